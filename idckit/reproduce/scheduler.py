"""The job scheduler of ``idckit reproduce`` and its simulator: which notebooks, prepare steps and training runs run
when, on how many lanes, and what the last reproduce's recorded times say a schedule will take.

With ``jobs`` > 1 the notebooks run in that many worker processes, each kernel on ``cores // jobs`` torch threads,
longest chain first, a notebook that reads another's runs (:data:`AFTER`) only once that one finished; the runs a
notebook would train in a row (:data:`idckit.registry.TRAINS`) are trained first as lane jobs of their own, one
(family, variant, seed) each, which the notebook then reads from the run cache; and each prepare step
(:mod:`idckit.reproduce.prepare`) is a lane job too, which only the notebooks and runs reading its data wait for (the
birds train while CLEVR renders). With one lane the notebooks run one after another. Each notebook's outcome is
recorded in ``status.json`` as it finishes. ``status.json`` keeps, under :data:`idckit.reports.report.TIMES_KEY`,
where the last reproduce spent its time (prepare steps, notebooks, training per run kind); :func:`simulate` plays a
schedule over those times and :func:`plan` the one ``reproduce`` would run (``idckit reproduce --plan``).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments import recipes
from idckit.experiments.base import train
from idckit.experiments.config import check_profile
from idckit.registry import DATASETS, NOTEBOOKS, STARTS_FROM, TRAINS, family, notebook
from idckit.reports.report import TIMES_KEY, read_status
from idckit.reproduce import prepare, runner
from idckit.reproduce.runner import Outcome
from idckit.settings import load_config

#: notebook -> the notebooks whose runs it reads or shares (the stand-in CLIP, adaptation, captioners, IDC-PCL's and
#: the birds chain's runs): with several lanes it starts only after they finished, instead of holding a lane while
#: it waits on their run locks
AFTER: dict[str, tuple[str, ...]] = {
    "clip4idc_table2_change_types": ("clip4idc_table1_clevr_change",),
    "clip4idc_table5_ablation": ("clip4idc_table1_clevr_change", "clip4idc_table3_spot_the_diff"),
    "clip4idc_table6_retrieval": ("clip4idc_table1_clevr_change", "clip4idc_table3_spot_the_diff",
                                  "clip4idc_table4_editing_request"),
    "clip4idc_table7_layer_split": ("clip4idc_table1_clevr_change",),
    "table3_change_types": ("table2_clevr_change",),
    "table4_ablation": ("table2_clevr_change",),
    "table5_cross_task": ("table1_birds_to_words",),
}


PREPARE = "prepare "


#: the metrics.json entries holding a run's own training seconds, first found wins (pre-training runs record their
#: training as wall_seconds)
TRAIN_SECONDS = ("train_seconds", "finetune_seconds", "caption_seconds", "wall_seconds")


def check_jobs(jobs: object) -> int:
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}",
                          fix="pass --jobs 1 (one notebook at a time) or the machine's core count at most")
    return jobs


def default_jobs(profile: str) -> int:
    """``reproduce_jobs`` of ``configs/runtime.json`` at ``profile``."""
    return check_jobs(load_config("runtime", profile)["reproduce_jobs"])


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # pragma: no cover - macOS
        return os.cpu_count() or 1


# -- running the jobs -----------------------------------------------------------------------------------------
def uses_lanes(jobs: int, notebooks: Sequence) -> bool:
    return jobs > 1 and len(notebooks) > 1


def run_all(notebooks: Sequence[Path], *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
            extra_parameters: dict | None, released: dict | None = None, jobs: int = 1,
            unit_times: dict[str, float] | None = None, prepare_records: list[dict] | None = None) -> list[Outcome]:
    """The notebooks one after another, or in lanes (:func:`_run_lanes`, which then also runs the prepare steps and
    appends their records to ``prepare_records``)."""
    if uses_lanes(jobs, notebooks):
        return _run_lanes(notebooks, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                          extra_parameters=extra_parameters, released=released, jobs=jobs, unit_times=unit_times,
                          prepare_records=prepare_records)
    status_path = report_dir / "status.json"
    outcomes = []
    for nb in notebooks:
        print(f"[idckit reproduce] {nb.stem} (profile={profile}) ...", flush=True)
        out = runner.run_one(nb, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                             extra_parameters=extra_parameters, released=released)
        outcomes.append(out)
        _finished(out, status_path, report_dir, profile, f"[idckit reproduce] {nb.stem}: ")
    return outcomes


def _run_lanes(notebooks: Sequence[Path], *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
               extra_parameters: dict | None, released: dict | None, jobs: int,
               unit_times: dict[str, float] | None = None, prepare_records: list[dict] | None = None
               ) -> list[Outcome]:
    """The notebooks in ``jobs`` worker processes (see the module's docstring), the prepare steps and the runs they
    train first (:func:`prepare_jobs`, :func:`training_jobs`), each training job's seconds into ``unit_times``, each
    prepare step's record into ``prepare_records``; the notebooks' outcomes in the given order."""
    status_path = report_dir / "status.json"
    by_name = {nb.stem: nb for nb in notebooks}
    pending, units, after, est = lane_jobs(list(by_name), profile=profile, roots=roots, runs_dir=runs_dir,
                                           report_dir=report_dir)
    steps = [n for n in pending if n.startswith(PREPARE)]
    selected = set(pending)
    prio = priorities(pending, est, after)
    threads = max(1, cores() // jobs)
    finished: set[str] = set()
    done: dict[str, Outcome] = {}
    kw = dict(profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
              extra_parameters=extra_parameters, released=released)
    unit_kw = dict(profile=profile, roots=roots, runs_dir=runs_dir, device=(extra_parameters or {}).get("device"))
    records: dict[str, dict] = {}
    # spawn: a worker starts clean, never a fork of a parent holding torch's thread pools
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_lane_env, initargs=(threads,)) as pool:
        running: dict = {}
        while pending or running:
            for name in _start_ready(pending, finished, selected, prio, after, jobs - len(running)):
                print(f"[{name}] started (profile={profile}, {threads} thread(s))", flush=True)
                if name in steps:
                    fut = pool.submit(prepare.prepare_one, name[len(PREPARE):], list(by_name), **unit_kw)
                else:
                    fut = pool.submit(train_unit, units[name], **unit_kw) if name in units else \
                        pool.submit(runner.run_one, by_name[name], **kw)
                running[fut] = name
            complete, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in complete:
                name = running.pop(fut)
                if name in steps:       # printed by the step; a failure is met again by the notebooks needing it
                    try:
                        records[name] = fut.result()
                    except Exception as e:  # noqa: BLE001 - a dead worker
                        records[name] = {"step": name[len(PREPARE):], "ok": False, "seconds": 0.0,
                                         "error": f"{type(e).__name__}: {e}"[:300]}
                    finished.add(name)
                    continue
                try:
                    out = fut.result()
                except Exception as e:  # noqa: BLE001 - a dead worker fails its notebook, not the others
                    out = Outcome(name, False, 0.0, f"{type(e).__name__}: {e}")
                done[name] = out
                finished.add(name)
                if name in units:       # a training job: said, and timed in status.json's record, not a report
                    print(f"[{name}] " + (f"ok in {out.seconds:.0f} s" if out.ok else
                                          f"FAILED after {out.seconds:.0f} s: {out.error.splitlines()[0][:300]}"),
                          flush=True)
                else:
                    _finished(out, status_path, report_dir, profile)
    if unit_times is not None:
        unit_times.update({n: round(done[n].seconds, 1) for n in units if done[n].ok})
    if prepare_records is not None:
        prepare_records.extend(records[n] for n in steps)
    return [done[nb.stem] for nb in notebooks]


def _lane_env(threads: int) -> None:
    """A worker's environment, inherited by the kernels it starts: ``threads`` torch/OpenMP threads each."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):     # torch takes its thread count from them
        os.environ[var] = str(threads)


def train_unit(unit: tuple[str, str, int], *, profile: str, roots: dict | None, runs_dir: Path,
               device: str | None = None) -> Outcome:
    """One (family, variant, seed) trained into the run cache, as ``idckit train`` does; a failure is returned (the
    notebook that reads the run then trains it itself, or fails on the same error and is marked)."""
    fam, variant, seed = unit
    t0 = time.time()
    try:
        root = (roots or {}).get(DATASETS[family(fam).dataset].param)
        train(fam, profile, root, variants=[variant], seeds=[seed], runs_dir=runs_dir, device=device,
              progress=False)
        return Outcome(unit_name(unit), True, time.time() - t0)
    except Exception as e:  # noqa: BLE001 - reported; the notebook meets it again
        return Outcome(unit_name(unit), False, time.time() - t0, f"{type(e).__name__}: {e}"[-2000:])


def _finished(out: Outcome, status_path: Path, report_dir: Path, profile: str, prefix: str = "") -> None:
    """Record ``out`` in status.json and say so; ``prefix`` (default ``[NAME] ``) starts every line printed."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    # read again under a lock: another `idckit reproduce` on the same reports may record its notebooks meanwhile
    with fileio.wait_lock(report_dir / f"{fileio.LOCK}status"):
        _record(status_path, out, profile, when)
    if prefix:          # one lane: as it always printed
        print(prefix + (f"ok in {out.seconds:.0f} s" if out.ok else f"FAILED after {out.seconds:.0f} s\n{out.error}"),
              flush=True)
        return
    tag = f"[{out.notebook}] "
    print(tag + (f"ok in {out.seconds:.0f} s" if out.ok else f"FAILED after {out.seconds:.0f} s\n" + "\n".join(
        tag + line for line in out.error.splitlines())), flush=True)


def _record(status_path: Path, out: Outcome, profile: str, when: str) -> None:
    status = read_status(status_path)
    if out.ok:
        status[out.notebook] = {"status": "ok", "when": when, "profile": profile, "seconds": round(out.seconds, 1)}
    else:
        prev = status.get(out.notebook, {})
        status[out.notebook] = {**prev, "status": "stale" if prev.get("status") else "failed",
                                "failed_when": when, "error": out.error.splitlines()[0][:300]}
    fileio.write_json(status_path, status, indent=1, sort_keys=True)


# -- the job graph --------------------------------------------------------------------------------------------
def lane_jobs(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path, report_dir: Path
              ) -> tuple[list[str], dict[str, tuple], dict[str, tuple[str, ...]], dict[str, float]]:
    """Every lane job of notebooks ``names`` in start order (prepare steps, training jobs, notebooks), the training
    jobs' units, what each job waits for, and each job's estimated seconds from the last recorded times."""
    cost = estimates(names, report_dir)
    units, after, unit_cost = training_jobs(names, cost, _known_units(report_dir))
    steps, step_after = prepare_jobs(names, profile=profile, roots=roots, runs_dir=runs_dir, units=units)
    after = {k: tuple(after.get(k, ())) + tuple(step_after.get(k, ())) for k in {*after, *step_after}}
    step_cost = {PREPARE + r["step"]: float(r["seconds"]) for r in _known_prepare(report_dir)}
    return steps + list(units) + list(names), units, after, {**cost, **unit_cost, **step_cost}


def training_units(name: str) -> list[tuple[str, str, int]]:
    """Notebook ``name``'s (family, variant, seed) units of :data:`idckit.registry.TRAINS` ([] when it lists
    none)."""
    units = []
    for fam, variants, seeds in TRAINS.get(name, ()):
        recipe_family = family(fam).recipe_family
        for v in (variants or tuple(recipes.variants(recipe_family))):
            for seed in (seeds or notebook(name).seeds):
                if (fam, v, seed) not in units:
                    units.append((fam, v, seed))
    return units


def unit_name(unit: tuple[str, str, int]) -> str:
    fam, variant, seed = unit
    return f"train {fam}/{variant} seed {seed}"


def training_jobs(names: Sequence[str], cost: dict[str, float],
                  known: dict[str, float] | None = None) -> tuple[dict[str, tuple], dict[str, tuple[str, ...]],
                                                                  dict[str, float]]:
    """The lane jobs that train the runs of notebooks ``names`` first (:data:`idckit.registry.TRAINS`):
    ``({job: unit}, {job or notebook: the jobs and notebooks it waits for}, {job: estimated seconds})``. A unit waits
    for the one it starts from (:data:`idckit.registry.STARTS_FROM`); a notebook for its units and :data:`AFTER`.
    A unit's estimate is its last recorded time (``known``), else the largest of its family's notebook estimates
    split over their units."""
    jobs: dict[str, tuple] = {}
    after: dict[str, tuple[str, ...]] = {n: tuple(AFTER.get(n, ())) for n in names}
    est: dict[str, float] = {}
    for n in names:
        units = training_units(n)
        # a notebook's time is its runs' when they are of its own family; CLIP4IDC table 1's IDC-PCL row is not
        share = cost.get(n, 0.0) / len(units) if any(u[0] == _main_family(n) for u in units) else 0.0
        for u in units:
            job = unit_name(u)
            if job not in jobs or est[job] == 0.0:
                jobs[job] = u
                est[job] = (known or {}).get(job, share)
        after[n] += tuple(unit_name(u) for u in units)
    for job, (fam, variant, seed) in jobs.items():
        # a notebook whose runs were cached says little of one run's cost: the family's largest estimate
        est[job] = max(est[u] for u in jobs if jobs[u][0] == fam) if (known or {}).get(job) is None else est[job]
        base = STARTS_FROM.get((fam, variant))
        after[job] = (unit_name((fam, base, seed)),) if base and unit_name((fam, base, seed)) in jobs else ()
    return jobs, after, est


def _main_family(name: str) -> str | None:
    nb = NOTEBOOKS.get(name)
    return nb.families[0] if nb and nb.families else None


def prepare_jobs(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                 units: dict[str, tuple] | None = None) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """The prepare steps of notebooks ``names`` as lane jobs (``prepare LABEL``) and what waits for what: a store
    for the scenes it is computed from, a notebook for the steps of its own datasets, a training job (``units``, as
    :func:`training_jobs` names them) for those of its family's dataset (never the hard twin's)."""
    labels = list(prepare.prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir))
    after: dict[str, tuple[str, ...]] = {}
    scenes = [lb for lb in labels if lb.startswith("scenes ")]
    for lb in labels:
        if not lb.startswith("scenes "):
            after[PREPARE + lb] = tuple(PREPARE + sc for sc in scenes if lb.endswith(" " + sc[len("scenes "):]))
    for n in names:
        own = prepare.prepare_steps([n], profile=profile, roots=roots, runs_dir=runs_dir)
        after[n] = tuple(PREPARE + lb for lb in own)
    for job, (fam, _, _) in (units or {}).items():
        ds = family(fam).dataset
        after[job] = tuple(PREPARE + lb for lb in labels if lb.endswith(" " + ds))
    return [PREPARE + lb for lb in labels], after


# -- the times ------------------------------------------------------------------------------------------------
def estimates(names: Sequence[str], report_dir: Path) -> dict[str, float]:
    """Each notebook's last recorded seconds (this report folder's status.json, else the committed reports'),
    0 where none is known."""
    known: dict[str, float] = {}
    for path in (paths.reports_dir(paths.DEFAULT_PROFILE) / "status.json", report_dir / "status.json"):
        try:
            doc = read_status(path)
        except ConfigError:
            continue
        known.update({k: float(v["seconds"]) for k, v in doc.items()
                      if isinstance(v, dict) and isinstance(v.get("seconds"), (int, float))})
    return {n: known.get(n, 0.0) for n in names}


def _last_times(report_dir: Path, key: str, kind: type):
    """Entry ``key`` (of type ``kind``) of the times the last ``idckit reproduce`` recorded into this folder, else
    into the committed reports; None when neither has it."""
    for path in (report_dir / "status.json", paths.reports_dir(paths.DEFAULT_PROFILE) / "status.json"):
        try:
            rec = read_status(path).get(TIMES_KEY)
        except ConfigError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get(key), kind):
            return rec[key]
    return None


def _known_units(report_dir: Path) -> dict[str, float]:
    """The training jobs' last recorded seconds, for the estimates; {} when none."""
    jobs = _last_times(report_dir, "training_jobs", dict) or {}
    return {k: float(v) for k, v in jobs.items() if isinstance(v, (int, float))}


