"""Pair <-> text retrieval metrics (R@K, median rank, mean rank), following CLIP4IDC's ``metrics.py`` protocol.

Protocol (sushizixin/CLIP4IDC ``metrics.py`` and ``eval_epoch``)
---------------------------------------------------------------
* Text -> pair: each caption is a query; the candidates are all pairs; the rank is that of the caption's own pair.
* Pair -> text: each pair is a query; the candidates are *caption groups*, one per pair, a group scoring the
  maximum of its sentences' similarities to the query pair (CLIP4IDC's ``tensor_video_to_text_sim``); the rank is
  that of the pair's own group.
* R@K is the percentage of queries whose rank is <= K; MdR and MnR are the median and mean of the 1-based ranks
  (the median of an even count is the mean of the two middle ranks, as ``np.median``).

Deviations from CLIP4IDC's code
-------------------------------
* Ties: the rank is the number of candidates scoring >= the true one (pessimistic), so a scorer that gives every
  candidate the same score gets the worst rank, never R@1 = 100%. CLIP4IDC ranks with a double ``argsort``, which
  breaks ties by array position (arbitrarily), so its numbers can be better than this on tied scores.
* Pairs that have no caption at all are neither pair->text queries (they have no true group) nor candidates (a
  group of no sentences has no score); text->pair still ranks them as candidate pairs, since they are pairs.
  CLIP4IDC never meets this case (every test pair has captions).
* Any K list is accepted (the CLIP4IDC paper's Spot-the-Diff R@10/20/50 needed code changes there).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_CHUNK = 2048  # rows per block, so the [rows x candidates] comparison matrix stays small on test-set sizes


def _as_array(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, on any device, in any dtype
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _ranks(scores: np.ndarray, true_index: np.ndarray) -> np.ndarray:
    """1-based pessimistic rank of ``scores[i, true_index[i]]`` in row i: how many entries are >= it."""
    out = np.empty(len(scores), dtype=np.int64)
    for start in range(0, len(scores), _CHUNK):
        block = scores[start:start + _CHUNK]
        true = block[np.arange(len(block)), true_index[start:start + _CHUNK]]
        out[start:start + _CHUNK] = (block >= true[:, None]).sum(axis=1)
    return out


def _summary(prefix: str, ranks: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    out = {f"{prefix}_R@{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out[f"{prefix}_MdR"] = float(np.median(ranks))
    out[f"{prefix}_MnR"] = float(np.mean(ranks))
    return out


def retrieval_metrics(sim, text_pair, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Text->pair and pair->text R@K (percent), MdR and MnR (1-based) from a text x pair similarity matrix.

    ``sim`` is ``[n_text, n_pair]`` (numpy array, torch tensor or nested list; higher = more similar);
    ``text_pair[i]`` is the index of the pair that text ``i`` describes. Returns the keys ``t2p_R@K`` for every
    K in ``ks``, ``t2p_MdR``, ``t2p_MnR``, ``p2t_R@K``, ``p2t_MdR``, ``p2t_MnR``. Ties count against the query
    (rank = number of candidates scoring >= the true one); pairs without any text are left out of pair->text.
    See the module docstring for the protocol. Raises ``ValueError`` on bad shapes, indices, NaN or K.
    """
    sim = _as_array(sim)
    text_pair = _as_array(text_pair)
    if sim.ndim != 2 or sim.shape[0] == 0 or sim.shape[1] == 0:
        raise ValueError(f"sim must be a non-empty 2-D [n_text, n_pair] matrix, got shape {sim.shape}")
    if not np.issubdtype(sim.dtype, np.number) or np.issubdtype(sim.dtype, np.complexfloating):
        raise ValueError(f"sim must hold real numbers, got dtype {sim.dtype}")
    if np.isnan(sim).any():
        raise ValueError("sim contains NaN; ranks would be undefined")
    n_text, n_pair = sim.shape
    if text_pair.shape != (n_text,):
        raise ValueError(f"text_pair must have one pair index per text: shape ({n_text},) for sim of shape "
                         f"{sim.shape}, got {text_pair.shape}")
    if not np.issubdtype(text_pair.dtype, np.integer):
        raise ValueError(f"text_pair must hold integer pair indices, got dtype {text_pair.dtype}")
    if text_pair.min() < 0 or text_pair.max() >= n_pair:
        raise ValueError(f"text_pair indices must lie in [0, {n_pair}) (sim has {n_pair} pair columns), "
                         f"got range [{text_pair.min()}, {text_pair.max()}]")
    ks = list(ks)
    if not ks or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 for k in ks):
        raise ValueError(f"ks must be a non-empty list of positive integers, got {ks}")

    t2p = _ranks(sim, text_pair)

    # Caption groups: sort texts by pair so each group is a contiguous run, then max-reduce each run.
    order = np.argsort(text_pair, kind="stable")
    groups, starts = np.unique(text_pair[order], return_index=True)  # groups = pairs that have text
    group_score = np.maximum.reduceat(sim[order], starts, axis=0)    # [n_group, n_pair]: group g vs pair p
    # Query pair groups[j] against all groups; its own group is column j.
    p2t = _ranks(np.ascontiguousarray(group_score[:, groups].T), np.arange(len(groups)))

    return {**_summary("t2p", t2p, ks), **_summary("p2t", p2t, ks)}
