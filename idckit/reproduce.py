"""``idckit reproduce``: run notebooks with papermill, convert them to HTML reports, write ``reports/index.html``.

Each notebook runs into a private staging directory; only when it finished AND converted does its HTML and
JSON replace the previous ones in ``reports/``. A failing notebook leaves the previous good report in place,
marked stale in ``reports/status.json`` and on the index page, and makes the command exit non-zero naming it.
"""
from __future__ import annotations

import html
import json
import shutil
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from idckit import fileio, paths
from idckit.errors import ConfigError
from idckit.experiments.config import check_profile

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


def run_one(nb: Path, *, profile: str, data_root: str | None, report_dir: Path, runs_dir: Path,
            extra_parameters: dict | None = None, log_output: bool = False) -> Outcome:
    import papermill as pm

    name = nb.stem
    stage = report_dir / f"_tmp-{name}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    t0 = time.time()
    try:
        executed = stage / f"{name}.ipynb"
        params = {"profile": profile, "data_root": data_root, "report_dir": str(stage), "runs_dir": str(runs_dir),
                  **(extra_parameters or {})}
        pm.execute_notebook(str(nb), str(executed), parameters=params, kernel_name=KERNEL, cwd=str(nb.parent),
                            progress_bar=False, log_output=log_output)
        report_json = stage / f"{name}.json"
        if not report_json.is_file():
            raise RuntimeError(f"notebook {name} ran but wrote no {report_json.name}")
        to_html(executed, stage / f"{name}.html")
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
        shutil.rmtree(stage, ignore_errors=True)


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


def reproduce(names: Sequence[str] = (), *, profile: str = paths.DEFAULT_PROFILE, data_root: str | None = None,
              report_dir: str | Path | None = None, runs_dir: str | Path | None = None,
              extra_parameters: dict | None = None, notebooks_dir: Path | None = None) -> list[Outcome]:
    check_profile(profile)
    report_dir = fileio.check_output_dir(report_dir or paths.reports_dir(profile), "--report-dir")
    runs_dir = fileio.check_output_dir(runs_dir or paths.runs_dir(), "--runs-dir")
    notebooks = discover(names, notebooks_dir)
    if data_root:  # a wrong root fails here, in one line, not inside every notebook
        from idckit.data.clevr_change import ClevrChange

        ClevrChange(Path(data_root).expanduser())
    report_dir.mkdir(parents=True, exist_ok=True)
    status_path = report_dir / "status.json"
    _read_status(status_path)       # an unreadable status file fails here, before the first notebook
    outcomes = []
    for nb in notebooks:
        print(f"[idckit reproduce] {nb.stem} (profile={profile}) ...", flush=True)
        out = run_one(nb, profile=profile, data_root=data_root, report_dir=report_dir, runs_dir=runs_dir,
                      extra_parameters=extra_parameters)
        outcomes.append(out)
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        # read again: another `idckit reproduce` on the same reports may have recorded its notebooks meanwhile
        status = _read_status(status_path)
        if out.ok:
            status[out.notebook] = {"status": "ok", "when": when, "profile": profile,
                                    "seconds": round(out.seconds, 1)}
            print(f"[idckit reproduce] {nb.stem}: ok in {out.seconds:.0f} s", flush=True)
        else:
            prev = status.get(out.notebook, {})
            status[out.notebook] = {**prev, "status": "stale" if prev.get("status") else "failed",
                                    "failed_when": when, "error": out.error.splitlines()[0][:300]}
            print(f"[idckit reproduce] {nb.stem}: FAILED after {out.seconds:.0f} s\n{out.error}", flush=True)
        fileio.write_json(status_path, status, indent=1, sort_keys=True)
    write_index(report_dir)
    return outcomes


# -- index page -------------------------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.1f}"
    return "" if v is None else str(v)


def _status_cell(doc: dict, run_status: str) -> str:
    """Whether the notebook ran (or its last run failed) and whether its runs learned: a run that only ran (a
    collapsed captioner, a retriever or judge at chance) is flagged here, not only inside its report."""
    from idckit.report import learning_status

    learned = learning_status(doc)
    cls = "flag" if learned["flag"] else ("learned" if learned["verdict"] == "learned" else "ran")
    cell = f'<span class="{cls}">{html.escape(learned["verdict"])}</span>'
    if learned["detail"]:
        cell += f'<br><span class="detail">{html.escape(learned["detail"])}</span>'
    if run_status in ("stale", "failed"):
        cell = '<span class="stale">stale: last run failed</span><br>' + cell
    return cell


