"""The one training loop, for every kind of run in the kit (IDC-PCL pre-training and fine-tuning, the stand-in
CLIP, CLIP4IDC adaptation and captioning).

What a run needs that is not specific to its task lives here: the optimiser and lr schedule, evaluation on
val at a fixed cadence, keeping the val-best weights (never test), early stopping, a wall-clock budget,
bf16 autocast, progress bars and logs, and checkpoints that make a killed run resume to exactly the result of
an uninterrupted one. The last point rests on three rules:

- the data order of an epoch depends only on (seed, epoch): the task's ``batches`` draws from a generator
  the loop seeds, and a resumed run replays the epoch and skips the batches already consumed;
- every other random draw (dropout, masking in ``train_step``) comes from torch's global RNG, whose state is
  saved with the checkpoint (with Python's and numpy's);
- a checkpoint is written after the step's evaluation, so its RNG state is the one the next step sees.

Files in ``run_dir``: ``last.pt`` (resumable state, written atomically), ``best.pt`` (the selected weights),
``log.jsonl`` (training logs and evaluations), ``fit.json`` (written last: the run is finished).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from idckit.errors import ConfigError
from idckit.fileio import atomic_path, write_json
from idckit.train.schedules import lr_factor
from idckit.train.task import Task


@dataclass
class TrainConfig:
    max_steps: int
    lr: float
    schedule: str = "constant"
    warmup_steps: int = 0
    decay_every: int = 0
    decay_times: int = 2
    optimizer: str = "adam"
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = None
    eval_every: int = 0
    patience: int | None = None
    checkpoint_every: int = 0
    log_every: int = 10
    seed: int = 0
    bf16: bool = False
    max_minutes: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown training settings {unknown}; known: {sorted(known)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


@dataclass
class FitResult:
    model: torch.nn.Module
    best_step: int
    best_metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    wall_seconds: float = 0.0
    stopped: str = "max_steps"

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("model")
        return d


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def _optimizer(cfg: TrainConfig, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    prepared = []
    for g in groups:
        g = dict(g)
        g["lr"] = cfg.lr * g.pop("lr_scale", 1.0)
        g.setdefault("weight_decay", cfg.weight_decay)
        prepared.append(g)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(prepared, lr=cfg.lr, betas=cfg.betas)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(prepared, lr=cfg.lr, betas=cfg.betas)
    raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; known: adam, adamw")


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_best(task: Task, run_dir: str | Path) -> torch.nn.Module:
    """The selected weights of a finished (or interrupted) run, in a freshly built model, eval mode."""
    model = task.build_model()
    model.load_state_dict(_load(Path(run_dir) / "best.pt"))
    return model.eval()


def fit(task: Task, cfg: TrainConfig, run_dir: str | Path, *, progress: bool = True) -> FitResult:
    """Train ``task`` under ``cfg`` in ``run_dir``; resume if a checkpoint is there; return the val-best model.

    A finished run (``fit.json`` present) is not trained again: its stored result and best weights come back.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "fit.json").is_file():
        stored = json.loads((run_dir / "fit.json").read_text())
        return FitResult(model=load_best(task, run_dir), **stored)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    model = task.build_model()
    optimizer = _optimizer(cfg, task.param_groups(model))
    factor = lr_factor(cfg.schedule, max_steps=cfg.max_steps, warmup_steps=cfg.warmup_steps,
                       decay_every=cfg.decay_every, decay_times=cfg.decay_times)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    metric = task.selection_metric

    s = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_step": -1, "best_metrics": {}, "history": [],
         "bad_evals": 0, "elapsed": 0.0}
    ckpt = run_dir / "last.pt"
    if ckpt.is_file():
        state = _load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        s = state["loop"]
        _set_rng_state(state["rng"])

    def save_checkpoint() -> None:
        with atomic_path(ckpt) as tmp:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "loop": s, "rng": _rng_state(),
                        "config": asdict(cfg)}, tmp)

    def save_best() -> None:
        with atomic_path(run_dir / "best.pt") as tmp:
            torch.save(model.state_dict(), tmp)

    log = (run_dir / "log.jsonl").open("a")
    started = time.perf_counter() - s["elapsed"]

    def evaluate() -> bool:
        """Evaluate on val, keep the best weights; True when early stopping should end the run."""
        metrics = task.evaluate(model, "val") if metric is not None else {}
        model.train()
        record = {"step": s["step"], "minutes": round((time.perf_counter() - started) / 60, 3), **metrics}
        s["history"].append(record)
        log.write(json.dumps({"eval": record}) + "\n")
        log.flush()
        if metric is None:
            s["best_step"], s["best_metrics"] = s["step"], metrics
            save_best()
            return False
        if metric not in metrics:
            raise ConfigError(f"the task's evaluate() returned no {metric!r} (got {sorted(metrics)})")
        if s["best_step"] < 0 or metrics[metric] > s["best_metrics"][metric]:
            s["best_step"], s["best_metrics"], s["bad_evals"] = s["step"], dict(metrics), 0
            save_best()
        else:
            s["bad_evals"] += 1
        return cfg.patience is not None and s["bad_evals"] >= cfg.patience

    model.train()
    bar = tqdm(total=cfg.max_steps, initial=s["step"], desc=run_dir.name, disable=not progress, unit="step")
    stopped, sums, n_logged = "max_steps", {}, 0
    try:
        while s["step"] < cfg.max_steps and stopped == "max_steps":
            batches = task.batches(s["epoch"], _epoch_generator(cfg.seed, s["epoch"]))
            consumed = 0
            for batch in batches:
                if consumed < s["batch_in_epoch"]:  # replaying a resumed epoch
                    consumed += 1
                    continue
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                    loss, logs = task.train_step(model, batch, s["step"])
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {s['step']} ({run_dir})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                scheduler.step()
                consumed += 1
                s["step"] += 1
                s["batch_in_epoch"] = consumed
                bar.update(1)
                for k, v in {"loss": float(loss.detach()), **logs}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n_logged += 1
                if n_logged >= cfg.log_every or s["step"] == cfg.max_steps:
                    means = {k: v / n_logged for k, v in sums.items()}
                    log.write(json.dumps({"step": s["step"], "lr": scheduler.get_last_lr()[0], **means}) + "\n")
                    log.flush()  # so `tail -f log.jsonl` shows a long run's progress
                    bar.set_postfix(loss=f"{means['loss']:.3f}")
                    sums, n_logged = {}, 0
                over_time = cfg.max_minutes is not None and time.perf_counter() - started > 60 * cfg.max_minutes
                last = s["step"] == cfg.max_steps or over_time
                evaluated = False
                if last or (cfg.eval_every and s["step"] % cfg.eval_every == 0):
                    evaluated = True
                    if evaluate():
                        stopped = "early_stop"
                if over_time and stopped == "max_steps":
                    stopped = "max_minutes"
                s["elapsed"] = time.perf_counter() - started
                if (evaluated and not cfg.checkpoint_every) or stopped != "max_steps" or last or (
                        cfg.checkpoint_every and s["step"] % cfg.checkpoint_every == 0):
                    save_checkpoint()
                if last or stopped != "max_steps":
                    break
            else:
                s["epoch"] += 1
                s["batch_in_epoch"] = 0
                if consumed == 0:
                    raise ConfigError("the task yielded no training batches", fix="check the training split")
    finally:
        bar.close()
        log.close()

    result = FitResult(model=model, best_step=s["best_step"], best_metrics=s["best_metrics"],
                       history=s["history"], steps=s["step"], wall_seconds=round(s["elapsed"], 2), stopped=stopped)
    write_json(run_dir / "fit.json", result.summary(), indent=1)
    result.model = load_best(task, run_dir)
    return result

