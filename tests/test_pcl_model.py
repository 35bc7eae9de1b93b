"""IDC-PCL model: layouts, masks, the difference-encoder switch, cached decoding, masking utilities."""
from __future__ import annotations

import pytest
import torch

from idckit.errors import ConfigError
from idckit.models.decoding import beam_search, greedy_decode, naive_greedy_decode
from idckit.models.pcl import PCL, PCLConfig, mask_regions, mask_tokens
from idckit.text.vocab import Vocab

VOCAB = Vocab.build(["the red cube changed to blue", "the small sphere has been added",
                     "no change was made", "the big rubber cylinder is missing"])
N, F_DIM = 5, 12


def tiny(**kw) -> PCL:
    torch.manual_seed(0)
    cfg = PCLConfig(vocab_size=len(VOCAB), feat_dim=F_DIM, n_regions=N, d_model=32, n_heads=4, d_ff=64,
                    n_layers=2, dropout=0.0, max_text_len=12, **kw)
    return PCL(cfg, VOCAB).eval()


def feats(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, N, F_DIM, generator=g), torch.randn(b, N, F_DIM, generator=g)


def text(b=3):
    return VOCAB.encode_batch(["the red cube changed to blue", "no change was made", "the small sphere"][:b], 10)


def test_shapes_in_both_modes():
    m, (f1, f2), t = tiny(), feats(), text()
    pre = m(f1, f2, t, mode="pretrain")
    assert pre.visual.shape == (3, 2 + 2 * N, 32) and pre.cls.shape == (3, 32) and pre.text.shape == (3, 10, 32)
    ft = m(f1, f2, t, mode="finetune")
    assert ft.cls is None and ft.text.shape == (3, 10, 32)
    assert m.mlm_logits(ft.text).shape == (3, 10, len(VOCAB))
    assert m.distractor_logits(ft).shape == (3, 2)
    assert m.fda_similarity(pre).shape == (3,) and bool((m.fda_similarity(pre).abs() <= 1 + 1e-6).all())
    assert m.mvcl_regress(pre.visual).shape == (3, 2 + 2 * N, F_DIM)
    with pytest.raises(ConfigError, match="pre-training layout"):
        m.fda_similarity(ft)
    with pytest.raises(ConfigError, match="features must be"):
        m(f1[:, :2], f2[:, :2], t)


def test_finetune_mask_is_unidirectional_and_ignores_padding():
    m, (f1, f2), t = tiny(), feats(), text()
    base = m(f1, f2, t, mode="finetune")
    later = t.clone()
    later[0, 4] = VOCAB.ids["sphere"]                  # change the 5th token of caption 0
    out = m(f1, f2, later, mode="finetune")
    assert torch.allclose(out.visual, base.visual)     # visual tokens never see text
    assert torch.allclose(out.text[0, :4], base.text[0, :4], atol=1e-6)   # earlier text unaffected
    assert not torch.allclose(out.text[0, 4:], base.text[0, 4:])
    padded = t.clone()
    pad_pos = (t[2] == VOCAB.pad_id).nonzero()[0, 0]
    padded[2, pad_pos:] = VOCAB.ids["red"]              # garbage where there was padding...
    padded[2, pad_pos:] = VOCAB.pad_id                  # ...then padding again with a different batch-mate
    out = m(f1, f2, padded, mode="finetune")
    assert torch.allclose(out.text[2, :pad_pos], base.text[2, :pad_pos], atol=1e-6)


def test_padding_is_masked_in_pretraining_and_attention_is_bidirectional():
    m, (f1, f2), t = tiny(), feats(), text()
    base = m(f1, f2, t, mode="pretrain")
    other = t.clone()
    other[0, 3] = VOCAB.ids["sphere"]
    assert not torch.allclose(m(f1, f2, other, mode="pretrain").visual[0], base.visual[0])  # text reaches images
    # extending the padding with more [PAD] columns changes nothing for real tokens
    longer = torch.cat([t, torch.full((3, 4), VOCAB.pad_id)], 1)
    out = m(f1, f2, longer, mode="pretrain")
    assert torch.allclose(out.visual, base.visual, atol=1e-5) and torch.allclose(out.cls, base.cls, atol=1e-5)


