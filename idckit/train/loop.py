"""The one training loop, for every kind of run in the kit (IDC-PCL pre-training and fine-tuning, the stand-in
CLIP, CLIP4IDC adaptation and captioning).

What a run needs that is not specific to its task lives here: the optimiser and lr schedule, evaluation on
val at a fixed cadence, keeping the val-best weights (never test; where ``authors_selection`` asks for it, the
authors' own choice, on test for CLIP4IDC, is kept beside them and decides nothing else), early stopping, a stop
for a captioner whose val captions collapsed to one sentence (``stop_on_collapse``), a wall-clock budget,
mixed precision and the device (:mod:`idckit.device`), data-parallel training under torchrun
(:mod:`idckit.train.distributed`), batches read ahead by DataLoader workers (:mod:`idckit.train.loader`),
progress bars and logs, and checkpoints that make a killed run resume to
exactly the result of an uninterrupted one. The last point rests on three rules:

- the data order of an epoch depends only on (seed, epoch): the task's ``batches`` draws from a generator
  the loop seeds, and a resumed run replays the epoch and skips the batches already consumed;
- every other random draw (dropout, masking in ``train_step``) comes from torch's global RNG, whose state is
  saved with the checkpoint (with Python's and numpy's);
- a checkpoint is written after the step's evaluation, so its RNG state is the one the next step sees.

Under torchrun (``WORLD_SIZE`` > 1) the model is wrapped in DistributedDataParallel around the task's
``train_step``; every rank draws the same global batch and trains on its ``task.shard`` of it, each rank's RNG
(dropout, masking) is seeded from (run seed, rank) and saved per rank, val metrics are rank 0's (the task gathers
its ranks' predictions there) and broadcast, so early stopping and the wall budget end every rank at the same
step; only rank 0 writes files. Exact resume needs the same number of processes; the weights load anywhere.

Files in ``run_dir``: ``last.pt`` (resumable state, written atomically), ``best.pt`` (the selected weights),
``best_authors.pt`` (where ``authors_selection`` is set: the weights the authors' scripts would have kept),
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
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from idckit import checkpoints
from idckit import device as devices
from idckit.errors import ConfigError
from idckit.fileio import atomic_path, read_run_file, torch_save, write_json
from idckit.train import distributed
from idckit.train.loader import BatchLoader, LoaderConfig
from idckit.train.optim import BertAdam, clip_per_tensor
from idckit.train.schedules import lr_factor
from idckit.train.task import Task


@dataclass
class TrainConfig:
    """The loop's settings. No defaults here: a run's ``train`` section over ``idckit/experiments/configs/train.json``
    (:func:`idckit.experiments.config.train_config` builds this)."""
    max_steps: int
    lr: float
    schedule: str
    warmup_steps: int
    decay_every: int
    decay_times: int
    optimizer: str          # adam, adamw (torch's) or bertadam (idckit.train.optim: no bias correction)
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    grad_clip: float | None
    grad_clip_per_tensor: float | None     # after grad_clip, each gradient tensor clipped on its own (BERT's)
    # what the backward multiplies the loss by (the logged loss is the loss itself): 1.0, the loss's own gradient;
    # 0.5 at CLIP4IDC's adaptation, the authors' 2-GPU gradient (their AllGather's backward keeps the local slice
    # and DDP averages over 2 ranks: half the global loss's, which clipping and BertAdam's eps then see)
    gradient_scale: float
    eval_every: int
    # val is scored after updates eval_offset + k * eval_every (k >= 1): 0, the kit's cadence; 1, IDC-PCL's
    # fine-tuning scripts', which score after the update at global_step k * eval_every, counted from 0
    # (bird/finetune.py:178, clver/finetune.py:179)
    eval_offset: int
    # the last step is scored too when off the cadence (the kit's); False: only the cadence, as IDC-PCL's
    # fine-tuning loops, whose updates after their last evaluation are never selected (a run that scored
    # nothing still scores its last step, so that it has weights to keep)
    eval_at_end: bool
    patience: int | None
    # an evaluation at or before this step is never selected and counts towards patience (IDC-PCL's bird
    # fine-tuning: bird/finetune.py:190); 0: every evaluation may be selected
    select_after_step: int
    # an evaluation equal to the best so far replaces it and resets patience (CLIP4IDC's `best <= score`); False:
    # only a strictly higher score is a gain (IDC-PCL's)
    improve_on_tie: bool
    checkpoint_every: int
    log_every: int
    seed: int
    amp: bool               # mixed precision: bf16 autocast, or fp16 + loss scaling where bf16 is absent
    compile: bool           # torch.compile the model's forward (opt-in; see bench/bench_train_loop.py)
    max_minutes: float | None
    # {"evals": N, "after_fraction": f}: stop when val wrote one distinct caption at N evaluations in a row, all at
    # or after step f * max_steps (a collapsed captioner's remaining steps show nothing new); None: never
    stop_on_collapse: dict[str, Any] | None
    # {"split": "val" | "test", "metric": KEY, "tokenize": bool (optional)}: besides the val selection, keep the
    # checkpoint the authors' scripts would keep (best_authors.pt; CLIP4IDC selects on test, IDC-PCL on whitespace
    # CIDEr-D), under the same gate and tie rules; patience and the headline stay the val selection's. None: off
    authors_selection: dict[str, Any] | None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown training settings {unknown}; known: {sorted(known)}")
        missing = sorted(known - set(d))
        if missing:
            raise ConfigError(f"training settings {missing} missing",
                              fix="build the loop's settings with idckit.experiments.config.train_config")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        _check_stop_on_collapse(d["stop_on_collapse"])
        gate = d["select_after_step"]
        if isinstance(gate, bool) or not isinstance(gate, int) or gate < 0:
            raise ConfigError(f"select_after_step must be a whole number >= 0 (0: no gate), got {gate!r}")
        if not isinstance(d["improve_on_tie"], bool):
            raise ConfigError(f"improve_on_tie must be true or false, got {d['improve_on_tie']!r}")
        scale = d["gradient_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
            raise ConfigError(f"gradient_scale must be a number > 0 (1.0: the loss's own gradient), got {scale!r}")
        offset = d["eval_offset"]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"eval_offset must be a whole number >= 0 (0: the kit's cadence), got {offset!r}")
        if not isinstance(d["eval_at_end"], bool):
            raise ConfigError(f"eval_at_end must be true or false, got {d['eval_at_end']!r}")
        _check_authors_selection(d["authors_selection"])
        return cls(**d)


#: the val metric a task's evaluate() returns for :attr:`TrainConfig.stop_on_collapse`: how many distinct captions
#: it decoded for the val pairs
DISTINCT_METRIC = "distinct_captions"


def _check_stop_on_collapse(rule: object) -> None:
    if rule is None:
        return
    fix = 'set stop_on_collapse to null or e.g. {"evals": 2, "after_fraction": 0.33, "distinct": 1}'
    if not isinstance(rule, dict) or not {"evals", "after_fraction"} <= set(rule) <= {"evals", "after_fraction",
                                                                                     "distinct"}:
        raise ConfigError(f"stop_on_collapse must be null or have the keys evals, after_fraction and (optional) "
                          f"distinct, got {rule!r}", fix=fix)
    n, f = rule["evals"], rule["after_fraction"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"stop_on_collapse.evals must be an integer >= 1, got {n!r}", fix=fix)
    d = rule.get("distinct", 1)
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ConfigError(f"stop_on_collapse.distinct must be an integer >= 1, got {d!r}", fix=fix)
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
        raise ConfigError(f"stop_on_collapse.after_fraction must be a number in [0, 1], got {f!r}", fix=fix)


#: the splits an authors' selection may read (:attr:`TrainConfig.authors_selection`)
AUTHORS_SPLITS = ("val", "test")
#: the file of the checkpoint selected the authors' way, beside best.pt
AUTHORS_BEST = "best_authors.pt"


def _check_authors_selection(rule: object) -> None:
    if rule is None:
        return
    fix = 'set authors_selection to null or e.g. {"split": "test", "metric": "CIDEr-D", "tokenize": true}'
    if not isinstance(rule, dict) or not {"split", "metric"} <= set(rule) <= {"split", "metric", "tokenize"}:
        raise ConfigError(f"authors_selection must be null or have the keys split, metric and (optional) tokenize, "
                          f"got {rule!r}", fix=fix)
    if rule["split"] not in AUTHORS_SPLITS:
        raise ConfigError(f"authors_selection.split must be one of {', '.join(AUTHORS_SPLITS)}, got "
                          f"{rule['split']!r}", fix=fix)
    if not isinstance(rule["metric"], str) or not rule["metric"]:
        raise ConfigError(f"authors_selection.metric must name a metric of the task's evaluate(), got "
                          f"{rule['metric']!r}", fix=fix)
    if "tokenize" in rule and not isinstance(rule["tokenize"], bool):
        raise ConfigError(f"authors_selection.tokenize must be true or false, got {rule['tokenize']!r}", fix=fix)


@dataclass
class FitResult:
    model: torch.nn.Module
    best_step: int
    best_metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    wall_seconds: float = 0.0
    stopped: str = "max_steps"     # or early_stop, max_minutes, collapsed (stop_on_collapse)
    max_steps: int = 0
    #: the authors' selection (:attr:`TrainConfig.authors_selection`): its rule, ``best_step``, ``best_metrics``
    #: and ``history`` (its evaluations); None when the run has none
    authors: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("model")
        if d["authors"] is None:     # a run without it writes the fit.json it always wrote
            d.pop("authors")
        return d


def _rng_state(device: torch.device) -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
    if device.type == "cuda":     # dropout on a GPU draws from the GPU's generator
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
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
        return torch.optim.Adam(prepared, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(prepared, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    if cfg.optimizer == "bertadam":
        return BertAdam(prepared, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; known: adam, adamw, bertadam")


def _load(path: Path, fix: str) -> Any:
    # through the kit's one checkpoint gate: weights_only, declared sizes checked, the file named in any error
    return checkpoints.load(path, what=f"run's {path.name}", fix=fix)


def _redo(run_dir: Path) -> str:
    return f"delete the run directory {run_dir} to train the run again"


def _resume_state(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                  scaler: Any) -> dict[str, Any]:
    """``last.pt`` loaded into the model, optimizer, scheduler and scaler, or one error naming the file: a truncated,
    foreign or hand-edited file never resumes half a run."""
    fix = (f"delete {ckpt} to restart the run from its first step (the run's best.pt is not resumable), or delete "
           "the run directory")
    state = _load(ckpt, fix)
    keys = ("model", "optimizer", "scheduler", "loop", "rng")
    if not isinstance(state, dict) or any(k not in state for k in keys) or not isinstance(state["loop"], dict) \
            or "step" not in state["loop"]:
        raise ConfigError(f"the run's last.pt is not a resumable checkpoint (it needs {', '.join(keys)})", path=ckpt,
                          fix=fix)
    checkpoints.check_state(state["model"], model.state_dict(), path=ckpt, what="run's last.pt", fix=fix)
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])     # moves the moments to the parameters' device
        scheduler.load_state_dict(state["scheduler"])
        if "scaler" in state:
            scaler.load_state_dict(state["scaler"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"the run's last.pt does not fit this run's model and optimizer ({type(e).__name__}: "
                          f"{str(e)[:160]})", path=ckpt, fix=fix) from e
    return state


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random draws (dropout, masking) in a multi-process run of seed ``seed``."""
    return seed * 1_000_003 + 7_919 * (rank + 1)


