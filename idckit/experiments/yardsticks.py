"""What every CLEVR-Change table measures its model against, computed by the package, not the notebook:

- :func:`clevr_baselines`: the most frequent caption, the pixel nearest neighbour and the judge oracle
  (:mod:`idckit.eval.baselines`) scored per subset (total, semantic, each change type, distractor) on the test split,
  with how often each names the change (:mod:`idckit.eval.describes`); cached in the runs dir by the data's
  identity, so every table of one dataset shares one computation;
- :func:`add_describes`: the same change-description score on the kit's trained captioning rows;
- :func:`add_bootstrap`: every trained row's per-pair scores (``per_pair``: what a paired bootstrap of two rows
  resamples, :func:`idckit.reports.stats.compare`), and a one-seed row's 95 % bootstrap half-width over its test
  pairs (``ci``); :func:`clevr_baselines` gives the baselines their per-pair scores on the same test pairs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from idckit.eval import describes
from idckit.eval.baselines import JudgeOracle, MostFrequentCaption, NearestDifference
from idckit.eval.captions import evaluate_pairs
from idckit.experiments.reporting import BASELINE_MODEL, TYPES, per_type_rows
from idckit.experiments.reporting import rows as report_rows
from idckit.experiments.runs import open_run, test_captions
from idckit.reports.format import Table, run_label
from idckit.reports.report import to_paper_scale
from idckit.reports.stats import (attach_per_pair, bootstrap_halfwidth, compare, mean_per_pair, per_pair_scores,
                                  standing, tie_best)
from idckit.reports.status import is_hard

#: bump when a baseline's definition changes (its cached predictions are then recomputed)
BASELINES_VERSION = "2"


def _describes(data, split: str, captions: Mapping[str, str]) -> dict[str, float] | None:
    ds = data.dataset()
    pairs = [p for p in ds.pairs(split) if p.pair_id in captions]
    records = describes.change_records(pairs, data.root)
    if not records:
        return None
    return describes.score(captions, records, ds.references(split))


def clevr_baselines(data, runs_dir: str | Path, split: str = "test", *, meteor: bool = True) -> list[dict[str, Any]]:
    """The three no-learning baselines on ``split`` of CLEVR-Change ``data`` (a
    :class:`~idckit.experiments.data.DataChoice`): ``[{"label", "test": {subset: metrics}, "predictions",
    "distinct_test_captions", "test_pairs", "describes", "per_pair"}]`` (``test`` on pycocoevalcap's scale, as a
    run's; ``per_pair``: CIDEr-D x100 per test pair, scored afresh, not cached)."""
    run = open_run(runs_dir, "baselines", {"data": data.identity, "split": split, "meteor": meteor,
                                           "baselines": BASELINES_VERSION})
    if run.is_complete():
        return _with_per_pair(run.metrics()["baselines"], data.dataset().references(split))
    ds = data.dataset()
    train, test = ds.pairs("train"), ds.pairs(split)
    refs, types = ds.references(split), ds.types(split)
    out = []
    for baseline in (MostFrequentCaption(), NearestDifference(), JudgeOracle()):
        preds = baseline.fit(train).predict(test)
        out.append({"label": baseline.name, "test": evaluate_pairs(refs, preds, types, meteor=meteor),
                    "predictions": preds, "distinct_test_captions": len(set(preds.values())),
                    "test_pairs": len(preds), "describes": _describes(data, split, preds)})
    run.complete({"baselines": out}, data=data.description)
    return _with_per_pair(out, refs)


def _with_per_pair(baselines: list[dict[str, Any]], references: Mapping[str, Any]) -> list[dict[str, Any]]:
    for b in baselines:
        caps = {k: v for k, v in b["predictions"].items() if k in references}
        if len(caps) > 1:
            b["per_pair"] = attach_per_pair({}, per_pair_scores(references, caps, "CIDEr-D"), "CIDEr-D")["per_pair"]
    return baselines


def baseline_rows(baselines: Sequence[Mapping[str, Any]], subset: str = "total") -> list[dict[str, Any]]:
    """Report rows (x100) of :func:`clevr_baselines` on ``subset``, each with its CIDEr-D per subset
    (``cider_d``) and its change-description score (``describes``)."""
    return [{"model": BASELINE_MODEL, "variant": b["label"], "split": "test", "subset": subset,
             "metrics": to_paper_scale(b["test"][subset]), "distinct_test_captions": b["distinct_test_captions"],
             "test_pairs": b["test_pairs"],
             "cider_d": {s: 100.0 * b["test"][s]["CIDEr-D"] for s in ("total", "semantic", "distractor")
                         if s in b["test"]},
             **({"per_pair": b["per_pair"]} if b.get("per_pair") and subset == "total" else {}),
             **({"describes": b["describes"]} if b.get("describes") else {})} for b in baselines]


def baseline_type_rows(baselines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Report rows of CIDEr-D (x100) per change type and distractor (the per-type tables' columns)."""
    return [{"model": BASELINE_MODEL, "variant": b["label"], "split": "test",
             "metrics": {t: 100.0 * b["test"][t]["CIDEr-D"] for t in TYPES if t in b["test"]},
             "distinct_test_captions": b["distinct_test_captions"], "test_pairs": b["test_pairs"]}
            for b in baselines]


#: baselines that see the test pair's true label: shown in every table, never the headline's "no-learning" mark
ORACLES = ("judge oracle",)


def best_baseline(rows: Sequence[Mapping[str, Any]], metric: str = "CIDEr-D") -> dict[str, Any]:
    """``{"label", "kit"}`` of the best baseline row on ``metric`` that uses no test label (not an oracle):
    what a headline is put beside."""
    fair = [r for r in rows if r.get("model") == BASELINE_MODEL and r["variant"] not in ORACLES
            and metric in r["metrics"]]
    best = max(fair, key=lambda r: r["metrics"][metric])
    return {"label": best["variant"], "kit": round(best["metrics"][metric], 2)}


def dataset_title(data) -> str:
    """A dataset's short name for titles: "SynthCLEVR-Change" or "CLEVR-Change (real)"."""
    desc = str(getattr(data, "description", data))
    head = desc.split(" (")[0]
    return head.split(": ", 1)[1] if head.startswith("synthetic: ") else f"{head.split(': ')[0]} data"


def headline(rows: Sequence[Mapping[str, Any]], variant: str, label: str, paper: float | None, *,
             metric: str = "CIDEr-D", baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A report's headline: ``variant``'s ``metric`` (its mean row where several seeds ran), the paper's number,
    the run it comes from (the status reads that run alone) and the no-learning baseline beside it."""
    mine = [r for r in rows if r["variant"] == variant and r.get("model") != BASELINE_MODEL]
    row = next((r for r in mine if r.get("seed") == "mean"), mine[0])
    out = {"label": label, "kit": round(row["metrics"][metric], 2), "paper": paper, "metric": metric,
           "runs": {"variants": [variant]}}
    if baseline is None:
        base = [r for r in rows if r.get("model") == BASELINE_MODEL and metric in r["metrics"]]
        baseline = best_baseline(base, metric) if base else None
    if baseline:
        out["baseline"] = dict(baseline)
    return out


def clevr_rows(setup, results: Sequence[Mapping[str, Any]], subset: str = "total") -> list[dict[str, Any]]:
    """:func:`idckit.experiments.reporting.rows` of runs on ``setup``'s CLEVR-Change data, each with how often it
    names the change (``describes``) and, for a one-seed variant, its bootstrap interval (``ci``)."""
    rows = report_rows(results, subset)
    add_describes(rows, results, setup.data)
    add_bootstrap(rows, results, setup.data.dataset().references("test"))
    return rows


def describe_table(rows: Sequence[Mapping[str, Any]], *, caption: str):
    """Per captioning row: CIDEr-D on all, changed and distractor pairs, judge accuracy, distinct captions, and
    how often the captions name the change type and the changed object, beside their chance rates."""
    recs = []
    for r in rows:
        if "cider_d" not in r and "describes" not in r:
            continue
        d = r.get("describes") or {}
        recs.append({"model": r.get("model"), "variant": r["variant"], "run": run_label(r),
                     "total": r.get("cider_d", {}).get("total"), "semantic": r.get("cider_d", {}).get("semantic"),
                     "distractor": r.get("cider_d", {}).get("distractor"), "judge_accuracy": r.get("judge_accuracy"),
                     "distinct": r.get("distinct_test_captions"), **{k: d.get(k) for k in (
                         "type_named", "type_chance", "attributes_named", "attributes_chance")}})
    return Table(recs, ["model", "variant", "run", "total", "semantic", "distractor", "judge_accuracy", "distinct",
                        "type_named", "type_chance", "attributes_named", "attributes_chance"], caption=caption)


def type_rows(setup, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`idckit.experiments.reporting.per_type_rows` of runs on ``setup``'s data, with ``describes``."""
    rows = per_type_rows(results)
    add_describes(rows, results, setup.data)
    return rows


def type_mean(row: Mapping[str, Any], types: Sequence[str]) -> float:
    """The mean of a per-type row's CIDEr-D over ``types`` (the change types the test split has)."""
    return sum(row["metrics"][t] for t in types) / len(types)


def type_headline(rows: Sequence[Mapping[str, Any]], variant: str, label: str, paper: Mapping[str, float],
                  types: Sequence[str]) -> dict[str, Any]:
    """A per-type table's headline: ``variant``'s mean CIDEr-D over ``types`` beside the paper's and the best
    no-learning baseline's (oracles excluded) on the same types."""
    mine = [r for r in rows if r["variant"] == variant and r.get("model") != BASELINE_MODEL]
    row = next((r for r in mine if r.get("seed") == "mean"), mine[0])
    fair = [r for r in rows if r.get("model") == BASELINE_MODEL and r["variant"] not in ORACLES]
    out = {"label": label, "kit": round(type_mean(row, types), 2),
           "paper": round(sum(paper[t] for t in types) / len(types), 2), "metric": "CIDEr-D",
           "runs": {"variants": [variant]}}
    if fair:
        best = max(fair, key=lambda r: type_mean(r, types))
        out["baseline"] = {"label": best["variant"], "kit": round(type_mean(best, types), 2)}
    return out


def type_standing_notes(rows: Sequence[Mapping[str, Any]], variant: str, types: Sequence[str]) -> list[str]:
    """:func:`standing_notes` on the mean CIDEr-D over ``types`` of per-type rows (the seed sd of that mean where
    several seeds ran; with one seed no spread is measured per type, and the sentence says so)."""
    metric = "CIDEr-D, mean of " + "/".join(types)
    flat = []
    for r in rows:
        if not all(t in r["metrics"] for t in types):
            continue
        row = {**r, "metrics": {metric: type_mean(r, types)}}
        if r.get("sd"):
            row["sd"] = {metric: type_mean({"metrics": r["sd"]}, types)}
        flat.append(row)
    return standing_notes(flat, variant, metric)


def type_describe_table(rows: Sequence[Mapping[str, Any]], *, caption: str):
    """Per captioning row and change type: how often its captions name that change type (%), and the chance of
    guessing the most common type."""
    recs = []
    types: list[str] = []
    for r in rows:
        d = r.get("describes") or {}
        by = d.get("type_named_by_type") or {}
        types += [t for t in by if t not in types]
        if by:
            recs.append({"model": r.get("model"), "variant": r["variant"], "run": run_label(r), **by,
                         "type_chance": d.get("type_chance")})
    return Table(recs, ["model", "variant", "run", *types, "type_chance"], caption=caption)


def hardest_type_notes(rows: Sequence[Mapping[str, Any]], paper: Mapping[str, float], variant: str,
                       types: Sequence[str]) -> list[str]:
    """The kit's hardest change type for ``variant`` (lowest CIDEr-D) beside the paper's, named only when no
    other type is within the row's noise (its seed sd per type; with one seed no spread is measured)."""
    mine = [r for r in rows if r["variant"] == variant]
    row = next((r for r in mine if r.get("seed") == "mean"), mine[0])
    sd = row.get("sd") or {}
    worst, tied = tie_best({t: -row["metrics"][t] for t in types}, {t: sd.get(t, 0.0) for t in types})
    paper_worst = min(types, key=lambda t: paper[t])
    noise = "seed sd per type" if sd else "one seed: no spread measured"
    if not sd:
        return [f"Hardest change type: {paper_worst} in the paper; the kit's run does not order its types ({noise})."]
    if worst is None:
        return [f"Hardest change type: {paper_worst} in the paper; in the kit's run no single one ({', '.join(tied)} "
                f"within noise, {noise})."]
    verdict = "agrees" if worst == paper_worst else "differs; the synthetic scenes differ from CLEVR's"
    return [f"Hardest change type: {paper_worst} in the paper, {worst} in the kit's run ({verdict}; {noise})."]


def best_split(rows: Sequence[Mapping[str, Any]], depth: int, metric: str = "CIDEr-D") -> tuple[float | None, str]:
    """Table 7's best split by ``metric`` as N_intra / depth, or None with the tied splits named when another split
    is not below the best one beyond noise (a paired bootstrap over their test pairs,
    :func:`idckit.reports.stats.compare`; without per-pair scores nothing is ordered)."""
    top = max(rows, key=lambda r: r["metrics"][metric])
    tied = [r["variant"] for r in rows if r is top or compare(top, r, metric).order != 1]
    if len(tied) > 1:
        return None, f"tie: {', '.join(tied)} within noise"
    return round(top["n_intra"] / depth, 3), f"best: {top['variant']}"


def standing_notes(rows: Sequence[Mapping[str, Any]], variant: str, metric: str = "CIDEr-D") -> list[str]:
    """Where ``variant`` (its mean row where several seeds ran) stands against every other model's row and every
    baseline row of ``rows`` on ``metric`` (hard-data rows are left to their own table), read against its noise."""
    def pick(rs):
        return next((r for r in rs if r.get("seed") == "mean"), rs[0]) if rs else None

    me = pick([r for r in rows if r["variant"] == variant and r.get("model") != BASELINE_MODEL and not is_hard(r)])
    others: dict[tuple, list] = {}
    for r in rows:
        if r is me or r["variant"] == variant or is_hard(r) or r.get("model") == "chance" or r.get("dataset"):
            continue
        others.setdefault((r.get("model"), r["variant"]), []).append(r)
    refs = [pick(rs) for rs in others.values()]
    return standing(me, refs, metric, model_name=variant)


def add_describes(rows: list[dict[str, Any]], results: Sequence[Mapping[str, Any]], data,
                  split: str = "test") -> list[dict[str, Any]]:
    """Each trained row of ``rows`` whose run (``row["run"]``) wrote test captions gets ``describes``; a mean row
    gets the mean of its seeds'."""
    by_run = {r["run"]: r for r in results}
    for row in rows:
        res = by_run.get(row.get("run"))
        if res is None or res.get("data", data.description) != data.description:
            continue
        caps = test_captions(res["run_dir"])
        if caps:
            d = _describes(data, split, caps)
            if d:
                row["describes"] = d
    for row in rows:
        if row.get("seed") == "mean":
            seeds = [r["describes"] for r in rows if r.get("seed") != "mean" and r.get("describes")
                     and r["variant"] == row["variant"] and r.get("model") == row.get("model")]
            if seeds:
                row["describes"] = {k: sum(s[k] for s in seeds) / len(seeds) for k in seeds[0]
                                    if isinstance(seeds[0][k], (int, float))}
    return rows


def add_bootstrap(rows: list[dict[str, Any]], results: Sequence[Mapping[str, Any]], references: Mapping[str, Any],
                  subset_ids: Sequence[str] | None = None, *, metrics: Sequence[str] = ("CIDEr-D",),
                  tokenize: bool = True, baselines: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Per-pair scores (x100) of ``metrics`` (CIDEr-D and/or ROUGE_L) for each trained row of ``rows`` from its run's
    test captions (``per_pair``; a mean row: the per-pair mean of its seeds), and of each baseline row named by
    ``baselines`` (``{"label", "predictions" or "captions"}``); a one-seed trained row (no seed spread) also gets
    ``ci`` = ``{metric: 95 % bootstrap half-width over its test pairs}``."""
    by_run = {r["run"]: r for r in results}
    by_label = {b["label"]: b.get("predictions") or b.get("captions") or {} for b in baselines}
    seeds: dict[tuple, int] = {}
    for row in rows:
        if row.get("seed") not in (None, "mean"):
            seeds[(row.get("model"), row["variant"])] = seeds.get((row.get("model"), row["variant"]), 0) + 1
    for row in rows:
        res = by_run.get(row.get("run"))
        if res is not None:
            caps = test_captions(res["run_dir"])
        elif row.get("model") == BASELINE_MODEL and row["variant"] in by_label:
            caps = dict(by_label[row["variant"]])
        else:
            continue
        if subset_ids is not None:
            caps = {k: v for k, v in caps.items() if k in set(subset_ids)}
        caps = {k: v for k, v in caps.items() if k in references}
        if len(caps) < 2:
            continue
        scores = {m: per_pair_scores(references, caps, m, tokenize=tokenize) for m in metrics}
        for m, sc in scores.items():
            attach_per_pair(row, sc, m)
        if res is not None and seeds.get((row.get("model"), row["variant"]), 0) <= 1:
            row["ci"] = {m: bootstrap_halfwidth(list(sc.values())) for m, sc in scores.items()}
    for row in rows:
        if row.get("seed") == "mean":
            mine = [r for r in rows if r.get("seed") not in (None, "mean") and r["variant"] == row["variant"]
                    and r.get("model") == row.get("model") and r.get("dataset") == row.get("dataset")]
            for m in metrics:
                pp = mean_per_pair(mine, m)
                if pp is not None:
                    row.setdefault("per_pair", {"pairs": pp["pairs"], "n": pp["n"]})[m] = pp[m]
    return rows


__all__ = ["BASELINES_VERSION", "ORACLES", "clevr_baselines", "baseline_rows", "baseline_type_rows",
           "best_baseline", "dataset_title", "headline", "type_rows", "type_mean", "type_headline",
           "type_standing_notes", "type_describe_table",
           "hardest_type_notes", "best_split", "clevr_rows", "describe_table", "standing_notes",
           "add_describes", "add_bootstrap"]
