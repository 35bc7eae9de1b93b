"""Notebook reports: the paper's numbers as data, the kit's rows with provenance, side-by-side tables.

Every notebook writes ``<report_dir>/<notebook>.json``::

    {"notebook": "table2_clevr_change", "table": "pcl.table2", "scale": "x100",
     "rows":  [{"model", "variant", "split", "metrics": {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D", ...}}, ...],
     "paper": [...the paper's rows, from idckit/reports/paper_numbers.json...],
     "provenance": {"profile", "data", "data_version", "backbone", "weights", "seeds", "selection_split",
                    "commit", "wall_seconds", ...}}

Metrics in reports are on the papers' scale (x100: BLEU-4 51.2, CIDEr-D 128.9); pycocoevalcap returns 0-1
(and CIDEr-D ~1.3), so :func:`to_paper_scale` converts. Tests, the README table and the index page read
these files; nobody types a result by hand.
"""
from __future__ import annotations

import html
import json
import math
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from idckit import fileio, registry
from idckit.errors import ConfigError
from idckit.settings import PROFILES

PAPER_NUMBERS = Path(__file__).parent / "paper_numbers.json"
CAPTION_METRICS: tuple[str, ...] = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
HEADLINE_METRICS: tuple[str, ...] = ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
PROVENANCE_KEYS: tuple[str, ...] = ("profile", "data", "data_version", "backbone", "weights", "seeds",
                                    "selection_split", "commit", "wall_seconds")
#: the status rules' thresholds live with the rules (:mod:`idckit.reports.status`)
from idckit.reports.status import (COLLAPSE_DISTINCT, COLLAPSE_TOP_SHARE, JUDGE_CHANCE_BELOW,  # noqa: E402,F401
                                  RETRIEVAL_LEARNED_FACTOR, is_collapsed, report_status)


@lru_cache(maxsize=1)
def _paper() -> dict:
    return json.loads(PAPER_NUMBERS.read_text(encoding="utf-8"))["tables"]


def paper_table(table_id: str) -> dict:
    """The published table ``table_id`` (e.g. ``"pcl.table2"``), rows on the paper's x100 scale."""
    tables = _paper()
    if table_id not in tables:
        raise ConfigError(f"unknown paper table {table_id!r}; known: {', '.join(tables)}")
    return tables[table_id]


def paper_rows(table_id: str, **row: Any) -> list[dict]:
    """The published rows of ``table_id`` whose fields equal ``row``; a ``dataset`` is the registry's name
    (``"spot-the-diff"``), matched against the paper-number id it has there."""
    if "dataset" in row:
        row = {**row, "dataset": registry.dataset(row["dataset"]).paper_id}
    return [r for r in paper_table(table_id)["rows"] if all(r.get(k) == v for k, v in row.items())]


def paper_value(table_id: str, metric: str, **row: Any) -> float:
    """One published number: ``metric`` of the one row of ``table_id`` whose fields equal ``row`` (e.g.
    ``paper_value("pcl.table2", "CIDEr-D", model="IDC-PCL")`` = 128.9), so a headline is read, never typed."""
    found = paper_rows(table_id, **row)
    if len(found) != 1 or metric not in found[0]["metrics"]:
        raise ConfigError(f"{table_id} has {len(found)} rows with {row} (need exactly one with {metric!r})")
    return found[0]["metrics"][metric]


def to_paper_scale(metrics: Mapping[str, float]) -> dict[str, float]:
    """pycocoevalcap's scale (0-1; CIDEr-D ~0-10) -> the papers' x100 scale. Retrieval metrics pass through."""
    return {k: (100.0 * v if k in CAPTION_METRICS else v) for k, v in metrics.items()}


#: the first note of every report whose data is synthetic (write_report adds it; no notebook types it)
SYNTHETIC_NOTE = ("Synthetic data: the numbers show the pipeline end to end and how methods rank on it; they are not "
                  "comparable with the paper's real-data numbers (pass the real dataset's root to run on it).")

#: what ``make reproduce`` itself writes: a change there does not make the code that produced a report dirty
GENERATED = ("reports", "README.md", "docs/img/index.png")