def load_best(task: Task, run_dir: str | Path, device: str | torch.device | None = "cpu", *,
              file: str = "best.pt") -> torch.nn.Module:
    """The selected weights of a finished (or interrupted) run, in a freshly built model on ``device``, eval mode.
    ``file``: ``best.pt`` (the val selection) or :data:`AUTHORS_BEST` (the authors' selection)."""
    model, path = task.build_model(), Path(run_dir) / file
    checkpoints.load_into(model, _load(path, _redo(Path(run_dir))), path=path, what=f"run's {file}",
                          fix=_redo(Path(run_dir)))
    return model.to(devices.resolve(device)).eval()


class _Step(torch.nn.Module):
    """The task's training step as a module's forward, so DistributedDataParallel sees every parameter use of a
    step (tasks call heads and encoders directly, not just ``model.forward``)."""

    def __init__(self, task: Task, model: torch.nn.Module):
        super().__init__()
        self.task, self.model = task, model

    def forward(self, batch: Any, step: int):
        return self.task.train_step(self.model, batch, step)


def fit(task: Task, cfg: TrainConfig, run_dir: str | Path, *, progress: bool = True,
        device: str | torch.device | None = None, loader: LoaderConfig | dict | None = None) -> FitResult:
    """Train ``task`` under ``cfg`` in ``run_dir`` on ``device`` (None: ``auto``); resume if a checkpoint is there;
    return the val-best model (on ``device``). ``loader``: how batches are read (:mod:`idckit.train.loader`; None:
    in this process); like the device, it changes the speed, not the result.

    A finished run (``fit.json`` present) is not trained again: its stored result and best weights come back.
    Under torchrun every process calls ``fit`` with the same arguments (see the module doc).
    """
    dev = devices.resolve(device)
    loader = LoaderConfig.from_dict(loader)     # a bad setting fails before any work
    devices.prepare(dev)
    distributed.init(dev)
    rank, world, main = distributed.rank(), distributed.world(), distributed.is_main()
    if world > 1 and not hasattr(task, "shard"):
        raise ConfigError(f"{type(task).__name__} cannot train on {world} processes: it has no shard() method")
    run_dir = Path(run_dir)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    if (run_dir / "fit.json").is_file():
        stored = read_run_file(run_dir / "fit.json", {"best_step": int, "best_metrics": dict},
                               may={"history": list, "steps": int, "wall_seconds": float, "stopped": str,
                                    "max_steps": int, "authors": dict},
                               fix=f"delete {run_dir / 'fit.json'} and run again: the run resumes from its last.pt "
                                   "and writes it anew")
        return FitResult(model=load_best(task, run_dir, dev), **stored)

    _seed(cfg.seed)
    model = task.build_model().to(dev)
    if cfg.compile:
        model.compile()     # in place: the state_dict keys stay those of the plain model
    if world > 1:
        _seed(rank_seed(cfg.seed, rank))
    optimizer = _optimizer(cfg, task.param_groups(model))
    scaler = devices.grad_scaler(dev, cfg.amp)
    factor = lr_factor(cfg.schedule, max_steps=cfg.max_steps, warmup_steps=cfg.warmup_steps,
                       decay_every=cfg.decay_every, decay_times=cfg.decay_times, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    metric = task.selection_metric
    authors = cfg.authors_selection if metric is not None else None

    s = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_step": -1, "best_metrics": {}, "history": [],
         "bad_evals": 0, "elapsed": 0.0}
    ckpt = run_dir / "last.pt"
    if ckpt.is_file():
        state = _resume_state(ckpt, model, optimizer, scheduler, scaler)
        s = state["loop"]
        per_rank = state.get("rng_ranks")
        if world > 1 and per_rank is not None and len(per_rank) == world:
            _set_rng_state(per_rank[rank], dev)
        elif world > 1:   # written by another number of processes: the weights resume, the random draws restart
            _seed(rank_seed(cfg.seed, rank) + s["step"])
        else:
            _set_rng_state(state["rng"], dev)
    step_fn: torch.nn.Module | Any = _Step(task, model)
    if world > 1:
        # find_unused_parameters: a pre-training step trains one head (MLM, MVCL or FDA) and leaves the others idle.
        # device_ids=None (allowed for a single-device module) keeps DDP from moving the batch to the GPU: a batch
        # holds indices into CPU tables (features, pixels, captions) and rows read into pinned memory, and the task
        # copies what it needs itself (non_blocking)
        step_fn = DistributedDataParallel(_Step(task, model), device_ids=None, find_unused_parameters=True)

    def save_checkpoint() -> None:
        states = distributed.gather(_rng_state(dev))   # a collective: every rank comes here at the same step
        if not main:
            return
        content = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "loop": s, "rng": states[0],
                   "config": asdict(cfg)}
        if world > 1:
            content["rng_ranks"] = states
        with atomic_path(ckpt) as tmp:
            torch_save(devices.to_cpu(content), tmp)

    def save_best(file: str = "best.pt") -> None:
        if main:
            with atomic_path(run_dir / file) as tmp:
                torch_save(devices.to_cpu(model.state_dict()), tmp)

    log = (run_dir / "log.jsonl").open("a") if main else None
    started = time.perf_counter() - s["elapsed"]

    def write_log(record: dict[str, Any]) -> None:
        if log is not None:
            try:
                log.write(json.dumps(record) + "\n")
                log.flush()  # so `tail -f log.jsonl` shows a long run's progress
            except OSError as e:       # a full disk: a failed write() names no file, the error should
                e.filename = e.filename or str(run_dir / "log.jsonl")
                raise

    def collapsed(metrics: dict[str, Any]) -> bool:
        """Count this evaluation towards ``stop_on_collapse``; True when the run should stop."""
        rule = cfg.stop_on_collapse
        if rule is None:
            return False
        if DISTINCT_METRIC not in metrics:
            raise ConfigError(f"stop_on_collapse needs the task's evaluate() to return {DISTINCT_METRIC!r} (got "
                              f"{sorted(metrics)})", fix="set stop_on_collapse to null for this run")
        counted = s["step"] >= rule["after_fraction"] * cfg.max_steps
        one = counted and metrics[DISTINCT_METRIC] <= rule.get("distinct", 1)
        s["collapsed_evals"] = s.get("collapsed_evals", 0) + 1 if one else 0
        return s["collapsed_evals"] >= rule["evals"]

    def gains(score: float, best: float | None, best_step: int) -> bool:
        return best_step < 0 or score > best or (cfg.improve_on_tie and score == best)

    def select_as_authors(val: dict[str, Any], final: bool, reason: str | None) -> None:
        """Score this evaluation the authors' way (:attr:`TrainConfig.authors_selection`) and keep its best weights
        in :data:`AUTHORS_BEST`, under the gate and tie rules of the val selection."""
        a = s.setdefault("authors", {"best_step": -1, "best_metrics": {}, "history": []})
        key = authors["metric"]
        if authors["split"] == "val" and "tokenize" not in authors:
            metrics = val                             # the val evaluation's own scores: no second decoding
        else:
            kw = {"tokenize": authors["tokenize"]} if "tokenize" in authors else {}
            metrics = distributed.broadcast(task.evaluate(model, authors["split"], **kw))
            model.train()
        if key not in metrics:
            raise ConfigError(f"authors_selection names {key!r} but the task's evaluate() on {authors['split']} "
                              f"returned {sorted(metrics)}", fix="name one of those metrics")
        record = {"step": s["step"], "split": authors["split"], **metrics}
        a["history"].append(record)
        write_log({"eval_authors": record})
        score, best = metrics[key], a["best_metrics"].get(key)
        if s["step"] > cfg.select_after_step and gains(score, best, a["best_step"]):
            a["best_step"], a["best_metrics"] = s["step"], dict(metrics)
            save_best(AUTHORS_BEST)
        elif a["best_step"] < 0 and (reason or final):    # as the val selection: no step past the gate
            a["best_step"], a["best_metrics"] = s["step"], dict(metrics)
            save_best(AUTHORS_BEST)

    def evaluate(final: bool) -> str | None:
        """Evaluate on val, keep the best weights; the reason to end the run now (early_stop, collapsed) or None.
        ``final``: the run's last evaluation whatever it returns."""
        metrics = task.evaluate(model, "val") if metric is not None else {}
        metrics = distributed.broadcast(metrics)     # rank 0's scores decide for every rank
        model.train()
        record = {"step": s["step"], "minutes": round((time.perf_counter() - started) / 60, 3), **metrics}
        s["history"].append(record)
        write_log({"eval": record})
        if metric is None:
            s["best_step"], s["best_metrics"] = s["step"], metrics
            save_best()
            return "collapsed" if collapsed(metrics) else None
        if metric not in metrics:
            raise ConfigError(f"the task's evaluate() returned no {metric!r} (got {sorted(metrics)})")
        gated = s["step"] <= cfg.select_after_step
        score, best = metrics[metric], s["best_metrics"].get(metric)
        gain = gains(score, best, s["best_step"])
        if not gated and gain:
            s["best_step"], s["best_metrics"], s["bad_evals"] = s["step"], dict(metrics), 0
            save_best()
        else:
            s["bad_evals"] += 1
        reason = "collapsed" if collapsed(metrics) else (
            "early_stop" if cfg.patience is not None and s["bad_evals"] >= cfg.patience else None)
        if s["best_step"] < 0 and (reason or final):
            # the run ends before the gate: its last weights are the only ones it has (the authors' script would
            # have no best checkpoint to test)
            s["best_step"], s["best_metrics"] = s["step"], dict(metrics)
            save_best()
            write_log({"selected_before_gate": {"step": s["step"], "select_after_step": cfg.select_after_step}})
        if authors is not None:
            select_as_authors(metrics, final, reason)
        return reason

    batch_loader = BatchLoader(task, cfg.seed, loader, dev)
    model.train()
    bar = tqdm(total=cfg.max_steps, initial=s["step"], desc=run_dir.name, disable=not (progress and main),
               unit="step")
    # a run that stopped before max_steps stays stopped when resumed (killed after its last checkpoint)
    stopped, sums, n_logged = s.get("stopped", "max_steps"), {}, 0
    try:
        while s["step"] < cfg.max_steps and stopped == "max_steps":
            consumed = s["batch_in_epoch"]     # a resumed epoch starts after the batches already consumed
            for batch in batch_loader.epoch(s["epoch"], skip=consumed):
                with devices.autocast(dev, cfg.amp):
                    loss, logs = step_fn(batch, s["step"])
                # the mean over ranks is the one-process loss (distributed.global_mean); every rank sees the same
                # value, so a non-finite loss stops all of them
                logged = {"loss": loss.detach().float(), **{k: torch.tensor(float(v)) for k, v in logs.items()}}
                if world > 1:
                    names = sorted(logged)
                    values = distributed.all_sum(torch.stack([logged[k].cpu() for k in names])) / world
                    logged = dict(zip(names, values))
                if not torch.isfinite(logged["loss"]):
                    raise FloatingPointError(f"loss is {float(logged['loss'])} at step {s['step']} ({run_dir})")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss if cfg.gradient_scale == 1.0 else loss * cfg.gradient_scale).backward()
                if cfg.grad_clip or cfg.grad_clip_per_tensor:
                    scaler.unscale_(optimizer)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                if cfg.grad_clip_per_tensor:
                    clip_per_tensor(model.parameters(), cfg.grad_clip_per_tensor)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                consumed += 1
                s["step"] += 1
                s["batch_in_epoch"] = consumed
                bar.update(1)
                for k, v in logged.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n_logged += 1
                if n_logged >= cfg.log_every or s["step"] == cfg.max_steps:
                    means = {k: v / n_logged for k, v in sums.items()}
                    write_log({"step": s["step"], "lr": scheduler.get_last_lr()[0], **means})
                    bar.set_postfix(loss=f"{means['loss']:.3f}")
                    sums, n_logged = {}, 0
                over_time = cfg.max_minutes is not None and time.perf_counter() - started > 60 * cfg.max_minutes
                if cfg.max_minutes is not None:
                    over_time = distributed.broadcast(over_time)   # rank 0's clock
                last = s["step"] == cfg.max_steps or over_time
                evaluated = False
                after = s["step"] - cfg.eval_offset
                cadence = bool(cfg.eval_every) and after > 0 and after % cfg.eval_every == 0
                if cadence or (last and (cfg.eval_at_end or s["best_step"] < 0)):
                    evaluated = True
                    stopped = evaluate(last) or stopped
                if over_time and stopped == "max_steps":
                    stopped = "max_minutes"
                if stopped != "max_steps":
                    s["stopped"] = stopped
                    if stopped == "collapsed":
                        write_log({"stopped": {"reason": stopped, "step": s["step"], "of": cfg.max_steps,
                                               "rule": cfg.stop_on_collapse}})
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
        batch_loader.close()
        bar.close()
        if log is not None:
            log.close()

    result = FitResult(model=model, best_step=s["best_step"], best_metrics=s["best_metrics"],
                       history=s["history"], steps=s["step"], wall_seconds=round(s["elapsed"], 2), stopped=stopped,
                       max_steps=cfg.max_steps,
                       authors={"rule": dict(authors), **s.get("authors", {"best_step": -1, "best_metrics": {},
                                                                           "history": []})}
                       if authors is not None else None)
    if main:
        write_json(run_dir / "fit.json", result.summary(), indent=1)
    distributed.barrier()     # best.pt and fit.json are on disk before any rank reads them
    result.model = load_best(task, run_dir, dev)
    return result

