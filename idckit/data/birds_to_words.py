"""Birds-to-Words (Forbes et al., EMNLP 2019) in its released format.

::

    ROOT/birds-to-words-v1.0.tsv     one row per (pair, annotator), tab separated, header row, 11 columns
    IMAGES/<photo_id>.<ext>          images fetched by the user from the iNaturalist URLs (not distributed)

The columns are :data:`COLUMNS`. ``img1`` is the left image and is called ``animal1`` in the text, ``img2`` the
right one, ``animal2``. The text is already lower-cased and tokenised (``animal1 ' s legs appear to be longer .``),
so the file is read with ``quoting=QUOTE_NONE``: a stray ``"`` inside a description is text, not a quote.

The references of a pair are all rows of one split sharing ``(img1ObservationURL, img2ObservationURL)``, ordered
by ``annN``. The photo id is the last path segment of the observation URL; the extension comes from the image URL
(``.../photos/<id>/medium.<ext>?<timestamp>``). Images are often dead on iNaturalist, so a pair whose image is
missing, empty or (with ``verify_images=True``) undecodable is flagged and counted, never an error.
"""
from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

from PIL import Image, UnidentifiedImageError

from idckit.errors import ConfigError, DatasetError

TSV_NAME = "birds-to-words-v1.0.tsv"
COLUMNS: tuple[str, ...] = ("img1ObservationURL", "img1ImgURL", "img1Species", "img1Selection",
                            "img2ObservationURL", "img2ImgURL", "img2Species", "img2Selection",
                            "split", "annN", "description")
SELECTIONS: tuple[str, ...] = ("base", "visual", "sameSpecies", "sameGenus", "sameFamily", "sameOrder", "sameClass")
SPLITS: tuple[str, ...] = ("train", "val", "test")
ANIMAL1, ANIMAL2 = "animal1", "animal2"
# Tried after the image URL's own extension, because downloaders often re-encode.
IMAGE_EXTS: tuple[str, ...] = ("jpg", "jpeg", "png")

LAYOUT_HELP = (
    f"expected the released {TSV_NAME}: tab separated, a header row with the 11 columns "
    + ", ".join(COLUMNS) + "; images named <photo_id>.<ext> in one folder (see idckit/data/birds_to_words.py); "
    "generate a synthetic one with `idckit generate birds --out DIR`"
)

OK, MISSING, EMPTY, UNREADABLE = "ok", "missing", "empty", "unreadable"


@dataclass(frozen=True)
class Photo:
    """One side of a pair: where it came from on iNaturalist and where it is (or is not) on disk."""

    photo_id: str
    observation_url: str
    image_url: str
    species: str
    selection: str
    path: Path | None  # the local file, None when it is missing
    status: str  # OK, MISSING, EMPTY or UNREADABLE

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class Pair:
    """An (animal1, animal2) pair with every annotator's paragraph as references."""

    pair_id: str
    split: str
    img1: Photo
    img2: Photo
    references: tuple[str, ...]
    annotators: tuple[int, ...]
    swapped: bool = False

    @property
    def images_ok(self) -> bool:
        return self.img1.ok and self.img2.ok

    @property
    def selection(self) -> str:
        """How the branch image relates to the pivot (``sameGenus`` ...); the pivot side says ``base``."""
        return self.img2.selection if self.img1.selection == "base" else self.img1.selection


def photo_id(observation_url: str) -> str:
    """``https://www.inaturalist.org/photos/1000001`` -> ``1000001`` (the last non-empty path segment)."""
    parts = [p for p in urlparse(observation_url).path.split("/") if p]
    if not parts:
        raise ValueError(f"no photo id in observation URL {observation_url!r}")
    return parts[-1]


def image_ext(image_url: str) -> str:
    """``https://static.inaturalist.org/photos/1/medium.jpg?1400000001`` -> ``jpg`` (``jpg`` if there is none)."""
    name = urlparse(image_url).path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else "jpg"


