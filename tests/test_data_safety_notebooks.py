"""The notebooks follow the kit's one write policy, and every relative path means the caller's working directory.

A notebook's ``report_dir`` is claimed as ``idckit reproduce`` claims its ``--report-dir`` (absent, empty or the
kit's own; a user's file there is refused, never replaced), and ``reproduce`` hands its notebooks, their kernels
and its lane workers absolute paths only: a kernel runs in ``notebooks/``, where a relative path would land.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from idckit import fileio, paths
from idckit.errors import ConfigError, IdckitError
from idckit.reports.notebook_params import check_parameters
from idckit.reports.report import Provenance, write_report

ROWS = [{"model": "m", "variant": "v", "split": "test", "metrics": {"CIDEr-D": 42.0}}]
PATH_ENV = ("IDCKIT_DATA_DIR", "IDCKIT_RUNS_DIR", "IDCKIT_REPORTS_DIR")


def _prov() -> Provenance:
    return Provenance(profile="smoke", data="synthetic: test", data_version="v", backbone="b", weights="w",
                      seeds=[0], commit="abc", environment={})


def _write(report_dir, name="00_walkthrough") -> Path:
    return write_report(report_dir, name, "walkthrough", ROWS, _prov())


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _refused(call, *, where: Path, says: str) -> IdckitError:
    before = _snapshot(where)
    with pytest.raises(ConfigError) as e:
        call()
    assert says in str(e.value) and e.value.fix, str(e.value)
    assert _snapshot(where) == before, "a refused write changed the folder"
    return e.value


def _namespace(report_dir, profile="smoke") -> dict:
    """What a notebook's check_parameters(globals()) sees after `papermill -p profile P -p report_dir R`."""
    cells = ["", "profile = 'cpu'\nclevr_root = None\nruns_dir = None\nreport_dir = None\n",
             f"# Parameters\nprofile = {profile!r}\nreport_dir = {report_dir!r}\n",
             "check_parameters(globals())"]
    return {"In": cells, "profile": profile, "report_dir": report_dir}


# -- the notebooks' write policy ----------------------------------------------------------------------------
def test_a_notebook_keeps_a_users_own_report_json(tmp_path):
    """papermill notebooks/00_walkthrough.ipynb o.ipynb -p profile smoke -p report_dir s: s/00_walkthrough.json
    is the user's, not a report the kit wrote."""
    s = tmp_path / "s"
    s.mkdir()
    (s / "00_walkthrough.json").write_text('{"my": "own numbers"}')
    err = _refused(lambda: _write(s), where=s, says="00_walkthrough.json")
    assert str(s) in str(err)


def test_a_notebook_refuses_a_folder_holding_a_users_files_then_writes_once_it_is_the_kits(tmp_path):
    s = tmp_path / "s"
    s.mkdir()
    (s / "notes.txt").write_text("mine")
    _refused(lambda: _write(s), where=s, says="notes.txt")
    (s / "notes.txt").unlink()
    first = _write(s)
    assert json.loads(first.read_text())["notebook"] == "00_walkthrough"
    again = _write(s)                                  # the kit's own report: replaced, as reproduce would
    assert again == first and _write(s, "table2_clevr_change").is_file()


def test_a_notebook_will_not_write_its_report_into_another_kind_of_kit_folder(tmp_path):
    data = tmp_path / "synth"
    data.mkdir()
    (data / "splits.json").write_text("{}")
    fileio.write_json(data / fileio.OWNER_FILE, {"kind": "dataset", "what": "dataset", "entries": ["splits.json"]})
    _refused(lambda: _write(data), where=data, says="not a idckit report folder")


def test_a_notebook_will_not_write_its_report_into_the_run_cache(tmp_path):
    runs = tmp_path / "runs"
    (runs / "pcl-finetune-0123abcd").mkdir(parents=True)
    (runs / "pcl-finetune-0123abcd" / "metrics.json").write_text("{}")
    _refused(lambda: _write(runs), where=runs, says="pcl-finetune-0123abcd")


