"""``idckit reproduce``: run notebooks with papermill, convert them to HTML reports, write ``reports/index.html``.

Each notebook runs into a staging directory of its own process; only when it finished AND converted does its
HTML and JSON replace the previous ones in ``reports/``. A failing notebook leaves the previous good report in
place, marked stale in ``reports/status.json`` and on the index page, and makes the command exit non-zero naming
it. The report folder follows idckit.fileio's write policy: it is absent, empty or the kit's own (its status.json,
index page and reports say so); anything else is refused before the first notebook, or with ``force`` kept. A
second ``reproduce`` of a notebook already running into the same folder is refused at once (a lock per notebook).

A prepare stage builds every dataset and grid feature store the selected notebooks read, through the same setup
functions the notebooks call (so they then find them cached): before the first notebook with one lane. With
``jobs`` > 1 the notebooks run in that many worker processes, each kernel on ``cores // jobs`` torch threads,
longest chain first, a notebook that reads another's runs (:data:`AFTER`) only once that one finished; the runs a
notebook would train in a row (:data:`idckit.registry.TRAINS`) are trained first as lane jobs of their own, one
(family, variant, seed) each, which the notebook then reads from the run cache; and each prepare step is a lane job
too, which only the notebooks and runs reading its data wait for (the birds train while CLEVR renders).
``status.json`` keeps, under :data:`TIMES_KEY`, where the last reproduce spent its time (prepare steps, notebooks,
training per run kind); :func:`plan` plays the schedule over those times (``idckit reproduce --plan``).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Sequence

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments.config import check_profile
from idckit.reports.report import TIMES_KEY, claim_report_dir, is_kit_report, read_status

KERNEL = "idckit"

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

#: the notebooks that also run on the synthetic hard twin (``pcl.hard_runs`` / ``duda.hard_runs``)
HARD_TWIN = ("table2_clevr_change", "table3_change_types")

#: the metrics.json entries holding a run's own training seconds, first found wins (pre-training runs record their
#: training as wall_seconds)
TRAIN_SECONDS = ("train_seconds", "finetune_seconds", "caption_seconds", "wall_seconds")


@dataclass
class Outcome:
    notebook: str
    ok: bool
    seconds: float
    error: str = ""


def discover(names: Sequence[str] = (), notebooks_dir: Path | None = None) -> list[Path]:
    nb_dir = notebooks_dir or paths.notebooks_dir()
    found = sorted(nb_dir.glob("*.ipynb"))
    if not names:
        return found
    by_name = {p.stem: p for p in found}
    out = []
    for n in names:
        stem = Path(n).stem
        if stem not in by_name:
            raise ConfigError(f"no notebook named {n!r}", path=nb_dir,
                              fix=f"choose from: {', '.join(sorted(by_name))}")
        out.append(by_name[stem])
    return out


def to_html(executed: Path, html_path: Path) -> None:
    """HTML with the code hidden (tables, plots and text visible), written atomically."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    # Progress bars and tool chatter go to stderr; a reader of the report wants tables and plots. Errors are
    # not streams and stay visible.
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = [o for o in cell.get("outputs", [])
                               if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": f"idckit: {html_path.stem}"}})
    fileio.write_text(html_path, body)


def updates_readme(profile: str, report_dir: str | Path | None) -> bool:
    """Only the default profile writing into the default reports/ may rewrite the README's results table: the
    table describes the committed reports, not a smoke test's."""
    return profile == paths.DEFAULT_PROFILE and report_dir is None and \
        paths.reports_dir(profile).resolve() == (paths.project_root() / "reports").resolve()


def absolute(path: str | Path | None) -> str | None:
    """``path`` absolute against this process's working directory (``~`` expanded; symbolic links kept), None
    where not given: a notebook's kernel runs in ``notebooks/``, where a relative path would name another place."""
    return os.path.abspath(os.path.expanduser(str(path))) if path else None


#: environment variables naming a place, which a kernel or lane worker inherits: made absolute for them
PATH_ENV = ("IDCKIT_DATA_DIR", "IDCKIT_RUNS_DIR", "IDCKIT_REPORTS_DIR", "IDCKIT_CHROMIUM", "HF_HOME", "HF_HUB_CACHE",
            "TORCH_HOME", "XDG_CACHE_HOME", "STANZA_RESOURCES_DIR")


@contextmanager
def absolute_env() -> Iterator[None]:
    """For the block (the prepare stage, the notebooks' kernels and the lane workers it starts): the kit's data,
    runs and reports folders pinned to the absolute ones this process resolved, and every other relative
    :data:`PATH_ENV` value made absolute; the caller's environment is restored afterwards."""
    pinned = {"IDCKIT_DATA_DIR": paths.data_dir(), "IDCKIT_RUNS_DIR": paths.runs_dir(),
              "IDCKIT_REPORTS_DIR": paths.reports_dir()}
    for var in PATH_ENV:
        value = os.environ.get(var)
        # a bare command name (IDCKIT_CHROMIUM=chromium) is looked up on PATH, not a path
        if value and var not in pinned and (os.sep in value or var != "IDCKIT_CHROMIUM"):
            pinned[var] = absolute(value)
    before = {var: os.environ.get(var) for var in pinned}
    os.environ.update({var: str(v) for var, v in pinned.items()})
    try:
        yield
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def parameters(name: str, *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
               extra_parameters: dict | None = None, released: dict | None = None) -> dict:
    """What notebook ``name`` is run with: the profile, the roots of the datasets it reads
    (:func:`idckit.registry.notebook_roots`: None where not given, its synthetic set), where reports and runs go.
    Every path is absolute (:func:`absolute`): the notebook runs in ``notebooks/``, not in the caller's folder."""
    from idckit.registry import notebook_released, notebook_roots

    places = {**notebook_roots(name, roots), "report_dir": report_dir, "runs_dir": runs_dir,
              **notebook_released(name, released)}
    return {"profile": profile, **{k: absolute(v) for k, v in places.items()}, **(extra_parameters or {})}


def check_roots(notebooks: Sequence[str], roots: dict | None) -> None:
    """Every given root that one of ``notebooks`` reads, checked against its dataset's layout (the manifest's), so a
    wrong root fails here, naming the layout and the fix, before any notebook works."""
    from idckit.experiments.data import check_root
    from idckit.registry import dataset_of_param, notebook_roots

    used = {p: r for name in notebooks for p, r in notebook_roots(name, roots).items() if r}
    for param, root in used.items():
        check_root(dataset_of_param(param).name, root)


def check_released(notebooks: Sequence[str], released: dict | None) -> None:
    """Every given released checkpoint (:data:`idckit.registry.RELEASED`) exists and one of ``notebooks`` takes it,
    checked before any notebook works (``idckit reproduce --released-checkpoint ...``)."""
    from idckit.registry import RELEASED, notebook_released

    notebook_released("", released)                 # an unknown parameter fails here
    for param, path in (released or {}).items():
        if not path:
            continue
        r = RELEASED[param]
        if not Path(path).exists():
            raise ConfigError(f"the released checkpoint of {r.option} does not exist", path=path,
                              fix=f"pass the authors' file or a run directory written by idckit import-checkpoint "
                                  f"--from {r.kind}")
        if not set(notebooks) & set(r.notebooks):
            raise ConfigError(f"none of the notebooks to run takes {r.option} ({r.variable}=)",
                              fix=f"run one of {', '.join(r.notebooks)}, or drop it")


def run_one(nb: Path, *, profile: str, roots: dict | None = None, report_dir: Path, runs_dir: Path,
            extra_parameters: dict | None = None, released: dict | None = None,
            log_output: bool = False) -> Outcome:
    import papermill as pm

    name = nb.stem
    # this process's own staging folder: a second run never shares it, and one left by a killed run is never read
    stage = report_dir / f"{fileio._STAGING}{os.getpid()}" / name
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    t0 = time.time()
    try:
        executed = stage / f"{name}.ipynb"
        params = {**parameters(name, profile=profile, roots=roots, report_dir=stage, runs_dir=runs_dir,
                               released=released), **(extra_parameters or {})}
        pm.execute_notebook(str(nb), str(executed), parameters=params, kernel_name=KERNEL, cwd=str(nb.parent),
                            progress_bar=False, log_output=log_output)
        report_json = stage / f"{name}.json"
        if not report_json.is_file():
            raise RuntimeError(f"notebook {name} ran but wrote no {report_json.name}")
        to_html(executed, stage / f"{name}.html")
        # the summary card goes first, under the title, before any prose or table
        from idckit.reports.card import with_card

        page = stage / f"{name}.html"
        fileio.write_text(page, with_card(page.read_text(encoding="utf-8"), json.loads(report_json.read_text())))
        seconds = time.time() - t0
        # Record the wall time of the whole notebook (execution + conversion) in its report.
        doc = json.loads(report_json.read_text())
        doc.setdefault("provenance", {})["notebook_wall_seconds"] = round(seconds, 1)
        fileio.write_json(report_json, doc, indent=1)
        # the folder was claimed before the first notebook; a file of these names the kit did not write may have
        # appeared since, and is kept
        if any((report_dir / f"{name}{s}").exists() for s in (".json", ".html")) and \
                not is_kit_report(report_dir / f"{name}.json"):
            raise ConfigError(f"{name}.json or {name}.html appeared in the report folder while {name} ran, and the "
                              "kit did not write it; it was kept, this report not written", path=report_dir,
                              fix=f"move {name}.json/.html away and run {name} again")
        for suffix in (".json", ".html"):
            (stage / f"{name}{suffix}").replace(report_dir / f"{name}{suffix}")
        return Outcome(name, True, seconds)
    except Exception as e:  # noqa: BLE001 - any failure must leave the previous report in place
        msg = f"{type(e).__name__}: {e}"
        if not isinstance(e, pm.PapermillExecutionError):
            msg += "\n" + traceback.format_exc(limit=3)
        return Outcome(name, False, time.time() - t0, msg[-4000:])
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        try:
            stage.parent.rmdir()
        except OSError:
            pass


def check_jobs(jobs: object) -> int:
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}",
                          fix="pass --jobs 1 (one notebook at a time) or the machine's core count at most")
    return jobs


