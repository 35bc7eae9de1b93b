"""DUDA as a baseline row of tables 2 and 3: trained once per (data, features, settings, seed) and cached.

The data pipeline is IDC-PCL's: the same synthetic default or real root, the same feature store (the backbone of
``configs/duda.json``, by default the IDC-PCL rows' one, so the store is shared) and the same vocabulary rules
(:func:`idckit.text.pcl_inputs.load_pcl_data`). The one recipe is ``duda/duda``; results have the keys of every
``run_variant`` (:data:`idckit.experiments.runs.RESULT_KEYS`), so a table puts the rows beside IDC-PCL's.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from idckit import registry
from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
from idckit.experiments import base, pcl, recipes
from idckit.experiments.base import Setup
from idckit.experiments.config import check_seeds, load_config, train_config
from idckit.experiments.runs import Run, hard_twin_runs, open_run, variant_result
from idckit.paths import DEFAULT_PROFILE
from idckit.tasks.duda import DUDATask, caption_judge_accuracy, no_change_sentences, predict
from idckit.text.pcl_inputs import load_pcl_data
from idckit.train import loop

FAMILY = registry.family("duda").recipe_family  # its one recipe: duda/duda
MODEL = "DUDA (idckit)"        # the model column of its report rows


def setup(profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, backbone: str | None = None, overrides: dict | None = None,
          hard: bool = False, progress: bool = True, device: str | None = None) -> Setup:
    """Data (generated on first use when synthetic) and IDC-PCL's grid features (its backbone, ``pcl.json``; the
    store is shared). ``backbone``, ``hard`` and ``device`` as in :func:`idckit.experiments.pcl.setup`."""
    cfg = load_config("duda", profile, overrides)
    shared = pcl.setup(profile, data_root, runs_dir=runs_dir, backbone=backbone, hard=hard, progress=progress,
                       device=device)
    return Setup(profile, cfg, shared.data, shared.runs_dir, store=shared.store, device=shared.device,
                 loader=shared.loader)


def loaded_data(s: Setup):
    """The in-memory data of a setup (IDC-PCL's :class:`idckit.text.pcl_inputs.PCLData`, without FDA negatives)."""
    key = (str(s.data.root), str(s.store.directory), s.config["max_len"], s.train_fraction)
    return base.CACHE.get("duda-data", key, lambda: load_pcl_data(s.data.dataset(), s.store,
                                                                  max_len=s.config["max_len"],
                                                                  train_fraction=s.train_fraction))


def run_variant(s: Setup, variant: str = "duda", seed: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """The recipe ``duda/duda`` on ``s``: train (select on val CIDEr-D), decode and score test; cached by config.

    Returns :data:`idckit.experiments.runs.RESULT_KEYS` (``test``: subset -> metric on pycocoevalcap's raw scale)
    and ``caption_judge_accuracy``: DUDA has no judge head (``judge_accuracy`` is None), so its test captions are
    read as judgments (:func:`idckit.tasks.duda.caption_judge_accuracy`).
    """
    recipe = recipes.get_recipe(variant, FAMILY)
    check_seeds([seed])
    c = s.config
    run_cfg = {"kind": "duda", **s.identity, "max_len": c["max_len"], "model": c["model"],
               **{k: c[k] for k in ("batch_size", "attention_l1", "swap_before", "eval_batch_size", "train")},
               "seed": seed}
    run = open_run(s.runs_dir, "duda", run_cfg)
    with run.exclusive():
        if not run.is_complete():
            _train(s, run, progress)
    return variant_result(MODEL, recipe, seed, run, train_seconds="finetune_seconds")


def _train(s: Setup, run: Run, progress: bool) -> None:
    t0 = time.perf_counter()
    data = loaded_data(s)
    c = run.config
    with CaptionScorer(meteor=False) as quick:
        task = DUDATask(data, c["model"], batch_size=c["batch_size"], attention_l1=c["attention_l1"],
                        swap_before=c["swap_before"], eval_batch_size=c["eval_batch_size"], scorer=quick)
        res = loop.fit(task, train_config(c["train"], c["seed"]), run.dir, progress=progress, device=s.device,
                       loader=s.loader)
    data.vocab.save(run.dir / "vocab.json")
    preds = predict(res.model, data, "test", batch_size=c["eval_batch_size"], progress=progress)
    write_results(run.dir / "test", preds["captions"])
    split = data.splits["test"]
    test = evaluate_pairs(split.references, preds["captions"], dict(zip(split.pair_ids, split.types)))
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "test": test,
                  "distinct_test_captions": len(set(preds["captions"].values())),
                  "caption_judge_accuracy": caption_judge_accuracy(preds["captions"], split,
                                                                   no_change_sentences(data)),
                  "finetune_seconds": res.wall_seconds, "pretrain_seconds": 0.0,
                  "wall_seconds": round(time.perf_counter() - t0, 1)})


#: the one ``duda/*`` recipe for every seed on one setup
runs = base.family_runs(run_variant, FAMILY)


def hard_runs(s: Setup, variants: Sequence[str] = ("duda",), seeds: Sequence[int] = (0,), *, progress: bool = True
              ) -> tuple[Setup | None, list[dict[str, Any]]]:
    """DUDA on the hard twin of a synthetic setup, labelled as such, as :func:`idckit.experiments.pcl.hard_runs`."""
    return hard_twin_runs(s, setup, runs, variants, seeds, progress=progress)


__all__ = ["FAMILY", "MODEL", "setup", "loaded_data", "run_variant", "runs", "hard_runs"]
