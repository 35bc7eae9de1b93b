"""The one formatting path: human names, fixed decimals, "–" for not reported, no index; the card and the index
agree with each report's JSON and the README table (on the committed reports)."""
from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from idckit.reports.format import Table, comparison, fmt, legend

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(p for p in (ROOT / "reports").glob("*.json") if p.name != "status.json")


def test_cells_have_fixed_decimals_and_a_dash_for_not_reported():
    assert fmt(0.583333, "judge_accuracy") == "0.583" and fmt(1.0, "judge_accuracy") == "1.000"
    assert fmt(float("nan"), "CIDEr-D") == "–" and fmt(None) == "–"
    assert fmt(78.4512, "CIDEr-D") == "78.5" and fmt(55, "distinct") == "55"
    assert fmt(0.75, "split_ratio") == "0.75"           # table 7's 9/12, not "0.8"


def test_a_table_has_human_column_names_and_no_index():
    t = Table([{"variant": "full", "t2p_MnR": 238.38, "top_share": 97.5, "CIDEr-D": None}])
    html = t._repr_html_()
    assert "<th>text→pair mean rank</th>" in html and "<th>share of the most frequent caption (%)</th>" in html
    assert "238.4" in html and "97.5" in html and "<td class='txt'>–</td>" in html
    assert "<th></th>" not in html and "t2p_MnR" not in html and "nan" not in html.lower()


def test_comparison_keeps_paper_and_kit_apart_and_shows_mean_plus_sd():
    rows = [{"model": "IDC-PCL", "variant": "full", "seed": s, "metrics": {"CIDEr-D": c}}
            for s, c in ((0, 1.0), (1, 3.0))]
    rows.append({"model": "IDC-PCL", "variant": "full", "seed": "mean", "n_seeds": 2, "metrics": {"CIDEr-D": 2.0},
                 "sd": {"CIDEr-D": 1.41}})
    t = comparison(rows, [{"model": "IDC-PCL", "variant": "full", "metrics": {"CIDEr-D": 128.9}}], ["CIDEr-D"])
    cells = t.cells()
    assert cells[0] == ["paper (real data)", "IDC-PCL", "full", "", "128.9"]
    assert cells[-1] == ["idckit (this run)", "IDC-PCL", "full", "mean ± sd of 2 seeds", "2.0 ± 1.4"]
    assert "CIDEr-D" in legend(["CIDEr-D"])._repr_html_()


def _index_cells():
    page = (ROOT / "reports" / "index.html").read_text()
    out = {}
    for m in re.finditer(r'<tr><td class="c-report"><a href="([^"]+)\.html">.*?</tr>', page, re.DOTALL):
        cells = re.findall(r'<td class="c-([a-z-]+)">(.*?)</td>', m.group(0), re.DOTALL)
        out[m.group(1)] = {k: unescape(re.sub(r"<[^>]+>", " ", v)).split() for k, v in cells}
    return out


@pytest.mark.skipif(not DOCS, reason="no committed reports")
def test_index_json_and_readme_agree_on_the_committed_reports():
    """Every number printed in two places comes from one source: the report's JSON, through report_card.summary."""
    from idckit.reports.readme import current_block
    from idckit.reports.card import summary

    index = _index_cells()
    readme = {line.split("](reports/")[1].split(".html")[0]: [c.strip() for c in line.strip("|").split(" | ")]
              for line in current_block((ROOT / "README.md").read_text()).splitlines() if "](reports/" in line}
    for jp in DOCS:
        doc = json.loads(jp.read_text())
        if "notebook" not in doc:
            continue
        s, nb = summary(doc), doc["notebook"]
        assert nb in index, f"{nb} is not on the index: re-run `idckit reproduce` (or write_index)"
        assert " ".join(index[nb]["idckit"]) == s.kit_text(), nb
        assert " ".join(index[nb]["paper"]) == s.paper_text(), nb
        assert " ".join(index[nb]["no-learning"]) == (
            " ".join([fmt(s.baseline["kit"], s.metric), *s.baseline["label"].split()]) if s.baseline else "–"), nb
        assert index[nb]["status"][0] == s.status.verdict.split()[0], nb
        head = doc.get("headline", {})
        if head.get("kit") is not None:
            # the JSON's headline keeps 2 decimals; the page rounds the rows' raw value once (63.845: 63.8, where
            # rounding the headline's 63.85 again would print 63.9)
            assert abs(s.kit - head["kit"]) <= 0.005 + 1e-9 and s.kit_text().startswith(fmt(s.kit, s.metric)), nb
        assert nb in readme, f"{nb} is not in the README table: run `idckit readme`"
        assert readme[nb][2] == s.kit_text() and readme[nb][4] == s.paper_text() and readme[nb][5] == s.status.verdict