def default_jobs(profile: str) -> int:
    """``reproduce_jobs`` of ``configs/runtime.json`` at ``profile``."""
    from idckit.settings import load_config

    return check_jobs(load_config("runtime", profile)["reproduce_jobs"])


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # pragma: no cover - macOS
        return os.cpu_count() or 1


def reproduce(names: Sequence[str] = (), *, profile: str = paths.DEFAULT_PROFILE, roots: dict | None = None,
              report_dir: str | Path | None = None, runs_dir: str | Path | None = None,
              extra_parameters: dict | None = None, notebooks_dir: Path | None = None,
              released: dict | None = None,
              force: bool = False, jobs: int | None = None) -> list[Outcome]:
    """``force``: write into a report folder that also holds files the kit did not write (they are kept).
    ``jobs``: notebooks run at once (None: ``reproduce_jobs`` of ``configs/runtime.json``)."""
    check_profile(profile)
    jobs = default_jobs(profile) if jobs is None else check_jobs(jobs)
    _check_extra(extra_parameters)
    notebooks = discover(names, notebooks_dir)
    report_dir = claim_report_dir(report_dir or paths.reports_dir(profile), notebooks, force)
    runs_dir = fileio.check_output_dir(Path(absolute(runs_dir or paths.runs_dir())), "--runs-dir")
    _check_apart(report_dir, runs_dir)
    # the caller's relative paths, as the caller meant them: the notebooks run elsewhere (see `parameters`)
    roots = {k: absolute(v) for k, v in roots.items()} if roots else roots
    released = {k: absolute(v) for k, v in released.items()} if released else released
    check_roots([nb.stem for nb in notebooks], roots)   # a wrong root fails here, before any notebook works
    check_released([nb.stem for nb in notebooks], released)
    report_dir.mkdir(parents=True, exist_ok=True)
    status_path = report_dir / "status.json"
    read_status(status_path)       # an unreadable status file fails here, before the first notebook
    fileio.remove_stale_staging(report_dir, fileio._STAGING)
    with ExitStack() as held:
        held.enter_context(absolute_env())      # inherited by every kernel and lane worker started below
        for nb in notebooks:        # all of them before the first runs: a refusal costs nothing
            held.enter_context(fileio.lock(
                report_dir, nb.stem, what=f"{nb.stem} in this report folder",
                fix="wait for that `idckit reproduce` to finish (its report replaces this one), or pass another "
                    "--report-dir"))
        t0 = time.time()
        device = (extra_parameters or {}).get("device")
        # with lanes each step is a lane job, so the birds train while CLEVR renders; else all before notebook one
        steps: list[dict] = [] if _lanes(jobs, notebooks) else prepare(
            [nb.stem for nb in notebooks], profile=profile, roots=roots, runs_dir=runs_dir, device=device)
        unit_times: dict[str, float] = {}
        outcomes = _run_all(notebooks, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                            extra_parameters=extra_parameters, released=released, jobs=jobs, unit_times=unit_times,
                            prepare_records=steps)
        threads = max(1, cores() // jobs) if _lanes(jobs, notebooks) else None   # else the parent's
        times = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "profile": profile,
                 "jobs": jobs, "threads": threads, "total_seconds": round(time.time() - t0, 1),
                 "prepare": steps, "notebooks": {o.notebook: round(o.seconds, 1) for o in outcomes},
                 "training": training_by_kind(runs_dir, since=t0), "training_jobs": unit_times}
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
    from idckit.registry import RELEASED, ROOT_PARAMS

    places = sorted(set(extra_parameters or {}) & {"report_dir", "runs_dir", *ROOT_PARAMS, *RELEASED})
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


