"""Writing a synthetic dataset directory: reuse, refusal, an atomic swap at the end, a pool whose order is fixed.

A generator builds its whole dataset in a per-process staging folder (idckit.fileio's write policy) and moves it
into ``out`` only when every file is written, so a killed run never leaves a half dataset that looks finished.
``synth_info.json`` holds the arguments: a directory holding the same ones is reused, one holding other
arguments of the same generator is replaced only with ``overwrite``, another generator's dataset and a folder
the kit did not write are never replaced, and entries the generator did not write (notes, ``features/``) are
refused, or with ``force`` kept.
"""
from __future__ import annotations

import io
import json
import numbers
import os
import shutil
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from idckit import fileio
from idckit.errors import DatasetError
from idckit.fileio import resolve_out
from idckit.paths import DEFAULT_PROFILE
from idckit.settings import load_config

MARKER = "synth_info.json"


def from_profile(config: str, profile: str | None, **given):
    """A generator's arguments: each one given, or where it is None the value of ``configs/<config>.json`` at
    ``profile`` (None: the kit's default profile). The generators' defaults live in those files only; the
    arguments carry the files' names (``pairs``, ``seed``, ...)."""
    resolved = load_config(config, profile or DEFAULT_PROFILE)
    return {k: resolved[k] if v is None else v for k, v in given.items()}


# What each generator writes at the top of its folder (the entries it owns there) and the file that tells its
# datasets apart from the other generators' (how a dataset written before the owner marker is recognised).
KINDS = {
    "synth-clevr-change": ("SynthCLEVR-Change dataset", "type_mapping.json",
                           ("change_captions.json", "images", "no_change_captions.json", "nsc_images", "sc_images",
                            "scene_descriptions.json", "scenes", "splits.json", MARKER, "type_mapping.json")),
    "synth-birds": ("SynthBirds dataset", "synth_birds.json",
                    ("CUB_200_2011", "birds_to_words", "cvpr2016_cub", "nabirds", "synth_birds.json", MARKER)),
    "synth-spot-the-diff": ("SynthSpot-the-Diff dataset", "changes.json",
                            ("annotations", "changes.json", "resized_images", "scene_descriptions.json", MARKER)),
    "synth-ier": ("SynthIER dataset", "edits.json",
                  ("edits.json", "images", "scene_descriptions.json", "test.json", "train.json", "valid.json", MARKER)),
}
MAX_PAIRS = 10_000_000     # 125x the real CLEVR-Change; more is a typo, and the job list alone would not fit in memory
MIN_BYTES_PER_PAIR = 1024  # far below any generator's (the smallest writes ~15 KB a pair at 64x48)


def _recognise(out: Path) -> dict | None:
    """The owner record of a dataset the kit wrote before the owner marker: its synth_info.json says synthetic and
    its layout says which generator."""
    marker = out / MARKER
    if not marker.is_file():
        return None
    try:
        old = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        old = None
    if not isinstance(old, dict) or old.get("synthetic") is not True:   # not the marker the kit writes
        raise DatasetError(f"{MARKER} here is not one idckit wrote (unreadable, or not marked synthetic), so this "
                           "directory may not be a synthetic dataset; refusing to replace it", path=marker,
                           fix="choose another --out (or empty this directory yourself)")
    for kind, (_, telltale, entries) in KINDS.items():
        if (out / telltale).exists():
            return {"kind": kind, "what": KINDS[kind][0], "entries": list(entries)}
    return None


