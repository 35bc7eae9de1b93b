"""CLIP4IDC experiments on CLEVR-Change: the runs behind the clip4idc_* notebooks, each trained once and cached.

A notebook calls :func:`setup` then :func:`runs` (captioning) or :func:`adapt` (retrieval) and gets metrics back.
Between them, in this order and each a cached run keyed by its config (:mod:`idckit.experiments.runs`):

1. the CLIP: the profile's open_clip weights (``clip.pretrained``: a tag such as ``openai`` or a checkpoint file),
   or, when that is null, the offline stand-in pre-trained here on the train images' scene descriptions
   (one run shared by every seed, variant and table);
2. adaptation (retrieval), per seed and intra/inter split; its val-best pair encoder starts the captioner;
3. captioning, per variant (CLIP-FT, CLIP4IDC w/o adaptation, CLIP4IDC), seed and split; val CIDEr-D selects
   the checkpoint; test is decoded once, greedily, and scored with the RCC breakdown.
"""
from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from idckit import paths
from idckit.errors import ConfigError
from idckit.experiments.config import load_config
from idckit.experiments.data import DataChoice, clevr_change
from idckit.experiments.pcl import TYPES, _mean_sd, ordering_notes  # noqa: F401  (shared table helpers)
from idckit.experiments.runs import Run, open_run

#: table 5's rows (CLEVR columns): (label, captioner switches, start from the adapted encoder?)
VARIANTS: dict[str, dict[str, Any]] = {
    "clip-ft": {"label": "CLIP-FT", "captioner": {"variant": "clip-ft"}, "adapt": False},
    "no-adapt": {"label": "CLIP4IDC w/o adaptation", "captioner": {"variant": "clip4idc"}, "adapt": False},
    "clip4idc": {"label": "CLIP4IDC", "captioner": {"variant": "clip4idc"}, "adapt": True},
}
MODEL = "CLIP4IDC (idckit)"


@dataclass
class Setup:
    profile: str
    config: dict[str, Any]
    data: DataChoice
    runs_dir: Path

    @property
    def identity(self) -> dict[str, Any]:
        return {"data": str(self.data.root), "data_version": self.data.version, "max_len": self.config["max_len"]}

    def _vision(self) -> dict:
        import open_clip

        import idckit.models.clip_loader  # noqa: F401  (registers the stand-in configs)

        cfg = open_clip.get_model_config(self.config["clip"]["name"])
        if cfg is None:
            raise ConfigError(f"unknown CLIP architecture {self.config['clip']['name']!r}")
        return cfg["vision_cfg"]

    @property
    def image_size(self) -> int:
        size = self._vision()["image_size"]
        return size if isinstance(size, int) else size[0]

    @property
    def depth(self) -> int:
        """Residual blocks of the CLIP's ViT (N_intra + N_inter); table 7 splits them."""
        return self._vision()["layers"]


def setup(profile: str = "cpu", data_root: str | Path | None = None, *, runs_dir: str | Path | None = None,
          overrides: dict | None = None, progress: bool = True) -> Setup:
    """Data (generated on first use when synthetic) and the run settings of ``profile``."""
    cfg = load_config("clip4idc", profile, overrides)
    runs = Path(runs_dir) if runs_dir else paths.runs_dir()
    if cfg["clip"].get("architecture"):
        register_architecture(cfg["clip"]["name"], cfg["clip"]["architecture"], runs / "clip_configs")
    return Setup(profile, cfg, clevr_change(profile, data_root, progress=progress), runs)


def register_architecture(name: str, architecture: dict, directory: Path) -> None:
    """Make an open_clip architecture given in a config (the smoke profile's tiny CLIP) known to open_clip."""
    import open_clip

    from idckit import fileio
    import idckit.models.clip_loader  # noqa: F401

    known = open_clip.get_model_config(name)
    if known is not None:
        if known != architecture:
            raise ConfigError(f"CLIP architecture {name!r} is already registered with different settings",
                              fix="give the config's architecture a new name")
        return
    path = Path(directory) / f"{name}.json"
    fileio.write_json(path, architecture, indent=1)
    open_clip.add_model_config(path)


