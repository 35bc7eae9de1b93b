"""CLEVR-Change (Park, Darrell, Rohrbach, ICCV 2019) in its official on-disk layout.

::

    ROOT/images/CLEVR_default_000123.png        before
    ROOT/sc_images/CLEVR_semantic_000123.png    after, with a semantic change
    ROOT/nsc_images/CLEVR_nonsemantic_000123.png after, viewpoint/lighting only (distractor)
    ROOT/change_captions.json     {"CLEVR_default_000123.png": [caption, ...]}
    ROOT/no_change_captions.json  {"CLEVR_default_000123.png": [caption, ...]}
    ROOT/splits.json              {"train": [int], "val": [int], "test": [int]}
    ROOT/type_mapping.json        {"color": ["000123.png", ...], "material": ..., "add", "drop", "move"}

Every split index yields two pairs: (default -> semantic) with the change captions and its change type, and
(default -> nonsemantic) with the no-change captions and type ``distractor``. Pair ids follow RCC's result
format: ``000123.png`` and ``000123.png_n``. Paths are built from the index, never by listing folders (RCC
lists and sorts, which only works because the real names are zero-padded and contiguous).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

from idckit.errors import DatasetError

CHANGE_TYPES: tuple[str, ...] = ("color", "material", "add", "drop", "move")
DISTRACTOR = "distractor"
SPLITS: tuple[str, ...] = ("train", "val", "test")

LAYOUT_HELP = (
    "expected the official CLEVR-Change layout: images/, sc_images/, nsc_images/, change_captions.json, "
    "no_change_captions.json, splits.json, type_mapping.json (see idckit/data/clevr_change.py); "
    "generate a synthetic one with `idckit generate clevr-change --out DIR`"
)


def default_name(index: int) -> str:
    return f"CLEVR_default_{index:06d}.png"


def semantic_name(index: int) -> str:
    return f"CLEVR_semantic_{index:06d}.png"


def nonsemantic_name(index: int) -> str:
    return f"CLEVR_nonsemantic_{index:06d}.png"


def pair_id(index: int, distractor: bool) -> str:
    """RCC result id: ``000123.png`` for the semantic pair, ``000123.png_n`` for the distractor pair."""
    return f"{index:06d}.png" + ("_n" if distractor else "")


def parse_pair_id(pid: str) -> tuple[int, bool]:
    """Inverse of :func:`pair_id`; raises ``ValueError`` on anything else."""
    distractor = pid.endswith("_n")
    stem = pid[:-2] if distractor else pid
    if not stem.endswith(".png") or not stem[:-4].isdigit():
        raise ValueError(f"not a CLEVR-Change pair id: {pid!r} (expected like '000123.png' or '000123.png_n')")
    return int(stem[:-4]), distractor


@dataclass(frozen=True)
class Pair:
    """One (before, after) image pair with its reference captions (Spot-the-Diff and IER use it too)."""

    pair_id: str
    index: int
    before: Path
    after: Path
    captions: tuple[str, ...]
    change_type: str  # one of CHANGE_TYPES or DISTRACTOR; "change" (Spot-the-Diff) or "edit" (IER)

    @property
    def is_change(self) -> bool:
        return self.change_type != DISTRACTOR


@dataclass
class PairDataset:
    """What every pair dataset of the kit (CLEVR-Change, Spot-the-Diff, IER) offers on top of its own
    ``pairs(split, check_images=...)``: a root checked to be a directory, its JSON files read with errors that name
    them, the evaluator's references and types per split, and iteration over all pairs. ``title`` and
    ``layout_help`` name the dataset and its layout in every error."""

    root: Path
    #: pairs left out of ``pairs`` for a missing image: split -> pair id -> the absent images (Spot-the-Diff and
    #: IER leave such pairs out with a warning; CLEVR-Change builds its paths from the index and raises instead)
    missing: dict[str, dict[str, list[Path]]] = field(default_factory=dict, repr=False)
    title: ClassVar[str] = "pair dataset"
    layout_help: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.title} root is not a directory", path=self.root, fix=self.layout_help)

    def read_json(self, name: str) -> Any:
        """The JSON file ``name`` under the root, or the kit's error naming it (missing or malformed)."""
        path = self.root / name
        if not path.is_file():
            raise DatasetError(f"missing file {name}", path=path, fix=self.layout_help)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"malformed JSON in {name}: {e}", path=path,
                               fix="re-download or re-generate the file") from e

    def with_images(self, split: str, pairs: Sequence[Pair]) -> list[Pair]:
        """``pairs`` whose two images exist; the others are recorded in :attr:`missing` and counted in a warning."""
        missing = {p.pair_id: absent for p in pairs if (absent := [x for x in (p.before, p.after) if not x.is_file()])}
        self.missing[split] = missing
        if missing:
            warnings.warn(f"{self.title} {split}: {len(missing)} of {len(pairs)} pairs have a missing image and are "
                          f"left out (e.g. {next(iter(missing.values()))[0]}); see {type(self).__name__}.missing",
                          stacklevel=3)
        return [p for p in pairs if p.pair_id not in missing]

    def references(self, split: str) -> dict[str, list[str]]:
        """pair id -> reference captions, for the evaluator."""
        return {p.pair_id: list(p.captions) for p in self.pairs(split, check_images=False)}

    def types(self, split: str) -> dict[str, str]:
        """pair id -> change type (``distractor`` for CLEVR-Change's ``_n`` ids)."""
        return {p.pair_id: p.change_type for p in self.pairs(split, check_images=False)}

    def __iter__(self) -> Iterator[Pair]:
        for s in SPLITS:
            yield from self.pairs(s)


