"""``idckit reproduce``: run notebooks with papermill, convert them to HTML reports, write ``reports/index.html``.

Each notebook runs into a staging directory of its own process; only when it finished AND converted does its
HTML and JSON replace the previous ones in ``reports/``. A failing notebook leaves the previous good report in
place, marked stale in ``reports/status.json`` and on the index page, and makes the command exit non-zero naming
it. The report folder follows idckit.fileio's write policy: it is absent, empty or the kit's own (its status.json,
index page and reports say so); anything else is refused before the first notebook, or with ``force`` kept. A
second ``reproduce`` of a notebook already running into the same folder is refused at once (a lock per notebook).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments.config import PROFILES, check_profile

KERNEL = "idckit"


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
    return profile == paths.DEFAULT_PROFILE and report_dir is None


INDEX_TITLE = "<title>idckit reports</title>"


def _kit_report(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("notebook") == path.stem


def _recognise_reports(d: Path) -> dict | None:
    """Which entries of ``d`` are the kit's reports (None: nothing says the folder is the kit's): its status.json,
    index page, ``NAME.json`` reports of notebook NAME with their ``NAME.html``, and other profiles' report
    folders inside it."""
    owned = []
    doc = _read_status(d / "status.json")      # a damaged one is named as such, not called foreign
    if (d / "status.json").is_file() and all(isinstance(v, dict) and "status" in v for v in doc.values()):
        owned.append("status.json")
    try:
        if INDEX_TITLE in (d / "index.html").read_text(encoding="utf-8", errors="replace")[:2000]:
            owned.append("index.html")
    except OSError:
        pass
    for jp in d.glob("*.json"):
        if jp.name != "status.json" and _kit_report(jp):
            owned += [jp.name] + ([f"{jp.stem}.html"] if (d / f"{jp.stem}.html").is_file() else [])
    owned += [p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("_tmp-")]   # older runs' staging
    owned += [p.name for p in d.iterdir() if p.is_dir() and p.name in PROFILES and _recognise_reports(p)]
    return {"kind": "reports", "what": "idckit report folder", "entries": owned} if owned else None


def claim_report_dir(report_dir: str | Path, notebooks: Sequence[Path], force: bool = False) -> Path:
    """The report folder resolved and checked before the first notebook (see the module's docstring)."""
    will = ["index.html", "status.json"] + [f"{nb.stem}{s}" for nb in notebooks for s in (".json", ".html")]
    return fileio.claim_dir(report_dir, "reports", flag="--report-dir", force=force, recognise=_recognise_reports,
                            will_write=will, what="idckit report folder").path


def parameters(name: str, *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
               extra_parameters: dict | None = None, released: dict | None = None) -> dict:
    """What notebook ``name`` is run with: the profile, the roots of the datasets it reads
    (:func:`idckit.manifest.notebook_roots`: None where not given, its synthetic set), where reports and runs go."""
    from idckit.manifest import notebook_released, notebook_roots

    return {"profile": profile, **notebook_roots(name, roots), "report_dir": str(report_dir),
            "runs_dir": str(runs_dir), **notebook_released(name, released), **(extra_parameters or {})}


def check_roots(notebooks: Sequence[str], roots: dict | None) -> None:
    """Every given root that one of ``notebooks`` reads, checked against its dataset's layout (the manifest's), so a
    wrong root fails here, naming the layout and the fix, before any notebook works."""
    from idckit.experiments.data import check_root
    from idckit.manifest import dataset_of_param, notebook_roots

    used = {p: r for name in notebooks for p, r in notebook_roots(name, roots).items() if r}
    for param, root in used.items():
        check_root(dataset_of_param(param).name, root)


def check_released(notebooks: Sequence[str], released: dict | None) -> None:
    """Every given released checkpoint (:data:`idckit.manifest.RELEASED`) exists and one of ``notebooks`` takes it,
    checked before any notebook works (``idckit reproduce --released-checkpoint ...``)."""
    from idckit.manifest import RELEASED, notebook_released

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
        from idckit.report_card import with_card

        page = stage / f"{name}.html"
        fileio.write_text(page, with_card(page.read_text(encoding="utf-8"), json.loads(report_json.read_text())))
        seconds = time.time() - t0
        # Record the wall time of the whole notebook (execution + conversion) in its report.
        doc = json.loads(report_json.read_text())
        doc.setdefault("provenance", {})["notebook_wall_seconds"] = round(seconds, 1)
        fileio.write_json(report_json, doc, indent=1)
        for suffix in (".json", ".html"):
            (stage / f"{name}{suffix}").replace(report_dir / f"{name}{suffix}")
        return Outcome(name, True, seconds)
    except Exception as e:  # noqa: BLE001 - any failure must leave the previous report in place
        msg = f"{type(e).__name__}: {e}"
        if not isinstance(e, pm.PapermillExecutionError):
            msg += "\n" + traceback.format_exc(limit=3)
        return Outcome(name, False, time.time() - t0, msg[-4000:])
    finally:
        shutil.rmtree(stage.parent, ignore_errors=True)


def _read_status(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        status = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"the reports' status file is unreadable ({e})", path=path,
                          fix="delete it; the next run rewrites it (the reports themselves are kept)") from e
    if not isinstance(status, dict):
        raise ConfigError("the reports' status file must hold a JSON object", path=path,
                          fix="delete it; the next run rewrites it (the reports themselves are kept)")
    return status


def reproduce(names: Sequence[str] = (), *, profile: str = paths.DEFAULT_PROFILE, roots: dict | None = None,
              report_dir: str | Path | None = None, runs_dir: str | Path | None = None,
              extra_parameters: dict | None = None, notebooks_dir: Path | None = None,
              released: dict | None = None,
              force: bool = False) -> list[Outcome]:
    """``force``: write into a report folder that also holds files the kit did not write (they are kept)."""
    check_profile(profile)
    notebooks = discover(names, notebooks_dir)
    report_dir = claim_report_dir(report_dir or paths.reports_dir(profile), notebooks, force)
    runs_dir = fileio.check_output_dir(runs_dir or paths.runs_dir(), "--runs-dir")
    check_roots([nb.stem for nb in notebooks], roots)   # a wrong root fails here, before any notebook works
    check_released([nb.stem for nb in notebooks], released)
    report_dir.mkdir(parents=True, exist_ok=True)
    status_path = report_dir / "status.json"
    _read_status(status_path)       # an unreadable status file fails here, before the first notebook
    fileio.remove_stale_staging(report_dir, fileio._STAGING)
    with ExitStack() as held:
        for nb in notebooks:        # all of them before the first runs: a refusal costs nothing
            held.enter_context(fileio.lock(
                report_dir, nb.stem, what=f"{nb.stem} in this report folder",
                fix="wait for that `idckit reproduce` to finish (its report replaces this one), or pass another "
                    "--report-dir"))
        return _run_all(notebooks, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                        extra_parameters=extra_parameters, released=released)


def _run_all(notebooks: Sequence[Path], *, profile: str, roots: dict | None, report_dir: Path, runs_dir: Path,
             extra_parameters: dict | None, released: dict | None = None) -> list[Outcome]:
    status_path = report_dir / "status.json"
    outcomes = []
    for nb in notebooks:
        print(f"[idckit reproduce] {nb.stem} (profile={profile}) ...", flush=True)
        out = run_one(nb, profile=profile, roots=roots, report_dir=report_dir, runs_dir=runs_dir,
                      extra_parameters=extra_parameters, released=released)
        outcomes.append(out)
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        # read again under a lock: another `idckit reproduce` on the same reports may record its notebooks meanwhile
        with fileio.wait_lock(report_dir / f"{fileio.LOCK}status"):
            _record(status_path, out, profile, when)
        print(f"[idckit reproduce] {nb.stem}: " + (f"ok in {out.seconds:.0f} s" if out.ok else
                                                  f"FAILED after {out.seconds:.0f} s\n{out.error}"), flush=True)
    with fileio.wait_lock(report_dir / f"{fileio.LOCK}status"):
        write_index(report_dir)
    return outcomes


def _record(status_path: Path, out: Outcome, profile: str, when: str) -> None:
    status = _read_status(status_path)
    if out.ok:
        status[out.notebook] = {"status": "ok", "when": when, "profile": profile, "seconds": round(out.seconds, 1)}
    else:
        prev = status.get(out.notebook, {})
        status[out.notebook] = {**prev, "status": "stale" if prev.get("status") else "failed",
                                "failed_when": when, "error": out.error.splitlines()[0][:300]}
    fileio.write_json(status_path, status, indent=1, sort_keys=True)


# -- index page -------------------------------------------------------------------------------------------
def write_index(report_dir: str | Path) -> Path:
    """``reports/index.html`` (:mod:`idckit.report_index`)."""
    from idckit import report_index

    return report_index.write_index(report_dir)