_DATA_CACHE: dict[tuple, Any] = {}


def _data(s: Setup):
    """Images (uint8, decoded once and cached on disk beside the runs) and BPE captions, shared by all runs."""
    from idckit.tasks.clip import load_clip_data

    key = (str(s.data.root), s.image_size, s.config["max_len"])
    if key not in _DATA_CACHE:
        tag = hashlib.sha256(str(s.data.root).encode()).hexdigest()[:8]
        cache = s.runs_dir / "images" / f"{s.data.root.name}-{tag}-{s.image_size}px" if s.config["image_cache"] else None
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_clip_data(s.data.dataset(), image_size=s.image_size, max_len=s.config["max_len"],
                                          cache_dir=cache)
    return _DATA_CACHE[key]


def _train_config(c: dict, seed: int):
    from idckit.train.loop import TrainConfig

    t = dict(c["train"])
    if "betas" in t:
        t["betas"] = tuple(t["betas"])
    return TrainConfig.from_dict({**t, "seed": seed})


# -- 1. the CLIP ----------------------------------------------------------------------------------------------
def clip_weights(s: Setup, *, progress: bool = True) -> dict[str, Any]:
    """``{"name", "weights", "description", "run", ...}``: what every later run loads with ``load_clip``."""
    from idckit.models.clip_loader import save_clip_checkpoint
    from idckit.tasks.clip import ClipPretrainTask
    from idckit.train.loop import fit

    name, pretrained = s.config["clip"]["name"], s.config["clip"]["pretrained"]
    if pretrained is not None:
        return {"name": name, "weights": str(pretrained), "key": str(pretrained), "run": None,
                "description": f"open_clip {name} ({pretrained})"}
    c = copy.deepcopy(s.config["pretrain_clip"])
    run = open_run(s.runs_dir, "clip-pretrain", {"kind": "clip-pretrain", **s.identity, "name": name,
                                                 "architecture": s.config["clip"].get("architecture"),
                                                 "pretrain": c, "seed": 0})
    path = run.dir / "clip.pt"
    if not run.is_complete():
        task = ClipPretrainTask(_data(s), name, batch_size=c["batch_size"], eval_batch_size=c["eval_batch_size"])
        res = fit(task, _train_config(c, 0), run.dir, progress=progress)
        save_clip_checkpoint(res.model, path, name)
        run.complete({"val": res.best_metrics, "best_step": res.best_step, "steps": res.steps,
                      "history": res.history, "wall_seconds": round(res.wall_seconds, 1)})
    m = run.metrics()
    return {"name": name, "weights": str(path), "key": run.key, "run": run.dir.name, "val": m["val"],
            "wall_seconds": m["wall_seconds"],
            "description": f"offline stand-in {name} pre-trained here on train scene descriptions "
                           f"({m['steps']} steps, val image<-text R@1 {m['val'].get('t2p_R@1', float('nan')):.1f})"}


# -- 2. adaptation ----------------------------------------------------------------------------------------------
def _adapt_run(s: Setup, clip: dict, n_intra: int | None, seed: int) -> Run:
    return open_run(s.runs_dir, "clip4idc-adapt", {"kind": "clip4idc-adapt", **s.identity, "clip": clip["key"],
                                                   "clip_name": clip["name"], "n_intra": n_intra,
                                                   "adapt": s.config["adapt"], "seed": seed})


def _adapt_task(s: Setup, clip: dict, n_intra: int | None):
    from idckit.tasks.clip import AdaptTask

    c = s.config["adapt"]
    return AdaptTask(_data(s), clip["name"], clip["weights"], batch_size=c["batch_size"], n_intra=n_intra,
                     lr_scale_clip=c["lr_scale_clip"], swap_prob=c["swap_prob"], eval_batch_size=c["eval_batch_size"])


