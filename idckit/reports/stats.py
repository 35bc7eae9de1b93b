"""Orderings with statistics: two numbers are put in order only when their gap exceeds the noise measured for them.

The noise of a row is its seed spread (the sd over its seeds, recorded on a mean row as ``sd``); with one seed it
is the half-width of a bootstrap interval over the test pairs (:func:`bootstrap_halfwidth`, from per-pair
scores, recorded on a row as ``ci``). A gap within the noise is said as "within noise", never as an order.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from idckit.eval.captions import CaptionScorer

#: bootstrap resamples of the test pairs (a 95 % interval of a mean needs a few hundred)
BOOTSTRAP_RESAMPLES = 500


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


def noise(row: Mapping[str, Any], metric: str) -> tuple[float, str]:
    """The noise of ``row``'s ``metric``: (its seed sd, "seed sd over N seeds"), else (its bootstrap half-width,
    "95 % bootstrap over test pairs"), else (0, "one seed, no spread measured")."""
    sd = (row.get("sd") or {}).get(metric)
    if sd is not None and row.get("n_seeds", 2) > 1:
        return float(sd), f"seed sd over {row.get('n_seeds', 'several')} seeds"
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
    how: str            # where the noise comes from
    metric: str

    @property
    def order(self) -> int:
        """1 (a above b), -1 (below) or 0 (within noise)."""
        return 0 if abs(self.gap) <= self.noise else (1 if self.gap > 0 else -1)

    def words(self) -> str:
        rel = {1: "above", -1: "below", 0: "within noise of"}[self.order]
        return (f"{self.a} is {rel} {self.b} on {self.metric}: gap {self.gap:+.1f} against a noise of "
                f"{self.noise:.1f} ({self.how})")


def compare(a: Mapping[str, Any], b: Mapping[str, Any], metric: str, *, a_name: str | None = None,
            b_name: str | None = None) -> Ordering:
    """Order two report rows on ``metric`` against the larger of their noises (:func:`noise`). A baseline row
    (no seeds, no spread) contributes no noise of its own."""
    na, ha = noise(a, metric)
    nb, hb = noise(b, metric)
    how = ha if na >= nb else hb
    return Ordering(a_name or a.get("variant", "a"), b_name or b.get("variant", "b"),
                    a["metrics"][metric] - b["metrics"][metric], max(na, nb), how, metric)


def paper_agreement(kit: Ordering, paper_gap: float) -> str:
    """``agrees`` / ``differs`` / ``within noise`` / ``paper ties``: the kit's ordering of two rows against the
    paper's (``paper_gap`` = a - b there, compared as published: one decimal)."""
    p = round(paper_gap, 1)
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
    names: a tie-break is named a tie, never reported as a winner."""
    if not values:
        return None, []
    best = max(values, key=values.get)
    tied = [k for k, v in values.items()
            if round(values[best] - v, decimals) <= max((noise_of or {}).get(k, 0.0), (noise_of or {}).get(best, 0.0))]
    return (best, [best]) if len(tied) == 1 else (None, tied)


__all__ = ["BOOTSTRAP_RESAMPLES", "bootstrap_halfwidth", "per_pair_scores", "per_pair_cider", "noise", "Ordering",
           "compare",
           "paper_agreement", "ordering_notes", "standing", "tie_best"]
