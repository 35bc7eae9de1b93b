from __future__ import annotations

import json
from pathlib import Path

from idckit.readme import END, START, current_block, render_results, update_readme

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_table_matches_the_committed_reports():
    readme = (ROOT / "README.md").read_text()
    assert current_block(readme) == render_results(ROOT / "reports"), (
        "README results table is out of date: run `.venv/bin/idckit readme`")


def test_update_rewrites_only_the_block(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "t.json").write_text(json.dumps({
        "notebook": "t", "headline": {"label": "CIDEr-D", "kit": 97.25, "paper": 128.9},
        "provenance": {"data": "synthetic: x", "backbone": "efficientnet_lite0", "profile": "cpu", "seeds": [0, 1, 2], "commit": "abc"}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{START}\nold\n{END}\n\nmore text\n")
    assert update_readme(readme, reports) is True
    text = readme.read_text()
    assert "| [t](reports/t.html) | CIDEr-D | 97.2 | – | 128.9 | no training | – | synthetic: x | 0, 1, 2 | abc |" in text
    assert text.startswith("# title") and text.endswith("more text\n") and "old" not in text
    assert update_readme(readme, reports) is False
