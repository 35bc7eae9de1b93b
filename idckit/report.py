"""Notebook reports: the paper's numbers as data, the kit's rows with provenance, side-by-side tables.

Every notebook writes ``<report_dir>/<notebook>.json``::

    {"notebook": "table2_clevr_change", "table": "idcpcl.table2", "scale": "x100",
     "rows":  [{"model", "variant", "split", "metrics": {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D", ...}}, ...],
     "paper": [...the paper's rows, from idckit/experiments/paper_numbers.json...],
     "provenance": {"profile", "data", "data_version", "backbone", "weights", "seeds", "selection_split",
                    "commit", "wall_seconds", ...}}

Metrics in reports are on the papers' scale (x100: BLEU-4 51.2, CIDEr-D 128.9); pycocoevalcap returns 0-1
(and CIDEr-D ~1.3), so :func:`to_paper_scale` converts. Tests, the README table and the index page read
these files; nobody types a result by hand.
"""
from __future__ import annotations

import json
import math
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from idckit import fileio
from idckit.errors import ConfigError

PAPER_NUMBERS = Path(__file__).parent / "experiments" / "paper_numbers.json"
CAPTION_METRICS: tuple[str, ...] = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
HEADLINE_METRICS: tuple[str, ...] = ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
PROVENANCE_KEYS: tuple[str, ...] = ("profile", "data", "data_version", "backbone", "weights", "seeds",
                                    "selection_split", "commit", "wall_seconds")


@lru_cache(maxsize=1)
def _paper() -> dict:
    return json.loads(PAPER_NUMBERS.read_text(encoding="utf-8"))["tables"]


def paper_table(table_id: str) -> dict:
    """The published table ``table_id`` (e.g. ``"idcpcl.table2"``), rows on the paper's x100 scale."""
    tables = _paper()
    if table_id not in tables:
        raise ConfigError(f"unknown paper table {table_id!r}; known: {', '.join(tables)}")
    return tables[table_id]


def to_paper_scale(metrics: Mapping[str, float]) -> dict[str, float]:
    """pycocoevalcap's scale (0-1; CIDEr-D ~0-10) -> the papers' x100 scale. Retrieval metrics pass through."""
    return {k: (100.0 * v if k in CAPTION_METRICS else v) for k, v in metrics.items()}


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
    return commit_of(Path(__file__).resolve().parents[1])


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


def write_report(report_dir: str | Path, notebook: str, table: str, rows: Sequence[Mapping[str, Any]],
                 provenance: Provenance | Mapping[str, Any], *, notes: Sequence[str] = (),
                 headline: Mapping[str, Any] | None = None, title: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> Path:
    """Validate and atomically write ``<report_dir>/<notebook>.json``; returns the path.

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
    paper = paper_table(table)["rows"] if table in _paper() else []
    if title is None:
        title = paper_table(table)["title"] if table in _paper() else table
    if headline is not None and headline.get("kit") is not None:
        _check_finite([{"metrics": {"headline": headline["kit"]}}], f"report {notebook} headline")
    doc = {"notebook": notebook, "table": table, "title": title, "scale": "x100", "rows": rows, "paper": paper,
           "headline": dict(headline) if headline else {}, "provenance": prov, "notes": list(notes),
           **(dict(extra) if extra else {})}
    path = Path(report_dir) / f"{notebook}.json"
    fileio.write_json(path, doc, indent=1)
    return path


def read_report(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def side_by_side(rows: Sequence[Mapping[str, Any]], paper_rows: Sequence[Mapping[str, Any]],
                 metrics: Sequence[str] = HEADLINE_METRICS, *, kit_label: str = "idckit (this run)",
                 paper_label: str = "paper (real data)"):
    """One DataFrame: the paper's rows, then the kit's, with a ``source`` column so they are never mixed."""
    import pandas as pd

    def frame(rs, source):
        recs = []
        for r in rs:
            rec = {"source": source, "model": r.get("model", ""), "variant": r.get("variant", "")}
            rec.update({m: r.get("metrics", {}).get(m, float("nan")) for m in metrics})
            recs.append(rec)
        return pd.DataFrame.from_records(recs, columns=["source", "model", "variant", *metrics])

    return pd.concat([frame(paper_rows, paper_label), frame(rows, kit_label)], ignore_index=True)
