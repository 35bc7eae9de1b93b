"""Projected wall time of `make reproduce` at the cpu profile over a table of per-job costs given by hand (single-thread
lane seconds): the kit's own schedule (:func:`idckit.reproduce.scheduler.simulate`, the real job graph of prepare
steps, training jobs and notebooks). `idckit reproduce --plan` does the same from the last recorded times; this script
asks "what if a job cost this much".

    python -m lab.scripts.project_reproduce COSTS.json [--jobs 2] [--speed 1.0]

COSTS.json (or a record whose ``costs`` is that table) maps job names (``prepare scenes clevr-change``, ``train birds/b2w seed 0``, a notebook's own time beyond
its training jobs) to seconds; a job it does not name costs 0 and is listed. ``--speed`` divides every cost (a lane
at 2 threads, say). Prints the schedule and the projected wall time.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from idckit.reproduce import runner, scheduler


def graph():
    """The real job graph of every notebook (prepare steps, training jobs, notebooks) and what each waits for."""
    names = [p.stem for p in runner.discover()]
    order, _, after, _ = scheduler.lane_jobs(names, profile="cpu", roots=None, runs_dir=Path("runs"),
                                             report_dir=Path("reports"))
    return order, after


def load_costs(path: str | Path) -> dict[str, float]:
    """Job -> seconds from a record with a ``costs`` table (reproduce_log_times.py's) or from the table alone."""
    doc = json.loads(Path(path).read_text())
    return {k: float(v) for k, v in doc.get("costs", doc).items() if not k.startswith("_")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("costs")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--speed", type=float, default=1.0)
    a = ap.parse_args(argv)
    raw = load_costs(a.costs)
    names, after = graph()
    cost = {n: raw.get(n, 0.0) / a.speed for n in names}
    sched = scheduler.simulate(names, cost, a.jobs, after)
    for n, (lane, t0, t1) in sorted(sched.items(), key=lambda kv: kv[1][1]):
        print(f"lane {lane}  {t0 / 60:6.1f} - {t1 / 60:6.1f} min  {n}")
    missing = [n for n in names if n not in raw]
    total = sum(cost.values())
    wall = max(t1 for _, _, t1 in sched.values())
    print(f"\nwork {total / 60:.0f} lane-min over {a.jobs} lane(s); projected wall {wall / 60:.0f} min "
          f"(perfect packing {total / a.jobs / 60:.0f})")
    if missing:
        print("no cost given (0):", ", ".join(missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
