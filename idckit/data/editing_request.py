"""Image-Editing-Request (Tan et al., ACL 2019) in the layout of its public release.

::

    ROOT/train.json   [{"img0": "<before file>", "img1": "<after file>", "sents": ["..."], "uid": "..."}, ...]
    ROOT/valid.json   the same, 3 requests per pair
    ROOT/test.json    the same, 3 requests per pair
    ROOT/images/      the images (a separate download); ROOT itself if there is no images/ folder

The JSON holds bare image file names with mixed extensions (jpg, png, JPG, jpeg, gif): ``img0`` is the
original, ``img1`` the edited image. Every entry has exactly the four keys above. The requests are raw text
(mixed case, punctuation); they are kept as written, since the scorer's PTB tokenizer lower-cases and drops
punctuation itself. The release has 1 request per training pair and 3 per valid/test pair.

Each entry is one :class:`~idckit.data.clevr_change.Pair` with id ``uid``, type ``edit`` and ``sents`` as the
references. The kit's split names are ``train``/``val``/``test`` like the other datasets; ``val`` reads
``valid.json`` (and ``"valid"`` is accepted too). A pair with a missing image is left out of
:meth:`~EditingRequest.pairs` and recorded in :attr:`~EditingRequest.missing` (a warning gives the count).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from idckit.data.clevr_change import Pair, PairDataset
from idckit.errors import DatasetError
from idckit.fileio import inside

SPLITS: tuple[str, ...] = ("train", "val", "test")
SPLIT_FILES = {"train": "train.json", "val": "valid.json", "test": "test.json"}
KEYS = frozenset({"img0", "img1", "sents", "uid"})
EDIT = "edit"

LAYOUT_HELP = (
    "expected the Image-Editing-Request release layout: train.json, valid.json, test.json (lists of "
    "{img0, img1, sents, uid}) beside an images/ folder (see idckit/data/editing_request.py); generate a "
    "synthetic one with `idckit generate editing-request --out DIR`"
)


def _split(split: str) -> str:
    return "val" if split == "valid" else split


@dataclass
class EditingRequest(PairDataset):
    """An Image-Editing-Request folder. ``EditingRequest(root).pairs("test")`` lists the test pairs.

    The split files are validated when first read and raise :class:`DatasetError` naming the file and the fix.
    Images are checked to exist (not decoded).
    """

    _entries: dict = field(default_factory=dict, repr=False)
    title: ClassVar[str] = "Image-Editing-Request"
    layout_help: ClassVar[str] = LAYOUT_HELP

    def __post_init__(self) -> None:
        super().__post_init__()
        if not any((self.root / f).is_file() for f in SPLIT_FILES.values()):
            nested = self.root / "dataset" / "adobe"
            raise DatasetError("no train.json, valid.json or test.json here", path=self.root,
                               fix=f"pass {nested}" if nested.is_dir() else LAYOUT_HELP)

    @property
    def image_dir(self) -> Path:
        return self.root / "images" if (self.root / "images").is_dir() else self.root

    def entries(self, split: str) -> list[dict]:
        """The split file as it is: one ``{"img0", "img1", "sents", "uid"}`` per pair."""
        split = _split(split)
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", path=self.root)
        if split not in self._entries:
            path = self.root / SPLIT_FILES[split]
            raw = self.read_json(SPLIT_FILES[split])
            schema = 'a JSON list of {"img0": file, "img1": file, "sents": [str, ...], "uid": str}'
            if not isinstance(raw, list):
                raise DatasetError(f"{path.name} must be {schema}", path=path, fix=LAYOUT_HELP)
            seen: set[str] = set()
            for k, e in enumerate(raw):
                if not isinstance(e, dict) or set(e) != KEYS:
                    keys = sorted(e) if isinstance(e, dict) else type(e).__name__
                    raise DatasetError(f"entry {k} has keys {keys}; expected exactly img0, img1, sents, uid",
                                       path=path, fix=f"each entry must be {schema}")
                if not all(isinstance(e[key], str) and e[key] for key in ("img0", "img1", "uid")):
                    raise DatasetError(f"entry {k}: img0, img1 and uid must be non-empty strings", path=path,
                                       fix=f"each entry must be {schema}")
                if not isinstance(e["sents"], list) or not e["sents"] or not all(
                        isinstance(s, str) and s.strip() for s in e["sents"]):
                    raise DatasetError(f"entry {k} ({e['uid']}): sents must be a non-empty list of non-empty "
                                       "strings", path=path, fix=f"each entry must be {schema}")
                if e["uid"] in seen:
                    raise DatasetError(f"uid {e['uid']!r} occurs twice", path=path,
                                       fix="every pair needs its own uid (it is the result id)")
                seen.add(e["uid"])
            self._entries[split] = raw
        return self._entries[split]

    def pairs(self, split: str, *, check_images: bool = True) -> list[Pair]:
        """One pair per entry, in file order; without ``check_images`` missing ones stay in."""
        split = _split(split)
        source = self.root / SPLIT_FILES[split]
        out = [Pair(e["uid"], k, *(inside(self.image_dir, e[key], source=source, entry=f"entry {k} {key}")
                                   for key in ("img0", "img1")), tuple(e["sents"]), EDIT)
               for k, e in enumerate(self.entries(split))]
        return self.with_images(split, out) if check_images else out

    def indices(self, split: str) -> list[int]:
        return list(range(len(self.entries(split))))


def split_counts(ds: EditingRequest) -> dict[str, dict[str, int]]:
    """Pairs, requests and pairs with a missing image, per split."""
    out = {}
    for s in SPLITS:
        entries = ds.entries(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.pairs(s)
        out[s] = {"pairs": len(entries), "sentences": sum(len(e["sents"]) for e in entries),
                  "missing_images": len(ds.missing[s])}
    return out
