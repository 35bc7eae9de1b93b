"""``idckit reproduce``: run notebooks with papermill, convert them to HTML reports, write ``reports/index.html``.

:func:`reproduce` is the entry point; the work is split over three modules:

- :mod:`idckit.reproduce.runner`: one notebook run into a staging directory and converted, its parameters (every
  path absolute) and the checks of the dataset roots and released checkpoints it is given;
- :mod:`idckit.reproduce.prepare`: the prepare stage, which builds every dataset and grid feature store the selected
  notebooks read before they run;
- :mod:`idckit.reproduce.scheduler`: which notebook, prepare step and training run runs when on how many lanes, each
  outcome recorded in ``status.json``, and the simulator behind :func:`plan` (``idckit reproduce --plan``).

Only when a notebook finished AND converted does its HTML and JSON replace the previous ones in ``reports/``. A
failing notebook leaves the previous good report in place, marked stale in ``reports/status.json`` and on the index
page, and makes the command exit non-zero naming it. The report folder follows idckit.fileio's write policy: it is
absent, empty or the kit's own (its status.json, index page and reports say so); anything else is refused before the
first notebook, or with ``force`` kept. A second ``reproduce`` of a notebook already running into the same folder is
refused at once (a lock per notebook). ``status.json`` keeps, under :data:`idckit.reports.report.TIMES_KEY`, where
the last reproduce spent its time.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments.config import check_profile
from idckit.registry import RELEASED, root_params
from idckit.reports import index as report_index
from idckit.reports.report import TIMES_KEY, claim_report_dir, read_status
from idckit.reproduce import prepare, runner, scheduler
# the names callers take from the package: the CLI (plan), the registry's tests (parameters, check_roots)
from idckit.reproduce.runner import Outcome, check_roots, parameters
from idckit.reproduce.scheduler import plan

__all__ = ["Outcome", "check_roots", "parameters", "plan", "reproduce", "updates_readme", "write_index"]


def reproduce(names: Sequence[str] = (), *, profile: str = paths.DEFAULT_PROFILE, roots: dict | None = None,
              report_dir: str | Path | None = None, runs_dir: str | Path | None = None,
              extra_parameters: dict | None = None, notebooks_dir: Path | None = None,
              released: dict | None = None,
              force: bool = False, jobs: int | None = None) -> list[Outcome]:
    """``force``: write into a report folder that also holds files the kit did not write (they are kept).
    ``jobs``: notebooks run at once (None: ``reproduce_jobs`` of ``configs/runtime.json``)."""
    check_profile(profile)
    jobs = scheduler.default_jobs(profile) if jobs is None else scheduler.check_jobs(jobs)
    _check_extra(extra_parameters)
    notebooks = runner.discover(names, notebooks_dir)
    report_dir = claim_report_dir(report_dir or paths.reports_dir(profile), notebooks, force)
    runs_dir = fileio.check_output_dir(Path(runner.absolute(runs_dir or paths.runs_dir())), "--runs-dir")
    _check_apart(report_dir, runs_dir)
    # the caller's relative paths, as the caller meant them: the notebooks run elsewhere (see `runner.parameters`)
    roots = {k: runner.absolute(v) for k, v in roots.items()} if roots else roots
    released = {k: runner.absolute(v) for k, v in released.items()} if released else released
    runner.check_roots([nb.stem for nb in notebooks], roots)    # a wrong root fails here, before any notebook works
    runner.check_released([nb.stem for nb in notebooks], released)
    report_dir.mkdir(parents=True, exist_ok=True)
    status_path = report_dir / "status.json"
    read_status(status_path)       # an unreadable status file fails here, before the first notebook
    fileio.remove_stale_staging(report_dir, fileio._STAGING)
    with ExitStack() as held:
        held.enter_context(runner.absolute_env())   # inherited by every kernel and lane worker started below
        for nb in notebooks:        # all of them before the first runs: a refusal costs nothing
            held.enter_context(fileio.lock(
                report_dir, nb.stem, what=f"{nb.stem} in this report folder",
                fix="wait for that `idckit reproduce` to finish (its report replaces this one), or pass another "
                    "--report-dir"))
        t0 = time.time()
        device = (extra_parameters or {}).get("device")
        lanes = scheduler.uses_lanes(jobs, notebooks)
        # with lanes each step is a lane job, so the birds train while CLEVR renders; else all before notebook one
        steps: list[dict] = [] if lanes else prepare.prepare(
            [nb.stem for nb in notebooks], profile=profile, roots=roots, runs_dir=runs_dir, device=device)
        unit_times: dict[str, float] = {}
        outcomes = scheduler.run_all(notebooks, profile=profile, roots=roots, report_dir=report_dir,
                                     runs_dir=runs_dir, extra_parameters=extra_parameters, released=released,
                                     jobs=jobs, unit_times=unit_times, prepare_records=steps)
        threads = max(1, scheduler.cores() // jobs) if lanes else None   # else the parent's
        times = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "profile": profile,
                 "jobs": jobs, "threads": threads, "total_seconds": round(time.time() - t0, 1),
                 "prepare": steps, "notebooks": {o.notebook: round(o.seconds, 1) for o in outcomes},
                 "training": scheduler.training_by_kind(runs_dir, since=t0), "training_jobs": unit_times}
        with fileio.wait_lock(report_dir / f"{fileio.LOCK}status"):
            status = read_status(status_path)
            status[TIMES_KEY] = times
            fileio.write_json(status_path, status, indent=1, sort_keys=True)
            write_index(report_dir)
        print(f"[idckit reproduce] wall {times['total_seconds'] / 60:.1f} min ({jobs} lane(s))", flush=True)
        return outcomes


def _check_extra(extra_parameters: dict | None) -> None:
    """Places go through their own arguments, which are claimed and made absolute; an extra parameter naming one
    would bypass both (a report_dir there would even replace the notebook's stage)."""
    places = sorted(set(extra_parameters or {}) & {"report_dir", "runs_dir", *root_params(), *RELEASED})
    if places:
        raise ConfigError(f"extra_parameters may not set {', '.join(places)}",
                          fix="pass report_dir=, runs_dir=, roots={...} or released={...} to reproduce instead")


def _check_apart(report_dir: Path, runs_dir: Path) -> None:
    """Reports and runs in one folder, or one inside the other, would make each a foreign entry of the other's
    folder (refused by the next reproduce) and mix run folders with reports."""
    report_dir, runs = report_dir.resolve(), runs_dir.resolve()
    if report_dir == runs or report_dir in runs.parents or runs in report_dir.parents:
        raise ConfigError("--report-dir and --runs-dir must be apart (neither the same folder nor one inside the "
                          "other)", path=runs_dir,
                          fix=f"pass a --runs-dir outside {report_dir} (e.g. runs/ beside it), or another --report-dir")


def updates_readme(profile: str, report_dir: str | Path | None) -> bool:
    """Only the default profile writing into the default reports/ may rewrite the README's results table: the
    table describes the committed reports, not a smoke test's."""
    return profile == paths.DEFAULT_PROFILE and report_dir is None and \
        paths.reports_dir(profile).resolve() == (paths.project_root() / "reports").resolve()


def write_index(report_dir: str | Path) -> Path:
    """``reports/index.html`` (:mod:`idckit.reports.index`)."""
    return report_index.write_index(report_dir)

