"""Shared fixtures. Tests never reach a model hub: HF_HUB_OFFLINE=1 makes missing weights fail fast."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: a second torch thread in each would only make them fight for the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# CLEVR-Change's released schemas (RCC's change/no-change captions, splits, type_mapping), with one more index
# per split so no subset is a singleton.
CHANGE = {
    "CLEVR_default_000000.png": ["the small yellow rubber cylinder changed to brown",
                                 "the tiny yellow cylinder turned brown"],
    "CLEVR_default_000001.png": ["the large red metal cube has been added", "the big red thing has been newly placed"],
    "CLEVR_default_000002.png": ["the small gray rubber sphere is missing", "the tiny gray ball is gone"],
    "CLEVR_default_000003.png": ["the large blue metal cube became green", "the big blue block turned green"],
    "CLEVR_default_000004.png": ["the small cyan ball changed its location",
                                 "the tiny cyan sphere is in a different location"],
    "CLEVR_default_000005.png": ["the large purple rubber cylinder turned metallic",
                                 "the big purple cylinder became shiny"],
}
NO_CHANGE = {
    "CLEVR_default_000000.png": ["no change was made", "the two scenes seem identical"],
    "CLEVR_default_000001.png": ["there is no change"],
    "CLEVR_default_000002.png": ["nothing has changed"],
    "CLEVR_default_000003.png": ["there is no difference", "nothing was modified"],
    "CLEVR_default_000004.png": ["the scene remains the same"],
    "CLEVR_default_000005.png": ["no change has occurred"],
}
SPLITS = {"train": [0, 3], "val": [1, 4], "test": [2, 5]}
TYPES = {"color": ["000000.png", "000003.png"], "material": ["000005.png"], "add": ["000001.png"],
         "drop": ["000002.png"], "move": ["000004.png"]}


def write_clevr_change(root: Path, *, image_size=(8, 6)) -> Path:
    from PIL import Image

    for sub, prefix in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            shade = (40 * i, 100 if sub == "sc_images" else 50, 200 if sub == "nsc_images" else 20)
            Image.new("RGB", image_size, shade).save(root / sub / f"CLEVR_{prefix}_{i:06d}.png")
    for name, obj in (("change_captions.json", CHANGE), ("no_change_captions.json", NO_CHANGE),
                      ("splits.json", SPLITS), ("type_mapping.json", TYPES)):
        (root / name).write_text(json.dumps(obj))
    return root


@pytest.fixture
def tiny_clevr(tmp_path) -> Path:
    """A six-index CLEVR-Change directory in the official layout (tiny solid-colour PNGs)."""
    return write_clevr_change(tmp_path / "clevr_change")
