"""Recorded training traces of IDC-PCL's three ``bird/`` stages (the authors' code run at a tiny size on CPU).

:func:`record_bird_traces` runs, from a checkout of the public code (yaolinli/IDC), K optimiser steps of each stage
the way its script runs them, and writes one file per stage into ``out``:

- ``pcl_bird_gic_trace.pt``: the GIC stage, ``bird/pretrain_cub.py:115-192`` (CUB captions, one image; MLM, MVCL,
  FDA mixed by their ``MetaLoader`` at the config's ratios 9:1:2);
- ``pcl_bird_fgvc_trace.pt``: the Birds-to-Words pre-training with the NABirds FGVC task,
  ``bird/pretrain.py:118-207`` (ratios 9:1:2:3), started from the GIC trace's last weights through their restore
  code (matching keys; the classifier and matcher keep their own initialisation);
- ``pcl_bird_finetune_trace.pt``: the paragraph fine-tuning, ``bird/finetune.py:100-172``, started from the FGVC
  trace's last weights the same way.

Everything random is drawn by the authors' own data code (their ``Dataset`` classes, ``DataLoader(shuffle=True)``
and ``MetaLoader``, num_workers 0) from fixed seeds, and the resulting batches are stored: the MLM and region masks,
the replacement words, the FDA negatives, the task order. Dropout is off (``dropout=0.0``): its masks cannot be
replayed by another implementation. Each step is their script's: train mode, ``zero_grad``, forward, their loss
reduction, backward, every group's lr from ``utils.get_lr_sched``, ``Adam.step``. Stored per step: the task, each
loss term, the total, every group's lr and the gradient norm (2-norm over every gradient, after backward); the
initial and final state_dicts; the lr function at the steps where it changes over the whole run.

The kit replays these through its own loop (tests/test_training_trace_pcl_birds.py).
"""
from __future__ import annotations

import copy
import itertools
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from idckit.authors import checkout_commit
from idckit.authors.pcl import RECORDING_VOCAB, SIZES, _authors_args, _load, _perturb, grad_norm, group_lrs
from idckit.errors import ConfigError

#: K optimiser steps per stage; the pre-training stages take more, so that their task order holds every task
STEPS = {"gic": 8, "fgvc": 10, "finetune": 6}
#: samples per batch (FDA: BATCH // (NEG + 1) groups of a caption and its NEG negatives, as get_dataloader divides)
BATCH, NEG = 6, 2
#: caption lengths (the authors' max_len: [BOS] + at most max_len - 3 words + [EOS], padded to max_len)
MAX_LEN = {"gic": 8, "fgvc": 8, "finetune": 10}
#: NABirds leaf classes of the FGVC batches (their classifier has 555 outputs, hard-coded)
CLASSES = (3, 7, 100, 554)
#: the pre-training stages' warm-up in the traces (their noam formula, bird/utils.py:151-155,174-180, with this
#: warm-up), so that the K steps hold its first step (lr 1e-8), its rise, its peak and its decay; the schedule at
#: the configs' own warm-up is recorded over the whole run
WARMUP = 3
#: the seed of python's ``random`` per stage (their masks and the MetaLoader's task draws): the first whose K
#: draws hold every task of the stage
SEED = {"gic": 3, "fgvc": 6, "finetune": 0}
WORDS = [w for w in RECORDING_VOCAB if not w.startswith("<")]


def _lr_steps(warmup: int, total: int) -> tuple[int, ...]:
    """Where the lr function is sampled: its start, the warm-up's end, and the run's last steps (noam changes at
    every step; these are where its formula switches)."""
    return tuple(sorted({0, 1, 2, warmup - 1, warmup, warmup + 1, 2 * warmup, total - 1, total, total + 1}))


#: the fine-tuning lr's steps: the halvings at 10k and 20k and their neighbours (bird/utils.py:164-171)
FINETUNE_LR_STEPS = (0, 1, 9999, 10000, 10001, 19999, 20000, 20001, 20002)


class _Cuda:
    """``.cuda()`` a no-op for tensors and modules while recording (the public code calls it everywhere)."""

    def __enter__(self):
        self.saved = torch.Tensor.cuda, torch.nn.Module.cuda
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.nn.Module.cuda = lambda self, *a, **k: self

    def __exit__(self, *exc):
        torch.Tensor.cuda, torch.nn.Module.cuda = self.saved


