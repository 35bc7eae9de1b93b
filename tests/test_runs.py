"""The run cache: a finished run's captions and counts, and runs keyed by what they are."""
from __future__ import annotations

from idckit.eval.captions import write_results


def test_caption_counts_of_a_run(tmp_path):
    from idckit.experiments.runs import caption_counts, test_captions

    write_results(tmp_path / "r" / "test", {"000001.png": "a", "000001.png_n": "b", "000002.png": "a"})
    assert test_captions(tmp_path / "r") == {"000001.png": "a", "000001.png_n": "b", "000002.png": "a"}
    assert caption_counts(tmp_path / "r") == {"distinct_test_captions": 2, "test_pairs": 3}
    assert caption_counts(tmp_path / "unfinished") == {"distinct_test_captions": None, "test_pairs": None}


# -- runs keyed by what they are ------------------------------------------------------------------------------
import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from idckit.errors import ConfigError  # noqa: E402
from idckit.experiments import runs as runs_mod  # noqa: E402
from idckit.experiments.data import content_identity  # noqa: E402
from idckit.experiments.runs import (TRAINING_CODE_FINGERPRINT, TRAINING_CODE_VERSION, open_run,  # noqa: E402
                                     training_fingerprint)


def test_content_identity_follows_the_files_not_the_path(tiny_clevr, tmp_path):
    ident = content_identity(tiny_clevr)
    moved = shutil.copytree(tiny_clevr, tmp_path / "elsewhere" / "renamed")
    assert ident.startswith("index:") and content_identity(moved) == ident
    caps = json.loads((moved / "change_captions.json").read_text())
    caps["CLEVR_default_000000.png"][0] = "the small yellow rubber cylinder turned brown"
    (moved / "change_captions.json").write_text(json.dumps(caps))
    assert content_identity(moved) != ident
    # a synthetic set is its synth_info.json content (layout and key order do not matter)
    (moved / "synth_info.json").write_text('{"synthetic": true, "seed": 1, "pairs": 20}')
    synth = content_identity(moved)
    (moved / "synth_info.json").write_text('{\n "pairs": 20,\n "seed": 1, "synthetic": true}')
    assert synth.startswith("synth:") and content_identity(moved) == synth
    (moved / "synth_info.json").write_text('{"synthetic": true, "seed": 2, "pairs": 20}')
    assert content_identity(moved) != synth


def test_moving_the_data_keeps_the_run_keys_and_the_feature_cache(tiny_clevr, tmp_path):
    from idckit.experiments import pcl
    from idckit.experiments.recipes import get_recipe

    runs = tmp_path / "runs"
    here = pcl.setup("smoke", tiny_clevr, runs_dir=runs, progress=False)
    moved = shutil.copytree(tiny_clevr, tmp_path / "moved" / "clevr")
    shutil.rmtree(tiny_clevr)
    there = pcl.setup("smoke", moved, runs_dir=runs, progress=False)
    assert here.identity == there.identity and there.store.directory == here.store.directory
    full = get_recipe("pcl/full").settings
    a, b = pcl._pretrain_run(here, full, 0), pcl._pretrain_run(there, full, 0)
    assert a.dir == b.dir and str(tiny_clevr) not in (a.dir / "config.json").read_text()
    assert a.config["training_code"] == TRAINING_CODE_VERSION and a.config["data"] == content_identity(moved)


def test_a_new_training_code_version_is_a_new_run(tmp_path, monkeypatch):
    old = open_run(tmp_path, "toy", {"a": 1})
    old.complete({"x": 1})
    monkeypatch.setattr(runs_mod, "TRAINING_CODE_VERSION", TRAINING_CODE_VERSION + ".next")
    new = open_run(tmp_path, "toy", {"a": 1})
    assert new.dir != old.dir and not new.is_complete() and old.is_complete()


def test_the_training_code_fingerprint_is_the_one_its_version_was_decided_on():
    assert training_fingerprint() == TRAINING_CODE_FINGERPRINT, (
        "the training code changed (idckit/experiments/runs.py TRAINING_MODULES). If the change alters what a run "
        "learns, bump TRAINING_CODE_VERSION (every cached run retrains); either way set TRAINING_CODE_FINGERPRINT "
        f"= {training_fingerprint()!r}")


def test_the_fingerprint_ignores_docstrings_and_comments_but_not_code(tmp_path):
    package = Path(runs_mod.__file__).resolve().parents[1]
    copy = shutil.copytree(package, tmp_path / "idckit", ignore=shutil.ignore_patterns("__pycache__"))
    base = training_fingerprint(copy)
    assert base == training_fingerprint()
    losses = copy / "losses.py"
    text = losses.read_text()
    losses.write_text(text.replace('"""', '"""Reworded for a reader. ', 1) + "\n# a comment\n")
    assert training_fingerprint(copy) == base
    losses.write_text(text + "\nSCALE = 2\n")
    assert training_fingerprint(copy) != base
    losses.write_text(text)
    (copy / "reproduce.py").write_text("CHANGED = 1\n")   # not a training module
    assert training_fingerprint(copy) == base


