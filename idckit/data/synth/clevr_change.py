"""SynthCLEVR-Change: write a synthetic dataset in exactly the official CLEVR-Change layout.

Besides the official files (see :mod:`idckit.data.clevr_change`) it writes:

- ``scenes/CLEVR_<split>_NNNNNN.json``: the CLEVR scene JSON of every image (the semantic scene carries the
  change record under ``"change"``);
- ``scene_descriptions.json``: ``{image file name: "there is a large red metal cube , ..."}`` for every image of
  the three folders, the single-image text for CLIP-style or general-captioning pre-training;
- ``synth_info.json``: ``{"synthetic": true, "generator", "pairs", "seed", "size", "camera_jitter",
  "lamp_jitter", "counts"}``, and ``"objects": [fewest, most]`` per before scene when it is not CLEVR's 3-10 (absent
  means 3-10, so the sets written before the argument keep their content identity and run keys); its presence is how reports tell synthetic data from the real release, and it is the
  marker without which ``overwrite`` refuses to delete a directory.

Every index draws from ``np.random.default_rng([seed, index])``, so the bytes do not depend on ``workers``.
Change types are balanced (a seeded permutation of ``index % 5``); splits are 85/5/10 like the real
33,830 / 1,988 / 3,985.
"""
from __future__ import annotations

import io
import json
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from idckit.data.clevr_change import CHANGE_TYPES, default_name
from idckit.data.synth import captions, render, scene as scenes, writing
from idckit.data.synth.vocab import GENERATOR_VERSION
from idckit.errors import DatasetError

SPLIT_FRACTIONS = {"train": 0.85, "val": 0.05, "test": 0.10}


def _types(n: int, seed: int) -> list[str]:
    order = np.random.default_rng([seed, 2**31 - 1]).permutation(np.arange(n) % len(CHANGE_TYPES))
    return [CHANGE_TYPES[int(k)] for k in order]


def _splits(n: int, seed: int) -> dict[str, list[int]]:
    perm = np.random.default_rng([seed, 2**31 - 2]).permutation(n)
    n_val, n_test = max(1, round(n * SPLIT_FRACTIONS["val"])), max(1, round(n * SPLIT_FRACTIONS["test"]))
    return {"train": sorted(map(int, perm[n_val + n_test:])), "val": sorted(map(int, perm[:n_val])),
            "test": sorted(map(int, perm[n_val:n_val + n_test]))}


def _png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def _make_index(job: tuple[int, int, str, tuple[int, int], float, float, tuple[int, int]]) -> dict:
    seed, index, ctype, size, camera_jitter, lamp_jitter, n_objects = job
    rng = np.random.default_rng([seed, index])
    for _ in range(20):
        default, semantic, nonsemantic = scenes.sample_triplet(rng, index, ctype, size, camera_jitter=camera_jitter,
                                                               lamp_jitter=lamp_jitter, n_objects=n_objects)
        n_caps = int(rng.integers(4, 9))
        try:
            change = captions.change_captions(default, semantic, semantic["change"], rng, n_caps)
        except captions.Unreferable:
            continue
        images = {}
        for sc in (default, semantic, nonsemantic):
            img, _ = render.render(sc, size)
            images[sc["image_filename"]] = _png(img)
        return {"index": index, "scenes": (default, semantic, nonsemantic), "images": images,
                "change": change, "no_change": captions.no_change_captions(rng, int(rng.integers(3, 7)))}
    raise RuntimeError(f"index {index}: no referable change in 20 scene draws")


def is_kit_dataset(path: Path) -> bool:
    """True if ``path`` holds a dataset this kit generated (its ``synth_info.json`` marker says so)."""
    info = path / "synth_info.json"
    try:
        return info.is_file() and json.loads(info.read_text()).get("synthetic") is True
    except (OSError, ValueError):
        return False


