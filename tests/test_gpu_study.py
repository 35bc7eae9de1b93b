"""lab/scripts/gpu_study.py (issue 52, item 1): the CPU dry run goes through every phase of `make gpu-study` and writes
the files the GPU session will bring back, with the fields the study reads; --score scores them with the kit's
evaluator. The kit's data/runs/reports folders are redirected by conftest; the study writes under tmp_path only."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_writes_every_run_and_scores(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "lab.scripts.gpu_study", "--dry-run", "--out", str(out),
                           "--work", str(work), "--workers", "2", "--jobs", "2", "--threads", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "IDCKIT_GPU_STUDY_NO_JAVA": "1"})    # the GPU machine has no Java
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[gpu-study] plan" in proc.stdout          # the budgets are printed up front
    files = sorted(p.name for p in out.iterdir())
    assert files == ["clip4idc_cpu_size.json", "pcl_cpu_size.json", "pcl_paper_size.json", "references.json",
                     "summary.json"]
    assert len(files) <= 8 and all((out / f).stat().st_size <= 16 * 2 ** 20 for f in files)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["phases"]) == {"render", "features", "train", "collect"}
    assert set(summary["runs"]) == {"pcl_1x", "pcl_10x", "pcl_30x", "pcl_30x_paper_settings", "pcl_10x_jitter1",
                                    "pcl_paper_size", "clip4idc_10x"}
    assert all(r["status"] == "done" for r in summary["runs"].values()), summary["runs"]
    refs = json.loads((out / "references.json").read_text())
    for kind in ("pcl_cpu_size", "pcl_paper_size", "clip4idc_cpu_size"):
        for r in json.loads((out / f"{kind}.json").read_text())["runs"]:
            assert r["val_history"], r["name"]
            point = r["val_history"][-1]
            assert {"step", "CIDEr-D", "type_named", "distinct_captions"} <= set(point), (r["name"], point)
            assert r["loss_curve"]["finetune"] and "loss" in r["loss_curve"]["finetune"][-1]
            t = r["test_type_named"]
            assert 0 <= t["type_named"] <= 100 and t["type_named_by_type"] and t["changed_pairs"] > 0
            assert r["distinct_test_captions"] >= 1 and r["java"] is False
            assert "METEOR" not in r["test_quick"]["total"]         # scored without Java on the device
            assert set(r["test_captions"]) == set(refs[r["phase"]["data"]]["references"])
            if r["phase"]["model"] == "pcl":
                assert r["judge_accuracy"] is not None and r["loss_curve"]["pretrain"]
    runs = {r["name"]: r for r in json.loads((out / "pcl_cpu_size.json").read_text())["runs"]}
    # steps scale with the budget; the 30x run at a 15 s loop budget stops on the time cap and says so
    assert runs["pcl_10x"]["max_steps"] == 10 * runs["pcl_1x"]["max_steps"]
    assert runs["pcl_30x"]["stopped"] == "max_minutes"
    assert runs["pcl_30x_paper_settings"]["overrides"]["model"]["dropout"] == 0.2      # paper's, at the cpu size
    # the twin is the kit's hard set (at the smoke profile both sets render at jitter 1.0; at cpu they differ)
    from idckit.experiments.data import synth_root

    assert Path(runs["pcl_10x_jitter1"]["data_root"]).name == synth_root("smoke", hard=True).name
    assert Path(runs["pcl_10x"]["data_root"]).name == synth_root("smoke").name
    assert synth_root("cpu", hard=True).name != synth_root("cpu").name
    assert all(Path(r["data_root"]).is_relative_to(work) for r in runs.values())      # never the clone's data/
    assert "pycocoevalcap" in runs["pcl_1x"]["imported_packages"]      # what must travel to the GPU machine

    scores = tmp_path / "scores.json"
    proc = subprocess.run([sys.executable, "-m", "lab.scripts.gpu_study", "--score", str(out), "--scores-out",
                           str(scores), "--no-meteor"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(scores.read_text())["scores"]
    assert set(s) == set(summary["runs"]) and all("CIDEr-D" in v["total"] for v in s.values())


def test_preflight_names_what_is_missing(monkeypatch):
    """Before any GPU minute is spent, a missing package is named with the fix (the image lacks open_clip & co)."""
    from lab.scripts import gpu_study

    assert gpu_study.preflight() == []        # the kit's venv has everything
    for mod in ("open_clip", "pycocoevalcap.cider.cider"):
        monkeypatch.setitem(sys.modules, mod, None)       # a None entry makes `import mod` raise ImportError
    missing = gpu_study.preflight()
    assert len(missing) == 2 and "open_clip_torch" in missing[0] and "pycocoevalcap" in missing[1]


def test_pycocoevalcap_copy_scores_without_its_data(tmp_path):
    """The copy that travels in .whl/site holds the scorers the device runs (CIDEr-D on whitespace tokens), and
    none of METEOR's or SPICE's data, which would not fit the 64 MiB carry."""
    from lab.scripts import gpu_study

    dst = gpu_study.copy_pycocoevalcap(tmp_path)
    assert (dst / "cider" / "cider_scorer.py").is_file() and not (dst / "spice").exists()
    assert not [f for f in dst.rglob("*") if f.is_file() and f.suffix != ".py"]
    assert sum(f.stat().st_size for f in dst.rglob("*")) < 2 ** 20
    code = ("import pycocoevalcap.cider.cider as c; from pycocoevalcap.cider.cider import Cider; "
            "print(c.__file__); print(Cider().compute_score({'a': ['a red cube moved']}, "
            "{'a': ['a red cube moved']})[0] >= 0)")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0].startswith(str(tmp_path)) and proc.stdout.split()[1] == "True"
