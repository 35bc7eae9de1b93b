"""Losses against hand-computed values and straightforward loop implementations."""
from __future__ import annotations

import math

import pytest
import torch

from idckit.losses import fda_nce, mlm_loss, mvcl_nce, symmetric_infonce
from numeric import assert_close


def cos(a, b) -> float:
    return float(a @ b) / (float(a.norm()) * float(b.norm()))


def nce_loop(scores_pos: list[float], scores_neg: list[list[float]], tau: float) -> float:
    """mean_i -log(exp(s_i/tau) / (exp(s_i/tau) + sum_n exp(s_in/tau))), one term at a time."""
    total = 0.0
    for s, negs in zip(scores_pos, scores_neg):
        num = math.exp(s / tau)
        total += -math.log(num / (num + sum(math.exp(x / tau) for x in negs)))
    return total / len(scores_pos)


def test_mlm_loss_hand_case_ignores_unlabelled_positions():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 0.0]], [[0.0, 5.0], [1.0, 1.0]]])
    labels = torch.tensor([[0, -100], [-100, 1]])
    # position (0,0): -log(e^2 / (e^2 + 1)); position (1,1): -log(1/2)
    want = (math.log(1 + math.exp(-2)) + math.log(2)) / 2
    assert_close(mlm_loss(logits, labels).item(), want, rtol=1e-6)
    assert_close(mlm_loss(logits, labels, "sum").item(), 2 * want, rtol=1e-6)
    assert mlm_loss(logits.bfloat16(), labels).dtype == torch.float32
    with pytest.raises(ValueError, match="reduction"):
        mlm_loss(logits, labels, "none")


def test_mlm_loss_with_nothing_labelled_is_zero_with_a_graph():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss = mlm_loss(logits, torch.full((2, 3), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_mvcl_nce_hand_cases():
    # cos(p, t) = 1, cos(p, n) = 0: -log(e / (e + 1))
    one = mvcl_nce(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]]), tau=1.0)
    assert_close(one.item(), -math.log(math.e / (math.e + 1)), rtol=1e-6)
    # 2 regions, 2 negatives, tau 0.5; cosines by hand:
    pred = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    target = torch.tensor([[1.0, 1.0], [0.0, -1.0]])
    negs = torch.tensor([[-1.0, 0.0], [0.0, 2.0]])
    r = math.sqrt(0.5)
    # region 0: pos cos((1,0),(1,1)) = r; negs: cos((1,0),(-1,0)) = -1, cos((1,0),(0,2)) = 0
    # region 1: pos cos((1,1),(0,-1)) = -r; negs: cos((1,1),(-1,0)) = -r, cos((1,1),(0,2)) = r
    a = -math.log(math.exp(2 * r) / (math.exp(2 * r) + math.exp(-2) + 1))
    b = -math.log(math.exp(-2 * r) / (math.exp(-2 * r) + math.exp(-2 * r) + math.exp(2 * r)))
    assert_close(mvcl_nce(pred, target, negs, tau=0.5).item(), (a + b) / 2, rtol=1e-6)


def test_mvcl_nce_matches_a_loop_and_has_gradients():
    g = torch.Generator().manual_seed(0)
    pred = torch.randn(4, 6, generator=g).requires_grad_()
    target, negs = torch.randn(4, 6, generator=g), torch.randn(7, 6, generator=g)
    want = nce_loop([cos(p, t) for p, t in zip(pred.detach(), target)],
                    [[cos(p, n) for n in negs] for p in pred.detach()], tau=0.7)
    loss = mvcl_nce(pred, target, negs, tau=0.7)
    assert_close(loss.item(), want, rtol=1e-5)
    loss.backward()
    assert pred.grad is not None and bool(pred.grad.abs().sum() > 0)
    # scale invariance: cosine scores do not care about feature norms
    assert_close(mvcl_nce(3 * pred, target, 0.1 * negs, tau=0.7).item(), want, rtol=1e-5)
    with pytest.raises(ValueError, match="expected"):
        mvcl_nce(pred, target[:3], negs, tau=1.0)


