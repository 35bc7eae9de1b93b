"""IDC-PCL experiments on CLEVR-Change: the runs behind tables 2, 3 and 4, each trained once and cached.

A notebook calls :func:`setup` then :func:`runs` and gets metrics back; everything between (features,
vocabulary, FDA negatives, pre-training, fine-tuning, val selection, test decoding, scoring) happens here.
Variants are the rows of table 4; table 2 and table 3 read the ``full`` row, so all three tables share it, and
``no_judge`` reuses ``full``'s pre-training run (only fine-tuning differs).
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from idckit import paths
from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR
from idckit.data.features import FeatureStore, extract_features
from idckit.errors import ConfigError, DatasetError
from idckit.experiments.config import check_profile, check_seeds, check_variants, load_config, train_config
from idckit.experiments.data import DataChoice, clevr_change
from idckit.experiments.runs import Run, caption_counts, open_run
from idckit.fileio import check_output_dir
from idckit.train import distributed

#: table 4's rows: (label in the paper, pre-training tasks, model switches, fine-tuning switches)
VARIANTS: dict[str, dict[str, Any]] = {
    "none": {"label": "w/o pre-training", "pretrain": None},
    "mlm": {"label": "MLM", "pretrain": {"mlm": 8}},
    "mlm+mvcl": {"label": "MLM + MVCL", "pretrain": {"mlm": 8, "mvcl": 1}},
    "full": {"label": "MLM + MVCL + FDA (full)", "pretrain": {"mlm": 8, "mvcl": 1, "fda": 2}},
    "no_diff_encoder": {"label": "full w/o image difference encoder", "pretrain": {"mlm": 8, "mvcl": 1, "fda": 2},
                        "model": {"difference_encoder": False}},
    "no_judge": {"label": "full w/o distractor judging", "pretrain": {"mlm": 8, "mvcl": 1, "fda": 2},
                 "finetune_model": {"distractor_head": False}},
}


@dataclass
class Setup:
    profile: str
    config: dict[str, Any]
    data: DataChoice
    store: FeatureStore
    runs_dir: Path
    device: str = "auto"        # where training, decoding and feature extraction run (not part of any run key)
    loader: dict[str, Any] = field(default_factory=dict)   # DataLoader workers (idckit.train.loader; no run key)

    @property
    def identity(self) -> dict[str, Any]:
        """What a run key must depend on besides the training settings: which data (its content, not its path),
        which features."""
        ident = {"data": self.data.identity, "data_version": self.data.version,
                 "features": self.store.meta.get("backbone"), "weights": self.store.meta.get("weights")}
        if self.train_fraction != 1:   # only then, so every run trained on the whole split keeps its key
            ident["train_fraction"] = self.train_fraction
        return ident

    @property
    def train_fraction(self) -> float:
        return float(self.config.get("train_fraction", 1.0))


def setup(profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, backbone: str | None = None, overrides: dict | None = None,
          hard: bool = False, progress: bool = True, device: str | None = None) -> Setup:
    """Data (generated on first use when synthetic) and its grid features (extracted once, cached).

    ``hard=True``: the synthetic set at CLEVR-Change's own jitter instead of the profile's learnable default.
    ``device`` (``auto``, ``cpu``, ``cuda:1``, ...) overrides the config's; a run's result does not depend on it
    beyond float rounding, so it is not part of the run keys."""
    check_profile(profile)
    cfg = load_config("pcl", profile, overrides)
    configured = cfg.pop("device")
    device = device or configured
    loader = cfg.pop("loader")
    if backbone:
        cfg["backbone"] = backbone
    runs = check_output_dir(Path(runs_dir) if runs_dir else paths.runs_dir(), "runs_dir")
    data = clevr_change(profile, data_root, hard=hard, progress=progress)
    out = runs / "features" / data.tag / cfg["backbone"].replace(":", "_").replace("/", "_")
    store = extract_features(data.root, cfg["backbone"], weights=cfg["backbone_weights"], out_dir=out,
                             progress=progress, device=device)
    return Setup(profile, cfg, data, store, runs, device, loader)


_DATA_CACHE: dict[tuple, Any] = {}


def _data(s: Setup):
    """The in-memory data of a setup (shared by every run of a notebook) with FDA negatives attached."""
    from idckit.tasks.pcl import load_pcl_data
    from idckit.text.negatives import build_negatives

    key = (str(s.data.root), str(s.store.directory), s.config["max_len"], s.train_fraction)
    if key not in _DATA_CACHE:
        data = load_pcl_data(s.data.dataset(), s.store, max_len=s.config["max_len"],
                             train_fraction=s.train_fraction)
        train = data.splits["train"]
        neg = build_negatives(train.references, ratio=s.config["negatives"]["ratio"],
                              seed=s.config["negatives"]["seed"], cache_dir=s.runs_dir / "negatives",
                              progress=False)
        data.negatives = neg.negatives
        data.negative_stats = {"tagger": neg.tagger, **{k: v for k, v in neg.stats.items()
                                                        if isinstance(v, (int, float, str))}}
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data
    return _DATA_CACHE[key]


def _pretrain_run(s: Setup, variant: dict, seed: int) -> Run | None:
    if variant["pretrain"] is None:
        return None
    cfg = copy.deepcopy(s.config["pretrain"])
    cfg["ratios"] = dict(variant["pretrain"])
    model = {**s.config["model"], **variant.get("model", {})}
    run_cfg = {"kind": "pcl-pretrain", **s.identity, "max_len": s.config["max_len"], "model": model,
               "negatives": s.config["negatives"] if "fda" in cfg["ratios"] else None, "pretrain": cfg, "seed": seed}
    return open_run(s.runs_dir, "pcl-pretrain", run_cfg)


def _train_pretrain(s: Setup, run: Run, progress: bool) -> None:
    from idckit.tasks.pcl import PretrainTask
    from idckit.train.loop import fit

    if run.is_complete():
        return
    c = run.config["pretrain"]
    task = PretrainTask(_data(s), run.config["model"], batch_size=c["batch_size"], ratios=c["ratios"],
                        mask_prob=c["mask_prob"], eos_prob=c["eos_prob"], region_prob=c["region_prob"],
                        tau_mvcl=c["tau_mvcl"], tau_fda=c["tau_fda"])
    res = fit(task, train_config(c["train"], run.config["seed"]), run.dir, progress=progress,
              device=s.device, loader=s.loader)
    if distributed.is_main():
        run.complete({"steps": res.steps, "wall_seconds": res.wall_seconds}, **_about(s))
    distributed.barrier()


def run_variant(variant: str = "full", profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
                seed: int = 0, runs_dir: str | Path | None = None, backbone: str | None = None,
                overrides: dict | None = None, progress: bool = True, setup_: Setup | None = None,
                device: str | None = None) -> dict[str, Any]:
    """Pre-train (if the variant does), fine-tune, select on val, decode and score test; cached by config.
    ``device`` as in :func:`setup` (ignored when ``setup_`` is given: the setup carries its device).

    Returns ``{"variant", "label", "run", "val": {...}, "test": {subset: {metric: value}}, "wall_seconds",
    "judge_accuracy", "distinct_test_captions", "test_pairs"}`` with metrics on pycocoevalcap's raw scale (CIDEr-D
    1.0 = 100 in the papers).
    """
    check_variants([variant], VARIANTS, "IDC-PCL")
    check_seeds([seed])
    s = setup_ or setup(profile, data_root, runs_dir=runs_dir, backbone=backbone, overrides=overrides,
                        progress=progress, device=device)
    v = VARIANTS[variant]
    pre = _pretrain_run(s, v, seed)
    model = {**s.config["model"], **v.get("model", {}), **v.get("finetune_model", {})}
    ft = copy.deepcopy(s.config["finetune"])
    run_cfg = {"kind": "pcl-finetune", **s.identity, "max_len": s.config["max_len"], "model": model,
               "init": None if pre is None else pre.key, "finetune": ft, "seed": seed}
    run = open_run(s.runs_dir, "pcl-finetune", run_cfg)
    if not run.is_complete():
        _finetune(s, run, pre, progress)
    metrics = run.metrics()
    return {"variant": variant, "label": v["label"], "seed": seed, "run": run.dir.name, **metrics,
            **caption_counts(run.dir)}


def _finetune(s: Setup, run: Run, pre: Run | None, progress: bool) -> None:
    from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
    from idckit.tasks.pcl import FinetuneTask, predict
    from idckit.train.loop import fit

    t0 = time.perf_counter()
    if pre is not None:
        _train_pretrain(s, pre, progress)
    data = _data(s)
    c = run.config["finetune"]
    with CaptionScorer(meteor=False) as quick:
        task = FinetuneTask(data, run.config["model"], batch_size=c["batch_size"], mask_prob=c["mask_prob"],
                            eos_prob=c["eos_prob"], distractor_weight=c["distractor_weight"],
                            eval_batch_size=c["eval_batch_size"], group_by_pair=c["group_by_pair"],
                            captions_per_pair=c["captions_per_pair"],
                            init_from=None if pre is None else pre.dir / "best.pt", scorer=quick)
        res = fit(task, train_config(c["train"], run.config["seed"]), run.dir,
                  progress=progress, device=s.device, loader=s.loader)
    preds = predict(res.model, data, "test", batch_size=c["eval_batch_size"], progress=progress)
    if not distributed.is_main():      # rank 0 scores and writes; the others wait for the finished run
        distributed.barrier()
        return
    data.vocab.save(run.dir / "vocab.json")
    write_results(run.dir / "test", preds["captions"])
    split = data.splits["test"]
    test = evaluate_pairs(split.references, preds["captions"], dict(zip(split.pair_ids, split.types)))
    pre_seconds = pre.metrics()["wall_seconds"] if pre is not None else 0.0
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "test": test, "judge_accuracy": preds["judge_accuracy"],
                  "finetune_seconds": res.wall_seconds, "pretrain_seconds": pre_seconds,
                  "wall_seconds": round(time.perf_counter() - t0 + pre_seconds, 1),
                  "negatives": getattr(data, "negative_stats", None)}, **_about(s))
    distributed.barrier()


def _about(s: Setup) -> dict[str, Any]:
    """What a run's record.json says beside the commit: the profile and the data in words (`idckit caption` picks
    among runs of one profile and one dataset)."""
    return {"profile": s.profile, "data": s.data.description, "data_identity": s.data.identity}


def load_finetuned(s: Setup, run_dir: str | Path, checkpoint: str = "best"):
    """(model, step): a fine-tuning run's weights in a model for ``s``'s data on ``s.device``, eval mode, and their
    training step.

    ``checkpoint``: ``best`` (the val-selected step, what the tables report) or ``last`` (the final step; the loop
    keeps it for resuming). The run must have been trained on this data's vocabulary.
    """
    import torch

    from idckit.models.pcl import PCL
    from idckit.tasks.pcl import model_config
    from idckit.text.vocab import Vocab

    run_dir = Path(run_dir)
    files = {"best": "best.pt", "last": "last.pt"}
    if checkpoint not in files:
        raise ConfigError(f"unknown checkpoint {checkpoint!r}; known: best, last")
    path, cfg_path = run_dir / files[checkpoint], run_dir / "config.json"
    if not path.is_file() or not cfg_path.is_file():
        raise DatasetError(f"no {files[checkpoint]} and config.json here", path=run_dir,
                           fix="give the directory of a pcl-finetune run under runs/")
    data = _data(s)
    if (run_dir / "vocab.json").is_file() and Vocab.load(run_dir / "vocab.json").words != data.vocab.words:
        raise DatasetError("this run was trained on another vocabulary than this data's", path=run_dir,
                           fix="set up with the run's data root and train_fraction (see its config.json)")
    model = PCL(model_config(data, json.loads(cfg_path.read_text())["model"]), data.vocab)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated or foreign files all mean "not this run's weights"
        raise DatasetError(f"{files[checkpoint]} is not a PyTorch checkpoint ({type(e).__name__})", path=path,
                           fix="train the run again (delete its directory), or load the other checkpoint") from e
    if checkpoint == "last":
        model.load_state_dict(state["model"])
        step = state["loop"]["step"]
    else:
        model.load_state_dict(state)
        metrics = run_dir / "metrics.json"
        step = json.loads(metrics.read_text()).get("best_step") if metrics.is_file() else None
    from idckit.device import resolve

    return model.to(resolve(s.device)).eval(), step


def hard_runs(s: Setup, variants: Sequence[str] = ("full",), seeds: Sequence[int] = (0,), *,
              progress: bool = True) -> tuple[Setup | None, list[dict[str, Any]]]:
    """The same runs on the hard twin of a synthetic setup (CLEVR-Change's own jitter; same profile, backbone and
    run cache), labelled as such, for the hard rows of tables 2 and 3. (None, []) on real data."""
    from idckit.experiments.data import synth_settings

    if not s.data.synthetic or synth_settings(s.profile, hard=True) == synth_settings(s.profile):
        return None, []        # real data, or a profile whose default already is the faithful jitter
    h = setup(s.profile, runs_dir=s.runs_dir, backbone=s.config["backbone"], hard=True, progress=progress,
              device=s.device)
    results = runs(h, variants, seeds, progress=progress)
    for r in results:
        r["label"] = f"{r['label']} [hard data]"
        r["data"] = h.data.description
    return h, results


def runs(s: Setup, variants: Sequence[str] = tuple(VARIANTS), seeds: Sequence[int] = (0,), *,
         progress: bool = True) -> list[dict[str, Any]]:
    """Every requested variant for every seed on one setup (shared data; each run trained once, then cached)."""
    variants, seeds = check_variants(variants, VARIANTS, "IDC-PCL"), check_seeds(seeds)
    return [run_variant(v, s.profile, seed=seed, setup_=s, progress=progress) for v in variants for seed in seeds]


def provenance_fields(s: Setup) -> dict[str, Any]:
    return {"data": s.data.description, "data_version": s.data.version,
            "backbone": s.store.meta.get("backbone"), "weights": s.store.meta.get("weights")}


__all__ = ["VARIANTS", "Setup", "setup", "run_variant", "runs", "hard_runs", "provenance_fields"]


# -- what the table notebooks show --------------------------------------------------------------------------
TYPES = (*CHANGE_TYPES, DISTRACTOR)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    import statistics

    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def rows(results: Sequence[dict[str, Any]], subset: str = "total") -> list[dict[str, Any]]:
    """Report rows (x100 scale): one per run, plus a mean row per variant when there are several seeds. Each
    records what :func:`idckit.report.trained_fields` lists (distinct test captions, judge, CIDEr-D subsets)."""
    from idckit.report import mean_trained_fields, to_paper_scale, trained_fields

    out, by_variant = [], {}
    for r in results:
        m = to_paper_scale(r["test"][subset])
        row = {"model": "IDC-PCL (idckit)", "variant": r["label"], "split": "test", "subset": subset,
               "seed": r.get("seed"), "run": r["run"], "metrics": m, **trained_fields(r),
               **({"data": r["data"]} if "data" in r else {})}
        out.append(row)
        by_variant.setdefault(r["label"], []).append(row)
    for label, rs in by_variant.items():
        if len(rs) > 1:
            ms = [r["metrics"] for r in rs]
            out.append({"model": "IDC-PCL (idckit)", "variant": label, "split": "test", "subset": subset,
                        "seed": "mean", "n_seeds": len(rs),
                        "metrics": {k: _mean_sd([m[k] for m in ms])[0] for k in ms[0]},
                        "sd": {k: _mean_sd([m[k] for m in ms])[1] for k in ms[0]}, **mean_trained_fields(rs)})
    return out


def per_type_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: CIDEr-D (x100) of each change type and the distractors, as table 3 prints."""
    from idckit.report import trained_fields

    out = []
    for r in results:
        out.append({"model": "IDC-PCL (idckit)", "variant": r["label"], "split": "test", "seed": r.get("seed"),
                    "run": r["run"], "metrics": {t: 100 * r["test"][t]["CIDEr-D"] for t in TYPES if t in r["test"]},
                    **trained_fields(r), **({"data": r["data"]} if "data" in r else {})})
    return out


