"""Orderings with statistics: two numbers are put in order only when their gap exceeds the noise measured for them.

An ordering (and a paper "agrees" / "differs") comes only from a **paired bootstrap over the test pairs** both rows
were scored on (their per-pair scores, stored on a row as ``per_pair`` by :func:`attach_per_pair`), combined with
each row's **seed spread** (the sd over its seeds, recorded on a mean row as ``sd``): noise = sqrt(paired half-width^2
+ sd_a^2 + sd_b^2). A gap within that noise is said as "within noise", never as an order. There is no ordering
where the rows carry no per-pair scores on the same test pairs, at zero noise, or when a trained row collapsed
(its score is that of a few sentences). Only the status (:mod:`idckit.reports.status`) may fall back, and says so,
to the unpaired noise of a report written before rows stored per-pair scores (each row's bootstrap half-width over
its own test pairs, ``ci``, and its seed sd).
"""
from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from idckit.eval.captions import CaptionScorer
from idckit.reports.format import name

#: bootstrap resamples of the test pairs (a 95 % interval of a mean needs a few hundred)
BOOTSTRAP_RESAMPLES = 500
#: decimals a stored per-pair score keeps (x100 scale): the mean moves by under 0.05, far inside any noise, and a
#: report's JSON grows by about 5 bytes a pair and metric
PER_PAIR_DECIMALS = 1
#: a captioning run that writes fewer distinct test captions than this (or than it has test pairs, on a smaller
#: test set) has collapsed: its scores say which sentences it settled on, not what it saw
COLLAPSE_DISTINCT = 10
#: share of test pairs given the single most frequent caption at which a run counts as collapsed
COLLAPSE_TOP_SHARE = 0.9


def is_collapsed(distinct: int | None, pairs: int | None = None, top_share: float | None = None) -> bool:
    """Did a captioning run collapse? Fewer than :data:`COLLAPSE_DISTINCT` distinct test captions (fewer than its
    test pairs on a smaller test set), or one caption for :data:`COLLAPSE_TOP_SHARE` of the pairs."""
    if distinct is None:
        return False
    floor = min(COLLAPSE_DISTINCT, pairs) if pairs else COLLAPSE_DISTINCT
    return distinct <= 1 or distinct < floor or (top_share is not None and top_share >= COLLAPSE_TOP_SHARE)


