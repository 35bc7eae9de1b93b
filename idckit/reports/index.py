"""``reports/index.html``: one row per report, grouped by paper, each the same :class:`idckit.reports.card.Summary`
the report's card and the README's table print: the kit's headline beside its no-learning baseline and the
paper's number, the status of the headline run (and of its hard-data twin), short data keys explained below the
table. Sized to fit a 1024 px window."""
from __future__ import annotations

import html
import json
from pathlib import Path

from idckit import fileio
from idckit.reports.report import TIMES_KEY
from idckit.reports.card import PAPERS, Summary, status_class, summary
from idckit.reports.format import fmt
from idckit.reports.status import STATUSES

COLUMNS = ("report", "headline", "idckit", "no-learning baseline", "paper", "status", "data", "seeds", "time")


def _docs(report_dir: Path) -> list[dict]:
    out = []
    for jp in sorted(report_dir.glob("*.json")):
        if jp.name == "status.json":
            continue
        doc = json.loads(jp.read_text())
        if isinstance(doc, dict) and "notebook" in doc:
            out.append(doc)
    return out


def data_keys(summaries: list[Summary]) -> dict[str, str]:
    """``{data + backbone description: short key}``: D1, D2, ... in order of first appearance."""
    keys: dict[str, str] = {}
    for s in summaries:
        keys.setdefault(f"{s.data}; backbone {s.backbone}", f"D{len(keys) + 1}")
    return keys


def _minutes(seconds) -> str:
    return f"{seconds / 60:.1f} min" if isinstance(seconds, (int, float)) else "–"


def _status_cell(s: Summary, run_status: str) -> str:
    e = html.escape
    cell = f'<span class="{status_class(s.status)}">{e(s.status.verdict)}</span>'
    if s.status.detail:
        cell += f'<br><span class="detail">{e(s.status.detail)}</span>'
    if s.hard is not None:
        cell += (f'<br>hard data: <span class="{status_class(s.hard)}">{e(s.hard.verdict)}</span>')
    if run_status in ("stale", "failed"):
        cell = '<span class="stale">stale: last run failed</span><br>' + cell
    return cell


def time_section(times: object) -> str:
    """The "Time" section: where the last ``idckit reproduce`` spent its wall time (status.json's
    :data:`idckit.reports.report.TIMES_KEY`: the prepare steps, training per run kind, each notebook), "" when none."""
    if not isinstance(times, dict):
        return ""
    e = html.escape

    def rows(pairs) -> str:
        return "".join(f"<tr><td>{e(str(a))}</td><td>{b}</td></tr>" for a, b in pairs)

    lanes = times.get("jobs")
    how = f"{lanes} notebook(s) at once" + (f", {times['threads']} torch thread(s) each" if times.get("threads")
                                             else "")
    prep = [(p.get("step"), _minutes(p.get("seconds")) + ("" if p.get("ok", True) else " (failed)"))
            for p in times.get("prepare", [])]
    train = [(f"{k} ({v.get('runs')} run(s))", _minutes(v.get("seconds")))
             for k, v in sorted(times.get("training", {}).items(), key=lambda kv: -kv[1].get("seconds", 0))]
    nbs = sorted(times.get("notebooks", {}).items(), key=lambda kv: -kv[1])
    return f"""<h2>Time</h2>
<p class="note">The last <code>idckit reproduce</code> ({e(str(times.get("when", "")))}, profile
{e(str(times.get("profile", "")))}): <b>{_minutes(times.get("total_seconds"))}</b> wall in all, {e(how)}. Training
time is the runs it trained (cached runs cost nothing); runs of one lane overlap the other lane's.</p>
<table class="time"><thead><tr><th>prepare step</th><th>wall</th></tr></thead><tbody>{rows(prep)}</tbody></table>
<table class="time"><thead><tr><th>training, per run kind</th><th>total</th></tr></thead><tbody>{rows(train)}
</tbody></table>
<table class="time"><thead><tr><th>notebook</th><th>wall</th></tr></thead><tbody>{rows((n, _minutes(v)) for n, v in nbs)}
</tbody></table>
"""


