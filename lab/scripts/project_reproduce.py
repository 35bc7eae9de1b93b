"""Projected wall time of `make reproduce` at the cpu profile: the kit's own lane schedule (longest chain first,
:func:`idckit.reproduce.next_ready`, the real job graph of prepare steps, training jobs and notebooks) played in
simulated time over a table of per-job costs in single-thread lane seconds.

    python -m lab.scripts.project_reproduce COSTS.json [--jobs 2] [--speed 1.0]

COSTS.json maps job names (``prepare scenes clevr-change``, ``train birds/b2w seed 0``, a notebook's own time beyond
its training jobs) to seconds; a job it does not name costs 0 and is listed. ``--speed`` divides every cost (a lane
at 2 threads, say). Prints the schedule and the projected wall time.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from idckit import reproduce as rp


def graph(jobs: int):
    names = [p.stem for p in rp.discover()]
    units, after, _ = rp.training_jobs(names, {}, {})
    steps, step_after = rp.prepare_jobs(names, profile="cpu", roots=None, runs_dir=Path("runs"), units=units)
    after = {k: tuple(after.get(k, ())) + tuple(step_after.get(k, ())) for k in {*after, *step_after}}
    return steps + list(units) + names, after


def simulate(pending: list[str], cost: dict[str, float], after: dict, jobs: int) -> dict[str, tuple]:
    prio = rp.priorities(pending, cost, after)
    pending, finished, lanes, out, now, selected = list(pending), set(), {}, {}, 0.0, set(pending)
    while pending or lanes:
        while pending and len(lanes) < jobs:
            n = rp.next_ready(pending, finished, selected, prio, after)
            if n is None:
                break
            pending.remove(n)
            lane = min(set(range(jobs)) - {v[0] for v in lanes.values()})
            lanes[n] = (lane, now, now + cost.get(n, 0.0))
        n = min(lanes, key=lambda k: lanes[k][2])
        out[n] = lanes.pop(n)
        now = out[n][2]
        finished.add(n)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("costs")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--speed", type=float, default=1.0)
    a = ap.parse_args(argv)
    raw = {k: float(v) for k, v in json.loads(Path(a.costs).read_text()).items() if not k.startswith("_")}
    names, after = graph(a.jobs)
    cost = {n: raw.get(n, 0.0) / a.speed for n in names}
    sched = simulate(names, cost, after, a.jobs)
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
