"""``make gpu-check`` / ``idckit doctor --gpu-check --out DIR`` / ``python -m idckit.cli.gpu_check``: does the kit work
on this GPU, and how fast are the papers' steps here? Minutes, no dataset, no weight download, no Java.

What it runs (each a row of the printed table and a key of ``OUT/gpu_check.json``):

- ``device``: the GPU, torch and CUDA versions, bf16 support;
- ``sdpa``: which scaled-dot-product-attention kernel (flash / efficient / cudnn / math) the kit's attentions
  actually run at the paper sizes, training and decoding, read from the profiler's op names;
- ``equality``: one fp32 forward of each model (IDC-PCL pre-training and fine-tuning, DUDA, the CLIP4IDC pair
  encoder and captioner) on the CPU and on the GPU from the same weights and inputs (TF32 off), within
  :data:`RTOL` of the largest output;
- ``decoding``: cached greedy decoding equals the naive (full re-run) decoding on the GPU, token for token;
- ``checkpoint``: weights saved from the GPU load on the CPU, and back, giving identical outputs;
- ``resume``: a run killed mid-way and resumed by the kit's loop ends bit-identical to an uninterrupted one
  (deterministic algorithms on, as a GPU needs for bit-equality; ``determinism`` says whether two uninterrupted
  runs agree at all);
- ``throughput``: steps at the paper sizes under bf16 autocast (IDC-PCL pre-training per task and fine-tuning,
  CLIP4IDC adaptation and captioning with a randomly initialised ViT-B/32, greedy decoding), each with its FLOPs
  (counted by torch's FlopCounterMode), the TFLOP/s reached and its fraction of a bf16 matmul's TFLOP/s measured
  in the same run, and the hours of the papers' full schedules at that speed (compute only: no data loading or
  evaluation);
- ``torchrun``: ``torchrun --nproc_per_node=1`` (a process group on NCCL, gloo on the CPU) trains a small run for a
  few steps, is stopped, and a second launch resumes it; the result must equal the in-process run bit for bit. The
  workers run as many CPU threads as the in-process run did: a CPU matmul's sums split by thread, so a different
  count changes the last bits of the weights however correct the resume is.

``--device cpu`` is the dry mode: the same code paths at the smoke profile's sizes (the "GPU" side is the CPU too,
so equality is trivially true there; the numbers are not a GPU's). tests/test_gpu_check.py runs it.

Imports: torch, torchvision, open_clip, numpy, pillow and tqdm, and the kit's models, tasks and loop; nothing of
evaluation, notebooks or Java, so ``python -m idckit.cli.gpu_check`` runs from a clone on a box with its own torch.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

# cuBLAS reads this when its first handle is made: bit-reproducible matmuls for the resume check
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from idckit import device as devices  # noqa: E402
from idckit import fileio  # noqa: E402
from idckit.experiments.config import load_config, model_config, train_config  # noqa: E402
from idckit.losses import mlm_loss, symmetric_infonce  # noqa: E402
from idckit.models.clip4idc import CLIP4IDCCaptioner, CLIP4IDCRetrieval  # noqa: E402
from idckit.models.clip_loader import load_clip  # noqa: E402
from idckit.models.decoding import greedy_decode, naive_greedy_decode  # noqa: E402
from idckit.models.duda import DUDA  # noqa: E402
from idckit.tasks.pcl import FinetuneTask, PretrainTask  # noqa: E402
from idckit.text.pcl_inputs import PCLData, SplitData  # noqa: E402
from idckit.text.vocab import SPECIALS, Vocab  # noqa: E402
from idckit.train.loop import fit  # noqa: E402

RTOL = 1e-4          # CPU vs GPU at fp32: the largest |difference| over the largest |output|
BUDGET_S = 8 * 60    # the whole check on one GPU


# -- sizes and builders (through the config factory, so the models' own switches stay data) ----------------------
def _profile(dry: bool) -> str:
    return "smoke" if dry else "paper"


def _kwargs(fn: Callable, section: dict, **given) -> dict:
    """The keys of ``section`` that ``fn`` takes, plus ``given``: a task's constructor picks its settings from its
    config section, whatever switches the section grows."""
    names = inspect.signature(fn).parameters
    return {**{k: v for k, v in section.items() if k in names and k not in given}, **given}


def _vocab(size: int):
    """The kit's specials, then words w0, w1, ... up to ``size`` entries: the vocabulary of random captions."""
    return Vocab(list(SPECIALS) + [f"w{i}" for i in range(size - len(SPECIALS))])


