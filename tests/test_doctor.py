"""idckit doctor: devices, Java, the weights and data each profile needs, and a non-zero exit when a notebook
would stop."""
from __future__ import annotations

import shutil

import huggingface_hub
import torch

from idckit.cli import main


def test_doctor_says_what_each_profile_needs_and_what_is_missing_offline(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))            # nothing cached
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    assert main(["doctor", "--profile", "paper", "--runs-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "device auto -> cpu" in out and "java:" in out
    assert "distributed: backends" in out and "gloo" in out and "NPROC=N" in out
    # what each notebook will do: its experiment, the weights it needs, where it runs
    # the families' notebooks come from the table manifest (IDC-PCL also trains for CLIP4IDC table 1's comparison)
    assert ("(table2_clevr_change, table3_change_types, table4_ablation, clip4idc_table1_clevr_change) at paper: "
            "resnet101") in out
    assert "DUDA (table2_clevr_change, table3_change_types) at paper" in out
    assert "Birds-to-Words" in out and "table1_birds_to_words" in out and "clip4idc_table6_retrieval" in out
    assert out.count("device auto (-> cpu), no DataLoader workers") == 4      # pcl, birds, clip4idc, duda
    assert "no --spot-root; clip4idc_table3_spot_the_diff, clip4idc_table5_ablation, clip4idc_table6_retrieval " \
           "use SynthSpot-the-Diff" in out
    problems = [line for line in out.splitlines() if line.startswith("! ")]
    assert len(problems) == 3 + (shutil.which("java") is None)
    assert any("resnet101" in p and "backbone_weights" in p for p in problems)         # the paper's features
    # birds at paper read ResNet-101 grids too, as the authors' bird/ configs do (img_embs 2048)
    assert any(p.startswith("! IDC-PCL on Birds-to-Words") and "resnet101" in p for p in problems)
    assert any("ViT-B-32 openai" in p and "HF_HUB_OFFLINE" in p for p in problems)     # the paper's CLIP
    # the cpu profile needs nothing from a hub
    assert main(["doctor", "--profile", "cpu", "--runs-dir", str(tmp_path)]) == (0 if shutil.which("java") else 1)
    out = capsys.readouterr().out
    assert "efficientnet_lite0 grid features, weights found" in out and "stand-in" in out


def test_doctor_fails_on_a_dataset_without_the_layout(capsys, tmp_path):
    (tmp_path / "spot").mkdir()
    assert main(["doctor", "--spot-root", str(tmp_path / "spot"), "--runs-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    bad = out[out.index("! data:"):]
    assert bad.startswith("! data: not a Spot-the-Diff root: missing folder annotations/")
    assert "fix:  point spot_root / --spot-root / SPOT_ROOT= at the folder holding annotations/" in bad


def test_doctor_flags_a_runs_dir_that_is_a_file(capsys, tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text("notes")
    assert main(["doctor", "--profile", "smoke", "--runs-dir", str(runs)]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("! ")]
    assert any(str(runs) in p and "is a file" in p and "--runs-dir" in p for p in problems)
    assert runs.read_text() == "notes"
