"""What a report's status means: what the run behind its headline does beyond the yardsticks.

One rule set, read from a report's JSON rows (never its HTML), decides the status the report card, the index page
and the README table all print (:func:`status_of`, :func:`report_status`). Only the **headline run** counts: the
rows that :func:`headline_rows` picks (the variant the headline names in ``headline["runs"]``; otherwise the first
trained variant). A baseline row, a chance row, a side row (another variant, another model) or a hard-data row never
sets the status; the hard-data twin of the headline run gets its own (:func:`hard_status`).

The statuses (:data:`STATUSES`), checked in this order; only ``describes`` (``retrieves`` for a retriever) is green:

- **collapsed**: a seed writes fewer than :data:`COLLAPSE_DISTINCT` distinct test captions (fewer than its test pairs
  on a smaller set): its scores are those of a few sentences;
- **not learned**: a distractor judge under :data:`JUDGE_CHANCE_BELOW` accuracy, or a retriever whose text->pair R@1
  is under :data:`RETRIEVAL_LEARNED_FACTOR` x chance or not above its un-adapted control;
- **describes**: the headline is above the best no-learning baseline beyond noise (:func:`idckit.reports.stats.compare`)
  and, where the data has change types, the captions name the change type above chance beyond noise
  (:func:`type_named`);
- **judges only**: the distractor judge learned, but the captions score at the judge oracle (within noise of it) or
  name the change type no more often than chance: the model tells a change from none, not what changed;
- **below baseline**: below the best no-learning baseline beyond noise;
- **at baseline**: not shown to differ from it (within noise, no noise measured, or above it while naming the
  change type at chance);
- **retrieves**: a retriever at :data:`RETRIEVAL_LEARNED_FACTOR` x chance text->pair R@1 or more, above its
  un-adapted control;
- **no training** (a report of baselines alone) and **not checked** (rows without the fields the rules read, or no
  baseline to compare with).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from idckit.reports.format import name
from idckit.reports.stats import COLLAPSE_DISTINCT, COLLAPSE_TOP_SHARE, Ordering, compare, is_collapsed

#: a distractor judge below this test accuracy is at chance on the balanced change / distractor test set
JUDGE_CHANCE_BELOW = 0.6
#: a retriever has learned only at this many times chance text->pair R@1 (and above its un-adapted control)
RETRIEVAL_LEARNED_FACTOR = 10.0
#: the model column of rows that are not runs of a model: the kit's baselines and the chance row
NOT_RUNS = ("baseline (idckit)", "chance")
HARD_MARK = "[hard data]"
#: the baseline that sees each test pair's true change / no-change label: the yardstick of "judges only", never the
#: headline's no-learning baseline
JUDGE_ORACLE = "judge oracle"
#: z of a one-sided 95 % test of a rate against its chance rate
Z95 = 1.96
#: how a headline label names its metric, for a report whose headline has no "metric"
LABEL_METRICS = (("N_intra", "split_ratio"), ("ROUGE-L", "ROUGE_L"), ("R@1", "t2p_R@1"), ("CIDEr-D", "CIDEr-D"),
                 ("BLEU-4", "Bleu_4"))
#: every status word, in the order the rules try them, and what it means (the index, the docs and the walkthrough
#: print this)
STATUSES: dict[str, str] = {
    "collapsed": f"a seed writes fewer than {COLLAPSE_DISTINCT} distinct test captions: its scores are those of a "
                 "few sentences",
    "not learned": f"its distractor judge is under {JUDGE_CHANCE_BELOW:.2f} accuracy, or its text->pair R@1 under "
                   f"{RETRIEVAL_LEARNED_FACTOR:g}x chance or not above the un-adapted encoder",
    "describes": "above the best no-learning baseline beyond noise and, where the data has change types, names the "
                 "change type above chance beyond noise",
    "retrieves": f"a retriever at {RETRIEVAL_LEARNED_FACTOR:g}x chance text->pair R@1 or more, above the un-adapted "
                 "encoder",
    "judges only": "the distractor judge learned, but the captions score at the judge oracle or name the change type "
                   "at chance: it tells a change from none, not what changed",
    "below baseline": "below the best no-learning baseline beyond noise",
    "at baseline": "not shown to differ from the best no-learning baseline (within noise, or no noise measured)",
    "not checked": "the rows lack what the rules read (distinct captions, a baseline): re-run to check",
    "no training": "baselines only: no model is trained in the report",
}
#: the words that mean "the numbers show the model doing the task beyond the yardsticks" (shown green)
GREEN = ("describes", "retrieves")
#: the words that mean "the numbers show no learning" (shown red)
FLAGGED = ("collapsed", "not learned", "below baseline")
VERDICTS = {v: v in FLAGGED for v in STATUSES}


@dataclass(frozen=True)
class Status:
    verdict: str          # one of STATUSES
    detail: str = ""

    @property
    def flag(self) -> bool:
        return VERDICTS[self.verdict]

    @property
    def green(self) -> bool:
        return self.verdict in GREEN

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "detail": self.detail, "flag": self.flag}

    def text(self) -> str:
        return self.verdict + (f": {self.detail}" if self.detail else "")


def is_run(row: Mapping[str, Any]) -> bool:
    """A row of a model the kit trained: it names its seed (a baseline or chance row has none)."""
    return (row.get("model") not in NOT_RUNS and not str(row.get("model", "")).startswith("baseline")
            and row.get("seed") is not None)


def is_hard(row: Mapping[str, Any]) -> bool:
    return HARD_MARK in str(row.get("variant", ""))


def _selector(doc: Mapping[str, Any]) -> dict[str, Any]:
    runs = (doc.get("headline") or {}).get("runs")
    if isinstance(runs, str):
        return {"variants": [runs]}
    return dict(runs) if isinstance(runs, Mapping) else {}


def headline_rows(doc: Mapping[str, Any], *, hard: bool = False, means: bool = False) -> list[dict[str, Any]]:
    """The rows of the run(s) behind a report's headline, one per seed (``means``: the mean rows instead).

    ``headline["runs"]`` = ``{"variants": [...], "model": ..., "dataset": ...}`` (or one variant name) picks them;
    a report without it falls back to the first trained variant of its first dataset. ``hard``: the same variant's
    ``[hard data]`` twin."""
    rows = [r for r in doc.get("rows", []) if is_run(r) and is_hard(r) == hard]
    rows = [r for r in rows if (r.get("seed") == "mean") == means]
    if not rows and means:
        return []
    sel = _selector(doc)
    strip = (lambda v: v.replace(f" {HARD_MARK}", "")) if hard else (lambda v: v)
    if sel.get("variants"):
        rows = [r for r in rows if strip(r["variant"]) in sel["variants"]]
        if "model" in sel:
            rows = [r for r in rows if r.get("model") == sel["model"]]
        return [r for r in rows if r.get("dataset") == sel.get("dataset")]
    first = [r for r in doc.get("rows", []) if is_run(r) and not is_hard(r)]
    if not first:
        return []
    key = _fallback_key(first, str((doc.get("headline") or {}).get("label", "")))
    return [r for r in rows if (r.get("model"), strip(r["variant"]), r.get("dataset")) == key]


def _fallback_key(rows: Sequence[Mapping[str, Any]], label: str) -> tuple:
    """For a report written before headlines named their run: the variant the headline label names first (the
    longest name where two start at the same word), else a "(full)" variant, else the first row's."""
    first_dataset = rows[0].get("dataset")
    rows = [r for r in rows if r.get("dataset") == first_dataset]
    named = [(label.find(r["variant"]), -len(r["variant"]), i) for i, r in enumerate(rows) if r["variant"] in label]
    if named:
        pick = rows[min(named)[2]]
    else:
        pick = next((r for r in rows if "(full)" in r["variant"]), rows[0])
    return pick.get("model"), pick["variant"], pick.get("dataset")


