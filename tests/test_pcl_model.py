"""IDC-PCL model: layouts, masks, the difference-encoder switch, heads, cached decoding, masking utilities."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from idckit.errors import ConfigError
from idckit.experiments.config import load_config, model_config
from idckit.models.decoding import beam_search, greedy_decode, naive_greedy_decode
from idckit.models.pcl import PCL, SWITCHES, PCLConfig, mask_regions, mask_tokens
from idckit.text.vocab import Vocab
from numeric import assert_close, assert_differ

VOCAB = Vocab.build(["the red cube changed to blue", "the small sphere has been added",
                     "no change was made", "the big rubber cylinder is missing"])
N, F_DIM, D = 5, 12, 32


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matmuls on a shared 2-core machine: one thread avoids OpenMP barrier stalls
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: the kit's switches (the cpu profile's); the public code's (the paper profile's) are tests/test_parity_pcl.py's
KIT_SWITCHES = {k: load_config("pcl", "cpu")["model"][k] for k in SWITCHES}


def pcl_config(**fields) -> PCLConfig:
    """``pcl-paper`` (the paper's sizes) with the kit's switches on an EfficientNet-Lite0 7x7 grid unless
    ``fields`` say otherwise."""
    return model_config("pcl-paper", **{"feat_dim": 1280, "n_regions": 49, **KIT_SWITCHES, **fields})


def tiny(seed=0, **kw) -> PCL:
    """A small model in eval mode whose outputs depend strongly on its inputs (weights at 1/sqrt(fan_in) instead
    of 0.02, so decoded captions differ between pairs and a mix-up of batch rows would show)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=len(VOCAB), feat_dim=F_DIM, n_regions=N, d_model=D, n_heads=4, d_ff=64, n_layers=2,
               dropout=0.0, max_text_len=12)
    m = PCL(pcl_config(**{**cfg, **kw}), VOCAB)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and "word" not in name:
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
    return m.eval()


def feats(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, N, F_DIM, generator=g), torch.randn(b, N, F_DIM, generator=g)


def text(b=3):
    return VOCAB.encode_batch(["the red cube changed to blue", "no change was made", "the small sphere"][:b], 10)


# -- layouts, config ------------------------------------------------------------------------------------------
def test_shapes_in_both_modes():
    m, (f1, f2), t = tiny(), feats(), text()
    pre = m(f1, f2, t, mode="pretrain")
    assert pre.visual.shape == (3, 2 + 2 * N, D) and pre.cls.shape == (3, D) and pre.text.shape == (3, 10, D)
    assert torch.equal(pre.img1, pre.visual[:, 0]) and torch.equal(pre.img2, pre.visual[:, 1 + N])
    ft = m(f1, f2, t, mode="finetune")
    assert ft.cls is None and ft.text.shape == (3, 10, D) and ft.visual.shape == (3, 2 + 2 * N, D)
    assert m.mlm_logits(ft.text).shape == (3, 10, len(VOCAB))
    assert m.mvcl_regress(pre.visual).shape == (3, 2 + 2 * N, F_DIM)
    assert m.judge_logits(ft).shape == (3, 2)
    with pytest.raises(ConfigError, match="mode"):
        m(f1, f2, t, mode="decode")
    with pytest.raises(ConfigError, match="features must be"):
        m(f1[:, :2], f2[:, :2], t)
    with pytest.raises(ConfigError, match="region_mask"):
        m(f1, f2, t, region_mask=torch.zeros(3, N, dtype=torch.bool))


def test_config_validation_and_vocab_ids_as_a_dict():
    cfg = pcl_config(vocab_size=len(VOCAB), feat_dim=F_DIM, n_regions=N, d_model=D, n_heads=4, d_ff=64)
    with pytest.raises(ConfigError, match="layers"):
        pcl_config(vocab_size=10, layers=3)
    with pytest.raises(ConfigError, match="divisible"):
        pcl_config(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="visual_activation"):
        pcl_config(vocab_size=10, visual_activation="relu")
    ids = {"pad": 0, "bos": 1, "eos": 2, "mask": 4, "img1": 5, "img2": 6, "cls": 7}
    torch.manual_seed(0)
    a = PCL(cfg, ids)
    torch.manual_seed(0)
    b = PCL(cfg, VOCAB)
    assert (a.mask_id, a.cls_id) == (4, 7) and all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ConfigError, match="vocab_size"):
        PCL(pcl_config(vocab_size=5, feat_dim=F_DIM, n_regions=N, d_model=D, n_heads=4, d_ff=64), VOCAB)


