"""The CLEVR tables' yardsticks on hand-made rows: the headline's run and baseline, ties, standings."""
from __future__ import annotations

from idckit.experiments import yardsticks
from idckit.experiments.reporting import BASELINE_MODEL
from idckit.reports.stats import attach_per_pair


def _run(variant, cider, seed=0, model="IDC-PCL (idckit)", **kw):
    return {"model": model, "variant": variant, "split": "test", "seed": seed, "run": f"r-{variant}-{seed}",
            "metrics": {"CIDEr-D": cider}, **kw}


def _base(variant, cider):
    return {"model": BASELINE_MODEL, "variant": variant, "split": "test", "metrics": {"CIDEr-D": cider}}


def test_the_headline_names_its_run_and_the_best_baseline_that_reads_no_label():
    rows = [_run("full", 70.0), _run("full", 74.0, seed=1),
            {**_run("full", 72.0, seed="mean"), "n_seeds": 2, "sd": {"CIDEr-D": 2.8}},
            _run("DUDA", 96.6, model="DUDA (idckit)"),
            _base("most frequent caption", 64.0), _base("nearest pixel difference", 85.0), _base("judge oracle", 92.0)]
    h = yardsticks.headline(rows, "full", "IDC-PCL CIDEr-D", 128.9)
    assert h["kit"] == 72.0 and h["runs"] == {"variants": ["full"]} and h["metric"] == "CIDEr-D"
    assert h["baseline"] == {"label": "nearest pixel difference", "kit": 85.0}   # not the oracle's 92.0
    notes = yardsticks.standing_notes(rows, "full")       # no per-pair scores stored: nothing is ordered
    assert notes[0] == ("full and DUDA are not ordered on CIDEr-D (gap -24.6): no per-pair scores on the same test "
                        "pairs.") and len(notes) == 4
    for r in rows:                                        # each row's scores on the same 100 pairs, as its mean
        attach_per_pair(r, {f"p{i}": r["metrics"]["CIDEr-D"] + (i % 5) - 2 for i in range(100)}, "CIDEr-D")
    notes = yardsticks.standing_notes(rows, "full")
    assert notes[0].startswith("full is below DUDA on CIDEr-D: gap -24.6 against a noise of 2.8 (paired 95 % "
                               "bootstrap over 100 test pairs and seed sd over 2 seeds)")
    assert any(n.startswith("full is above most frequent caption") for n in notes)
    assert any(n.startswith("full is below judge oracle") for n in notes) and len(notes) == 4


def test_best_split_is_a_tie_within_the_paired_bootstrap_interval():
    def split(k, c):
        row = {"variant": f"{k}/{12 - k}", "n_intra": k, "metrics": {"CIDEr-D": c}, "seed": 0}
        return attach_per_pair(row, {f"p{i}": c + (-8 if i % 2 else 8) + (i * k) % 11 - 5 for i in range(200)},
                               "CIDEr-D")

    rows = [split(6, 63.8), split(9, 64.2), split(12, 60.0)]
    assert yardsticks.best_split(rows, 12) == (None, "tie: 6/6, 9/3 within noise")
    rows[0] = split(6, 50.0)
    assert yardsticks.best_split(rows, 12) == (0.75, "best: 9/3")
    # without per-pair scores nothing is ordered: every split ties
    bare = [{k: v for k, v in r.items() if k != "per_pair"} for r in rows]
    assert yardsticks.best_split(bare, 12) == (None, "tie: 6/6, 9/3, 12/0 within noise")


def test_per_type_headline_and_the_hardest_type():
    types = {"color": 10.0, "material": 4.0, "move": 30.0}
    rows = [{**_run("full", 0), "metrics": dict(types)},
            {**_base("most frequent caption", 0), "metrics": {"color": 1.0, "material": 1.0, "move": 1.0}},
            {**_base("judge oracle", 0), "metrics": {"color": 50.0, "material": 50.0, "move": 50.0}}]
    h = yardsticks.type_headline(rows, "full", "mean of the types", {"color": 100, "material": 90, "move": 110},
                                 ["color", "material", "move"])
    assert h["kit"] == round(44 / 3, 2) and h["paper"] == 100.0
    assert h["baseline"] == {"label": "most frequent caption", "kit": 1.0}
    (note,) = yardsticks.hardest_type_notes(rows[:1], {"color": 100, "material": 90, "move": 110}, "full",
                                            ["color", "material", "move"])
    assert note == ("Hardest change type: material in the paper; the kit's run does not order its types (one seed: "
                    "no spread measured).")
    three = {**rows[0], "seed": "mean", "n_seeds": 3, "sd": {"color": 1.0, "material": 1.0, "move": 1.0}}
    (note,) = yardsticks.hardest_type_notes([three], {"color": 100, "material": 90, "move": 110}, "full",
                                            ["color", "material", "move"])
    assert note.startswith("Hardest change type: material in the paper, material in the kit's run (agrees")
    tied = {**three, "metrics": {"color": 4.0, "material": 4.0, "move": 30.0}}
    (note,) = yardsticks.hardest_type_notes([tied], {"color": 100, "material": 90, "move": 110}, "full",
                                            ["color", "material", "move"])
    assert "no single one (color, material within noise" in note


def test_dataset_title():
    assert yardsticks.dataset_title(type("D", (), {"description": "synthetic: SynthCLEVR-Change (60 pairs)"})) == \
        "SynthCLEVR-Change"


def test_type_standing_reads_the_mean_over_types():
    rows = [{**_run("full", 0), "metrics": {"color": 10.0, "move": 30.0}},
            {**_base("judge oracle", 0), "metrics": {"color": 50.0, "move": 50.0}}]
    (note,) = yardsticks.type_standing_notes(rows, "full", ["color", "move"])
    assert note == ("full and judge oracle are not ordered on CIDEr-D, mean of color/move (gap -30.0): no per-pair "
                    "scores on the same test pairs.")
