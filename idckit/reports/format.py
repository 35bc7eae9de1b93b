"""The one formatting path of report tables: human column names, fixed decimals per metric, "–" for a number
that is not reported, no pandas index, and a legend of the terms a table uses.

A notebook passes plain records (dicts) or report rows; it never rounds, renames or styles a DataFrame itself.
"""
from __future__ import annotations

import html
import math
from typing import Any, Iterable, Mapping, Sequence

NOT_REPORTED = "–"

#: report keys -> the names a reader sees
NAMES: dict[str, str] = {
    "Bleu_1": "BLEU-1", "Bleu_2": "BLEU-2", "Bleu_3": "BLEU-3", "Bleu_4": "BLEU-4", "METEOR": "METEOR",
    "ROUGE_L": "ROUGE-L", "CIDEr-D": "CIDEr-D", "SPICE": "SPICE",
    "t2p_MdR": "text→pair median rank", "t2p_MnR": "text→pair mean rank",
    "p2t_MdR": "pair→text median rank", "p2t_MnR": "pair→text mean rank",
    "distinct": "distinct captions", "pairs": "test pairs", "top_caption": "most frequent caption",
    "top_share": "share of the most frequent caption (%)", "judge_accuracy": "judge accuracy",
    "verified_share": "true statements (%)", "difference_recall": "differences named (%)",
    "distractor": "distractor", "semantic": "semantic", "total": "total",
    "type_named": "change type named (%)", "type_chance": "chance (%)",
    "attributes_named": "changed object named (%)", "attributes_chance": "chance (%)",
    "n_intra": "intra layers", "n_inter": "inter layers", "label": "split", "paper_split": "the paper's split",
    "relative_depth": "N_intra / depth", "step": "step", "minutes": "minutes", "seed": "seed",
    "selection": "checkpoint selection",
}
for _d, _w in (("t2p", "text→pair"), ("p2t", "pair→text")):
    for _k in (1, 5, 10, 20, 50):
        NAMES[f"{_d}_R@{_k}"] = f"{_w} R@{_k}"

#: decimals per key (default 1: every metric on the papers' x100 scale)
DECIMALS: dict[str, int] = {"judge_accuracy": 3, "distinct": 0, "pairs": 0, "seed": 0, "step": 0,
                            "n_seeds": 0, "test_pairs": 0, "distinct_test_captions": 0, "minutes": 1,
                            # table 7's best split as N_intra / depth: 9/12 is 0.75, not 0.8
                            "split_ratio": 2, "relative_depth": 2}

#: the terms a report may use, explained once
LEGEND: dict[str, str] = {
    "CIDEr-D": "consensus with the references (TF-IDF weighted n-grams, x100): rewards the words the references "
               "share and this pair's references use more than others'",
    "total / semantic / distractor": "all test pairs / the changed pairs / the pixel-identical or jittered "
                                     "no-change pairs",
    "judge accuracy": "how often the model's change / no-change decision is right (0.5 is chance on the "
                      "balanced test set)",
    "distinct captions": "how many different sentences a run writes over its test pairs; fewer than 10 = "
                         "collapsed",
    "R@K": "share of queries whose true match ranks in the top K (%); chance is K / number of pairs",
    "median / mean rank": "rank of the true match (1 is best); chance is about half the number of pairs",
    "no-learning baseline": "a caption chosen without training a model: the most frequent training caption, the "
                            "nearest neighbour's, or the judge oracle's (the true change / no-change label, then "
                            "the most frequent caption of that kind)",
    "within noise": "a gap not larger than the seed spread (sd over seeds) or, with one seed, the 95 % bootstrap "
                    "interval over test pairs",
    "–": "not reported",
}


def name(key: str) -> str:
    return NAMES.get(key, key)