def generate(out: str | Path, *, n_pairs: int | None = None, seed: int | None = None,
             size: tuple[int, int] | None = None, camera_jitter: float | None = None, lamp_jitter: float | None = None,
             objects: tuple[int, int] | None = None, workers: int | None = None, profile: str | None = None,
             overwrite: bool = False, progress: bool = True, force: bool = False) -> Path:
    """Write SynthCLEVR-Change to ``out`` (atomically); reuse it if it already holds the same arguments. An argument
    left None is ``configs/synth_clevr_change.json``'s at ``profile`` (None: the default profile).

    ``camera_jitter`` and ``lamp_jitter`` are CLEVR's jitter sizes (CLEVR-Change renders 1.0; the cpu profile 0):
    smaller values give distractors that move the camera and lamps less, an easier set. ``objects`` = (fewest,
    most) objects in a before scene, CLEVR's (3, 10) by default; fewer objects make the change a larger share.
    ``force``: write beside entries the generator did not write (kept, never deleted).
    """
    a = writing.from_profile("synth_clevr_change", profile, pairs=n_pairs, seed=seed, size=size,
                             camera_jitter=camera_jitter, lamp_jitter=lamp_jitter, objects=objects, workers=workers)
    n_pairs, seed, size, workers = a["pairs"], a["seed"], a["size"], a["workers"]
    camera_jitter, lamp_jitter, objects = a["camera_jitter"], a["lamp_jitter"], a["objects"]
    out = Path(out)
    size = (int(size[0]), int(size[1]))
    if n_pairs < len(CHANGE_TYPES) * 4:
        raise DatasetError(f"--pairs {n_pairs} is too small", path=out,
                           fix=f"use at least {len(CHANGE_TYPES) * 4} so every change type and split appears")
    if min(size) < 32:
        raise DatasetError(f"--size {size[0]}x{size[1]} is too small to render objects", path=out,
                           fix="use at least 32x32 (the profile's size is in configs/synth_clevr_change.json: "
                               "240x160 at cpu)")
    out = writing.check_workers_seed_out(out, workers, seed)
    writing.check_pairs_fit(out, n_pairs)
    for name, value in (("--camera-jitter", camera_jitter), ("--lamp-jitter", lamp_jitter)):
        if not (0.0 <= float(value) <= 3.0):
            raise DatasetError(f"{name} must be between 0 and 3 scene units, got {value}", path=out,
                               fix=f"pass {name} 1.0 (CLEVR-Change's value) or a smaller value for easier data")
    objects = (int(objects[0]), int(objects[1]))
    if not (1 <= objects[0] <= objects[1] <= scenes.MAX_OBJECTS):
        raise DatasetError(f"--objects {objects[0]}-{objects[1]} is not a range within 1-{scenes.MAX_OBJECTS}",
                           path=out, fix="pass --objects 3-10 (CLEVR's) or a smaller range such as 2-4")
    info = {"synthetic": True, "generator": GENERATOR_VERSION, "pairs": n_pairs, "seed": seed, "size": list(size),
            "camera_jitter": float(camera_jitter), "lamp_jitter": float(lamp_jitter)}
    if objects != (scenes.MIN_OBJECTS, scenes.MAX_OBJECTS):
        info["objects"] = list(objects)
    claim = writing.claim(out, "synth-clevr-change", info, overwrite, force,
                          legacy={"objects": [scenes.MIN_OBJECTS, scenes.MAX_OBJECTS]})  # absent: CLEVR's 3-10
    if claim is None:
        return out

    types = _types(n_pairs, seed)
    jitter = (float(camera_jitter), float(lamp_jitter))
    jobs = [(seed, i, types[i], size, *jitter, objects) for i in range(n_pairs)]
    change_caps, no_change_caps, descriptions = {}, {}, {}
    type_mapping: dict[str, list[str]] = {t: [] for t in CHANGE_TYPES}
    folder = {"default": "images", "semantic": "sc_images", "nonsemantic": "nsc_images"}
    with writing.staging(claim) as tmp:
        for sub in ("images", "sc_images", "nsc_images", "scenes"):
            (tmp / sub).mkdir()
        with get_context("fork").Pool(workers) if workers > 1 else _Serial() as pool:
            results = pool.imap(_make_index, jobs, chunksize=4)
            for r in tqdm(results, total=n_pairs, desc="SynthCLEVR-Change", unit="pair", disable=not progress):
                i = r["index"]
                for sc in r["scenes"]:
                    name = sc["image_filename"]
                    (tmp / folder[sc["split"]] / name).write_bytes(r["images"][name])
                    (tmp / "scenes" / name.replace(".png", ".json")).write_text(json.dumps(sc, sort_keys=True))
                    descriptions[name] = captions.describe_scene(sc)
                change_caps[default_name(i)] = r["change"]
                no_change_caps[default_name(i)] = r["no_change"]
                type_mapping[types[i]].append(f"{i:06d}.png")
        splits = _splits(n_pairs, seed)
        counts = {s: {t: sum(types[i] == t for i in idx) for t in CHANGE_TYPES} for s, idx in splits.items()}
        for name, obj in (("change_captions.json", change_caps), ("no_change_captions.json", no_change_caps),
                          ("splits.json", splits), ("type_mapping.json", type_mapping),
                          ("scene_descriptions.json", descriptions),
                          ("synth_info.json", {**info, "counts": counts})):
            (tmp / name).write_text(json.dumps(obj, sort_keys=True))
    return out


class _Serial:
    """Pool stand-in for workers=1 (same code path, no processes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, jobs, chunksize=1):
        return map(fn, jobs)

