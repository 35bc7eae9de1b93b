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
    ("pcl", "pretrain.train.max_steps", 250001, "Table 6: 250K; clver/pretrain.py updates at 0 .. 250000"),
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
    ("clip4idc_caption", "train.patience", 11, "public code: stops when more than 10 epochs in a row gained nothing"),
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
    # Table 6: weight decay 0 in both stages (configs/train.json's default when a train block names none)
    assert "weight_decay" not in pcl["pretrain"]["train"] and "weight_decay" not in pcl["finetune"]["train"]
    # Noam with the step counted from 0, as their utils.get_lr_sched (tests/test_training_trace_pcl_pretrain.py)
    assert pcl["pretrain"]["train"]["schedule"] == "noam_public"
    assert pcl["finetune"]["train"]["schedule"] == "step_decay"
    assert pcl["backbone_weights"] is None        # torchvision's ImageNet weights by name; a file path otherwise
    # the smaller profiles keep the offline stand-in backbone
    assert load_config("pcl", "cpu")["backbone"] == load_config("pcl", "smoke")["backbone"] == "efficientnet_lite0"


def test_named_model_configs_are_the_profiles_model_sections():
    from idckit.errors import ConfigError
    from idckit.experiments.config import model_config, model_names

    sizes = {"vocab_size": 80, "feat_dim": 1280, "n_regions": 49}
    assert {"pcl-cpu", "pcl-paper", "clip4idc-cpu", "duda-smoke"} <= set(model_names())
    for name in model_names():
        cfg = model_config(name) if name.startswith("clip4idc") else model_config(name, **sizes)
        file, section = {"pcl": ("pcl", "model"), "pcl-birds": ("pcl_birds", "model"),
                         "clip4idc": ("clip4idc_caption", "captioner"), "duda": ("duda", "model")}[
            name.rpartition("-")[0]]
        profile = load_config(file, name.rpartition("-")[2])
        assert all(getattr(cfg, k) == v for k, v in profile[section].items()), name
    cpu, paper = model_config("clip4idc-cpu"), model_config("clip4idc-paper")
    assert (cpu.hidden, cpu.freeze_visual, cpu.max_len) == (128, True, 32) and not paper.freeze_visual
    assert model_config("pcl-cpu", **sizes).max_text_len == load_config("pcl", "cpu")["max_len"]
    assert model_config("pcl-paper", **sizes, d_model=64).d_model == 64          # fields override
    with pytest.raises(ConfigError, match="unknown model config"):
        model_config("pcl-gpu")
    with pytest.raises(ConfigError, match="vocab_size"):
        model_config("pcl-cpu")



def _paper_pcl_data(max_len: int, n: int = 8):
    """Random 7x7x2048 features (ResNet-101's grid) for n train and n val pairs, 80 words (CLEVR-Change's size)."""
    import torch

    from idckit.text.pcl_inputs import PCLData, SplitData
    from idckit.text.vocab import SPECIALS, Vocab

    g = torch.Generator().manual_seed(0)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(80 - len(SPECIALS))])
    splits = {}
    for k, split in enumerate(("train", "val")):
        ids = torch.randint(vocab.n_special, 80, (n, max_len), generator=g)
        ids[:, 0], ids[:, 12:] = vocab.bos_id, vocab.pad_id
        ids[:, 11] = vocab.eos_id
        names = [f"{split}{i}" for i in range(n)]
        splits[split] = SplitData(pair_ids=names, types=["color", "distractor"] * (n // 2),
                                  before=torch.arange(n) + 2 * n * k, after=torch.arange(n) + 2 * n * k + n,
                                  is_change=torch.arange(n) % 2 == 0, references={p: ["w1 w2"] for p in names},
                                  sample_pair=torch.arange(n), sample_ids=ids)
    data = PCLData(vocab=vocab, features=torch.randn(4 * n, 49, 2048, generator=g).half(), splits=splits,
                   max_len=max_len)
    data.negatives = {p: ["w3 w4 w5"] * 6 for p in splits["train"].pair_ids}
    return data


def _paper_pair_data(size: int, max_len: int, scenes: int = 2):
    """Random uint8 images at the CLIP size: per scene a semantic pair (default, sc) then its distractor pair."""
    import torch

    from idckit.data.images import ImageCache
    from idckit.models.clip4idc import tokenize_captions
    from idckit.tasks.clip4idc import PairData, PairSplit

    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (3 * scenes, 3, size, size), generator=g, dtype=torch.uint8)
    images = ImageCache(pixels, {f"i{r}": r for r in range(3 * scenes)})
    before = torch.arange(scenes).repeat_interleave(2) * 3
    after = before + torch.tensor([1, 2]).repeat(scenes)
    names = [f"p{i}" for i in range(2 * scenes)]
    split = PairSplit(pair_ids=names, types=["color", "distractor"] * scenes, before=before, after=after,
                      is_change=torch.arange(2 * scenes) % 2 == 0,
                      distractor_row=torch.where(torch.arange(2 * scenes) % 2 == 0, after + 1, -1),
                      references={p: ["the cube changed"] for p in names}, sample_pair=torch.arange(2 * scenes),
                      sample_ids=tokenize_captions(["the red cube became blue", "no change"] * scenes, max_len))
    return PairData(images=images, splits={"train": split, "val": split}, max_len=max_len)