def commit_of(root: Path) -> str:
    """The commit checked out at ``root``, with ``+dirty`` when a tracked file other than the generated outputs
    differs from it (reproduce rewrites reports/ and the README's results table while it runs)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":(exclude){g}" for g in GENERATED)],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if dirty else "")


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit the kit's code ran at (see :func:`commit_of`)."""
    return commit_of(Path(__file__).resolve().parents[2])     # the clone holding idckit/


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def environment() -> dict[str, Any]:
    """What the numbers ran on: Python, torch, the device torch resolves by default and its CPU threads."""
    try:
        import torch  # local: torch costs ~3 s at import; idckit reproduce imports this module and never needs it

        from idckit.device import resolve  # local: imports torch (see above)

        return {"python": platform.python_version(), "torch": torch.__version__, "device": str(resolve("auto")),
                "threads": torch.get_num_threads()}
    except Exception as e:  # noqa: BLE001 - provenance must not fail a finished notebook
        return {"python": platform.python_version(), "torch": f"unavailable ({type(e).__name__})"}


@dataclass
class Provenance:
    profile: str
    data: str  # "synthetic: SynthCLEVR-Change (N pairs, seed S, WxH)" or "real: /path"
    data_version: str
    backbone: str
    weights: str
    seeds: list[int]
    selection_split: str = "val"
    commit: str = field(default_factory=git_commit)
    wall_seconds: float = 0.0
    date: str = field(default_factory=utc_now)
    environment: dict[str, Any] = field(default_factory=environment)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


def _check_finite(rows: Iterable[Mapping[str, Any]], where: str) -> None:
    for row in rows:
        for k, v in row.get("metrics", {}).items():
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{where}: metric {k!r} of row {row.get('model')!r}/{row.get('variant')!r} "
                                 f"is not a finite number: {v!r}")


def distinct_notes(notes: Sequence[str]) -> list[str]:
    """``notes`` with each sentence once: a repeat, or a note another note already says in full (a standing
    "X is above Y ..." inside "agrees: X is above Y ...; the paper has ..."; 40 characters or more, so a short
    phrase is never taken for one), is dropped."""
    out: list[str] = []
    for n in notes:
        core = n.rstrip(". ")
        if n in out or (len(core) >= 40 and any(core in m and m != n for m in notes)):
            continue
        out.append(n)
    return out


