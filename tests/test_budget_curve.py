"""lab/scripts/budget_curve.py at smoke size: the overrides it trains with, the history it records, the plot."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lab.scripts import budget_curve as bc


def test_overrides_keep_the_cpu_schedule_shape():
    assert bc._overrides("pcl", 1800, 200, None) == {
        "finetune": {"train": {"max_steps": 1800, "eval_every": 200, "decay_every": 900}}}
    assert bc._overrides("clip4idc", 3000, 250, 40.0) == {
        "caption": {"train": {"max_steps": 3000, "eval_every": 250, "max_minutes": 40.0}}}


@pytest.fixture
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)       # smoke-size training: a second thread gains nothing, a busy 2-core box crawls
    yield
    torch.set_num_threads(n)


def test_pcl_curve_at_smoke_size(tmp_path, one_thread):
    from idckit.data.synth.clevr_change import generate

    root = tmp_path / "synth"
    generate(root, n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    out = tmp_path / "out"
    bc.main(["pcl", "--profile", "smoke", "--steps", "4", "--eval-every", "2", "--data-root", str(root),
             "--runs-dir", str(tmp_path / "runs"), "--out-dir", str(out), "--plot"])
    d = json.loads((out / "budget_curve_pcl_synth_f1.json").read_text())
    assert d["profile"] == "smoke" and d["overrides"]["finetune"]["train"]["max_steps"] == 4
    assert d["train_fraction"] == 1.0 and d["train_pairs"] > 0
    # the text-only line drawn beside the curve: the commonest training caption, scored on the same val pairs
    tb = d["text_baseline"]
    assert tb["split"] == "val" and tb["caption"] and 0 <= tb["CIDEr-D_semantic"] and 0 < tb["CIDEr-D"] < 10
    assert [h["step"] for h in d["history"]] == [2, 4]
    assert all(math.isfinite(h["CIDEr-D"]) and h["minutes"] >= 0 for h in d["history"])
    assert d["best_step"] in (2, 4)
    assert 1 <= d["distinct_test_captions"]["distinct"] <= d["distinct_test_captions"]["pairs"]
    assert (out / "budget_curve.png").stat().st_size > 10_000


def test_plot_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run a model first"):
        bc.plot(tmp_path / "x.png", tmp_path)


def test_train_fraction_is_a_pcl_override_and_names_the_json():
    assert bc._overrides("pcl", 100, 50, None, 0.25)["train_fraction"] == 0.25
    assert "train_fraction" not in bc._overrides("pcl", 100, 50, None, 1.0)
    with pytest.raises(SystemExit, match="IDC-PCL only"):
        bc._overrides("clip4idc", 100, 50, None, 0.5)
    assert bc._json_name("pcl", None, 1.0) == "budget_curve_pcl.json"
    assert bc._json_name("pcl", Path("/d/synth-n8000"), 0.25) == "budget_curve_pcl_synth-n8000_f0.25.json"


def test_distractor_weight_is_a_pcl_finetune_override_and_names_the_json():
    assert bc._overrides("pcl", 100, 50, None, distractor_weight=5.0)["finetune"]["distractor_weight"] == 5.0
    assert "distractor_weight" not in bc._overrides("pcl", 100, 50, None)["finetune"]
    with pytest.raises(SystemExit, match="IDC-PCL only"):
        bc._overrides("clip4idc", 100, 50, None, distractor_weight=5.0)
    assert bc._json_name("pcl", Path("/d/synth-n8000"), 1.0, 5.0) == "budget_curve_pcl_synth-n8000_f1_dw5.json"
    assert bc._json_name("pcl", None, 1.0, 2.5) == "budget_curve_pcl_default_f1_dw2.5.json"


def test_pretrain_steps_is_a_pcl_pretrain_override_and_names_the_json():
    assert bc._overrides("pcl", 100, 50, None, pretrain_steps=1000)["pretrain"] == {"train": {"max_steps": 1000}}
    assert "pretrain" not in bc._overrides("pcl", 100, 50, None)
    with pytest.raises(SystemExit, match="IDC-PCL only"):
        bc._overrides("clip4idc", 100, 50, None, pretrain_steps=1000)
    assert bc._json_name("pcl", Path("/d/n8000"), 1.0, None, 1000) == "budget_curve_pcl_n8000_f1_pt1000.json"


def test_smaller_train_fraction_trains_on_fewer_pairs_and_is_its_own_run(tmp_path, one_thread):
    from idckit.data.synth.clevr_change import generate

    root = tmp_path / "synth"
    generate(root, n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    out = tmp_path / "out"
    args = ["pcl", "--profile", "smoke", "--steps", "2", "--eval-every", "2", "--data-root", str(root),
            "--runs-dir", str(tmp_path / "runs"), "--out-dir", str(out)]
    bc.main(args)
    bc.main(args + ["--train-fraction", "0.5"])
    whole = json.loads((out / "budget_curve_pcl_synth_f1.json").read_text())
    half = json.loads((out / "budget_curve_pcl_synth_f0.5.json").read_text())
    assert half["train_pairs"] == 2 * round(0.5 * whole["train_pairs"] / 2)   # both pairs of half the befores
    assert half["run"] != whole["run"]
    # val and test are not subsampled: both runs are scored on the same pairs
    assert half["distinct_test_captions"]["pairs"] == whole["distinct_test_captions"]["pairs"]


def test_a_curve_keeps_its_colour_in_both_panels(tmp_path):
    """An older curve without semantic CIDEr-D must not shift the colours of the semantic panel (it did once)."""
    hist = lambda sem: [{"step": s, "minutes": s / 10, "CIDEr-D": 0.5, **({"CIDEr-D_semantic": 0.1} if sem else {})}
                        for s in (10, 20)]
    for name, sem in (("budget_curve_a.json", False), ("budget_curve_b.json", True)):
        (tmp_path / name).write_text(json.dumps({"label": name[13], "profile": "cpu", "history": hist(sem)}))
    fig = bc.plot(tmp_path / "x.png", tmp_path)
    total, semantic = fig.axes[:2]
    marked = lambda ax: [ln for ln in ax.get_lines() if ln.get_marker() == "o" and len(ln.get_xdata())]
    assert len(marked(total)) == 2 and len(marked(semantic)) == 1
    assert marked(semantic)[0].get_color() == marked(total)[1].get_color() != marked(total)[0].get_color()
