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
    # A: one caption for 90 % of the pairs; B: 4 distinct captions for 8 pairs (fewer than 10 and than its pairs)
    assert len(notes) == 2 and notes[0].startswith("COLLAPSED: A, seed 0") and "90 %" in notes[0]
    assert notes[1].startswith("COLLAPSED: B wrote") and "(4 distinct captions)" in notes[1]
    varied = [{**div[1], "distinct": 8, "top_share": 0.125}]   # every one of its 8 test pairs has its own caption
    assert diversity_notes(varied) == []


def test_caption_counts_of_a_run(tmp_path):
    from idckit.experiments.runs import caption_counts, test_captions

    write_results(tmp_path / "r" / "test", {"000001.png": "a", "000001.png_n": "b", "000002.png": "a"})
    assert test_captions(tmp_path / "r") == {"000001.png": "a", "000001.png_n": "b", "000002.png": "a"}
    assert caption_counts(tmp_path / "r") == {"distinct_test_captions": 2, "test_pairs": 3}
    assert caption_counts(tmp_path / "unfinished") == {"distinct_test_captions": None, "test_pairs": None}


def test_collapse_check_prints_and_returns_the_notes(tmp_path, capsys):
    write_results(tmp_path / "r" / "test", {f"{i:06d}.png": "no change" for i in range(4)})
    diversity, notes = collapse_check(tmp_path, [{"run": "r", "label": "L", "seed": 0}])
    assert diversity == output_diversity(tmp_path, [{"run": "r", "label": "L", "seed": 0}])
    assert len(notes) == 1 and notes[0].startswith("COLLAPSED: L, seed 0") and notes[0] in capsys.readouterr().out
