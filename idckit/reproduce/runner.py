"""One notebook of ``idckit reproduce``: found, given its parameters, run by papermill, converted to an HTML report.

Each notebook runs into a staging directory of its own process (:func:`run_one`); only when it finished AND converted
does its HTML and JSON replace the previous ones in ``reports/``, so a failing notebook leaves the previous good
report in place. Every path a notebook or a lane worker is given is absolute (:func:`absolute`,
:func:`absolute_env`): the kernel runs in ``notebooks/``, not in the caller's folder; the dataset roots and released
checkpoints it is given are checked before any notebook works (:func:`check_roots`, :func:`check_released`).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import nbformat
import papermill as pm
from nbconvert import HTMLExporter

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments.data import check_root
from idckit.registry import RELEASED, dataset_of_param, notebook_released, notebook_roots
from idckit.reports.card import with_card
from idckit.reports.report import is_kit_report

KERNEL = "idckit"


#: environment variables naming a place, which a kernel or lane worker inherits: made absolute for them
PATH_ENV = ("IDCKIT_DATA_DIR", "IDCKIT_RUNS_DIR", "IDCKIT_REPORTS_DIR", "IDCKIT_CHROMIUM", "HF_HOME", "HF_HUB_CACHE",
            "TORCH_HOME", "XDG_CACHE_HOME", "STANZA_RESOURCES_DIR")


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


def absolute(path: str | Path | None) -> str | None:
    """``path`` absolute against this process's working directory (``~`` expanded; symbolic links kept), None
    where not given: a notebook's kernel runs in ``notebooks/``, where a relative path would name another place."""
    return os.path.abspath(os.path.expanduser(str(path))) if path else None


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
    places = {**notebook_roots(name, roots), "report_dir": report_dir, "runs_dir": runs_dir,
              **notebook_released(name, released)}
    return {"profile": profile, **{k: absolute(v) for k, v in places.items()}, **(extra_parameters or {})}


def check_roots(notebooks: Sequence[str], roots: dict | None) -> None:
    """Every given root that one of ``notebooks`` reads, checked against its dataset's layout (the manifest's), so a
    wrong root fails here, naming the layout and the fix, before any notebook works."""
    used = {p: r for name in notebooks for p, r in notebook_roots(name, roots).items() if r}
    for param, root in used.items():
        check_root(dataset_of_param(param).name, root)


def check_released(notebooks: Sequence[str], released: dict | None) -> None:
    """Every given released checkpoint (:data:`idckit.registry.RELEASED`) exists and one of ``notebooks`` takes it,
    checked before any notebook works (``idckit reproduce --released-checkpoint ...``)."""
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


def to_html(executed: Path, html_path: Path) -> None:
    """HTML with the code hidden (tables, plots and text visible), written atomically."""
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