def adapt(s: Setup, n_intra: int | None = None, seed: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """Retrieval adaptation (cached): ``{"run", "n_intra", "val", "test", "test_unadapted", "wall_seconds"}``;
    ``test_unadapted`` is the same retrieval evaluation of the encoder before adaptation (same seed)."""
    from idckit.train.loop import fit

    clip = clip_weights(s, progress=progress)
    run = _adapt_run(s, clip, n_intra, seed)
    if not run.is_complete():
        task = _adapt_task(s, clip, n_intra)
        torch.manual_seed(seed)
        before = task.evaluate(task.build_model(), "test")
        res = fit(task, _train_config(s.config["adapt"], seed), run.dir, progress=progress)
        run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                      "test": task.evaluate(res.model, "test"), "test_unadapted": before,
                      "wall_seconds": round(res.wall_seconds, 1)})
    return {"run": run.dir.name, "n_intra": n_intra, "seed": seed, "clip": clip["description"], **run.metrics(),
            "_best": str(run.dir / "best.pt")}


# -- 3. captioning ----------------------------------------------------------------------------------------------
def run_variant(s: Setup, variant: str = "clip4idc", seed: int = 0, *, n_intra: int | None = None,
                freeze_visual: bool = False, progress: bool = True) -> dict[str, Any]:
    """Adapt (if the variant does), caption, select on val, decode and score test; cached by config.

    Returns ``{"variant", "label", "seed", "run", "val", "test": {subset: {metric}}, "wall_seconds", ...}`` with
    metrics on pycocoevalcap's raw scale (CIDEr-D 1.0 = 100 in the papers)."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown CLIP4IDC variant {variant!r}; known: {', '.join(VARIANTS)}")
    v = VARIANTS[variant]
    clip = clip_weights(s, progress=progress)
    ad = adapt(s, n_intra, seed, progress=progress) if v["adapt"] else None
    c = copy.deepcopy(s.config["caption"])
    captioner = {**c["captioner"], **v["captioner"], "n_intra": n_intra, "freeze_visual": freeze_visual}
    run = open_run(s.runs_dir, "clip4idc-caption", {"kind": "clip4idc-caption", **s.identity, "clip": clip["key"],
                                                    "clip_name": clip["name"], "captioner": captioner,
                                                    "init": ad["run"] if ad else None, "caption": c, "seed": seed})
    if not run.is_complete():
        _caption(s, run, clip, captioner, ad, progress)
    return {"variant": variant, "label": v["label"], "seed": seed, "n_intra": n_intra, "run": run.dir.name,
            "clip": clip["description"], "adapt": {k: ad[k] for k in ("run", "val", "test", "test_unadapted")}
            if ad else None, **run.metrics()}


def _caption(s: Setup, run: Run, clip: dict, captioner: dict, ad: dict | None, progress: bool) -> None:
    from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
    from idckit.tasks.clip import CaptionTask, predict
    from idckit.train.loop import fit

    c = run.config["caption"]
    data = _data(s)
    with CaptionScorer(meteor=False) as quick:
        task = CaptionTask(data, clip["name"], clip["weights"], captioner, batch_size=c["batch_size"],
                           init_pair_encoder=ad["_best"] if ad else None, lr_scale_visual=c["lr_scale_visual"],
                           eval_batch_size=c["eval_batch_size"], scorer=quick)
        res = fit(task, _train_config(c, run.config["seed"]), run.dir, progress=progress)
    t0 = time.perf_counter()
    preds = predict(res.model, data, "test", batch_size=c["eval_batch_size"], progress=progress)
    decode_seconds = time.perf_counter() - t0
    write_results(run.dir / "test", preds)
    split = data.splits["test"]
    test = evaluate_pairs(split.references, preds, dict(zip(split.pair_ids, split.types)))
    clip_seconds = 0.0 if clip.get("run") is None else clip.get("wall_seconds", 0.0)
    adapt_seconds = ad["wall_seconds"] if ad else 0.0
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "test": test, "caption_seconds": round(res.wall_seconds, 1),
                  "adapt_seconds": adapt_seconds, "clip_pretrain_seconds": clip_seconds,
                  "test_decode_seconds": round(decode_seconds, 1),
                  "wall_seconds": round(res.wall_seconds + decode_seconds + adapt_seconds, 1)})


def runs(s: Setup, variants: Sequence[str] = tuple(VARIANTS), seeds: Sequence[int] = (0,), *,
         progress: bool = True) -> list[dict[str, Any]]:
    """Every requested variant for every seed on one setup (one stand-in CLIP, each run trained once, cached)."""
    return [run_variant(s, v, seed, progress=progress) for v in variants for seed in seeds]


# -- what the notebooks show ----------------------------------------------------------------------------------
def rows(results: Sequence[dict[str, Any]], subset: str = "total") -> list[dict[str, Any]]:
    """Report rows (x100 scale): one per run, plus a mean row (with sd) per variant when there are several seeds."""
    from idckit.report import to_paper_scale

    out, by_variant = [], {}
    for r in results:
        m = to_paper_scale(r["test"][subset])
        out.append({"model": MODEL, "variant": r["label"], "split": "test", "subset": subset, "seed": r.get("seed"),
                    "run": r["run"], "metrics": m})
        by_variant.setdefault(r["label"], []).append(m)
    for label, ms in by_variant.items():
        if len(ms) > 1:
            out.append({"model": MODEL, "variant": label, "split": "test", "subset": subset, "seed": "mean",
                        "metrics": {k: _mean_sd([m[k] for m in ms])[0] for k in ms[0]},
                        "sd": {k: _mean_sd([m[k] for m in ms])[1] for k in ms[0]}})
    return out


def per_type_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: CIDEr-D (x100) of each change type and the distractors."""
    return [{"model": MODEL, "variant": r["label"], "split": "test", "seed": r.get("seed"),
             "metrics": {t: 100 * r["test"][t]["CIDEr-D"] for t in TYPES if t in r["test"]}} for r in results]