def _known_prepare(report_dir: Path) -> list[dict]:
    """The prepare steps' last records (``{"step", "seconds", ...}``), for the estimates; [] when none."""
    return [r for r in _last_times(report_dir, "prepare", list) or []
            if isinstance(r, dict) and isinstance(r.get("seconds"), (int, float)) and isinstance(r.get("step"), str)]


def training_by_kind(runs_dir: Path, since: float) -> dict[str, dict]:
    """``{run kind: {"runs", "seconds"}}``: the runs of ``runs_dir`` finished since ``since`` (their metrics.json
    written then) and their own training seconds (:data:`TRAIN_SECONDS`)."""
    out: dict[str, dict] = {}
    for d in sorted(Path(runs_dir).glob("*-*")):
        m = d / "metrics.json"
        try:
            if m.stat().st_mtime < since:
                continue
            metrics = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        sec = next((metrics[k] for k in TRAIN_SECONDS if isinstance(metrics.get(k), (int, float))), 0.0)
        agg = out.setdefault(d.name.rsplit("-", 1)[0], {"runs": 0, "seconds": 0.0})
        agg["runs"] += 1
        agg["seconds"] = round(agg["seconds"] + float(sec), 1)
    return out


# -- the schedule ---------------------------------------------------------------------------------------------
def priorities(names: Sequence[str], cost: dict[str, float],
               after: dict[str, tuple[str, ...]] | None = None) -> dict[str, float]:
    """A notebook's cost plus the longest chain of notebooks waiting on it (``after``, default :data:`AFTER`): list
    scheduling by it starts the long chains first."""
    after = AFTER if after is None else after
    selected = set(names)
    waiting = {n: [m for m in names if n in after.get(m, ())] for n in names}
    memo: dict[str, float] = {}

    def level(n: str) -> float:
        if n not in memo:
            memo[n] = cost.get(n, 0.0) + max((level(m) for m in waiting[n] if m in selected), default=0.0)
        return memo[n]

    return {n: level(n) for n in names}