# -- the prepare stage ----------------------------------------------------------------------------------------
def prepare_steps(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                  device: str | None = None) -> dict[str, Callable[[], object]]:
    """``{label: build}``: every dataset (``scenes ...``) and grid feature store (``features ...``) the notebooks
    ``names`` read, each built by the setup function the notebook itself calls, so it then finds them cached.
    Datasets come before the stores computed from them; notebooks the manifest does not know add nothing."""
    from idckit.experiments import data as data_mod
    from idckit.experiments.data import synth_settings
    from idckit.registry import NOTEBOOKS, notebook_roots

    steps: dict[str, Callable[[], object]] = {}
    kw = {"runs_dir": runs_dir, "device": device, "progress": False}
    for name in names:
        nb = NOTEBOOKS.get(name)
        if nb is None:
            continue
        nb_roots = notebook_roots(name, roots)
        clevr = nb_roots.get("clevr_root")
        fams = set(nb.families)
        if "clevr-change" in nb.datasets:
            steps.setdefault("scenes clevr-change", lambda r=clevr: data_mod.clevr_change(profile, r,
                                                                                             progress=False))
        if fams & {"pcl", "duda"}:
            from idckit.experiments import pcl

            steps.setdefault("features clevr-change", lambda r=clevr: pcl.setup(profile, r, **kw))
            if name in HARD_TWIN and not clevr and synth_settings(profile, hard=True) != synth_settings(profile):
                steps.setdefault("scenes clevr-change hard", lambda: data_mod.clevr_change(profile, hard=True,
                                                                                           progress=False))
                steps.setdefault("features clevr-change hard", lambda: pcl.setup(profile, hard=True, **kw))
        if "clip4idc" in fams:
            from idckit.experiments import clip4idc
            from idckit.registry import DATASETS

            for ds in nb.datasets:    # its data, and the stand-in's description data where it has none
                root = nb_roots.get(DATASETS[ds].param)
                steps.setdefault(f"scenes {ds}" if ds != "clevr-change" else "clip4idc data clevr-change",
                                 lambda r=root, d=ds: clip4idc.setup(profile, r, dataset=d, **kw))
        if "birds" in fams:
            from idckit.experiments import birds

            root = nb_roots.get("birds_root")
            steps.setdefault("scenes birds", lambda r=root: data_mod.birds(profile, r, progress=False))
            steps.setdefault("features birds", lambda r=root: birds.setup(profile, r, **kw))
    order = sorted(steps, key=lambda label: not label.startswith("scenes"))   # stable: data before features
    return {label: steps[label] for label in order}