RETRIEVAL_KEYS = ("t2p_R@1", "t2p_R@5", "t2p_R@10", "t2p_MdR", "t2p_MnR", "p2t_R@1", "p2t_R@5", "p2t_R@10",
                  "p2t_MdR", "p2t_MnR")


def retrieval_rows(adapted: Sequence[dict[str, Any]], *, unadapted: bool = True) -> list[dict[str, Any]]:
    """Test retrieval rows of adaptation runs, and (once per split) the same encoder before adaptation."""
    out = []
    for a in adapted:
        split = "default" if a["n_intra"] is None else f"{a['n_intra']} intra"
        out.append({"model": MODEL, "variant": f"adapted ({split})", "split": "test", "seed": a["seed"],
                    "run": a["run"], "metrics": {k: a["test"][k] for k in RETRIEVAL_KEYS}})
        if unadapted:
            out.append({"model": MODEL, "variant": f"before adaptation ({split})", "split": "test",
                        "seed": a["seed"], "metrics": {k: a["test_unadapted"][k] for k in RETRIEVAL_KEYS}})
    return out


def provenance(s: Setup, results: Sequence[dict[str, Any]], seeds: Sequence[int], wall_seconds: float,
               selection: str = "val (CIDEr-D)"):
    from idckit.report import Provenance

    clip = clip_weights(s, progress=False)
    return Provenance(profile=s.profile, data=s.data.description, data_version=s.data.version,
                      backbone=f"CLIP {clip['name']} (pixels, {s.image_size} px)", weights=clip["description"],
                      seeds=list(seeds), wall_seconds=round(wall_seconds, 1), selection_split=selection,
                      extra={"clip_run": clip["run"], "runs": [r["run"] for r in results],
                             "caption_model": s.config["caption"]["captioner"]})


__all__ = ["VARIANTS", "Setup", "setup", "clip_weights", "adapt", "run_variant", "runs", "rows", "per_type_rows",
           "retrieval_rows", "provenance", "ordering_notes"]
