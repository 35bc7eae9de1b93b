"""IDC-PCL experiments on CLEVR-Change: the runs behind tables 2, 3 and 4, each trained once and cached.

A notebook calls :func:`setup` then :func:`runs` (or :func:`run_variant` per run) and gets results back (the keys
of :data:`idckit.experiments.runs.RESULT_KEYS`); everything between (features, vocabulary, FDA negatives,
pre-training, fine-tuning, val selection, test decoding, scoring) happens here. Variants are the ``pcl/*`` recipes
of :mod:`idckit.experiments.recipes`, the rows of table 4; table 2 and table 3 read the ``full`` row, so all three
tables share it, and ``no_judge`` reuses ``full``'s pre-training run (only fine-tuning differs). Report rows are
:mod:`idckit.experiments.reporting`'s.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from idckit import checkpoints, paths, registry
from idckit.data.features import IMAGE_SIZE
from idckit.device import resolve
from idckit.errors import ConfigError, DatasetError
from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
from idckit.experiments import base, recipes, selection
from idckit.experiments.base import Setup
from idckit.experiments.config import check_profile, check_seeds, load_config, train_config
from idckit.experiments.data import clevr_change
from idckit.experiments.runs import Run, final_train_loss, hard_twin_runs, open_run, variant_result
from idckit.fileio import check_output_dir, read_run_file
from idckit.models.pcl import PCL, SWITCHES
from idckit.reports.report import Provenance
from idckit.tasks.pcl import FinetuneTask, PretrainTask, build_config, predict
from idckit.text.negatives import build_negatives
from idckit.text.pcl_inputs import load_pcl_data
from idckit.text.vocab import Vocab
from idckit.train import distributed, loop

FAMILY = registry.family("pcl").recipe_family  # the recipes this module trains: pcl/full, pcl/no_judge, ...
MODEL = "IDC-PCL (idckit)"     # the model column of its report rows


def setup(profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, backbone: str | None = None, overrides: dict | None = None,
          hard: bool = False, progress: bool = True, device: str | None = None) -> Setup:
    """Data (generated on first use when synthetic) and its grid features (extracted once, cached).

    ``hard=True``: the synthetic set at CLEVR-Change's own jitter instead of the profile's learnable default.
    ``device`` (``auto``, ``cpu``, ``cuda:1``, ...) overrides ``configs/runtime.json``'s; a run's result does not
    depend on it beyond float rounding, so it is not part of the run keys."""
    check_profile(profile)
    cfg = load_config("pcl", profile, overrides)
    if backbone:
        cfg["backbone"] = backbone
    runs = check_output_dir(Path(runs_dir) if runs_dir else paths.runs_dir(), "runs_dir")
    device, loader = base.runtime(profile, device)    # an unknown device fails before the data is generated
    data = clevr_change(profile, data_root, hard=hard, progress=progress)
    store = base.features(cfg, data.root, data.tag, runs, device=device, progress=progress)
    return Setup(profile, cfg, data, runs, store=store, device=device, loader=loader)


def loaded_data(s: Setup):
    """The in-memory data of a setup (:class:`idckit.text.pcl_inputs.PCLData`: features, vocabulary, splits; shared by
    every run of a notebook, loaded once per process) with FDA negatives attached."""
    key = (str(s.data.root), str(s.store.directory), s.config["max_len"], s.config["words_kept"], s.train_fraction)
    return base.CACHE.get("pcl-data", key, lambda: _load(s))


def _load(s: Setup):
    data = load_pcl_data(s.data.dataset(), s.store, max_len=s.config["max_len"], train_fraction=s.train_fraction,
                         words_kept=s.config["words_kept"])
    neg = build_negatives(data.splits["train"].references, ratio=s.config["negatives"]["ratio"],
                          seed=s.config["negatives"]["seed"], cache_dir=s.runs_dir / "negatives", progress=False)
    data.negatives = neg.negatives
    data.negative_stats = {"tagger": neg.tagger, **{k: v for k, v in neg.stats.items()
                                                    if isinstance(v, (int, float, str))}}
    return data


def _pretrain_run(s: Setup, recipe: Mapping[str, Any], seed: int) -> Run | None:
    """The pre-training run of a recipe's settings (None when it fine-tunes from scratch)."""
    if recipe["pretrain"] is None:
        return None
    cfg = copy.deepcopy(s.config["pretrain"])
    missing = [k for k in recipe["pretrain"] if not cfg["ratios"].get(k)]
    if missing:
        raise ConfigError(f"the recipe pre-trains with {', '.join(recipe['pretrain'])} but pretrain.ratios gives no "
                          f"positive ratio for {', '.join(missing)} (ratios: {cfg['ratios']})",
                          fix="give every objective a ratio > 0 in pcl.json's pretrain.ratios (or in overrides)")
    cfg["ratios"] = {k: cfg["ratios"][k] for k in recipe["pretrain"]}
    model = {**s.config["model"], **recipe.get("model", {})}
    run_cfg = {"kind": "pcl-pretrain", **s.identity, "max_len": s.config["max_len"], "model": model,
               "negatives": s.config["negatives"] if "fda" in cfg["ratios"] else None, "pretrain": cfg, "seed": seed}
    return open_run(s.runs_dir, "pcl-pretrain", run_cfg)


