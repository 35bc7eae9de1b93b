"""Tests never touch the project tree: the kit's data, runs and reports folders point outside the clone for the whole
session (tests/conftest.py), `reproduce` is tested with its prepare stage faked, and a check at the end of the
session fails the suite if the clone's data/, runs/, reports/ or tracked files changed."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import KIT_DIRS, tree_changes, tree_state, whole_suite
from idckit import paths

ROOT = Path(__file__).resolve().parents[1]


def _outside_the_clone(p) -> bool:
    return not Path(p).resolve().is_relative_to(ROOT)


def test_the_kits_folders_lie_outside_the_clone_here_and_in_a_subprocess():
    folders = [paths.data_dir(), paths.runs_dir(), paths.reports_dir(), paths.reports_dir("smoke")]
    assert all(map(_outside_the_clone, folders)), folders
    # a CLI subprocess or a notebook kernel inherits them
    code = "from idckit import paths; print(paths.data_dir()); print(paths.runs_dir()); print(paths.reports_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == 3 and all(map(_outside_the_clone, out)), out


def test_a_test_may_still_point_them_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("IDCKIT_RUNS_DIR", str(tmp_path / "mine"))
    assert paths.runs_dir() == tmp_path / "mine" and _outside_the_clone(paths.data_dir())


def test_reproduce_of_every_notebook_at_the_cpu_profile_renders_nothing(fake_reproduce, tmp_path):
    """The fake keeps the prepare stage's steps (so reproduce's order and records are tested) but builds none: the
    cpu profile's 8,000-scene SynthCLEVR-Change alone takes 45 minutes on two cores."""
    from idckit import reproduce as rp

    t0 = time.time()
    out = rp.reproduce(profile="cpu", report_dir=tmp_path / "rep", runs_dir=tmp_path / "runs", jobs=1)
    assert out and all(o.ok for o in out) and time.time() - t0 < 30
    assert "scenes clevr-change" in fake_reproduce.prepared and "features birds" in fake_reproduce.prepared
    assert fake_reproduce.ran == [o.notebook for o in out]
    assert not paths.data_dir().exists() or not any(paths.data_dir().iterdir())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# -- the end-of-session check (conftest.pytest_sessionfinish) -------------------------------------------------
def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def clone(tmp_path):
    """A fake project: one tracked source file, a committed report, an ignored data/ holding a dataset."""
    root = tmp_path / "clone"
    (root / "idckit").mkdir(parents=True)
    (root / "idckit" / "a.py").write_text("x = 1\n")
    (root / "reports").mkdir()
    (root / "reports" / "t.json").write_text("{}")
    (root / ".gitignore").write_text("/data/\n/runs/\n__pycache__/\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "c")
    (root / "data" / "ds").mkdir(parents=True)
    (root / "data" / "ds" / "img.png").write_bytes(b"png")
    return root


def test_the_tree_check_passes_when_nothing_changed(clone):
    before = tree_state(clone, tracked=True)
    (clone / "idckit" / "__pycache__").mkdir()          # what importing the package leaves is no change
    (clone / "idckit" / "__pycache__" / "a.pyc").write_bytes(b"")
    assert tree_changes(before, tree_state(clone, tracked=True)) == []


@pytest.mark.parametrize("tracked", [True, False])
def test_the_tree_check_names_a_new_file_in_data_and_a_changed_report_always(clone, tracked):
    before = tree_state(clone, tracked=tracked)
    (clone / "data" / "synth-n8000").mkdir()
    (clone / "data" / "synth-n8000" / "x.png").write_bytes(b"new")
    (clone / "runs").mkdir()
    (clone / "reports" / "t.json").write_text('{"rewritten": 1}')
    assert tree_changes(before, tree_state(clone, tracked=tracked)) == [
        "data/synth-n8000/", "data/synth-n8000/x.png", "reports/t.json", "runs/"]


def test_the_tree_check_names_a_changed_tracked_file_only_when_told(clone):
    before = tree_state(clone, tracked=True)
    (clone / "idckit" / "a.py").write_text("x = 2\n")
    (clone / "gpu_check").mkdir()                       # a stray output beside the sources
    (clone / "gpu_check" / "gpu_check.json").write_text("{}")
    assert tree_changes(before, tree_state(clone, tracked=True)) == ["gpu_check/", "idckit/a.py"]
    assert tree_changes(tree_state(clone, tracked=False), tree_state(clone, tracked=False)) == []
    # a file already edited when the session started, edited again by a test
    before = tree_state(clone, tracked=True)
    (clone / "idckit" / "a.py").write_text("x = 3\n")
    assert tree_changes(before, tree_state(clone, tracked=True)) == ["idckit/a.py"]


def test_tracked_files_are_checked_on_the_whole_suite_or_under_ci(monkeypatch):
    from _pytest.config import Config

    def config(source, args):
        return SimpleNamespace(args_source=source, args=args, getini=lambda name: ["tests"], rootpath=ROOT,
                               invocation_params=SimpleNamespace(dir=ROOT))

    monkeypatch.delenv("CI", raising=False)
    assert whole_suite(config(Config.ArgsSource.TESTPATHS, ["tests"]))
    assert whole_suite(config(Config.ArgsSource.ARGS, ["tests/"]))
    assert not whole_suite(config(Config.ArgsSource.ARGS, ["tests/test_isolation.py"]))
    monkeypatch.setenv("CI", "true")
    assert whole_suite(config(Config.ArgsSource.ARGS, ["tests/test_isolation.py"]))


def test_every_folder_the_kit_reads_from_the_environment_is_redirected():
    """A folder variable added to idckit.paths later is redirected too, or this fails."""
    import re

    assert set(re.findall(r'"(IDCKIT_\w+_DIR)"', Path(paths.__file__).read_text())) == set(KIT_DIRS)