def test_fda_nce_hand_case_and_loop():
    pos, neg = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    a = -math.log(math.e / (math.e + 2))                       # logits [1, 0, 0]
    b = -math.log(1 / (1 + math.e + math.exp(-1)))             # logits [0, 1, -1]
    assert_close(fda_nce(pos, neg, tau=1.0).item(), (a + b) / 2, rtol=1e-6)
    assert_close(fda_nce(pos, neg, tau=0.5).item(), fda_nce(2 * pos, 2 * neg, tau=1.0).item(), rtol=1e-6)
    g = torch.Generator().manual_seed(1)
    pos, neg = torch.rand(5, generator=g) * 2 - 1, torch.rand(5, 6, generator=g) * 2 - 1
    assert_close(fda_nce(pos, neg, tau=0.3).item(), nce_loop(pos.tolist(), neg.tolist(), 0.3), rtol=1e-5)
    with pytest.raises(ValueError, match="expected"):
        fda_nce(pos, neg[:4], tau=1.0)


def test_symmetric_infonce_hand_case_and_loop():
    logits = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    rows = (-math.log(math.exp(2) / (math.exp(2) + 1)) - math.log(0.5)) / 2
    cols = (-math.log(math.exp(2) / (math.exp(2) + math.e)) - math.log(math.e / (1 + math.e))) / 2
    assert_close(symmetric_infonce(logits).item(), (rows + cols) / 2, rtol=1e-6)
    s = torch.randn(5, 5, generator=torch.Generator().manual_seed(2))
    row_terms = [-(s[i, i] - torch.logsumexp(s[i], 0)).item() for i in range(5)]
    col_terms = [-(s[j, j] - torch.logsumexp(s[:, j], 0)).item() for j in range(5)]
    assert_close(symmetric_infonce(s).item(), (sum(row_terms) + sum(col_terms)) / 10, rtol=1e-5)
    # a perfect, confident matrix costs almost nothing; swapping its columns costs a lot
    eye = 20 * torch.eye(4)
    # (float32 rounds at the logits' scale, 20, not at the loss's)
    assert_close(symmetric_infonce(eye).item(), math.log1p(3 * math.exp(-20)), rtol=1e-6, scale=20.0)
    assert symmetric_infonce(eye[:, [1, 0, 3, 2]]).item() > 19
    with pytest.raises(ValueError, match="square"):
        symmetric_infonce(torch.zeros(2, 3))


def test_judge_loss_hand_case():
    import math

    from idckit.losses import judge_loss

    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(4.0), 0.0]])   # p(change) = 3/4, then 1/5
    got = judge_loss(logits, torch.tensor([True, True]))
    assert_close(float(got), 0.5 * (-math.log(0.75) - math.log(0.2)), rtol=1e-6)
    assert_close(float(judge_loss(logits, torch.tensor([0, 0]))), 0.5 * (-math.log(0.25) - math.log(0.8)),
                 rtol=1e-6)
    with pytest.raises(ValueError, match=r"logits \[B, 2\]"):
        judge_loss(torch.zeros(2, 3), torch.tensor([0, 1]))


def test_attention_mass_hand_case():
    from idckit.losses import attention_mass

    before = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 0.0]])
    after = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.0, 0.0]], dtype=torch.bfloat16)
    # pair 0: (1.0 + 3.0) / 2 = 2.0; pair 1: (0 + 0.5) / 2 = 0.25; mean 1.125, in float32 whatever the input dtype
    got = attention_mass(before, after)
    assert got.dtype == torch.float32
    assert_close(float(got), 1.125, rtol=1e-6)
    with pytest.raises(ValueError, match=r"two \[B, N\] attention maps"):
        attention_mass(before, after[:1])


