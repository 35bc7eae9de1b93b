"""Report rows from run results: what the table notebooks of both papers show.

A result of any experiment module's ``run_variant`` (the keys of :data:`idckit.experiments.runs.RESULT_KEYS`)
becomes a row on the papers' x100 scale: :func:`rows` (one subset, and a mean +/- sd row per variant run with
several seeds) and :func:`per_type_rows` (CIDEr-D per change type); every trained row carries
:func:`trained_fields`, so a report says whether its runs collapsed. Orderings with statistics are
:mod:`idckit.reports.stats`; the CLEVR baselines and yardsticks :mod:`idckit.experiments.yardsticks`. Baselines
become rows with :func:`baseline_rows`, Birds-to-Words' pivot-branch scores with :func:`selection_rows`, and
CLIP4IDC's retrieval runs with :func:`retrieval_rows` and :func:`layer_split_rows` (tables 6 and 7). Writing,
reading and judging the report files is :mod:`idckit.reports.report`.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR
from idckit.experiments.selection import KIT_LABEL
from idckit.reports.report import retrieval_chance, to_paper_scale
from idckit.reports.stats import compare

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
                           "cider_d": {sub: 100.0 * test[sub]["CIDEr-D"] for sub in ("total", "semantic", DISTRACTOR)
                                       if sub in test and "CIDEr-D" in test[sub]}}
    if result.get("judge_accuracy") is not None:
        out["judge_accuracy"] = float(result["judge_accuracy"])
    return out


def authors_fields(result: Mapping[str, Any], metrics: Callable[[Mapping[str, Any]], dict[str, float]]
                   ) -> dict[str, Any]:
    """Where a run also kept the checkpoint the authors' scripts would keep (``paper``: metrics.json's
    ``authors_selection``, :mod:`idckit.experiments.selection`): ``selection`` naming the row's own numbers
    val-selected, and ``authors_selection`` = ``{"label", "step", "val_step", "metrics"}``, that checkpoint's test
    numbers on the row's terms (``metrics(test)``: the row's metrics from a test breakdown). ``{}`` otherwise, so a
    run without one (cpu, smoke) reports nothing more."""
    a = result.get("authors_selection")
    if not isinstance(a, Mapping) or a.get("test") is None:
        return {}
    return {"selection": KIT_LABEL, "authors_selection": {"label": a["label"], "step": a["best_step"],
                                                          "val_step": a["val_best_step"],
                                                          "metrics": metrics(a["test"])}}


def _mean_authors(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`authors_fields` of a mean row: the mean over seeds where every seed has them."""
    picked = [r.get("authors_selection") for r in rows]
    if not rows or any(a is None for a in picked):
        return {}
    keys = [k for k in picked[0]["metrics"] if all(k in a["metrics"] for a in picked)]
    stats = {k: mean_sd([a["metrics"][k] for a in picked]) for k in keys}
    return {"selection": KIT_LABEL, "authors_selection": {
        "label": picked[0]["label"], "steps": [a["step"] for a in picked],
        "metrics": {k: v[0] for k, v in stats.items()}, "sd": {k: v[1] for k, v in stats.items()}}}


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
                          "sd": {k: v[1] for k, v in stats.items()}, **mean_trained_fields(rs), **_mean_authors(rs)})
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
                    **({"data": r["data"]} if "data" in r else {}),
                    # the grammar's shares are the val-selected captions' alone: not among the authors' metrics
                    **authors_fields(r, lambda t: to_paper_scale(t[subset]))})
    return _with_means(out, {"subset": subset})


def per_type_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """CIDEr-D (x100) of each change type and the distractors (:data:`TYPES` the test split has), one row per run,
    then a mean row (with ``sd``) per variant run with several seeds: IDC-PCL's table 3, CLIP4IDC's table 2."""
    def per_type(test: Mapping[str, Any]) -> dict[str, float]:
        return {t: 100 * test[t]["CIDEr-D"] for t in TYPES if t in test}

    out = [{"model": r["model"], "variant": r["label"], "split": "test", "seed": r.get("seed"), "run": r["run"],
            "metrics": per_type(r["test"]), **trained_fields(r),
            **({"data": r["data"]} if "data" in r else {}), **authors_fields(r, per_type)} for r in results]
    return _with_means(out, {})


