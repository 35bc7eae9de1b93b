"""Benchmark: IDC-PCL pre-training throughput against this machine's matmul peak, fp32 and bf16 autocast.

One MLM pre-training step at the paper's size (d 512, 8 heads, FFN 2048, 3 cross-modal layers + the two image
encoder layers, 2048-d features, 49 regions per image, 40 words: 141 tokens) = forward, backward and an Adam update,
dropout 0.2 on. FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add). The peak
is the best n x n x n matmul (n = 2048) measured in the same run, interleaved with the timed steps, so a burst of
load from other jobs on a shared machine lowers both sides; the fraction reported is best step vs best peak.

bf16: autocast only pays on CPUs with native bf16 matmuls (AVX512-BF16 or AMX; ``torch.ops.mkldnn.
_is_mkldnn_bf16_supported()``). Elsewhere PyTorch emulates them, one to two orders of magnitude slower than fp32,
so the bf16 step then runs once on ``--bf16-batch`` (default 1) samples against a 512^3 bf16 matmul peak, to say
how slow rather than to wait minutes.

``OMP_WAIT_POLICY=PASSIVE`` is set unless the environment says otherwise: on a shared machine spinning OpenMP
threads fight the other jobs for the cores. Run:
    .venv/bin/python bench/bench_train_pcl.py --batch 32 --threads 2
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts OpenMP

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from idckit.experiments.config import model_config  # noqa: E402
from idckit.losses import mlm_loss  # noqa: E402
from idckit.models.pcl import PCL, mask_tokens  # noqa: E402
from idckit.text.vocab import SPECIALS, Vocab  # noqa: E402


def matmul_gflops(dtype: torch.dtype, n: int) -> float:
    """The better of ``a @ b`` and ``F.linear(a, b)`` (= a @ b.T, the model's op): bf16 kernels differ by layout."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b, F.linear(a, b)
    return 2 * n ** 3 / min(_time(lambda: a @ b), _time(lambda: F.linear(a, b))) / 1e9


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per precision (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16-batch", type=int, default=None,
                    help="batch of the bf16 step (default: --batch with native bf16, else 1)")
    ap.add_argument("--skip-bf16", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(80 - len(SPECIALS))])
    model = PCL(model_config("pcl-paper", vocab_size=80, feat_dim=2048, n_regions=49), vocab).train()
    opt = torch.optim.Adam(model.parameters(), 1e-4)

    def make_batch(b: int):
        f1, f2 = torch.randn(b, 49, 2048), torch.randn(b, 49, 2048)
        ids = torch.randint(vocab.n_special, 80, (b, 40))
        ids[:, 0], ids[:, -1] = vocab.bos_id, vocab.eos_id
        return (f1, f2, *mask_tokens(ids, vocab, torch.Generator().manual_seed(0)))

    def step(batch, bf16: bool):
        f1, f2, inputs, labels = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(f1, f2, inputs, mode="pretrain")
            keep = labels != -100
            loss = mlm_loss(model.mlm_logits(out.text[keep]), labels[keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    native_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    print(f"IDC-PCL MLM pre-training step, paper size, 141 tokens, {args.threads} threads "
          f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}); native bf16 matmuls: {native_bf16}")
    res: dict = {}
    plans = [("fp32", False, torch.float32, args.batch, 2048)]
    if not args.skip_bf16:
        bf16_batch = args.bf16_batch or (args.batch if native_bf16 else 1)
        plans.append(("bf16 autocast", True, torch.bfloat16, bf16_batch, 2048 if native_bf16 else 512))
    for name, bf16, dtype, b, n in plans:
        batch = make_batch(b)
        with FlopCounterMode(display=False) as counter:
            step(batch, False)               # the same FLOPs whatever the precision; doubles as warm-up
        flops = counter.get_total_flops()
        step(batch, bf16)                    # warm-up in this precision
        peak, best = 0.0, float("inf")
        for _ in range(args.steps if native_bf16 or not bf16 else 1):   # interleaved, so load bursts hit both
            peak = max(peak, matmul_gflops(dtype, n))
            best = min(best, _time(lambda: step(batch, bf16)))
        peak = max(peak, matmul_gflops(dtype, n))
        achieved = flops / best / 1e9
        key = name.split()[0]
        res[key] = {"batch": b, "gflop_per_step": flops / 1e9, "s_per_step": best, "samples_s": b / best,
                    "gflops": achieved, "peak_gflops": peak, "fraction_of_peak": achieved / peak}
        line = (f"  {name:14s} batch {b:3d}: {flops / 1e9:6.1f} GFLOP/step, {best:6.2f} s/step, {b / best:6.1f} "
                f"samples/s, {achieved:6.1f} GFLOP/s = {100 * achieved / peak:3.0f} % of the {key} {n}^3 matmul "
                f"peak ({peak:.1f} GFLOP/s)")
        if bf16:
            fp32 = res["fp32"]
            line += (f"; {100 * achieved / fp32['peak_gflops']:.0f} % of the fp32 peak, "
                     f"{fp32['s_per_step'] / fp32['batch'] / (best / b):.2f}x fp32's samples/s")
        else:
            line += "  (target >= 60 %)"
        print(line)
    return res


if __name__ == "__main__":
    main()
