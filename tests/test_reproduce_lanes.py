"""``idckit reproduce --jobs N``: the lane schedule, the kernels' threads, the stage times in status.json and on the
index, the prepare stage's steps, and the feature-store lock that makes two processes extract a store once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from idckit.errors import ConfigError
from idckit.reports.report import claim_report_dir
from idckit.reproduce import prepare, reproduce, scheduler
from idckit.reproduce.scheduler import next_ready, training_by_kind

# a fake notebook: its report holds what its kernel saw (torch threads, the OpenMP setting) and when it ran
TIMED = '''
import json, os, time, pathlib, torch
t0 = time.time()
time.sleep(SLEEP)
from idckit.reports.report import write_report, Provenance
write_report(report_dir, NAME, "pcl.table2",
             [{"model": "m", "variant": "v", "split": "test", "metrics": {"CIDEr-D": 1.0}}],
             Provenance(profile=profile, data="synthetic: test", data_version="v", backbone="b", weights="w", seeds=[0]),
             headline={"label": "CIDEr-D", "kit": 1.0})
p = pathlib.Path(report_dir) / (NAME + ".json")
doc = json.loads(p.read_text())
doc["seen"] = {"threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "start": t0,
               "end": time.time(), "pid": os.getpid()}
p.write_text(json.dumps(doc))
'''


def _notebook(path: Path, sleep: float = 0.0) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'cpu'\nreport_dir = None\nruns_dir = None")
    params.metadata["tags"] = ["parameters"]
    code = TIMED.replace("NAME", repr(path.stem)).replace("SLEEP", repr(sleep))
    nb.cells = [params, nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "idckit", "display_name": "Python (idckit)", "language": "python"}
    nbformat.write(nb, str(path))


def _simulate(names, cost, jobs):
    return scheduler.simulate(names, cost, jobs)


def test_schedule_runs_long_chains_first_and_keeps_every_dependent_after_its_source():
    cost = {"clip4idc_table1_clevr_change": 5825, "clip4idc_table2_change_types": 9, "table2_clevr_change": 1050,
            "table3_change_types": 7, "table4_ablation": 12, "table1_birds_to_words": 662, "table5_cross_task": 3142,
            "clip4idc_table7_layer_split": 1482, "00_walkthrough": 49}
    names = sorted(cost)
    sched = _simulate(names, cost, jobs=2)
    assert set(sched) == set(names)                        # every notebook once, on one lane
    for n, after in scheduler.AFTER.items():
        for a in after:
            if n in sched and a in sched:
                assert sched[n][1] >= sched[a][2], (n, a)  # a dependent starts once its source finished
    for lane in (0, 1):                                    # a lane runs one notebook at a time
        spans = sorted((s, e) for ln, s, e in sched.values() if ln == lane)
        assert all(e <= s2 for (_, e), (s2, _) in zip(spans, spans[1:]))
    # the longest chain (CLIP4IDC table 1, then table 7) starts at once; birds (table 1 -> 5) on the other lane
    assert sched["clip4idc_table1_clevr_change"][1] == 0 and sched["table1_birds_to_words"][1] == 0
    makespan = max(e for _, _, e in sched.values())
    assert makespan < sum(cost.values()) * 0.7
    assert _simulate(names, cost, jobs=1)["clip4idc_table1_clevr_change"][1] == 0


def test_simulate_by_hand_and_a_plan_from_a_lanes_record(tmp_path, capsys):
    # a (3) waits for p (2); b (4) and c (1) are free: lane 0 p 0-2 then a 2-5, lane 1 b 0-4 then c 4-5
    sched = scheduler.simulate(["p", "a", "b", "c"], {"p": 2, "a": 3, "b": 4, "c": 1}, 2, {"a": ("p",)})
    assert sched == {"p": (0, 0, 2), "b": (1, 0, 4), "a": (0, 2, 5), "c": (1, 4, 5)}
    # two notebooks from a lanes record; schedule worked by hand: the birds' long chain starts first, CLEVR's scenes
    # beside it; each store after its scenes, each run after its store, each notebook after its runs and stores
    prep = {"scenes birds": 10, "features birds": 20, "scenes clevr-change": 50, "features clevr-change": 30,
            "scenes clevr-change hard": 5, "features clevr-change hard": 5}
    times = {"prepare": [{"step": k, "seconds": v} for k, v in prep.items()],
             "training_jobs": {"train birds/b2w seed 0": 100, "train birds/both seed 0": 100}}
    (tmp_path / "status.json").write_text(json.dumps({"_reproduce": times, "table1_birds_to_words": {"seconds": 5.0},
                                                       "table3_change_types": {"seconds": 7.0}}))
    names = ["table1_birds_to_words", "table3_change_types"]
    sched, missing = scheduler.plan(names, profile="cpu", report_dir=tmp_path, jobs=2)
    assert missing == [] and sched == {
        "prepare scenes birds": (0, 0, 10), "prepare scenes clevr-change": (1, 0, 50),
        "prepare features birds": (0, 10, 30), "train birds/b2w seed 0": (0, 30, 130),
        "train birds/both seed 0": (1, 50, 150), "prepare features clevr-change": (0, 130, 160),
        "prepare scenes clevr-change hard": (1, 150, 155), "prepare features clevr-change hard": (1, 155, 160),
        "table1_birds_to_words": (0, 160, 165), "table3_change_types": (1, 160, 167)}
    one, _ = scheduler.plan(names, profile="cpu", report_dir=tmp_path, jobs=1)     # one lane: all of it in a row
    assert max(e for _, _, e in one.values()) == sum(prep.values()) + 100 + 100 + 5 + 7
    from idckit import cli

    assert cli.main(["reproduce", *names, "--plan", "--report-dir", str(tmp_path)]) == 0
    assert "projected wall 3 min on 2 lane(s)" in capsys.readouterr().out


def test_next_ready_waits_for_a_running_source():
    prio = {"table2_clevr_change": 10.0, "table3_change_types": 99.0}
    sel = set(prio)
    assert next_ready(["table3_change_types"], set(), sel, prio) is None
    assert next_ready(["table3_change_types"], {"table2_clevr_change"}, sel, prio) == "table3_change_types"
    assert next_ready(["table3_change_types"], set(), {"table3_change_types"}, prio) == "table3_change_types"


def test_hard_twin_notebooks_are_those_running_hard_runs():
    nbs = Path(__file__).resolve().parents[1] / "notebooks"
    assert {p.stem for p in nbs.glob("*.py") if "hard_runs(" in p.read_text()} == set(prepare.HARD_TWIN)


def test_prepare_steps_build_each_store_once_data_first(tmp_path):
    steps = prepare.prepare_steps(["table2_clevr_change", "table3_change_types", "clip4idc_table5_ablation",
                              "table5_cross_task", "unknown_fake"], profile="cpu", roots=None, runs_dir=tmp_path)
    labels = list(steps)
    assert labels[:4] == ["scenes clevr-change", "scenes clevr-change hard", "scenes spot-the-diff", "scenes birds"]
    assert labels[4:] == ["features clevr-change", "features clevr-change hard", "clip4idc data clevr-change",
                          "features birds"]
    assert prepare.prepare_steps(["00_walkthrough"], profile="cpu", roots=None, runs_dir=tmp_path).keys() == \
        {"scenes clevr-change"}


def test_prepare_jobs_wait_for_their_scenes_and_hold_back_only_what_reads_them(tmp_path):
    names = ["table2_clevr_change", "table5_cross_task", "clip4idc_table3_spot_the_diff"]
    units, _, _ = scheduler.training_jobs(names, {}, {})
    steps, after = scheduler.prepare_jobs(names, profile="cpu", roots=None, runs_dir=tmp_path, units=units)
    assert steps[0] == "prepare scenes clevr-change" and "prepare features birds" in steps
    assert after["prepare features clevr-change hard"] == ("prepare scenes clevr-change hard",)
    assert after["prepare features birds"] == ("prepare scenes birds",)
    assert set(after["table5_cross_task"]) == {"prepare scenes birds", "prepare features birds"}   # not CLEVR's
    assert set(after["train birds/b2w seed 1"]) == {"prepare scenes birds", "prepare features birds"}
    assert set(after["train pcl/full seed 0"]) == {"prepare scenes clevr-change", "prepare features clevr-change"}
    assert "prepare features clevr-change hard" in after["table2_clevr_change"]     # its hard twin rows
    assert after["clip4idc_table3_spot_the_diff"] == ("prepare scenes spot-the-diff",)


def test_the_last_recorded_stage_times_feed_the_next_estimate(tmp_path):
    times = {"prepare": [{"step": "scenes birds", "ok": True, "seconds": 8.0}, {"step": "junk"}, "junk"],
             "training_jobs": {"train birds/b2w seed 0": 700.0, "odd": "x"}}
    (tmp_path / "status.json").write_text(json.dumps({"_reproduce": times}))
    assert scheduler._known_prepare(tmp_path) == [{"step": "scenes birds", "ok": True, "seconds": 8.0}]
    assert scheduler._known_units(tmp_path) == {"train birds/b2w seed 0": 700.0}


@pytest.mark.slow
def test_two_lanes_prepare_as_jobs_and_start_a_notebook_only_after_its_data(tmp_path, monkeypatch):
    from idckit import registry as manifest

    nbs, reports, runs = tmp_path / "nbs", tmp_path / "reports", tmp_path / "runs"
    nbs.mkdir()
    for name in ("first", "table1_birds_to_words"):          # the second is the manifest's: birds scenes + features
        _notebook(nbs / f"{name}.ipynb")
    monkeypatch.setitem(manifest.TRAINS, "table1_birds_to_words", ())
    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path / "data"))     # inherited by the spawned lanes
    out = reproduce(profile="smoke", report_dir=reports, runs_dir=runs, notebooks_dir=nbs, jobs=2)
    assert all(o.ok for o in out)
    times = json.loads((reports / "status.json").read_text())["_reproduce"]
    assert [(r["step"], r["ok"]) for r in times["prepare"]] == [("scenes birds", True), ("features birds", True)]
    made = max(p.stat().st_mtime for p in (tmp_path / "data").rglob("*") if p.is_file())
    made = max([made] + [p.stat().st_mtime for p in runs.rglob("*") if p.is_file()])
    seen = json.loads((reports / "table1_birds_to_words.json").read_text())["seen"]
    assert seen["start"] >= made                     # the notebook after its data and its features
    first = json.loads((reports / "first.json").read_text())["seen"]
    assert first["start"] < made         # a notebook needing none of it ran beside the prepare steps


def test_training_by_kind_counts_the_runs_finished_during_the_reproduce(tmp_path):
    def run(name, metrics, age=0.0):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps(metrics))
        if age:
            t = time.time() - age
            os.utime(d / "metrics.json", (t, t))

    run("pcl-finetune-aaa", {"finetune_seconds": 10.0, "wall_seconds": 99.0})
    run("pcl-finetune-bbb", {"finetune_seconds": 5.5})
    run("clip-standin-ccc", {"train_seconds": 30.0, "wall_seconds": 31.0})
    run("pcl-pretrain-ddd", {"wall_seconds": 7.0})
    run("duda-eee", {"finetune_seconds": 100.0}, age=3600)          # cached before: not this reproduce's
    (tmp_path / "features").mkdir()
    assert training_by_kind(tmp_path, since=time.time() - 60) == {
        "pcl-finetune": {"runs": 2, "seconds": 15.5}, "clip-standin": {"runs": 1, "seconds": 30.0},
        "pcl-pretrain": {"runs": 1, "seconds": 7.0}}


def test_a_status_with_stage_times_is_the_kits(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"a": {"status": "ok"}, "_reproduce": {"jobs": 2}}))
    assert claim_report_dir(tmp_path, []) == tmp_path.resolve()
    (tmp_path / "status.json").write_text(json.dumps({"_visits": 3}))
    with pytest.raises(Exception, match="idckit report folder|status"):
        claim_report_dir(tmp_path, [])


def test_jobs_must_be_a_count():
    with pytest.raises(ConfigError, match="--jobs"):
        scheduler.check_jobs(0)
    assert scheduler.default_jobs("cpu") == 2 and scheduler.default_jobs("smoke") == 1


@pytest.mark.slow
def test_two_lanes_run_disjoint_notebooks_on_shared_cores_and_record_the_times(tmp_path, monkeypatch):
    nbs, reports = tmp_path / "nbs", tmp_path / "reports"
    nbs.mkdir()
    for name, sleep in (("first", 4.0), ("second", 0.0), ("third", 0.0)):
        _notebook(nbs / f"{name}.ipynb", sleep)
    monkeypatch.setitem(scheduler.AFTER, "third", ("second",))
    out = reproduce(profile="cpu", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs, jobs=2)
    assert [o.notebook for o in out] == ["first", "second", "third"] and all(o.ok for o in out)
    seen = {n: json.loads((reports / f"{n}.json").read_text())["seen"] for n in ("first", "second", "third")}
    want = max(1, scheduler.cores() // 2)
    assert all(s["threads"] == want and s["omp"] == str(want) for s in seen.values())
    assert seen["second"]["start"] < seen["first"]["end"]           # two notebooks at once
    assert seen["third"]["start"] >= seen["second"]["end"]          # the dependent after its source
    status = json.loads((reports / "status.json").read_text())
    times = status["_reproduce"]
    assert times["jobs"] == 2 and times["threads"] == want and set(times["notebooks"]) == {"first", "second", "third"}
    assert times["total_seconds"] < sum(times["notebooks"].values())  # the lanes overlapped
    assert times["prepare"] == [] and times["training"] == {}
    assert all(status[n]["status"] == "ok" for n in ("first", "second", "third"))
    page = (reports / "index.html").read_text()
    assert "<h2>Time</h2>" in page and "2 notebook(s) at once" in page and "first" in page
    assert not list(reports.glob(".idckit-staging-*"))


def test_a_lane_worker_loads_torch_only_after_setting_its_threads():
    """A spawned lane worker imports the package (its initializer's and its jobs' modules) before ``_lane_env`` sets
    OMP_NUM_THREADS, and torch fixes its thread count when it is imported: the package itself must not import torch,
    or a training job in a worker would run on the machine's threads instead of the lane's."""
    code = ("import sys, idckit.reproduce.scheduler; "
            "print(sorted({'torch', 'idckit.reproduce.prepare'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['idckit.reproduce.prepare']"        # the prepare steps' module loaded, torch not


@pytest.mark.slow
def test_one_lane_keeps_the_parents_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    nbs, reports = tmp_path / "nbs", tmp_path / "reports"
    nbs.mkdir()
    _notebook(nbs / "only.ipynb")
    out = reproduce(profile="cpu", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs, jobs=1)
    assert out[0].ok
    seen = json.loads((reports / "only.json").read_text())["seen"]
    assert seen["omp"] is None and json.loads((reports / "status.json").read_text())["_reproduce"]["jobs"] == 1


CHILD = '''
import sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import idckit.data.features as F
log, root, out = sys.argv[1:4]
real = F.preprocess
def counted(paths, *a, **k):
    with open(log, "a") as f:
        f.write(f"{len(paths)}\\n")
    time.sleep(2.0)
    return real(paths, *a, **k)
F.preprocess = counted
names = [f"img/{i}.png" for i in range(5)]
store = F.extract_features(Path(root), images=names, batch_size=1, out_dir=Path(out), progress=False)
assert store.meta["complete"]
'''


@pytest.mark.slow
def test_two_processes_asking_for_one_store_extract_it_once(tmp_path):
    from PIL import Image
    import numpy as np

    rng = np.random.default_rng(0)
    (tmp_path / "img").mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(tmp_path / f"img/{i}.png")
    log, out = tmp_path / "preprocessed.log", tmp_path / "runs" / "features" / "x" / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CHILD, str(log), str(tmp_path), str(out)]
    first = subprocess.Popen(cmd, env=env)
    deadline = time.time() + 120
    while not (log.is_file() and log.read_text().count("\n") >= 2) and time.time() < deadline:
        time.sleep(0.1)                         # the first one is extracting (probe + a batch), holding the lock
    second = subprocess.Popen(cmd, env=env)
    assert first.wait(timeout=300) == 0 and second.wait(timeout=300) == 0
    counts = [int(x) for x in log.read_text().split()]
    # the first: a probe image and the five; the second waits, then only probes and reads the complete store
    assert sum(counts) == 5 + 2, counts


def test_training_jobs_split_a_notebook_of_many_runs_and_keep_shared_stages_in_order():
    from idckit.registry import STARTS_FROM, TRAINS
    from idckit.reproduce.scheduler import training_units

    names = ["table1_birds_to_words", "table5_cross_task", "table2_clevr_change", "table4_ablation",
             "table3_change_types"]
    cost = {"table1_birds_to_words": 600.0, "table5_cross_task": 3000.0, "table2_clevr_change": 1000.0,
            "table4_ablation": 12.0, "table3_change_types": 7.0}
    units, after, est = scheduler.training_jobs(names, cost)
    # table 5: every birds variant at each of its three seeds, one job each; table 1's two are the same jobs
    assert len([u for u in units.values() if u[0] == "birds"]) == 4 * 3
    assert set(training_units("table1_birds_to_words")) <= set(units.values())
    assert len(units) == len(set(units.values()))                 # no run trained by two jobs
    for n in names:                                                # a notebook waits for every run it reads
        assert {scheduler.unit_name(u) for u in training_units(n)} <= set(after[n])
    assert "table2_clevr_change" in after["table4_ablation"]      # and for the notebooks of AFTER, as before
    for (fam, variant), base in STARTS_FROM.items():               # a shared first stage is never trained twice
        for seed in (0, 1, 2):
            job = scheduler.unit_name((fam, variant, seed))
            if job in units:
                assert after[job] == (scheduler.unit_name((fam, base, seed)),)
    assert set(TRAINS) >= {"table5_cross_task", "table4_ablation"} and "table3_change_types" not in TRAINS
    # estimates: the notebook's split over its units; table 4's cached 12 s does not make its runs look free
    assert est[scheduler.unit_name(("birds", "b2w", 1))] == pytest.approx(max(600.0 / 2, 3000.0 / 12))
    assert est[scheduler.unit_name(("pcl", "mlm", 0))] == pytest.approx(1000.0 / 2)
    known = {scheduler.unit_name(("pcl", "mlm", 0)): 77.0}
    assert scheduler.training_jobs(names, cost, known)[2][scheduler.unit_name(("pcl", "mlm", 0))] == 77.0


def test_clip4idc_table1_waits_for_the_idc_pcl_run_it_shares_with_table2():
    units, after, _ = scheduler.training_jobs(["clip4idc_table1_clevr_change", "table2_clevr_change"], {})
    assert [j for j in after["clip4idc_table1_clevr_change"] if j.startswith("train ")] == ["train pcl/full seed 0"]
    assert list(units).count("train pcl/full seed 0") == 1          # one job for both notebooks


def test_a_training_job_trains_the_run_its_notebook_then_reads_from_the_cache(tmp_path):
    import torch

    from idckit.experiments import birds

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = scheduler.train_unit(("birds", "b2w", 0), profile="smoke", roots=None, runs_dir=tmp_path)
        assert out.ok and out.notebook == "train birds/b2w seed 0", out.error
        trained = {p.parent.name: p.stat().st_mtime for p in tmp_path.glob("pcl-birds-*/metrics.json")}
        assert trained                                             # the chain's runs, complete
        setup = birds.setup("smoke", runs_dir=tmp_path, progress=False)
        res = birds.runs(setup, ["b2w"], [0], progress=False)      # what table 1 calls: read, not retrained
        assert res and {p.parent.name: p.stat().st_mtime for p in tmp_path.glob("pcl-birds-*/metrics.json")} \
            == trained
    finally:
        torch.set_num_threads(before)
    bad = scheduler.train_unit(("birds", "no-such-variant", 0), profile="smoke", roots=None, runs_dir=tmp_path)
    assert not bad.ok and "no-such-variant" in bad.error


@pytest.mark.slow
def test_two_lanes_train_a_notebooks_runs_first_as_jobs_of_their_own(tmp_path, monkeypatch):
    from idckit import registry as manifest

    nbs, reports, runs = tmp_path / "nbs", tmp_path / "reports", tmp_path / "runs"
    nbs.mkdir()
    for name in ("first", "reader"):
        _notebook(nbs / f"{name}.ipynb")
    monkeypatch.setitem(manifest.TRAINS, "reader", (("birds", ("b2w",), (0,)),))
    out = reproduce(profile="smoke", report_dir=reports, runs_dir=runs, notebooks_dir=nbs, jobs=2)
    assert [o.notebook for o in out] == ["first", "reader"] and all(o.ok for o in out)
    times = json.loads((reports / "status.json").read_text())["_reproduce"]
    assert set(times["training_jobs"]) == {"train birds/b2w seed 0"}      # timed, for the next estimate
    assert "train birds/b2w seed 0" not in json.loads((reports / "status.json").read_text())   # not a report
    finished = max(p.stat().st_mtime for p in runs.glob("pcl-birds-*/metrics.json"))
    seen = json.loads((reports / "reader.json").read_text())["seen"]
    assert seen["start"] >= finished                                      # the reader after its runs