def per_variant(rows: Sequence[Mapping[str, Any]], metric: str = "CIDEr-D") -> dict[str, float]:
    """``{variant: metric}`` of report rows, the mean row where a variant has several seeds."""
    out: dict[str, float] = {}
    for r in rows:
        if r.get("seed") == "mean" or r["variant"] not in out:
            out[r["variant"]] = r["metrics"][metric]
    return out


def gap_notes(rows: Sequence[Mapping[str, Any]], reference: str, others: Sequence[str],
              metrics: Mapping[str, str], *, subject: str, n_seeds: int) -> list[str]:
    """One sentence per metric and row of ``others``: its mean minus ``reference``'s, read against the paired
    bootstrap over test pairs combined with the seed spread (:func:`idckit.reports.stats.compare`): "helps" /
    "hurts" only beyond it, nothing where no paired test exists. ``metrics`` maps a metric key to its printed
    name."""
    def pick(variant: str) -> Mapping[str, Any]:
        mine = [r for r in rows if r["variant"] == variant]
        return next((r for r in mine if r.get("seed") == "mean"), mine[0])

    out = []
    for metric, name in metrics.items():
        for lb in others:
            o = compare(pick(lb), pick(reference), metric)
            if not o.tested:
                out.append(f"{lb} vs {reference} on {name}: {o.gap:+.1f} ({n_seeds} seed(s)), not ordered: {o.how}.")
                continue
            verdict = {1: "helps", -1: "hurts", 0: "makes no difference beyond the noise"}[o.order]
            out.append(f"{lb} vs {reference} on {name}: {o.gap:+.1f} against a noise of {o.noise:.1f} ({o.how}): "
                       f"here {subject} {verdict}.")
    return out


# -- baselines and comparisons -------------------------------------------------------------------------------------
#: the model column of the kit's baseline rows (they see no image, or only features' nearest neighbour)
BASELINE_MODEL = "baseline (idckit)"