class _AuthorsData:
    """The authors' ``bird/data`` modules and ``bird/`` model modules, loaded from the checkout (their data modules
    import nothing of the checkout; the model modules neither)."""

    def __init__(self, checkout: Path):
        folder = checkout / "bird"
        self.cub = _load(folder / "data" / "dataset_pretrain_cub.py", "idc_bird_data_pretrain_cub")
        self.bird = _load(folder / "data" / "dataset_pretrain_bird.py", "idc_bird_data_pretrain_bird")
        self.nabirds = _load(folder / "data" / "dataset_pretrain_nabirds.py", "idc_bird_data_pretrain_nabirds")
        self.finetune = _load(folder / "data" / "dataset_finetune_bird.py", "idc_bird_data_finetune_bird")
        self.m_cub = _load(folder / "modules_pretrain_cub.py", "idc_bird_trace_modules_pretrain_cub")
        self.m_bird = _load(folder / "modules_pretrain_bird.py", "idc_bird_trace_modules_pretrain_bird")
        self.m_finetune = _load(folder / "modules_finetune_bird.py", "idc_bird_trace_modules_finetune_bird")


def _feature(g: torch.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Non-negative features with float16 values (the kit stores features as float16, so they replay exactly)."""
    return torch.randn(shape, generator=g).relu().half().float().numpy()


def _sentence(g: torch.Generator, lo: int = 2, hi: int = 6) -> list[str]:
    n = int(torch.randint(lo, hi + 1, (1,), generator=g))
    return [WORDS[int(i)] for i in torch.randint(len(WORDS), (n,), generator=g)]


def _shuffled(words: list[str], g: torch.Generator) -> list[str]:
    """A hard negative: the caption's words in another order (or one word replaced when the order cannot change)."""
    out = [words[int(i)] for i in torch.randperm(len(words), generator=g)]
    if out == words:
        out[0] = WORDS[(WORDS.index(out[0]) + 1) % len(WORDS)]
    return out


def _args(checkout: Path, config: str, max_len: int):
    args, utils = _authors_args(checkout, "bird", config)
    if getattr(args, "l2_wd", 0) > 0:
        raise ConfigError("the traces assume the public configs' l2_wd 0", fix="record from an unmodified checkout")
    tiny = copy.copy(args)
    tiny.batch_size, tiny.max_len, tiny.neg_num = BATCH, max_len, NEG
    if hasattr(args, "warmup_steps"):
        tiny.warmup_steps = WARMUP
    return args, tiny, utils


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone() for k, t in model.state_dict().items()}


def _restore(model: torch.nn.Module, previous: dict[str, torch.Tensor]) -> list[str]:
    """Their stage-to-stage restore (bird/pretrain.py:153-158, bird/finetune.py:129-134): the checkpoint's keys the
    model has replace the model's own; the rest keep their initialisation. Returns the keys taken over."""
    own = model.state_dict()
    taken = {k: v for k, v in previous.items() if k in own}
    own.update(taken)
    model.load_state_dict(own)
    return sorted(taken)


def _continue(model: torch.nn.Module, previous: dict[str, torch.Tensor], g: torch.Generator, args):
    """A later stage's start: perturbed like every trace's model, then the previous stage's weights restored as their
    scripts restore them, and their Adam (nothing frozen: the public config's se_block = de_block = 1). Returns
    (the keys taken over, the initial weights, the optimiser)."""
    _perturb(model, g)
    restored = _restore(model, previous)
    init = _state(model)
    if args.se_block > 1 or args.de_block > 1:
        raise ConfigError("the trace assumes the public config's se_block = de_block = 1 (nothing frozen)",
                          fix="record from an unmodified checkout")
    optim = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr,
                             weight_decay=args.weight_decay)
    return restored, init, optim


