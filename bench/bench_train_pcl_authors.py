"""Benchmark: IDC-PCL fine-tuning samples/s, the kit against the authors' code, same model size, batch, thread.

The authors' fine-tuning model (``clver/modules_finetune.py`` of a checkout of yaolinli/IDC, imported by path as
``idckit.authors.pcl`` does, with ``.cuda()`` made a no-op) and their training step as ``clver/finetune.py`` runs
it: ``mlm_loss, itm_loss = model(batch, compute_loss=True)``, ``(mlm_loss.sum() + itm_loss.sum()).backward()``,
Adam. Their batch: ``--batch`` (pair, caption) samples, 15 % of the words masked and labelled (-1 elsewhere),
``diff_label`` per sample. Both sides: hidden ``--hidden`` (heads hidden/32, FFN 4 x hidden), 2 cross-modal
layers and one image-encoder layer each (the cpu profile's depths), 49 regions of 1280-d features, 28 tokens, one
thread, the best of ``--steps`` after one warm-up step, interleaved so load bursts from other jobs hit both.

Kit rows (the task's own ``train_step``, ``bench_train_models.Bench``): the cpu profile's fine-tuning as configured
(pairs grouped, ``captions_per_pair`` references each, the visual side once per pair, every position a target) and
the public code's layout (``group_by_pair`` false, masked targets), at the pcl.json cpu model with the sizes above.
Authors' rows: their dropout 0.2 (their config) and 0 (the kit's cpu setting). The checkout: ``--authors PATH`` or
``IDC_AUTHORS``; without it only the kit's numbers are printed. Run:
    git clone <yaolinli/IDC> /tmp/idc_authors
    .venv/bin/python bench/bench_train_pcl_authors.py --authors /tmp/idc_authors
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts OpenMP

import torch  # noqa: E402

from bench_train_models import FEAT, REGIONS, Bench, _finetune  # noqa: E402
from idckit.experiments.config import load_config  # noqa: E402

TARGET = 3.0     # issue 40: the kit's fine-tuning at 3x the authors' samples/s


def authors_step(checkout: Path, hidden: int, batch: int, max_len: int, dropout: float):
    """(step function) of the authors' fine-tuning at this size, on a random batch of their format."""
    from idckit.authors.pcl import RECORDING_VOCAB, _load

    module = _load(checkout / "clver" / "modules_finetune.py", "idc_clver_modules_finetune")
    torch.Tensor.cuda = lambda self, *a, **k: self            # their code calls .cuda() everywhere
    torch.nn.Module.cuda = lambda self, *a, **k: self
    v = RECORDING_VOCAB
    vocab = 80
    torch.manual_seed(0)
    model = module.Model(ff_dim=4 * hidden, img_embs=FEAT, n_hidden=hidden, n_head=hidden // 32, n_block=2,
                         img_enc_block=1, vocab_size=vocab, dropout=dropout, max_len=max_len + 2,
                         CLS=v["<CLS>"]).train()
    g = torch.Generator().manual_seed(0)
    cap = torch.randint(len(v), vocab, (batch, max_len), generator=g)
    cap[:, 0], cap[:, 11], cap[:, 12:] = v["<BOS>"], v["<EOS>"], v["<PAD>"]
    masked = (torch.rand(batch, max_len, generator=g) < 0.15) & (cap != v["<PAD>"])
    masked[:, 0] = False
    masked[:, 5] = True                                        # at least one target per sample
    label = torch.where(masked, cap, torch.full_like(cap, -1))
    data = {"img1": torch.randn(batch, REGIONS, FEAT, generator=g), "img2": torch.randn(batch, REGIONS, FEAT,
                                                                                         generator=g),
            "cap": cap.masked_fill(masked, v["<MASK>"]), "cap_label": label,
            "diff_label": torch.randint(0, 2, (batch,), generator=g)}
    optim = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        mlm, itm = model(data, compute_loss=True)
        loss = mlm.sum() + itm.sum()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", type=Path, default=os.environ.get("IDC_AUTHORS"),
                    help="a checkout of yaolinli/IDC (or IDC_AUTHORS)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config("pcl", "cpu")
    size = {"d_model": args.hidden, "n_heads": args.hidden // 32, "d_ff": 4 * args.hidden}
    steps = {
        "kit, cpu profile's fine-tuning (grouped, every position)":
            Bench("pcl_finetune", task=_finetune("pcl", size, batch_size=args.batch)).step,
        "kit, the public layout (ungrouped, masked targets)":
            Bench("pcl_finetune", task=_finetune("pcl", size, batch_size=args.batch, group_by_pair=False,
                                                 targets="masked")).step,
    }
    if args.authors is None:
        print("no checkout of the authors' code given (--authors PATH or IDC_AUTHORS): the kit's numbers only")
    elif not (args.authors / "clver" / "modules_finetune.py").is_file():
        raise SystemExit(f"{args.authors} has no clver/modules_finetune.py: pass a checkout of yaolinli/IDC")
    else:
        for dropout in (0.2, 0.0):
            steps[f"authors' code, dropout {dropout:g}"] = authors_step(args.authors, args.hidden, args.batch,
                                                                        cfg["max_len"], dropout)
    best = {k: float("inf") for k in steps}
    for fn in steps.values():
        fn()                                                   # warm-up
    for _ in range(args.steps):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    print(f"IDC-PCL fine-tuning step (forward, backward, Adam), hidden {args.hidden}, {args.hidden // 32} heads, "
          f"FFN {4 * args.hidden}, batch {args.batch} samples, {REGIONS} x {FEAT} features, {cfg['max_len']} "
          f"tokens, 1 thread, best of {args.steps}; load {os.getloadavg()[0]:.2f}")
    for k, s in best.items():
        print(f"  {k:58s} {s:6.3f} s/step {args.batch / s:7.1f} samples/s")
    authors = [k for k in best if k.startswith("authors")]
    if authors:
        ref = best[authors[0]]
        for k in best:
            if k.startswith("kit"):
                print(f"  {k}: {ref / best[k]:.2f}x the authors' samples/s (dropout 0.2; target {TARGET:g}x), "
                      f"{best[authors[1]] / best[k]:.2f}x at their dropout 0")
    return best


if __name__ == "__main__":
    main()
