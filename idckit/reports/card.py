"""The summary card at the top of every report, and the one summary of a report that the card, the index page
and the README's results table all print (so a number shown in two places comes from one function).

The card says, before any method prose or table: the headline with its no-learning baseline and the paper's
number side by side, the status in words (:mod:`idckit.reports.status`), a one-sentence verdict, the seeds as
mean ± sd, how often the captions name the change (CLEVR tables), and links to the index, the JSON and the docs.
``idckit reproduce`` inserts it into each report's HTML right under the title (:func:`with_card`).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from idckit.reports.format import fmt
from idckit.reports.status import (Status, baseline_ordering, hard_status, headline_metric, headline_rows, is_run,
                                   report_status)

CARD_START, CARD_END = "<!-- idckit-card -->", "<!-- /idckit-card -->"
PAPERS = {"pcl": "IDC-PCL (Yao et al., AAAI 2022)", "clip4idc": "CLIP4IDC (Guo et al., AACL 2022)"}
#: the docs page of each report family, relative to reports/
DOCS = {"pcl": "../docs/idcpcl.md", "clip4idc": "../docs/clip4idc.md", "birds": "../docs/birds.md"}
#: the card's name for the headline's own (val-selected) number where the authors' selection stands beside it
KIT_SELECTION = "val-selected (kit)"


def paper_of(doc: Mapping[str, Any]) -> str:
    """The paper a report belongs to ("IDC-PCL (...)", "CLIP4IDC (...)") or "the kit" (the walkthrough)."""
    return PAPERS.get(str(doc.get("table", "")).split(".")[0], "the kit")


def docs_link(doc: Mapping[str, Any]) -> str:
    nb = str(doc.get("notebook", ""))
    if "birds" in nb or nb == "table5_cross_task":
        return DOCS["birds"]
    return DOCS.get(str(doc.get("table", "")).split(".")[0], "../README.md")


def baseline_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The no-learning baseline beside the headline: ``headline["baseline"]`` (``{"label", "kit"}``) where the
    notebook computed it on the headline's own terms; else the best baseline row on the headline's metric (the
    chance row for retrieval)."""
    head = doc.get("headline") or {}
    if isinstance(head.get("baseline"), Mapping):
        return dict(head["baseline"])
    metric = headline_metric(doc)
    if metric is None or head.get("metric_kind") == "difference" or not any(is_run(r) for r in doc.get("rows", [])):
        return None   # a report of baselines alone: its headline is a baseline
    runs = head.get("runs")
    dataset = runs.get("dataset") if isinstance(runs, Mapping) else None
    candidates = [r for r in doc.get("rows", []) if not is_run(r) and metric in r.get("metrics", {})
                  and r.get("dataset") == dataset]
    if not candidates:
        return None
    best = max(candidates, key=lambda r: r["metrics"][metric])
    label = "chance" if best.get("model") == "chance" else best.get("variant", "baseline")
    return {"label": label, "kit": best["metrics"][metric]}


