"""``idckit verify-data ROOT --dataset NAME``: is this copy of a dataset complete and readable?

Partial archives and half-finished downloads are the commonest way a real-data run fails hours in. This module
compares a copy with what its release is known to hold and lists every problem at once, instead of the loaders'
first-error-and-stop:

- **schema**: the caption / split / annotation files parse and have the release's structure (the kit's loaders
  in ``idckit/data`` validate each file; their first error per file is reported here);
- **missing**: every image a split refers to exists (and is not empty);
- **extra**: files in an image folder that no split refers to, where the release has none (CLEVR-Change's three
  folders, CUB's and NABirds' ``images/``); for Spot-the-Diff and IER, whose folders may hold more than the
  splits use, they are counted as a note only;
- **count**: split sizes and files per folder against the expected counts (below);
- **corrupt**: every referenced image is fully decoded with PIL (a progress bar; ``sample`` decodes a seeded
  random subset instead). A truncated PNG or JPEG fails here.

Expected counts (``counts``): ``"release"`` compares with the published facts of the full release (the dataset's
``release`` in :data:`idckit.registry.DATASETS`); ``"declared"`` with the counts a kit-generated synthetic set
declares in its own ``synth_info.json``; ``"none"`` checks structure and schema only (for a deliberately partial
copy). The default, ``"auto"``, is ``declared`` when ``synth_info.json`` is there and ``release`` otherwise. Facts
the reference marks unverified (CUB's train/test split, NABirds' image count) are compared and printed as notes,
never failures.

The fast part (:func:`verify` with ``decode=False``: no image is opened) is what ``idckit doctor`` runs.
"""
from __future__ import annotations

import json
import os
import random
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from PIL import Image
from tqdm.auto import tqdm

from idckit import fileio, registry
from idckit.data.birds_to_words import BirdsToWords
from idckit.data.clevr_change import (CHANGE_TYPES, SPLITS, ClevrChange, default_name, nonsemantic_name,
                                      semantic_name)
from idckit.data.cub import Cub
from idckit.data.nabirds import NABirds
from idckit.errors import DatasetError, IdckitError

COUNT_MODES = ("auto", "release", "declared", "none")
KINDS = ("schema", "missing", "corrupt", "extra", "count")
# the published facts of each full release (per split) are the datasets' ``release`` in idckit.registry, from the
# papers and the released files; "unverified" facts are compared as notes only

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")


@dataclass(frozen=True)
class Finding:
    kind: str      # one of KINDS
    where: str     # a path (or file name) relative to the root
    detail: str


