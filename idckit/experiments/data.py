"""The dataset a notebook runs on: the real one when ``data_root`` is given, else the embedded synthetic default.

The synthetic default's size per profile is data (``configs/synth_clevr_change.json``), like every other setting.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from idckit import paths
from idckit.data.clevr_change import ClevrChange
from idckit.errors import ConfigError
from idckit.experiments.config import load_config



def synth_settings(profile: str, hard: bool = False) -> dict:
    """The synthetic default of ``profile``; ``hard`` swaps in the faithful CLEVR-Change jitter (its ``hard`` key)."""
    s = load_config("synth_clevr_change", profile)
    hard_settings = s.pop("hard")
    return {**s, **hard_settings} if hard else s


@dataclass(frozen=True)
class DataChoice:
    root: Path
    synthetic: bool
    description: str  # for report provenance
    version: str

    def dataset(self) -> ClevrChange:
        return ClevrChange(self.root)


def clevr_change(profile: str, data_root: str | Path | None = None, *, hard: bool = False,
                 progress: bool = True) -> DataChoice:
    """The CLEVR-Change root to use; generates the synthetic default on first use (cached on disk).

    ``hard=True`` is the synthetic set at CLEVR-Change's own jitter, the setting the cpu budget does not learn
    (kept beside the learnable default so reports show what difficulty changes); it has no meaning for real data.
    """
    if data_root and hard:
        raise ConfigError("hard=True picks the faithful synthetic set; it cannot be combined with data_root",
                          fix="drop hard=True for real data (the real CLEVR-Change is the faithful setting)")
    if data_root:
        root = Path(data_root).expanduser().resolve()
        ClevrChange(root)  # validates the layout now, with a helpful error
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return DataChoice(root, True, f"synthetic: SynthCLEVR-Change at {root} ({meta.get('pairs')} pairs, "
                              f"{jitter_words(meta)})", meta.get("generator", "unknown"))
        return DataChoice(root, False, f"real: CLEVR-Change at {root}", "official release")
    s = synth_settings(profile, hard)
    w, h = s["size"]
    cam, lamp = float(s["camera_jitter"]), float(s["lamp_jitter"])
    root = paths.data_dir() / f"synth-clevr-change-n{s['pairs']}-s{s['seed']}-{w}x{h}-cam{cam:g}-lamp{lamp:g}"
    from idckit.data.synth.clevr_change import generate  # renders only if not already there
    from idckit.data.synth.vocab import GENERATOR_VERSION

    generate(root, n_pairs=s["pairs"], seed=s["seed"], size=(w, h), camera_jitter=cam, lamp_jitter=lamp,
             workers=s["workers"])
    return DataChoice(root, True, f"synthetic: SynthCLEVR-Change ({s['pairs']} before-images, seed {s['seed']}, "
                      f"{w}x{h}, {jitter_words(s)})", GENERATOR_VERSION)


def jitter_words(info: dict) -> str:
    """How a synthetic set's difficulty reads in reports; sets written before the knob existed used 1.0."""
    cam, lamp = info.get("camera_jitter", 1.0), info.get("lamp_jitter", 1.0)
    return f"camera jitter {float(cam)}, lamp jitter {float(lamp)}"


# -- birds: Birds-to-Words, CUB-200-2011 and NABirds under one root ------------------------------------------
@dataclass(frozen=True)
class BirdsChoice:
    """A root holding ``birds_to_words/`` (TSV + ``images/``), ``CUB_200_2011/`` (+ the Reed captions beside it)
    and ``nabirds/``: SynthBirds' layout, and how the real downloads are to be arranged."""
    root: Path
    synthetic: bool
    description: str
    version: str

    def b2w(self):
        from idckit.data.birds_to_words import BirdsToWords

        return BirdsToWords(self.root / "birds_to_words")

    def cub(self):
        from idckit.data.cub import Cub

        return Cub(self.root)

    def nabirds(self):
        from idckit.data.nabirds import NABirds

        return NABirds(self.root)

    def images(self) -> list[str]:
        """Every image the experiments read, relative to the root: Birds-to-Words photos that exist, CUB's
        training images (the GIC stage) and NABirds' training images (the FGVC stage)."""
        rel = lambda p: Path(p).resolve().relative_to(self.root).as_posix()
        out = [rel(ph.path) for ph in self.b2w().photos(only_ok=True)]
        out += [rel(im.path) for im in self.cub().images("train")]
        out += [rel(im.path) for im in self.nabirds().images("train")]
        return sorted(set(out))


def birds(profile: str, data_root: str | Path | None = None, *, progress: bool = True) -> BirdsChoice:
    """The bird root to use; generates the SynthBirds default of ``profile`` on first use (cached on disk)."""
    if data_root:
        root = Path(data_root).expanduser().resolve()
        choice = BirdsChoice(root, False, f"real: Birds-to-Words, CUB-200-2011 and NABirds at {root}",
                             "official release")
        choice.b2w(), choice.cub(), choice.nabirds()   # validates the layout now, with a helpful error
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return BirdsChoice(root, True, f"synthetic: SynthBirds at {root} ({meta.get('pairs')} pairs)",
                               meta.get("generator", "unknown"))
        return choice
    s = load_config("synth_birds", profile)
    tree = "x".join(str(t) for t in s["tree"])
    root = paths.data_dir() / (f"synth-birds-n{s['pairs']}-c{s['cub_per_class']}-b{s['nabirds_per_class']}"
                               f"-s{s['seed']}-{s['size']}px-t{tree}")
    from idckit.data.synth.birds import generate
    from idckit.data.synth.vocab import GENERATOR_VERSION

    generate(root, n_pairs=s["pairs"], cub_per_class=s["cub_per_class"], nabirds_per_class=s["nabirds_per_class"],
             size=s["size"], seed=s["seed"], workers=s["workers"], tree=tuple(s["tree"]), progress=progress)
    root = root.resolve()
    return BirdsChoice(root, True, f"synthetic: SynthBirds ({s['pairs']} Birds-to-Words pairs, {s['cub_per_class']} "
                       f"CUB and {s['nabirds_per_class']} NABirds images per species, {s['size']} px, seed "
                       f"{s['seed']})", GENERATOR_VERSION)