def bootstrap_halfwidth(scores: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                        level: float = 0.95) -> float:
    """Half the width of the percentile bootstrap interval of the mean of ``scores`` (per test pair)."""
    scores = list(scores)
    if len(scores) < 2:
        return 0.0
    rng = random.Random(seed)
    n = len(scores)
    means = sorted(statistics.fmean(rng.choices(scores, k=n)) for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return (hi - lo) / 2


def per_pair_scores(references: Mapping[str, Sequence[str]], candidates: Mapping[str, str],
                    metric: str = "CIDEr-D", *, tokenize: bool = True) -> dict[str, float]:
    """``metric`` (CIDEr-D or ROUGE_L, x100) of each candidate with the corpus statistics of the whole set, as the
    evaluator computes them (their mean is the reported corpus score): what :func:`bootstrap_halfwidth`
    resamples."""
    # local: pycocoevalcap stays off the training path and `idckit readme` (card imports this module); see eval.captions
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge  # local: as Cider

    scorers = {"CIDEr-D": Cider, "ROUGE_L": Rouge}
    if metric not in scorers:
        raise ValueError(f"per-pair scores exist for {sorted(scorers)}, not {metric!r}")
    scorer = CaptionScorer(meteor=False)
    try:
        gts, res = scorer._prepare(references, candidates, tokenize)
    finally:
        scorer.close()
    _, scores = scorers[metric]().compute_score(gts, res)
    return {k: 100.0 * float(s) for k, s in zip(sorted(gts), scores)}


def per_pair_cider(references: Mapping[str, Sequence[str]], candidates: Mapping[str, str]) -> dict[str, float]:
    return per_pair_scores(references, candidates, "CIDEr-D")


def pairs_key(ids: Sequence[str]) -> str:
    """A short name of a set of test pairs: two rows are paired only on the same set."""
    return hashlib.sha1("\n".join(sorted(map(str, ids))).encode()).hexdigest()[:12]


def _packed(values: Sequence[float]) -> str:
    return " ".join(f"{round(float(v), PER_PAIR_DECIMALS):g}" for v in values)


def per_pair_values(row: Mapping[str, Any], metric: str) -> list[float] | None:
    """``row``'s stored per-pair ``metric`` scores (sorted pair-id order), or None."""
    pp = row.get("per_pair")
    if not isinstance(pp, Mapping) or metric not in pp:
        return None
    v = pp[metric]
    return [float(x) for x in v.split()] if isinstance(v, str) else [float(x) for x in v]


def attach_per_pair(row: dict[str, Any], scores: Mapping[str, float], metric: str) -> dict[str, Any]:
    """Store ``scores`` (``{pair id: score}``, x100) on ``row`` as ``per_pair = {"pairs": key, "n": N, metric:
    "s1 s2 ..."}``: one string in sorted pair-id order, rounded to :data:`PER_PAIR_DECIMALS`, so the JSON stays a
    line a metric; a second metric on the same pairs joins the first."""
    ids = sorted(scores)
    key = pairs_key(ids)
    pp = row.get("per_pair")
    if not isinstance(pp, dict) or pp.get("pairs") != key:
        pp = row["per_pair"] = {"pairs": key, "n": len(ids)}
    pp[metric] = _packed([scores[i] for i in ids])
    return row


def mean_per_pair(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any] | None:
    """The per-pair mean over seed ``rows`` (a mean row's ``per_pair``), or None unless all share their pairs."""
    pps = [r.get("per_pair") for r in rows]
    if not pps or not all(isinstance(p, Mapping) and metric in p for p in pps) or \
            len({p["pairs"] for p in pps}) != 1:
        return None
    cols = [per_pair_values(r, metric) for r in rows]
    return {"pairs": pps[0]["pairs"], "n": pps[0]["n"], metric: _packed([statistics.fmean(v) for v in zip(*cols)])}


def paired_halfwidth(a: Sequence[float], b: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                     level: float = 0.95) -> float:
    """Half the width of the percentile bootstrap interval of mean(a - b), resampling the test pairs (one index
    draws both rows' score of the same pair)."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need the same pairs, got {len(a)} and {len(b)}")
    return bootstrap_halfwidth([x - y for x, y in zip(a, b)], resamples=resamples, seed=seed, level=level)


def _paired(a: Mapping[str, Any], b: Mapping[str, Any], metric: str) -> tuple[list, list] | None:
    va, vb = per_pair_values(a, metric), per_pair_values(b, metric)
    if va is None or vb is None or a["per_pair"].get("pairs") != b["per_pair"].get("pairs") or len(va) != len(vb):
        return None
    return va, vb


def seed_sd(row: Mapping[str, Any], metric: str) -> float | None:
    """The seed spread of ``row``'s ``metric`` (a mean row's sd over two or more seeds), None where not measured."""
    sd = (row.get("sd") or {}).get(metric)
    return float(sd) if sd is not None and (row.get("n_seeds") or 0) > 1 else None


def _trained(row: Mapping[str, Any]) -> bool:
    return row.get("seed") is not None


def noise(row: Mapping[str, Any], metric: str) -> tuple[float, str]:
    """The unpaired noise of ``row``'s ``metric``: (its seed sd, "seed sd over N seeds"), else (its bootstrap
    half-width over its own test pairs, "95 % bootstrap over test pairs"), else (0, "one seed, no spread
    measured")."""
    sd = seed_sd(row, metric)
    if sd is not None:
        return sd, f"seed sd over {row.get('n_seeds')} seeds"
    ci = (row.get("ci") or {}).get(metric)
    if ci is not None:
        return float(ci), "95 % bootstrap over test pairs"
    return 0.0, "one seed, no spread measured"


@dataclass(frozen=True)
class Ordering:
    a: str
    b: str
    gap: float          # a - b
    noise: float
    how: str            # where the noise comes from, or why there is no ordering
    metric: str
    tested: bool = True  # False: no ordering can be read (no paired scores, zero noise, a collapsed row)

    @property
    def order(self) -> int:
        """1 (a above b), -1 (below) or 0 (within noise, or not tested)."""
        if not self.tested:
            return 0
        return 0 if abs(self.gap) <= self.noise else (1 if self.gap > 0 else -1)

    def words(self) -> str:
        if not self.tested:
            return f"{self.a} and {self.b} are not ordered on {name(self.metric)} (gap {self.gap:+.1f}): {self.how}"
        rel = {1: "above", -1: "below", 0: "within noise of"}[self.order]
        return (f"{self.a} is {rel} {self.b} on {name(self.metric)}: gap {self.gap:+.1f} against a noise of "
                f"{self.noise:.1f} ({self.how})")


def compare(a: Mapping[str, Any], b: Mapping[str, Any], metric: str, *, a_name: str | None = None,
            b_name: str | None = None, paired_only: bool = True) -> Ordering:
    """Order two report rows on ``metric``: the gap against sqrt(paired bootstrap half-width^2 + each row's seed
    sd^2) (see the module's docstring). A baseline row (no seeds) adds no seed spread. No ordering (``tested``
    False) for a collapsed trained row, without per-pair scores on the same pairs (``paired_only=False``: the
    unpaired noise instead, sqrt of the squares of each row's :func:`noise`, said as such), or at zero noise."""
    name_a, name_b = a_name or a.get("variant", "a"), b_name or b.get("variant", "b")
    gap = a["metrics"][metric] - b["metrics"][metric]

    def untested(why: str) -> Ordering:
        return Ordering(name_a, name_b, gap, 0.0, why, metric, tested=False)

    for r, n in ((a, name_a), (b, name_b)):
        if _trained(r) and is_collapsed(r.get("distinct_test_captions"), r.get("test_pairs")):
            return untested(f"{n} collapsed ({r.get('distinct_test_captions')} distinct test captions)")
    sds = [s for s in (seed_sd(a, metric), seed_sd(b, metric)) if s is not None]
    seeds = (f"seed sd over {max(r.get('n_seeds') or 1 for r in (a, b))} seeds" if sds else
             "one seed: no seed spread" if _trained(a) or _trained(b) else "")
    pair = _paired(a, b, metric)
    if pair is not None:
        hw = paired_halfwidth(*pair)
        total = math.sqrt(hw ** 2 + sum(s ** 2 for s in sds))
        how = f"paired 95 % bootstrap over {len(pair[0])} test pairs" + (f" and {seeds}" if seeds else "")
    elif paired_only:
        return untested("no per-pair scores on the same test pairs")
    else:
        (na, ha), (nb, hb) = noise(a, metric), noise(b, metric)
        total = math.sqrt(na ** 2 + nb ** 2)
        how = "unpaired: " + " and ".join(h for n, h in ((na, ha), (nb, hb)) if n) if total else ""
    if total <= 0:
        return untested("no noise measured")
    return Ordering(name_a, name_b, gap, total, how, metric)


def paper_agreement(kit: Ordering, paper_gap: float) -> str:
    """``agrees`` / ``differs`` / ``within noise`` / ``paper ties`` / ``not ordered``: the kit's ordering of two rows
    against the paper's (``paper_gap`` = a - b there, compared as published: one decimal)."""
    p = round(paper_gap, 1)
    if not kit.tested:
        return "not ordered"
    if kit.order == 0:
        return "within noise"
    if p == 0:
        return "paper ties"
    return "agrees" if (p > 0) == (kit.order > 0) else "differs"


def ordering_notes(rows: Sequence[Mapping[str, Any]], paper: Mapping[str, float], metric: str = "CIDEr-D",
                   *, names: Sequence[str] | None = None) -> list[str]:
    """For every two variants both the paper and the kit have (``paper`` = ``{variant: value}``), one sentence:
    the kit's order read against its noise, and whether it agrees with the paper's. ``rows``: report rows, the
    mean row of a variant standing for it where there is one."""
    by = {}
    for r in rows:
        if r.get("seed") == "mean" or r["variant"] not in by:
            by[r["variant"]] = r
    labels = [v for v in (names or paper) if v in by and v in paper]
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            o = compare(by[a], by[b], metric)
            verdict = paper_agreement(o, paper[a] - paper[b])
            out.append(f"{verdict}: {o.words()}; the paper has {paper[a]:.1f} vs {paper[b]:.1f}.")
    return out


def standing(model: Mapping[str, Any], references: Sequence[Mapping[str, Any]], metric: str,
             *, model_name: str | None = None) -> list[str]:
    """Where ``model`` (a report row) stands against each reference row (a baseline, DUDA), one sentence each."""
    return [compare(model, r, metric, a_name=model_name or model.get("variant"),
                    b_name=r.get("variant")).words() + "." for r in references if metric in r.get("metrics", {})]


def tie_best(values: Mapping[str, float], noise_of: Mapping[str, float] | None = None, *,
             decimals: int = 1) -> tuple[str | None, list[str]]:
    """The best of ``values`` or, when others are within its noise (or equal as printed), None and the tied
    names: a tie-break is named a tie, never reported as a winner. With no noise measured for any (all zero or
    missing) nothing is ordered: None and every name."""
    if not values:
        return None, []
    if len(values) > 1 and not any((noise_of or {}).get(k, 0.0) > 0 for k in values):
        return None, list(values)
    best = max(values, key=values.get)
    tied = [k for k, v in values.items()
            if round(values[best] - v, decimals) <= max((noise_of or {}).get(k, 0.0), (noise_of or {}).get(best, 0.0))]
    return (best, [best]) if len(tied) == 1 else (None, tied)


__all__ = ["BOOTSTRAP_RESAMPLES", "PER_PAIR_DECIMALS", "COLLAPSE_DISTINCT", "COLLAPSE_TOP_SHARE", "is_collapsed",
           "bootstrap_halfwidth", "per_pair_scores", "per_pair_cider", "pairs_key", "attach_per_pair",
           "per_pair_values", "mean_per_pair", "paired_halfwidth", "seed_sd", "noise", "Ordering", "compare",
           "paper_agreement",
           "ordering_notes", "standing", "tie_best"]
