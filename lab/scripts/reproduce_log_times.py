"""Per-job wall seconds from the console log of one or more `make reproduce` invocations over the same run cache
(a run resumed after a kill): each job counts in the invocation that did its work, not in the later ones that found
it cached. The output's ``costs`` is the table lab/scripts/project_reproduce.py takes.

    python -m lab.scripts.reproduce_log_times reproduce.log [--paused SECONDS JOB ...] > times.json

``--paused`` subtracts a stretch the whole run was stopped (SIGSTOP) from the jobs that were running through it.
A job killed part-way and resumed from its checkpoint counts only its resumed part: such jobs are listed under
``resumed`` (those a later invocation still had to finish).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

INVOKED = "-m idckit.cli reproduce"
STARTED = re.compile(r"\[(?P<job>[^\]]+)\] started ")
DONE = re.compile(r"\[(?P<job>[^\]]+)\] ok in (?P<s>\d+) s$")
PREPARED = re.compile(r"\[prepare\] (?P<step>[^\]]+): (?P<s>\d+) s$")


def parse(text: str) -> dict:
    """``costs`` (job -> seconds, the largest over invocations), ``invocations`` and ``resumed``."""
    costs: dict[str, float] = {}
    running: set[str] = set()          # started and not done in the current invocation
    killed: set[str] = set()           # running when an invocation ended
    resumed: list[str] = []
    invocations = 0
    for line in text.replace("\r", "\n").splitlines():
        line = line.rstrip()
        if INVOKED in line:
            invocations += 1
            killed |= running
            running = set()
        elif m := STARTED.search(line):
            running.add(m["job"])
        elif m := DONE.search(line) or PREPARED.search(line):
            job = m.groupdict().get("job") or f"prepare {m['step']}"
            running.discard(job)
            s = float(m["s"])
            if job in killed and s > 0 and job not in resumed:
                resumed.append(job)
            costs[job] = max(costs.get(job, 0.0), s)
    return {"costs": costs, "invocations": invocations, "resumed": resumed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--paused", nargs="+", metavar=("SECONDS", "JOB"),
                    help="seconds the run was stopped, then the jobs running through the stop")
    a = ap.parse_args(argv)
    out = parse(a.log.read_text(errors="replace"))
    if a.paused:
        seconds, jobs = float(a.paused[0]), a.paused[1:]
        for job in jobs:
            out["costs"][job] = round(out["costs"][job] - seconds, 1)
        out["paused"] = {"seconds": seconds, "jobs": jobs}
    out["lane_seconds"] = round(sum(out["costs"].values()), 1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
