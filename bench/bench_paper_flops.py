"""FLOPs of one training sample of every paper-size model, counted, and the wall-time estimates they imply.

Counts forward + backward FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add; no
optimizer, no data loading) for a few samples through the kit's real training steps at the paper profile's sizes:
IDC-PCL pre-training (MLM, MVCL, FDA with 6 negatives; mixed 8:1:2 as the ratio pool draws them) and fine-tuning,
CLIP4IDC adaptation (ViT-B/32 pair encoder + text tower, InfoNCE) and captioning (ViT-B/32 + 3+3 caption layers).
Every count is linear in the batch, so a step of the paper's batch is the per-sample count times the batch.

The wall times printed are ESTIMATES: counted FLOPs x the papers' steps / an assumed sustained throughput
(``--tflops``, default 100 TFLOP/s: about a third of an A100's 312 dense bf16 TFLOP/s). They leave out data loading,
evaluation and Python overhead, which matter for CLIP4IDC (224 px images decoded per step). Run:
    .venv/bin/python bench/bench_paper_flops.py --tflops 100 --gpus 1 8
"""
from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode

from idckit.experiments.config import load_config, model_config
from idckit.losses import mlm_loss
from idckit.cli.gpu_check import pcl_data
from idckit.tasks.pcl import FinetuneTask, PretrainTask


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        loss = fn()
        loss.backward()
    return counter.get_total_flops()


def pcl_flops(per: int = 7) -> dict[str, float]:
    """Per-sample FLOPs of each IDC-PCL step kind (FDA: per caption scored, 7 per pair)."""
    cfg = load_config("pcl", "paper")
    data = pcl_data(per, cfg["max_len"], feat_dim=2048, n_regions=49)   # ResNet-101's 7x7 grid
    out = {}
    for kind in ("mlm", "mvcl", "fda"):
        p = cfg["pretrain"]
        task = PretrainTask(data, cfg["model"], batch_size=per, ratios={kind: 1}, mask_prob=p["mask_prob"],
                            eos_prob=p["eos_prob"], region_prob=p["region_prob"], tau_mvcl=p["tau_mvcl"],
                            tau_fda=p["tau_fda"])
        torch.manual_seed(0)
        model = task.build_model().train()
        batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
        out[kind] = _count(lambda: task.train_step(model, batch, 0)[0]) / len(batch["pairs"])
    f = cfg["finetune"]
    task = FinetuneTask(data, cfg["model"], batch_size=per, mask_prob=f["mask_prob"], eos_prob=f["eos_prob"],
                        distractor_weight=f["distractor_weight"], eval_batch_size=f["eval_batch_size"],
                        group_by_pair=f["group_by_pair"], captions_per_pair=f["captions_per_pair"],
                        targets=f["targets"], selection_metric=f["selection_metric"], tokenize=f["tokenize"])
    model = task.build_model().train()
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    out["finetune"] = _count(lambda: task.train_step(model, batch, 0)[0]) / per
    return out


def clip4idc_flops(per: int = 2) -> dict[str, float]:
    from idckit.models.clip4idc import CLIP4IDCCaptioner, CLIP4IDCRetrieval
    from idckit.models.clip_loader import load_clip

    adapt, cap = load_config("clip4idc_adapt", "paper"), load_config("clip4idc_caption", "paper")
    clip, _, _ = load_clip(adapt["clip"]["model"], None)      # the architecture; the weights do not change FLOPs
    retrieval = CLIP4IDCRetrieval(clip).train()
    retrieval.freeze_like_public_code()
    images = torch.randn(per, 3, 224, 224), torch.randn(per, 3, 224, 224)
    tokens = torch.randint(1, 49000, (per, 32))

    def adapt_step():
        pair = torch.nn.functional.normalize(retrieval.encode_pair(*images), dim=-1)
        text = torch.nn.functional.normalize(retrieval.encode_text(tokens), dim=-1)
        return (text @ pair.t()).logsumexp(1).mean()

    out = {"adapt": _count(adapt_step) / per}
    captioner = CLIP4IDCCaptioner(load_clip(adapt["clip"]["model"], None)[0],
                                  model_config("clip4idc-paper")).train()
    ids = torch.randint(1, 49000, (per, cap["max_len"]))
    out["caption"] = _count(lambda: mlm_loss(*captioner.teacher_forcing(captioner.encode(*images), ids))) / per
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tflops", type=float, default=100.0, help="assumed sustained TFLOP/s per GPU")
    ap.add_argument("--gpus", type=int, nargs="*", default=[1, 8])
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    pcl, pcl_cfg = pcl_flops(), load_config("pcl", "paper")
    c4, cap_cfg = clip4idc_flops(), load_config("clip4idc_caption", "paper")
    print("GFLOP per training sample (forward + backward, counted):")
    for k, v in {**pcl, **c4}.items():
        print(f"  {k:9s} {v / 1e9:8.2f}")
    pool = pcl_cfg["pretrain"]["ratios"]
    mix = sum(pool[k] * pcl[k] for k in pool) / sum(pool.values())      # FDA rows are captions, 7 per pair
    pre = pcl_cfg["pretrain"]
    fda_rows = (pre["batch_size"] // 7) * 7
    step_pre = (sum(pool[k] * pcl[k] * (fda_rows if k == "fda" else pre["batch_size"]) for k in pool)
                / sum(pool.values()))
    ft = pcl_cfg["finetune"]
    scenes_per_epoch = 33830                  # CLEVR-Change train before-images (67,660 train pairs / 2)
    cap_steps = cap_cfg["train"]["epochs"] * (scenes_per_epoch // cap_cfg["batch_size"])
    plans = [
        ("IDC-PCL pre-training", pre["train"]["max_steps"], step_pre),
        ("IDC-PCL fine-tuning (upper bound: max_steps, early stopping ends it sooner)", ft["train"]["max_steps"],
         ft["batch_size"] * pcl["finetune"]),
        ("CLIP4IDC captioning (upper bound: 50 epochs)", cap_steps, 2 * cap_cfg["batch_size"] * c4["caption"]),
        ("CLIP4IDC adaptation, per 100,000 caption samples", 100_000 // 128, 128 * c4["adapt"]),
    ]
    print(f"ESTIMATES at an assumed {args.tflops:g} TFLOP/s sustained per GPU (compute only; mix per step "
          f"{mix / 1e9:.2f} GFLOP/sample for pre-training):")
    for name, steps, flops in plans:
        hours = [steps * flops / (args.tflops * 1e12 * g) / 3600 for g in args.gpus]
        when = lambda h: f"{h:.1f} h" if h >= 1 else f"{60 * h:.0f} min"  # noqa: E731
        print(f"  {name}: {steps:,} steps x {flops / 1e12:.2f} TFLOP = "
              + ", ".join(f"{when(h)} on {g} GPU{'s' if g > 1 else ''}" for h, g in zip(hours, args.gpus)))


if __name__ == "__main__":
    main()
