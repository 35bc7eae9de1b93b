"""Benchmark: every model the cpu profile trains, at its cpu size: fp32 vs bf16 autocast, 1 vs 2 threads, 2 gloo
processes x 1 thread vs 1 process, against this machine's matmul peak, side by side in one run.

Each model is the kit's own task (``build_model``, ``batches``, ``train_step``) on synthetic data of the right
shapes (features 49 x 1280 as efficientnet_lite0 gives them, CLIP BPE ids, uint8 images at the stand-in's size);
sizes and batch sizes come from the cpu profile of the config JSONs. A timed step is the task's ``train_step``
(under ``torch.autocast("cpu", dtype=torch.bfloat16)`` for bf16), backward and an Adam update, on one batch drawn
once (so data drawing is not timed); pre-training is timed per step kind (MLM, MVCL, FDA), as the ratio pool
mixes them. Modes (the first three alternate step by step; the best step of each counts):

    fp32 1t     1 process, 1 thread (the baseline of every ratio)
    bf16 1t     1 process, 1 thread, bf16 autocast
    fp32 2t     1 process, 2 threads
    ddp 2x1     2 processes (torch.multiprocessing spawn, gloo) x 1 thread, the same global batch split by the
                task's ``shard``; the step wrapped in DistributedDataParallel as ``idckit.train.loop.fit`` wraps it
    compiled    (``--compile``) 1 process, 1 thread, fp32, the step under ``torch.compile`` (inductor): its first
                step (the compilation) is reported apart and not timed

The FLOPs of a step are counted once (FlopCounterMode, forward + backward) and divided by the best step time:
GFLOP/s and their fraction of the fp32 peak at the same thread count. Peaks are the best of a few n^3 matmuls.
A task without ``shard`` (DUDA) cannot run on 2 processes in the kit: its ddp column says "-".
Not covered: the birds' FGVC pre-training stage (it needs class-labelled image pairs; its steps are the same model).
Run (the machine is shared: note the load printed first):
    .venv/bin/python bench/bench_train_models.py --steps 3
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts OpenMP

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench_decoding_clip4idc import count_flops  # noqa: E402
from bench_train_pcl import matmul_gflops  # noqa: E402
from idckit.experiments.config import load_config  # noqa: E402
from idckit.text.pcl_inputs import PCLData, SplitData  # noqa: E402
from idckit.text.vocab import SPECIALS, Vocab  # noqa: E402

FEAT, REGIONS = 1280, 49        # efficientnet_lite0 at 224 px (the cpu profile's backbone)
SOT, EOT = 49406, 49407          # CLIP BPE


def pcl_data(n_scenes: int, max_len: int, captions: int = 4) -> PCLData:
    """Scenes as the kit stores them: a change pair and a distractor pair per before-image, ``captions`` each."""
    g = torch.Generator().manual_seed(0)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(80 - len(SPECIALS))])
    n = 2 * n_scenes
    ids = torch.randint(vocab.n_special, 80, (n * captions, max_len), generator=g)
    length = min(12, max_len)                                       # CLEVR captions: ~11 words
    ids[:, 0], ids[:, length:] = vocab.bos_id, vocab.pad_id
    ids[:, length - 1] = vocab.eos_id
    scene = torch.arange(n) // 2
    change = torch.arange(n) % 2 == 0
    pair_ids = [str(i) for i in range(n)]
    train = SplitData(pair_ids=pair_ids, types=["color" if c else "distractor" for c in change.tolist()],
                      before=3 * scene, after=3 * scene + 1 + (~change).long(), is_change=change,
                      references={p: ["the w9 w10 changed" if c else "no change"]
                                  for p, c in zip(pair_ids, change.tolist())},
                      sample_pair=torch.arange(n).repeat_interleave(captions), sample_ids=ids)
    data = PCLData(vocab=vocab, features=torch.randn(3 * n_scenes, REGIONS, FEAT, generator=g).half(),
                   splits={"train": train}, max_len=max_len)
    data.negatives = {p: [" ".join(f"w{i}" for i in range(10))] * 6 for p in pair_ids}
    return data


def _pretrain(name: str, kind: str):
    """Pre-training steps of one ``kind`` (mlm, mvcl, fda): a step's cost depends on its kind."""
    from idckit.tasks.pcl import PretrainTask

    cfg = load_config(name, "cpu")
    p = cfg["pretrain"]
    return PretrainTask(pcl_data(p["batch_size"], cfg["max_len"]), cfg["model"], batch_size=p["batch_size"],
                        ratios={kind: 1}, mask_prob=p["mask_prob"], eos_prob=p["eos_prob"],
                        region_prob=p["region_prob"], tau_mvcl=p["tau_mvcl"], tau_fda=p["tau_fda"])