@dataclass
class Result:
    dataset: str
    root: Path
    counts_mode: str                      # release, declared or none (auto resolved)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)   # what was counted in the copy
    images: int = 0                       # images the splits refer to
    decoded: int | None = None            # images decoded (None: the fast part only)

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, kind: str, where: str | Path, detail: str) -> None:
        if isinstance(where, Path):
            try:
                where = where.relative_to(self.root).as_posix()
            except ValueError:
                where = str(where)
        self.findings.append(Finding(kind, where, detail))

    def by_kind(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {k: [] for k in KINDS}
        for f in self.findings:
            out[f.kind].append(f)
        return out

    def summary(self) -> str:
        counts = {k: len(v) for k, v in self.by_kind().items() if v}
        what = ", ".join(f"{n} {k}" for k, n in counts.items()) if counts else "no problems"
        decoded = ("no image decoded (fast check)" if self.decoded is None
                   else f"{self.decoded} of {self.images} images decoded")
        return f"{self.dataset} at {self.root}: {what}; {self.images} images referenced, {decoded}; counts: " \
               f"{self.counts_mode}"

    def lines(self, limit: int = 20) -> list[str]:
        """The report: per kind, the first ``limit`` findings and how many more."""
        out = [self.summary()]
        for kind, items in self.by_kind().items():
            if not items:
                continue
            out.append(f"{kind} ({len(items)}):")
            out += [f"  {f.where}: {f.detail}" for f in items[:limit]]
            if len(items) > limit:
                out.append(f"  ... and {len(items) - limit} more")
        out += [f"note: {n}" for n in self.notes]
        return out


# -- helpers ----------------------------------------------------------------------------------------------------
def _declared(root: Path) -> dict | None:
    info = root / "synth_info.json"
    if not info.is_file():
        return None
    try:
        return json.loads(info.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _resolve_mode(root: Path, counts: str) -> str:
    if counts not in COUNT_MODES:
        raise IdckitError(f"unknown counts mode {counts!r}", fix=f"use one of {', '.join(COUNT_MODES)}")
    if counts == "auto":
        return "declared" if _declared(root) is not None else "release"
    if counts == "declared" and _declared(root) is None:
        raise DatasetError("--counts declared needs the synth_info.json a kit-generated set carries", path=root,
                           fix="use --counts release for a real copy, or --counts none to check structure only")
    return counts


def _compare(res: Result, where: str, what: str, found: int, expected: int | None) -> None:
    if expected is not None and found != expected:
        res.add("count", where, f"{what}: {found:,} found, {expected:,} expected "
                                f"({'published' if res.counts_mode == 'release' else 'declared in synth_info.json'})")


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()


def _check_exists(res: Result, paths: Iterable[Path], what: str) -> list[Path]:
    """The paths that exist and are not empty; the others are recorded as missing."""
    present = []
    paths = list(paths)
    res.images += len(paths)
    for p in paths:
        if not p.is_file():
            res.add("missing", p, f"{what} not found")
        elif p.stat().st_size == 0:
            res.add("missing", p, f"{what} is an empty file (an interrupted download?)")
        else:
            present.append(p)
    return present


def _schema(res: Result, where: str, call: Callable):
    """``call()``, or None with its DatasetError recorded as a schema finding."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except DatasetError as err:
        res.add("schema", where, str(err).splitlines()[0])
        return None


# -- per dataset: the fast part -----------------------------------------------------------------------------------
def _clevr_change(res: Result, expected: dict | None) -> list[Path]:
    ds = _schema(res, ".", lambda: ClevrChange(res.root))
    if ds is None:
        return []
    splits = _schema(res, "splits.json", lambda: ds.splits) or {}
    change = _schema(res, "change_captions.json", lambda: ds.change_captions) or {}
    no_change = _schema(res, "no_change_captions.json", lambda: ds.no_change_captions) or {}
    types = _schema(res, "type_mapping.json", lambda: ds.change_type_of) or {}
    seen: dict[int, str] = {}
    for s in SPLITS:
        for i in splits.get(s, []):
            if i in seen:
                res.add("schema", "splits.json", f"index {i} is in both {seen[i]} and {s}")
            seen[i] = s
    for i in sorted(seen):
        key = default_name(i)
        for name, table in (("change_captions.json", change), ("no_change_captions.json", no_change)):
            if table and not table.get(key):
                res.add("schema", name, f"split index {i} ({key}) has no captions")
        if types and i not in types:
            res.add("schema", "type_mapping.json", f"split index {i} has no change type")
    res.facts = {"splits": {s: len(splits.get(s, [])) for s in SPLITS},
                 "pairs": {s: 2 * len(splits.get(s, [])) for s in SPLITS}}
    folders = (("images", default_name), ("sc_images", semantic_name), ("nsc_images", nonsemantic_name))
    for folder, name in folders:
        on_disk = _files(res.root / folder)
        res.facts[f"{folder}/"] = len(on_disk)
        wanted = {name(i) for i in seen}
        for extra in sorted(on_disk - wanted):
            res.add("extra", f"{folder}/{extra}", "no split refers to this file")
    if expected is not None:
        if res.counts_mode == "release":
            want = expected["splits"]
            for folder, _ in folders:
                _compare(res, f"{folder}/", "files", res.facts[f"{folder}/"], expected["images_per_folder"])
        else:   # synth_info.json: {split: {change type: count}}
            want = {s: sum(expected.get("counts", {}).get(s, {}).get(t, 0) for t in CHANGE_TYPES) for s in SPLITS}
        for s in SPLITS:
            _compare(res, "splits.json", f"{s} indices", res.facts["splits"][s], want.get(s))
    paths = [res.root / folder / name(i) for i in sorted(seen) for folder, name in folders]
    return _check_exists(res, paths, "image")


def _pair_dataset(res: Result, expected: dict | None, loader, count_fn, extras_note: str) -> list[Path]:
    """Spot-the-Diff and IER: one loader with ``entries(split)`` and ``pairs(split, check_images=False)``."""
    ds = _schema(res, ".", lambda: loader(res.root))
    if ds is None:
        return []
    paths: dict[Path, None] = {}
    for s in ("train", "val", "test"):
        if _schema(res, f"{s} split", lambda: ds.entries(s)) is None:
            continue
        for p in ds.pairs(s, check_images=False):
            paths.update({p.before: None, p.after: None})
        res.facts[s] = count_fn(ds, s)
    if expected is not None:
        want = expected["splits"] if res.counts_mode == "release" else expected.get("counts", {})
        for s, found in res.facts.items():
            for what, n in found.items():
                _compare(res, f"{s} split", what, n, want.get(s, {}).get(what))
    folder = res.root / registry.dataset(res.dataset).images
    referenced = {p.name for p in paths}
    others = [n for n in _files(folder) if n.lower().endswith(IMAGE_SUFFIXES) and n not in referenced
              and not n.endswith("_diff.jpg")]
    if others:
        res.notes.append(f"{len(others)} images in {folder.name or '.'}/ that no split refers to ({extras_note})")
    return _check_exists(res, paths, "image")


def _spot_counts(ds, s: str) -> dict[str, int]:
    entries = ds.entries(s)
    return {"entries": len(entries), "pairs": len({e["img_id"] for e in entries}),
            "sentences": sum(len(e["sentences"]) for e in entries)}


def _ier_counts(ds, s: str) -> dict[str, int]:
    entries = ds.entries(s)
    return {"pairs": len(entries), "sentences": sum(len(e["sents"]) for e in entries)}


def _pair_counts(ds, s: str) -> dict[str, int]:
    """A pair dataset the kit has no special counts for (one registered from outside): its pairs."""
    return {"pairs": len(ds.pairs(s, check_images=False))}


def _birds(res: Result, expected: dict | None) -> list[Path]:
    paths: list[Path] = []
    b2w = _schema(res, "birds_to_words/", lambda: BirdsToWords(res.root / "birds_to_words"))
    if b2w is not None:
        res.facts["birds_to_words"] = b2w.counts()
        for s in ("train", "val", "test"):
            for p in b2w.pairs(s):
                if len(p.references) > 5:
                    res.add("schema", b2w.tsv, f"pair {p.pair_id} ({s}) has {len(p.references)} paragraphs; the "
                                               "release has at most 5 annotators per pair")
        photos = b2w.photos(only_ok=False)
        for ph in photos:
            if ph.path is None:
                res.images += 1
                res.add("missing", b2w.image_root / f"{ph.photo_id}.*",
                        f"Birds-to-Words photo {ph.photo_id} is {ph.status} (from {ph.image_url}; the notebooks "
                        "skip its pairs)")
            else:
                paths.append(ph.path)
        if expected is not None and res.counts_mode == "declared":
            for s in ("train", "val", "test"):
                for what in ("pairs", "paragraphs"):
                    _compare(res, f"birds_to_words {s}", what, res.facts["birds_to_words"][s][what],
                             expected.get("counts", {}).get(s, {}).get(what))
        if expected is not None and res.counts_mode == "release":
            res.notes.append("Birds-to-Words publishes no exact split counts; this copy has "
                             + ", ".join(f"{s} {c['pairs']:,} pairs / {c['paragraphs']:,} paragraphs"
                                         for s, c in res.facts["birds_to_words"].items()))
    cub = _schema(res, "CUB_200_2011/", lambda: Cub(res.root))
    cub_images = _schema(res, "CUB_200_2011/", lambda: cub.images()) if cub is not None else None
    if cub_images is not None:
        res.facts["cub"] = {"images": len(cub_images), "classes": len(cub.classes),
                            "train": sum(im.is_train for im in cub_images)}
        paths += [im.path for im in cub_images]
        text = _schema(res, "CUB captions", lambda: cub.text_root)
        if text is not None:
            for im in cub_images:
                caption = text / "text_c10" / (im.rel_path.rsplit(".", 1)[0] + ".txt")
                if not caption.is_file():
                    res.add("missing", caption, "caption file (Reed et al. text_c10) not found")
                elif not any(line.strip() for line in caption.read_text(encoding="utf-8").splitlines()):
                    res.add("schema", caption, "caption file is empty (the release has 10 captions per image)")
        _extras(res, cub.root / "images", {im.rel_path for im in cub_images})
        if expected is not None and res.counts_mode == "release":
            _compare(res, "CUB_200_2011/images.txt", "images", len(cub_images), expected["cub_images"])
            _compare(res, "CUB_200_2011/classes.txt", "classes", len(cub.classes), expected["cub_classes"])
            unv = expected["unverified"]
            if (res.facts["cub"]["train"], len(cub_images) - res.facts["cub"]["train"]) != \
                    (unv["cub_train"], unv["cub_test"]):
                res.notes.append(f"CUB train/test {res.facts['cub']['train']:,} / "
                                 f"{len(cub_images) - res.facts['cub']['train']:,}; commonly cited "
                                 f"{unv['cub_train']:,} / {unv['cub_test']:,} (unverified)")
        if expected is not None and res.counts_mode == "declared":
            _compare(res, "CUB_200_2011/images.txt", "images", len(cub_images),
                     expected.get("counts", {}).get("cub_images"))
    nab = _schema(res, "nabirds/", lambda: NABirds(res.root))
    nab_images = _schema(res, "nabirds/", lambda: nab.images()) if nab is not None else None
    if nab_images is not None:
        res.facts["nabirds"] = {"images": len(nab_images), "leaf_classes": len(nab.leaf_classes)}
        paths += [im.path for im in nab_images]
        _extras(res, nab.root / "images", {im.rel_path for im in nab_images})
        if expected is not None and res.counts_mode == "release":
            unv = expected["unverified"]
            for what, key in (("images", "nabirds_images"), ("leaf_classes", "nabirds_leaf_classes")):
                if res.facts["nabirds"][what] != unv[key]:
                    res.notes.append(f"NABirds {what.replace('_', ' ')} {res.facts['nabirds'][what]:,}; commonly "
                                     f"cited {unv[key]:,} (unverified)")
        if expected is not None and res.counts_mode == "declared":
            _compare(res, "nabirds/images.txt", "images", len(nab_images),
                     expected.get("counts", {}).get("nabirds_images"))
    return _check_exists(res, paths, "image")


def _extras(res: Result, images: Path, listed: set[str]) -> None:
    if not images.is_dir():
        return
    for p in sorted(images.rglob("*")):
        if p.is_file() and p.relative_to(images).as_posix() not in listed:
            res.add("extra", p, "not listed in images.txt")


# -- decoding ------------------------------------------------------------------------------------------------------
def _decode_one(path: Path) -> tuple[tuple[int, int] | None, str | None]:
    """(size, None) for an image that decodes in full, (None, why) for one that does not."""
    try:
        with Image.open(path) as im:
            im.load()   # the whole image: a truncated file fails here, not at open()
            return im.size, None
    except Exception as err:   # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError... on bad files
        return None, f"cannot be decoded ({type(err).__name__}: {err})"


def _decode(res: Result, paths: list[Path], sample: int | None, progress: bool, workers: int, seed: int = 0) -> None:
    todo = sorted(paths)
    if sample is not None and sample < len(todo):
        todo = sorted(random.Random(seed).sample(todo, sample))
    sizes: Counter = Counter()
    # PIL decodes without the GIL: threads scale a real release's 10^5 images over the cores; findings stay in path
    # order whatever the number of threads
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for p, (size, why) in zip(todo, tqdm(pool.map(_decode_one, todo), total=len(todo),
                                              desc=f"decoding {res.dataset}", unit="img", disable=not progress)):
            if why is None:
                sizes[size] += 1
            else:
                res.add("corrupt", p, why)
    res.decoded = len(todo)
    res.facts["image_sizes"] = {f"{w}x{h}": n for (w, h), n in sizes.most_common(5)}
    want = registry.dataset(res.dataset).release.get("image_size")
    if res.counts_mode == "release" and want is not None:
        off = sum(n for s, n in sizes.items() if s != want)
        if off:
            res.add("count", "images", f"{off:,} decoded images are not {want[0]}x{want[1]} (the release's size): "
                                       f"{dict(list(res.facts['image_sizes'].items()))}")


# -- entry points ----------------------------------------------------------------------------------------------------
#: a dataset's own checks (the others: a pair loader's splits, counted by _COUNTS or by pairs, then its images)
_CHECKS = {"clevr-change": _clevr_change, "birds": _birds}
_COUNTS = {"spot-the-diff": (_spot_counts, "the release's resized_images/ may hold frames of unannotated ids; "
                                           "not an error"),
           "editing-request": (_ier_counts, "the image download may hold images of other splits; not an error")}


def verify(root: str | Path, dataset: str, *, decode: bool = True, sample: int | None = None,
           counts: str = "auto", progress: bool = True, workers: int | None = None) -> Result:
    """Check the copy of ``dataset`` at ``root`` (see the module's docstring); never raises for a problem of the
    copy, only for bad arguments."""
    known = registry.DATASETS
    if dataset not in known:
        raise IdckitError(f"unknown dataset {dataset!r}", fix=f"use one of {', '.join(known)}")
    if sample is not None and sample < 1:
        raise IdckitError(f"--sample must be at least 1, got {sample}", fix="omit it to decode every image")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"{dataset} root is not a directory", path=root,
                           fix="pass the folder that holds the dataset (see docs/real_data.md)")
    mode = _resolve_mode(root, counts)
    res = Result(dataset, root, mode)
    release = dict(known[dataset].release) or None
    expected = None if mode == "none" else (_declared(root) if mode == "declared" else release)
    if dataset in _CHECKS:
        present = _CHECKS[dataset](res, expected)
    else:
        count_fn, note = _COUNTS.get(dataset, (_pair_counts, "not an error"))
        present = _pair_dataset(res, expected, known[dataset].load, count_fn, note)
    if decode:
        _decode(res, present, sample, progress, workers or min(8, os.cpu_count() or 1))
    return res


def fast_lines(root: str | Path, dataset: str) -> list[tuple[bool, str]]:
    """``idckit doctor``'s lines for a root: the fast part of :func:`verify` (no image decoded)."""
    try:
        res = verify(root, dataset, decode=False, progress=False)
    except IdckitError as err:
        return [(False, f"verify-data {dataset}: {str(err).splitlines()[0]}")]
    head = (res.ok, f"verify-data {dataset} (fast, no decoding): {res.summary().split(': ', 1)[1]}")
    details = [(False, "    " + line) for line in res.lines(limit=3)[1:] if not line.startswith("note:")]
    fix = [] if res.ok else [(False, f"    fix: run `idckit verify-data {root} --dataset {dataset}` for the full list")]
    return [head, *details[:12], *fix]


def _own_json(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and {"dataset", "counts", "findings"} <= doc.keys()


def main(root: str | Path, dataset: str, *, sample: int | None = None, counts: str = "auto",
         fast: bool = False, json_out: str | Path | None = None, limit: int = 20, workers: int | None = None) -> int:
    if json_out is not None:   # the write policy before any decoding: never an input, never a foreign file
        json_out = fileio.claim_file(json_out, "--json", inputs=[root], recognise=_own_json,
                                     what="an earlier verify-data report")
    res = verify(root, dataset, decode=not fast, sample=sample, counts=counts, workers=workers)
    for line in res.lines(limit=limit):
        print(line)
    if json_out is not None:
        fileio.write_json(Path(json_out), {"dataset": res.dataset, "root": str(res.root),
                                           "counts": res.counts_mode, "ok": res.ok, "images": res.images,
                                           "decoded": res.decoded, "facts": res.facts, "notes": res.notes,
                                           "findings": [f.__dict__ for f in res.findings]})
    return 0 if res.ok else 1