def baseline_rows(results: Sequence[Mapping[str, Any]], *, percent: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Report rows (x100, ``total``) of scored baselines (``{"label", "test", "distinct_test_captions",
    "test_pairs", ...}``, e.g. :func:`idckit.experiments.birds.baselines`); ``percent`` as in :func:`rows`."""
    out = []
    for r in results:
        m = to_paper_scale(r["test"]["total"])
        m.update({k: 100.0 * r[k] for k in percent if r.get(k) is not None})
        out.append({"model": BASELINE_MODEL, "variant": r["label"], "split": "test", "subset": "total",
                    "metrics": m, "distinct_test_captions": r["distinct_test_captions"],
                    "test_pairs": r["test_pairs"]})
    return out


def selection_rows(results: Sequence[Mapping[str, Any]], metric: str = "ROUGE_L") -> list[dict[str, Any]]:
    """Per run, ``metric`` (x100) on each pivot-branch selection of Birds-to-Words' test split (sameSpecies ...
    sameClass)."""
    out = []
    for r in results:
        out.append({"variant": r["label"], "seed": r.get("seed"),
                    **{sub: 100.0 * sc[metric] for sub, sc in r["test"].items() if sub not in ("total", "semantic")}})
    return out


# -- retrieval rows: CLIP4IDC's tables 6 and 7 ----------------------------------------------------------------------
#: the retrieval metrics of CLEVR-Change's rows, both directions (another dataset's:
#: :func:`idckit.experiments.clip4idc.retrieval_keys`)
RETRIEVAL_KEYS = ("t2p_R@1", "t2p_R@5", "t2p_R@10", "t2p_MdR", "t2p_MnR", "p2t_R@1", "p2t_R@5", "p2t_R@10",
                  "p2t_MdR", "p2t_MnR")


def _chance(n_pairs: int, keys: Sequence[str]) -> dict[str, float]:
    ks = sorted({int(k.split("@")[1]) for k in keys if "_R@" in k})
    return {k: v for k, v in retrieval_chance(n_pairs, ks).items() if k in keys}


def retrieval_rows(adapted: Sequence[Mapping[str, Any]], *, unadapted: bool = True, n_pairs: int | None = None,
                   keys: Sequence[str] = RETRIEVAL_KEYS) -> list[dict[str, Any]]:
    """Test retrieval rows of adaptation runs (:func:`idckit.experiments.clip4idc.adapt`, or the recipe
    ``clip4idc/adapt``) and, per run, the same encoder before adaptation and plain CLIP.

    With ``n_pairs`` (:func:`idckit.experiments.clip4idc.test_pairs_retrieved`) each adapted row records the
    ``chance`` metrics of a random ranking, and a last row shows them, so a reader sees how far above chance the
    encoder ranks. ``keys``: the metrics of the rows (``clip4idc.retrieval_keys`` of the setup)."""
    chance = _chance(n_pairs, keys) if n_pairs else None
    out = []
    for a in adapted:
        split = f"{a['n_intra']}/{a['n_inter']}"
        out.append({"model": a["model"], "variant": f"adapted ({split})", "split": "test", "seed": a["seed"],
                    "run": a["run"], "metrics": {k: a["test"][k] for k in keys},
                    **({"chance": chance} if chance else {}),
                    **authors_fields(a, lambda t: {k: t[k] for k in keys})})
        if unadapted:
            out.append({"model": a["model"], "variant": f"before adaptation ({split}, fresh e1/e2/p)",
                        "split": "test", "seed": a["seed"], "metrics": {k: a["test_unadapted"][k] for k in keys}})
            out.append({"model": a["model"], "variant": "plain CLIP (mean of the two image embeddings)",
                        "split": "test", "seed": a["seed"],
                        "metrics": {k: a["test_plain_clip"][k] for k in keys}})
    if chance:
        out.append(chance_row(n_pairs, keys))
    return out


def layer_split_rows(splits: Sequence[Mapping[str, Any]], adapted: Sequence[Mapping[str, Any]],
                     captioned: Sequence[Mapping[str, Any]], n_pairs: int | None = None) -> list[dict[str, Any]]:
    """Table 7's rows: per split (:func:`idckit.experiments.clip4idc.layer_splits`), test retrieval of its
    adaptation run beside test captioning (x100) of its frozen-encoder captioner, with what a trained row records
    (:func:`trained_fields`, retrieval chance)."""
    chance = {k: v for k, v in retrieval_chance(n_pairs).items() if k in RETRIEVAL_KEYS} if n_pairs else None
    out = []
    def both(retrieval: Mapping[str, Any], captioning: Mapping[str, Any]) -> dict[str, float]:
        metrics = {m: retrieval[m] for m in RETRIEVAL_KEYS}
        metrics.update({m: 100 * captioning["total"][m] for m in ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
                        if m in captioning["total"]})
        return metrics

    for sp, a, c in zip(splits, adapted, captioned):
        # the authors' pick of both stages, or of neither: a row never mixes the two selections
        picked = authors_fields(a, lambda t: t) and authors_fields(c, lambda t: t)
        out.append({"model": c["model"], "variant": sp["label"], "paper_split": sp["paper_split"],
                    "n_intra": sp["n_intra"], "split": "test", "seed": c["seed"], "run": c["run"],
                    "adapt_run": a["run"], "metrics": both(a["test"], c["test"]), **trained_fields(c),
                    **({"chance": chance} if chance else {}),
                    **(authors_fields(c, lambda t: both(a["authors_selection"]["test"], t)) if picked else {})})
    return out


def chance_row(n_pairs: int, keys: Sequence[str] = RETRIEVAL_KEYS) -> dict[str, Any]:
    """A table row with the retrieval metrics (``keys``) of a random ranking of ``n_pairs`` test pairs."""
    return {"model": "chance", "variant": f"random ranking of {n_pairs} test pairs", "split": "test",
            "metrics": _chance(n_pairs, keys)}


__all__ = ["TYPES", "mean_sd", "trained_fields", "authors_fields", "mean_trained_fields", "rows", "per_type_rows",
           "per_variant", "gap_notes", "BASELINE_MODEL", "baseline_rows", "selection_rows", "RETRIEVAL_KEYS",
           "retrieval_rows", "layer_split_rows", "chance_row"]