def _finetune(name: str, model_overrides: dict | None = None, **finetune_overrides):
    """The cpu profile's fine-tuning task of ``name`` (pcl, pcl_birds), with model / finetune overrides."""
    from idckit.tasks.pcl import FinetuneTask

    cfg = load_config(name, "cpu")
    f = {**cfg["finetune"], **finetune_overrides}
    b = f["batch_size"]
    return FinetuneTask(pcl_data(b, cfg["max_len"]), {**cfg["model"], **(model_overrides or {})}, batch_size=b,
                        mask_prob=f["mask_prob"], eos_prob=f["eos_prob"], distractor_weight=f["distractor_weight"],
                        eval_batch_size=f["eval_batch_size"], group_by_pair=f["group_by_pair"],
                        captions_per_pair=f["captions_per_pair"], targets=f["targets"],
                        selection_metric=f["selection_metric"], tokenize=f["tokenize"])


def _duda():
    from idckit.tasks.duda import DUDATask

    cfg = load_config("duda", "cpu")
    return DUDATask(pcl_data(cfg["batch_size"], cfg["max_len"], captions=1), cfg["model"],
                    batch_size=cfg["batch_size"], attention_l1=cfg["attention_l1"], swap_before=cfg["swap_before"],
                    eval_batch_size=cfg["eval_batch_size"])


def _images(model_name: str, n: int):
    from idckit.data.images import ImageCache
    from idckit.models.clip_loader import load_clip

    size = load_clip(model_name, None)[0].visual.image_size[0]
    pixels = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return ImageCache(pixels, {str(i): i for i in range(n)})


def _clip_ids(n: int, length: int) -> torch.Tensor:
    ids = torch.randint(1, 49000, (n, length), generator=torch.Generator().manual_seed(1))
    ids[:, 0], ids[:, 12], ids[:, 13:] = SOT, EOT, 0
    return ids


def _standin():
    from idckit.tasks.clip_pretrain import DescriptionData, StandinPretrainTask

    cfg = load_config("clip_standin", "cpu")
    b = cfg["batch_size"]
    images = _images(cfg["model"], 3 * b)
    objects = {r: [f"a small red rubber cube {i}" for i in range(6)] for r in range(3 * b)}
    data = DescriptionData(images=images, train_scenes=torch.arange(3 * b).view(b, 3), objects=objects,
                           object_tokens={r: [6] * 6 for r in objects}, val_rows=torch.arange(b))
    return StandinPretrainTask(data, cfg["model"], batch_size=b, weight_decay=cfg["weight_decay"],
                               eval_batch_size=cfg["eval_batch_size"])


def _pair_data(model_name: str, scenes: int, max_len: int):
    from idckit.tasks.clip4idc import PairData, PairSplit

    n = 2 * scenes
    scene, change = torch.arange(n) // 2, torch.arange(n) % 2 == 0
    split = PairSplit(pair_ids=[str(i) for i in range(n)], types=["color"] * n, before=3 * scene,
                      after=3 * scene + 1 + (~change).long(), is_change=change,
                      distractor_row=torch.where(change, 3 * scene + 2, -1), references={},
                      sample_pair=torch.arange(n), sample_ids=_clip_ids(n, max_len))
    return PairData(images=_images(model_name, 3 * scenes), splits={"train": split}, max_len=max_len)


def _adapt():
    from idckit.tasks.clip4idc import AdaptTask

    cfg = load_config("clip4idc_adapt", "cpu")
    b = cfg["batch_size"]
    return AdaptTask(_pair_data(cfg["clip"]["model"], b, 32), cfg["clip"]["model"], None, batch_size=b,
                     clip_lr_scale=cfg["clip_lr_scale"], weight_decay=cfg["weight_decay"], swap_prob=cfg["swap_prob"],
                     freeze_intra=cfg["freeze_intra"], freeze_embeddings=cfg["freeze_embeddings"],
                     eval_batch_size=cfg["eval_batch_size"], ks=(1,))