class _NoScoring:
    """Validation without the JVM and without decoding: these runs are about sizes and steps, not scores."""

    def evaluate(self, model, split="val"):
        return {self.selection_metric: 0.0}


@pytest.fixture
def two_threads():
    """The paper-size steps on both cores, and the count restored after: later test files keep their own."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_every_paper_size_model_trains_two_steps(tmp_path, two_threads):
    """IDC-PCL pre-training (the 8:1:2 pool: MLM, MVCL, FDA with 6 negatives) and fine-tuning at the paper's size
    (d 512, 1+1+3 layers, 49 regions of 2048-d features, 40 words), CLIP4IDC adaptation and captioning on a ViT-B/32
    (randomly initialised: OpenAI's weights cannot be downloaded in tests) with the paper's 3+3-layer captioner;
    2 loop steps each at a tiny batch, on the CPU."""
    import torch

    from idckit.tasks.clip4idc import AdaptTask, CaptionTask
    from idckit.tasks.pcl import FinetuneTask, PretrainTask
    from idckit.experiments.config import train_config
    from idckit.train.loop import fit

    class Finetune(_NoScoring, FinetuneTask):
        pass

    class Caption(_NoScoring, CaptionTask):
        pass

    two = train_config(dict(max_steps=2, lr=1e-4, seed=0))
    pcl = load_config("pcl", "paper")
    data = _paper_pcl_data(pcl["max_len"])
    p = pcl["pretrain"]
    pre = PretrainTask(data, pcl["model"], batch_size=7, ratios=p["ratios"], mask_prob=p["mask_prob"],
                       eos_prob=p["eos_prob"], region_prob=p["region_prob"], tau_mvcl=p["tau_mvcl"],
                       tau_fda=p["tau_fda"])
    res = fit(pre, two, tmp_path / "pre", progress=False, device="cpu")
    # the public pre-training model's size (the MVCL output layer tied to the projection, no final LayerNorm)
    assert res.steps == 2 and round(sum(p.numel() for p in res.model.parameters()) / 1e6, 2) == 17.17
    f = pcl["finetune"]
    ft = Finetune(data, pcl["model"], batch_size=2, mask_prob=f["mask_prob"], eos_prob=f["eos_prob"],
                  distractor_weight=f["distractor_weight"], eval_batch_size=2, group_by_pair=f["group_by_pair"],
                  captions_per_pair=f["captions_per_pair"], targets=f["targets"],
                  selection_metric=f["selection_metric"], tokenize=f["tokenize"],
                  loss_reduction=f["loss_reduction"], init_from=tmp_path / "pre" / "best.pt")
    assert fit(ft, two, tmp_path / "ft", progress=False, device="cpu").steps == 2

    adapt, cap = load_config("clip4idc_adapt", "paper"), load_config("clip4idc_caption", "paper")
    pairs = _paper_pair_data(224, cap["max_len"])
    task = AdaptTask(pairs, adapt["clip"]["model"], None, batch_size=2, clip_lr_scale=adapt["clip_lr_scale"],
                     weight_decay=adapt["weight_decay"], swap_prob=adapt["swap_prob"],
                     freeze_intra=adapt["freeze_intra"], freeze_embeddings=adapt["freeze_embeddings"],
                     eval_batch_size=adapt["eval_batch_size"], ks=(1, 5, 10))
    res = fit(task, two, tmp_path / "adapt", progress=False, device="cpu")
    assert res.steps == 2 and res.model.pair_encoder.n_intra == 9          # the paper's 9 intra + 3 inter
    captioner = {**cap["captioner"], "variant": "clip4idc", "n_intra": 9}
    task = Caption(pairs, adapt["clip"]["model"], None, captioner, batch_size=1,
                   captions_per_pair=cap["captions_per_pair"],
                   visual_lr_scale=cap["visual_lr_scale"], trim_vocab=cap["trim_vocab"],
                   eval_batch_size=cap["eval_batch_size"], init_from=tmp_path / "adapt" / "best.pt")
    assert fit(task, two, tmp_path / "caption", progress=False, device="cpu").steps == 2