def fmt(value: Any, key: str = "") -> str:
    """One cell: ``value`` at ``key``'s fixed decimals, "–" when missing or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NOT_REPORTED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        d = DECIMALS.get(key, 0 if isinstance(value, int) else 1)
        return f"{value:.{d}f}"
    return str(value)


class Table:
    """A formatted table: records in, HTML (and plain text) out, columns in the order given."""

    def __init__(self, records: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None, *,
                 caption: str = "", notes: Sequence[str] = ()):
        self.records = [dict(r) for r in records]
        if columns is None:
            columns = []
            for r in self.records:
                columns += [k for k in r if k not in columns]
        self.columns = list(columns)
        self.caption = caption
        self.notes = list(notes)

    def cells(self) -> list[list[str]]:
        return [[fmt(r.get(c), c) for c in self.columns] for r in self.records]

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(name(c))}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(
            f"<td class='{'num' if isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) else 'txt'}'>"
            f"{esc(v)}</td>" for c, v in zip(self.columns, row)) + "</tr>"
            for r, row in zip(self.records, self.cells()))
        cap = f"<caption>{esc(self.caption)}</caption>" if self.caption else ""
        notes = "".join(f"<p class='idckit-table-note'>{esc(n)}</p>" for n in self.notes)
        return (f"<table class='idckit-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                + notes)

    def __repr__(self) -> str:
        rows = [[name(c) for c in self.columns], *self.cells()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        return "\n".join(([self.caption] if self.caption else []) + lines)


class Notes:
    """Sentences shown as a list in proportional type (a print() would set them in monospace and wrap mid-word)."""

    def __init__(self, sentences: Iterable[str], *, title: str = ""):
        self.sentences = list(sentences)
        self.title = title

    def _repr_html_(self) -> str:
        head = f"<p><b>{html.escape(self.title)}</b></p>" if self.title else ""
        return head + "<ul class='idckit-notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.sentences) + \
            "</ul>"

    def __repr__(self) -> str:
        return "\n".join(([self.title] if self.title else []) + [f"- {n}" for n in self.sentences])


def run_label(row: Mapping[str, Any]) -> str:
    """How a table names a kit row's run: ``seed 0``, ``mean ± sd of 3 seeds``, or empty (not a trained row)."""
    seed = row.get("seed")
    if seed == "mean":
        n = row.get("n_seeds")
        return f"mean ± sd of {n} seeds" if n else "mean over seeds"
    return "" if seed is None else f"seed {seed}"


#: how a comparison names the paper's rows where the kit shows both selections (each paper selected its own)
PAPER_SELECTION = "as published"


def _value(row: Mapping[str, Any], metric: str) -> Any:
    v = row.get("metrics", {}).get(metric)
    sd = (row.get("sd") or {}).get(metric)
    if v is not None and sd is not None and row.get("seed") == "mean":
        d = DECIMALS.get(metric, 1)
        return f"{v:.{d}f} ± {sd:.{d}f}"
    return v


def comparison(rows: Sequence[Mapping[str, Any]], paper_rows: Sequence[Mapping[str, Any]] = (),
               metrics: Sequence[str] = ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D"), *, caption: str = "",
               kit_label: str = "idckit (this run)", paper_label: str = "paper (real data)") -> Table:
    """The paper's rows, then the kit's (a ``source`` column keeps them apart), one column per metric; a mean row
    shows mean ± sd. Baseline rows keep their model name ("baseline (idckit)").

    Where a kit row also carries the checkpoint the authors' scripts would have selected (``authors_selection``,
    :func:`idckit.experiments.reporting.authors_fields`), a ``selection`` column labels each row and that
    checkpoint's numbers follow the row on a line of their own; without any, the table is as it always was."""
    both = any(r.get("authors_selection") for r in rows)
    recs = []
    for src, rs, kit in ((paper_label, paper_rows, False), (kit_label, rows, True)):
        for r in rs:
            rec = {"source": src, "model": r.get("model", ""), "variant": r.get("variant", ""),
                   **({"run": run_label(r)} if kit else {"run": ""}), **{m: _value(r, m) for m in metrics}}
            if both:
                rec["selection"] = r.get("selection", "") if kit else PAPER_SELECTION
            recs.append(rec)
            a = r.get("authors_selection") if kit else None
            if a:
                recs.append({**rec, "selection": a["label"],
                             **{m: _value({**a, "seed": r.get("seed")}, m) for m in metrics}})
    return Table(recs, ["source", "model", "variant", "run", *(["selection"] if both else []), *metrics],
                 caption=caption)


def legend(terms: Sequence[str] | None = None) -> Table:
    """The legend of ``terms`` (default: every term of :data:`LEGEND`)."""
    keys = terms or list(LEGEND)
    return Table([{"term": k, "meaning": LEGEND[k]} for k in keys], ["term", "meaning"], caption="Terms")


__all__ = ["NOT_REPORTED", "NAMES", "DECIMALS", "LEGEND", "PAPER_SELECTION", "name", "fmt", "Table", "Notes",
           "run_label", "comparison", "legend"]