def claim(out: Path, kind: str, info: dict, overwrite: bool, force: bool = False,
          legacy: dict | None = None) -> "fileio.Claim | None":
    """None if ``out`` already holds this dataset (reused as is); else the claim on ``out`` to write it into.

    Refused (nothing written or deleted): another kind of dataset, another synthetic dataset of this kind without
    ``overwrite``, and entries the generator did not write (the user's notes, a ``features/`` store) without
    ``force``; with ``force`` those are kept, never deleted. ``legacy``: what a key of ``info`` meant in markers
    written before the generator had it."""
    what, _, entries = KINDS[kind]
    c = fileio.claim_dir(out, kind, recognise=_recognise, will_write=entries, what=what, check=False,
                         error=DatasetError, foreign_note=f" (no {MARKER})")
    if c.previous is not None:
        try:
            old = json.loads((c.path / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        legacy = legacy or {}
        keys = {*info, *legacy}
        if isinstance(old, dict) and all(old.get(k, legacy.get(k)) == info.get(k, legacy.get(k)) for k in keys):
            return None
        if not overwrite:
            raise DatasetError(f"output directory holds another {what} (another synthetic dataset of this "
                               "generator, made with other arguments)",
                               path=c.path, fix="choose another --out, or pass --overwrite to replace it")
    c.check(force)
    return c


def reusable(out: Path, info: dict, overwrite: bool, legacy: dict | None = None) -> bool:
    """Kept for callers outside the generators: True if ``out`` holds this dataset (any kind)."""
    owner = _recognise(out) if out.is_dir() else None
    if owner is None:
        return False
    return claim(out, owner["kind"], info, overwrite, legacy=legacy) is None


def check_pairs_fit(out: Path, n_pairs: int) -> None:
    """An impossible size is refused before the job list is built (``--pairs 10**12`` would exhaust memory)."""
    if n_pairs > MAX_PAIRS:
        raise DatasetError(f"--pairs {n_pairs} is more than this generator can write (at most {MAX_PAIRS:,})",
                           path=out, fix="pass a smaller --pairs (the real CLEVR-Change has 79,606 pairs)")
    where = out if out.exists() else out.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if n_pairs * MIN_BYTES_PER_PAIR > free:
        raise DatasetError(f"--pairs {n_pairs} needs more than {n_pairs * MIN_BYTES_PER_PAIR / 2**30:.1f} GiB; "
                           f"{free / 2**30:.1f} GiB are free there", path=where,
                           fix="pass a smaller --pairs, or an --out on a larger disk")


@contextmanager
def staging(c) -> Iterator[Path]:
    """A fresh per-process folder; on success its entries replace the dataset's own (synth_info.json last, so a
    kill mid-swap leaves no folder that looks finished), else it is removed."""
    marker = None                   # set once the body finished: only the swap's own failure is handled below
    try:
        with c.staging(last=(MARKER,)) as tmp:
            yield tmp
            marker = (tmp / MARKER).read_bytes() if (tmp / MARKER).is_file() else b""
    except OSError as e:
        if marker is None:
            raise
        # two processes that generate one dataset at once (two notebooks, two lanes): the second finds the first's
        # published folder in its way; the same marker means the same arguments, hence the same bytes, so it reads
        # the first's and discards its own
        published = c.path / MARKER
        if c.previous is None and marker and published.is_file() and published.read_bytes() == marker:
            return
        raise DatasetError(f"another process wrote this folder while this one generated it ({e.strerror}); "
                           "nothing of it was replaced", path=c.path,
                           fix="run one generator per folder at a time, or choose another --out") from e


def write_json(path: Path, obj, *, indent: int | None = None) -> None:
    """Deterministic JSON (the real files' style: ``", "``/``": "`` separators, non-ASCII kept)."""
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + ("\n" if indent else ""),
                    encoding="utf-8")


def encode(img, fmt: str) -> bytes:
    """PIL image -> file bytes with fixed settings (so the bytes depend on the pixels only)."""
    buf = io.BytesIO()
    fmt = fmt.lower().lstrip(".")
    if fmt == "png":
        img.save(buf, format="PNG", optimize=False, compress_level=6)
    elif fmt in ("jpg", "jpeg"):
        img.convert("RGB").save(buf, format="JPEG", quality=90, subsampling=2, optimize=False)
    elif fmt == "gif":
        img.convert("RGB").quantize(colors=256, method=0, dither=0).save(buf, format="GIF")
    else:
        raise ValueError(f"unsupported image format {fmt!r}")
    return buf.getvalue()


def ordered_map(fn: Callable, jobs: Iterable, workers: int, chunksize: int = 4) -> Iterator:
    """``map(fn, jobs)`` in order, over ``workers`` forked processes when more than one."""
    if workers <= 1:
        yield from map(fn, jobs)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap(fn, jobs, chunksize=chunksize)


def check_common(out: Path, n_pairs: int, minimum: int, workers: int, seed: int) -> Path:
    """Every generator argument checked before the first image (a bad one found later would waste the rendering);
    returns ``out`` resolved."""
    if n_pairs < minimum:
        raise DatasetError(f"--pairs {n_pairs} is too small", path=out,
                           fix=f"use at least {minimum} so every split has pairs")
    out = check_workers_seed_out(out, workers, seed)
    check_pairs_fit(out, n_pairs)
    return out


def check_workers_seed_out(out: Path, workers: int, seed: int) -> Path:
    """The arguments every generator has, and ``--out`` resolved (links, loops, ``.``, read-only places)."""
    if workers < 1:
        raise DatasetError(f"--workers must be >= 1, got {workers}", path=out, fix="pass --workers 1 or more")
    # numpy's seed sequences take only non-negative integers
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DatasetError(f"--seed must be an integer >= 0, got {seed!r}", path=out, fix="pass --seed 0 or any n >= 0")
    return resolve_out(out, "--out", must_write=False, error=DatasetError)


def split_ids(n: int, seed: int, fractions: dict[str, float]) -> dict[str, list[int]]:
    """A seeded partition of ``range(n)`` into train/val/test with the given val and test fractions."""
    perm = np.random.default_rng([seed, 2**31 - 2]).permutation(n)
    n_val, n_test = max(1, round(n * fractions["val"])), max(1, round(n * fractions["test"]))
    return {"train": sorted(map(int, perm[n_val + n_test:])), "val": sorted(map(int, perm[:n_val])),
            "test": sorted(map(int, perm[n_val:n_val + n_test]))}
