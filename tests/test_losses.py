"""Losses against hand-computed values and straightforward loop implementations."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from idckit.losses import fda_nce, mlm_loss, mvcl_nce, symmetric_infonce


def test_mlm_loss_ignores_unmasked_positions():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 0.0]], [[0.0, 5.0], [1.0, 1.0]]])
    labels = torch.tensor([[0, -100], [-100, 1]])
    # position (0,0): -log softmax([2,0])[0]; position (1,1): -log 0.5
    want = (math.log(1 + math.exp(-2)) + math.log(2)) / 2
    assert math.isclose(mlm_loss(logits, labels).item(), want, rel_tol=1e-6)
    assert math.isclose(mlm_loss(logits, labels, "sum").item(), 2 * want, rel_tol=1e-6)


def test_fda_nce_hand_case():
    pos, neg = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    a = -math.log(math.e / (math.e + 2))
    b = -math.log(1 / (1 + math.e + math.exp(-1)))
    assert math.isclose(fda_nce(pos, neg).item(), (a + b) / 2, rel_tol=1e-6)
    # temperature divides the logits
    assert math.isclose(fda_nce(pos, neg, tau=0.5).item(), fda_nce(2 * pos, 2 * neg).item(), rel_tol=1e-6)


def test_mvcl_nce_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    pred, target, negs = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), torch.randn(7, 6, generator=g)
    total = 0.0
    for p, t in zip(pred, target):
        pos = math.exp(F.cosine_similarity(p, t, dim=0).item() / 0.7)
        neg = sum(math.exp(F.cosine_similarity(p, n, dim=0).item() / 0.7) for n in negs)
        total += -math.log(pos / (pos + neg))
    assert math.isclose(mvcl_nce(pred, target, negs, tau=0.7).item(), total / 4, rel_tol=1e-5)
    # orthogonal hand case: cos(p,t)=1, cos(p,n)=0 -> -log(e / (e + 1))
    one = mvcl_nce(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]]))
    assert math.isclose(one.item(), -math.log(math.e / (math.e + 1)), rel_tol=1e-6)


def test_symmetric_infonce_hand_case():
    logits = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    rows = (-math.log(math.exp(2) / (math.exp(2) + 1)) - math.log(0.5)) / 2
    cols = (-math.log(math.exp(2) / (math.exp(2) + math.e)) - math.log(math.e / (1 + math.e))) / 2
    assert math.isclose(symmetric_infonce(logits).item(), (rows + cols) / 2, rel_tol=1e-6)
