"""Report rows from run results (idckit.experiments.reporting): hand-made results, hand-computed rows."""
from __future__ import annotations

import pytest

from idckit.experiments.reporting import (TYPES, gap_notes, mean_sd, per_type_rows, per_variant, rows,
                                          trained_fields)


def _result(model="IDC-PCL (idckit)", variant="full", label="MLM + MVCL + FDA (full)", seed=0, cider=1.0,
            distinct=40, judge=None, **extra):
    """A result as run_variant returns it: ``test`` on pycocoevalcap's scale (CIDEr-D 1.0 = 100)."""
    test = {"total": {"Bleu_4": 0.5, "CIDEr-D": cider}, "semantic": {"Bleu_4": 0.4, "CIDEr-D": cider / 2},
            "distractor": {"Bleu_4": 0.6, "CIDEr-D": 2 * cider}, "color": {"CIDEr-D": 0.3}, "move": {"CIDEr-D": 0.1}}
    return {"model": model, "variant": variant, "label": label, "seed": seed, "run": f"run-{variant}-{seed}",
            "test": test, "distinct_test_captions": distinct, "test_pairs": 100, "judge_accuracy": judge, **extra}


def test_mean_sd_is_the_sample_sd_and_zero_for_one_value():
    assert mean_sd([1.0, 2.0, 4.0]) == pytest.approx((7 / 3, (((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2
                                                             + (4 - 7 / 3) ** 2) / 2) ** 0.5))
    assert mean_sd([5.0]) == (5.0, 0.0)


def test_rows_give_one_row_per_run_and_a_mean_row_per_variant_with_several_seeds():
    results = [_result(seed=0, cider=1.0, distinct=40, judge=0.8), _result(seed=1, cider=1.4, distinct=12, judge=0.6),
               _result(model="DUDA (idckit)", variant="duda", label="DUDA", cider=0.5, data="hard set")]
    out = rows(results)
    assert [(r["model"], r["variant"], r["seed"]) for r in out] == [
        ("IDC-PCL (idckit)", "MLM + MVCL + FDA (full)", 0), ("IDC-PCL (idckit)", "MLM + MVCL + FDA (full)", 1),
        ("DUDA (idckit)", "DUDA", 0), ("IDC-PCL (idckit)", "MLM + MVCL + FDA (full)", "mean")]
    first, mean = out[0], out[-1]
    assert first["metrics"] == pytest.approx({"Bleu_4": 50.0, "CIDEr-D": 100.0}) and first["subset"] == "total"
    assert first["run"] == "run-full-0" and first["judge_accuracy"] == 0.8 and "data" not in first
    assert out[2]["data"] == "hard set" and "judge_accuracy" not in out[2]      # no judge, no field
    # mean row: CIDEr-D (100 + 140) / 2 = 120, sample sd |140 - 100| / sqrt(2); fewest distinct; mean judge
    assert mean["n_seeds"] == 2 and mean["metrics"]["CIDEr-D"] == pytest.approx(120.0)
    assert mean["sd"]["CIDEr-D"] == pytest.approx(40 / 2 ** 0.5) and mean["sd"]["Bleu_4"] == 0.0
    assert mean["distinct_test_captions"] == 12 and mean["judge_accuracy"] == pytest.approx(0.7)
    assert mean["cider_d"] == pytest.approx({"total": 120.0, "semantic": 60.0, "distractor": 240.0})
    semantic = rows(results[:1], "semantic")[0]
    assert semantic["subset"] == "semantic" and semantic["metrics"]["CIDEr-D"] == pytest.approx(50.0)


def test_rows_rename_variants_and_show_fractions_as_percentages():
    r = _result(variant="b2w", label="B2W", verified_share=0.25, difference_recall=None)
    (row,) = rows([r], labels={"b2w": "IDC-PCL"}, percent=("verified_share", "difference_recall"))
    assert row["variant"] == "IDC-PCL" and row["metrics"]["verified_share"] == 25.0
    assert "difference_recall" not in row["metrics"]                # None (real data): not a metric


def test_per_type_rows_show_cider_of_each_type_the_test_split_has():
    out = per_type_rows([_result(seed=0, cider=1.0), _result(seed=1, cider=3.0)])
    assert set(out[0]["metrics"]) == {"color", "move", "distractor"} <= set(TYPES)
    assert out[0]["metrics"] == pytest.approx({"color": 30.0, "move": 10.0, "distractor": 200.0})
    assert out[-1]["seed"] == "mean" and out[-1]["metrics"]["distractor"] == pytest.approx(400.0)
    assert out[-1]["sd"]["distractor"] == pytest.approx(400 / 2 ** 0.5) and out[-1]["sd"]["color"] == 0.0
    assert len(per_type_rows([_result()])) == 1                           # one seed: no mean row


def test_per_variant_prefers_the_mean_row():
    out = rows([_result(seed=0, cider=1.0), _result(seed=1, cider=2.0),
                _result(variant="none", label="w/o", cider=0.2)])
    assert per_variant(out) == pytest.approx({"MLM + MVCL + FDA (full)": 150.0, "w/o": 20.0})
    assert per_variant(out, "Bleu_4")["w/o"] == pytest.approx(50.0)


def test_trained_fields():
    result = {"test": {"total": {"CIDEr-D": 0.9}, "semantic": {"CIDEr-D": 0.4}, "distractor": {"CIDEr-D": 1.4},
                       "color": {"CIDEr-D": 0.1}}, "distinct_test_captions": 37, "test_pairs": 400,
              "judge_accuracy": 0.875}
    f = trained_fields(result)
    assert f == {"distinct_test_captions": 37, "test_pairs": 400, "judge_accuracy": 0.875,
                 "cider_d": pytest.approx({"total": 90.0, "semantic": 40.0, "distractor": 140.0})}
    assert "judge_accuracy" not in trained_fields({**result, "judge_accuracy": None})


def test_baseline_and_selection_rows():
    from idckit.experiments.reporting import BASELINE_MODEL, baseline_rows, selection_rows

    base = {"label": "most frequent paragraph", "test": {"total": {"ROUGE_L": 0.25, "CIDEr-D": 0.05}},
            "distinct_test_captions": 1, "test_pairs": 30, "verified_share": 0.5}
    (row,) = baseline_rows([base], percent=("verified_share", "difference_recall"))   # a missing field is left out
    assert (row["model"], row["variant"], row["distinct_test_captions"]) == (BASELINE_MODEL, base["label"], 1)
    assert row["metrics"] == pytest.approx({"ROUGE_L": 25.0, "CIDEr-D": 5.0, "verified_share": 50.0})
    run = {"label": "B2W", "seed": 2, "test": {"total": {"ROUGE_L": 0.4}, "sameSpecies": {"ROUGE_L": 0.3},
                                               "sameClass": {"ROUGE_L": 0.5}}}
    assert selection_rows([run]) == [{"variant": "B2W", "seed": 2, "sameSpecies": 30.0, "sameClass": 50.0}]


def test_gap_notes_read_a_difference_against_the_paired_noise_and_the_seed_sd():
    from idckit.reports.stats import attach_per_pair

    rows = [{"variant": "B2W", "seed": "mean", "n_seeds": 3, "metrics": {"R": 45.0, "C": 20.0},
             "sd": {"R": 1.0, "C": 5.0}},
            {"variant": "+CUB", "seed": "mean", "n_seeds": 3, "metrics": {"R": 43.0, "C": 22.0},
             "sd": {"R": 0.5, "C": 1.0}},
            {"variant": "+NA", "seed": "mean", "n_seeds": 3, "metrics": {"R": 47.5, "C": 20.0},
             "sd": {"R": 2.0, "C": 0.0}}]
    for r in rows:      # ROUGE-L per pair: one pattern shifted by the row's mean, so the pairs add no noise
        attach_per_pair(r, {f"p{i}": r["metrics"]["R"] + (i % 9) - 4 for i in range(60)}, "R")
    notes = gap_notes(rows, "B2W", ["+CUB", "+NA"], {"R": "ROUGE-L", "C": "CIDEr-D"}, subject="the extra data",
                      n_seeds=3)
    assert notes == [
        "+CUB vs B2W on ROUGE-L: -2.0 against a noise of 1.1 (paired 95 % bootstrap over 60 test pairs and seed sd "
        "over 3 seeds): here the extra data hurts.",
        "+NA vs B2W on ROUGE-L: +2.5 against a noise of 2.2 (paired 95 % bootstrap over 60 test pairs and seed sd "
        "over 3 seeds): here the extra data helps.",
        "+CUB vs B2W on CIDEr-D: +2.0 (3 seed(s)), not ordered: no per-pair scores on the same test pairs.",
        "+NA vs B2W on CIDEr-D: +0.0 (3 seed(s)), not ordered: no per-pair scores on the same test pairs."]