# -- masks ----------------------------------------------------------------------------------------------------
def test_finetune_mask_matches_a_hand_built_one():
    m, t = tiny(), text()
    nv = 2 + 2 * N
    got = m._finetune_mask(nv, t)[:, 0]
    for b in range(3):
        for i in range(nv + 10):
            for j in range(nv + 10):
                if i < nv:
                    want = j < nv                                           # visual rows: visual keys only
                else:
                    want = j < nv or (j <= i and t[b, j - nv] != VOCAB.pad_id)   # text rows: causal, never PAD
                assert bool(got[b, i, j]) == want, (b, i, j)


def test_finetune_mask_is_unidirectional():
    m, (f1, f2), t = tiny(), feats(), text()
    base = m(f1, f2, t, mode="finetune")
    later = t.clone()
    later[0, 4] = VOCAB.ids["sphere"]                  # change the 5th token of caption 0
    out = m(f1, f2, later, mode="finetune")
    assert_close(out.visual, base.visual)     # visual tokens never see text
    assert_close(out.text[0, :4], base.text[0, :4])   # earlier text unaffected
    assert_differ(out.text[0, 4:], base.text[0, 4:], rtol=1e-3)
    assert_close(out.text[1:], base.text[1:])          # other captions unaffected


@pytest.mark.parametrize("mode", ["pretrain", "finetune"])
def test_padding_never_reaches_real_tokens(mode):
    m, (f1, f2), t = tiny(), feats(), text()
    base = m(f1, f2, t, mode=mode)
    real = t != VOCAB.pad_id
    with torch.no_grad():                               # whatever a [PAD] embeds to, nothing else changes
        m.word.weight[VOCAB.pad_id] += 3.0 * torch.randn(D)  # (not a constant: LayerNorm removes it)
    out = m(f1, f2, t, mode=mode)
    assert_close(out.visual, base.visual)
    assert_close(out.text[real], base.text[real])
    assert_differ(out.text[~real], base.text[~real], rtol=1e-3)   # the PAD rows themselves do change
    # and neither does padding further: 4 more [PAD] columns
    longer = m(f1, f2, torch.cat([t, torch.full((3, 4), VOCAB.pad_id)], 1), mode=mode)
    assert_close(longer.visual, base.visual)
    assert_close(longer.text[:, :10][real], base.text[real])


def test_pretraining_attention_is_bidirectional():
    m, (f1, f2), t = tiny(), feats(), text()
    base = m(f1, f2, t, mode="pretrain")
    other = t.clone()
    other[0, 3] = VOCAB.ids["sphere"]
    out = m(f1, f2, other, mode="pretrain")
    assert_differ(out.visual[0], base.visual[0], rtol=1e-4)    # text reaches the images
    assert_differ(out.text[0, :3], base.text[0, :3], rtol=1e-4)  # and earlier words
    assert_differ(out.cls[0], base.cls[0], rtol=1e-4)
    assert_close(out.visual[1:], base.visual[1:])       # only within its own sample


# -- the image difference encoder -------------------------------------------------------------------------------
def test_difference_encoder_switch():
    with_de, without = tiny(), tiny(difference_encoder=False)
    n_block = sum(p.numel() for p in with_de.cross[0].parameters())
    n_with, n_without = (sum(p.numel() for p in m.parameters()) for m in (with_de, without))
    assert n_with - n_without == 2 * n_block                  # one single-image + one pair-image block
    f1, f2 = feats()
    assert without(f1, f2, text(), mode="finetune").text.shape == (3, 10, D)
    assert greedy_decode(without, (f1, f2), 4).shape[0] == 3
    # without the encoder, image 1's tokens know nothing of image 2 before the cross-modal stage
    v, v2 = without.encode_visual(f1, f2), without.encode_visual(f1, f2 + 1)
    assert_close(v[:, :1 + N], v2[:, :1 + N])
    assert_differ(v[:, 1 + N:], v2[:, 1 + N:])
    w, w2 = with_de.encode_visual(f1, f2), with_de.encode_visual(f1, f2 + 1)
    assert_differ(w[:, :1 + N], w2[:, :1 + N], rtol=1e-4)          # the pair encoder mixes them