def test_a_running_reproduces_stage_is_the_kits_but_a_users_notebook_is_not(tmp_path):
    """reproduce runs a notebook into <report_dir>/.idckit-staging-<pid>/<name>/, beside papermill's executed copy;
    the notebook writes there. A notebook papermill did not write is the user's."""
    stage = tmp_path / "reports" / f"{fileio._STAGING}{os.getpid()}" / "00_walkthrough"
    stage.mkdir(parents=True)
    executed = nbformat.v4.new_notebook()
    executed.metadata["papermill"] = {"input_path": "notebooks/00_walkthrough.ipynb",
                                      "output_path": str(stage / "00_walkthrough.ipynb")}
    nbformat.write(executed, str(stage / "00_walkthrough.ipynb"))
    assert _write(stage).is_file()

    mine = tmp_path / "mine"
    mine.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), str(mine / "analysis.ipynb"))
    _refused(lambda: _write(mine), where=mine, says="analysis.ipynb")


def test_a_notebook_refuses_a_users_report_dir_in_its_first_cells_before_any_work(tmp_path):
    s = tmp_path / "s"
    s.mkdir()
    (s / "00_walkthrough.json").write_text('{"my": "own numbers"}')
    err = _refused(lambda: check_parameters(_namespace(str(s))), where=s, says="report_dir")
    assert "--force" not in err.fix          # a notebook takes no --force; the fix must be one it can follow
    check_parameters(_namespace(str(tmp_path / "new")))       # a new folder: fine, and nothing is created yet
    assert not (tmp_path / "new").exists()


def test_a_notebooks_default_report_dir_is_claimed_too(tmp_path, monkeypatch):
    monkeypatch.setenv("IDCKIT_REPORTS_DIR", str(tmp_path / "reports"))
    (tmp_path / "reports" / "smoke").mkdir(parents=True)
    (tmp_path / "reports" / "smoke" / "draft.md").write_text("mine")
    _refused(lambda: check_parameters(_namespace(None)), where=tmp_path / "reports", says="draft.md")


# -- relative paths mean the caller's working directory --------------------------------------------------------
def test_the_kits_folders_from_relative_environment_variables_are_absolute_under_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var, rel in zip(PATH_ENV, ("reldata", "relruns", "relreports")):
        monkeypatch.setenv(var, rel)
    got = [paths.data_dir(), paths.runs_dir(), paths.reports_dir(), paths.reports_dir("smoke")]
    assert got == [tmp_path / "reldata", tmp_path / "relruns", tmp_path / "relreports",
                   tmp_path / "relreports" / "smoke"]
    assert all(p.is_absolute() for p in got)


def test_every_path_a_notebook_is_given_is_absolute_under_the_callers_cwd(tmp_path, monkeypatch):
    from idckit.reproduce.runner import parameters

    monkeypatch.chdir(tmp_path)
    params = parameters("table2_clevr_change", profile="smoke", roots={"clevr_root": "d"}, report_dir=Path("rep"),
                        runs_dir=Path("relruns"), released={"released_checkpoint": "ck.pt"})
    assert {k: params[k] for k in ("clevr_root", "report_dir", "runs_dir", "released_checkpoint")} == {
        "clevr_root": str(tmp_path / "d"), "report_dir": str(tmp_path / "rep"),
        "runs_dir": str(tmp_path / "relruns"), "released_checkpoint": str(tmp_path / "ck.pt")}


@pytest.fixture
def fake_reproduce(monkeypatch):
    """reproduce() with its prepare stage and notebooks replaced by recorders of what they were handed."""
    from idckit.reproduce import prepare, runner, scheduler

    seen: list[dict] = []

    def record(nbs, **kw):
        seen.append({"env": {k: os.environ.get(k) for k in (*PATH_ENV, "HF_HOME", "TORCH_HOME")},
                     "params": [runner.parameters(nb.stem, profile=kw["profile"], roots=kw["roots"],
                                                  report_dir=kw["report_dir"], runs_dir=kw["runs_dir"],
                                                  released=kw["released"]) for nb in nbs],
                     "runs_dir": kw["runs_dir"], "report_dir": kw["report_dir"]})
        return [runner.Outcome(nb.stem, True, 0.0) for nb in nbs]

    monkeypatch.setattr(prepare, "prepare", lambda *a, **k: [])
    monkeypatch.setattr(scheduler, "run_all", lambda nbs, **kw: record(nbs, **kw))
    return seen


