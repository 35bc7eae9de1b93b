"""Spot-the-Diff (Jhamtani & Berg-Kirkpatrick, EMNLP 2018) in the layout of its public release.

::

    ROOT/annotations/train.json       [{"img_id": "400", "sentences": ["...", ...]}, ...]  one entry per annotator
    ROOT/annotations/val.json
    ROOT/annotations/test.json
    ROOT/resized_images/400.png       before (224x224)
    ROOT/resized_images/400_2.png     after
    ROOT/resized_images/400_diff.jpg  precomputed difference image (optional, not read)

``ROOT`` is the release's ``data/`` folder. Ids are decimal strings without zero padding; each image may be
``.png`` or ``.jpg`` (one of the release's preprocessing scripts accepts either). Sentences are lower-case with
the punctuation stripped.

An id occurs in up to three entries, one per annotator. :meth:`SpotTheDiff.pairs` groups them into one
:class:`~idckit.data.clevr_change.Pair` per id whose references pool **every sentence of every annotator**: the
single-sentence protocol that all later work (CLIP4IDC included) scores against, one predicted sentence per pair.
Pair ids are ``"<img_id>.png"``, the ids CLIP4IDC writes into its results. Every pair is a change pair (type
``change``): the no-difference sentences (about 30 % of the references) sit among the others, unlabelled.

A pair whose before or after image is missing is left out of :meth:`~SpotTheDiff.pairs` and recorded in
:attr:`~SpotTheDiff.missing` (a warning gives the count), so a partial image download still loads.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from idckit.data.clevr_change import Pair, PairDataset
from idckit.errors import DatasetError

SPLITS: tuple[str, ...] = ("train", "val", "test")
CHANGE = "change"
IMAGE_EXTENSIONS: tuple[str, ...] = (".png", ".jpg")

LAYOUT_HELP = (
    "expected the Spot-the-Diff release layout: annotations/{train,val,test}.json and resized_images/<id>.png + "
    "<id>_2.png, with ROOT the release's data/ folder (see idckit/data/spot_the_diff.py); generate a synthetic "
    "one with `idckit generate spot-the-diff --out DIR`"
)


def pair_id(img_id: str) -> str:
    """CLIP4IDC's result id of a pair: ``"400" -> "400.png"``."""
    return f"{img_id}.png"


def parse_pair_id(pid: str) -> str:
    """Inverse of :func:`pair_id`; raises ``ValueError`` on anything else."""
    if not pid.endswith(".png") or not _canonical(pid[:-4]):
        raise ValueError(f"not a Spot-the-Diff pair id: {pid!r} (expected like '400.png')")
    return pid[:-4]


def _canonical(img_id) -> bool:
    return isinstance(img_id, str) and img_id.isdigit() and img_id.isascii() and str(int(img_id)) == img_id


