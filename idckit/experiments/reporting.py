"""Report rows from run results: what the table notebooks of both papers show.

A result of any experiment module's ``run_variant`` (the keys of :data:`idckit.experiments.runs.RESULT_KEYS`)
becomes a row on the papers' x100 scale: :func:`rows` (one subset, and a mean +/- sd row per variant run with
several seeds) and :func:`per_type_rows` (CIDEr-D per change type); every trained row carries
:func:`trained_fields`, so a report says whether its runs collapsed. :func:`ordering_notes` says in words whether
the kit orders rows as a paper does. Writing, reading and judging the report files is :mod:`idckit.report`.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR
from idckit.report import to_paper_scale

#: the columns of the per-type tables (IDC-PCL's table 3, CLIP4IDC's table 2)
TYPES: tuple[str, ...] = (*CHANGE_TYPES, DISTRACTOR)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def trained_fields(result: Mapping[str, Any]) -> dict[str, Any]:
    """What every trained captioning row of a report records beside its metrics, so tests, the index and the
    README can tell a collapsed or unjudging run without the HTML: ``distinct_test_captions``, ``test_pairs``,
    ``judge_accuracy`` (only where the model has a distractor judge) and ``cider_d`` on the x100 scale for the
    ``total``, ``semantic`` and ``distractor`` subsets (a subset the test split lacks is left out).

    ``result`` is a run's result (any ``run_variant``): ``test`` on pycocoevalcap's scale, ``distinct_test_captions``
    and ``test_pairs`` counted from its decoded test captions."""
    test = result.get("test", {})
    out: dict[str, Any] = {"distinct_test_captions": result.get("distinct_test_captions"),
                           "test_pairs": result.get("test_pairs"),
                           "cider_d": {sub: 100.0 * test[sub]["CIDEr-D"] for sub in ("total", "semantic", "distractor")
                                       if sub in test and "CIDEr-D" in test[sub]}}
    if result.get("judge_accuracy") is not None:
        out["judge_accuracy"] = float(result["judge_accuracy"])
    return out


def mean_trained_fields(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`trained_fields` of a mean row: the fewest distinct captions of its seeds, mean judge and CIDEr-D."""
    distinct = [r["distinct_test_captions"] for r in rows if r.get("distinct_test_captions") is not None]
    out: dict[str, Any] = {"distinct_test_captions": min(distinct) if distinct else None,
                           "test_pairs": rows[0].get("test_pairs") if rows else None,
                           "cider_d": {k: statistics.fmean(r["cider_d"][k] for r in rows)
                                       for k in (rows[0].get("cider_d", {}) if rows else {})
                                       if all(k in r.get("cider_d", {}) for r in rows)}}
    judges = [r["judge_accuracy"] for r in rows if r.get("judge_accuracy") is not None]
    if judges and len(judges) == len(rows):
        out["judge_accuracy"] = statistics.fmean(judges)
    return out


def _with_means(out: list[dict[str, Any]], fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``out`` (one row per run) followed by a mean row (with ``sd``) for every (model, variant) run with several
    seeds, over the metrics all its seeds have."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in out:
        groups.setdefault((row["model"], row["variant"]), []).append(row)
    means = []
    for (model, variant), rs in groups.items():
        if len(rs) > 1:
            keys = [k for k in rs[0]["metrics"] if all(k in x["metrics"] for x in rs)]
            stats = {k: mean_sd([x["metrics"][k] for x in rs]) for k in keys}
            means.append({"model": model, "variant": variant, "split": "test", **fields, "seed": "mean",
                          "n_seeds": len(rs), "metrics": {k: v[0] for k, v in stats.items()},
                          "sd": {k: v[1] for k, v in stats.items()}, **mean_trained_fields(rs)})
    return out + means


def rows(results: Sequence[Mapping[str, Any]], subset: str = "total", *, labels: Mapping[str, str] | None = None,
         percent: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Report rows (x100 scale) of ``subset``: one per run, then a mean row (with ``sd``) per variant run with
    several seeds. Each records :func:`trained_fields` (and ``data`` when the result names its data, as hard runs
    do). ``labels`` renames variants (``{"b2w": "IDC-PCL"}``); ``percent`` lists result fields in 0-1 shown among
    the metrics as percentages (SynthBirds' grammar scores)."""
    out = []
    for r in results:
        m = to_paper_scale(r["test"][subset])
        m.update({k: 100.0 * r[k] for k in percent if r.get(k) is not None})
        out.append({"model": r["model"], "variant": (labels or {}).get(r["variant"], r["label"]), "split": "test",
                    "subset": subset, "seed": r.get("seed"), "run": r["run"], "metrics": m, **trained_fields(r),
                    **({"data": r["data"]} if "data" in r else {})})
    return _with_means(out, {"subset": subset})


def per_type_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """CIDEr-D (x100) of each change type and the distractors (:data:`TYPES` the test split has), one row per run,
    then a mean row (with ``sd``) per variant run with several seeds: IDC-PCL's table 3, CLIP4IDC's table 2."""
    out = [{"model": r["model"], "variant": r["label"], "split": "test", "seed": r.get("seed"), "run": r["run"],
            "metrics": {t: 100 * r["test"][t]["CIDEr-D"] for t in TYPES if t in r["test"]}, **trained_fields(r),
            **({"data": r["data"]} if "data" in r else {})} for r in results]
    return _with_means(out, {})


def per_variant(rows: Sequence[Mapping[str, Any]], metric: str = "CIDEr-D") -> dict[str, float]:
    """``{variant: metric}`` of report rows, the mean row where a variant has several seeds."""
    out: dict[str, float] = {}
    for r in rows:
        if r.get("seed") == "mean" or r["variant"] not in out:
            out[r["variant"]] = r["metrics"][metric]
    return out


def ordering_notes(kit: Mapping[str, float], paper: Mapping[str, float], metric: str = "CIDEr-D", *,
                   decimals: int = 1) -> list[str]:
    """Plain sentences saying, for every two rows, whether the kit orders them as the paper does.

    Values are compared as printed (rounded to ``decimals``), so two rows shown with the same number tie. The
    verdict does not depend on which row comes first: ``agrees`` (same order, or both tie), ``TIES`` (the kit ties
    two rows the paper orders), ``DIFFERS`` (the opposite order, or the kit orders two rows the paper ties)."""
    def order(x: float, y: float) -> int:
        d = round(x, decimals) - round(y, decimals)
        return (d > 0) - (d < 0)

    where = {1: "above", 0: "level with", -1: "below"}
    notes = []
    labels = [k for k in paper if k in kit]
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            p, k = order(paper[a], paper[b]), order(kit[a], kit[b])
            verdict = "agrees" if p == k else ("TIES" if k == 0 else "DIFFERS")
            notes.append(f"{verdict}: paper has {a} {where[p]} {b} ({paper[a]:.{decimals}f} vs "
                         f"{paper[b]:.{decimals}f}); the kit has it {where[k]} ({kit[a]:.{decimals}f} vs "
                         f"{kit[b]:.{decimals}f} {metric}).")
    return notes


__all__ = ["TYPES", "mean_sd", "trained_fields", "mean_trained_fields", "rows", "per_type_rows", "per_variant",
           "ordering_notes"]
