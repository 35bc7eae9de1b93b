"""Writing a synthetic dataset directory: reuse, refusal, an atomic swap at the end, a pool whose order is fixed.

A generator builds its whole dataset in a hidden sibling directory and renames it onto ``out`` only when every
file is written, so a killed run never leaves a half dataset that looks finished. ``synth_info.json`` is the
marker: a directory holding the same arguments is reused, one holding other arguments is replaced only with
``overwrite``, and a non-empty directory without the marker (possibly a real download) is never replaced.
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

from idckit.errors import DatasetError

MARKER = "synth_info.json"


def reusable(out: Path, info: dict, overwrite: bool, legacy: dict | None = None) -> bool:
    """True if ``out`` already holds this dataset; raises if it holds something that must not be replaced.
    ``legacy``: what a key of ``info`` meant in markers written before the generator had it."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise DatasetError("output path is a file, not a directory", path=out, fix="choose another --out")
    marker = out / MARKER
    if not marker.is_file():
        if any(out.iterdir()):
            raise DatasetError(f"output directory is not empty and has no {MARKER}, so it is not a synthetic "
                               "dataset written by idckit; refusing to replace it", path=out,
                               fix="choose another --out (or empty this directory yourself)")
        return False
    try:
        old = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        old = None
    if not isinstance(old, dict) or old.get("synthetic") is not True:   # not the marker the kit writes
        raise DatasetError(f"{MARKER} here is not one idckit wrote (unreadable, or not marked synthetic), so this "
                           "directory may not be a synthetic dataset; refusing to replace it", path=marker,
                           fix="choose another --out (or empty this directory yourself)")
    if {k: old.get(k, (legacy or {}).get(k)) for k in info} == info:
        return True
    if not overwrite:
        raise DatasetError("output directory holds another synthetic dataset (made with other arguments)",
                           path=out, fix="choose another --out, or pass --overwrite to replace it")
    return False


@contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A fresh hidden directory beside ``out``; renamed onto ``out`` if the block succeeds, else removed."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def check_common(out: Path, n_pairs: int, minimum: int, workers: int, seed: int) -> None:
    """Every generator argument checked before the first image (a bad one found later would waste the rendering)."""
    if n_pairs < minimum:
        raise DatasetError(f"--pairs {n_pairs} is too small", path=out,
                           fix=f"use at least {minimum} so every split has pairs")
    check_workers_seed_out(out, workers, seed)


def check_workers_seed_out(out: Path, workers: int, seed: int) -> None:
    from idckit.fileio import check_output_dir

    if workers < 1:
        raise DatasetError(f"--workers must be >= 1, got {workers}", path=out, fix="pass --workers 1 or more")
    # numpy's seed sequences take only non-negative integers
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DatasetError(f"--seed must be an integer >= 0, got {seed!r}", path=out, fix="pass --seed 0 or any n >= 0")
    if not out.exists():    # a path under a file or in a read-only place: refused before any work
        check_output_dir(out, "--out")


def split_ids(n: int, seed: int, fractions: dict[str, float]) -> dict[str, list[int]]:
    """A seeded partition of ``range(n)`` into train/val/test with the given val and test fractions."""
    import numpy as np

    perm = np.random.default_rng([seed, 2**31 - 2]).permutation(n)
    n_val, n_test = max(1, round(n * fractions["val"])), max(1, round(n * fractions["test"]))
    return {"train": sorted(map(int, perm[n_val + n_test:])), "val": sorted(map(int, perm[:n_val])),
            "test": sorted(map(int, perm[n_val:n_val + n_test]))}
