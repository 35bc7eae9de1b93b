"""The simulated-judge analysis (idckit.eval.judge_gate), the shift-tolerant feature probe, and the script that
uses both."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from idckit import registry
from idckit.errors import ConfigError, DatasetError
from idckit.eval.judge_gate import gate, judge_curve
from idckit.text.vocab import SPECIALS, Vocab

TYPES = {"000000.png": "color", "000000.png_n": "distractor", "000001.png": "add", "000001.png_n": "distractor",
         "000002.png": "move", "000002.png_n": "distractor", "000003.png": "drop", "000003.png_n": "distractor"}
CAPTIONS = {k: ("the cube moved" if t != "distractor" else "the blue sphere turned red") for k, t in TYPES.items()}
NO = "no change"


def test_a_perfect_judge_says_no_change_exactly_on_distractors():
    out = gate(CAPTIONS, TYPES, NO, 1.0)
    assert out == {k: NO if t == "distractor" else CAPTIONS[k] for k, t in TYPES.items()}


def test_a_judge_that_is_always_wrong_inverts_the_gate():
    out = gate(CAPTIONS, TYPES, NO, 0.0)
    assert out == {k: CAPTIONS[k] if t == "distractor" else NO for k, t in TYPES.items()}


def test_the_judge_errs_on_exactly_the_share_asked_for_and_is_seeded():
    perfect = gate(CAPTIONS, TYPES, NO, 1.0)
    for seed in range(5):
        out = gate(CAPTIONS, TYPES, NO, 0.75, seed=seed)
        assert sum(out[k] != perfect[k] for k in TYPES) == 2          # round(0.25 * 8)
        assert out == gate(CAPTIONS, TYPES, NO, 0.75, seed=seed)
    assert len({tuple(sorted(gate(CAPTIONS, TYPES, NO, 0.75, seed=s).items())) for s in range(5)}) > 1


def test_gate_rejects_bad_input():
    with pytest.raises(ConfigError, match=r"in \[0, 1\]"):
        gate(CAPTIONS, TYPES, NO, 1.5)
    with pytest.raises(ConfigError, match="no change type"):
        gate({**CAPTIONS, "000009.png": "x"}, TYPES, NO, 1.0)


def test_judge_curve_scores_the_gated_captions_like_the_evaluator():
    from idckit.eval.captions import evaluate_pairs

    refs = {k: (["no change", "nothing has changed"] if t == "distractor" else [f"the {t} cube changed"])
            for k, t in TYPES.items()}
    caps = {k: f"the {t} cube changed" if t != "distractor" else "the cube changed" for k, t in TYPES.items()}
    rows = judge_curve(refs, caps, TYPES, NO, accuracies=(0.5, 1.0), seeds=(0, 1))
    assert [(r["judge_accuracy"], r["seed"]) for r in rows] == [(0.5, 0), (0.5, 1), (1.0, 0)]
    for r in rows:
        direct = evaluate_pairs(refs, gate(caps, TYPES, NO, r["judge_accuracy"], r["seed"]), TYPES, meteor=False)
        assert r["CIDEr-D_total"] == pytest.approx(direct["total"]["CIDEr-D"])
        assert r["CIDEr-D_distractor"] == pytest.approx(direct["distractor"]["CIDEr-D"])
    perfect = rows[-1]
    # captions equal to their only reference on the semantic half, "no change" on every distractor
    assert perfect["CIDEr-D_semantic"] > 1 and perfect["CIDEr-D_total"] > rows[0]["CIDEr-D_total"]


# -- the feature probe and the script, on a small synthetic set -------------------------------------------
@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from idckit.data.synth.clevr_change import generate
    from idckit.experiments import pcl

    tmp = tmp_path_factory.mktemp("judge")
    root = tmp / "synth"
    generate(root, n_pairs=24, seed=1, size=(96, 64), workers=1, profile="smoke", progress=False)  # jitter 1.0
    s = pcl.setup("smoke", root, runs_dir=tmp / "runs", progress=False)
    r = pcl.run_variant(s, "full", progress=False)
    return s, tmp / "runs" / r["run"], root, tmp


def test_probe_radius_takes_the_best_match_within_the_window(smoke_run):
    from idckit.eval.probe import difference_probe
    from idckit.experiments import pcl

    data = pcl.loaded_data(smoke_run[0])
    same, near = difference_probe(data, radius=0), difference_probe(data, radius=2)
    assert same["radius"] == 0 and near["radius"] == 2 and same["train_pairs"] == near["train_pairs"] > 0
    # a window that includes the cell itself can only find a closer match (strictly, on real features)
    assert near["max_region_distance_change"] < same["max_region_distance_change"]
    assert near["max_region_distance_distractor"] < same["max_region_distance_distractor"]
    assert 0 <= same["test_accuracy"] <= 1 and 0 <= near["test_accuracy"] <= 1


def test_load_run_gives_the_selected_and_the_last_step(smoke_run):
    from idckit.eval.captions import load_results
    from idckit.experiments import pcl
    from idckit.tasks.pcl import predict

    s, run_dir = smoke_run[:2]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    best, step = pcl.load_run(run_dir, "best", device=s.device)
    assert step == metrics["best_step"]
    last, last_step = pcl.load_run(run_dir, "last", device=s.device)
    assert last_step == json.loads((run_dir / "config.json").read_text())["finetune"]["train"]["max_steps"]
    assert not best.training and not last.training
    # the selected weights decode the captions the run wrote for test
    ours = predict(best, pcl.loaded_data(s), "test", batch_size=s.config["finetune"]["eval_batch_size"])["captions"]
    assert ours == load_results(run_dir / "test")
    with pytest.raises(ConfigError, match="unknown checkpoint"):
        pcl.load_run(run_dir, "middle", device=s.device)
    with pytest.raises(Exception, match="config.json"):
        pcl.load_run(run_dir.parent, "best", device=s.device)
    assert registry.family("pcl").load_run(run_dir)[1] == step         # the registry's loader is this one
    other = Vocab([*SPECIALS, "the", "cube", "changed"])
    with pytest.raises(DatasetError, match="another vocabulary"):
        pcl.load_run(run_dir, vocab=other)


def test_judge_ceiling_script_at_smoke_size(smoke_run):
    s, run_dir, root, tmp = smoke_run
    from lab.scripts import judge_ceiling as jc

    out = tmp / "out"
    d = jc.run(root, [run_dir], ["best"], fractions=(0.5, 1.0), accuracies=(0.5, 1.0), seeds=(0, 1), threads=1,
               profile="smoke", runs_dir=tmp / "runs", out_dir=out)
    saved = json.loads((out / f"judge_ceiling_{Path(root).name}.json").read_text())
    assert saved["probe"] == d["probe"] and len(d["probe"]) == 4
    assert [p["radius"] for p in d["probe"]] == [0, 2, 0, 2]
    assert d["probe"][0]["train_pairs"] < d["probe"][2]["train_pairs"]
    g = d["gated"][0]
    assert g["run"] == run_dir.name and g["checkpoint"] == "best" and 0 <= g["model_judge_accuracy"] <= 1
    assert [(r["judge_accuracy"], r["seed"]) for r in g["rows"]] == [(0.5, 0), (0.5, 1), (1.0, 0)]
    from idckit.eval.baselines import MostFrequentCaption

    distractors = [p for p in s.data.dataset().pairs("train", check_images=False) if not p.is_change]
    assert g["no_change_sentence"] == MostFrequentCaption().fit(distractors).caption
    fig = jc.plot(out / "judge_ceiling.png", out)
    assert (out / "judge_ceiling.png").stat().st_size > 10_000 and len(fig.axes) == 2