def write_report(report_dir: str | Path, notebook: str, table: str, rows: Sequence[Mapping[str, Any]],
                 provenance: Provenance | Mapping[str, Any], *, notes: Sequence[str] = (),
                 headline: Mapping[str, Any] | None = None, title: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> Path:
    """Validate and atomically write ``<report_dir>/<notebook>.json`` into a folder the kit may write into
    (:func:`claim_notebook_report_dir`); returns the path.

    ``headline`` = ``{"label": "CIDEr-D (test, total)", "kit": 97.3, "paper": 128.9}`` is what the index page
    shows for this report (``paper`` None where the paper has no such number; ``kit`` None where the run cannot
    decide it, e.g. a best split when every split ties; the label should then say why).
    """
    prov = provenance.to_dict() if isinstance(provenance, Provenance) else dict(provenance)
    missing = [k for k in PROVENANCE_KEYS if k not in prov]
    if missing:
        raise ValueError(f"report {notebook}: provenance lacks {missing}")
    rows = [dict(r) for r in rows]
    for r in rows:
        for key in ("model", "variant", "split", "metrics"):
            if key not in r:
                raise ValueError(f"report {notebook}: a row lacks {key!r}: {r}")
    _check_finite(rows, f"report {notebook}")
    notes = distinct_notes(notes)
    if str(prov.get("data", "")).startswith("synthetic") and SYNTHETIC_NOTE not in notes:
        notes.insert(0, SYNTHETIC_NOTE)
    paper = paper_table(table)["rows"] if table in _paper() else []
    if title is None:
        title = paper_table(table)["title"] if table in _paper() else table
    if headline is not None and headline.get("kit") is not None:
        _check_finite([{"metrics": {"headline": headline["kit"]}}], f"report {notebook} headline")
    doc = {"notebook": notebook, "table": table, "title": title, "scale": "x100", "rows": rows, "paper": paper,
           "headline": dict(headline) if headline else {}, "provenance": prov, "notes": list(notes),
           **(dict(extra) if extra else {})}
    path = claim_notebook_report_dir(report_dir, notebook) / f"{notebook}.json"
    fileio.write_json(path, doc, indent=1)
    return path


# -- what a report folder is: the one claim reproduce and the notebooks make before writing ----------------
#: status.json's record of where the last reproduce spent its time (prepare steps, training, each notebook)
TIMES_KEY = "_reproduce"
INDEX_TITLE = "<title>idckit reports</title>"


def is_kit_report(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("notebook") == path.stem


def _executed_notebook(path: Path) -> bool:
    """A notebook papermill executed (its metadata says so): reproduce stages one beside the report its notebook
    writes, and ``papermill NB OUT -p report_dir DIR`` may put OUT there."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(nb, dict) and isinstance(nb.get("metadata"), dict) and "papermill" in nb["metadata"]


def recognise_reports(d: Path) -> dict | None:
    """Which entries of ``d`` are the kit's reports (None: nothing says the folder is the kit's): its status.json,
    index page, ``NAME.json`` reports of notebook NAME with their ``NAME.html``, executed notebooks, and other
    profiles' report folders inside it."""
    owned = []
    doc = read_status(d / "status.json")      # a damaged one is named as such, not called foreign
    if (d / "status.json").is_file() and all(isinstance(v, dict) and ("status" in v or k == TIMES_KEY)
                                             for k, v in doc.items()):
        owned.append("status.json")
    try:
        if INDEX_TITLE in (d / "index.html").read_text(encoding="utf-8", errors="replace")[:2000]:
            owned.append("index.html")
    except OSError:
        pass
    for jp in d.glob("*.json"):
        if jp.name != "status.json" and is_kit_report(jp):
            owned += [jp.name] + ([f"{jp.stem}.html"] if (d / f"{jp.stem}.html").is_file() else [])
    owned += [p.name for p in d.glob("*.ipynb") if _executed_notebook(p)]
    owned += [p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("_tmp-")]   # older runs' staging
    owned += [p.name for p in d.iterdir() if p.is_dir() and p.name in PROFILES and recognise_reports(p)]
    return {"kind": "reports", "what": "idckit report folder", "entries": owned} if owned else None


def claim_report_dir(report_dir: str | Path, notebooks: Sequence[Path | str], force: bool = False, *,
                     flag: str = "--report-dir", force_option: str = "--force",
                     will_write: Sequence[str] | None = None) -> Path:
    """The report folder resolved and checked before the first notebook (see the module's docstring); a notebook
    claims its ``report_dir`` the same way (:func:`write_report`), with no ``--force`` to offer.
    ``will_write``: what is written there (default: reproduce's index, status and each notebook's JSON and HTML)."""
    stems = [nb.stem if isinstance(nb, Path) else nb for nb in notebooks]
    will = ["index.html", "status.json"] + [f"{n}{s}" for n in stems for s in (".json", ".html")] \
        if will_write is None else list(will_write)
    return fileio.claim_dir(report_dir, "reports", flag=flag, force=force, recognise=recognise_reports,
                            will_write=will, what="idckit report folder", force_option=force_option).path


def read_status(path: Path) -> dict:
    if not path.is_file():
        return {}
    return fileio.read_json(path, dict, what="the reports' status file", unreadable=True,
                            fix="delete it; the next run rewrites it (the reports themselves are kept)")


def claim_notebook_report_dir(report_dir: str | Path, notebook: str | None = None) -> Path:
    """``report_dir`` resolved and claimed as ``idckit reproduce`` claims its ``--report-dir``
    (:func:`claim_report_dir`): absent, empty or the kit's own (a running reproduce's stage
    included); a user's ``<notebook>.json`` or any other file of theirs there is refused, never replaced. A notebook
    has no ``--force``: the user moves the files, or picks another folder."""
    if not isinstance(report_dir, (str, Path)):      # papermill -p report_dir 5 injects an int
        raise ConfigError(f"report_dir must be a folder path, got {report_dir!r}",
                          fix="pass -p report_dir PATH (a folder), or leave it None for the profile's reports folder")
    return claim_report_dir(report_dir, [], flag="report_dir", force_option="",
                            will_write=[f"{notebook}.json"] if notebook else [])


def read_report(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# -- what the recorded rows say about learning ----------------------------------------------------------------
def retrieval_chance(n_pairs: int, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Retrieval metrics of a random ranking over ``n_pairs`` candidates (both directions; one true candidate per
    query): R@K = K / n (percent), median and mean rank (n + 1) / 2."""
    if n_pairs < 1:
        raise ValueError(f"retrieval chance needs at least one candidate pair, got {n_pairs}")
    out = {}
    for d in ("t2p", "p2t"):
        out.update({f"{d}_R@{k}": 100.0 * min(k, n_pairs) / n_pairs for k in ks})
        out[f"{d}_MdR"] = out[f"{d}_MnR"] = (n_pairs + 1) / 2
    return out


def learning_status(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``{"verdict", "detail", "flag"}`` of a report: :func:`idckit.reports.status.report_status` (its headline run
    only), as a dict."""
    return report_status(doc).as_dict()


# -- the block that ends every report -------------------------------------------------------------------------
def _minutes(seconds: Any) -> str:
    return f"{seconds / 60:.1f} min" if isinstance(seconds, (int, float)) else "–"


@dataclass
class ReportSummary:
    """What a notebook shows last: where its numbers come from, whether its runs learned, and its JSON's notes.

    Rendered as HTML in the notebook and its report; nothing in it points at a temporary folder."""
    doc: dict[str, Any]

    def lines(self) -> list[tuple[str, str]]:
        prov = self.doc.get("provenance", {})
        status = learning_status(self.doc)
        trained = isinstance(prov.get("train_seconds"), (int, float))
        return [
            ("data", str(prov.get("data", ""))),
            ("backbone", str(prov.get("backbone", ""))),
            ("weights", str(prov.get("weights", ""))),
            ("profile", str(prov.get("profile", ""))),
            ("seeds", ", ".join(map(str, prov.get("seeds", []))) or "–"),
            ("selection split", str(prov.get("selection_split", ""))),
            ("commit", str(prov.get("commit", ""))),
            ("date", str(prov.get("date", "–"))),
            ("environment", ", ".join(f"{k} {v}" for k, v in prov["environment"].items())
             if isinstance(prov.get("environment"), Mapping) else "–"),
            ("wall time", f"{_minutes(prov.get('wall_seconds'))} (this notebook, up to writing its report)"),
            ("training time", f"{_minutes(prov.get('train_seconds'))} (the runs behind the numbers: trained once, "
                              "then read from the run cache)" if trained else "none (nothing is trained here)"),
            ("status", status["verdict"] + (f": {status['detail']}" if status["detail"] else "")),
            ("report data", f"{self.doc.get('notebook', '')}.json, beside this report"),
        ]

    def _repr_html_(self) -> str:
        prov = self.doc.get("provenance", {})
        # notebook_wall_seconds (execution + conversion, added after this block rendered) is not a second clock
        shown = {"profile", "data", "backbone", "weights", "seeds", "selection_split", "commit", "wall_seconds",
                 "train_seconds", "date", "environment", "notebook_wall_seconds"}
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(v)}</td></tr>" for k, v in self.lines())
        more = "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(v if isinstance(v, str) else json.dumps(v))}"
                       "</li>" for k, v in prov.items() if k not in shown)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.doc.get("notes", []))
        return (f"<div class='idckit-provenance'><h2>Provenance</h2><table>{rows}</table>"
                + (f"<details><summary>every provenance field</summary><ul>{more}</ul></details>" if more else "")
                + (f"<h2>Notes</h2><ul class='idckit-notes'>{notes}</ul>" if notes else "") + "</div>")

    def __repr__(self) -> str:
        text = [f"{k}: {v}" for k, v in self.lines()]
        notes = self.doc.get("notes", [])
        return "\n".join(["Provenance", *text] + (["", "Notes", *(f"- {n}" for n in notes)] if notes else []))


def report_summary(path: str | Path) -> ReportSummary:
    """The provenance block and interpretive notes of the report at ``path`` (as :func:`write_report` wrote it);
    every notebook ends with it."""
    return ReportSummary(read_report(path))