def prepare(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
            device: str | None = None) -> list[dict]:
    """Run :func:`prepare_steps` once each, timed. A failing step is recorded and printed, not raised: the
    notebooks that need it then fail on the same error and are marked as usual, the others still run."""
    return [_timed_step(label, build) for label, build in
            prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir, device=device).items()]


def prepare_one(label: str, names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                device: str | None = None) -> dict:
    """Prepare step ``label`` of notebooks ``names`` as a lane job (a worker cannot be sent the step's closure)."""
    steps = prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir, device=device)
    return _timed_step(label, steps[label])


def _timed_step(label: str, build: Callable[[], object]) -> dict:
    print(f"[prepare] {label} ...", flush=True)
    t0 = time.time()
    rec: dict = {"step": label}
    try:
        build()
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - the notebook reading it reports the failure
        rec.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
    rec["seconds"] = round(time.time() - t0, 1)
    print(f"[prepare] {label}: " + (f"{rec['seconds']:.0f} s" if rec["ok"] else f"FAILED: {rec['error']}"),
          flush=True)
    return rec


PREPARE = "prepare "


def prepare_jobs(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                 units: dict[str, tuple] | None = None) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """The prepare steps of notebooks ``names`` as lane jobs (``prepare LABEL``) and what waits for what: a store
    for the scenes it is computed from, a notebook for the steps of its own datasets, a training job (``units``, as
    :func:`training_jobs` names them) for those of its family's dataset (never the hard twin's)."""
    from idckit.registry import family

    labels = list(prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir))
    after: dict[str, tuple[str, ...]] = {}
    scenes = [lb for lb in labels if lb.startswith("scenes ")]
    for lb in labels:
        if not lb.startswith("scenes "):
            after[PREPARE + lb] = tuple(PREPARE + sc for sc in scenes if lb.endswith(" " + sc[len("scenes "):]))
    for n in names:
        own = prepare_steps([n], profile=profile, roots=roots, runs_dir=runs_dir)
        after[n] = tuple(PREPARE + lb for lb in own)
    for job, (fam, _, _) in (units or {}).items():
        ds = family(fam)[2]
        after[job] = tuple(PREPARE + lb for lb in labels if lb.endswith(" " + ds))
    return [PREPARE + lb for lb in labels], after


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