def _caption():
    from idckit.tasks.clip4idc import CaptionTask

    cfg = load_config("clip4idc_caption", "cpu")
    clip = load_config("clip4idc_adapt", "cpu")["clip"]["model"]
    b = cfg["batch_size"]
    return CaptionTask(_pair_data(clip, b, cfg["max_len"]), clip, None, cfg["captioner"], batch_size=b,
                       visual_lr_scale=cfg["visual_lr_scale"], trim_vocab=cfg["trim_vocab"],
                       eval_batch_size=cfg["eval_batch_size"], captions_per_pair=cfg["captions_per_pair"])


#: name -> (task factory, what it trains)
MODELS = {
    "pcl_mlm": (lambda: _pretrain("pcl", "mlm"), "IDC-PCL pre-training, MLM steps (pcl.json)"),
    "pcl_mvcl": (lambda: _pretrain("pcl", "mvcl"), "IDC-PCL pre-training, MVCL steps (pcl.json)"),
    "pcl_fda": (lambda: _pretrain("pcl", "fda"), "IDC-PCL pre-training, FDA steps (pcl.json)"),
    "pcl_finetune": (lambda: _finetune("pcl"), "IDC-PCL fine-tuning (pcl.json)"),
    "duda": (_duda, "DUDA (duda.json)"),
    "birds_mlm": (lambda: _pretrain("pcl_birds", "mlm"), "IDC-PCL birds pre-training, MLM steps (pcl_birds.json)"),
    "birds_finetune": (lambda: _finetune("pcl_birds"), "IDC-PCL birds fine-tuning (pcl_birds.json)"),
    "clip_standin": (_standin, "stand-in CLIP pre-training (clip_standin.json)"),
    "clip4idc_adapt": (_adapt, "CLIP4IDC adaptation (clip4idc_adapt.json)"),
    "clip4idc_caption": (_caption, "CLIP4IDC captioner (clip4idc_caption.json)"),
}


def samples_of(batch: dict) -> int:
    """(pair, caption) samples of a batch: grouped fine-tuning has [P, k, L] text."""
    for key in ("text", "ids", "tokens"):
        if key in batch and torch.is_tensor(batch[key]):
            t = batch[key]
            return t.shape[0] * (t.shape[1] if t.dim() == 3 else 1)
    return len(batch["pairs"])


class Bench:
    """One model: its task, model, Adam, and a batch drawn once; ``step`` is what a training step runs."""

    def __init__(self, name: str, ddp: bool = False, task=None):
        from idckit.train.loop import _Step

        torch.manual_seed(0)
        self.task = MODELS[name][0]() if task is None else task
        self.model = self.task.build_model().train()
        self.batch = next(iter(self.task.batches(0, torch.Generator().manual_seed(0))))
        self.samples = samples_of(self.batch)      # global
        step = _Step(self.task, self.model)
        if ddp:                                    # as the loop does: this rank's rows, then read them
            from torch.nn.parallel import DistributedDataParallel

            self.batch = self.task.shard(self.batch)
            step = DistributedDataParallel(step, device_ids=None, find_unused_parameters=True)
        if hasattr(self.task, "load"):
            self.batch = self.task.load(self.batch)
        self.fn = step
        self.opt = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], 1e-4)

    def step(self, bf16: bool = False) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = self.fn(self.batch, 0)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def time(self, modes: dict[str, tuple[bool, int]], warmup: int, steps: int) -> dict[str, float]:
        """Best seconds per step of each mode (name -> (bf16, threads)), ``steps`` rounds after ``warmup``; the
        modes alternate within a round, so a burst of load from other jobs hits all of them."""
        best = dict.fromkeys(modes, float("inf"))
        for i in range(warmup + steps):
            for name, (bf16, threads) in modes.items():
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                self.step(bf16)
                if i >= warmup:
                    best[name] = min(best[name], time.perf_counter() - t0)
        torch.set_num_threads(1)
        return best

    def flops(self) -> float:
        def run():
            loss, _ = self.fn(self.batch, 0)
            loss.backward()
        total, _ = count_flops(run)
        self.model.zero_grad(set_to_none=True)
        return total


def _ddp_worker(rank: int, name: str, port: int, warmup: int, steps: int, out) -> None:
    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        b = Bench(name, ddp=True)
        for _ in range(warmup):
            b.step()
        times = []
        for _ in range(steps):      # every rank times the same steps; a step ends when the slower rank's does
            dist.barrier()
            t0 = time.perf_counter()
            b.step()
            dist.barrier()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out.put(min(times))
    finally:
        dist.destroy_process_group()


def ddp_time(name: str, warmup: int, steps: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_ddp_worker, args=(name, port, warmup, steps, out), nprocs=2, start_method="spawn")
    return out.get()