def test_a_finished_run_records_the_commit_and_code_version(tmp_path):
    from idckit.reports.report import git_commit

    run = open_run(tmp_path, "toy", {"a": 1})
    run.complete({"x": 1}, profile="smoke", data_identity="synth:abc")
    rec = json.loads((run.dir / "record.json").read_text())
    assert rec["commit"] == git_commit() and rec["commit"] != "unknown"
    assert rec["training_code"] == TRAINING_CODE_VERSION and rec["profile"] == "smoke"
    assert run.record() == rec and run.metrics() == {"x": 1}


def _finished_run(runs: Path, name: str, val: float, profile: str, data: str) -> None:
    run = runs / f"pcl-finetune-{name}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"data": data}))
    for f in ("best.pt", "vocab.json"):
        (run / f).write_text("")
    (run / "record.json").write_text(json.dumps({"profile": profile, "data_identity": data, "data": f"data {data}"}))
    (run / "metrics.json").write_text(json.dumps({"val": {"CIDEr-D": val}}))


def test_caption_picks_the_best_run_of_one_profile_and_one_dataset_and_says_which(tmp_path, tiny_clevr,
                                                                                   monkeypatch):
    from idckit.cli import caption

    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path / "data"))   # no synthetic default generated
    runs = tmp_path / "runs"
    _finished_run(runs, "a", 0.9, "smoke", "synth:x")      # the best val score, but a smoke run
    _finished_run(runs, "b", 0.5, "cpu", "synth:x")
    _finished_run(runs, "c", 0.7, "cpu", "synth:x")
    run, why = caption.choose_run(runs)
    assert run.name == "pcl-finetune-c"
    assert why == ("best val CIDEr-D 70.0 of 2 finished run(s) at profile cpu on data synth:x; 1 run(s) of other "
                   "profiles or data not compared (--profile, --data-root choose)")
    assert caption.choose_run(runs, profile="smoke")[0].name == "pcl-finetune-a"
    real = content_identity(tiny_clevr)
    _finished_run(runs, "d", 0.8, "cpu", real)              # the same profile on another dataset
    with pytest.raises(ConfigError, match="on 2 different datasets") as err:
        caption.choose_run(runs)
    assert "--data-root" in err.value.fix
    assert caption.choose_run(runs, data_root=tiny_clevr)[0].name == "pcl-finetune-d"
    # the profile's synthetic default wins when it exists
    monkeypatch.setattr(caption, "_default_data", lambda p: "synth:x" if p == "cpu" else None)
    assert caption.choose_run(runs)[0].name == "pcl-finetune-c"
    with pytest.raises(ConfigError, match="no finished IDC-PCL run matches profile 'paper'"):
        caption.choose_run(runs, profile="paper")


def _held_elsewhere(run) -> bool:
    """Whether some holder has ``run``'s lock: flock locks belong to open files, so a fresh open of the same lock
    file conflicts with a holder in this process as in any other."""
    import fcntl

    with open(run.dir / ".lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_a_second_process_waits_for_the_run_and_a_killed_holder_frees_it(tmp_path):
    import subprocess
    import sys
    import time

    run = open_run(tmp_path, "toy", {"a": 1})
    holder = ("import sys, time; from idckit.experiments.runs import open_run\n"
              "run = open_run(sys.argv[1], 'toy', {'a': 1})\n"
              "with run.exclusive():\n"
              "    (run.dir / 'started').write_text('')\n"
              "    time.sleep(float(sys.argv[2]))\n"
              "    run.complete({'x': 1})\n")
    child = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path), "1.5"])
    deadline = time.time() + 60
    while not (run.dir / "started").exists():
        assert time.time() < deadline and child.poll() is None, "the holder never started"
        time.sleep(0.05)
    assert _held_elsewhere(run)
    with run.exclusive():                      # waits for the child: the run is finished when we get it
        assert run.is_complete() and run.metrics() == {"x": 1}
    assert child.wait(timeout=60) == 0 and not _held_elsewhere(run)
    # a holder killed mid-run leaves no stale lock behind
    other = open_run(tmp_path, "toy", {"a": 2})
    child = subprocess.Popen([sys.executable, "-c", holder.replace("'a': 1", "'a': 2"), str(tmp_path), "600"])
    while not (other.dir / "started").exists():
        assert time.time() < deadline and child.poll() is None, "the holder never started"
        time.sleep(0.05)
    assert _held_elsewhere(other)
    child.kill()
    child.wait(timeout=60)
    with other.exclusive():
        assert not other.is_complete()


def test_a_run_is_held_while_it_trains_and_released_after(tmp_path, tiny_clevr, monkeypatch):
    from idckit.experiments import pcl

    s = pcl.setup("smoke", tiny_clevr, runs_dir=tmp_path / "runs", progress=False)
    seen = []

    def fake_finetune(s, run, pre, progress):
        seen.append(_held_elsewhere(run))
        run.complete({"test": {}})

    monkeypatch.setattr(pcl, "_finetune", fake_finetune)
    monkeypatch.setattr(pcl, "variant_result", lambda *a, **k: {})
    pcl.run_variant(s, "none", 0)
    run = next((tmp_path / "runs").glob("pcl-finetune-*"))
    assert seen == [True] and not _held_elsewhere(type("R", (), {"dir": run})())