def _name(r: Mapping[str, Any]) -> str:
    seed = r.get("seed")
    return f"{r.get('variant') or r.get('model')}" + (f", seed {seed}" if seed not in (None, "mean") else "")


def _control(doc: Mapping[str, Any], row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The un-adapted control of a retrieval row: the "before adaptation" row of the same model, seed and data."""
    for r in doc.get("rows", []):
        if (str(r.get("variant", "")).startswith("before adaptation") and r.get("seed") == row.get("seed")
                and r.get("dataset") == row.get("dataset") and r.get("model") == row.get("model")):
            return r
    return None


def headline_metric(doc: Mapping[str, Any]) -> str | None:
    """The metric a report's headline is on: ``headline["metric"]``, else the one its label names."""
    head = doc.get("headline") or {}
    if head.get("metric"):
        return head["metric"]
    label = head.get("label", "")
    return next((m for word, m in LABEL_METRICS if word in label), None)


def _mean_row(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The mean row of the run ``rows`` are the seeds of (the same model, variant, dataset), or None."""
    r0 = rows[0]
    return next((r for r in doc.get("rows", []) if r.get("seed") == "mean" and r.get("variant") == r0.get("variant")
                 and r.get("model") == r0.get("model") and r.get("dataset") == r0.get("dataset")), None)


def _baseline_rows(doc: Mapping[str, Any], row: Mapping[str, Any], metric: str) -> list[Mapping[str, Any]]:
    """The no-learning rows scored on ``row``'s test pairs (same dataset and data) on ``metric``."""
    return [r for r in doc.get("rows", []) if not is_run(r) and r.get("model") != "chance"
            and metric in r.get("metrics", {}) and r.get("dataset") == row.get("dataset")
            and r.get("data") == row.get("data")]


def _best_baseline(doc: Mapping[str, Any], row: Mapping[str, Any], metric: str) -> Mapping[str, Any] | None:
    """The headline's no-learning baseline row: the one ``headline["baseline"]`` names, else the best (the judge
    oracle, which sees the test label, excluded)."""
    fair = [r for r in _baseline_rows(doc, row, metric) if r.get("variant") != JUDGE_ORACLE]
    named = ((doc.get("headline") or {}).get("baseline") or {}).get("label")
    pick = next((r for r in fair if r.get("variant") == named), None)
    return pick or (max(fair, key=lambda r: r["metrics"][metric]) if fair else None)


def type_named(rows: Sequence[Mapping[str, Any]], mean: Mapping[str, Any] | None = None) -> tuple[bool | None, str]:
    """Do the captions name the change type above chance beyond noise? (True / False / None where no row records
    ``describes``, how to say it). The noise: a one-sided 95 % binomial margin at the chance rate over every seed's
    changed pairs, combined with the seed sd of the rate where two or more seeds recorded it."""
    ds = [r["describes"] for r in rows if isinstance(r.get("describes"), Mapping) and
          r["describes"].get("type_named") is not None]
    if not ds and mean is not None and isinstance(mean.get("describes"), Mapping):
        ds = [mean["describes"]]
    if not ds:
        return None, ""
    rate = sum(d["type_named"] for d in ds) / len(ds)
    chance = ds[0]["type_chance"]
    n = sum(d.get("changed_pairs") or 0 for d in ds)
    p0 = chance / 100.0
    binom = 100.0 * Z95 * math.sqrt(p0 * (1 - p0) / n) if n else 0.0
    sd = (math.sqrt(sum((d["type_named"] - rate) ** 2 for d in ds) / (len(ds) - 1)) if len(ds) > 1 else 0.0)
    margin = math.sqrt(binom ** 2 + sd ** 2)
    above = margin > 0 and rate - chance > margin
    return above, (f"names the change type for {rate:.1f} % of changed pairs (chance {chance:.1f} %, margin "
                   f"{margin:.1f})")


def _gap(o: Ordering) -> str:
    if not o.tested:
        return f"{name(o.metric)} {o.gap:+.1f} against {o.b}, not ordered: {o.how}"
    return f"{name(o.metric)} {o.gap:+.1f} against {o.b} (noise {o.noise:.1f}, {o.how})"


def status_of(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Status:
    """The status of ``rows`` (one headline run's seeds) of report ``doc`` (the rules: the module's docstring)."""
    if not rows:
        if any(is_run(r) for r in doc.get("rows", [])):
            return Status("not checked", "the report names no headline run")
        return Status("no training", "baselines only")
    captioners = [r for r in rows if "distinct_test_captions" in r and r["distinct_test_captions"] is not None]
    retrievers = [r for r in rows if "chance" in r and "t2p_R@1" in r.get("metrics", {})]
    if not captioners and not retrievers:
        return Status("not checked", "written before reports recorded distinct captions; re-run to check")
    collapsed = [r for r in captioners if is_collapsed(r["distinct_test_captions"], r.get("test_pairs"))]
    if collapsed:
        worst = min(collapsed, key=lambda r: r["distinct_test_captions"])
        n = worst["distinct_test_captions"]
        return Status("collapsed", f"{len(collapsed)} of {len(captioners)} seed run(s) write fewer than "
                                   f"{COLLAPSE_DISTINCT} distinct test captions; fewest {n} ({_name(worst)})")
    failed = []
    for r in retrievers:
        r1, ch = r["metrics"]["t2p_R@1"], r["chance"]["t2p_R@1"]
        ctrl = _control(doc, r)
        if r1 < RETRIEVAL_LEARNED_FACTOR * ch:
            failed.append(f"{_name(r)}: text->pair R@1 {r1:.1f} is {r1 / ch:.1f}x chance ({ch:.2f}, learned needs "
                          f"{RETRIEVAL_LEARNED_FACTOR:g}x)")
        elif ctrl is not None and r1 <= ctrl["metrics"].get("t2p_R@1", float("inf")):
            failed.append(f"{_name(r)}: text->pair R@1 {r1:.1f}, not above the un-adapted "
                          f"{ctrl['metrics']['t2p_R@1']:.1f}")
    failed += [f"{_name(r)}: judge accuracy {r['judge_accuracy']:.2f} (chance 0.5)" for r in captioners
               if r.get("judge_accuracy") is not None and r["judge_accuracy"] < JUDGE_CHANCE_BELOW]
    if failed:
        return Status("not learned", "; ".join(failed))
    if not captioners:
        return Status("retrieves", f"text->pair R@1 "
                                   f"{min(r['metrics']['t2p_R@1'] / r['chance']['t2p_R@1'] for r in retrievers):.0f}x"
                                   " chance or more, above the un-adapted control")
    return _captioner_status(doc, captioners)


def _headline_row(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The row standing for run ``rows``: its mean row where several seeds ran, else its one seed."""
    mean = _mean_row(doc, rows)
    return mean if mean is not None and len(rows) > 1 else rows[0]


def _orderings(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> tuple[Ordering | None, Ordering | None]:
    """The headline run against its best no-learning baseline and against the judge oracle, on the headline's
    metric (the unpaired noise where the rows store no per-pair scores; None where there is no such row)."""
    row = _headline_row(doc, rows)
    metric = headline_metric(doc)
    if metric and metric in row.get("metrics", {}):
        base = _best_baseline(doc, row, metric)
        oracle = next((r for r in _baseline_rows(doc, row, metric) if r.get("variant") == JUDGE_ORACLE), None)
        return (base and compare(row, base, metric, paired_only=False),
                oracle and compare(row, oracle, metric, paired_only=False))
    head = doc.get("headline") or {}
    base = head.get("baseline") or {}
    if metric and not row.get("data") and head.get("kit") is not None and base.get("kit") is not None:
        # a headline that is no row's metric (a mean over change types): its number beside its baseline's, with
        # no noise measured for it, so never ordered
        return compare({"metrics": {metric: head["kit"]}}, {"metrics": {metric: base["kit"]}}, metric,
                       a_name=metric, b_name=base.get("label", "baseline"), paired_only=False), None
    return None, None


def baseline_ordering(doc: Mapping[str, Any]) -> Ordering | None:
    """The headline run against its best no-learning baseline, as the status reads it (the card's verdict says
    this one), or None."""
    rows = headline_rows(doc)
    return _orderings(doc, rows)[0] if rows else None


def _captioner_status(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Status:
    """describes / judges only / below baseline / at baseline / not checked, for captioning seed ``rows`` that
    neither collapsed nor failed their judge."""
    judges = [r["judge_accuracy"] for r in rows if r.get("judge_accuracy") is not None]
    named, named_text = type_named(rows, _mean_row(doc, rows))
    vs_base, vs_oracle = _orderings(doc, rows)
    parts = [p for p in (named_text, f"judge accuracy {min(judges):.2f}+" if judges else "") if p]
    if vs_base is not None and vs_base.order == 1 and named is not False:
        return Status("describes", "; ".join([_gap(vs_base), *parts]))
    at_oracle = vs_oracle is not None and vs_oracle.tested and vs_oracle.order == 0
    if judges and (at_oracle or named is False):
        why = [f"within noise of the judge oracle ({_gap(vs_oracle)})"] if at_oracle else []
        return Status("judges only", "; ".join([*why, *parts]))
    if vs_base is None:
        return Status("not checked", "; ".join(["no no-learning baseline on its test pairs to compare with", *parts]))
    if vs_base.order == -1:
        return Status("below baseline", "; ".join([_gap(vs_base), *parts]))
    return Status("at baseline", "; ".join([_gap(vs_base), *parts]))


def report_status(doc: Mapping[str, Any]) -> Status:
    """The status of a report: its headline run's (:func:`headline_rows`), never a baseline's or a side row's."""
    if not doc.get("rows") and any(n.startswith("COLLAPSED") for n in doc.get("notes", [])):
        return Status("collapsed", "its notes")
    return status_of(doc, headline_rows(doc))


def hard_status(doc: Mapping[str, Any]) -> Status | None:
    """The status of the headline run's ``[hard data]`` twin, or None where the report has none."""
    rows = headline_rows(doc, hard=True)
    return status_of(doc, rows) if rows else None


__all__ = ["COLLAPSE_DISTINCT", "COLLAPSE_TOP_SHARE", "JUDGE_CHANCE_BELOW", "RETRIEVAL_LEARNED_FACTOR", "JUDGE_ORACLE",
           "STATUSES", "GREEN", "FLAGGED", "VERDICTS", "LABEL_METRICS", "headline_metric", "type_named",
           "baseline_ordering",
           "Status",
           "is_collapsed", "is_run", "is_hard", "headline_rows", "status_of", "report_status", "hard_status"]