def compiled_time(name: str, steps: int) -> tuple[float, float]:
    """(seconds of the first step, which compiles; best seconds per step after it) of the step under
    ``torch.compile``, 1 thread, fp32: a fresh model, so the eager modes' timings are untouched."""
    torch.set_num_threads(1)
    b = Bench(name)
    b.fn = torch.compile(b.fn)
    t0 = time.perf_counter()
    b.step()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(steps + 1):                    # one more: a shape seen once may recompile on the second step
        t0 = time.perf_counter()
        b.step()
        best = min(best, time.perf_counter() - t0)
    return first, best


def peaks(n: int, repeats: int = 3) -> dict[tuple[str, int], float]:
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            out[(str(dtype).split(".")[1], threads)] = max(matmul_gflops(dtype, n) for _ in range(repeats))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode (the best one counts)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--peak-n", type=int, default=2048, help="size of the n^3 peak matmuls")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time the step under torch.compile")
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)   # open_clip's "no pretrained weights" for every stand-in built
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1/5/15 min), "
          f"{os.cpu_count()} CPUs; torch {torch.__version__}; native CPU bf16: "
          f"{bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}", flush=True)
    peak = peaks(args.peak_n)
    print(f"matmul peak ({args.peak_n}^3, GFLOP/s): fp32 1t {peak[('float32', 1)]:.1f}, 2t "
          f"{peak[('float32', 2)]:.1f}; bf16 1t {peak[('bfloat16', 1)]:.1f}, 2t {peak[('bfloat16', 2)]:.1f}",
          flush=True)
    rows = {}
    for name in args.models:
        torch.set_num_threads(1)
        b = Bench(name)
        b.step()                     # fills the tasks' caches of frozen outputs (intra blocks, pair tokens) first
        flops = b.flops()
        r = {"samples": b.samples, "gflop": flops / 1e9}
        r.update(b.time({"fp32_1t": (False, 1), "bf16_1t": (True, 1), "fp32_2t": (False, 2)}, args.warmup,
                        args.steps))
        can_shard = hasattr(b.task, "shard")      # the loop refuses 2 processes without it
        del b
        torch.set_num_threads(1)
        if not args.no_ddp and can_shard:
            r["ddp_2x1"] = ddp_time(name, args.warmup, args.steps)
        if args.compile:
            r["compile_s"], r["compiled_1t"] = compiled_time(name, args.steps)
        rows[name] = r
        base = r["fp32_1t"]
        frac = flops / base / 1e9 / peak[("float32", 1)]
        print(f"{MODELS[name][1]}: batch {r['samples']}, {r['gflop']:.2f} GFLOP/step (fwd+bwd)\n"
              f"  fp32 1t {base:.3f} s/step = {r['samples'] / base:7.1f} samples/s = {1 / base:5.2f} steps/s, "
              f"{flops / base / 1e9:5.1f} GFLOP/s = {100 * frac:3.0f} % of the fp32 1t peak\n"
              + "  ratios of samples/s to fp32 1t: "
              + ", ".join(f"{k.replace('_', ' ')} {base / r[k]:.2f}x"
                          for k in ("bf16_1t", "fp32_2t", "ddp_2x1", "compiled_1t") if k in r)
              + (f"; ddp 2x1 / fp32 2t {r['fp32_2t'] / r['ddp_2x1']:.2f}x" if "ddp_2x1" in r else "")
              + (f"; compiling took {r['compile_s']:.0f} s" if "compile_s" in r else ""),
              flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print("\nsummary (samples/s ratios; > 1 pays):")
    print(f"  {'model':18s} {'fp32 1t':>9s} {'bf16/fp32 1t':>12s} {'2t/1t':>6s} "
          f"{'ddp2x1/1t':>9s} {'ddp/2t':>6s} {'%peak 1t':>8s}" + (f" {'compiled/1t':>11s}" if args.compile else ""))
    for name, r in rows.items():
        base = r["fp32_1t"]
        ddp = (f"{base / r['ddp_2x1']:9.2f} {r['fp32_2t'] / r['ddp_2x1']:6.2f}" if "ddp_2x1" in r
               else f"{'-':>9s} {'-':>6s}")
        print(f"  {name:18s} {r['samples'] / base:9.1f} {base / r['bf16_1t']:12.2f} "
              f"{base / r['fp32_2t']:6.2f} {ddp} "
              f"{100 * r['gflop'] / base / peak[('float32', 1)]:8.0f}"
              + (f" {base / r['compiled_1t']:11.2f}" if "compiled_1t" in r else ""))
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
