"""Every attention in the kit runs through torch's scaled_dot_product_attention (so flash and memory-efficient
kernels apply on a GPU) and equals the textbook softmax(QK^T / sqrt(d) + mask) V with the public code's -1e9
fills, for every mask the models build: IDC-PCL's pre-training (padding) and fine-tuning (uni-directional)
masks, its cached decoding and its parallel-[MASK] scoring, CLIP4IDC's causal caption decoder and cross-attention,
and open_clip's towers (nn.MultiheadAttention)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from idckit.experiments.config import model_config
from idckit.models.pcl import PCL
from idckit.text.vocab import Vocab
from numeric import assert_close

SDPA = F.scaled_dot_product_attention


def textbook(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The attention the public IDC-PCL and CLIP4IDC code write out by hand."""
    assert dropout_p == 0.0 and not enable_gqa
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -1e9)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -1e9) if attn_mask.dtype == torch.bool else s + attn_mask
    return s.softmax(-1) @ v


@pytest.fixture
def checked(monkeypatch):
    """Every scaled_dot_product_attention call also computes the textbook result and compares; returns the log
    of (mask kind, is_causal) per call."""
    calls = []

    def both(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        fused = SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        ref = textbook(q, k, v, attn_mask, dropout_p, is_causal, scale)
        assert_close(fused, ref)
        masked = attn_mask is not None and attn_mask.dtype == torch.bool and not bool(attn_mask.all())
        calls.append({"masked": masked, "causal": is_causal, "float_mask": attn_mask is not None
                      and attn_mask.dtype != torch.bool})
        return fused

    monkeypatch.setattr(F, "scaled_dot_product_attention", both)
    torch.manual_seed(0)
    return calls


def test_idc_pcl_attention_with_every_mask(checked):
    from idckit.models.decoding import beam_search, greedy_decode

    vocab = Vocab.build(["the red cube changed to blue", "no change was made"])
    model = PCL(model_config("pcl-paper", vocab_size=len(vocab), feat_dim=12, n_regions=5, d_model=32, n_heads=4,
                             d_ff=64, n_layers=2, dropout=0.0, max_text_len=12), vocab).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, 1 / math.sqrt(m.weight.shape[1]))
    f1, f2 = torch.randn(3, 5, 12), torch.randn(3, 5, 12)
    text = vocab.encode_batch(["the red cube changed to blue", "no change", "the cube"], 10)   # padded rows
    with torch.no_grad():
        model(f1, f2, text, mode="pretrain")
        model(f1, f2, text, mode="finetune")
        model.full_logits((f1, f2), text[:, :4], every_step=True)
        greedy_decode(model, (f1, f2), 6)
        beam_search(model, (f1, f2), 4, 2)
    assert sum(c["masked"] for c in checked) >= 8           # padding, uni-directional and decoding masks
    assert all(not c["causal"] for c in checked)


def test_clip4idc_and_open_clip_attention(checked):
    from idckit.models.clip4idc import CLIP4IDCCaptioner
    from idckit.models.clip_loader import load_clip
    from idckit.models.decoding import greedy_decode

    clip, _, _ = load_clip("idckit-standin-ViT-T-16", None)
    clip.train()                                 # grad-enabled training: nn.MultiheadAttention's SDPA path
    clip.encode_text(torch.randint(1, 400, (2, 32)))
    clip.encode_image(torch.randn(2, 3, 112, 112))
    n_clip = len(checked)
    assert n_clip >= 9 and any(c["float_mask"] for c in checked)   # the text tower's causal mask
    cap = CLIP4IDCCaptioner(clip, model_config("clip4idc-paper", hidden=128, heads=4, ffn=64, enc_layers=1,
                                               dec_layers=1, dropout=0.0, max_len=8)).eval()
    pair = torch.randn(2, 3, 112, 112), torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        cap(*pair, torch.randint(1, 400, (2, 8)))
        greedy_decode(cap, pair, 4)
    assert any(c["causal"] for c in checked[n_clip:])