def write_index(report_dir: str | Path) -> Path:
    """``reports/index.html``: one row per report, the kit's headline beside the paper's, with provenance."""
    from idckit.report import COLLAPSE_DISTINCT, JUDGE_CHANCE_BELOW, RETRIEVAL_CHANCE_FACTOR

    report_dir = Path(report_dir)
    status_path = report_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.is_file() else {}
    rows = []
    for jp in sorted(report_dir.glob("*.json")):
        if jp.name == "status.json":
            continue
        doc = json.loads(jp.read_text())
        if "notebook" not in doc:
            continue
        prov = doc.get("provenance", {})
        head = doc.get("headline", {})
        st = status.get(doc["notebook"], {}).get("status", "ok")
        rows.append({
            # <wbr>: long notebook names may break at their underscores instead of widening the table
            "report": (f'<a href="{html.escape(doc["notebook"])}.html">'
                       f'{html.escape(doc["notebook"]).replace("_", "_<wbr>")}</a>'),
            "paper table": html.escape(doc.get("title") or doc.get("table", "")),
            "headline": html.escape(head.get("label", "")),
            "idckit": _fmt(head.get("kit")),
            "paper": _fmt(head.get("paper")) or "–",
            "profile": html.escape(str(prov.get("profile", ""))),
            "data": html.escape(str(prov.get("data", ""))),
            "backbone": html.escape(str(prov.get("backbone", ""))),
            "seeds": html.escape(", ".join(map(str, prov.get("seeds", [])))),
            "wall": f'{prov.get("notebook_wall_seconds", prov.get("wall_seconds", 0)) / 60:.1f} min',
            # a cached re-render takes seconds; this is the training behind the numbers, done once
            "training": (f'{prov["train_seconds"] / 60:.1f} min' if isinstance(prov.get("train_seconds"), (int, float))
                         else "–"),
            "commit": html.escape(str(prov.get("commit", ""))),
            "status": _status_cell(doc, st),
        })
    cols = ["report", "paper table", "headline", "idckit", "paper", "profile", "data", "backbone", "seeds",
            "wall", "training", "commit", "status"]
    # one long data description repeated on every row pushed the commit and status off a laptop screen
    shared_data = {r["data"] for r in rows}
    data_line = ""
    if len(shared_data) == 1 and rows:
        cols.remove("data")
        data_line = f'<p class="note"><b>data</b> (every row): {shared_data.pop()}</p>'
    head_html = "".join(f"<th>{c}</th>" for c in cols)
    body = "\n".join("<tr>" + "".join(f"<td>{r[c]}</td>" for c in cols) + "</tr>" for r in rows)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idckit reports</title>
<style>
 body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
 table {{ border-collapse: collapse; font-size: 0.9rem; }}
 th, td {{ border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; vertical-align: top; }}
 th {{ background: #f0f0f0; }} .stale, .flag {{ color: #b00; font-weight: bold; }}
 .learned {{ color: #070; font-weight: bold; }} .detail {{ font-size: 0.8rem; color: #555; }}
 p.note {{ max-width: 60rem; }}
</style></head><body>
<h1>idckit: reproduced tables</h1>
<p class="note">Each row links to a notebook report. <b>idckit</b> is the kit's own measurement; <b>paper</b> is
the published number on the real dataset, shown beside it and never mixed in. <b>status</b> says whether the
runs behind a report <i>learned</i> or only <i>ran</i>: a captioner that writes fewer than {COLLAPSE_DISTINCT}
distinct test captions is COLLAPSED, a retriever under {RETRIEVAL_CHANCE_FACTOR:g}x chance text->pair R@1 or a
distractor judge under {JUDGE_CHANCE_BELOW:.2f} accuracy is at chance. Rows whose data says
<i>synthetic</i> ran on a synthetic set in the real dataset's format (SynthCLEVR-Change, SynthSpot-the-Diff,
SynthIER, SynthBirds): they show the pipeline end to end, not a real-data reproduction.</p>
{data_line}
<table><thead><tr>{head_html}</tr></thead><tbody>
{body}
</tbody></table>
</body></html>
"""
    path = report_dir / "index.html"
    fileio.write_text(path, page)
    return path
