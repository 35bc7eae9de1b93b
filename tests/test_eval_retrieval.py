"""Retrieval metrics: hand-ranked cases, ties, K lists, even-count median, pairs without text, brute force."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from idckit.eval.retrieval import retrieval_metrics

# 3 pairs, 5 texts. Texts 0,1 describe pair 0; text 2 pair 1; texts 3,4 pair 2.
TEXT_PAIR = [0, 0, 1, 2, 2]
SIM = [
    [0.9, 0.1, 0.3],  # t0, true pair 0 (.9): nothing >= .9 but itself           -> rank 1
    [0.2, 0.6, 0.4],  # t1, true pair 0 (.2): .2 .6 .4 all >= .2                  -> rank 3
    [0.3, 0.6, 0.9],  # t2, true pair 1 (.6): .6 and .9                           -> rank 2
    [0.1, 0.2, 0.8],  # t3, true pair 2 (.8)                                      -> rank 1
    [0.5, 0.5, 0.5],  # t4, true pair 2 (.5): a three-way tie counts pessimistically -> rank 3
]
# Caption groups (max over each group's texts), group x pair:
#   g0 = max(t0, t1) = [.9, .6, .4]   g1 = t2 = [.3, .6, .9]   g2 = max(t3, t4) = [.5, .5, .8]
# Pair 0 ranks groups by column 0: .9 .3 .5 -> own .9 rank 1
# Pair 1 by column 1: .6 .6 .5 -> own .6 tied with g0 -> rank 2 (pessimistic)
# Pair 2 by column 2: .4 .9 .8 -> own .8 below g1 -> rank 2


def test_hand_ranked_case():
    m = retrieval_metrics(np.array(SIM), TEXT_PAIR, ks=(1, 2, 5))
    # t2p ranks [1, 3, 2, 1, 3]
    assert m["t2p_R@1"] == pytest.approx(40.0)
    assert m["t2p_R@2"] == pytest.approx(60.0)
    assert m["t2p_R@5"] == pytest.approx(100.0)
    assert m["t2p_MdR"] == 2.0
    assert m["t2p_MnR"] == pytest.approx(2.0)
    # p2t ranks [1, 2, 2]
    assert m["p2t_R@1"] == pytest.approx(100 / 3)
    assert m["p2t_R@2"] == pytest.approx(100.0)
    assert m["p2t_MdR"] == 2.0
    assert m["p2t_MnR"] == pytest.approx(5 / 3)
    assert set(m) == {f"{d}_{s}" for d in ("t2p", "p2t") for s in ("R@1", "R@2", "R@5", "MdR", "MnR")}


def test_torch_and_list_inputs_match_numpy():
    ref = retrieval_metrics(np.array(SIM), np.array(TEXT_PAIR))
    assert retrieval_metrics(torch.tensor(SIM), torch.tensor(TEXT_PAIR)) == ref
    assert retrieval_metrics(torch.tensor(SIM, dtype=torch.bfloat16), TEXT_PAIR)["t2p_R@1"] == ref["t2p_R@1"]
    assert retrieval_metrics(SIM, TEXT_PAIR) == ref


def test_constant_scorer_gets_the_worst_rank_not_a_perfect_one():
    n = 7
    m = retrieval_metrics(np.zeros((2 * n, n)), np.repeat(np.arange(n), 2), ks=(1, 5, 10))
    assert m["t2p_R@1"] == 0.0 and m["p2t_R@1"] == 0.0
    assert m["t2p_R@5"] == 0.0 and m["t2p_R@10"] == 100.0
    assert m["t2p_MdR"] == m["t2p_MnR"] == m["p2t_MdR"] == m["p2t_MnR"] == float(n)


def test_any_k_list_and_even_count_median():
    # 60 pairs, one text each; text i sees exactly i other pairs strictly above its true pair -> rank i+1.
    n = 60
    sim = np.full((n, n), -1.0)
    for i in range(n):
        sim[i, i] = 0.0
        sim[i, [c for c in range(n) if c != i][:i]] = 1.0
    m = retrieval_metrics(sim, np.arange(n), ks=[10, 20, 50])
    # t2p ranks are 1..60
    assert m["t2p_R@10"] == pytest.approx(100 * 10 / 60)
    assert m["t2p_R@20"] == pytest.approx(100 * 20 / 60)
    assert m["t2p_R@50"] == pytest.approx(100 * 50 / 60)
    assert m["t2p_MdR"] == 30.5  # median of an even count: mean of ranks 30 and 31
    assert m["t2p_MnR"] == pytest.approx(30.5)


def test_pairs_without_text_are_left_out_of_pair_to_text():
    # 3 pairs but only pairs 0 and 2 have texts; pair 1 is still a t2p candidate.
    sim = np.array([[0.5, 0.9, 0.1],   # t0 -> pair 0: pair 1 outranks it -> rank 2
                    [0.2, 0.8, 0.7]])  # t1 -> pair 2: pair 1 outranks it -> rank 2
    m = retrieval_metrics(sim, [0, 2], ks=(1, 2))
    assert m["t2p_R@1"] == 0.0 and m["t2p_MnR"] == 2.0
    # p2t: queries pairs 0 and 2, candidates groups {0: t0, 2: t1}:
    # pair 0 column 0: g0 .5, g2 .2 -> rank 1; pair 2 column 2: g0 .1, g2 .7 -> rank 1
    assert m["p2t_R@1"] == 100.0 and m["p2t_MnR"] == 1.0


def _brute_force(sim, text_pair, ks):
    n_text, n_pair = len(sim), len(sim[0])
    t2p = [sum(1 for p in range(n_pair) if sim[i][p] >= sim[i][text_pair[i]]) for i in range(n_text)]
    groups = sorted(set(text_pair))
    g = {q: [max(sim[i][p] for i in range(n_text) if text_pair[i] == q) for p in range(n_pair)] for q in groups}
    p2t = [sum(1 for q in groups if g[q][p] >= g[p][p]) for p in groups]
    out = {}
    for name, ranks in (("t2p", t2p), ("p2t", p2t)):
        for k in ks:
            out[f"{name}_R@{k}"] = 100.0 * sum(r <= k for r in ranks) / len(ranks)
        s = sorted(ranks)
        mid = len(s) // 2
        out[f"{name}_MdR"] = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
        out[f"{name}_MnR"] = sum(ranks) / len(ranks)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_a_brute_force_loop(seed, monkeypatch):
    import idckit.eval.retrieval as r

    monkeypatch.setattr(r, "_CHUNK", 7)  # exercise the row blocking
    rng = np.random.default_rng(seed)
    n_pair, n_text = 23, 61
    text_pair = rng.integers(0, n_pair, n_text)
    # quantised scores so ties occur often
    sim = rng.integers(0, 5, (n_text, n_pair)).astype(np.float32)
    ks = (1, 3, 10, 20)
    got = retrieval_metrics(sim, text_pair, ks=ks)
    want = _brute_force(sim.tolist(), text_pair.tolist(), ks)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k]), k


@pytest.mark.parametrize("sim, text_pair, ks, match", [
    (np.zeros(3), [0, 1, 2], (1,), "2-D"),
    (np.zeros((0, 3)), [], (1,), "non-empty"),
    (np.zeros((3, 2)), [0, 1], (1,), r"shape \(3,\)"),
    (np.zeros((2, 2)), [0, 2], (1,), r"\[0, 2\)"),
    (np.zeros((2, 2)), [0, -1], (1,), r"\[0, 2\)"),
    (np.zeros((2, 2)), [0.0, 1.0], (1,), "integer"),
    (np.array([[np.nan, 0.0], [0.0, 0.0]]), [0, 1], (1,), "NaN"),
    (np.zeros((2, 2)), [0, 1], (0,), "positive"),
    (np.zeros((2, 2)), [0, 1], (), "positive"),
])
def test_bad_inputs_raise_clear_errors(sim, text_pair, ks, match):
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(sim, np.array(text_pair), ks=ks)