# -- the lanes ------------------------------------------------------------------------------------------------
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
    stems = [nb.stem for nb in discover(names, notebooks_dir)]
    report_dir = Path(report_dir or paths.reports_dir(profile))
    cost = estimates(stems, report_dir)
    known = {PREPARE + r["step"]: float(r["seconds"]) for r in _known_prepare(report_dir)}
    known_units = _known_units(report_dir)
    runs_dir = paths.runs_dir()
    if _lanes(jobs, stems):
        order, _, after, est = lane_jobs(stems, profile=profile, roots=roots, runs_dir=runs_dir,
                                         report_dir=report_dir)
        # a notebook timed before its runs were jobs of their own held their training: its units carry that time
        est.update({n: 0.0 for n in stems
                    if training_units(n) and not any(unit_name(u) in known_units for u in training_units(n))})
        sched = simulate(order, est, jobs, after)
    else:       # one lane: the prepare stage, then each notebook with the runs it trains (each run counted once)
        sched, now, counted = {}, 0.0, set()
        for n in [PREPARE + lb for lb in prepare_steps(stems, profile=profile, roots=roots, runs_dir=runs_dir)]:
            sched[n] = (0, now, now + known.get(n, 0.0))
            now = sched[n][2]
        for n in stems:
            mine = [unit_name(u) for u in training_units(n) if unit_name(u) not in counted]
            counted.update(mine)
            sched[n] = (0, now, now + cost.get(n, 0.0) + sum(known_units.get(u, 0.0) for u in mine))
            now = sched[n][2]
    missing = [n for n in sched if not (n in known or n in known_units or cost.get(n))]
    return sched, missing


def training_units(name: str) -> list[tuple[str, str, int]]:
    """Notebook ``name``'s (family, variant, seed) units of :data:`idckit.registry.TRAINS` ([] when it lists
    none)."""
    from idckit.experiments import recipes
    from idckit.registry import TRAINS, family, notebook

    units = []
    for fam, variants, seeds in TRAINS.get(name, ()):
        recipe_family = family(fam)[1]
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
    from idckit.registry import STARTS_FROM

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
    from idckit.registry import NOTEBOOKS

    nb = NOTEBOOKS.get(name)
    return nb.families[0] if nb and nb.families else None


