"""The README's guide "Add a model, a dataset or a table", as code: a dataset and an experiment family from outside the
kit, each one record handed to :func:`idckit.registry.register` (:data:`DATASET`, :data:`FAMILY_RECORD`, with the
config file in :data:`CONFIG_DIR`). tests/test_registry.py registers them and drives ``idckit list``, ``config``,
``train`` and ``verify-data`` through them.

The dataset: ``pairs_{train,val,test}.json`` (lists of ``{"id", "before", "after", "caption"}``) beside ``images/``.
The family: a two-weight model that tells a changed pair from an unchanged one by the mean absolute pixel difference,
trained by the kit's one loop (:func:`idckit.train.loop.fit`) into the run cache.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from idckit import checkpoints, paths, registry
from idckit.data.clevr_change import Pair
from idckit.data.images import load_image
from idckit.errors import DatasetError
from idckit.experiments import base, recipes
from idckit.experiments.base import Setup
from idckit.experiments.config import load_config, train_config
from idckit.experiments.runs import open_run, variant_result
from idckit.train.loop import fit

SPLITS = ("train", "val", "test")
CONFIG_DIR = Path(__file__).parent / "toy_configs"
GENERATOR_VERSION = "toy-pairs/1"


# -- the dataset ---------------------------------------------------------------------------------------------------
class ToyPairs:
    """A toy pair dataset's loader: what verify-data and ``setup`` read (``entries``, ``pairs``)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        missing = [s for s in SPLITS if not (self.root / f"pairs_{s}.json").is_file()]
        if missing:
            raise DatasetError(f"no {', '.join(f'pairs_{s}.json' for s in missing)} here", path=self.root,
                               fix="generate a toy set with tests/toy_family.generate")

    def entries(self, split: str) -> list[dict[str, Any]]:
        return json.loads((self.root / f"pairs_{split}.json").read_text())

    def pairs(self, split: str, check_images: bool = True) -> list[Pair]:
        return [Pair(e["id"], i, self.root / "images" / e["before"], self.root / "images" / e["after"],
                     (e["caption"],), "change" if e["changed"] else "distractor")
                for i, e in enumerate(self.entries(split))]


def generate(root: str | Path, n_pairs: int = 12, seed: int = 0, **_: Any) -> Path:
    """A toy set: grey 8x8 images, half the pairs with a bright square pasted into the after-image."""
    root, rng = Path(root), np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        entries = []
        for i in range(n_pairs):
            before = rng.integers(0, 60, (8, 8), dtype=np.uint8)
            after, changed = before.copy(), bool(i % 2)
            if changed:
                after[2:6, 2:6] = 255
            pid = f"{split}{i}"
            Image.fromarray(before).save(root / "images" / f"{pid}_a.png")
            Image.fromarray(after).save(root / "images" / f"{pid}_b.png")
            entries.append({"id": pid, "before": f"{pid}_a.png", "after": f"{pid}_b.png", "changed": changed,
                            "caption": "the square appeared" if changed else "no change"})
        (root / f"pairs_{split}.json").write_text(json.dumps(entries))
    return root


DATASET = registry.Dataset(
    "toy-pairs", "Toy pairs", "SynthToy", "toy_root", "pairs_{train,val,test}.json and images/",
    loader="toy_family:ToyPairs", generator="toy_family", config="toy", markers=("pairs_train.json", "images"),
    images="images")


# -- the family ----------------------------------------------------------------------------------------------------
FAMILY = "toy"                  # its recipes' family
MODEL = "toy judge"             # the model column of its report rows
FAMILY_RECORD = registry.Family(
    "toy", "toy_family", FAMILY, "toy-pairs", ("toy", "train"), ("toy", ()), ("toy", "model", None),
    "toy_family:ToyConfig",
    recipes=(registry.Recipe("toy/base", "toy", "a changed-pair detector on the mean pixel difference",
                             ("toy.table1",)),))


@dataclass
class ToyConfig:
    init: float


def _features(root: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = ToyPairs(root).pairs(split)
    diff = [np.abs(np.asarray(load_image(p.after), float) - np.asarray(load_image(p.before), float)).mean() / 255
            for p in pairs]
    return torch.tensor(diff, dtype=torch.float32)[:, None], torch.tensor([p.change_type == "change" for p in pairs])


class ToyTask:
    selection_metric = "accuracy"

    def __init__(self, root: Path, cfg: ToyConfig):
        self.cfg, self.train, self.val = cfg, _features(root, "train"), _features(root, "val")

    def build_model(self) -> torch.nn.Module:
        model = torch.nn.Linear(1, 1)
        torch.nn.init.constant_(model.weight, self.cfg.init)
        return model

    def param_groups(self, model):
        return [{"params": list(model.parameters())}]

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[Any]:
        yield self.train

    def train_step(self, model, batch, step):
        x, y = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y.float())
        return loss, {"loss": float(loss.detach())}

    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        x, y = self.val
        with torch.no_grad():
            return {"accuracy": float(((model(x)[:, 0] > 0) == y).float().mean())}


def setup(profile: str, data_root: str | Path | None = None, *, runs_dir: str | Path | None = None,
          progress: bool = True, device: str | None = None) -> Setup:
    cfg = load_config("toy", profile)
    runs = Path(runs_dir) if runs_dir else paths.runs_dir()
    root = Path(data_root) if data_root else generate(runs / "toy-data", n_pairs=cfg["pairs"])
    ToyPairs(root)
    return Setup(profile, cfg, root, runs, device=device or "cpu")


def run_variant(s: Setup, variant: str = "base", seed: int = 0, *, progress: bool = True) -> dict[str, Any]:
    recipe = recipes.get_recipe(variant, FAMILY)
    run = open_run(s.runs_dir, "toy", {"kind": "toy", "data": str(s.data), "model": s.config["model"],
                                       "train": s.config["train"], "seed": seed})
    with run.exclusive():
        if not run.is_complete():
            res = fit(ToyTask(s.data, ToyConfig(**s.config["model"])), train_config(s.config["train"], seed),
                      run.dir, progress=progress, device=s.device)
            run.complete({"val": res.best_metrics, "best_step": res.best_step, "test": {}, "toy_seconds": 0.0})
    return variant_result(MODEL, recipe, seed, run, train_seconds="toy_seconds")


runs = base.family_runs(run_variant, FAMILY)


def load_run(run_dir: str | Path, checkpoint: str = "best", device: str = "cpu"):
    """(model, step) of a finished toy run: what :meth:`idckit.registry.Family.load_run` calls."""
    path, fix = Path(run_dir) / "best.pt", "train the toy run again"
    model = checkpoints.load_into(torch.nn.Linear(1, 1), checkpoints.load(path, fix=fix), path=path, fix=fix)
    return model.to(device).eval(), json.loads((Path(run_dir) / "metrics.json").read_text())["best_step"]


__all__: Sequence[str] = ("DATASET", "FAMILY_RECORD", "ToyPairs", "generate", "setup", "run_variant", "runs",
                          "load_run")