def test_single_image_encoder_sees_each_image_alone():
    m = tiny(single_layers=1, pair_layers=0)
    f1, f2 = feats()
    v, v2 = m.encode_visual(f1, f2), m.encode_visual(f1, f2 + 1)
    assert_close(v[:, :1 + N], v2[:, :1 + N])
    assert_differ(v[:, 1 + N:], v2[:, 1 + N:], rtol=1e-4)
    # one set of weights for both images: 1 block, not 2
    assert sum(p.numel() for p in m.single.parameters()) == sum(p.numel() for p in m.cross[0].parameters())


def test_region_mask_zeroes_raw_features_before_the_projection():
    for act in ("none", "sigmoid"):
        m, (f1, f2), t = tiny(visual_activation=act), feats(), text()
        rm = mask_regions(3, N, torch.Generator().manual_seed(0))
        masked = m(f1, f2, t, region_mask=rm)
        zeroed = m(f1.masked_fill(rm[:, 0, :, None], 0), f2.masked_fill(rm[:, 1, :, None], 0), t)
        assert_close(masked.visual, zeroed.visual)
        assert_differ(masked.visual, m(f1, f2, t).visual, rtol=1e-4)


# -- heads ------------------------------------------------------------------------------------------------------
def test_heads():
    m, (f1, f2), t = tiny(), feats(), text()
    pre = m(f1, f2, t, mode="pretrain")
    want = F.cosine_similarity((pre.visual[:, 0] + pre.visual[:, 1 + N]) / 2, pre.cls, dim=-1)
    assert_close(m.fda_similarity(pre), want)
    assert_close(m.judge_logits(pre), m.judge(torch.cat([pre.visual[:, 0], pre.visual[:, 1 + N]], 1)))
    with pytest.raises(ConfigError, match="pre-training layout"):
        m.fda_similarity(m(f1, f2, t, mode="finetune"))
    with pytest.raises(ConfigError, match="distractor_head=False"):
        tiny(distractor_head=False).judge_logits(pre)
    assert not hasattr(tiny(distractor_head=False), "judge")


def test_load_pretrained_reports_what_it_skipped():
    src, dst = tiny(seed=1, distractor_head=False), tiny(seed=2)
    state = src.state_dict()
    state["extra.weight"] = torch.zeros(2)
    state["mlm_head.weight"] = torch.zeros(3, D)        # wrong shape
    report = dst.load_pretrained(state)
    assert report["missing"] == ["judge.bias", "judge.weight"]
    assert report["unexpected"] == ["extra.weight"] and report["mismatched"] == ["mlm_head.weight"]
    assert torch.equal(dst.cross[0].attn.qkv.weight, src.cross[0].attn.qkv.weight)
    assert not torch.equal(dst.mlm_head.weight, src.mlm_head.weight)
    assert "pe" not in dst.state_dict()                # the positional table is rebuilt, never loaded


def test_dropout_is_active_in_training_only():
    m, (f1, f2), t = tiny(dropout=0.2), feats(), text()
    m.train()
    a, b = m(f1, f2, t).text, m(f1, f2, t).text
    assert_differ(a, b)
    m.eval()
    assert torch.equal(m(f1, f2, t).text, m(f1, f2, t).text)


# -- generation -------------------------------------------------------------------------------------------------
def suppress_eos(m: PCL) -> PCL:
    with torch.no_grad():  # decode long enough to exercise the cache (and its growth past max_text_len)
        m.mlm_head.bias[VOCAB.eos_id] = -30.0
    return m


@pytest.mark.parametrize("batch", [1, 3])
def test_cached_greedy_equals_naive_greedy(batch):
    m = suppress_eos(tiny())
    visual = feats(batch, seed=4)
    cached = greedy_decode(m, visual, 15)                # 15 > max_text_len 12: the cache grows
    naive = naive_greedy_decode(m, visual, 15)
    assert cached.shape == (batch, 15) and torch.equal(cached, naive)
    assert torch.equal(beam_search(m, visual, 15, 1), cached)
    if batch > 1:
        assert len({tuple(r) for r in cached.tolist()}) > 1   # the pairs get different captions