@dataclass
class ClevrChange(PairDataset):
    """A CLEVR-Change root directory. ``ClevrChange(root).pairs("test")`` lists the test pairs.

    Loading validates the layout and raises :class:`DatasetError` naming the file and the fix.
    Image files are checked to exist (not decoded) for the splits that are asked for.
    """

    _json_cache: dict = field(default_factory=dict, repr=False)
    title: ClassVar[str] = "CLEVR-Change"
    layout_help: ClassVar[str] = LAYOUT_HELP

    def __post_init__(self) -> None:
        super().__post_init__()
        for sub in ("images", "sc_images", "nsc_images"):
            if not (self.root / sub).is_dir():
                raise DatasetError(f"missing folder {sub}/", path=self.root / sub, fix=LAYOUT_HELP)

    # -- raw files -----------------------------------------------------------------------------------
    def _json(self, name: str):
        if name not in self._json_cache:
            self._json_cache[name] = self.read_json(name)
        return self._json_cache[name]

    @cached_property
    def splits(self) -> dict[str, list[int]]:
        raw = self._json("splits.json")
        path = self.root / "splits.json"
        if not isinstance(raw, dict) or not all(s in raw for s in SPLITS):
            raise DatasetError('splits.json must be {"train": [int], "val": [int], "test": [int]}',
                               path=path, fix=LAYOUT_HELP)
        out = {}
        for s in SPLITS:
            if not isinstance(raw[s], list) or not all(isinstance(i, int) and i >= 0 for i in raw[s]):
                raise DatasetError(f'splits.json["{s}"] must be a list of non-negative integer image indices',
                                   path=path, fix=LAYOUT_HELP)
            out[s] = list(raw[s])
        return out

    @cached_property
    def change_captions(self) -> dict[str, list[str]]:
        return self._caption_file("change_captions.json")

    @cached_property
    def no_change_captions(self) -> dict[str, list[str]]:
        return self._caption_file("no_change_captions.json")

    def _caption_file(self, name: str) -> dict[str, list[str]]:
        raw = self._json(name)
        if not isinstance(raw, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in raw.values()
        ):
            raise DatasetError(f'{name} must map "CLEVR_default_NNNNNN.png" to a list of strings',
                               path=self.root / name, fix=LAYOUT_HELP)
        # An empty reference cannot be scored (pycocoevalcap's BLEU rejects it) and teaches nothing.
        blank = next(((k, i) for k, v in raw.items() for i, c in enumerate(v) if not c.strip()), None)
        if blank is not None:
            n = sum(1 for v in raw.values() for c in v if not c.strip())
            raise DatasetError(f"{name}[{blank[0]!r}][{blank[1]}] is an empty caption ({n} empty in the file)",
                               path=self.root / name,
                               fix=f"remove the empty strings from {name} (every caption must hold words)")
        return raw

    @cached_property
    def change_type_of(self) -> dict[int, str]:
        """Image index -> change type, from type_mapping.json."""
        raw = self._json("type_mapping.json")
        path = self.root / "type_mapping.json"
        if not isinstance(raw, dict):
            raise DatasetError("type_mapping.json must be an object of change type -> list of '000123.png'",
                               path=path, fix=LAYOUT_HELP)
        out: dict[int, str] = {}
        for ctype, ids in raw.items():
            if ctype not in CHANGE_TYPES:
                raise DatasetError(f"unknown change type {ctype!r} in type_mapping.json "
                                   f"(expected one of {', '.join(CHANGE_TYPES)})", path=path, fix=LAYOUT_HELP)
            for pid in ids:
                try:
                    idx, distractor = parse_pair_id(pid)
                except (ValueError, TypeError) as e:
                    raise DatasetError(f"bad id in type_mapping.json[{ctype!r}]: {e}", path=path,
                                       fix=LAYOUT_HELP) from e
                if distractor:
                    raise DatasetError(f"type_mapping.json[{ctype!r}] lists a distractor id {pid!r}",
                                       path=path, fix=LAYOUT_HELP)
                out[idx] = ctype
        return out

    # -- pairs ---------------------------------------------------------------------------------------
    def indices(self, split: str) -> list[int]:
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}",
                               path=self.root / "splits.json", fix=f"use one of {', '.join(SPLITS)}")
        return self.splits[split]

    def pairs(self, split: str, *, check_images: bool = True) -> list[Pair]:
        """Both pairs of every index of ``split``: semantic first, then its distractor."""
        out: list[Pair] = []
        for idx in self.indices(split):
            out.extend(self.pairs_of(idx, check_images=check_images))
        return out

    def pairs_of(self, index: int, *, check_images: bool = True) -> tuple[Pair, Pair]:
        key = default_name(index)
        before = self.root / "images" / key
        sc = self.root / "sc_images" / semantic_name(index)
        nsc = self.root / "nsc_images" / nonsemantic_name(index)
        if check_images:
            for p in (before, sc, nsc):
                if not p.is_file():
                    raise DatasetError(f"split index {index} has no image {p.name}", path=p,
                                       fix="every split index needs its default, semantic and nonsemantic image; "
                                           + LAYOUT_HELP)
        for name, table in (("change_captions.json", self.change_captions),
                            ("no_change_captions.json", self.no_change_captions)):
            if not table.get(key):
                raise DatasetError(f"index {index} ({key}) has no captions in {name}", path=self.root / name,
                                   fix="every split index needs at least one caption in both caption files")
        ctype = self.change_type_of.get(index)
        if ctype is None:
            raise DatasetError(f"index {index} has no change type in type_mapping.json",
                               path=self.root / "type_mapping.json",
                               fix='add "%06d.png" under its change type' % index)
        return (
            Pair(pair_id(index, False), index, before, sc, tuple(self.change_captions[key]), ctype),
            Pair(pair_id(index, True), index, before, nsc, tuple(self.no_change_captions[key]), DISTRACTOR),
        )


def split_counts(ds: ClevrChange, splits: Sequence[str] = SPLITS) -> dict[str, dict[str, int]]:
    """Pairs per change type per split (distractor included)."""
    out: dict[str, dict[str, int]] = {}
    for s in splits:
        counts = {t: 0 for t in (*CHANGE_TYPES, DISTRACTOR)}
        for t in ds.types(s).values():
            counts[t] += 1
        out[s] = counts
    return out