def next_ready(pending: Sequence[str], finished: set[str], selected: set[str], prio: dict[str, float],
               after: dict[str, tuple[str, ...]] | None = None) -> str | None:
    """The pending notebook to start now: of those whose ``after`` notebooks (default :data:`AFTER`; among
    ``selected``) finished, the highest priority (ties: the given order); None when none may start yet."""
    after = AFTER if after is None else after
    ready = [n for n in pending if all(a in finished or a not in selected for a in after.get(n, ()))]
    return max(ready, key=lambda n: (prio[n], -pending.index(n))) if ready else None


def _start_ready(pending: list[str], finished: set[str], selected: set[str], prio: dict[str, float],
                 after: dict[str, tuple[str, ...]] | None, free: int) -> list[str]:
    """Up to ``free`` jobs to start now, best first (:func:`next_ready`), taken out of ``pending``."""
    out = []
    while pending and len(out) < free:
        name = next_ready(pending, finished, selected, prio, after)
        if name is None:
            break
        pending.remove(name)
        out.append(name)
    return out


def simulate(pending: Sequence[str], cost: dict[str, float], jobs: int,
             after: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[int, float, float]]:
    """The lanes' schedule played in simulated time, as :func:`_run_lanes` runs it (longest chain first, a job once
    what it waits for finished): ``{job: (lane, start, end)}`` in ``cost``'s unit; a job without a cost takes 0."""
    prio = priorities(pending, cost, after)
    pending, selected = list(pending), set(pending)
    finished: set[str] = set()
    lanes: dict[str, tuple[int, float, float]] = {}
    out: dict[str, tuple[int, float, float]] = {}
    now = 0.0
    while pending or lanes:
        for name in _start_ready(pending, finished, selected, prio, after, jobs - len(lanes)):
            lane = min(set(range(jobs)) - {v[0] for v in lanes.values()})
            lanes[name] = (lane, now, now + cost.get(name, 0.0))
        name = min(lanes, key=lambda k: lanes[k][2])
        out[name] = lanes.pop(name)
        now = out[name][2]
        finished.add(name)
    return out


