from __future__ import annotations

import json
import re
from pathlib import Path

from idckit.reports.readme import END, START, current_block, render_results, update_readme

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


def test_readme_is_a_newcomers_document():
    """The two commands come first, the page stays short, and a Status row is one line, not a lab log."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines: move detail to docs/ or lab/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 400]
    assert not long, f"README.md lines {long} are over 400 characters"
    first_block = lines[lines.index("```bash") + 1:lines.index("```")]
    assert [line.split("#")[0].strip() for line in first_block] == ["make reproduce", "make test"]


def test_relative_links_in_the_docs_resolve():
    """Every relative link of the README, docs/ and lab/ names a file that exists (studies moved to lab/ once)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "lab").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readmes_constant_caption_numbers_are_the_walkthroughs():
    """'How to read the numbers' quotes the walkthrough's most frequent caption by hand: it must match the report."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"scores ([\d.]+) total CIDEr-D on its test set: ([\d.]+) on the distractor half, ([\d.]+) on the "
                  r"semantic half", readme)
    assert m, "README's 'Read a total beside its halves' sentence changed: update this test with it"
    rows = json.loads((ROOT / "reports" / "00_walkthrough.json").read_text())["rows"]
    cider = {r["variant"]: r["metrics"]["CIDEr-D"] for r in rows if r["model"] == "most frequent caption"}
    assert [float(x) for x in m.groups()] == [round(cider[v], 1) for v in ("total", "distractor", "semantic")], (
        "README quotes the walkthrough's most frequent caption; reports/00_walkthrough.json now says "
        f"{cider['total']:.1f} / {cider['distractor']:.1f} / {cider['semantic']:.1f}")