def test_class_contrastive_hand_case():
    from idckit.losses import class_contrastive

    # three vectors: a and b same class at 60 degrees (cos 0.5), c another class, cos(a, c) = 0, cos(b, c) = 0.8
    a = torch.tensor([1.0, 0.0, 0.0])
    b = torch.tensor([0.5, math.sqrt(0.75), 0.0])
    c = torch.tensor([0.0, 0.8 / math.sqrt(0.75), 0.0])
    c = c + torch.tensor([0.0, 0.0, math.sqrt(max(0.0, 1 - float(c.norm()) ** 2))])
    z = torch.stack([a, b, 2 * c])                        # the scale of a vector does not matter
    labels = torch.tensor([7, 7, 3])
    # same-class terms (a,b) and (b,a): 1 - 0.5 each; different-class (b,c), (c,b): 0.8 - 0.4 each; (a,c): 0
    want = (2 * 0.5 + 2 * 0.4) / 9
    assert_close(float(class_contrastive(z, labels, margin=0.4)), want, rtol=1e-5)
    assert_close(float(class_contrastive(z, labels, margin=0.9)), 2 * 0.5 / 9, rtol=1e-5)
    with pytest.raises(ValueError, match=r"z \[N, d\]"):
        class_contrastive(z, labels[:2])


def test_clip_logits_are_scaled_cosines_and_gather_sees_unit_vectors():
    from idckit.losses import clip_logits

    text = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    image = torch.tensor([[0.0, 2.0], [5.0, 0.0], [1.0, -1.0]])
    scale = torch.tensor(math.log(10.0))
    got = clip_logits(text, image, scale)
    want = torch.tensor([[10 * cos(t, i) for i in image] for t in text])
    assert_close(got, want)
    seen = []
    doubled = clip_logits(text, image, scale, gather=lambda x: seen.append(x.norm(dim=-1)) or torch.cat([x, x]))
    assert doubled.shape == (4, 6) and seen
    for n in seen:
        assert_close(n, torch.ones_like(n))
    assert_close(doubled[:2, :3], want)


def test_fgvc_loss_is_the_unweighted_sum_of_its_three_terms():
    from idckit.losses import class_contrastive, fgvc_loss

    classes = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])          # image 1: p(class 1) = 3/4; image 2: 1/2
    match = torch.tensor([[math.log(4.0), 0.0]])                            # p(same) = 1/5
    feats = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    labels = torch.tensor([[1, 1]])                                         # same class
    total, parts = fgvc_loss(classes, match, feats, labels)
    assert_close(float(parts["fgvc_class"]), 0.5 * (-math.log(0.75) - math.log(0.5)), rtol=1e-6)
    assert_close(float(parts["fgvc_match"]), -math.log(0.2), rtol=1e-6)
    assert_close(float(parts["fgvc_contrast"]), float(class_contrastive(feats[0], labels[0])))
    assert_close(float(total), sum(float(v) for v in parts.values()), rtol=1e-6)
    with pytest.raises(ValueError, match=r"labels \[N, 2\]"):
        fgvc_loss(classes, match, feats, labels[:, :1])


def test_weight_decay_groups_follow_open_clips_rule():
    from idckit.train.task import weight_decay_groups

    m = torch.nn.Module()
    m.proj = torch.nn.Linear(3, 4)
    m.token_embedding = torch.nn.Embedding(5, 3)
    m.logit_scale = torch.nn.Parameter(torch.ones([]))
    m.frozen = torch.nn.Linear(2, 2)
    m.frozen.requires_grad_(False)
    decay, no_decay = weight_decay_groups(m.named_parameters(), 0.2, lr_scale=0.5)
    assert [id(p) for p in decay["params"]] == [id(m.proj.weight)]
    assert {id(p) for p in no_decay["params"]} == {id(m.proj.bias), id(m.token_embedding.weight), id(m.logit_scale)}
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["lr_scale"], no_decay["lr_scale"]) == \
        (0.2, 0.0, 0.5, 0.5)