def provenance(s: Setup, results: Sequence[dict[str, Any]], seeds: Sequence[int], wall_seconds: float):
    from idckit.report import Provenance

    tagger = next((r.get("negatives", {}) or {}).get("tagger") for r in results) if results else None
    return Provenance(profile=s.profile, seeds=list(seeds), wall_seconds=round(wall_seconds, 1),
                      selection_split="val (CIDEr-D)", **provenance_fields(s),
                      extra={"model_size": s.config["model"], "fda_tagger": tagger,
                             "runs": [r["run"] for r in results],
                             # wall_seconds is this notebook's; training happened once, in the cached runs:
                             "train_seconds": round(sum(r.get("finetune_seconds", 0.0) for r in results)
                                                    + sum({r.get("pretrain_seconds", 0.0) for r in results}), 1)})


def difference_probe(s: Setup, *, radius: int = 0, steps: int = 500, seed: int = 0) -> dict[str, float]:
    """How separable are real changes from distractors in the grid features themselves?

    A logistic regression on the sorted per-region distances (plus their mean), trained on train and scored on
    test. A low accuracy says the features (not the model) make distractor judging hard: the distractors'
    viewpoint jitter moves every region about as much as a semantic change moves one.

    ``radius`` 0 compares each region with the same region of the other image, ``||f1_j - f2_j||``. A radius r > 0
    compares it with its best match among the other image's regions at most r grid cells away (both directions),
    which forgives the viewpoint shift the way an attention over neighbouring regions could.
    """
    import torch
    import torch.nn.functional as F

    data = _data(s)
    side = int(round(s.store.n_regions ** 0.5))
    if radius and side * side != s.store.n_regions:
        raise ConfigError(f"radius {radius} needs a square grid; this store has {s.store.n_regions} regions")
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).view(-1, 2)
    far = torch.cdist(grid.float(), grid.float(), p=float("inf")) > radius       # [R, R] outside the window

    def xy(split):
        sp = data.splits[split]
        rows = []
        for lo in range(0, len(sp), 256):    # chunks keep memory flat on 14x14 grids
            f1, f2 = data.pair_features(split, torch.arange(lo, min(lo + 256, len(sp))))
            if radius == 0:
                d = (f1 - f2).norm(dim=-1)
            else:
                dist = torch.cdist(f1, f2).masked_fill(far, float("inf"))       # [n, before j, after k]
                d = torch.cat([dist.min(2).values, dist.min(1).values], 1)
            rows.append(torch.cat([d.sort(dim=1, descending=True).values, d.mean(1, keepdim=True)], 1))
        return torch.cat(rows), sp.is_change.float()

    (xtr, ytr), (xte, yte) = xy("train"), xy("test")
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    torch.manual_seed(seed)
    w = torch.zeros(xtr.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], 0.05)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits((xtr - mu) / sd @ w + b, ytr)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = float((((xte - mu) / sd @ w + b > 0).float() == yte).float().mean())
    return {"test_accuracy": acc, "chance": float(max(yte.mean(), 1 - yte.mean())), "radius": radius,
            "train_pairs": len(ytr),
            "max_region_distance_change": float(xtr[ytr == 1, 0].mean()),
            "max_region_distance_distractor": float(xtr[ytr == 0, 0].mean())}
