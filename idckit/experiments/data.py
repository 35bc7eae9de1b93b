"""The dataset a notebook runs on: the real one when ``data_root`` is given, else the embedded synthetic default.

The synthetic default's size per profile is data (``configs/synth_clevr_change.json``,
``configs/synth_spot_the_diff.json``, ``configs/synth_editing_request.json``), like every other setting.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from idckit import paths
from idckit.data.clevr_change import ClevrChange
from idckit.experiments.config import load_config



def synth_settings(profile: str) -> dict:
    return load_config("synth_clevr_change", profile)


@dataclass(frozen=True)
class DataChoice:
    root: Path
    synthetic: bool
    description: str  # for report provenance
    version: str
    name: str = "clevr-change"  # a key of DATASETS

    def dataset(self):
        """The loader of this root: ``ClevrChange``, ``SpotTheDiff`` or ``EditingRequest`` (one interface)."""
        return loader(self.name)(self.root)


#: the pair datasets a notebook can run on: loader, synthetic generator and its config, names for reports, the
#: R@K of the paper's retrieval table (CLIP4IDC table 6) beyond 1/5/10
DATASETS = {
    "clevr-change": {"loader": "idckit.data.clevr_change:ClevrChange", "title": "CLEVR-Change",
                     "synth": "SynthCLEVR-Change"},
    "spot-the-diff": {"loader": "idckit.data.spot_the_diff:SpotTheDiff", "title": "Spot-the-Diff",
                      "synth": "SynthSpot-the-Diff", "generator": "idckit.data.synth.spot_the_diff",
                      "config": "synth_spot_the_diff", "paper_ks": (10, 20, 50)},
    "editing-request": {"loader": "idckit.data.editing_request:EditingRequest", "title": "Image-Editing-Request",
                        "synth": "SynthIER", "generator": "idckit.data.synth.editing_request",
                        "config": "synth_editing_request"},
}


def loader(name: str):
    """The loader class of dataset ``name`` (imported on use)."""
    import importlib

    from idckit.errors import ConfigError

    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    module, cls = DATASETS[name]["loader"].split(":")
    return getattr(importlib.import_module(module), cls)


def clevr_change(profile: str, data_root: str | Path | None = None, *, progress: bool = True) -> DataChoice:
    """The CLEVR-Change root to use; generates the synthetic default on first use (cached on disk)."""
    if data_root:
        root = Path(data_root).expanduser().resolve()
        ClevrChange(root)  # validates the layout now, with a helpful error
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return DataChoice(root, True, f"synthetic: SynthCLEVR-Change at {root} ({meta.get('pairs')} pairs)",
                              meta.get("generator", "unknown"))
        return DataChoice(root, False, f"real: CLEVR-Change at {root}", "official release")
    s = synth_settings(profile)
    w, h = s["size"]
    root = paths.data_dir() / f"synth-clevr-change-n{s['pairs']}-s{s['seed']}-{w}x{h}"
    from idckit.data.synth.clevr_change import generate  # renders only if not already there
    from idckit.data.synth.vocab import GENERATOR_VERSION

    generate(root, n_pairs=s["pairs"], seed=s["seed"], size=(w, h), workers=s.get("workers", 2))
    return DataChoice(root, True,
                      f"synthetic: SynthCLEVR-Change ({s['pairs']} before-images, seed {s['seed']}, {w}x{h})",
                      GENERATOR_VERSION)


def pair_dataset(name: str, profile: str, data_root: str | Path | None = None, *,
                 progress: bool = True) -> DataChoice:
    """The root of dataset ``name`` (a key of :data:`DATASETS`) to use: ``data_root`` (real or synthetic, validated
    now), else the profile's synthetic default, generated on first use (cached on disk)."""
    import importlib

    load = loader(name)
    if name == "clevr-change":
        return clevr_change(profile, data_root, progress=progress)
    d = DATASETS[name]
    if data_root:
        root = Path(data_root).expanduser().resolve()
        load(root)  # validates the layout now, with a helpful error
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return DataChoice(root, True, f"synthetic: {d['synth']} at {root} ({meta.get('pairs')} pairs)",
                              meta.get("generator", "unknown"), name)
        return DataChoice(root, False, f"real: {d['title']} at {root}", "official release", name)
    s = load_config(d["config"], profile)
    gen = importlib.import_module(d["generator"])
    root = paths.data_dir() / f"synth-{name}-n{s['pairs']}-s{s['seed']}"
    # the kit's own cache: a set from an older generator version is replaced (never a folder without the marker)
    gen.generate(root, n_pairs=s["pairs"], seed=s["seed"], workers=s.get("workers", 2), overwrite=True,
                 progress=progress)
    return DataChoice(root, True, f"synthetic: {d['synth']} ({s['pairs']} pairs, seed {s['seed']})",
                      gen.GENERATOR_VERSION, name)
