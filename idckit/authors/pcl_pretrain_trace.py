"""A recorded training trace of the authors' IDC-PCL ``clver/`` pre-training (``clver/pretrain.py`` at their commit).

:func:`record_clver_pretrain_trace` runs their pre-training the way ``clver/pretrain.py:103-170`` runs it, at the
recordings' tiny :data:`~idckit.authors.pcl.SIZES` on the CPU, and writes ``pcl_clver_pretrain_trace.pt``:

- their data pipeline makes the batches: ``data/dataset_pretrain_clver.Dataset`` for each of their config's
  ``pretrain_tasks`` (``mlm``, ``mvm_contrst`` = MVCL, ``fda``) over a tiny made-up corpus, each in a
  ``torch.utils.data.DataLoader(shuffle=True)`` (``num_workers=0``, so every random draw is in this process), and
  their ``MetaLoader`` draws the task of each step from its pool (their config's ratios ``r``: 8 MLM, 1 MVCL,
  2 FDA). Python's and torch's generators are seeded (:data:`TRACE_SEED`, chosen so the first
  :data:`TRACE_STEPS` draws cover every task at least twice). Each batch is stored as it came out, so its MLM
  masks and replacement words, MVCL masks and FDA negatives are fixed in it; the task order is stored too.
- their model (``modules_pretrain.Model``, weights perturbed off their initialisation) with ``dropout=0.0``:
  dropout masks cannot be replayed by another implementation;
- their step: ``model.train(); model.zero_grad(); raw_loss, _ = model(batch, task); loss = raw_loss.mean();
  loss.backward()``, every group's lr set to ``utils.get_lr_sched(global_step, args)`` (pretrain=True, Noam with
  their floor of 1e-8 at step 0), ``torch.optim.Adam`` (their config's lr and weight decay) stepped; global_step
  counts from 0.
- their config's ``warmup_steps`` (8000) is replaced by :data:`TRACE_WARMUP` for the trace, so the warm-up, its
  end and the decay after it fall inside the recorded steps (at 8000 the lr would stay near 1e-8 and no weight
  would move). The whole run's schedule at their config's warm-up is stored at :data:`TRACE_SCHEDULE_STEPS`.

Stored per step: the task, its loss (their ``raw_loss.mean()``: the only term of a step), the number of terms it
averages, every group's lr and the gradient norm (over all gradients after backward); the initial and final
state_dict; the batches. ``tests/test_training_trace_pcl_pretrain.py`` replays them through the kit's loop.
"""
from __future__ import annotations

import random
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from idckit.authors import checkout_commit
from idckit.authors.pcl import (AUTHORS_SPECIALS, RECORDING_VOCAB, SEED, SIZES, _authors_args, _load, _perturb,
                                grad_norm, group_lrs)
from idckit.errors import ConfigError

#: optimiser steps recorded
TRACE_STEPS = 10
#: the python/torch seed of the trace's data pipeline and task draws: its first TRACE_STEPS draws hold every task
#: at least twice
TRACE_SEED = 24
#: the trace's warm-up (their config's 8000 kept for the whole-run schedule)
TRACE_WARMUP = 4
#: samples per MLM/MVCL batch; FDA takes int(TRACE_BATCH / (negatives + 1)) pairs, as ``get_dataloader`` does
TRACE_BATCH = 8
#: (pair, caption) samples in the made-up corpus; pairs (each has two captions)
TRACE_SAMPLES, TRACE_PAIRS = 16, 8
#: where their ``get_lr_sched(step, args, pretrain=True)`` is sampled over the whole run (0 .. total_train_steps,
#: at their warm-up of 8000): the floor at 0, the warm-up's start and end, the decay after it and the last step
TRACE_SCHEDULE_STEPS = (0, 1, 2, 3999, 7999, 8000, 8001, 8002, 16000, 100000, 249999, 250000)