def _stack(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def _batches_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded batches as plain tensors (the DataLoader's dicts; FGVC labels [B, 1] kept as they come)."""
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in rows]


# -- GIC (CUB) ---------------------------------------------------------------------------------------------------
def _gic(checkout: Path, mods: _AuthorsData, g: torch.Generator, previous: dict[str, torch.Tensor]
         ) -> dict[str, Any]:
    """The first stage: ``previous`` (no stage before it) is empty."""
    if previous:
        raise ConfigError("the GIC stage starts from its own initialisation, not from another stage")
    args, tiny, utils = _args(checkout, "pretrain_cub.json", MAX_LEN["gic"])
    s, v = SIZES, RECORDING_VOCAB
    side = int(s["regions"] ** 0.5)
    images = {f"cub{i}": _feature(g, (s["feat"], side, side)) for i in range(3 * BATCH)}
    keys = sorted(images)
    datas = [{"img": k, "description": _sentence(g)} for k in keys]
    negs = [{**d, "negs": [_shuffled(d["description"], g) for _ in range(NEG)]} for d in datas]
    rev = {i: w for w, i in v.items()}
    loaders = {}
    for task in args.pretrain_tasks:
        dataset = mods.cub.Dataset(tiny, task, negs if task == "fda" else datas, images=images, vocabs=v,
                                   rev_vocabs=rev, split="train")
        size = int(BATCH / (NEG + 1)) if task == "fda" else BATCH          # bird/pretrain_cub.py:109-112
        loaders[task] = (torch.utils.data.DataLoader(dataset, batch_size=size, shuffle=True), args.r[task])
    meta = mods.cub.MetaLoader(loaders)
    model = mods.m_cub.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"],
                             n_block=s["layers"], vocab_size=len(v), dropout=0.0, max_len=MAX_LEN["gic"],
                             tasks=args.pretrain_tasks, CLS=v["<CLS>"])
    _perturb(model, g)
    init = _state(model)
    optim = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr,
                             weight_decay=args.weight_decay)
    tasks, batches, steps = [], [], []
    for global_step, (task, batch) in enumerate(itertools.islice(meta, STEPS["gic"])):
        model.train()
        model.zero_grad()
        raw_loss, _ = model(batch, task, compute_loss=True)
        loss = raw_loss.mean()
        loss.backward()
        lr_this_step = utils.get_lr_sched(global_step, tiny)
        for group in optim.param_groups:
            group["lr"] = lr_this_step
        steps.append({"loss": loss.detach(), "lr": group_lrs(optim), "grad_norm": grad_norm(model)})
        optim.step()
        tasks.append(task)
        batches.append(batch)
    lr_steps = _lr_steps(args.warmup_steps, args.total_train_steps)
    return {"config": _config(args), "pool": list(meta.sampling_pools), "tasks": tasks,
            "batches": _batches_of(batches), "trace_warmup_steps": WARMUP, "init": init, "final": _state(model),
            "steps": _stack(steps),
            "schedule": {"steps": torch.tensor(lr_steps),
                         "lr": torch.tensor([utils.get_lr_sched(i, args) for i in lr_steps], dtype=torch.float64)}}


def _config(args) -> dict[str, Any]:
    return {"lr": args.lr, "weight_decay": args.weight_decay, "warmup_steps": getattr(args, "warmup_steps", None),
            "total_train_steps": args.total_train_steps, "batch_size": args.batch_size}


