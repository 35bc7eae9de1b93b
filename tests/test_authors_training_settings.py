"""The audit's last training differences as named settings whose `paper` value is the authors' (issue 49): each
setting's profile values, and a hand-computed check that fails if the kit ignored it.

- decoding's fewest words (``decode_min_words``): the authors' greedy decoders bar nothing at the first step.
- words kept after truncation (``words_kept``): the authors keep max_len - 3 words and pad to max_len.
- MLM's random replacement (``mask_random_from``) and a caption with no word chosen (``mask_none_chosen``): the
  authors draw from the whole vocabulary and mask the first word.
- pre-training's FDA positives (``fda_samples``) and data order (``sampling``): the authors' samples are every
  (pair, caption), walked in shuffled epochs per task.
- the gradient's scale (``train.gradient_scale``): CLIP4IDC's adaptation took half the global loss's gradient on
  the authors' 2 GPUs.
- CLIP4IDC's caption length: ``clip4idc-paper``, the released checkpoints' import and the paper run are one value.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import ddp_worker as worker
from idckit.errors import ConfigError
from idckit.experiments.config import load_config, train_config
from idckit.tasks.clip4idc import CaptionTask
from idckit.data.features import FeatureStore
from idckit.experiments.base import Setup
from idckit.models.pcl import mask_tokens, replacement_ids
from idckit.tasks.pcl import FinetuneTask, PretrainTask, predict
from numeric import assert_close
from idckit.text.pcl_inputs import PairRecord, pcl_data_from_records
from idckit.text.vocab import Vocab
from idckit.train.loop import fit

FINETUNE = {"batch_size": 6, "mask_prob": 0.15, "eos_prob": 0.15, "distractor_weight": 1.0, "eval_batch_size": 4,
            "targets": "masked", "group_by_pair": False, "captions_per_pair": 1, "selection_metric": "CIDEr-D",
            "tokenize": True, "loss_reduction": "mean"}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _ends_at_once(model):
    """``model`` whose likeliest token after the start token is always the end token (by a wide margin)."""
    step = model.decode_step

    def decode_step(state, tokens):
        logits = step(state, tokens).clone()
        logits[:, model.eos_id] = logits.max(-1).values + 100.0
        return logits

    model.decode_step = decode_step
    return model


# -- decoding's fewest words ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, section", [("pcl", "finetune"), ("pcl_birds", "finetune"),
                                             ("clip4idc_caption", None)])
def test_paper_decodes_with_no_minimum_length_and_cpu_smoke_with_one_word(family, section):
    def value(profile):
        cfg = load_config(family, profile)
        return (cfg[section] if section else cfg)["decode_min_words"]

    assert value("paper") == 0
    assert value("cpu") == value("smoke") == 1


def test_pcl_fine_tuning_decodes_with_its_setting():
    data = worker.tiny_pcl_data()
    torch.manual_seed(0)
    captions = {}
    for words in (0, 1):
        task = FinetuneTask(data, worker.MODEL, decode_min_words=words, **FINETUNE)
        model = _ends_at_once(task.build_model())
        captions[words] = predict(model, data, "val", batch_size=4, min_words=task.decode_min_words)["captions"]
    # the authors' greedy ends every caption at once; the kit's guard writes one word first
    assert set(captions[0].values()) == {""}
    assert all(len(c.split()) == 1 for c in captions[1].values())


class _Decoded(Exception):
    pass


def test_pcl_validation_decodes_with_the_setting(monkeypatch):
    import idckit.tasks.pcl as tasks_pcl

    def spy(model, data, split, *, batch_size, min_words):
        raise _Decoded(min_words)

    monkeypatch.setattr(tasks_pcl, "predict", spy)
    task = FinetuneTask(worker.tiny_pcl_data(), worker.MODEL, decode_min_words=0, **FINETUNE)
    with pytest.raises(_Decoded) as decoded:
        task.evaluate(task.build_model(), "val")
    assert decoded.value.args == (0,)


def test_a_negative_or_fractional_minimum_is_refused():
    for bad in (-1, 0.5, True):
        with pytest.raises(ConfigError, match="decode_min_words must be an integer >= 0"):
            FinetuneTask(worker.tiny_pcl_data(), worker.MODEL, decode_min_words=bad, **FINETUNE)


def test_clip4idc_captioning_decodes_with_its_setting(pairs, clip_file):
    small = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
             "freeze_visual": True, "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise",
             "tie_clip_embeddings": True, "freeze_clip_embeddings": False, "segment_embedding": None,
             "difference_tokens": False}
    captions = {}
    for words in (0, 1):
        task = CaptionTask(pairs, "idckit-standin-ViT-T-16", clip_file, small, batch_size=2, captions_per_pair=1,
                           visual_lr_scale=0.0, trim_vocab=False, eval_batch_size=8, decode_min_words=words)
        torch.manual_seed(0)
        captions[words] = task.predict(_ends_at_once(task.build_model()), "val")
    assert set(captions[0].values()) == {""}
    assert all(c != "" for c in captions[1].values())


# -- words kept after truncation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["pcl", "pcl_birds"])
def test_paper_keeps_max_len_minus_3_words_and_cpu_smoke_max_len_minus_2(family):
    assert load_config(family, "paper")["words_kept"] == "max_len - 3"
    for profile in ("cpu", "smoke"):
        assert load_config(family, profile)["words_kept"] == "max_len - 2", profile


LONG = " ".join(f"w{i}" for i in range(12))         # 12 words, more than a max_len of 10 keeps either way


def _long_data(words_kept: str):
    vocab = Vocab.build([LONG])
    store = FeatureStore(directory=Path("."), meta={}, index={"a.png": 0, "b.png": 1},
                         array=np.zeros((2, 4, 8), dtype=np.float16))
    records = {"train": [PairRecord("p0", "a.png", "b.png", (LONG, "w3 w1"), "color")]}
    data = pcl_data_from_records(records, store, max_len=10, vocab=vocab, words_kept=words_kept)
    data.negatives = {"p0": [LONG]}
    return data, vocab


def test_the_authors_truncation_keeps_max_len_minus_3_words_then_pads():
    data, v = _long_data("max_len - 3")
    w = [v.ids[f"w{i}"] for i in range(12)]
    # their padding(): sent[:max_len - 3] -> [BOS] + 7 words + [EOS], then [PAD] to max_len 10
    theirs = [v.bos_id, *w[:7], v.eos_id, v.pad_id]
    short = [v.bos_id, w[3], w[1], v.eos_id] + [v.pad_id] * 6
    assert data.splits["train"].sample_ids.tolist() == [theirs, short]
    assert data.negative_ids().tolist() == [[theirs]]        # FDA's negatives are truncated the same way
    kit, _ = _long_data("max_len - 2")
    assert kit.splits["train"].sample_ids[0].tolist() == [v.bos_id, *w[:8], v.eos_id]
    assert kit.negative_ids()[0, 0].tolist() == [v.bos_id, *w[:8], v.eos_id]


def test_an_unknown_truncation_is_refused():
    with pytest.raises(ConfigError, match="words_kept must be one of"):
        _long_data("max_len - 4")


def test_the_truncation_is_part_of_every_idc_pcl_run_key():
    data = SimpleNamespace(identity="x", version=1)
    keys = [Setup("paper", {"words_kept": kept}, data, Path(".")).identity for kept in ("max_len - 2", "max_len - 3")]
    assert keys[0]["words_kept"] == "max_len - 2" and keys[1]["words_kept"] == "max_len - 3"
    assert "words_kept" not in Setup("cpu", {}, data, Path(".")).identity      # families without the setting


# -- MLM's random replacement and a caption with no word chosen ------------------------------------------------------
@pytest.mark.parametrize("family, sections", [("pcl", ("pretrain", "finetune")),
                                              ("pcl_birds", ("gic", "pretrain", "finetune"))])
def test_paper_masks_as_the_authors_and_cpu_smoke_as_before(family, sections):
    for section in sections:
        paper = load_config(family, "paper")[section]
        assert (paper["mask_random_from"], paper["mask_none_chosen"]) == ("vocabulary", "first"), section
        for profile in ("cpu", "smoke"):
            c = load_config(family, profile)[section]
            assert (c["mask_random_from"], c["mask_none_chosen"]) == ("words", "smallest"), (section, profile)


TWELVE = Vocab.build(["w0 w1 w2 w3"])              # ids 0-7 the specials ([MASK] 4, [IMG1] 5, [IMG2] 6), 8-11 words


@pytest.mark.parametrize("random_from, special_tokens, expected", [
    ("words", "shared_cls", {9, 10, 11}),
    ("vocabulary", "distinct", {0, 1, 2, 3, 5, 6, 7, 9, 10, 11}),
    ("vocabulary", "shared_cls", {0, 1, 2, 3, 7, 9, 10, 11}),       # a shared_cls model has no [IMG1]/[IMG2] word
])
def test_the_ids_a_random_replacement_can_take(random_from, special_tokens, expected):
    ids = torch.tensor([[1] + [8] * 10 + [2]] * 2000)      # every word is id 8; p=1 chooses each
    out, labels = mask_tokens(ids, TWELVE, torch.Generator().manual_seed(0), p=1.0, eos_p=0.0,
                              random_ids=replacement_ids(TWELVE, random_from, special_tokens))
    assert (labels[:, 1:11] == 8).all()
    # the replaced words other than [MASK] and a draw of 8 itself: every candidate id, and nothing else
    assert set(out[:, 1:11][(out[:, 1:11] != 8) & (out[:, 1:11] != 4)].tolist()) == expected


def test_a_caption_with_no_word_chosen_masks_its_first_word_at_first():
    ids = torch.tensor([[1, 9, 10, 11, 2, 0]] * 400)
    out, labels = mask_tokens(ids, TWELVE, torch.Generator().manual_seed(0), p=0.0, eos_p=0.0, none_chosen="first")
    assert out.tolist() == [[1, 4, 10, 11, 2, 0]] * 400
    assert labels.tolist() == [[-100, 9, -100, -100, -100, -100]] * 400
    out, labels = mask_tokens(ids, TWELVE, torch.Generator().manual_seed(0), p=0.0, eos_p=0.0)
    picked = (labels != -100).int().argmax(1)
    assert set(picked.tolist()) == {1, 2, 3}                    # the kit's: the word with the smallest draw
    assert (labels != -100).sum(1).tolist() == [1] * 400
    assert set(out[torch.arange(400), picked].tolist()) - {4, 9, 10, 11}     # 80/10/10: some random words


def test_an_unknown_masking_rule_is_refused():
    with pytest.raises(ConfigError, match="mask_random_from must be one of words, vocabulary"):
        replacement_ids(TWELVE, "specials", "distinct")
    with pytest.raises(ConfigError, match="mask_none_chosen must be one of smallest, first"):
        FinetuneTask(worker.tiny_pcl_data(), worker.MODEL, mask_none_chosen="last", **FINETUNE)


@pytest.mark.parametrize("make", ["pretrain", "finetune"])
def test_the_tasks_batches_mask_with_their_settings(make):
    data = worker.tiny_pcl_data()
    v = data.vocab

    def first_batch(none_chosen, random_from):
        kw = {"mask_none_chosen": none_chosen, "mask_random_from": random_from}
        if make == "pretrain":
            task = PretrainTask(data, worker.MODEL, batch_size=40, ratios={"mlm": 1}, **{**worker.PRETRAIN,
                                "mask_prob": 0.0, "eos_prob": 0.0}, **kw)
        else:
            task = FinetuneTask(data, worker.MODEL, **{**FINETUNE, "batch_size": 40, "mask_prob": 0.0, "eos_prob": 0.0},
                                **kw)
        return task, next(iter(task.batches(0, torch.Generator().manual_seed(0))))

    task, batch = first_batch("first", "vocabulary")
    assert (batch["text"][:, 1] == v.mask_id).all() and (batch["labels"][:, 2:] == -100).all()
    assert torch.equal(task.masking["random_ids"], torch.arange(len(v)))       # distinct specials: every id
    task, batch = first_batch("smallest", "words")
    assert not (batch["labels"][:, 1] != -100).all() and task.masking["random_ids"] is None


# -- pre-training's FDA positives and data order -------------------------------------------------------------------
@pytest.mark.parametrize("family, sections", [("pcl", ("pretrain",)), ("pcl_birds", ("gic", "pretrain"))])
def test_paper_samples_pre_training_as_the_authors_and_cpu_smoke_as_before(family, sections):
    for section in sections:
        paper = load_config(family, "paper")[section]
        assert (paper["fda_samples"], paper["sampling"]) == ("captions", "epochs"), section
        for profile in ("cpu", "smoke"):
            c = load_config(family, profile)[section]
            assert (c["fda_samples"], c["sampling"]) == ("pairs", "fresh"), (section, profile)


def _pretrain(ratios, batch_size, **kw):
    data = worker.tiny_pcl_data()                    # 24 train pairs x 2 captions = 48 samples; 2 negatives a pair
    task = PretrainTask(data, worker.MODEL, batch_size=batch_size, ratios=ratios, **worker.PRETRAIN, **kw)
    return data.splits["train"], task.batches(0, torch.Generator().manual_seed(0))


def _samples(train, pairs, texts) -> list[tuple]:
    return sorted((int(p), tuple(t.tolist())) for p, t in zip(pairs, texts))


def test_epochs_walk_every_sample_once_then_reshuffle_with_a_short_last_batch():
    train, batches = _pretrain({"mvcl": 1}, 10, sampling="epochs")
    first = [next(batches) for _ in range(5)]
    assert [len(b["pairs"]) for b in first] == [10, 10, 10, 10, 8]         # 48 samples: 4 full batches and 8
    everyone = _samples(train, train.sample_pair, train.sample_ids)
    assert _samples(train, torch.cat([b["pairs"] for b in first]), torch.cat([b["text"] for b in first])) == everyone
    assert len(next(batches)["pairs"]) == 10                                # a new epoch, reshuffled
    train, fresh = _pretrain({"mvcl": 1}, 10)
    assert [len(b["pairs"]) for b in fresh] == [10] * 4                     # the kit's: 48 // 10 fresh subsets


def test_each_task_walks_its_own_epochs():
    train, batches = _pretrain({"mvcl": 1, "mlm": 1}, 10, sampling="epochs")
    mvcl = []
    while len(mvcl) < 5:
        b = next(batches)
        if b["task"] == "mvcl":
            mvcl.append(b)
    assert [len(b["pairs"]) for b in mvcl] == [10, 10, 10, 10, 8]
    assert _samples(train, torch.cat([b["pairs"] for b in mvcl]), torch.cat([b["text"] for b in mvcl])) == \
        _samples(train, train.sample_pair, train.sample_ids)


def test_fda_positives_are_every_caption_or_one_per_pair():
    # batch 12 = 4 groups of (positive + 2 negatives); an epoch of "captions" is 48 / 4 = 12 steps
    train, batches = _pretrain({"fda": 1}, 12, sampling="epochs", fda_samples="captions")
    steps = [next(batches) for _ in range(12)]
    pos_pairs = torch.cat([b["pairs"][::3] for b in steps])
    pos_texts = torch.cat([b["text"][::3] for b in steps])
    assert _samples(train, pos_pairs, pos_texts) == _samples(train, train.sample_pair, train.sample_ids)
    # "pairs": an epoch is 24 / 4 = 6 steps, every pair once with one of its own references
    train, batches = _pretrain({"fda": 1}, 12, sampling="epochs", fda_samples="pairs")
    steps = [next(batches) for _ in range(6)]
    pos_pairs = torch.cat([b["pairs"][::3] for b in steps])
    assert sorted(pos_pairs.tolist()) == list(range(24))
    own = {(int(p), tuple(t.tolist())) for p, t in zip(train.sample_pair, train.sample_ids)}
    assert all((int(p), tuple(t.tolist())) in own for b in steps for p, t in zip(b["pairs"][::3], b["text"][::3]))


def test_an_unknown_sampling_rule_is_refused():
    with pytest.raises(ConfigError, match="fda_samples must be one of pairs, captions"):
        _pretrain({"fda": 1}, 12, fda_samples="references")
    with pytest.raises(ConfigError, match="sampling must be one of fresh, epochs"):
        _pretrain({"fda": 1}, 12, sampling="shuffle")


# -- the gradient's scale ----------------------------------------------------------------------------------------
def test_paper_adapts_with_the_authors_2_gpu_gradient_and_every_other_stage_with_the_losss():
    def scale(name, profile):
        return train_config(load_config(name, profile)["train"], steps_per_epoch=10).gradient_scale

    assert scale("clip4idc_adapt", "paper") == 0.5
    assert scale("clip4idc_adapt", "cpu") == scale("clip4idc_adapt", "smoke") == 1.0
    assert scale("clip4idc_caption", "paper") == 1.0
    for family in ("pcl", "pcl_birds"):
        for section in ("pretrain", "finetune"):
            assert train_config(load_config(family, "paper")[section]["train"]).gradient_scale == 1.0


class _Linear:
    """loss = sum(w . x): its gradient is x, whatever w is."""

    selection_metric = None
    x = torch.tensor([[3.0, -4.0]])

    def __init__(self):
        self.grads = []

    def build_model(self):
        model = torch.nn.Linear(2, 1, bias=False)
        model.weight.register_hook(lambda g: self.grads.append(g.clone()))     # what the backward gives w
        return model

    def param_groups(self, model):
        return [{"params": list(model.parameters())}]

    def batches(self, epoch, generator):
        yield 0

    def train_step(self, model, batch, step):
        loss = model(self.x).sum()
        return loss, {}

    def evaluate(self, model, split="val"):
        return {}


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_the_loop_backpropagates_the_scaled_loss_and_logs_the_loss(tmp_path, scale):
    torch.manual_seed(0)
    cfg = train_config({"max_steps": 1, "lr": 1e-3, "gradient_scale": scale, "log_every": 1})
    task = _Linear()
    fit(task, cfg, tmp_path / "run", progress=False)
    assert [g.tolist() for g in task.grads] == [[[3.0 * scale, -4.0 * scale]]]   # scale x the loss's gradient x
    torch.manual_seed(0)
    w = _Linear().build_model().weight.detach()                                 # the same initial weights
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert_close(logged[0]["loss"], float((w * _Linear.x).sum()), rtol=1e-6)     # the loss, unscaled


def test_a_non_positive_gradient_scale_is_refused():
    for bad in (0.0, -1.0, True):
        with pytest.raises(ConfigError, match="gradient_scale must be a number > 0"):
            train_config({"max_steps": 1, "lr": 1e-3, "gradient_scale": bad})


# -- CLIP4IDC's caption length ---------------------------------------------------------------------------------------
def test_the_paper_captioner_the_released_import_and_the_paper_run_share_the_authors_caption_length():
    from idckit.authors.released import _released_settings
    from idckit.experiments.config import model_config

    paper = load_config("clip4idc_caption", "paper")
    # theirs: max_words 32 keeps 31 words, decoded in 32 steps; the kit's length counts SOT and EOT: 33
    assert paper["caption_max_len"] == 33
    assert model_config("clip4idc-paper").max_len == 33
    assert _released_settings("clip4idc-caption")["max_len"] == 33
    for profile in ("cpu", "smoke"):           # caption_max_len null: the adaptation's max_len, as before
        assert load_config("clip4idc_caption", profile)["caption_max_len"] is None
        assert model_config(f"clip4idc-{profile}").max_len == load_config("clip4idc_caption", profile)["max_len"]


# -- BERT schedules' warm-up fraction ----------------------------------------------------------------------------
def test_bert_schedules_warm_up_over_the_exact_fraction_as_the_authors():
    """Their warmup_linear / warmup_cosine compare x = step / total with the fraction 0.1 itself
    (modules/optimization.py:26-43 in sushizixin/CLIP4IDC); at 25 steps the warm-up ends at 2.5 steps, so step 2
    is still warming up at 2 / 2.5 = 0.8 (rounding to 2 whole steps would put it in the decay, at 0.9783)."""
    from idckit.train.schedules import lr_factor

    for schedule, after in (("warmup_linear_bert", (1 - 3 / 25) / 0.9), ("warmup_cosine_bert", None)):
        cfg = train_config({"schedule": schedule, "lr": 1e-4, "max_steps": 25, "warmup_fraction": 0.1})
        assert cfg.warmup_steps == pytest.approx(2.5)
        f = lr_factor(cfg.schedule, max_steps=cfg.max_steps, warmup_steps=cfg.warmup_steps)
        assert [f(0), f(1), f(2)] == pytest.approx([0.0, 0.4, 0.8])
        if after is not None:
            assert f(3) == pytest.approx(after)
    # the kit's own schedules keep whole warm-up steps
    assert train_config({"schedule": "warmup_cosine", "lr": 1e-4, "max_steps": 25,
                         "warmup_fraction": 0.1}).warmup_steps == 2
