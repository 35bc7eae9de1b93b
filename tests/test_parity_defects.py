"""Defects the independent parity check found (issue 49, item 6), each pinned against the authors' recordings.

The converted IDC-PCL model is scored and decoded here through the kit's own paths (``mlm_logits`` in the kit's
vocabulary, the losses the tasks call, ``greedy_decode``), never through the authors' columns picked out of the
kit's logits (``[:, k_of_a]``, which tests/test_parity_pcl.py uses and which hides the kit's extra columns).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from idckit.losses import mlm_loss
from idckit.models.decoding import greedy_decode
from numeric import assert_close
from test_parity_pcl import kit_model, one_thread, recording  # noqa: F401  (the fixture runs on one thread)

RTOL = 1e-5


# -- the kit's [IMG1]/[IMG2] are no words of the authors' vocabulary ---------------------------------------------------
def test_converted_model_scores_captions_over_the_authors_vocabulary():
    """The caption cross-entropy of a converted checkpoint, in the kit's ids and through the kit's head, is the
    authors' per position (their <CLS> logit counted once, not three times as [IMG1], [IMG2] and [CLS])."""
    rec = recording("clver_finetune")
    model, k_of_a, _ = kit_model(rec)
    keep = rec["cap_label"] != -1
    with torch.no_grad():
        out = model(rec["f1"], rec["f2"], k_of_a[rec["cap"]], mode="finetune")
        logits = model.mlm_logits(out.text[keep])
    labels = k_of_a[rec["cap_label"][keep]]
    assert_close(F.cross_entropy(logits, labels, reduction="none"), rec["mlm_loss"], rtol=RTOL,
                 what="per-position caption cross-entropy, kit vs authors")
    assert_close(mlm_loss(logits, labels, "sum"), rec["mlm_loss"].sum(), rtol=RTOL)


def test_converted_model_decodes_the_authors_cls_as_cls():
    """Where the authors' model emits <CLS>, the kit's greedy decoding emits [CLS] (not [IMG1], the first of the
    three columns that hold the copied <CLS> row). Their <CLS> output bias is raised until it wins every step, so
    their greedy caption is <CLS> at every one of its max_len - 1 steps (their decoder bars nothing: min_len 0)."""
    rec = recording("clver_finetune")
    cls = rec["vocab"]["<CLS>"]
    state = dict(rec["state_dict"])
    state["output_layer.bias"] = state["output_layer.bias"].clone()
    state["output_layer.bias"][cls] += 1e3
    model, k_of_a, _ = kit_model({**rec, "state_dict": state})
    tokens = greedy_decode(model, (rec["f1"], rec["f2"]), rec["max_len"] - 1, min_len=0)
    assert tokens.tolist() == [[int(k_of_a[cls])] * (rec["max_len"] - 1)] * len(tokens)
    assert int(k_of_a[cls]) == model.cls_id


def test_converted_model_greedy_tokens_are_the_authors_in_kit_ids():
    """The recorded greedy captions, mapped word for word into the kit's ids, are what the kit decodes."""
    rec = recording("clver_finetune")
    model, k_of_a, _ = kit_model(rec)
    tokens = greedy_decode(model, (rec["f1"], rec["f2"]), rec["max_len"] - 1)
    eos = int(k_of_a[rec["vocab"]["<EOS>"]])
    want = k_of_a[rec["greedy"][:, 1:]].tolist()                      # their [BOS] first, then the words
    got = tokens.tolist()
    for g, w in zip(got, want):
        cut = w.index(eos) + 1 if eos in w else len(w)
        assert g[:cut] == w[:cut]


def test_distinct_special_tokens_keep_every_column():
    """The kit's own layout (cpu, smoke) has [IMG1]/[IMG2] words of its own: nothing is barred."""
    rec = recording("clver_finetune")
    model, k_of_a, _ = kit_model(rec, special_tokens="distinct")
    with torch.no_grad():
        out = model(rec["f1"], rec["f2"], k_of_a[rec["cap"]], mode="finetune")
        assert torch.isfinite(model.mlm_logits(out.text)).all()
    assert len(model.not_words) == 0


# -- special-token dropout: one mask per sample, as the authors ------------------------------------------------------
def test_special_token_dropout_is_drawn_per_sample_as_the_authors():
    """Their <CLS> id is repeated over the batch before it is embedded and dropped out (clver/modules_finetune.py
    49-53, modules_pretrain.py 53-58 at 6f3aabf), so each sample has its own mask; the kit's [IMG1] in training mode
    too (docs/parity.md once said theirs was drawn once per batch)."""
    from idckit.models.pcl import T_IMG1

    rec = recording("clver_finetune")
    model, _, _ = kit_model(rec)
    model.train()
    torch.manual_seed(0)
    x = model._special(model.img1_id, T_IMG1, 64)[:, 0]
    dropped = x == 0
    assert len({tuple(r) for r in dropped.tolist()}) > 1            # not one mask shared by the batch
    assert_close(dropped.float().mean(), torch.tensor(model.cfg.dropout), rtol=0.2)


# -- decoded specials: words at paper, as the authors' transform writes them --------------------------------------------
def test_paper_predictions_keep_a_decoded_special_as_a_word_cpu_drops_it():
    """``special_words`` is "keep" at pcl-paper and pcl-birds-paper (the authors' decoding) and "drop" at cpu and
    smoke; the fine-tuning task's captions follow it. A model whose [UNK] wins every step after the first word
    writes "<word> [UNK] [UNK] .." at paper and "<word>" at cpu."""
    from ddp_worker import tiny_pcl_data
    from idckit.experiments.config import model_config
    from idckit.models.pcl import PCL
    from idckit.tasks.pcl import predict

    sizes = dict(vocab_size=20, feat_dim=12, n_regions=4)
    for family in ("pcl", "pcl-birds"):
        assert model_config(f"{family}-paper", **sizes).special_words == "keep"
        for profile in ("cpu", "smoke"):
            assert model_config(f"{family}-{profile}", **sizes).special_words == "drop"
    data = tiny_pcl_data()
    s = data.splits["val"]
    out = {}
    for words in ("keep", "drop"):
        cfg = model_config("pcl-paper", vocab_size=len(data.vocab), feat_dim=data.feat_dim,
                           n_regions=data.features.shape[1], max_text_len=data.max_len, d_model=32, n_heads=2,
                           d_ff=64, n_layers=1, special_words=words)
        torch.manual_seed(0)
        model = PCL(cfg, data.vocab).eval()
        with torch.no_grad():
            model.mlm_head.bias[data.vocab.unk_id] += 1e3
        out[words] = predict(model, data, "val", batch_size=len(s))["captions"]
    n_steps = data.max_len - 1
    for pair in s.pair_ids:
        first, *rest = out["keep"][pair].split()
        assert first not in data.vocab.words[:data.vocab.n_special] and rest == ["[UNK]"] * (n_steps - 1)
        assert out["drop"][pair] == first