# -- FGVC (Birds-to-Words + NABirds) -----------------------------------------------------------------------------
def _fgvc(checkout: Path, mods: _AuthorsData, g: torch.Generator, gic_final: dict[str, torch.Tensor]
          ) -> dict[str, Any]:
    args, tiny, utils = _args(checkout, "pretrain_bird_nabirds.json", MAX_LEN["fgvc"])
    s, v = SIZES, RECORDING_VOCAB
    side = int(s["regions"] ** 0.5)
    images = {f"b2w{i}": _feature(g, (s["feat"], side, side)) for i in range(4 * BATCH)}
    keys = sorted(images)
    datas = [{"img1": keys[2 * i], "img2": keys[2 * i + 1], "description": _sentence(g)} for i in range(2 * BATCH)]
    negs = [{**d, "negs": [_shuffled(d["description"], g) for _ in range(NEG)]} for d in datas]
    # NABirds features are stored [F, n] (bird/data/dataset_pretrain_nabirds.py:30-31 transposes them to [n, F])
    nab_images = {f"nab{i}": _feature(g, (s["feat"], s["regions"])) for i in range(4 * BATCH)}
    nab_keys = sorted(nab_images)
    classes = [CLASSES[int(i)] for i in torch.randint(len(CLASSES), (len(nab_keys),), generator=g)]
    nab = [{"img1": nab_keys[2 * i], "img2": nab_keys[2 * i + 1], "class_id1": classes[2 * i],
            "class_id2": classes[2 * i + 1], "label": int(classes[2 * i] == classes[2 * i + 1])}
           for i in range(2 * BATCH)]
    rev = {i: w for w, i in v.items()}
    loaders = {}
    for task in args.pretrain_tasks:                      # bird/pretrain.py:95-132
        if task == "nabirds":
            dataset = mods.nabirds.Dataset(tiny, nab, nab_images, split="train")
        else:
            dataset = mods.bird.Dataset(tiny, task, negs if task == "fda" else datas, images=images, vocabs=v,
                                        rev_vocabs=rev, split="train")
        size = int(BATCH / (NEG + 1)) if task == "fda" else BATCH
        loaders[task] = (torch.utils.data.DataLoader(dataset, batch_size=size, shuffle=True), args.r[task])
    meta = mods.bird.MetaLoader(loaders)
    model = mods.m_bird.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"],
                              n_block=s["layers"], se_block=args.se_block, de_block=args.de_block,
                              vocab_size=len(v), dropout=0.0, max_len=MAX_LEN["fgvc"], tasks=args.pretrain_tasks,
                              CLS=v["<CLS>"])
    restored, init, optim = _continue(model, gic_final, g, args)
    spy = _Terms(mods.m_bird)
    tasks, batches, steps = [], [], []
    try:
        for global_step, (task, batch) in enumerate(itertools.islice(meta, STEPS["fgvc"])):
            model.train()
            model.zero_grad()
            spy.calls.clear()
            raw_loss, _ = model(batch, task, compute_loss=True)
            loss = raw_loss.mean()
            loss.backward()
            lr_this_step = utils.get_lr_sched(global_step, tiny)
            for group in optim.param_groups:
                group["lr"] = lr_this_step
            row = {"loss": loss.detach(), "lr": group_lrs(optim), "grad_norm": grad_norm(model),
                   "fgvc_class": torch.tensor(float("nan")), "fgvc_match": torch.tensor(float("nan")),
                   "fgvc_contrast": torch.tensor(float("nan"))}
            if task == "nabirds":
                # nabirds_forward's terms: the two cross-entropies it calls, in order, and con_loss
                (class_loss, match_loss), (contrast,) = spy.calls, spy.contrast[-1:]
                row.update(fgvc_class=class_loss, fgvc_match=match_loss, fgvc_contrast=contrast)
            steps.append(row)
            optim.step()
            tasks.append(task)
            batches.append(batch)
    finally:
        spy.remove()
    lr_steps = _lr_steps(args.warmup_steps, args.total_train_steps)
    return {"config": _config(args), "pool": list(meta.sampling_pools), "tasks": tasks,
            "batches": _batches_of(batches), "trace_warmup_steps": WARMUP, "n_classes": model.num_classes,
            "restored": restored, "init": init, "final": _state(model), "steps": _stack(steps),
            "schedule": {"steps": torch.tensor(lr_steps),
                         "lr": torch.tensor([utils.get_lr_sched(i, args) for i in lr_steps], dtype=torch.float64)}}


class _Terms:
    """Records, inside ``modules_pretrain_bird``, what its ``F.cross_entropy`` and ``con_loss`` return (the FGVC
    loss's three terms, which ``nabirds_forward`` returns only summed)."""

    def __init__(self, module):
        self.module, self.calls, self.contrast = module, [], []
        self.saved_f, self.saved_con = module.F, module.con_loss
        spy = self

        class _F:
            def __getattr__(self, name):
                return getattr(spy.saved_f, name)

            def cross_entropy(self, *a, **k):
                out = spy.saved_f.cross_entropy(*a, **k)
                spy.calls.append(out.detach().clone())
                return out

        def con_loss(*a, **k):
            out = spy.saved_con(*a, **k)
            spy.contrast.append(out.detach().clone())
            return out

        module.F, module.con_loss = _F(), con_loss

    def remove(self) -> None:
        self.module.F, self.module.con_loss = self.saved_f, self.saved_con