@pytest.mark.parametrize("jobs", [1, 2])
def test_reproduce_hands_its_notebooks_and_lanes_absolute_paths_only(tmp_path, monkeypatch, fake_reproduce, jobs):
    """IDCKIT_DATA_DIR=reldata HF_HOME=relhf idckit reproduce ... --report-dir rep --runs-dir relruns --clevr-root d
    --released-checkpoint ck.pt: the notebooks' kernels run in notebooks/ (and lane workers inherit the env); every
    path they see names what the caller meant."""
    from conftest import write_clevr_change

    from idckit.reproduce import reproduce

    monkeypatch.chdir(tmp_path)
    write_clevr_change(tmp_path / "d")
    (tmp_path / "ck.pt").write_bytes(b"x")
    monkeypatch.setenv("IDCKIT_DATA_DIR", "reldata")
    monkeypatch.setenv("HF_HOME", "relhf")
    monkeypatch.delenv("IDCKIT_RUNS_DIR", raising=False)
    reproduce(["table2_clevr_change", "table3_change_types"], profile="smoke", roots={"clevr_root": "d"},
              report_dir="rep", runs_dir="relruns", released={"released_checkpoint": "ck.pt"}, jobs=jobs)
    [seen] = fake_reproduce
    assert seen["env"]["IDCKIT_DATA_DIR"] == str(tmp_path / "reldata")
    assert seen["env"]["HF_HOME"] == str(tmp_path / "relhf")
    assert seen["env"]["IDCKIT_RUNS_DIR"] == str(paths.project_root() / "runs")   # pinned for the kernels
    assert seen["runs_dir"] == tmp_path / "relruns" and seen["report_dir"] == (tmp_path / "rep").resolve()
    for params in seen["params"]:
        for key in ("clevr_root", "report_dir", "runs_dir", "released_checkpoint"):
            p = Path(params[key])
            assert p.is_absolute() and paths.notebooks_dir() not in p.parents, (key, p)
        assert params["clevr_root"] == str(tmp_path / "d")
    # the caller's own environment is as it was
    assert os.environ["IDCKIT_DATA_DIR"] == "reldata" and os.environ["HF_HOME"] == "relhf"
    assert "IDCKIT_RUNS_DIR" not in os.environ


def test_reproduce_refuses_a_report_dir_and_runs_dir_that_overlap(tmp_path, monkeypatch, fake_reproduce):
    from idckit.reproduce import reproduce

    monkeypatch.chdir(tmp_path)
    for report_dir, runs_dir in (("out", "out"), ("out", "out/runs"), ("out/reports", "out")):
        with pytest.raises(ConfigError, match="--runs-dir") as e:
            reproduce(["00_walkthrough"], profile="smoke", report_dir=report_dir, runs_dir=runs_dir, jobs=1)
        assert e.value.fix
    assert fake_reproduce == [] and not (tmp_path / "out").exists()


def test_the_readme_is_rewritten_only_from_the_clones_own_reports(tmp_path, monkeypatch):
    """`IDCKIT_REPORTS_DIR=/big/disk idckit reproduce` writes its reports there: the README's table describes
    reports/ of the clone, and is not rewritten from elsewhere (nor from a test's temporary folder)."""
    from idckit.reproduce import updates_readme

    monkeypatch.setenv("IDCKIT_REPORTS_DIR", str(tmp_path / "reports"))
    assert not updates_readme(paths.DEFAULT_PROFILE, None)
    monkeypatch.setenv("IDCKIT_REPORTS_DIR", str(paths.project_root() / "reports"))
    assert updates_readme(paths.DEFAULT_PROFILE, None)
    assert not updates_readme("smoke", None)