def plan(names: Sequence[str] = (), *, profile: str = paths.DEFAULT_PROFILE, roots: dict | None = None,
         report_dir: str | Path | None = None, jobs: int | None = None,
         notebooks_dir: Path | None = None) -> tuple[dict[str, tuple[int, float, float]], list[str]]:
    """What ``reproduce`` would run, on which lane and when, in seconds estimated from the last recorded times (this
    report folder's status.json, else the committed reports'), without running anything: ``(schedule, jobs with no
    recorded time)``. With one lane the prepare stage comes first and the notebooks follow in order."""
    check_profile(profile)
    jobs = default_jobs(profile) if jobs is None else check_jobs(jobs)
    stems = [nb.stem for nb in runner.discover(names, notebooks_dir)]
    report_dir = Path(report_dir or paths.reports_dir(profile))
    cost = estimates(stems, report_dir)
    known = {PREPARE + r["step"]: float(r["seconds"]) for r in _known_prepare(report_dir)}
    known_units = _known_units(report_dir)
    runs_dir = paths.runs_dir()
    if uses_lanes(jobs, stems):
        order, _, after, est = lane_jobs(stems, profile=profile, roots=roots, runs_dir=runs_dir,
                                         report_dir=report_dir)
        # a notebook timed before its runs were jobs of their own held their training: its units carry that time
        est.update({n: 0.0 for n in stems
                    if training_units(n) and not any(unit_name(u) in known_units for u in training_units(n))})
        sched = simulate(order, est, jobs, after)
    else:       # one lane: the prepare stage, then each notebook with the runs it trains (each run counted once)
        sched, now, counted = {}, 0.0, set()
        steps = prepare.prepare_steps(stems, profile=profile, roots=roots, runs_dir=runs_dir)
        for n in [PREPARE + lb for lb in steps]:
            sched[n] = (0, now, now + known.get(n, 0.0))
            now = sched[n][2]
        for n in stems:
            mine = [unit_name(u) for u in training_units(n) if unit_name(u) not in counted]
            counted.update(mine)
            sched[n] = (0, now, now + cost.get(n, 0.0) + sum(known_units.get(u, 0.0) for u in mine))
            now = sched[n][2]
    missing = [n for n in sched if not (n in known or n in known_units or cost.get(n))]
    return sched, missing