def swap_animals(text: str) -> str:
    """Exchange the tokens ``animal1`` and ``animal2`` (the text is tokenised, so whole tokens only)."""
    table = {ANIMAL1: ANIMAL2, ANIMAL2: ANIMAL1}
    return " ".join(table.get(tok, tok) for tok in text.split(" "))


def swap_pair(pair: Pair) -> Pair:
    """The same pair shown the other way round: images exchanged and ``animal1``/``animal2`` in every reference."""
    return replace(pair, pair_id=pair.pair_id + "_swap", img1=pair.img2, img2=pair.img1,
                   references=tuple(swap_animals(r) for r in pair.references), swapped=not pair.swapped)


class BirdsToWords:
    """The Birds-to-Words TSV plus an optional local image folder.

    ``BirdsToWords(root)`` takes the TSV itself or a folder holding it; ``image_root`` defaults to ``images/``
    beside the TSV. ``pairs("test")`` lists the test pairs in file order; ``image_status()`` counts what is
    missing. With ``verify_images=True`` every present image is decoded once (slow on the real 6K images).
    """

    def __init__(self, root: str | Path, image_root: str | Path | None = None, *, verify_images: bool = False):
        root = Path(root)
        tsv = root / TSV_NAME if root.is_dir() else root
        if not tsv.is_file():
            raise DatasetError(f"no {TSV_NAME} found", path=tsv, fix=LAYOUT_HELP)
        self.tsv = tsv
        self.image_root = Path(image_root) if image_root is not None else tsv.parent / "images"
        self.verify_images = verify_images
        self._status: dict[Path, str] = {}
        self._pairs = self._read()

    # -- reading ---------------------------------------------------------------------------------------
    def _read(self) -> dict[str, list[Pair]]:
        try:
            with self.tsv.open(encoding="utf-8-sig", newline="") as f:  # a BOM must not break the header
                rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        except UnicodeDecodeError as e:
            raise DatasetError(f"not UTF-8 text: {e}", path=self.tsv, fix=LAYOUT_HELP) from e
        if not rows or tuple(rows[0]) != COLUMNS:
            got = ", ".join(rows[0]) if rows else "an empty file"
            raise DatasetError(f"wrong header: got {got}", path=self.tsv, fix=LAYOUT_HELP)
        groups: dict[tuple[str, str, str], list[tuple[int, str, list[str]]]] = {}
        for line, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            if len(row) != len(COLUMNS):
                raise DatasetError(f"line {line} has {len(row)} tab-separated fields, expected {len(COLUMNS)}",
                                   path=self.tsv, fix="a description must not contain a tab; " + LAYOUT_HELP)
            r = dict(zip(COLUMNS, row))
            if r["split"] not in SPLITS:
                raise DatasetError(f"line {line}: split {r['split']!r} is not one of {', '.join(SPLITS)}",
                                   path=self.tsv, fix=LAYOUT_HELP)
            for col in ("img1Selection", "img2Selection"):
                if r[col] not in SELECTIONS:
                    raise DatasetError(f"line {line}: {col} {r[col]!r} is not one of {', '.join(SELECTIONS)}",
                                       path=self.tsv, fix=LAYOUT_HELP)
            try:
                ann = int(r["annN"])
            except ValueError as e:
                raise DatasetError(f"line {line}: annN {r['annN']!r} is not an integer", path=self.tsv,
                                   fix=LAYOUT_HELP) from e
            key = (r["split"], r["img1ObservationURL"], r["img2ObservationURL"])
            groups.setdefault(key, []).append((ann, r["description"].strip(), row))
        out: dict[str, list[Pair]] = {s: [] for s in SPLITS}
        for (split, _, _), anns in groups.items():
            anns.sort(key=lambda a: a[0])  # stable: equal annN keep file order
            r = dict(zip(COLUMNS, anns[0][2]))
            try:
                img1, img2 = self._photo(r, "img1"), self._photo(r, "img2")
            except ValueError as e:
                raise DatasetError(str(e), path=self.tsv, fix=LAYOUT_HELP) from e
            out[split].append(Pair(f"{img1.photo_id}-{img2.photo_id}", split, img1, img2,
                                   tuple(a[1] for a in anns), tuple(a[0] for a in anns)))
        return out

    def _photo(self, r: dict[str, str], side: str) -> Photo:
        pid = photo_id(r[f"{side}ObservationURL"])
        ext = image_ext(r[f"{side}ImgURL"])
        path, status = self._find(pid, ext)
        return Photo(pid, r[f"{side}ObservationURL"], r[f"{side}ImgURL"], r[f"{side}Species"],
                     r[f"{side}Selection"], path, status)

    def _find(self, pid: str, ext: str) -> tuple[Path | None, str]:
        for e in dict.fromkeys((ext, *IMAGE_EXTS)):
            path = self.image_root / f"{pid}.{e}"
            if path not in self._status:
                self._status[path] = self._check(path)
            if self._status[path] != MISSING:
                return (path, self._status[path]) if self._status[path] == OK else (None, self._status[path])
        return None, MISSING

    def _check(self, path: Path) -> str:
        if not path.is_file():
            return MISSING
        if path.stat().st_size == 0:
            return EMPTY
        if self.verify_images:
            try:
                with Image.open(path) as im:
                    im.verify()
            except (UnidentifiedImageError, OSError, SyntaxError):
                return UNREADABLE
        return OK

    # -- pairs -----------------------------------------------------------------------------------------
    def pairs(self, split: str, *, only_with_images: bool = False) -> list[Pair]:
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", path=self.tsv)
        return [p for p in self._pairs[split] if p.images_ok or not only_with_images]

    def references(self, split: str) -> dict[str, list[str]]:
        """pair id -> every annotator's paragraph, for the evaluator (the text is already tokenised)."""
        return {p.pair_id: list(p.references) for p in self.pairs(split)}

    def training_examples(self, split: str = "train", *, swap: bool = False,
                          only_with_images: bool = True) -> list[tuple[Pair, str]]:
        """One (pair, paragraph) per annotation. ``swap=True`` adds every pair mirrored (training data only)."""
        if swap and split != "train":
            raise ConfigError(f"swap augmentation is for the training split only, not {split!r}",
                              fix="evaluate val/test pairs as annotated; pass swap=False")
        pairs = self.pairs(split, only_with_images=only_with_images)
        if swap:
            pairs = pairs + [swap_pair(p) for p in pairs]
        return [(p, ref) for p in pairs for ref in p.references]

    def photos(self, split: str | None = None, *, only_ok: bool = True) -> list[Photo]:
        """Distinct photos of ``split`` (all splits if None) in order of first appearance: what a feature
        extractor reads (``photo.path`` relative to ``image_root``)."""
        seen: dict[str, Photo] = {}
        for s in ([split] if split else SPLITS):
            for p in self.pairs(s):
                for ph in (p.img1, p.img2):
                    if ph.ok or not only_ok:
                        seen.setdefault(ph.photo_id, ph)
        return list(seen.values())

    def image_status(self, split: str | None = None) -> dict[str, int]:
        """Counts of pairs and of their images by status (``ok``, ``missing``, ``empty``, ``unreadable``)."""
        pairs = [p for s in ([split] if split else SPLITS) for p in self.pairs(s)]
        photos = {ph.photo_id: ph.status for p in pairs for ph in (p.img1, p.img2)}
        counts = Counter(photos.values())
        return {"pairs": len(pairs), "pairs_with_images": sum(p.images_ok for p in pairs),
                "images": len(photos), **{s: counts.get(s, 0) for s in (OK, MISSING, EMPTY, UNREADABLE)}}

    def counts(self) -> dict[str, dict[str, int]]:
        """Per split: pairs, paragraphs and sentences (the paper counts sentences: about 41K in all)."""
        out = {}
        for s in SPLITS:
            refs = [r for p in self.pairs(s) for r in p.references]
            out[s] = {"pairs": len(self.pairs(s)), "paragraphs": len(refs),
                      "sentences": sum(max(1, r.split(" ").count(".")) for r in refs)}
        return out