def pcl_data(n_pairs: int, max_len: int, feat_dim: int, n_regions: int, vocab_size: int = 80, seed: int = 0):
    """Random IDC-PCL data of the paper's shapes (CLEVR-Change: ~80 words, captions of ~11 words, 7x7 grids):
    what the steps and models need, without a dataset."""
    g = torch.Generator().manual_seed(seed)
    vocab = _vocab(vocab_size)
    words = torch.randint(vocab.n_special, vocab_size, (n_pairs, max_len), generator=g)
    length = min(12, max_len)
    words[:, 0], words[:, length:] = vocab.bos_id, vocab.pad_id
    words[:, length - 1] = vocab.eos_id
    train = SplitData(pair_ids=[str(i) for i in range(n_pairs)], types=["color"] * n_pairs,
                      before=torch.arange(n_pairs), after=torch.arange(n_pairs, 2 * n_pairs),
                      is_change=torch.arange(n_pairs) % 2 == 0, references={}, sample_pair=torch.arange(n_pairs),
                      sample_ids=words)
    data = PCLData(vocab=vocab, features=torch.randn(2 * n_pairs, n_regions, feat_dim, generator=g).half(),
                   splits={"train": train}, max_len=max_len)
    data.negatives = {p: [" ".join(f"w{(i + k) % (vocab_size - vocab.n_special)}" for i in range(10))
                          for k in range(6)] for p in train.pair_ids}
    return data


def feat_dim(dry: bool) -> int:
    return 64 if dry else 2048       # the paper's ResNet-101 grid; a small grid for the dry mode


def pcl_tasks(dry: bool, n_pairs: int, batch: int | None = None, ratios: dict | None = None):
    """(pre-training task, fine-tuning task) at the profile's sizes on random data."""
    cfg = load_config("pcl", _profile(dry))
    data = pcl_data(n_pairs, cfg["max_len"], feat_dim(dry), 49)
    pre, ft = cfg["pretrain"], cfg["finetune"]
    pretrain = PretrainTask(**_kwargs(PretrainTask, pre, data=data, model=cfg["model"],
                                      batch_size=batch or pre["batch_size"], ratios=ratios or pre["ratios"]))
    finetune = FinetuneTask(**_kwargs(FinetuneTask, ft, data=data, model=cfg["model"],
                                      batch_size=batch or ft["batch_size"]))
    return pretrain, finetune, cfg


def duda_model(dry: bool, vocab_size: int = 80):
    vocab = _vocab(vocab_size)
    return DUDA(model_config(f"duda-{_profile(dry)}", vocab_size=vocab_size, feat_dim=feat_dim(dry),
                             n_regions=49), vocab)


def clip_model(dry: bool):
    """A randomly initialised CLIP of the profile's architecture (ViT-B/32 at paper; the stand-in when dry)."""
    name = load_config("clip4idc_adapt", _profile(dry))["clip"]["model"]
    return load_clip(name, None)[0], name


def clip4idc_models(dry: bool):
    clip, name = clip_model(dry)
    size = clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    retrieval = CLIP4IDCRetrieval(clip)
    captioner = CLIP4IDCCaptioner(clip_model(dry)[0], model_config(f"clip4idc-{_profile(dry)}"))
    return retrieval, captioner, int(size), name


# -- helpers --------------------------------------------------------------------------------------------------------
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@contextlib.contextmanager
def _fp32_exact():
    """TF32 off while comparing fp32 results across devices."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _to(obj, dev):
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, dev) for o in obj)
    return obj


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| over max |a|, finite entries only; an entry infinite on either side must be equal on both
    (IDC-PCL's paper-profile logits are -inf at [IMG1]/[IMG2], no words of its vocabulary), else inf."""
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool((finite | (a == b)).all()):
        return float("inf")
    if not bool(finite.any()):
        return 0.0
    return float((a - b)[finite].abs().max() / a[finite].abs().max().clamp_min(1e-12))


def _state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