# -- fine-tuning -------------------------------------------------------------------------------------------------
def _finetune(checkout: Path, mods: _AuthorsData, g: torch.Generator, fgvc_final: dict[str, torch.Tensor]
              ) -> dict[str, Any]:
    args, tiny, utils = _args(checkout, "finetune_bird.json", MAX_LEN["finetune"])
    s, v = SIZES, RECORDING_VOCAB
    side = int(s["regions"] ** 0.5)
    images = {f"ft{i}": _feature(g, (s["feat"], side, side)) for i in range(2 * BATCH * STEPS["finetune"])}
    keys = sorted(images)
    rows = [{"img1": keys[2 * i], "img2": keys[2 * i + 1], "description": _sentence(g, 3, 7)}
            for i in range(BATCH * STEPS["finetune"])]
    rev = {i: w for w, i in v.items()}
    with tempfile.TemporaryDirectory() as tmp:          # their Dataset reads a json-lines file
        path = Path(tmp) / "train.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        dataset = mods.finetune.Dataset(tiny, str(path), vocabs=v, rev_vocabs=rev, images=images, split="train")
    loader = torch.utils.data.DataLoader(dataset=dataset, batch_size=BATCH, shuffle=True)   # finetune.py:93
    model = mods.m_finetune.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"],
                                  n_block=s["layers"], se_block=args.se_block, de_block=args.de_block,
                                  vocab_size=len(v), dropout=0.0, max_len=MAX_LEN["finetune"], CLS=v["<CLS>"])
    restored, init, optim = _continue(model, fgvc_final, g, args)
    batches, steps = [], []
    for global_step, batch in enumerate(itertools.islice(loader, STEPS["finetune"])):
        model.train()
        model.zero_grad()
        loss, _ = model(batch, compute_loss=True)
        loss = loss.sum()
        loss.backward()
        lr_this_step = utils.get_lr_sched(global_step, args, pretrain=False)
        for group in optim.param_groups:
            group["lr"] = lr_this_step
        steps.append({"loss": loss.detach(), "lr": group_lrs(optim), "grad_norm": grad_norm(model)})
        optim.step()
        batches.append(batch)
    return {"config": _config(args), "batches": _batches_of(batches), "restored": restored, "init": init,
            "final": _state(model), "steps": _stack(steps),
            "schedule": {"steps": torch.tensor(FINETUNE_LR_STEPS),
                         "lr": torch.tensor([utils.get_lr_sched(i, args, pretrain=False) for i in FINETUNE_LR_STEPS],
                                            dtype=torch.float64)}}


def record_bird_traces(checkout: str | Path, out: str | Path) -> list[Path]:
    """Record the three stages' traces of ``checkout`` into ``out`` (``pcl_bird_{gic,fgvc,finetune}_trace.pt``);
    returns the files written. Each stage starts from the one before's last weights (their restore code)."""
    checkout, out = Path(checkout), Path(out)
    if not (checkout / "bird" / "pretrain_cub.py").is_file():
        raise ConfigError(f"{checkout} is not a checkout of the public IDC-PCL code (no bird/pretrain_cub.py)",
                          path=checkout, fix="git clone https://github.com/yaolinli/IDC and pass its folder")
    commit = checkout_commit(checkout)
    mods = _AuthorsData(checkout)
    common = {"commit": commit, "sizes": dict(SIZES), "vocab": dict(RECORDING_VOCAB), "dropout": 0.0,
              "batch": BATCH, "neg": NEG}
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    paths, previous = [], {}
    try:
        with _Cuda():
            for stage, run in (("gic", _gic), ("fgvc", _fgvc), ("finetune", _finetune)):
                # their scripts seed python, numpy and torch (bird/pretrain_cub.py:48-50); the draws here are the
                # data code's (masks, shuffles, task order) and the weights' perturbation
                random.seed(SEED[stage])
                np.random.seed(SEED[stage])
                torch.manual_seed(SEED[stage])
                g = torch.Generator().manual_seed(40 + len(paths))
                rec = run(checkout, mods, g, previous)
                previous = rec["final"]
                path = out / f"pcl_bird_{stage}_trace.pt"
                torch.save({**common, "stage": stage, "max_len": MAX_LEN[stage], **rec}, path)
                paths.append(path)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        torch.set_num_threads(threads)
    return paths
