"""The shared body of CLIP4IDC's tables 3 (Spot-the-Diff) and 4 (Image Editing Request): CLIP-FT and CLIP4IDC
on a pair dataset beside the text-only baseline and the paper's rows, the orderings read against the noise (a
paired bootstrap over test pairs, :func:`idckit.reports.stats.compare`), the diversity of the captions, and the
report.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from idckit.experiments import clip4idc, reporting
from idckit.experiments.yardsticks import add_bootstrap, dataset_title, headline, standing_notes
from idckit.reports.format import Notes, Table, comparison
from idckit.reports.plots import side_by_side_bars
from idckit.reports.report import paper_table, write_report
from idckit.reports.stats import ordering_notes


@dataclass
class PairTable:
    setup: Any
    results: list
    table: str                      # "clip4idc.table3" / "clip4idc.table4"
    paper_cider: dict               # {model: CIDEr-D} of the paper's rows the kit has
    baseline: dict                  # clip4idc.text_baseline(setup)
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @property
    def dataset(self) -> str:
        return dataset_title(self.setup.data)

    def comparison(self) -> Table:
        return comparison(self.rows, paper_table(self.table)["rows"],
                          caption=f"{self.table}: the paper (real data) and the kit ({self.dataset}), test")

    def bars(self):
        kit = reporting.per_variant(self.rows)
        order = [*self.paper_cider, *[v for v in kit if v not in self.paper_cider]]
        return side_by_side_bars(kit, self.paper_cider, order, title=f"{self.table}: test CIDEr-D, {self.dataset}",
                                 kit_label=f"idckit ({self.setup.profile}, {self.dataset})",
                                 paper_label="paper (real data)")

    def ordering(self) -> Notes:
        return Notes(self.notes)

    def write(self, report_dir, notebook: str, label: str, paper: float, *, extra_notes: Sequence[str] = (),
              collapse_notes: Sequence[str] = ()):
        return write_report(
            report_dir, notebook, self.table, self.rows,
            clip4idc.provenance(self.setup, self.results, sorted({r["seed"] for r in self.results}),
                                time.time() - self.started),
            headline=headline(self.rows, "CLIP4IDC", label, paper),
            notes=[*extra_notes, f"CLIP: {self.results[0]['clip']}.",
                   f"Text-only baseline: {self.baseline['sentence']!r}.", *self.notes, *collapse_notes])


def build(setup, results: Sequence[Mapping[str, Any]], table: str, paper_cider: Mapping[str, float]) -> PairTable:
    """Rows (the runs, each with a bootstrap interval over its test pairs, and the text-only baseline) and the
    ordering notes: every two rows the paper has, CLIP4IDC against CLIP-FT, and both against the baseline."""
    pt = PairTable(setup, list(results), table, dict(paper_cider), clip4idc.text_baseline(setup))
    refs = setup.data.dataset().references("test")
    pt.rows = reporting.rows(results) + [dict(pt.baseline)]
    # the baseline's one sentence on every test pair, scored per pair as the runs are: their orderings are paired
    sentence = {"label": pt.baseline["variant"], "predictions": dict.fromkeys(refs, pt.baseline["sentence"])}
    add_bootstrap(pt.rows, results, refs, baselines=[sentence])
    pt.notes = ordering_notes(pt.rows, pt.paper_cider)
    if "CLIP-FT" not in pt.paper_cider:
        pt.notes += [n + " (the paper has no CLIP-FT row here)" for n in standing_notes(
            [r for r in pt.rows if r["variant"] in ("CLIP4IDC", "CLIP-FT")], "CLIP4IDC")]
    pt.notes += standing_notes([r for r in pt.rows if r["variant"] == "CLIP4IDC"
                                or r.get("model") == reporting.BASELINE_MODEL], "CLIP4IDC")
    return pt


__all__ = ["PairTable", "build"]
