"""Benchmark: the one training loop's throughput by device, process count, precision and compilation, side by side.

Trains IDC-PCL pre-training (MLM steps; the kit's real task and loop, ``idckit.train.loop.fit``) on random float16
features memory-mapped from a file as the feature store does, at the cpu profile's model size (read from pcl.json;
2 cross-modal layers, 49 regions of 1280-d features, 28 words) and reports samples/s of each mode against the first:

    base      1 process  x THREADS threads, fp32, eager, batches read in the training process
    amp       1 process  x THREADS threads, mixed precision (bf16 autocast on this device)
    compile   1 process  x THREADS threads, fp32, torch.compile (the first steps compile and are not timed)
    ddp       NPROC torchrun processes x THREADS/NPROC threads each (gloo on CPU, NCCL on CUDA), fp32, same
              global batch: the data-parallel overhead on this machine
    workers   as base, with WORKERS DataLoader worker processes reading the feature rows ahead of the step
              (pinned memory on CUDA; idckit.train.loader)
    nodropout as base with the model's dropout 0: on CPU the dropout masks (bernoulli draws over every attention
              map) cost about a third of a step at the cpu model's size (--modes base nodropout)

Steps are timed from inside the loop (the start of step WARMUP to the start of the last step), so the model build,
compilation and the first steps do not count. Run:
    .venv/bin/python bench/bench_train_loop.py --threads 2 --nproc 2 --workers 2 --batch 64 --steps 12
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts OpenMP

import numpy as np  # noqa: E402
import torch  # noqa: E402

from idckit.text.pcl_inputs import PCLData, SplitData  # noqa: E402
from idckit.tasks.pcl import PretrainTask  # noqa: E402
from idckit.text.vocab import SPECIALS, Vocab  # noqa: E402
from idckit.train import distributed  # noqa: E402
from idckit.experiments.config import load_config, train_config  # noqa: E402
from idckit.train.loop import fit  # noqa: E402

CPU = load_config("pcl", "cpu")
MODEL = CPU["model"]     # the size the cpu profile trains, from its one source
PRETRAIN = {k: CPU["pretrain"][k] for k in ("mask_prob", "eos_prob", "region_prob", "tau_mvcl", "tau_fda")}


def write_features(path: Path, n_pairs: int = 512, regions: int = 49, dim: int = 1280) -> None:
    g = torch.Generator().manual_seed(0)
    np.save(path, torch.randn(2 * n_pairs, regions, dim, generator=g).half().numpy())


def data(features: Path, n_pairs: int = 512, max_len: int = 28) -> PCLData:
    g = torch.Generator().manual_seed(1)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(80 - len(SPECIALS))])
    ids = torch.randint(vocab.n_special, 80, (n_pairs, max_len), generator=g)
    ids[:, 0], ids[:, -1] = vocab.bos_id, vocab.eos_id
    train = SplitData(pair_ids=[str(i) for i in range(n_pairs)], types=["color"] * n_pairs,
                      before=torch.arange(n_pairs), after=torch.arange(n_pairs, 2 * n_pairs),
                      is_change=torch.ones(n_pairs, dtype=torch.bool), references={},
                      sample_pair=torch.arange(n_pairs), sample_ids=ids)
    import warnings

    with warnings.catch_warnings():   # read-only memmap, as idckit.text.pcl_inputs.load_pcl_data reads the store
        warnings.simplefilter("ignore", UserWarning)
        features = torch.from_numpy(np.load(features, mmap_mode="r"))
    return PCLData(vocab=vocab, features=features, splits={"train": train}, max_len=max_len)


class Timed(PretrainTask):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.starts: list[float] = []

    def train_step(self, model, batch, step):
        self.starts.append(time.perf_counter())
        return super().train_step(model, batch, step)


def run(mode: str, args, out: Path) -> dict:
    """One mode in this process (a torchrun worker for ddp); rank 0 returns {samples_s, ...}."""
    model = {**MODEL, "dropout": 0.0} if mode == "nodropout" else MODEL
    task = Timed(data(out / "features.npy"), model, batch_size=args.batch, ratios={"mlm": 1}, **PRETRAIN)
    cfg = train_config(dict(max_steps=args.steps, lr=1e-4, log_every=1000, seed=0, amp=mode == "amp",
                      compile=mode == "compile"))
    fit(task, cfg, out / mode, progress=False, device=args.device,
        loader={"workers": args.workers if mode == "workers" else 0})
    t = task.starts
    timed = len(t) - 1 - args.warmup
    return {"mode": mode, "samples_s": args.batch * timed / (t[-1] - t[args.warmup]),
            "s_per_step": (t[-1] - t[args.warmup]) / timed}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="auto, cpu, cuda, cuda:N")
    ap.add_argument("--nproc", type=int, default=2, help="processes of the ddp mode (1 skips it)")
    ap.add_argument("--threads", type=int, default=2, help="threads of a single process (ddp: divided)")
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps (compilation happens here)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the workers mode")
    ap.add_argument("--modes", nargs="*", default=["base", "amp", "compile", "ddp", "workers"])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:                           # inside torchrun
        torch.set_num_threads(max(1, args.threads // args.world))
        res = run(args.worker, args, args.out)
        if distributed.is_main():
            (args.out / "ddp.json").write_text(json.dumps(res))
        return res
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_features(out / "features.npy")
        for mode in args.modes:
            if mode == "ddp":
                if args.nproc < 2:
                    continue
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                       __file__, "--worker", "ddp", "--out", str(out), "--device", args.device, "--world",
                       str(args.nproc), "--threads", str(args.threads), "--batch", str(args.batch), "--steps",
                       str(args.steps), "--warmup", str(args.warmup)]   # torchrun would take --nproc as its own
                subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads
                                                                                               // args.nproc))})
                res = json.loads((out / "ddp.json").read_text())
            else:
                res = run(mode, args, out)
            results.append(res)
            print(f"  ({mode}: {res['samples_s']:.1f} samples/s)", flush=True)
    base = results[0]["samples_s"]
    print(f"IDC-PCL pre-training (MLM) through the training loop, cpu-profile model, global batch {args.batch}, "
          f"{args.steps - 1 - args.warmup} timed steps, device {args.device}, {args.threads} threads in all; "
          f"native CPU bf16: {bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}")
    labels = {"base": "1 process, fp32, eager", "amp": "1 process, mixed precision", "compile": "1 process, compiled",
              "ddp": f"{args.nproc} processes x {max(1, args.threads // args.nproc)} thread(s), gloo/nccl",
              "workers": f"1 process, {args.workers} DataLoader workers",
              "nodropout": "1 process, fp32, dropout 0"}
    for r in results:
        print(f"  {labels[r['mode']]:38s} {r['samples_s']:8.1f} samples/s  {r['s_per_step']:6.3f} s/step  "
              f"{r['samples_s'] / base:5.2f}x")
    return {r["mode"]: r for r in results}


if __name__ == "__main__":
    main()