# -- the forwards compared across devices -------------------------------------------------------------------------
def forwards(dry: bool) -> dict[str, tuple[torch.nn.Module, Callable[[torch.nn.Module, tuple], torch.Tensor], tuple]]:
    """name -> (model on the CPU in eval mode, forward(model, inputs) -> one tensor, CPU inputs)."""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    pretrain, _, cfg = pcl_tasks(dry, n_pairs=8, batch=4)
    pcl = pretrain.build_model().eval()
    vocab = pretrain.data.vocab
    b, n, fd, length = 2, 49, feat_dim(dry), cfg["max_len"]
    f1, f2 = torch.randn(b, n, fd, generator=g), torch.randn(b, n, fd, generator=g)
    ids = torch.randint(vocab.n_special, len(vocab), (b, length), generator=g)
    ids[:, 0], ids[:, 10:] = vocab.bos_id, vocab.pad_id

    def pcl_pre(m, x):
        out = m(*x, mode="pretrain")
        return torch.cat([m.mlm_logits(out.text).flatten(), m.mvcl_regress(out.visual).flatten()])

    def pcl_ft(m, x):
        out = m(*x, mode="finetune")
        parts = [m.mlm_logits(out.text).flatten()]
        if m.cfg.distractor_head:
            parts.append(m.judge_logits(out).flatten())
        return torch.cat(parts)

    duda = duda_model(dry).eval()
    torch.manual_seed(0)
    retrieval, captioner, size, _ = clip4idc_models(dry)
    images = (torch.randn(b, 3, size, size, generator=g), torch.randn(b, 3, size, size, generator=g))
    text = torch.randint(1, 49000, (b, 32), generator=g)
    cap_ids = torch.randint(1, 49000, (b, 20), generator=g)
    cap_ids[:, 0] = captioner.bos_id
    return {
        "IDC-PCL pre-training": (pcl, pcl_pre, (f1, f2, ids)),
        "IDC-PCL fine-tuning": (pcl, pcl_ft, (f1, f2, ids)),
        "DUDA": (duda, lambda m, x: m(*x).logits, (f1, f2, ids[:, :24])),
        "CLIP4IDC pair encoder": (retrieval.eval(), lambda m, x: m(*x), (*images, text)),
        "CLIP4IDC captioner": (captioner.eval(), lambda m, x: m(*x), (*images, cap_ids)),
    }


def check_equality(dev: torch.device, dry: bool, fw: dict) -> dict:
    out = {}
    with _fp32_exact(), torch.no_grad():
        for name, (model, fn, x) in fw.items():
            ref = fn(model, x)
            other = copy.deepcopy(model).to(dev)
            got = fn(other, _to(x, dev))
            diff = _rel_diff(ref, got)
            out[name] = {"rel_max_diff": diff, "equal": bool(diff <= RTOL),
                         "numel": ref.numel()}
            del other
    return out


def check_decoding(dev: torch.device, dry: bool, fw: dict) -> dict:
    out = {}
    with _fp32_exact():
        # CLIP4IDC decodes from its pair tokens, computed once (as its evaluation does for a frozen encoder): the
        # naive rule would otherwise re-run the ViT at every token
        for name, key, visual in (("IDC-PCL", "IDC-PCL fine-tuning", lambda m, x: (x[0], x[1])),
                                  ("DUDA", "DUDA", lambda m, x: (x[0], x[1])),
                                  ("CLIP4IDC", "CLIP4IDC captioner", lambda m, x: m.pair_encoder(x[0], x[1])[0])):
            model, _, x = fw[key]
            m = copy.deepcopy(model).to(dev).eval()
            with torch.no_grad():
                v = visual(m, _to(x, dev))
            max_len = 12 if dry else 20
            cached, naive = greedy_decode(m, v, max_len), naive_greedy_decode(m, v, max_len)
            out[name] = {"equal": bool(torch.equal(cached, naive)), "tokens": int(cached.numel())}
            if not out[name]["equal"] and cached.shape == naive.shape:   # where, for a diagnosis
                out[name]["first_mismatch"] = [int(i) for i in (cached != naive).nonzero()[0]]
            del m
    return out


def check_checkpoint(dev: torch.device, fw: dict, tmp: Path) -> dict:
    """Weights saved from ``dev`` load on the CPU (map_location) and back, with identical outputs each way."""
    model, fn, x = fw["IDC-PCL fine-tuning"]
    with torch.no_grad():
        on_dev = copy.deepcopy(model).to(dev)
        path = tmp / "from_device.pt"
        torch.save(on_dev.state_dict(), path)       # as a GPU run would write it, device tensors and all
        cpu = copy.deepcopy(model)
        cpu.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        to_cpu = torch.equal(fn(cpu, x), fn(model, x))
        torch.save(cpu.state_dict(), tmp / "from_cpu.pt")
        back = copy.deepcopy(model).to(dev)
        back.load_state_dict(torch.load(tmp / "from_cpu.pt", map_location=dev, weights_only=True))
        xd = _to(x, dev)
        to_dev = torch.equal(fn(back, xd), fn(on_dev, xd))
    return {"device_to_cpu": bool(to_cpu), "cpu_to_device": bool(to_dev)}