@contextmanager
def _their_command_line(folder: Path) -> Iterator[None]:
    """Their modules read ``sys.argv`` (``para.parse_args``) and import ``para`` from their folder when loaded."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = ["clver/pretrain.py", "--dataset", "clver", "--exp_name", "trace", "--config",
                str(folder / "config" / "pretrain_clver.json")]
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _corpus(g: torch.Generator) -> tuple[list[dict], list[dict], dict[str, dict[str, np.ndarray]]]:
    """(their caption samples, their FDA samples, their image dict): TRACE_PAIRS pairs of two images each, two
    captions of 2..5 words per pair (no truncation at max_len 8), SIZES["neg"] negatives per pair (its words
    shuffled, as hard negatives are); images as ``load_split_images`` holds them ([feat, 2, 2] arrays whose values
    are float16 numbers, as the kit stores features)."""
    s = SIZES
    words = [w for w in RECORDING_VOCAB if w not in AUTHORS_SPECIALS]
    side = int(round(s["regions"] ** 0.5))
    images: dict[str, np.ndarray] = {}
    datas, negs = [], []
    for p in range(TRACE_PAIRS):
        a, b = f"CLEVR_default_{p:06d}", f"CLEVR_semantic_{p:06d}"
        for name in (a, b):
            images[name] = torch.randn(s["feat"], side, side, generator=g).relu().half().float().numpy()
        caps = [[words[int(i)] for i in torch.randint(len(words), (int(k),), generator=g)]
                for k in torch.randint(2, s["max_len"] - 2, (2,), generator=g)]
        pair_negs = []
        for _ in range(s["neg"]):
            cap = caps[0]
            pair_negs.append([cap[int(i)] for i in torch.randperm(len(cap), generator=g)])
        for cap in caps:
            datas.append({"img1": a, "img2": b, "sentences": cap})
            negs.append({"img1": a, "img2": b, "sentences": cap, "negs": pair_negs})
    return datas, negs, {"img": images}


def record_clver_pretrain_trace(checkout: str | Path, out: str | Path) -> Path:
    """``out/pcl_clver_pretrain_trace.pt``: TRACE_STEPS optimiser steps of the authors' ``clver/`` pre-training
    (module doc)."""
    checkout, out = Path(checkout), Path(out)
    folder = checkout / "clver"
    if not (folder / "pretrain.py").is_file():
        raise ConfigError(f"{checkout} is not a checkout of the public IDC-PCL code (no clver/pretrain.py)",
                          path=checkout, fix="git clone https://github.com/yaolinli/IDC and pass its folder")
    args, utils = _authors_args(checkout, "clver", "pretrain_clver.json")
    with _their_command_line(folder):
        dataset = _load(folder / "data" / "dataset_pretrain_clver.py", "idc_clver_dataset_pretrain")
    modules = _load(folder / "modules_pretrain.py", "idc_clver_modules_pretrain_trace")
    s, v = SIZES, RECORDING_VOCAB
    tasks = list(args.pretrain_tasks)
    if sorted(tasks) != ["fda", "mlm", "mvm_contrst"]:
        raise ConfigError(f"the trace expects their config's tasks mlm, mvm_contrst, fda, got {tasks}",
                          fix="record from an unmodified checkout")
    schedule = torch.tensor([utils.get_lr_sched(i, args, pretrain=True) for i in TRACE_SCHEDULE_STEPS],
                            dtype=torch.float64)
    config = {"lr": args.lr, "weight_decay": args.weight_decay, "warmup_steps": args.warmup_steps,
              "total_train_steps": args.total_train_steps, "ratios": {t: int(args.r[t]) for t in tasks},
              "tmp": args.tmp}
    # their dataset reads args.max_len and args.dataset; the loaders' batch sizes follow get_dataloader
    args.max_len, args.neg_num, args.batch_size, args.warmup_steps = s["max_len"], s["neg"], TRACE_BATCH, TRACE_WARMUP
    g = torch.Generator().manual_seed(SEED + 30)
    datas, neg_datas, images = _corpus(g)

    saved = torch.Tensor.cuda, torch.nn.Module.cuda
    # the public code puts every tensor on the GPU with .cuda(); here everything stays on the CPU
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    try:
        torch.manual_seed(SEED + 30)
        model = modules.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"],
                              n_block=s["layers"], img_enc_block=1, vocab_size=len(v), dropout=0.0,
                              max_len=s["max_len"], tasks=tasks, tmp=args.tmp, CLS=v["<CLS>"])
        _perturb(model, g)
        init = {k: t.detach().clone() for k, t in model.state_dict().items()}

        # clver/pretrain.py:84-117: one Dataset and DataLoader per task, FDA's batch int(bs / (neg_num + 1))
        random.seed(TRACE_SEED)
        np.random.seed(TRACE_SEED)
        torch.manual_seed(TRACE_SEED)
        rev = {i: w for w, i in v.items()}
        loaders = {}
        for task in tasks:
            data = dataset.Dataset(args, task, neg_datas if task == "fda" else datas, images=images, vocabs=v,
                                   rev_vocabs=rev, split="train")
            size = int(args.batch_size / (args.neg_num + 1)) if task == "fda" else args.batch_size
            loaders[task] = (torch.utils.data.DataLoader(dataset=data, batch_size=size, shuffle=True), args.r[task])
        meta = dataset.MetaLoader(loaders)
        pool = list(meta.sampling_pools)

        # clver/pretrain.py:147 and :155-170
        optim = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr,
                                 weight_decay=args.weight_decay)
        order, batches, steps = [], [], []
        global_step = -1
        for _, (task, batch) in zip(range(TRACE_STEPS), meta):
            global_step += 1
            order.append(task)
            batches.append({k: t.clone() for k, t in batch.items()})
            model.train()
            model.zero_grad()
            raw_loss, _ = model(batch, task, compute_loss=True)
            loss = raw_loss.mean()
            loss.backward()
            lr_this_step = utils.get_lr_sched(global_step, args)
            for group in optim.param_groups:
                group["lr"] = lr_this_step
            steps.append({"loss": loss.detach().clone(), "terms": torch.tensor(raw_loss.numel()),
                          "lr": group_lrs(optim), "grad_norm": grad_norm(model)})
            optim.step()
        final = {k: t.detach().clone() for k, t in model.state_dict().items()}
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda = saved
    for task in tasks:
        if order.count(task) < 2:
            raise ConfigError(f"the trace's {TRACE_STEPS} steps hold {task} {order.count(task)} time(s), fewer "
                              f"than 2: {order}", fix="choose another TRACE_SEED")
    path = out / "pcl_clver_pretrain_trace.pt"
    record: dict[str, Any] = {
        "commit": checkout_commit(checkout), "sizes": dict(s), "vocab": dict(v), "max_len": s["max_len"],
        "dropout": 0.0, "config": config, "trace_warmup": TRACE_WARMUP, "pool": pool, "tasks": order,
        "batches": batches, "init": init, "final": final,
        "steps": {k: torch.stack([st[k] for st in steps]) for k in steps[0]},
        "schedule": {"steps": torch.tensor(TRACE_SCHEDULE_STEPS), "lr": schedule}}
    torch.save(record, path)
    return path