def _train_pretrain(s: Setup, run: Run, progress: bool) -> None:
    with run.exclusive():
        if run.is_complete():
            return
        c = run.config["pretrain"]
        task = PretrainTask(loaded_data(s), run.config["model"], batch_size=c["batch_size"], ratios=c["ratios"],
                            mask_prob=c["mask_prob"], eos_prob=c["eos_prob"], region_prob=c["region_prob"],
                            tau_mvcl=c["tau_mvcl"], tau_fda=c["tau_fda"], mask_random_from=c["mask_random_from"],
                            mask_none_chosen=c["mask_none_chosen"], fda_samples=c["fda_samples"],
                            sampling=c["sampling"])
        res = loop.fit(task, train_config(c["train"], run.config["seed"]), run.dir, progress=progress,
                       device=s.device, loader=s.loader)
        if distributed.is_main():
            run.complete({"steps": res.steps, "wall_seconds": res.wall_seconds}, **_about(s))
        distributed.barrier()


def run_variant(s: Setup, variant: str = "full", seed: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """The recipe ``pcl/<variant>`` on ``s``: pre-train (if it does), fine-tune, select on val, decode and score
    test; every stage cached by its config.

    Returns :data:`idckit.experiments.runs.RESULT_KEYS` (``test``: subset -> metric on pycocoevalcap's raw scale,
    CIDEr-D 1.0 = 100 in the papers; ``judge_accuracy`` of the distractor judge, None without it) and
    ``finetune_seconds``, ``pretrain_seconds``, ``negatives`` (the FDA tagger and counts).
    """
    recipe = recipes.get_recipe(variant, FAMILY)
    check_seeds([seed])
    v = recipe.settings
    pre = _pretrain_run(s, v, seed)
    model = {**s.config["model"], **v.get("model", {}), **v.get("finetune_model", {})}
    ft = copy.deepcopy(s.config["finetune"])
    run_cfg = {"kind": "pcl-finetune", **s.identity, "max_len": s.config["max_len"], "model": model,
               "init": None if pre is None else pre.key, "finetune": ft, "seed": seed}
    run = open_run(s.runs_dir, "pcl-finetune", run_cfg)
    with run.exclusive():
        if not run.is_complete():
            _finetune(s, run, pre, progress)
    return variant_result(MODEL, recipe, seed, run, train_seconds="finetune_seconds")


def _finetune(s: Setup, run: Run, pre: Run | None, progress: bool) -> None:
    if pre is not None:
        _train_pretrain(s, pre, progress)
    t0 = time.perf_counter()            # after the pre-training, whose own wall time is added once below
    data = loaded_data(s)
    c = run.config["finetune"]
    with CaptionScorer(meteor=False) as quick:
        task = FinetuneTask(data, run.config["model"], batch_size=c["batch_size"], mask_prob=c["mask_prob"],
                            eos_prob=c["eos_prob"], distractor_weight=c["distractor_weight"],
                            loss_reduction=c["loss_reduction"], eval_batch_size=c["eval_batch_size"],
                            decode_min_words=c["decode_min_words"], mask_random_from=c["mask_random_from"],
                            mask_none_chosen=c["mask_none_chosen"], group_by_pair=c["group_by_pair"],
                            captions_per_pair=c["captions_per_pair"], targets=c["targets"],
                            selection_metric=c["selection_metric"], tokenize=c["tokenize"],
                            init_from=None if pre is None else pre.dir / "best.pt", scorer=quick)
        res = loop.fit(task, train_config(c["train"], run.config["seed"]), run.dir,
                       progress=progress, device=s.device, loader=s.loader)
    split = data.splits["test"]

    def test_scores(model) -> dict[str, Any]:
        captions = predict(model, data, "test", batch_size=c["eval_batch_size"], progress=progress,
                           min_words=c["decode_min_words"])["captions"]
        return evaluate_pairs(split.references, captions, dict(zip(split.pair_ids, split.types))) \
            if distributed.is_main() else {}

    preds = predict(res.model, data, "test", batch_size=c["eval_batch_size"], progress=progress,
                    min_words=c["decode_min_words"])
    authors = selection.authors_entry(res, task, run.dir, test_scores)
    if not distributed.is_main():      # rank 0 scores and writes; the others wait for the finished run
        distributed.barrier()
        return
    data.vocab.save(run.dir / "vocab.json")
    write_results(run.dir / "test", preds["captions"])
    test = evaluate_pairs(split.references, preds["captions"], dict(zip(split.pair_ids, split.types)))
    pre_seconds = pre.metrics()["wall_seconds"] if pre is not None else 0.0
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "test": test, "judge_accuracy": preds["judge_accuracy"],
                  "finetune_seconds": res.wall_seconds, "pretrain_seconds": pre_seconds,
                  "wall_seconds": round(time.perf_counter() - t0 + pre_seconds, 1),
                  "negatives": getattr(data, "negative_stats", None), **selection.with_test(authors, test)},
                 **_about(s))
    distributed.barrier()