@dataclass
class SpotTheDiff(PairDataset):
    """A Spot-the-Diff ``data/`` folder. ``SpotTheDiff(root).pairs("test")`` lists the test pairs.

    The annotation files are validated when first read and raise :class:`DatasetError` naming the file and the
    fix. Images are checked to exist (not decoded).
    """

    _entries: dict = field(default_factory=dict, repr=False)
    title: ClassVar[str] = "Spot-the-Diff"
    layout_help: ClassVar[str] = LAYOUT_HELP

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.root / "annotations").is_dir() and (self.root / "data" / "annotations").is_dir():
            raise DatasetError("this is the repository root, not its data/ folder", path=self.root,
                               fix=f"pass {self.root / 'data'}")
        for sub in ("annotations", "resized_images"):
            if not (self.root / sub).is_dir():
                raise DatasetError(f"missing folder {sub}/", path=self.root / sub, fix=LAYOUT_HELP)

    # -- raw files -----------------------------------------------------------------------------------
    def entries(self, split: str) -> list[dict]:
        """The annotation file of ``split`` as it is: one ``{"img_id", "sentences"}`` per annotator."""
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}",
                               path=self.root / "annotations")
        if split not in self._entries:
            path = self.root / "annotations" / f"{split}.json"
            raw = self.read_json(f"annotations/{split}.json")
            schema = 'a JSON list of {"img_id": "400", "sentences": ["...", ...]}'
            if not isinstance(raw, list):
                raise DatasetError(f"annotations/{split}.json must be {schema}", path=path, fix=LAYOUT_HELP)
            for k, e in enumerate(raw):
                if not isinstance(e, dict) or set(e) != {"img_id", "sentences"}:
                    raise DatasetError(f"entry {k} is not {{'img_id', 'sentences'}}: {str(e)[:80]}", path=path,
                                       fix=f"each entry must be {schema}")
                if not _canonical(e["img_id"]):
                    raise DatasetError(f"entry {k}: img_id {e['img_id']!r} is not an un-padded decimal string",
                                       path=path, fix='write ids as strings without zero padding, e.g. "42"')
                sents = e["sentences"]
                if not isinstance(sents, list) or not sents or not all(isinstance(s, str) and s.strip()
                                                                       for s in sents):
                    raise DatasetError(f"entry {k} (img_id {e['img_id']}): sentences must be a non-empty list of "
                                       "non-empty strings", path=path, fix=f"each entry must be {schema}")
            self._entries[split] = raw
        return self._entries[split]

    def image_path(self, img_id: str, after: bool) -> Path:
        """``resized_images/<id>.png`` (or ``_2`` for the after image); ``.jpg`` if only that exists."""
        stem = f"{img_id}_2" if after else img_id
        for ext in IMAGE_EXTENSIONS:
            path = self.root / "resized_images" / (stem + ext)
            if path.is_file():
                return path
        return self.root / "resized_images" / (stem + IMAGE_EXTENSIONS[0])

    # -- pairs ---------------------------------------------------------------------------------------
    def grouped(self, split: str) -> dict[str, list[list[str]]]:
        """img_id -> every annotator's sentences, in file order; ids sorted numerically."""
        out: dict[str, list[list[str]]] = {}
        for e in self.entries(split):
            out.setdefault(e["img_id"], []).append(list(e["sentences"]))
        return {k: out[k] for k in sorted(out, key=int)}

    def indices(self, split: str) -> list[int]:
        return [int(k) for k in self.grouped(split)]

    def pairs(self, split: str, *, check_images: bool = True) -> list[Pair]:
        """One pair per id, references pooled over annotators; without ``check_images`` missing ones stay in."""
        out = [Pair(pair_id(img_id), int(img_id), self.image_path(img_id, False), self.image_path(img_id, True),
                    tuple(s for sents in annotators for s in sents), CHANGE)
               for img_id, annotators in self.grouped(split).items()]
        return self.with_images(split, out) if check_images else out


    def coco_ground_truth(self, split: str) -> dict:
        """The COCO caption ground truth CLIP4IDC scores against (``spot_total_change_captions_reformat.json``).

        One annotation per reference sentence and one ``images`` record per annotator entry, so image ids repeat
        (the shipped test file: 1,270 pairs, 2,107 annotations, 1,404 image records); ``info`` and ``licenses``
        are empty strings as there.
        """
        images, annotations = [], []
        for img_id, annotators in self.grouped(split).items():
            for sents in annotators:
                images.append({"id": pair_id(img_id)})
                for sent in sents:
                    annotations.append({"image_id": pair_id(img_id), "caption": sent, "id": len(annotations)})
        return {"info": "", "licenses": "", "type": "captions", "images": images, "annotations": annotations}



def split_counts(ds: SpotTheDiff) -> dict[str, dict[str, int]]:
    """Entries (annotator descriptions), pairs, sentences and pairs with a missing image, per split."""
    out = {}
    for s in SPLITS:
        entries = ds.entries(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.pairs(s)
        out[s] = {"entries": len(entries), "pairs": len(ds.grouped(s)),
                  "sentences": sum(len(e["sentences"]) for e in entries), "missing_images": len(ds.missing[s])}
    return out