def test_difference_encoder_switch():
    with_de, without = tiny(), tiny(difference_encoder=False)
    n_block = sum(p.numel() for p in with_de.cross[0].parameters())
    assert sum(p.numel() for p in with_de.parameters()) - sum(p.numel() for p in without.parameters()) == 2 * n_block
    f1, f2 = feats()
    assert without(f1, f2, text(), mode="finetune").text.shape == (3, 10, 32)
    # with the switch off, image 1's tokens are not influenced by image 2 before the cross-modal stage
    v = without.encode_visual(f1, f2)
    v2 = without.encode_visual(f1, f2 + 1)
    assert torch.allclose(v[:, :1 + N], v2[:, :1 + N]) and not torch.allclose(with_de.encode_visual(f1, f2)[:, :1 + N],
                                                                             with_de.encode_visual(f1, f2 + 1)[:, :1 + N])


@pytest.mark.parametrize("batch", [1, 3])
def test_cached_greedy_equals_full_recomputation(batch):
    m = tiny()
    with torch.no_grad():  # make EOS unlikely so decoding runs long enough to exercise the cache
        m.mlm_head.bias[VOCAB.eos_id] = -5.0
    visual = feats(batch, seed=4)
    cached = greedy_decode(m, visual, 11)
    naive = naive_greedy_decode(m, visual, 11)
    assert cached.shape[1] >= 5 and torch.equal(cached, naive)
    assert torch.equal(beam_search(m, visual, 11, 1), cached)
    state = m.start_decoding(visual)
    public = [m.recompute_text_logits(state, torch.full((batch, 1), VOCAB.bos_id)).argmax(-1)]
    assert torch.equal(public[0], cached[:, 0])


def test_beam_search_runs_and_scores_at_least_greedy():
    m = tiny()
    visual = feats(2, seed=5)
    out = beam_search(m, visual, 11, 3)
    assert out.shape[0] == 2 and out.dtype == torch.long


def test_mask_tokens_statistics_and_rules():
    ids = VOCAB.encode_batch(["the red cube changed to blue"] * 4000, 10)
    g = torch.Generator().manual_seed(0)
    inp, lab = mask_tokens(ids, VOCAB, g)
    words = ids >= VOCAB.n_special
    chosen = (lab != -100) & words
    # 15 % of 6 words, plus the forced word when none was drawn (probability 0.85**6): 0.15 + 0.85**6 / 6
    assert abs(chosen.sum() / words.sum() - (0.15 + 0.85 ** 6 / 6)) < 0.01
    assert bool(chosen.any(1).all())
    as_mask = (inp == VOCAB.mask_id) & chosen
    unchanged = (inp == ids) & chosen
    assert 0.77 < as_mask.sum() / chosen.sum() < 0.83
    assert 0.07 < unchanged.sum() / chosen.sum() < 0.14       # 10 % kept + random draws that hit the same word
    assert bool((inp[:, 0] == VOCAB.bos_id).all()) and bool((lab[:, 0] == -100).all())
    pad = ids == VOCAB.pad_id
    assert bool((inp[pad] == VOCAB.pad_id).all()) and bool((lab[pad] == -100).all())
    eos = ids == VOCAB.eos_id
    eos_masked = eos & (lab == VOCAB.eos_id)
    assert 0.12 < eos_masked.sum() / eos.sum() < 0.18 and bool((inp[eos_masked] == VOCAB.mask_id).all())
    again = mask_tokens(ids, VOCAB, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], inp) and torch.equal(again[1], lab)


def test_mask_regions_masks_one_image_at_least_one_region():
    m = mask_regions(2000, 49, torch.Generator().manual_seed(0))
    per_image = m.sum(2)
    assert bool(((per_image[:, 0] == 0) ^ (per_image[:, 1] == 0)).all())
    assert bool((per_image.sum(1) >= 1).all())
    assert 0.13 < m.sum() / (2000 * 49) < 0.19
    assert 0.45 < (per_image[:, 1] > 0).float().mean() < 0.55


def test_paper_size_parameter_count():
    cfg = PCLConfig(vocab_size=80, feat_dim=2048)
    m = PCL(cfg, VOCAB)
    n = sum(p.numel() for p in m.parameters())
    # public model: 16.90M with V=80; ours adds an untied MVCL output layer (512x2048) and drops nothing else
    assert 16.5e6 < n < 18.5e6, n
