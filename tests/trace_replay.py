"""Replaying a recorded training trace through the kit's own loop (the IDC-PCL trace tests share it)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from idckit.authors import pcl as parity
from idckit.experiments.config import train_config
from idckit.text.pcl_inputs import FGVCData, PCLData, SplitData
from idckit.text.vocab import Vocab
from idckit.train.loop import fit
from numeric import assert_close

#: the authors' pre-training task names -> the kit's
PRETRAIN_TASKS = {"mlm": "mlm", "mvm_contrst": "mvcl", "fda": "fda", "nabirds": "fgvc"}


def replay(task, block: dict, steps: int, tmp_path: Path, **overrides):
    """``steps`` of :func:`idckit.train.loop.fit` on ``task`` with the profile's ``block`` of training settings
    (``overrides`` on top), logging every step and never evaluating. Returns (the fit result, the loop's logged
    steps, and per step (lr of each group, gradient norm)) read where the loop hands them to the optimiser, through
    a step pre-hook. One thread: the traces were recorded on one."""
    cfg = train_config({**block, "max_steps": steps, "log_every": 1, "eval_every": 0, "checkpoint_every": 0,
                        **overrides})
    seen = []

    def before_step(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        seen.append((torch.tensor([group["lr"] for group in optimizer.param_groups], dtype=torch.float64),
                     torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    hook = register_optimizer_step_pre_hook(before_step)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = fit(task, cfg, tmp_path / "run", progress=False, device="cpu")
    finally:
        hook.remove()
        torch.set_num_threads(before)
    logged = [r for r in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines()) if "loss" in r]
    assert res.steps == steps and len(logged) == steps and len(seen) == steps
    return res, logged, seen


def compare_final(rec: dict, model, words, rtol: float = 1e-5, unused: tuple[str, ...] = ("pooler.",)) -> int:
    """The kit's IDC-PCL weights after the last step against the recorded ones (``rec["final"]``, the authors'
    names), to ``rtol`` relative; returns how many tensors moved off ``rec["init"]``. ``unused``: name prefixes of
    their heads that no step of the trace reads, which must not have moved (their ITM pooler outside CLEVR
    fine-tuning)."""
    final, _ = parity.authors_state_dict_of_kit(model.state_dict(), words, rec["vocab"])
    lr_sum = rec["steps"]["lr"].sum()
    moved = 0
    for key, value in rec["final"].items():
        if key == "position_encoding.pe":            # a buffer, the kit's own table (test_parity_pcl)
            continue
        if unused and key.startswith(unused):
            assert torch.equal(value, rec["init"][key]), key
            continue
        got = final[key]
        if key == "position_encoding.type_pe.weight":    # their row 0 is never used (the kit has no such row)
            got, value = got[1:], value[1:]
        if key.endswith("attn.k_linear.bias"):
            # attention is invariant to a key bias (it shifts every score of a query alike): its true gradient is
            # 0 and the computed one rounding noise, which Adam divides by its own size, so each step moves it by
            # about lr in a direction no two implementations share (the CLEVR fine-tuning trace's largest gap,
            # 1.81e-4, is just over the sum of its steps' lr, 1.8e-4); bounded by twice that, not compared
            assert (got - value).abs().max() <= 2 * lr_sum, key
            continue
        assert_close(got, value, rtol=rtol, what=key)
        moved += not torch.equal(value, rec["init"][key][-len(value):])
    return moved


def recorded(task_class):
    """``task_class`` fed the recorded batches (in the kit's ids), one per step, in their order: the one seam; the
    loop, the forward, the losses, the optimiser and the schedule are the kit's own."""

    class Recorded(task_class):
        def __init__(self, data, batches, **kw):
            super().__init__(data, **kw)
            self.recorded = batches

        def batches(self, epoch, generator):
            yield from self.recorded

    Recorded.__name__ = Recorded.__qualname__ = f"Recorded{task_class.__name__}"
    return Recorded


def _kit_labels(label: torch.Tensor, k_of_a: torch.Tensor) -> torch.Tensor:
    return torch.where(label == -1, torch.full_like(label, -100), k_of_a[label.clamp(min=0)])


def kit_inputs(rec: dict):
    """(PCLData holding every batch's images, the recorded batches in the kit's layout and ids, the kit's words).

    Each batch has pairs of its own. GIC: one image per caption, the second the all-zero blank row (the model lays
    it out as a lone image, ``single_image="lone"``). MVCL: the pair features are their originals (``img_label``;
    the kit zeroes the masked regions itself), the regions their ``img_mask``. FDA: each pair once per caption (the
    positive, then the negatives), as their model repeats the images. NABirds: FGVC image pairs with their classes.
    """
    _, words = parity.convert_state_dict(rec["init"], rec["vocab"])
    k_of_a = parity.kit_ids_of_authors(rec["vocab"])
    gic = rec.get("stage") == "gic"
    n_neg = rec["neg"] if "neg" in rec else rec["sizes"]["neg"]     # the birds traces store theirs apart
    tasks = rec.get("tasks") or ["finetune"] * len(rec["batches"])
    feats1, feats2, texts, batches = [], [], [], []
    fgvc = {"f1": [], "f2": [], "class1": [], "class2": []}
    n_pairs = n_fgvc = 0
    for task, b in zip(tasks, rec["batches"]):
        if task == "nabirds":
            size = len(b["img1"])
            assert torch.equal(b["label"].view(-1), (b["class1"] == b["class2"]).view(-1).long())
            fgvc["f1"].append(b["img1"])
            fgvc["f2"].append(b["img2"])
            fgvc["class1"].append(b["class1"].view(-1))
            fgvc["class2"].append(b["class2"].view(-1))
            batches.append({"task": "fgvc", "pairs": torch.arange(n_fgvc, n_fgvc + size)})
            n_fgvc += size
            continue
        if gic:
            f1 = b["img_label"] if task == "mvm_contrst" else b["img"]
            f2 = torch.zeros_like(f1)
        else:
            f1, f2 = b["img1"], b["img2"]
        size, n = f1.shape[:2]
        pairs = torch.arange(n_pairs, n_pairs + size)
        out = {"task": PRETRAIN_TASKS.get(task), "pairs": pairs}
        if task in ("mlm", "finetune"):
            out["text"], out["labels"] = k_of_a[b["cap"]], _kit_labels(b["cap_label"], k_of_a)
        elif task == "mvm_contrst":
            if gic:
                regions = torch.stack([b["img_mask"], torch.zeros_like(b["img_mask"])], 1)
                assert torch.equal(f1.masked_fill(regions[:, 0, :, None], 0.0), b["img"])
            else:
                f1, f2 = b["img_label"][:, :n], b["img_label"][:, n:]
                regions = b["img_mask"].view(size, 2, n)
                assert torch.equal(f1.masked_fill(regions[:, 0, :, None], 0.0), b["img1"])
                assert torch.equal(f2.masked_fill(regions[:, 1, :, None], 0.0), b["img2"])
            out["text"], out["regions"] = k_of_a[b["cap"]], regions
        else:
            groups = b["caps"].shape[1]
            out.update(pairs=pairs.repeat_interleave(groups), text=k_of_a[b["caps"]].flatten(0, 1), groups=groups)
        if task == "finetune":
            del out["task"]
        feats1.append(f1)
        feats2.append(f2)
        texts.append(k_of_a[b["cap"]])
        batches.append(out)
        n_pairs += size
    features = torch.cat(feats1 + ([] if gic else feats2) + fgvc["f1"] + fgvc["f2"]
                         + ([torch.zeros_like(feats1[0][:1])] if gic else []))
    assert torch.equal(features.half().float(), features)       # float16 values, as the kit stores features
    after = torch.full((n_pairs,), len(features) - 1) if gic else torch.arange(n_pairs, 2 * n_pairs)
    train = SplitData(pair_ids=[f"p{i}" for i in range(n_pairs)], types=["x"] * n_pairs,
                      before=torch.arange(n_pairs), after=after, is_change=torch.ones(n_pairs, dtype=torch.bool),
                      references={}, sample_pair=torch.arange(n_pairs), sample_ids=torch.cat(texts))
    # PretrainTask encodes the pairs' FDA negatives when it is built; the recorded batches carry their own
    data = PCLData(vocab=Vocab(words), features=features.half(), splits={"train": train}, max_len=rec["max_len"],
                   negatives={p: ["the cube"] * n_neg for p in train.pair_ids},
                   blank_row=len(features) - 1 if gic else None)
    if n_fgvc:
        first = (1 + (not gic)) * n_pairs
        data.fgvc = FGVCData(rows1=torch.arange(first, first + n_fgvc),
                             rows2=torch.arange(first + n_fgvc, first + 2 * n_fgvc),
                             class1=torch.cat(fgvc["class1"]), class2=torch.cat(fgvc["class2"]),
                             n_classes=rec["n_classes"])
    return data, batches, words
