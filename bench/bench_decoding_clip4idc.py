"""Benchmark: CLIP4IDC greedy captioning with idckit's cache vs the public code's way, at the same weights.

Three decoders, one model (random weights of the chosen shapes; decoding cost does not depend on the values):

* cached  -- ``idckit.models.decoding.greedy_decode``: the pair encoder and the 3-layer caption encoder run once,
  cross-attention K/V once per decoder layer, self-attention K/V cached, one new position per step.
* public  -- what ``main_task_caption.greedy_decode`` does: CLIP's ViT once, then at every one of the ``max_len``
  steps the caption encoder and the decoder over the whole prefix (LM head on every position), no cache, no early
  stop. (It also runs CLIP's text encoder once on the batch; not counted here.)
* naive   -- ``idckit.models.decoding.naive_greedy_decode``: ``full_logits`` every step, i.e. the ViT too.

Asserts identical tokens, then prints FLOPs per pair (FlopCounterMode; fp32 FLOPs = 2 x MAC, with the MHA fast path
off and a formula for CPU SDPA so attention is counted), pairs/s and speedups. Run:
    .venv/bin/python bench/bench_decoding_clip4idc.py --model vitb32 --batch 16
The machine's 2 cores are shared with other jobs: wall-clock numbers are noisy, FLOP ratios are not.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from idckit.experiments.config import load_config, model_config
from idckit.models import decoding
from idckit.models.clip4idc import CLIP4IDCCaptioner
from idckit.models.clip_loader import load_clip

MODELS = {  # name -> the profile measured: its CLIP (clip4idc_adapt.json) and its captioner (clip4idc-<profile>)
    "vitb32": "paper",        # the paper's shapes
    "standin": "cpu",         # the kit's offline stand-in and the cpu profile's captioner
}


def public_code_greedy(model: CLIP4IDCCaptioner, visual, max_len: int) -> torch.Tensor:
    """The public code's greedy decoding: no cache, caption encoder re-run each step, all max_len steps."""
    pair_tokens, _ = model.pair_encoder(*visual)
    ids = torch.full((pair_tokens.shape[0], 1), model.bos_id, dtype=torch.long)
    for _ in range(max_len):
        logits = model.decode(model.encode_pair_tokens(pair_tokens), ids)[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, 1:]


def after_eos_to_pad(ids: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """Keep each row up to and including its first EOS, pad after (the public code cuts there when decoding text)."""
    seen = (ids == eos_id).long().cumsum(1)
    after = (seen - (ids == eos_id).long()) > 0
    return ids.masked_fill(after, pad_id)


def count_flops(fn) -> tuple[float, object]:
    def cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs):   # receives shapes; 2 bmm (QK^T, PV)
        return sdpa_flop_count(query, key, value)

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa}
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)   # the fused MHA kernel is invisible to FlopCounterMode
    try:
        counter = FlopCounterMode(display=False, custom_mapping=mapping)
        with counter:
            out = fn()
    finally:
        torch.backends.mha.set_fastpath_enabled(was)
    return counter.get_total_flops(), out


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="vitb32")
    # An evaluation batch. At batch 4 the cached decoder is bound by reading the 49408x512 LM head (101 MB fp32)
    # once per step; measured 7.5x (batch 4) vs 13.3x (batch 16) over the public way, decoding after the ViT.
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=None, help="decoding steps (default: the profile's max_len)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-naive", action="store_true", help="skip the everything-every-step baseline")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    profile = MODELS[args.model]
    arch = load_config("clip4idc_adapt", profile)["clip"]["model"]
    cfg = model_config(f"clip4idc-{profile}", freeze_visual=False)     # the encoder's cost is measured, not skipped
    max_len = args.max_len or cfg.max_len
    clip, _, _ = load_clip(arch, None)
    size = clip.visual.image_size[0]
    model = CLIP4IDCCaptioner(clip, cfg).eval()
    g = torch.Generator().manual_seed(1)
    visual = tuple(torch.randn(args.batch, 3, size, size, generator=g) for _ in range(2))
    print(f"model: {arch} (random weights, pretrained=None), captioner hidden {cfg.hidden}, "
          f"{cfg.enc_layers}+{cfg.dec_layers} layers, {model.pair_encoder.n_intra}/{model.pair_encoder.n_inter} "
          f"intra/inter, {2 * model.pair_encoder.tokens_per_image} visual tokens; batch {args.batch}, "
          f"max_len {max_len}, {args.threads} threads (cores shared with other jobs)")

    runs = {
        "cached": lambda: decoding.greedy_decode(model, visual, max_len),
        "public": lambda: public_code_greedy(model, visual, max_len),
        "naive": lambda: decoding.naive_greedy_decode(model, visual, max_len),
    }
    if args.skip_naive:
        del runs["naive"]
    results = {}
    with torch.inference_mode():
        encoder_flops, _ = count_flops(lambda: model.pair_encoder(*visual))
        encoder_seconds, _ = timed(lambda: model.pair_encoder(*visual), max(2, args.repeats))
        for name, fn in runs.items():
            seconds, tokens = timed(fn, args.repeats)
            flops, _ = count_flops(fn)
            results[name] = {"seconds": seconds, "flops_per_pair": flops / args.batch, "tokens": tokens}

    cached = results["cached"]["tokens"]
    for name, r in results.items():
        toks = after_eos_to_pad(r["tokens"], model.eos_id, model.pad_id)
        assert torch.equal(toks[:, :cached.shape[1]], cached), f"{name} decoded different tokens"
        assert (toks[:, cached.shape[1]:] == model.pad_id).all(), f"{name} decoded past every EOS"
    print(f"identical tokens: yes ({cached.shape[1]} steps; "
          f"{int((cached == model.eos_id).any(1).sum())}/{args.batch} rows emitted EOS)")

    enc = encoder_flops / args.batch / 1e9
    print(f"pair encoder (ViT, run once by cached and public): {enc:.2f} GFLOP/pair, {encoder_seconds:.2f} s/batch")
    print(f"{'decoder':8s} {'GFLOP/pair':>11s} {'decode-only':>12s} {'s/batch':>9s} {'decode s':>9s} {'pairs/s':>8s}")
    for name, r in results.items():
        total = r["flops_per_pair"] / 1e9
        r["decode_seconds"] = max(r["seconds"] - encoder_seconds, 1e-9)
        print(f"{name:8s} {total:11.2f} {total - enc:12.2f} {r['seconds']:9.2f} {r['decode_seconds']:9.2f} "
              f"{args.batch / r['seconds']:8.2f}")
    c = results["cached"]
    for name in ("public", "naive"):
        if name in results:
            r = results[name]
            print(f"speedup cached vs {name}: end to end {r['seconds'] / c['seconds']:.1f}x wall, "
                  f"{r['flops_per_pair'] / c['flops_per_pair']:.1f}x FLOPs; decoding after the ViT "
                  f"{r['decode_seconds'] / c['decode_seconds']:.1f}x wall, "
                  f"{(r['flops_per_pair'] / 1e9 - enc) / (c['flops_per_pair'] / 1e9 - enc):.1f}x FLOPs")
    r = results["public"]
    ratio = r["decode_seconds"] / c["decode_seconds"]
    # The public code's slowness is in decoding (caption encoder + decoder re-run for all 32 steps); the ViT runs
    # once per pair in both, so the 10x target is on the decoding that follows it.
    print(f"target: decoding >= 10x faster than the public code's way -> {ratio:.1f}x wall: "
          f"{'met' if ratio >= 10 else 'NOT met'}")
    return results


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