def test_greedy_stops_at_eos_and_pads_finished_rows():
    m = tiny()
    visual = feats(3, seed=4)
    with torch.no_grad():                                  # row 0 emits EOS first, then everyone
        m.mlm_head.bias[VOCAB.eos_id] = 0.0
    cached, naive = greedy_decode(m, visual, 30), naive_greedy_decode(m, visual, 30)
    assert torch.equal(cached, naive)
    for row in cached.tolist():
        if VOCAB.eos_id in row:
            assert set(row[row.index(VOCAB.eos_id) + 1:]) <= {VOCAB.pad_id}


def test_decode_step_equals_full_logits_at_every_position():
    m = tiny()
    visual = feats(3, seed=5)
    g = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.full((3, 1), VOCAB.bos_id), torch.randint(8, len(VOCAB), (3, 9), generator=g)], 1)
    with torch.inference_mode():
        full = m.full_logits(visual, ids, every_step=True)                   # [3, 10, V]
        state = m.start_decoding(visual)
        steps = torch.stack([m.decode_step(state, ids[:, i]) for i in range(ids.shape[1])], 1)
        last = m.full_logits(visual, ids)                                     # the paper's input, [3, 1, V]
        # and the plain fine-tuning forward on [ids, MASK]
        plain = m.mlm_logits(m(*visual, torch.cat([ids, torch.full((3, 1), VOCAB.mask_id)], 1), mode="finetune")
                             .text[:, -1])
    assert full.shape == (3, 10, len(VOCAB)) and last.shape == (3, 1, len(VOCAB))
    assert_close(steps, full)
    assert_close(last[:, 0], steps[:, -1])
    assert_close(plain, last[:, 0])


def test_reorder_state_follows_the_index():
    m = tiny()
    visual = feats(3, seed=6)
    ids = VOCAB.encode_batch(["the red cube changed", "no change was made", "the small sphere has"], 6)[:, :5]
    index = torch.tensor([2, 0, 0, 1])
    with torch.inference_mode():
        state = m.start_decoding(visual)
        for i in range(3):
            m.decode_step(state, ids[:, i])
        state = m.reorder_state(state, index)
        got = torch.stack([m.decode_step(state, ids[index, i]) for i in (3, 4)], 1)
        want = m.full_logits(tuple(v[index] for v in visual), ids[index], every_step=True)[:, 3:]
    assert_close(got, want)


def test_beam_search_is_batch_independent():
    m = suppress_eos(tiny())
    with torch.no_grad():
        m.mlm_head.bias[VOCAB.eos_id] = -2.0
    visual = feats(3, seed=7)
    together = beam_search(m, visual, 8, 3)
    for i in range(3):
        alone = beam_search(m, tuple(v[i:i + 1] for v in visual), 8, 3)
        assert torch.equal(alone[0], together[i, :alone.shape[1]])


# -- masking utilities ------------------------------------------------------------------------------------------
def test_mask_tokens_statistics_and_rules():
    ids = VOCAB.encode_batch(["the red cube changed to blue", "no change"] * 3000, 10)
    g = torch.Generator().manual_seed(0)
    inp, lab = mask_tokens(ids, VOCAB, g)
    words = ids >= VOCAB.n_special
    chosen = (lab != -100) & words
    assert torch.equal(lab[chosen], ids[chosen])
    # 15 % of the words, plus the forced word when none was drawn: P(none of n) = 0.85**n, spread over n words
    want = (0.15 * 6 + 0.85 ** 6 + 0.15 * 2 + 0.85 ** 2) / 8
    assert abs(chosen.sum() / words.sum() - want) < 0.01
    assert bool(chosen.any(1).all())                                  # at least one word per caption
    as_mask = (inp == VOCAB.mask_id) & chosen
    random = (inp != ids) & (inp != VOCAB.mask_id) & chosen
    unchanged = (inp == ids) & chosen
    assert 0.77 < as_mask.sum() / chosen.sum() < 0.83
    assert 0.08 < random.sum() / chosen.sum() < 0.12
    assert 0.08 < unchanged.sum() / chosen.sum() < 0.12              # 10 % kept (+ random draws of the same word)
    assert bool((inp[random] >= VOCAB.n_special).all())              # random words are never specials
    assert bool((inp[~chosen & words] == ids[~chosen & words]).all())
    assert bool((inp[:, 0] == VOCAB.bos_id).all()) and bool((lab[:, 0] == -100).all())   # BOS never
    pad = ids == VOCAB.pad_id
    assert bool((inp[pad] == VOCAB.pad_id).all()) and bool((lab[pad] == -100).all())     # PAD never
    eos = ids == VOCAB.eos_id
    eos_masked = eos & (lab == VOCAB.eos_id)
    assert 0.13 < eos_masked.sum() / eos.sum() < 0.17 and bool((inp[eos_masked] == VOCAB.mask_id).all())
    assert bool((inp[eos & ~eos_masked] == VOCAB.eos_id).all()) and bool((lab[eos & ~eos_masked] == -100).all())
    again = mask_tokens(ids, VOCAB, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], inp) and torch.equal(again[1], lab)
    other = mask_tokens(ids, VOCAB, torch.Generator().manual_seed(1))
    assert not torch.equal(other[1], lab)
    assert torch.equal(ids, VOCAB.encode_batch(["the red cube changed to blue", "no change"] * 3000, 10))  # no in-place


