"""Benchmark: IDC-PCL pre-training throughput against this machine's matmul peak, fp32 and bf16 autocast.

One MLM pre-training step at the paper's size (d 512, 8 heads, FFN 2048, 3 cross-modal layers + the two image
encoder layers, 2048-d features, 49 regions per image, 40 words: 141 tokens) = forward, backward and an Adam update.
FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (2 x MAC); the peak is the best of a few
2048 x 2048 x 2048 matmuls measured in the same run, so a busy machine lowers both sides. Run:
    .venv/bin/python bench/bench_train_pcl.py --batch 32
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from idckit.losses import mlm_loss
from idckit.models.pcl import PCL, PCLConfig, mask_tokens
from idckit.text.vocab import SPECIALS, Vocab


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = min(_time(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-bf16", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(80 - len(SPECIALS))])
    model = PCL(PCLConfig(vocab_size=80, feat_dim=2048), vocab).train()
    opt = torch.optim.Adam(model.parameters(), 1e-4)
    b = args.batch
    f1, f2 = torch.randn(b, 49, 2048), torch.randn(b, 49, 2048)
    ids = torch.randint(vocab.n_special, 80, (b, 40))
    ids[:, 0], ids[:, -1] = vocab.bos_id, vocab.eos_id
    inputs, labels = mask_tokens(ids, vocab, torch.Generator().manual_seed(0))

    def step(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(f1, f2, inputs, mode="pretrain")
            keep = labels != -100
            loss = mlm_loss(model.mlm_logits(out.text[keep]), labels[keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with FlopCounterMode(display=False) as counter:
        step(False)
    flops = counter.get_total_flops()
    res = {"gflop_per_step": flops / 1e9}
    print(f"IDC-PCL MLM pre-training step, paper size, batch {b}, 141 tokens, {args.threads} threads: "
          f"{flops / 1e9:.1f} GFLOP/step ({flops / b / 3e9:.2f} GFLOP forward per sample)")
    for name, bf16, dtype in (("fp32", False, torch.float32), ("bf16 autocast", True, torch.bfloat16)):
        if bf16 and args.skip_bf16:
            continue
        peak = matmul_peak(dtype)
        step(bf16)  # warm-up
        t = min(_time(lambda: step(bf16)) for _ in range(args.steps))
        achieved = flops / t / 1e9
        fp32_peak = res.get("fp32_peak", peak)
        res[f"{name}_samples_s"], res[f"{name}_gflops"] = b / t, achieved
        res.setdefault("fp32_peak", peak)
        print(f"  {name:14s} {t:6.2f} s/step  {b / t:6.1f} samples/s  {achieved:6.1f} GFLOP/s  "
              f"= {100 * achieved / peak:4.0f} % of the {name.split()[0]} matmul peak ({peak:.0f} GFLOP/s)"
              + (f", {100 * achieved / fp32_peak:4.0f} % of the fp32 peak" if bf16 else "  (target >= 60 %)"))
    return res


if __name__ == "__main__":
    main()
