"""The run cache's output checks: collapsed captioning runs are found and named."""
from __future__ import annotations

from idckit.eval.captions import write_results
from idckit.experiments.runs import collapse_check, diversity_notes, output_diversity


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
    assert len(notes) == 1 and notes[0].startswith("COLLAPSED: A, seed 0") and "90 %" in notes[0]
    assert diversity_notes(div, collapsed_share=0.95) == []


def test_collapse_check_prints_and_returns_the_notes(tmp_path, capsys):
    write_results(tmp_path / "r" / "test", {f"{i:06d}.png": "no change" for i in range(4)})
    diversity, notes = collapse_check(tmp_path, [{"run": "r", "label": "L", "seed": 0}])
    assert diversity == output_diversity(tmp_path, [{"run": "r", "label": "L", "seed": 0}])
    assert len(notes) == 1 and notes[0].startswith("COLLAPSED: L, seed 0") and notes[0] in capsys.readouterr().out
