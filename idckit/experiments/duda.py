"""DUDA as a baseline row of tables 2 and 3: trained once per (data, features, settings, seed) and cached.

The data pipeline is IDC-PCL's: the same synthetic default or real root, the same feature store (the backbone of
``configs/duda.json``, by default the IDC-PCL rows' one, so the store is shared) and the same vocabulary rules
(:func:`idckit.tasks.pcl.load_pcl_data`). Results have the keys of :func:`idckit.experiments.pcl.run_variant`
(``test`` per subset, ``run``, ``history``, ``best_step``, ``wall_seconds``) so a table puts the rows side by side.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from idckit.errors import ConfigError
from idckit.experiments import pcl
from idckit.experiments.config import load_config, train_config
from idckit.experiments.pcl import Setup
from idckit.experiments.runs import Run, open_run
from idckit.paths import DEFAULT_PROFILE

MODEL = "DUDA (idckit)"
VARIANTS: dict[str, dict[str, Any]] = {"duda": {"label": "DUDA"}}


def setup(profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, backbone: str | None = None, overrides: dict | None = None,
          hard: bool = False, progress: bool = True, device: str | None = None) -> Setup:
    """Data (generated on first use when synthetic) and its grid features (extracted once, shared with IDC-PCL).
    ``hard`` and ``device`` as in :func:`idckit.experiments.pcl.setup`."""
    cfg = load_config("duda", profile, overrides)
    configured = cfg.pop("device")
    if backbone:
        cfg["backbone"] = backbone
    shared = pcl.setup(profile, data_root, runs_dir=runs_dir, backbone=cfg["backbone"], hard=hard,
                       progress=progress, device=device or configured)
    return Setup(profile, cfg, shared.data, shared.store, shared.runs_dir, shared.device, loader=shared.loader)


_DATA_CACHE: dict[tuple, Any] = {}


def _data(s: Setup):
    from idckit.tasks.pcl import load_pcl_data

    key = (str(s.data.root), str(s.store.directory), s.config["max_len"], s.train_fraction)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_pcl_data(s.data.dataset(), s.store, max_len=s.config["max_len"],
                                         train_fraction=s.train_fraction)
    return _DATA_CACHE[key]


def run_variant(variant: str = "duda", profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *,
                seed: int = 0, runs_dir: str | Path | None = None, backbone: str | None = None,
                overrides: dict | None = None, progress: bool = True, setup_: Setup | None = None) -> dict[str, Any]:
    """Train (select on val CIDEr-D), decode and score test; cached by config.

    Returns ``{"variant", "label", "seed", "run", "val", "test": {subset: {metric: value}}, "best_step",
    "history", "wall_seconds", "distinct_test_captions", "caption_judge_accuracy"}``, metrics on pycocoevalcap's
    raw scale. DUDA has no judge head: ``caption_judge_accuracy`` reads its test captions as judgments
    (:func:`idckit.tasks.duda.caption_judge_accuracy`).
    """
    if variant not in VARIANTS:
        raise ConfigError(f"unknown DUDA variant {variant!r}; known: {', '.join(VARIANTS)}")
    s = setup_ or setup(profile, data_root, runs_dir=runs_dir, backbone=backbone, overrides=overrides,
                        progress=progress)
    run_cfg = {"kind": "duda", **s.identity, "max_len": s.config["max_len"], "model": s.config["model"],
               "train": s.config["train"], "seed": seed}
    run = open_run(s.runs_dir, "duda", run_cfg)
    if not run.is_complete():
        _train(s, run, progress)
    return {"variant": variant, "label": VARIANTS[variant]["label"], "seed": seed, "run": run.dir.name,
            **run.metrics()}


def _train(s: Setup, run: Run, progress: bool) -> None:
    from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
    from idckit.tasks.duda import DUDATask, caption_judge_accuracy, no_change_sentences, predict
    from idckit.train.loop import fit

    t0 = time.perf_counter()
    data = _data(s)
    c = run.config["train"]
    with CaptionScorer(meteor=False) as quick:
        task = DUDATask(data, run.config["model"], batch_size=c["batch_size"], attention_l1=c["attention_l1"],
                        swap_before=c["swap_before"], eval_batch_size=c["eval_batch_size"], scorer=quick)
        res = fit(task, train_config(c["loop"], run.config["seed"]), run.dir, progress=progress, device=s.device,
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


def runs(s: Setup, seeds: Sequence[int] = (0,), *, progress: bool = True) -> list[dict[str, Any]]:
    return [run_variant("duda", s.profile, seed=seed, setup_=s, progress=progress) for seed in seeds]


def hard_runs(s: Setup, seeds: Sequence[int] = (0,), *, progress: bool = True
              ) -> tuple[Setup | None, list[dict[str, Any]]]:
    """DUDA on the hard twin of a synthetic setup, labelled as such, as :func:`idckit.experiments.pcl.hard_runs`."""
    from idckit.experiments.data import synth_settings

    if not s.data.synthetic or synth_settings(s.profile, hard=True) == synth_settings(s.profile):
        return None, []
    h = setup(s.profile, runs_dir=s.runs_dir, backbone=s.config["backbone"], hard=True, progress=progress,
              device=s.device)
    results = runs(h, seeds, progress=progress)
    for r in results:
        r["label"] = f"{r['label']} [hard data]"
        r["data"] = h.data.description
    return h, results


def rows(results: Sequence[dict[str, Any]], subset: str = "total") -> list[dict[str, Any]]:
    """Report rows (x100 scale) as :func:`idckit.experiments.pcl.rows`, under the model name DUDA (idckit)."""
    return [{**r, "model": MODEL} for r in pcl.rows(results, subset)]


def per_type_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 3's row per run (CIDEr-D x100 of each change type and the distractors)."""
    return [{**r, "model": MODEL} for r in pcl.per_type_rows(results)]


def compare_notes(pcl_results: Sequence[dict[str, Any]], duda_results: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per seed both models ran: test CIDEr-D (total and semantic), distinct test captions and how
    well each tells changes from distractors (IDC-PCL's judge head; DUDA's captions read as judgments), ending
    with which of the two learned the setting, so a reader sees when the baseline learns what IDC-PCL does not."""
    duda_by_seed = {r.get("seed"): r for r in duda_results}
    notes = []
    for p in pcl_results:
        d = duda_by_seed.get(p.get("seed"))
        if d is None:
            continue
        cp, cd = (100 * r["test"]["total"]["CIDEr-D"] for r in (p, d))
        sp, sd = (100 * r["test"]["semantic"]["CIDEr-D"] if "semantic" in r["test"] else float("nan") for r in (p, d))
        jp, jd = p.get("judge_accuracy"), d.get("caption_judge_accuracy")
        judge = (f"; judging changes from distractors {jp:.2f} (IDC-PCL's head) vs {jd:.2f} (DUDA's captions)"
                 if jp is not None and jd is not None else "")
        better = "DUDA" if cd > cp else "IDC-PCL" if cp > cd else "neither"
        notes.append(f"{p['label']} vs DUDA, seed {p.get('seed')}: test CIDEr-D {cp:.1f} vs {cd:.1f} (semantic "
                     f"{sp:.1f} vs {sd:.1f}), {p.get('distinct_test_captions')} vs {d.get('distinct_test_captions')} "
                     f"distinct test captions{judge}; higher CIDEr-D: {better}.")
    return notes


__all__ = ["MODEL", "VARIANTS", "setup", "run_variant", "runs", "hard_runs", "rows", "per_type_rows",
           "compare_notes"]