def test_mask_tokens_unknown_words_count_as_words():
    ids = VOCAB.encode_batch(["zzz yyy"] * 50, 6)
    inp, lab = mask_tokens(ids, VOCAB, torch.Generator().manual_seed(0), p=1.0, eos_p=0.0)
    assert bool((lab[:, 1:3] == VOCAB.unk_id).all()) and bool((lab[:, 3:] == -100).all())


def test_mask_regions_masks_one_image_at_least_one_region():
    m = mask_regions(4000, 49, torch.Generator().manual_seed(0))
    assert m.shape == (4000, 2, 49) and m.dtype == torch.bool
    per_image = m.sum(2)
    assert bool(((per_image[:, 0] == 0) ^ (per_image[:, 1] == 0)).all())    # exactly one image per sample
    assert bool((per_image.sum(1) >= 1).all())
    assert abs(m.sum() / (4000 * 49) - (0.15 + 0.85 ** 49 / 49)) < 0.01
    assert 0.47 < (per_image[:, 1] > 0).float().mean() < 0.53
    assert torch.equal(m, mask_regions(4000, 49, torch.Generator().manual_seed(0)))
    few = mask_regions(500, 3, torch.Generator().manual_seed(1), p=0.0)
    assert bool((few.sum((1, 2)) == 1).all())                               # the at-least-one rule alone


# -- size -------------------------------------------------------------------------------------------------------
def test_paper_size_parameter_count():
    words = Vocab(list(VOCAB.words[:8]) + [f"w{i}" for i in range(72)])
    m = PCL(pcl_config(vocab_size=80, feat_dim=2048), words)
    n = sum(p.numel() for p in m.parameters())
    mvcl = sum(p.numel() for p in m.mvcl_head.parameters())
    print(f"IDC-PCL at the paper's CLEVR-Change size (V=80, feat 2048): {n / 1e6:.2f}M parameters, "
          f"{(n - mvcl) / 1e6:.2f}M without the MVCL head (public fine-tuning model: 16.90M)")
    # public fine-tuning model 16.90M = ours - MVCL head (1.31M, the public fine-tuning model has none)
    # - final LayerNorm (1,024) + the public 7th type row (512)
    assert n == 18_214_482
    assert abs((n - mvcl - 1024 + 512) / 1e6 - 16.90) < 0.005


def test_every_position_queries_see_what_generation_sees():
    """forward_grouped(queries=True): query i's output equals the fine-tuning forward on [BOS] w1 .. w(i-1) [MASK]
    read at the [MASK] (what greedy decoding computes at step i), for every position, [PAD] included; the clean
    rows are unchanged and the visual side does not see the queries."""
    m, (f1, f2), ids = tiny(), feats(), text()
    out = m.forward_grouped(f1, f2, ids[:, None], queries=True)
    length = ids.shape[1]
    assert out.text.shape == (3, length - 1, D)
    for i in range(1, length):
        prefix = torch.cat([ids[:, :i], torch.full((3, 1), VOCAB.mask_id)], 1)
        ref = m(f1, f2, prefix, mode="finetune").text[:, i]
        assert_close(out.text[:, i - 1], ref, what=f"position {i}")
    plain = m.forward_grouped(f1, f2, ids[:, None])
    assert_close(out.img1, plain.img1)
    assert_close(out.visual, plain.visual)
    # the greedy decoder's first token is the argmax of query 1 (a generation step, not only a forward); by default
    # over the words alone, since a caption has at least one word (decoding.MIN_WORDS)
    logits = m.mlm_logits(out.text[:, 0])
    assert torch.equal(greedy_decode(m, (f1, f2), 2, min_len=0)[:, 0], logits.argmax(-1))
    words = logits.index_fill(-1, torch.tensor([m.bos_id, m.eos_id, m.pad_id, *m.special_ids]), float("-inf"))
    assert torch.equal(greedy_decode(m, (f1, f2), 2)[:, 0], words.argmax(-1))