@dataclass
class Summary:
    """What the card, the index and the README print for one report."""
    notebook: str
    paper: str
    title: str
    label: str
    kit: float | None
    sd: float | None
    n_seeds: int
    seeds: list
    baseline: dict[str, Any] | None
    paper_value: float | None
    status: Status
    hard: Status | None
    verdict: str
    describes: dict[str, Any] | None
    data: str
    backbone: str
    profile: str
    commit: str
    wall_seconds: float | None
    train_seconds: float | None
    date: str
    environment: str
    metric: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: the headline run's number where its checkpoint is selected the authors' way (``{"label", "kit", "sd"}``,
    #: :func:`authors_of`); None where the run kept no such checkpoint (cpu, smoke)
    authors: dict[str, Any] | None = None

    def kit_text(self) -> str:
        if self.kit is None:
            return "tie" if "tie" in self.label else "–"
        return fmt(self.kit, self.metric) + (f" ± {fmt(self.sd, self.metric)}" if self.sd is not None
                                             and self.n_seeds > 1 else "")

    def authors_text(self) -> str:
        if not self.authors:
            return ""
        sd = self.authors.get("sd")
        return fmt(self.authors["kit"], self.metric) + (f" ± {fmt(sd, self.metric)}" if sd is not None
                                                        and self.n_seeds > 1 else "")

    def baseline_text(self) -> str:
        return "–" if not self.baseline else f"{fmt(self.baseline['kit'], self.metric)} ({self.baseline['label']})"

    def paper_text(self) -> str:
        return fmt(self.paper_value, self.metric)

    def seeds_text(self) -> str:
        if self.n_seeds > 1:
            return f"{self.n_seeds} seeds ({', '.join(map(str, self.seeds))}), mean ± sd"
        return f"one seed ({', '.join(map(str, self.seeds)) or '–'})"


def _verdict(doc: Mapping[str, Any], status: Status, kit: float | None, baseline: dict | None,
             mean_row: Mapping[str, Any] | None, metric: str | None) -> str:
    """The status word and why: the headline against its baseline as the status read it
    (:func:`idckit.reports.status.baseline_ordering`), never a second reading of the numbers."""
    rows = headline_rows(doc)
    if status.verdict == "no training":
        return "baselines only: no model is trained in this report."
    if status.verdict == "not checked":
        return "not checked: " + status.detail + "."
    against = ""
    o = baseline_ordering(doc)
    if o is not None and baseline and kit is not None and metric:
        nums = f"{fmt(kit, metric)} vs {fmt(baseline['kit'], metric)}"
        if not o.tested:
            against = f"not ordered against the baseline ({nums}; {o.how})"
        else:
            against = {1: "above the baseline", -1: "below the baseline", 0: "within noise of the baseline"}[o.order]
            against += f" ({nums}; noise {fmt(o.noise, metric)}, {o.how})"
    if status.verdict == "collapsed":
        fewest = min(r["distinct_test_captions"] for r in rows if r.get("distinct_test_captions") is not None)
        words = "one sentence" if fewest <= 1 else f"{fewest} distinct sentences"
        return f"collapsed: writes {words}" + (f"; {against}" if against else "") + "."
    if status.verdict in ("not learned", "judges only"):
        return f"{status.verdict}: " + status.detail.split("; ")[0] + (f"; {against}" if against else "") + "."
    return status.verdict + (f": {against}" if against else "") + "."


def _raw(value: float | None, rows: list, metric: str | None) -> float | None:
    """The unrounded number a headline rounded (to 2 decimals) from one of ``rows``, so a page rounds it once."""
    if value is None or not metric:
        return value
    return next((r["metrics"][metric] for r in rows if isinstance(r, Mapping) and metric in r.get("metrics", {})
                 and round(r["metrics"][metric], 2) == round(value, 2)), value)


def authors_of(doc: Mapping[str, Any], metric: str | None) -> dict[str, Any] | None:
    """The headline's number selected the authors' way: ``metric`` of the ``authors_selection`` of the headline's
    row (its mean row where several seeds ran), with its label; None where that row has none, or where the
    headline is not one row's metric (a mean over types, a best split)."""
    means = headline_rows(doc, means=True)
    rows = means if len(means) == 1 else headline_rows(doc)
    head = doc.get("headline") or {}
    if len(rows) != 1 or not metric or head.get("kit") is None:
        return None
    a, row = rows[0].get("authors_selection"), rows[0]
    if not isinstance(a, Mapping) or metric not in a.get("metrics", {}) or \
            round(row.get("metrics", {}).get(metric, float("nan")), 2) != round(head["kit"], 2):
        return None
    return {"label": a["label"], "kit": a["metrics"][metric], "sd": (a.get("sd") or {}).get(metric)}


def summary(doc: Mapping[str, Any]) -> Summary:
    head = doc.get("headline") or {}
    prov = doc.get("provenance", {})
    status = report_status(doc)
    means = headline_rows(doc, means=True)
    metric = headline_metric(doc)
    mean_row = means[0] if len(means) == 1 else None
    sd = (mean_row.get("sd") or {}).get(metric) if mean_row and metric else None
    seeds = list(prov.get("seeds", []))
    rows = headline_rows(doc)
    baseline = baseline_of(doc)
    if baseline and metric:
        named = [r for r in doc.get("rows", []) if not is_run(r) and r.get("variant") == baseline.get("label")]
        baseline = {**baseline, "kit": _raw(baseline.get("kit"), named, metric)}
    kit = _raw(head.get("kit"), [mean_row] if mean_row else rows[:1] if len(rows) == 1 else [], metric)
    describes = next((r["describes"] for r in ([mean_row] if mean_row else rows) if r and r.get("describes")), None)
    env = prov.get("environment") or {}
    env_text = ", ".join(f"{k} {v}" for k, v in env.items()) if isinstance(env, Mapping) else str(env)
    return Summary(
        notebook=str(doc.get("notebook", "")), paper=paper_of(doc), title=str(doc.get("title", "")),
        label=str(head.get("label", "")), kit=kit, sd=sd, n_seeds=mean_row.get("n_seeds", 1) if mean_row else 1,
        seeds=seeds, baseline=baseline, paper_value=head.get("paper"), status=status, hard=hard_status(doc),
        verdict=_verdict(doc, status, kit, baseline, mean_row, metric), describes=describes,
        data=str(prov.get("data", "")), backbone=str(prov.get("backbone", "")), profile=str(prov.get("profile", "")),
        commit=str(prov.get("commit", "")), wall_seconds=prov.get("wall_seconds"),
        train_seconds=prov.get("train_seconds"), date=str(prov.get("date", "–")), environment=env_text or "–",
        metric=metric or "", authors=authors_of(doc, metric))


def test_set_text(doc: Mapping[str, Any]) -> str:
    """"; test set: N pairs" of the headline run (every number on the card is read on those pairs), "" unknown."""
    def size(r: Mapping[str, Any]) -> int | None:
        chance = (r.get("chance") or {}).get("t2p_R@1")     # a retriever's chance R@1 is 100 / its test pairs
        return r.get("test_pairs") or (r.get("per_pair") or {}).get("n") or (round(100 / chance) if chance else None)

    sizes = {size(r) for r in headline_rows(doc)} - {None}
    return f"; test set: {', '.join(map(str, sorted(sizes)))} pairs" if sizes else ""


def describes_text(d: Mapping[str, Any] | None) -> str:
    if not d:
        return ""
    out = (f"names the right change type for {fmt(d['type_named'])} % of the changed test pairs (chance "
           f"{fmt(d['type_chance'])} %)")
    if d.get("attributes_named") is not None:
        out += (f", and the changed object's attributes for {fmt(d['attributes_named'])} % (chance "
                f"{fmt(d['attributes_chance'])} %)")
    return out


CARD_CSS = """<style>
.idckit-card { border: 2px solid #2b6cb0; background: #eef4fb; border-radius: 6px; padding: 0.8rem 1.1rem;
  margin: 0.6rem 0 1.2rem 0; font-family: system-ui, sans-serif; max-width: 62rem; }
.idckit-card table { border-collapse: collapse; margin: 0.3rem 0; }
.idckit-card th, .idckit-card td { padding: 0.15rem 0.9rem 0.15rem 0; text-align: left; border: none;
  background: transparent; font-size: 0.95rem; }
.idckit-card .big { font-size: 1.35rem; font-weight: 600; }
.idckit-card .flag { color: #b00; font-weight: 700; } .idckit-card .learned { color: #070; font-weight: 700; }
.idckit-card .ran { color: #555; font-weight: 700; } .idckit-card p { margin: 0.35rem 0; }
table.idckit-table td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.idckit-table td.txt, table.idckit-table th, table.idckit-table thead th { text-align: left !important; }
table.idckit-table caption { caption-side: top; text-align: left; font-weight: 600; }
.jp-RenderedText pre, .output_text pre { white-space: pre-wrap; word-break: normal; overflow-wrap: anywhere; }
</style>"""


def status_class(st: Status) -> str:
    return "flag" if st.flag else ("learned" if st.green else "ran")


def card_html(doc: Mapping[str, Any], *, marked: bool = True) -> str:
    """The card of report ``doc`` (an HTML fragment; ``marked``: between :data:`CARD_START` and :data:`CARD_END`,
    the markers :func:`with_card` replaces)."""
    s = summary(doc)
    e = html.escape
    status = f"<span class='{status_class(s.status)}'>{e(s.status.verdict)}</span>"
    if s.status.detail:
        status += f" <span>({e(s.status.detail)})</span>"
    hard = ""
    if s.hard is not None:
        hard = (f"<tr><th>hard data</th><td><span class='{status_class(s.hard)}'>{e(s.hard.verdict)}</span> "
                f"({e(s.hard.detail)})</td></tr>")
    desc = describes_text(s.describes)
    nb = e(s.notebook)
    start, end = (CARD_START, CARD_END) if marked else ("", "")
    heads, values = [e(s.label)], [e(s.kit_text())]
    if s.authors:    # both selections side by side, each labelled, so the paper's number is read against its like
        heads = [f"{e(s.label)}: {e(KIT_SELECTION)}", f"{e(s.label)}: {e(s.authors['label'])}"]
        values.append(e(s.authors_text()))
    heads += ["no-learning baseline", "paper (real data)"]
    values += [e(s.baseline_text()), e(s.paper_text())]
    head_row = "".join(f"<th>{h}</th>" for h in heads)
    value_row = "".join(f"<td class='big'>{v}</td>" for v in values)
    return (f"{start}{CARD_CSS}<div class='idckit-card'{' id=idckit-card' if marked else ''}>"
            f"<p><b>{e(s.paper)}</b>: {e(s.title)}</p>"
            f"<table><tr>{head_row}</tr><tr>{value_row}</tr></table>"
            f"<table><tr><th>status</th><td>{status}</td></tr>{hard}"
            f"<tr><th>verdict</th><td>{e(s.verdict)}</td></tr>"
            + (f"<tr><th>describes the change?</th><td>{e(desc)}</td></tr>" if desc else "")
            + f"<tr><th>seeds</th><td>{e(s.seeds_text())}</td></tr>"
            f"<tr><th>data</th><td>{e(s.data)}{e(test_set_text(doc))}</td></tr></table>"
            f"<p><a href='index.html'>all reports</a> · <a href='{nb}.json'>this report's numbers ({nb}.json)</a>"
            f" · <a href='{e(docs_link(doc))}'>docs</a> · how to read a status: "
            f"<a href='00_walkthrough.html'>the walkthrough</a></p></div>{end}")


def with_card(page: str, doc: Mapping[str, Any]) -> str:
    """``page`` (a report's HTML) with the card right after its first heading (or at the top of its body),
    replacing a card it already has."""
    page = re.sub(re.escape(CARD_START) + r".*?" + re.escape(CARD_END), "", page, flags=re.DOTALL)
    card = card_html(doc)
    m = re.search(r"</h1>", page)
    if m is None:
        m = re.search(r"<body[^>]*>", page)
    if m is None:
        return card + page
    return page[:m.end()] + card + page[m.end():]


class Card:
    """The card as a notebook output (for a notebook run outside ``idckit reproduce``)."""

    def __init__(self, doc: Mapping[str, Any]):
        self.doc = doc

    def _repr_html_(self) -> str:
        return card_html(self.doc, marked=False)   # not the page's own card: with_card leaves it in place

    def __repr__(self) -> str:
        s = summary(self.doc)
        both = f" ({KIT_SELECTION}) | {s.authors['label']}: {s.authors_text()}" if s.authors else ""
        return "\n".join([f"{s.label}: {s.kit_text()}{both} | baseline {s.baseline_text()} | paper {s.paper_text()}",
                          f"status: {s.status.text()}", f"verdict: {s.verdict}", f"seeds: {s.seeds_text()}"])


__all__ = ["Summary", "summary", "authors_of", "KIT_SELECTION", "card_html", "with_card", "Card", "paper_of",
           "baseline_of", "headline_metric", "describes_text", "status_class"]
