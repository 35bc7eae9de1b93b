"""How ``make reproduce NPROC=N`` reaches the notebooks: torchrun trains the runs first (``idckit train``), then the
notebooks find them in the run cache and only decode, score and render.

A whole smoke notebook after a 2-process ``idckit train`` takes about 75 s here (the training processes' start-up,
feature extraction and the JVM scorer dominate), so the test stops one step short of papermill: it calls what the
notebook calls (``pcl.setup`` then ``pcl.runs``) and checks that nothing trains there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_reproduce_nproc_trains_under_torchrun_before_the_notebooks():
    out = subprocess.run(["make", "-n", "reproduce", "NPROC=2", "PROFILE=smoke", "DEVICE=cpu",
                          "NOTEBOOKS=table2_clevr_change"], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = [line.strip() for line in out.stdout.splitlines()]
    from idckit.registry import FAMILIES

    # the values travel in the environment, read quoted (tests/test_bad_input_makefile.py runs them for real)
    trains = [i for i, line in enumerate(lines)
              if 'torchrun --standalone --nproc_per_node="$NPROC" -m idckit.cli train' in line]
    # every family of the table manifest, one after another, then CLIP4IDC's further seeds
    assert lines[trains[0]].startswith(f"for f in {' '.join(FAMILIES)}; do ") and " train $f " in lines[trains[0]]
    assert all('--profile "$PROFILE"' in lines[i] and '--device "$DEVICE"' in lines[i] for i in trains)
    # the CLIP4IDC notebooks' captioning seeds (tables 1 and 2 show seeds 0, 1, 2) are trained under torchrun too
    assert any("--variants clip4idc --seeds 1 2" in lines[i] for i in trains)
    notebooks = [i for i, line in enumerate(lines) if "-m idckit.cli reproduce" in line]
    assert len(notebooks) == 1 and notebooks[0] > max(trains) and "$NOTEBOOKS" in lines[notebooks[0]]
    plain = subprocess.run(["make", "-n", "reproduce", "PROFILE=smoke"], cwd=ROOT, capture_output=True, text=True,
                           check=True)
    assert "torchrun" not in plain.stdout       # NPROC=1: the notebooks train in their own process


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)       # as the torchrun processes (OMP_NUM_THREADS=1): a busy 2-core box crawls at 2
    yield
    torch.set_num_threads(n)


def test_runs_trained_by_torchrun_are_the_notebooks_runs(tmp_path, monkeypatch, one_thread):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "IDCKIT_DATA_DIR": str(tmp_path / "data"), "IDCKIT_RUNS_DIR": str(tmp_path / "runs")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "idckit.cli",
           "train", "pcl", "--profile", "smoke", "--variants", "none", "--device", "cpu"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    trained = sorted((tmp_path / "runs").glob("pcl-finetune-*"))
    assert len(trained) == 1 and (trained[0] / "metrics.json").is_file()
    assert len(torch.load(trained[0] / "last.pt", weights_only=True)["rng_ranks"]) == 2   # 2 DDP processes

    # what table4_ablation's "w/o pre-training" row calls, in one process: it finds the run and trains nothing
    from idckit.experiments import pcl
    from idckit.train import loop

    monkeypatch.setenv("IDCKIT_DATA_DIR", env["IDCKIT_DATA_DIR"])
    monkeypatch.setenv("IDCKIT_RUNS_DIR", env["IDCKIT_RUNS_DIR"])
    monkeypatch.setattr(loop, "fit", lambda *a, **k: pytest.fail("the notebook trained a run torchrun had trained"))
    setup = pcl.setup("smoke", None, progress=False, device="cpu")
    (result,) = pcl.runs(setup, ["none"], [0], progress=False)
    assert result["run"] == trained[0].name and result["test"]["total"]["CIDEr-D"] >= 0