def _about(s: Setup) -> dict[str, Any]:
    """What a run's record.json says beside the commit: the profile and the data in words (`idckit caption` picks
    among runs of one profile and one dataset)."""
    return {"profile": s.profile, "data": s.data.description, "data_identity": s.data.identity}


def load_run(run_dir: str | Path, checkpoint: str = "best", device: str = "cpu", *, n_regions: int | None = None,
             vocab: Vocab | None = None):
    """(model, step): an IDC-PCL fine-tuning run (trained here, or an authors' checkpoint brought in by ``idckit
    import-checkpoint``) in a model on ``device``, eval mode, with its training step. The one way to load a trained
    IDC-PCL run (:meth:`idckit.registry.Family.load_run`): ``idckit caption``, the released rows and the lab's probes
    all come here.

    It reads the run's own files: ``config.json`` (model section, caption length), ``vocab.json`` and the checkpoint:
    ``best`` (the val-selected step, what the tables report) or ``last`` (the final step; the loop keeps it for
    resuming). The region features' size is the checkpoint's; ``n_regions`` is the grid's (default: the run's
    ``feature_size`` on the stride-32 grid every backbone of the kit has, 7x7 at 224 px). ``vocab``: the words of
    the data the caller will feed it, refused when they are not the run's.
    """
    run_dir = Path(run_dir)
    files = {"best": "best.pt", "last": "last.pt"}
    if checkpoint not in files:
        raise ConfigError(f"unknown checkpoint {checkpoint!r}; known: best, last")
    path, cfg_path, vocab_path = run_dir / files[checkpoint], run_dir / "config.json", run_dir / "vocab.json"
    if not path.is_file() or not cfg_path.is_file() or not vocab_path.is_file():
        raise DatasetError(f"no {files[checkpoint]}, config.json and vocab.json here", path=run_dir,
                           fix="give the directory of a pcl-finetune run under runs/ (or of an imported checkpoint)")
    fix = "train the run again (delete its directory), or pass another run"
    run_cfg = read_run_file(cfg_path, {"model": dict, "max_len": int}, fix=fix)
    words = Vocab.load(vocab_path)
    if vocab is not None and vocab.words != words.words:
        raise DatasetError("this run was trained on another vocabulary than this data's", path=run_dir,
                           fix="set up with the run's data root and train_fraction (see its config.json)")
    state = checkpoints.load(path, what=f"run's {files[checkpoint]}", fix=fix)
    if checkpoint == "last":
        if not isinstance(state, dict) or not isinstance(state.get("loop"), dict) or "step" not in state["loop"]:
            raise ConfigError("the run's last.pt is not a resumable checkpoint", path=path, fix=fix)
        state, step = state.get("model"), state["loop"]["step"]
    else:
        metrics = run_dir / "metrics.json"
        step = json.loads(metrics.read_text()).get("best_step") if metrics.is_file() else None
    project = state.get("project.weight") if isinstance(state, dict) else None
    if not isinstance(project, torch.Tensor) or project.ndim != 2:
        raise ConfigError(f"the run's {files[checkpoint]} is not an IDC-PCL state dict", path=path, fix=fix)
    # runs trained before the model section named n_classes and the switches (idckit.models.pcl.SWITCHES) lack them;
    # the default profile's values (the kit's choices) are what those runs were built with
    base_model = load_config("pcl", paths.DEFAULT_PROFILE)["model"]
    model_cfg = {**{k: base_model[k] for k in ("n_classes", *SWITCHES)}, **run_cfg["model"]}
    size = run_cfg.get("feature_size") or IMAGE_SIZE
    model = PCL(build_config(model_cfg, vocab_size=len(words), feat_dim=project.shape[1],
                             n_regions=n_regions or (size // 32) ** 2, max_text_len=run_cfg["max_len"]), words)
    # every key and shape of the model its config.json and vocab.json build, and finite values
    checkpoints.load_into(model, state, path=path, what=f"run's {files[checkpoint]}", fix=fix)
    return model.to(resolve(device)).eval(), step


def hard_runs(s: Setup, variants: Sequence[str] = ("full",), seeds: Sequence[int] = (0,), *,
              progress: bool = True) -> tuple[Setup | None, list[dict[str, Any]]]:
    """The same runs on the hard twin of a synthetic setup (CLEVR-Change's own jitter; same profile, backbone and
    run cache), labelled as such, for the hard rows of tables 2 and 3. (None, []) on real data."""
    return hard_twin_runs(s, setup, runs, variants, seeds, progress=progress)


#: every requested variant (default: every ``pcl/*`` recipe) for every seed on one setup
runs = base.family_runs(run_variant, FAMILY)


def provenance_fields(s: Setup) -> dict[str, Any]:
    return {"data": s.data.description, "data_version": s.data.version,
            "backbone": s.store.meta.get("backbone"), "weights": s.store.meta.get("weights")}


def provenance(s: Setup, results: Sequence[dict[str, Any]], seeds: Sequence[int], wall_seconds: float):
    tagger = next((r.get("negatives", {}) or {}).get("tagger") for r in results) if results else None
    losses = {r["run"]: final_train_loss(s.runs_dir / r["run"]) for r in results}
    known = [v for v in losses.values() if v is not None]
    return Provenance(profile=s.profile, seeds=list(seeds), wall_seconds=round(wall_seconds, 1),
                      selection_split="val (CIDEr-D)", **provenance_fields(s),
                      extra={"model_size": s.config["model"], "fda_tagger": tagger,
                             "runs": [r["run"] for r in results],
                             # the fine-tuning runs' last logged training loss, and their mean: what a smoke test
                             # pins where the scores of a few steps sit at 0
                             "final_train_loss": round(sum(known) / len(known), 4) if known else None,
                             "final_train_losses": losses,
                             # wall_seconds is this notebook's; training happened once, in the cached runs:
                             "train_seconds": round(sum(r.get("finetune_seconds", 0.0) for r in results)
                                                    + sum({r.get("pretrain_seconds", 0.0) for r in results}), 1)})


__all__ = ["FAMILY", "MODEL", "Setup", "setup", "loaded_data", "run_variant", "runs", "hard_runs", "load_run",
           "provenance", "provenance_fields"]