# -- the attention probe (idckit.eval.probe) -------------------------------------------------------------------
def test_attention_probe_is_uniform_by_hand_when_every_query_is_zero_and_leaves_the_model_as_it_was():
    from idckit.eval.probe import changed_regions, pcl_attention_on_change

    m, (f1, f2), t = tiny(), feats(), text()
    f2[:, 2] += 10.0                                       # region 2 moved most in every pair, then region 0 or 1...
    changed = changed_regions(f1, f2, k=1)
    assert changed.sum(1).tolist() == [1, 1, 1] and changed[:, 2].all()
    before = m.forward_grouped(f1, f2, t[:, None], queries=True).text
    for blk in [*m.single, *m.pair, *m.cross]:
        with torch.no_grad():
            blk.attn.qkv.weight[:D].zero_()
            blk.attn.qkv.bias[:D].zero_()                  # q = 0: every allowed key scores the same
    got = pcl_attention_on_change(m, f1, f2, t, changed)
    nv = 2 * N + 2
    assert_close(got["changed_share"], 2 / nv, rtol=1e-5)                 # float32 attention, float64 reference
    assert_close(got["pair"][0]["same_position"], [1 / nv] * 4, rtol=1e-5)
    assert_close(got["pair"][0]["same_position_changed"], [1 / nv] * 4, rtol=1e-5)
    # query i sees the nv visual keys, the clean non-[PAD] words before it and itself
    real = t[:, 1:] != VOCAB.pad_id
    n_words = (t != VOCAB.pad_id).long()
    vis = torch.stack([nv / (nv + n_words[:, :i + 1].sum(1) + 1) for i in range(t.shape[1] - 1)], 1)
    want = float(vis[real].mean())
    for layer in got["cross"]:
        assert_close(layer["visual"], [want] * 4, rtol=1e-5)
        assert_close(layer["changed_of_visual"], [2 / nv] * 4, rtol=1e-5)
        assert_close(layer["img_of_visual"], [2 / nv] * 4, rtol=1e-5)
    # the recording wrapper is gone and the forward is the model's own again
    assert not m.training and all("attend" not in vars(blk.attn) for blk in [*m.single, *m.pair, *m.cross])
    m2 = tiny()
    assert torch.equal(m2.forward_grouped(f1, f2, t[:, None], queries=True).text, before)


def test_attention_probe_pair_layer_equals_the_softmax_of_its_own_queries_and_keys():
    from idckit.eval.probe import changed_regions, pcl_attention_on_change

    m, (f1, f2), t = tiny(), feats(), text()
    changed = changed_regions(f1, f2, k=2)
    got = pcl_attention_on_change(m, f1, f2, t, changed)
    seen = {}
    hook = m.pair[0].ln1.register_forward_hook(lambda mod, inp, out: seen.setdefault("x", out))
    with torch.no_grad():
        m.encode_visual(f1, f2)
        q, k, _ = m.pair[0].attn.heads(seen["x"])
    hook.remove()
    p = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1)          # [B, h, nv, nv]
    same = torch.stack([p[:, :, N + 2 + i, 1 + i] for i in range(N)], -1)
    assert_close(got["pair"][0]["same_position"], same.mean((0, 2)).tolist(), rtol=1e-5)
    assert_close(got["pair"][0]["same_position_changed"], [float(same[:, h][changed].mean()) for h in range(4)],
                 rtol=1e-5)
    for layer in got["cross"]:                             # a random model: proper shares, not a uniform split
        assert all(0 < v < 1 for v in layer["visual"] + layer["changed_of_visual"] + layer["img_of_visual"])