def test_a_report_that_appeared_while_its_notebook_ran_is_kept(tmp_path, monkeypatch):
    """The claim checked the folder before the first notebook; a user's file of the report's name that appears
    meanwhile is not replaced by the finished notebook's report."""
    import papermill

    from idckit.reproduce import runner

    reports = tmp_path / "reports"
    reports.mkdir()
    nb = tmp_path / "nbs" / "probe.ipynb"
    nb.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), str(nb))

    def execute(inp, out, parameters, **kw):
        executed = nbformat.v4.new_notebook()
        executed.metadata["papermill"] = {"input_path": inp, "output_path": out}
        nbformat.write(executed, out)
        _write(parameters["report_dir"], "probe")
        (reports / "probe.json").write_text('{"mine": true}')      # the user's, written meanwhile

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    out = runner.run_one(nb, profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs")
    assert not out.ok and "probe.json" in out.error
    assert (reports / "probe.json").read_text() == '{"mine": true}' and not (reports / "probe.html").exists()


@pytest.mark.slow
def test_a_notebook_run_by_reproduce_from_another_cwd_writes_nothing_beside_the_notebooks(tmp_path, monkeypatch):
    """End to end through papermill: the kernel runs in the notebooks' folder, yet reports, runs and the data dir
    are the caller's relative paths."""
    from idckit.reproduce import reproduce

    nbs, work = tmp_path / "nbs", tmp_path / "work"
    nbs.mkdir()
    work.mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'cpu'\nreport_dir = None\nruns_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from idckit import paths\nfrom idckit.reports.report import write_report, Provenance\n"
        "seen = {'data_dir': str(paths.data_dir()), 'runs_dir': runs_dir, 'report_dir': report_dir}\n"
        "write_report(report_dir, 'probe', 'walkthrough', "
        "[{'model': 'm', 'variant': 'v', 'split': 'test', 'metrics': {}}], Provenance(profile=profile, "
        "data='synthetic: t', data_version='v', backbone='b', weights='w', seeds=[0]), extra={'seen': seen})")]
    nb.metadata["kernelspec"] = {"name": "idckit", "display_name": "Python (idckit)", "language": "python"}
    nbformat.write(nb, str(nbs / "probe.ipynb"))
    monkeypatch.chdir(work)
    monkeypatch.setenv("IDCKIT_DATA_DIR", "reldata")
    [out] = reproduce(profile="smoke", report_dir="rep", runs_dir="relruns", notebooks_dir=nbs, jobs=1)
    assert out.ok, out.error
    seen = json.loads((work / "rep" / "probe.json").read_text())["seen"]
    assert seen["data_dir"] == str(work / "reldata") and seen["runs_dir"] == str(work / "relruns")
    assert Path(seen["report_dir"]).parent.parent == (work / "rep").resolve()      # its stage in rep/
    assert sorted(p.name for p in nbs.iterdir()) == ["probe.ipynb"]


@pytest.mark.parametrize("value", [5, ["s"]])
def test_a_report_dir_that_is_not_a_path_is_a_clear_error(tmp_path, value):
    """papermill -p report_dir 5 injects an int: an idckit error naming the parameter, not a TypeError."""
    with pytest.raises(ConfigError, match="report_dir must be a folder path") as e:
        check_parameters(_namespace(value))
    assert e.value.fix


def test_reproduce_refuses_places_smuggled_through_extra_parameters(tmp_path, monkeypatch, fake_reproduce):
    """An extra parameter is passed as is, after the claimed, absolute ones: a report_dir there would replace the
    notebook's stage (past the write policy), a relative root would be read from notebooks/."""
    from idckit.reproduce import reproduce

    monkeypatch.chdir(tmp_path)
    for extra in ({"report_dir": "mine"}, {"clevr_root": "d"}, {"runs_dir": "r", "device": "cpu"}):
        with pytest.raises(ConfigError, match=next(iter(extra))) as e:
            reproduce(["00_walkthrough"], profile="smoke", report_dir="rep", runs_dir="runs", jobs=1,
                      extra_parameters=extra)
        assert e.value.fix
    assert fake_reproduce == [] and sorted(p.name for p in tmp_path.iterdir()) == []