def render(report_dir: str | Path) -> str:
    report_dir = Path(report_dir)
    status_path = report_dir / "status.json"
    run_status = json.loads(status_path.read_text()) if status_path.is_file() else {}
    docs = _docs(report_dir)
    sums = [summary(d) for d in docs]
    keys = data_keys(sums)
    e = html.escape
    groups: dict[str, list[str]] = {}
    for doc, s in zip(docs, sums):
        st = run_status.get(s.notebook, {}).get("status", "ok")
        cells = {
            "report": (f'<a href="{e(s.notebook)}.html">{e(s.notebook).replace("_", "_<wbr>")}</a>'
                       f'<br><span class="detail">{e(s.title)}</span>'),
            "headline": e(s.label),
            "idckit": e(s.kit_text()),
            "no-learning baseline": ("–" if not s.baseline else
                                     f'{e(fmt(s.baseline["kit"], s.metric))}<br><span class="detail">'
                                     f'{e(s.baseline["label"])}</span>'),
            "paper": e(s.paper_text()),
            "status": _status_cell(s, st),
            "data": f'<span title="{e(s.data)}">{keys[f"{s.data}; backbone {s.backbone}"]}</span>',
            "seeds": e(", ".join(map(str, s.seeds))),
            "time": (f'{_minutes(s.wall_seconds)}<br><span class="detail">training '
                     f'{_minutes(s.train_seconds)}</span>'),
        }
        row = "<tr>" + "".join(f'<td class="c-{c.split()[0]}">{cells[c]}</td>' for c in COLUMNS) + "</tr>"
        groups.setdefault(s.paper, []).append(row)
    order = [*PAPERS.values(), "the kit"]
    head = "".join(f'<th class="c-{c.split()[0]}">{c}</th>' for c in COLUMNS)
    body = "\n".join(f'<tr class="group"><th colspan="{len(COLUMNS)}">{e(p)}</th></tr>\n' + "\n".join(groups[p])
                     for p in sorted(groups, key=lambda p: order.index(p) if p in order else len(order)))
    legend = "".join(f"<li><b>{k}</b>: {e(d)}</li>" for d, k in keys.items())
    commits = sorted({s.commit for s in sums})
    status_words = "; ".join(f"<i>{e(w)}</i> = {e(m)}" for w, m in STATUSES.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idckit reports</title>
<style>
 body {{ font-family: system-ui, sans-serif; margin: 1rem; color: #222; max-width: 990px; }}
 table {{ border-collapse: collapse; font-size: 0.82rem; width: 100%; table-layout: auto; }}
 th, td {{ border: 1px solid #ccc; padding: 0.25rem 0.4rem; text-align: left; vertical-align: top; }}
 th {{ background: #f0f0f0; }} th.c-status {{ background: #dde8f5; }}
 tr.group th {{ background: #e4e4e4; font-size: 0.9rem; }}
 td.c-idckit, td.c-paper {{ text-align: right; white-space: nowrap; }}
 td.c-no-learning {{ text-align: right; max-width: 9rem; }}
 .stale, .flag {{ color: #b00; font-weight: bold; }} .learned {{ color: #070; font-weight: bold; }}
 .ran {{ color: #555; font-weight: bold; }} .detail {{ font-size: 0.75rem; color: #555; }}
 p.note, ul.legend {{ font-size: 0.85rem; }}
 table.time {{ width: auto; display: inline-table; margin: 0 1rem 0.5rem 0; vertical-align: top; }}
</style></head><body>
<h1>idckit: reproduced tables</h1>
<p class="note"><b>idckit</b> is the kit's own measurement (mean ± sd where several seeds ran);
<b>no-learning baseline</b> is the best caption chosen without training a model on the same test pairs (chance for
retrieval); <b>paper</b> is the published number on the real dataset, never mixed in. <b>status</b> is the
headline run's only (never a baseline's or a side row's), the first that applies of: {status_words}; only
<span class="learned">green</span> means the model does the task beyond the yardsticks; the hard-data twin has its
own status.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
<p class="note"><b>data</b> (hover a key for the full text):</p>
<ul class="legend">{legend}</ul>
<p class="note">Synthetic data (SynthCLEVR-Change, SynthSpot-the-Diff, SynthIER, SynthBirds) has the real
dataset's format: the rows show the pipeline end to end, not a real-data reproduction. Commit(s):
{e(", ".join(commits))}.</p>
{time_section(run_status.get(TIMES_KEY))}</body></html>
"""


def write_index(report_dir: str | Path) -> Path:
    path = Path(report_dir) / "index.html"
    fileio.write_text(path, render(report_dir))
    return path
