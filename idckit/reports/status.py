"""What a report's status means: did the run behind its headline learn?

One rule set, read from a report's JSON rows (never its HTML), shared by the report card, the index page and the
README table:

- only the **headline run** counts: the rows that :func:`headline_rows` picks (the variant the headline names in
  ``headline["runs"]``; otherwise the first trained variant). A baseline row, a chance row, a side row (another
  variant, another model) or a hard-data row never sets the status; the hard-data twin of the headline run gets
  its own status (:func:`hard_status`);
- a captioner is **collapsed** when a seed writes fewer than :data:`COLLAPSE_DISTINCT` distinct test captions (or
  fewer than its test pairs on a smaller set);
- a distractor judge under :data:`JUDGE_CHANCE_BELOW` accuracy, or a retriever whose text->pair R@1 is under
  :data:`RETRIEVAL_LEARNED_FACTOR` x chance or not above its un-adapted control, has **not learned**;
- otherwise **learned**; a report of baselines alone is **no training**.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

#: a captioning run that writes fewer distinct test captions than this (or than it has test pairs, on a smaller
#: test set) has collapsed: its scores say which sentences it settled on, not what it saw
COLLAPSE_DISTINCT = 10
#: share of test pairs given the single most frequent caption at which a run counts as collapsed
COLLAPSE_TOP_SHARE = 0.9
#: a distractor judge below this test accuracy is at chance on the balanced change / distractor test set
JUDGE_CHANCE_BELOW = 0.6
#: a retriever has learned only at this many times chance text->pair R@1 (and above its un-adapted control)
RETRIEVAL_LEARNED_FACTOR = 10.0
#: the model column of rows that are not runs of a model: the kit's baselines and the chance row
NOT_RUNS = ("baseline (idckit)", "chance")
HARD_MARK = "[hard data]"
#: the words a status may say, and whether each means "the numbers do not show learning"
VERDICTS = {"learned": False, "collapsed": True, "not learned": True, "no training": False, "not checked": False}


@dataclass(frozen=True)
class Status:
    verdict: str          # one of VERDICTS
    detail: str = ""

    @property
    def flag(self) -> bool:
        return VERDICTS[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "detail": self.detail, "flag": self.flag}

    def text(self) -> str:
        return self.verdict + (f": {self.detail}" if self.detail else "")


def is_collapsed(distinct: int | None, pairs: int | None = None, top_share: float | None = None) -> bool:
    """Did a captioning run collapse? Fewer than :data:`COLLAPSE_DISTINCT` distinct test captions (fewer than its
    test pairs on a smaller test set), or one caption for :data:`COLLAPSE_TOP_SHARE` of the pairs."""
    if distinct is None:
        return False
    floor = min(COLLAPSE_DISTINCT, pairs) if pairs else COLLAPSE_DISTINCT
    return distinct <= 1 or distinct < floor or (top_share is not None and top_share >= COLLAPSE_TOP_SHARE)


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


def status_of(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Status:
    """The status of ``rows`` (one headline run's seeds) of report ``doc``."""
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
    parts = []
    if captioners:
        parts.append(f"{min(r['distinct_test_captions'] for r in captioners)}+ distinct test captions per seed")
    judges = [r["judge_accuracy"] for r in captioners if r.get("judge_accuracy") is not None]
    if judges:
        parts.append(f"judge accuracy {min(judges):.2f}+")
    if retrievers:
        parts.append(f"text->pair R@1 {min(r['metrics']['t2p_R@1'] / r['chance']['t2p_R@1'] for r in retrievers):.0f}x"
                     " chance or more, above the un-adapted control")
    return Status("learned", ", ".join(parts))


def report_status(doc: Mapping[str, Any]) -> Status:
    """The status of a report: its headline run's (:func:`headline_rows`), never a baseline's or a side row's."""
    if not doc.get("rows") and any(n.startswith("COLLAPSED") for n in doc.get("notes", [])):
        return Status("collapsed", "its notes")
    return status_of(doc, headline_rows(doc))


def hard_status(doc: Mapping[str, Any]) -> Status | None:
    """The status of the headline run's ``[hard data]`` twin, or None where the report has none."""
    rows = headline_rows(doc, hard=True)
    return status_of(doc, rows) if rows else None


__all__ = ["COLLAPSE_DISTINCT", "COLLAPSE_TOP_SHARE", "JUDGE_CHANCE_BELOW", "RETRIEVAL_LEARNED_FACTOR", "Status",
           "is_collapsed", "is_run", "is_hard", "headline_rows", "status_of", "report_status", "hard_status"]