# -- resume through the kit's loop ----------------------------------------------------------------------------------
class _Killed(Exception):
    pass


class Crashing:
    """A task that stops (as a kill would) before step ``at``; everything else is the wrapped task's. No
    validation (``selection_metric`` None): scoring needs the evaluation stack, which this check does not load."""

    selection_metric = None

    def __init__(self, task, at: int | None = None):
        self.task, self.at = task, at

    def __getattr__(self, name):
        return getattr(self.task, name)

    def train_step(self, model, batch, step):
        if self.at is not None and step == self.at:
            raise _Killed(step)
        return self.task.train_step(model, batch, step)


RESUME_STEPS, KILL_AT = 6, 3


def resume_task():
    """The small pre-training run the resume and torchrun checks train: every pre-training task, dropout on."""
    pretrain, _, _ = pcl_tasks(True, n_pairs=48, batch=8, ratios={"mlm": 2, "mvcl": 1, "fda": 1})
    return pretrain


def resume_config():
    return train_config({"max_steps": RESUME_STEPS, "lr": 1e-3, "schedule": "warmup_cosine", "warmup_steps": 2,
                         "checkpoint_every": KILL_AT, "eval_every": 0, "log_every": 1, "seed": 0})


def train_run(dev: torch.device, run_dir: Path, kill_at: int | None = None) -> dict | None:
    """Train the resume run in ``run_dir`` (resuming what is there); the final weights, or None when killed."""
    try:
        res = fit(Crashing(resume_task(), kill_at), resume_config(), run_dir, progress=False, device=dev)
    except _Killed:
        return None
    return {k: v.detach().cpu() for k, v in res.model.state_dict().items()}


@contextlib.contextmanager
def deterministic():
    """Deterministic kernels, and the math attention (the fused kernels' backward may add in any order on a GPU):
    what bit-equality between two runs needs, so that the resume checks test the resume and nothing else."""
    saved = torch.backends.cudnn.deterministic
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = saved


def check_resume(dev: torch.device, tmp: Path) -> tuple[dict, dict]:
    threads = torch.get_num_threads()          # the torchrun workers are given the same: like with like
    with deterministic():
        whole = train_run(dev, tmp / "whole")
        again = train_run(dev, tmp / "again")
        assert train_run(dev, tmp / "killed", KILL_AT) is None
        resumed = train_run(dev, tmp / "killed")
    return ({"steps": RESUME_STEPS, "killed_at": KILL_AT, "bit_identical": _state_equal(whole, resumed),
             "determinism": _state_equal(whole, again), "threads": threads}, whole)


