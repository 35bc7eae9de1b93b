"""What tests/test_distributed.py runs, alone (imported) or under ``torchrun --nproc_per_node=2`` (gloo, CPU).

The runs use the kit's real tasks (IDC-PCL pre-training with MLM, MVCL and FDA, fine-tuning with the judge;
CLIP4IDC adaptation and captioning on the stand-in CLIP), on random in-memory data small enough for seconds.
Dropout is 0 so the only random draws are the batch generator's, which every rank shares: one process and two
processes then compute the same global gradients, and their runs must agree to float tolerance.

    torchrun --nproc_per_node=2 tests/ddp_worker.py all OUT_DIR
    torchrun --nproc_per_node=2 tests/ddp_worker.py finetune OUT_DIR [CRASH_AT_STEP]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from idckit.text.pcl_inputs import PCLData, SplitData
from idckit.tasks.pcl import FinetuneTask, PretrainTask, predict
from idckit.text.vocab import Vocab
from idckit.train import distributed
from idckit.experiments.config import train_config
from idckit.train.loop import fit

MODEL = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "single_layers": 1, "pair_layers": 1,
         "dropout": 0.0, "difference_encoder": True, "distractor_head": True, "n_classes": 0,
         "visual_activation": "none", "norm": "torch", "input_norm": False, "final_norm": True,
         "scale_words": False, "mvcl_head": "untied", "special_tokens": "distinct", "pos_table": "vaswani",
         "attend_padding": False, "init": "kit", "mvcl_negatives": "paper",
         "single_image": "blank", "special_words": "drop"}
PRETRAIN = {"mask_prob": 0.15, "eos_prob": 0.15, "region_prob": 0.15, "tau_mvcl": 1.0, "tau_fda": 1.0}
WORDS = ["the", "red", "blue", "cube", "sphere", "moved", "changed", "color", "no", "change", "was", "added"]


def tiny_pcl_data() -> PCLData:
    g = torch.Generator().manual_seed(0)
    vocab = Vocab.build([" ".join(WORDS)])
    n_pairs, max_len = {"train": 24, "val": 6}, 10
    features = torch.randn(2 * sum(n_pairs.values()), 4, 8, generator=g).half()
    splits, row = {}, 0
    for split, n in n_pairs.items():
        before = torch.arange(row, row + n)
        after = torch.arange(row + n, row + 2 * n)
        row += 2 * n
        captions = [[" ".join(WORDS[int(j)] for j in torch.randint(len(WORDS), (int(k),), generator=g))
                     for k in torch.randint(3, 8, (2,), generator=g)] for _ in range(n)]
        ids = [f"{split}{i}" for i in range(n)]
        splits[split] = SplitData(
            pair_ids=ids, types=["color" if i % 2 == 0 else "distractor" for i in range(n)], before=before,
            after=after, is_change=torch.arange(n) % 2 == 0, references=dict(zip(ids, captions)),
            sample_pair=torch.arange(n).repeat_interleave(2),
            sample_ids=vocab.encode_batch([c for cs in captions for c in cs], max_len))
    data = PCLData(vocab=vocab, features=features, splits=splits, max_len=max_len)
    data.negatives = {p: [f"the {w} cube moved" for w in ("red", "blue")] for p in splits["train"].pair_ids}
    return data


class JudgedFinetune(FinetuneTask):
    """Fine-tuning whose val score needs no JVM: the judge's accuracy plus a small bonus per distinct caption
    (sharded decoding, gathered, scored on rank 0 as the real evaluate does)."""

    selection_metric = "score"

    def __init__(self, data, crash_at=None, grouped=False, **kw):
        # grouped: the cpu profile's batches (4 pairs x 2 references); else the paper's per-caption batches
        kw = {"targets": "masked", "selection_metric": "CIDEr-D", "tokenize": True, "loss_reduction": "mean", **kw}
        super().__init__(data, MODEL, batch_size=8, eval_batch_size=4, mask_prob=0.15, eos_prob=0.15,
                         distractor_weight=1.0, group_by_pair=grouped, captions_per_pair=2 if grouped else 1, **kw)
        self.crash_at = crash_at
        self.selection_metric = "score"    # FinetuneTask sets its own (CIDEr-D or ROUGE_L) per instance

    def train_step(self, model, batch, step):
        if self.crash_at is not None and step == self.crash_at:
            raise KeyboardInterrupt("simulated kill")
        return super().train_step(model, batch, step)

    def evaluate(self, model, split="val"):
        preds = predict(model, self.data, split, batch_size=self.eval_batch_size)
        if not distributed.is_main():
            return {}
        return {"score": preds["judge_accuracy"] + 0.01 * len(set(preds["captions"].values()))}


def tiny_pair_data(scenes: int = 16, size: int = 112):
    """Random uint8 images at the stand-in CLIP's size: per scene a semantic pair (default, sc) with one change
    caption, then its distractor pair (default, nsc) with a no-change caption."""
    from idckit.data.images import ImageCache
    from idckit.models.clip4idc import tokenize_captions
    from idckit.tasks.clip4idc import PairData, PairSplit

    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (3 * scenes, 3, size, size), generator=g, dtype=torch.uint8)
    images = ImageCache(pixels, {f"i{r}": r for r in range(3 * scenes)})
    before = torch.arange(scenes).repeat_interleave(2) * 3
    after = before + torch.tensor([1, 2]).repeat(scenes)
    names = [f"p{i}" for i in range(2 * scenes)]
    change = [" ".join(WORDS[int(j)] for j in torch.randint(len(WORDS), (6,), generator=g)) for _ in range(scenes)]
    texts = [t for c in change for t in (c, "no change was made")]
    split = PairSplit(pair_ids=names, types=["color", "distractor"] * scenes, before=before, after=after,
                      is_change=torch.arange(2 * scenes) % 2 == 0,
                      distractor_row=torch.where(torch.arange(2 * scenes) % 2 == 0, after + 1, -1),
                      references={p: [t] for p, t in zip(names, texts)}, sample_pair=torch.arange(2 * scenes),
                      sample_ids=tokenize_captions(texts, 16))
    return PairData(images=images, splits={"train": split, "val": split}, max_len=16)


class JudgedCaption:
    """CLIP4IDC captioning scored without a JVM: the number of distinct captions (sharded decoding, gathered)."""

    selection_metric = "score"

    def evaluate(self, model, split="val"):
        preds = self.predict(model, split)
        return {"score": float(len(set(preds.values())))} if distributed.is_main() else {}


def adapt(out: Path, workers: int = 0):
    """CLIP4IDC adaptation on the stand-in CLIP: InfoNCE over all-gathered pair and text vectors."""
    from idckit.tasks.clip4idc import AdaptTask

    task = AdaptTask(tiny_pair_data(), "idckit-standin-ViT-T-16", None, batch_size=8, clip_lr_scale=1e-3,
                     weight_decay=0.2, swap_prob=0.5, freeze_intra=False, freeze_embeddings=False, eval_batch_size=128,
                     ks=(1, 5, 10))
    return fit(task, train_config(dict(max_steps=4, lr=1e-3, log_every=1, seed=5)), out, progress=False,
               loader={"workers": workers})


def caption(out: Path):
    """CLIP4IDC captioning (frozen pair encoder, token loss over the global token count)."""
    from idckit.tasks.clip4idc import CaptionTask

    class Task(JudgedCaption, CaptionTask):
        pass

    captioner = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                 "freeze_visual": True,
                 "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise",
                 "tie_clip_embeddings": True, "freeze_clip_embeddings": False, "segment_embedding": None,
                 "difference_tokens": False}
    task = Task(tiny_pair_data(), "idckit-standin-ViT-T-16", None, captioner, batch_size=4, captions_per_pair=1,
                visual_lr_scale=0.0, trim_vocab=False, eval_batch_size=6)
    return fit(task, train_config(dict(max_steps=4, lr=1e-3, log_every=1, eval_every=2, seed=5)), out, progress=False)


def pretrain(out: Path, workers: int = 0):
    task = PretrainTask(tiny_pcl_data(), MODEL, batch_size=6, ratios={"mlm": 2, "mvcl": 1, "fda": 1}, **PRETRAIN)
    return fit(task, train_config(dict(max_steps=8, lr=3e-3, log_every=1, seed=5)), out, progress=False,
               loader={"workers": workers})


def finetune(out: Path, crash_at=None, grouped=False):
    task = JudgedFinetune(tiny_pcl_data(), crash_at=crash_at, grouped=grouped)
    cfg = train_config(dict(max_steps=8, lr=3e-3, log_every=1, eval_every=3, checkpoint_every=2, seed=5))
    return fit(task, cfg, out, progress=False)


def varied_model():
    """A PCL with large random weights: its captions and judgments differ from pair to pair (a few training steps
    on this data would caption every pair alike), so equal decodings mean something."""
    from idckit.models.pcl import PCL
    from idckit.tasks.pcl import build_config, data_sizes

    data = tiny_pcl_data()
    torch.manual_seed(3)
    model = PCL(build_config(MODEL, **data_sizes(data)), data.vocab)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, 0.5)
    return model


def decode(out: Path | None) -> dict:
    """The val captions and judgments of :func:`varied_model`, decoded by every rank and gathered; rank 0 writes
    them to ``out``."""
    preds = predict(varied_model(), tiny_pcl_data(), "val", batch_size=2)
    result = {"captions": preds["captions"], "judged": preds["judged_change"]}
    if out is not None and distributed.is_main():
        out.write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    what, out = sys.argv[1], Path(sys.argv[2])
    if what == "all":
        # 2 DataLoader workers per rank read the features / pixels of its shard (the 1-process reference reads in
        # process): sharding before the workers read must not change what a rank trains on
        pretrain(out / "pretrain", workers=2)
        adapt(out / "adapt", workers=2)
        caption(out / "caption")
        finetune(out / "finetune")
        finetune(out / "finetune_grouped", grouped=True)
        decode(out / "decoded.json")
    elif what == "finetune":
        finetune(out / "finetune", crash_at=int(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        raise SystemExit(f"unknown scenario {what}")
    if distributed.world() > 1:
        # every rank leaves its last collective before any tears gloo down (an early teardown can abort a rank
        # that is still finishing: "terminate called without an active exception")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
