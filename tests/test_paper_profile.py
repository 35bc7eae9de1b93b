"""PROFILE=paper is the papers' setting: every hyperparameter the papers print, tabulated against the configs.

Transcribed from IDC-PCL's appendix Table 6 (CLEVR-Change column) and CLIP4IDC's appendix B with its public scripts
(batch 128 for adaptation, warm-up fractions, betas); the comment on each row says where a value comes from."""
from __future__ import annotations

import pytest

from idckit.experiments.config import load_config

# (config, dotted key, paper value, source)
PAPER = [
    ("pcl", "backbone", "resnet101", "IDC-PCL 3.1: ResNet-101 grid features (7x7x2048)"),
    ("pcl", "max_len", 40, "IDC-PCL Table 6: max sentence length 40"),
    ("pcl", "model.n_layers", 3, "Table 6: layers 3"),
    ("pcl", "model.single_layers", 1, "Table 6: single-image block 1"),
    ("pcl", "model.pair_layers", 1, "Table 6: pair-image block 1"),
    ("pcl", "model.d_model", 512, "Table 6: hidden 512"),
    ("pcl", "model.d_ff", 2048, "Table 6: FFN 2048"),
    ("pcl", "model.n_heads", 8, "Table 6: heads 8"),
    ("pcl", "model.dropout", 0.2, "Table 6: dropout 0.2"),
    ("pcl", "pretrain.train.warmup_steps", 8000, "Table 6: pre-training warm-up 8K"),
    ("pcl", "pretrain.train.max_steps", 250000, "Table 6: pre-training steps 250K"),
    ("pcl", "pretrain.train.lr", 1e-4, "Table 6: pre-training lr 1e-4"),
    ("pcl", "pretrain.batch_size", 200, "Table 6: batch 200"),
    ("pcl", "pretrain.ratios", {"mlm": 8, "mvcl": 1, "fda": 2}, "Table 6: MLM:MVCL:FDA = 8:1:2"),
    ("pcl", "pretrain.tau_mvcl", 1.0, "Table 6: tau1 = 1"),
    ("pcl", "pretrain.tau_fda", 1.0, "Table 6: tau2 = 1"),
    ("pcl", "negatives.ratio", [2, 2, 2], "Table 6: 6 FDA negatives, retrieve:replace:confuse = 2:2:2"),
    ("pcl", "finetune.train.lr", 3e-5, "Table 6: fine-tuning lr 3e-5"),
    ("pcl", "finetune.batch_size", 200, "Table 6: fine-tuning batch 200"),
    ("clip4idc_adapt", "clip", {"model": "ViT-B-32", "pretrained": "openai"}, "CLIP4IDC B: OpenAI ViT-B/32"),
    ("clip4idc_adapt", "train.epochs", 12, "CLIP4IDC B: 12 epochs of adaptation"),
    ("clip4idc_adapt", "train.lr", 1e-4, "public code: the new parameters at 1e-4"),
    ("clip4idc_adapt", "clip_lr_scale", 1e-3, "B: CLIP's weights at 1e-7 = 1e-4 x 1e-3"),
    ("clip4idc_adapt", "batch_size", 128, "public scripts: --batch_size 128"),
    ("clip4idc_caption", "max_len", 32, "B: greedy decoding up to 32 steps, text length 32"),
    ("clip4idc_caption", "captioner.enc_layers", 3, "B: 3 encoder layers"),
    ("clip4idc_caption", "captioner.dec_layers", 3, "B: 3 decoder layers"),
    ("clip4idc_caption", "captioner.heads", 8, "B: 8 heads"),
    ("clip4idc_caption", "captioner.hidden", 512, "B: hidden 512"),
    ("clip4idc_caption", "captioner.dropout", 0.1, "B: dropout 0.1"),
    ("clip4idc_caption", "train.lr", 1e-4, "B: caption model lr 1e-4"),
    ("clip4idc_caption", "visual_lr_scale", 1e-3, "B: visual encoder lr 1e-7 = 1e-4 x 1e-3"),
    ("clip4idc_caption", "train.epochs", 50, "B: up to 50 epochs"),
    ("clip4idc_caption", "batch_size", 16, "B: batch 16"),
    ("clip4idc_caption", "train.patience", 10, "public code: early stopping after 10 epochs without gain"),
]


def _get(d, dotted):
    for k in dotted.split("."):
        d = d[k]
    return d


@pytest.mark.parametrize("config, key, paper, source", PAPER, ids=[f"{c}:{k}" for c, k, _, _ in PAPER])
def test_paper_profile_equals_the_papers(config, key, paper, source):
    assert _get(load_config(config, "paper"), key) == paper, source


def test_paper_profile_weight_decay_and_schedules():
    pcl = load_config("pcl", "paper")
    # Table 6: weight decay 0 in both stages (the loop's default when a train block names none)
    assert "weight_decay" not in pcl["pretrain"]["train"] and "weight_decay" not in pcl["finetune"]["train"]
    assert pcl["pretrain"]["train"]["schedule"] == "noam" and pcl["finetune"]["train"]["schedule"] == "step_decay"
    assert pcl["backbone_weights"] is None        # torchvision's ImageNet weights by name; a file path otherwise
    # the smaller profiles keep the offline stand-in backbone
    assert load_config("pcl", "cpu")["backbone"] == load_config("pcl", "smoke")["backbone"] == "efficientnet_lite0"