def train_unit(unit: tuple[str, str, int], *, profile: str, roots: dict | None, runs_dir: Path,
               device: str | None = None) -> Outcome:
    """One (family, variant, seed) trained into the run cache, as ``idckit train`` does; a failure is returned (the
    notebook that reads the run then trains it itself, or fails on the same error and is marked)."""
    from idckit.experiments.base import train
    from idckit.registry import DATASETS, family

    fam, variant, seed = unit
    t0 = time.time()
    try:
        root = (roots or {}).get(DATASETS[family(fam)[2]].param)
        train(fam, profile, root, variants=[variant], seeds=[seed], runs_dir=runs_dir, device=device,
              progress=False)
        return Outcome(unit_name(unit), True, time.time() - t0)
    except Exception as e:  # noqa: BLE001 - reported; the notebook meets it again
        return Outcome(unit_name(unit), False, time.time() - t0, f"{type(e).__name__}: {e}"[-2000:])


def _lane_env(threads: int) -> None:
    """A worker's environment, inherited by the kernels it starts: ``threads`` torch/OpenMP threads each."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):     # torch takes its thread count from them
        os.environ[var] = str(threads)


def _run_all(notebooks: Sequence[Path], *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
             extra_parameters: dict | None, released: dict | None = None, jobs: int = 1,
             unit_times: dict[str, float] | None = None, prepare_records: list[dict] | None = None) -> list[Outcome]:
    """The notebooks one after another, or in lanes (:func:`_run_lanes`, which then also runs the prepare steps and
    appends their records to ``prepare_records``)."""
    if _lanes(jobs, notebooks):
        return _run_lanes(notebooks, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                          extra_parameters=extra_parameters, released=released, jobs=jobs, unit_times=unit_times,
                          prepare_records=prepare_records)
    status_path = report_dir / "status.json"
    outcomes = []
    for nb in notebooks:
        print(f"[idckit reproduce] {nb.stem} (profile={profile}) ...", flush=True)
        out = run_one(nb, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                      extra_parameters=extra_parameters, released=released)
        outcomes.append(out)
        _finished(out, status_path, report_dir, profile, f"[idckit reproduce] {nb.stem}: ")
    return outcomes


def _lanes(jobs: int, notebooks: Sequence) -> bool:
    return jobs > 1 and len(notebooks) > 1


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


def _run_lanes(notebooks: Sequence[Path], *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
               extra_parameters: dict | None, released: dict | None, jobs: int,
               unit_times: dict[str, float] | None = None, prepare_records: list[dict] | None = None
               ) -> list[Outcome]:
    """The notebooks in ``jobs`` worker processes (see the module's docstring), the prepare steps and the runs they
    train first (:func:`prepare_jobs`, :func:`training_jobs`), each training job's seconds into ``unit_times``, each
    prepare step's record into ``prepare_records``; the notebooks' outcomes in the given order."""
    import multiprocessing

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
                    fut = pool.submit(prepare_one, name[len(PREPARE):], list(by_name), **unit_kw)
                else:
                    fut = pool.submit(train_unit, units[name], **unit_kw) if name in units else \
                        pool.submit(run_one, by_name[name], **kw)
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


def _record(status_path: Path, out: Outcome, profile: str, when: str) -> None:
    status = read_status(status_path)
    if out.ok:
        status[out.notebook] = {"status": "ok", "when": when, "profile": profile, "seconds": round(out.seconds, 1)}
    else:
        prev = status.get(out.notebook, {})
        status[out.notebook] = {**prev, "status": "stale" if prev.get("status") else "failed",
                                "failed_when": when, "error": out.error.splitlines()[0][:300]}
    fileio.write_json(status_path, status, indent=1, sort_keys=True)


# -- index page -------------------------------------------------------------------------------------------
def write_index(report_dir: str | Path) -> Path:
    """``reports/index.html`` (:mod:`idckit.reports.index`)."""
    from idckit.reports import index as report_index

    return report_index.write_index(report_dir)
