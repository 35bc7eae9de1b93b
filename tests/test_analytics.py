"""Caption analytics of finished runs (idckit.experiments.analytics): collapsed runs are found and named."""
from __future__ import annotations

from idckit.eval.captions import write_results
from idckit.experiments.analytics import collapse_check, diversity_notes, output_diversity, timing_table


def test_output_diversity_counts_distinct_test_captions_and_flags_collapse(tmp_path):
    write_results(tmp_path / "a" / "test", {f"{i:06d}.png": "the scene remains the same" for i in range(9)}
                  | {"000009.png": "the red cube moved"})
    write_results(tmp_path / "b" / "test", {f"{i:06d}.png": f"caption {i % 4}" for i in range(8)})
    results = [{"run": "a", "label": "A", "seed": 0}, {"run": "b", "label": "B"}, {"run": "unfinished"}]
    div = output_diversity(tmp_path, results)
    assert [(d["run"], d["pairs"], d["distinct"]) for d in div] == [("a", 10, 2), ("b", 8, 4)]
    assert div[0]["top_caption"] == "the scene remains the same" and div[0]["top_share"] == 0.9
    assert div[1]["top_share"] == 0.25
    notes = diversity_notes(div)
    # A: one caption for 90 % of the pairs; B: 4 distinct captions for 8 pairs (fewer than 10 and than its pairs)
    assert len(notes) == 2 and notes[0].startswith("COLLAPSED: A, seed 0") and "90 %" in notes[0]
    assert notes[1].startswith("COLLAPSED: B wrote") and "(4 distinct captions)" in notes[1]
    varied = [{**div[1], "distinct": 8, "top_share": 0.125}]   # every one of its 8 test pairs has its own caption
    assert diversity_notes(varied) == []


def test_collapse_check_returns_a_table_and_the_notes_once(tmp_path, capsys):
    write_results(tmp_path / "r" / "test", {f"{i:06d}.png": "no change" for i in range(4)})
    table, notes = collapse_check(tmp_path, [{"run": "r", "label": "L", "seed": 0}])
    assert table.cells() == [["L", "0", "1", "4", "no change", "100.0"]]
    assert "<th>share of the most frequent caption (%)</th>" in table._repr_html_()
    assert len(notes) == 1 and notes[0].startswith("COLLAPSED: L, seed 0")
    assert capsys.readouterr().out == ""                 # the notes go to the report's notes, not printed twice


def test_timing_table_shows_minutes():
    t = timing_table([{"run": "r", "label": "L", "seed": 0, "caption_seconds": 90.0}],
                     {"caption_seconds": "captioning (min)", "adapt_seconds": "adaptation (min)"}, caption="x")
    assert t.cells() == [["L", "0", "1.5", "–"]]