# -- torchrun ------------------------------------------------------------------------------------------------------
def worker(run_dir: Path, device: str, kill_at: int | None, threads: int | None = None) -> int:
    """One torchrun process: join a process group on NCCL (CUDA) or gloo, check an all-reduce, train the resume run
    on ``threads`` CPU threads (the in-process run's count)."""
    if threads is not None:
        torch.set_num_threads(threads)

    dev = devices.resolve(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index if dev.index is not None else int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    t = torch.ones(3, device=dev)
    dist.all_reduce(t)
    info = {"backend": backend, "world": dist.get_world_size(), "all_reduce": t.tolist(),
            "threads": torch.get_num_threads()}
    with deterministic():
        state = train_run(dev, run_dir, kill_at)
    if state is not None:
        torch.save(state, run_dir / "final_weights.pt")
    info["killed"] = state is None
    (run_dir / f"torchrun_{'killed' if state is None else 'resumed'}.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    return 0


def check_torchrun(dev: torch.device, tmp: Path, whole: dict, threads: int) -> dict:
    """Kill and resume the resume run under torchrun on ``threads`` CPU threads (the in-process run's count); its
    final weights must equal the in-process run's bit for bit."""
    run_dir = tmp / "torchrun"
    root = Path(__file__).resolve().parents[2]     # the folder holding the idckit package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(threads)}
    out: dict[str, Any] = {}
    for label, extra in (("killed", ["--kill-at", str(KILL_AT)]), ("resumed", [])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
               "idckit.cli.gpu_check", "--worker", str(run_dir), "--device", str(dev), "--threads", str(threads), *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        out[f"{label}_seconds"] = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            out.update(ok=False, error=f"{label} launch exited {proc.returncode}: {(proc.stderr or '')[-1500:]}")
            return out
        out[label] = json.loads((run_dir / f"torchrun_{label}.json").read_text())
    final = torch.load(run_dir / "final_weights.pt", map_location="cpu", weights_only=True)
    out["threads"] = threads                   # each launch's own count is in out["killed"] / out["resumed"]
    out["bit_identical_to_in_process"] = _state_equal(whole, final)
    out["ok"] = bool(out["bit_identical_to_in_process"] and out["killed"]["killed"]
                     and out["resumed"]["all_reduce"] == [1.0, 1.0, 1.0]
                     and out["killed"].get("threads") == out["resumed"].get("threads") == threads)
    return out


# -- which SDPA kernel runs --------------------------------------------------------------------------------------
SDPA_OPS = (("flash", "flash_attention"), ("efficient", "efficient_attention"), ("cudnn", "cudnn_attention"),
            ("math", "attention_math"))


def sdpa_backends(fn: Callable[[], Any]) -> dict[str, int]:
    """Backend -> calls of the SDPA kernels while ``fn`` runs (from the op names torch's profiler records)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts: dict[str, int] = {}
    for ev in prof.key_averages():
        for backend, needle in SDPA_OPS:
            if needle in ev.key and ev.key.startswith("aten::_"):
                counts[backend] = counts.get(backend, 0) + ev.count
    return counts


# -- throughput -----------------------------------------------------------------------------------------------------
def matmul_peak(dev: torch.device, dry: bool) -> float:
    """TFLOP/s of a square bf16 matmul (8192 on a GPU): the ceiling the steps are compared with."""
    n = 256 if dry else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    reps = 3 if dry else 100
    for _ in range(2):
        a @ b
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(dev)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def _timed(dev: torch.device, step: Callable[[], Any], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        step()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    _sync(dev)
    return (time.perf_counter() - t0) / reps


def _flops(step: Callable[[], Any]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def _train_step(model, loss_fn, dev):
    """A whole training step: forward under bf16 autocast, backward, an AdamW update of the trainable weights."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        with devices.autocast(dev, True):
            loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def throughput(dev: torch.device, dry: bool, peak: float) -> dict:
    """Per step kind: samples, seconds, FLOPs, TFLOP/s, fraction of ``peak``; plus the full schedules' hours."""
    warm, reps = (1, 1) if dry else (3, 10)
    rows: dict[str, dict] = {}

    def record(name, samples, step):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        flops = _flops(step)      # also the first warm-up
        seconds = _timed(dev, step, warm, reps)
        rows[name] = {"samples": samples, "step_seconds": seconds, "samples_per_s": samples / seconds,
                      "gflop_per_step": flops / 1e9, "tflops": flops / seconds / 1e12,
                      "fraction_of_peak": flops / seconds / 1e12 / peak}
        if dev.type == "cuda":
            rows[name]["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)

    cfg = load_config("pcl", _profile(dry))
    # IDC-PCL: the kit's own tasks' steps (masking, negatives, losses), one step kind at a time
    for kind in ("mlm", "mvcl", "fda"):
        batch_size = cfg["pretrain"]["batch_size"]
        task, _, _ = pcl_tasks(dry, n_pairs=max(batch_size, 8), ratios={kind: 1})
        torch.manual_seed(0)
        model = task.build_model().to(dev).train()
        batch = task.load(next(iter(task.batches(0, torch.Generator().manual_seed(0))))) \
            if hasattr(task, "load") else next(iter(task.batches(0, torch.Generator().manual_seed(0))))
        step = _train_step(model, lambda: task.train_step(model, batch, 0)[0], dev)
        record(f"IDC-PCL pre-training {kind.upper()}", len(batch["pairs"]), step)
        del model
    _, ft, _ = pcl_tasks(dry, n_pairs=max(cfg["finetune"]["batch_size"], 8))
    torch.manual_seed(0)
    model = ft.build_model().to(dev).train()
    gen = torch.Generator().manual_seed(0)
    batch = next(iter(ft.batches(0, gen)))
    batch = ft.load(batch) if hasattr(ft, "load") else batch
    record("IDC-PCL fine-tuning", cfg["finetune"]["batch_size"],
           _train_step(model, lambda: ft.train_step(model, batch, 0)[0], dev))
    # decoding: greedy, the papers' test-time rule, a validation batch at a time
    eval_b = cfg["finetune"]["eval_batch_size"]
    f = torch.randn(eval_b, 49, feat_dim(dry), device=dev)
    model.eval()
    def decode_pcl():
        with devices.autocast(dev, True):
            greedy_decode(model, (f, f.flip(0)), cfg["max_len"])
    record("IDC-PCL greedy decoding", eval_b, decode_pcl)
    del model

    # CLIP4IDC: the retrieval (adaptation) and captioning steps at the paper's batches
    adapt, cap = load_config("clip4idc_adapt", _profile(dry)), load_config("clip4idc_caption", _profile(dry))
    torch.manual_seed(0)
    retrieval, captioner, size, clip_name = clip4idc_models(dry)
    retrieval.to(dev).train()
    ab = adapt["batch_size"]
    imgs = torch.randn(ab, 3, size, size, device=dev), torch.randn(ab, 3, size, size, device=dev)
    tokens = torch.randint(1, 49000, (ab, 32), device=dev)
    record(f"CLIP4IDC adaptation ({clip_name}, random init)", ab,
           _train_step(retrieval, lambda: symmetric_infonce(retrieval(*imgs, tokens)), dev))
    del retrieval, imgs
    captioner.to(dev).train()
    cb = 2 * cap["batch_size"]            # a scene gives a (default, semantic) and a (default, nonsemantic) pass
    imgs = torch.randn(cb, 3, size, size, device=dev), torch.randn(cb, 3, size, size, device=dev)
    ids = torch.randint(1, 49000, (cb, cap["max_len"]), device=dev)
    ids[:, 0] = captioner.bos_id
    record(f"CLIP4IDC captioning ({clip_name}, random init)", cb,
           _train_step(captioner, lambda: mlm_loss(*captioner.teacher_forcing(captioner.encode(*imgs), ids)), dev))
    captioner.eval()
    db = min(cap["eval_batch_size"], cb)

    def decode_clip():
        with devices.autocast(dev, True):
            greedy_decode(captioner, (imgs[0][:db], imgs[1][:db]), cap["max_len"])
    record("CLIP4IDC greedy decoding", db, decode_clip)
    del captioner, imgs

    # the papers' schedules at these speeds (compute only)
    paper_pcl, paper_cap = load_config("pcl", "paper"), load_config("clip4idc_caption", "paper")
    pool = paper_pcl["pretrain"]["ratios"]
    pre_step = sum(pool[k] * rows[f"IDC-PCL pre-training {k.upper()}"]["step_seconds"] for k in pool) / sum(pool.values())
    scenes = 33830                        # CLEVR-Change train before-images (67,660 train pairs / 2)
    cap_steps = paper_cap["train"]["epochs"] * (scenes // paper_cap["batch_size"])
    adapt_name = next(k for k in rows if k.startswith("CLIP4IDC adaptation"))
    cap_name = next(k for k in rows if k.startswith("CLIP4IDC captioning"))
    schedules = {
        "IDC-PCL pre-training": {"steps": paper_pcl["pretrain"]["train"]["max_steps"], "step_seconds": pre_step},
        "IDC-PCL fine-tuning (upper bound; early stopping ends it sooner)": {
            "steps": paper_pcl["finetune"]["train"]["max_steps"],
            "step_seconds": rows["IDC-PCL fine-tuning"]["step_seconds"]},
        "CLIP4IDC captioning (upper bound: 50 epochs of 33,830 scenes)": {
            "steps": cap_steps, "step_seconds": rows[cap_name]["step_seconds"]},
        "CLIP4IDC adaptation, per 100,000 caption samples": {
            "steps": 100_000 // load_config("clip4idc_adapt", "paper")["batch_size"],
            "step_seconds": rows[adapt_name]["step_seconds"]},
    }
    for s in schedules.values():
        s["hours"] = s["steps"] * s["step_seconds"] / 3600
    return {"steps": rows, "schedules": schedules,
            "note": "schedules: measured step time x the papers' steps; compute only (no data loading or evaluation)"
                    + ("; DRY MODE: smoke sizes on the CPU, not a GPU's numbers" if dry else "")}


# -- the whole check ----------------------------------------------------------------------------------------------
def device_info(dev: torch.device) -> dict:
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in torch.__version__.split(".")[:2])
    info = {"device": str(dev), "torch": torch.__version__, "torch_supported": (major, minor) >= (2, 4),
            "cuda_build": torch.version.cuda, "python": platform.python_version(),
            "bf16": bool(devices.bf16_supported(dev))}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gb=round(p.total_memory / 2**30, 1))
    else:
        info.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def sdpa_check(dev: torch.device, dry: bool) -> dict:
    """The kernels the kit's attentions run at the profile's sizes under bf16 autocast: a training step (dropout
    on) and a decoding pass (eval) of IDC-PCL, and a CLIP4IDC captioning forward."""
    pre, _, _ = pcl_tasks(dry, n_pairs=16, batch=8)
    torch.manual_seed(0)
    model = pre.build_model().to(dev)
    batch = next(iter(pre.batches(0, torch.Generator().manual_seed(0))))
    batch = pre.load(batch) if hasattr(pre, "load") else batch

    def train():
        model.train()
        with devices.autocast(dev, True):
            pre.train_step(model, batch, 0)[0].backward()

    f = torch.randn(8, 49, feat_dim(dry), device=dev)

    def decode():
        with devices.autocast(dev, True):
            greedy_decode(model, (f, f), 6)

    out = {"IDC-PCL training step": sdpa_backends(train), "IDC-PCL decoding": sdpa_backends(decode)}
    del model
    _, captioner, size, _ = clip4idc_models(dry)
    captioner.to(dev).eval()
    imgs = torch.randn(2, 3, size, size, device=dev)
    ids = torch.full((2, 8), captioner.bos_id, device=dev)

    def caption():
        with torch.no_grad(), devices.autocast(dev, True):
            captioner(imgs, imgs, ids)
    out["CLIP4IDC captioner forward"] = sdpa_backends(caption)
    return out


def _recognise_out(folder: Path) -> dict | None:
    """An earlier gpu-check's folder, written before the write policy's marker: its gpu_check.json alone."""
    try:
        doc = json.loads((folder / "gpu_check.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or "budget_seconds" not in doc:
        return None
    return {"kind": "gpu-check", "entries": ["gpu_check.json"]}


def run(device: str = "auto", out: str | Path = "gpu_check", *, progress: bool = True) -> dict:
    """Run every check on ``device`` (``cpu``: the dry mode) and write ``OUT/gpu_check.json``."""
    dev = devices.resolve(device)
    dry = dev.type != "cuda"
    devices.prepare(dev)
    # the write policy before any work: a folder holding anything but an earlier gpu_check.json is refused
    out = fileio.claim_dir(out, "gpu-check", recognise=_recognise_out, will_write=["gpu_check.json"]).path
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"dry": dry, "profile": _profile(dry), "rtol": RTOL, "budget_seconds": BUDGET_S}
    timings: dict[str, float] = {}
    def section(name: str, fn: Callable[[], Any]):
        if progress:
            print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
        s = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as err:   # noqa: BLE001 - a failing part is a result; the other parts still run
            result[name] = {"error": f"{type(err).__name__}: {err}"}
        timings[name] = round(time.perf_counter() - s, 1)
        # after every part, so a check stopped by a time limit leaves what it measured
        fileio.write_json(out / "gpu_check.json", {**result, "seconds": timings, "finished": False}, indent=1)

    section("device", lambda: device_info(dev))
    section("sdpa", lambda: sdpa_check(dev, dry))
    fw: dict = {}
    section("models", lambda: {name: sum(p.numel() for p in m.parameters())
                               for name, (m, _, _) in fw.update(forwards(dry)) or fw.items()})
    section("equality", lambda: check_equality(dev, dry, fw))
    section("decoding", lambda: check_decoding(dev, dry, fw))
    with tempfile.TemporaryDirectory(prefix="idckit-gpu-check-") as tmp:
        tmp = Path(tmp)
        section("checkpoint", lambda: check_checkpoint(dev, fw, tmp))
        whole: dict = {}

        def resume():
            res, w = check_resume(dev, tmp)
            whole.update(w)
            return res
        section("resume", resume)
        section("torchrun", lambda: check_torchrun(dev, tmp, whole, result["resume"]["threads"]) if whole
                else {"ok": False, "error": "no resume run"})
    del fw
    section("matmul_peak_tflops", lambda: matmul_peak(dev, dry))
    peak = result["matmul_peak_tflops"] if isinstance(result["matmul_peak_tflops"], float) else float("nan")
    section("throughput", lambda: throughput(dev, dry, peak))
    result["seconds"] = {**timings, "total": round(time.perf_counter() - t0, 1)}
    result["finished"] = True
    result["ok"] = passed(result)
    fileio.write_json(out / "gpu_check.json", result, indent=1)
    return result


def passed(r: dict) -> bool:
    """Every equality, decoding, checkpoint, resume and torchrun check true, and no section failed."""
    try:
        return (all(v["equal"] for v in r["equality"].values()) and all(v["equal"] for v in r["decoding"].values())
                and all(r["checkpoint"].values()) and r["resume"]["bit_identical"] and r["torchrun"]["ok"]
                and not any(isinstance(v, dict) and "error" in v for v in r.values()))
    except (KeyError, TypeError, AttributeError):
        return False


def table(r: dict) -> str:
    """The printed summary of a result of :func:`run`."""
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    lines = []
    d = r.get("device", {})
    lines.append(f"device      {d.get('name', '?')} ({d.get('device')}), torch {d.get('torch')}, CUDA "
                 f"{d.get('cuda_build')}, bf16 {yes(d.get('bf16'))}" + ("   [DRY MODE: CPU, smoke sizes]"
                                                                       if r.get("dry") else ""))
    if d.get("torch_supported") is False:
        lines.append("            torch older than 2.4: the kit is not meant for it (failures below may be that)")
    models = r.get("models") or {}
    if "error" in models:
        lines.append(f"models      {models['error']}")
    else:
        lines.append("models      " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in models.items()))
    for name, counts in (r.get("sdpa") or {}).items():
        lines.append(f"sdpa        {name}: " + (", ".join(f"{k} x{v}" for k, v in counts.items()) or "none")
                     if isinstance(counts, dict) else f"sdpa        {name}: {counts}")
    for key, label in (("equality", "cpu=device"), ("decoding", "cached=naive")):
        for name, v in (r.get(key) or {}).items():
            if isinstance(v, dict) and "equal" in v:
                extra = f" (rel diff {v['rel_max_diff']:.1e})" if "rel_max_diff" in v else ""
                lines.append(f"{label:12s}{name}: {yes(v['equal'])}{extra}")
            else:
                lines.append(f"{label:12s}{name}: {v}")
    for key in ("checkpoint", "resume", "torchrun"):
        v = r.get(key) or {}
        shown = {k: x for k, x in v.items() if not isinstance(x, dict)}
        lines.append(f"{key:12s}" + ", ".join(f"{k} {x}" for k, x in shown.items()))
    peak = r.get("matmul_peak_tflops")
    lines.append(f"peak        bf16 matmul {peak:.3g} TFLOP/s" if isinstance(peak, float) else f"peak        {peak}")
    tp = r.get("throughput") or {}
    if "steps" in tp:
        lines.append(f"{'step (bf16 autocast)':60s} {'samples/s':>10s} {'GFLOP/step':>11s} {'TFLOP/s':>8s} "
                     f"{'of peak':>8s}")
        for name, s in tp["steps"].items():
            lines.append(f"{name:60s} {s['samples_per_s']:10.1f} {s['gflop_per_step']:11.1f} {s['tflops']:8.2f} "
                         f"{100 * s['fraction_of_peak']:7.1f}%")
        for name, s in tp["schedules"].items():
            lines.append(f"schedule    {name}: {s['steps']:,} steps x {s['step_seconds']:.3f} s = {s['hours']:.2f} h")
        lines.append(f"            ({tp['note']})")
    elif tp:
        lines.append(f"throughput  {tp}")
    lines.append(f"total       {r.get('seconds', {}).get('total')} s (budget {r.get('budget_seconds')} s); all checks "
                 f"passed: {yes(passed(r))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idckit.cli.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="cuda, cuda:N, or cpu for the dry mode (default: auto)")
    ap.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.json")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kill-at", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker, args.device, args.kill_at, args.threads)
    r = run(args.device, args.out)
    print(table(r))
    print(f"written: {args.out / 'gpu_check.json'}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
