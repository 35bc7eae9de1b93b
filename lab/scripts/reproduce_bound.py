"""The fastest `make reproduce` the cpu profile's levers could give: every lever not yet shown to cost quality is taken
as if it cost none, at a generous speed-up, over the measured per-job costs, and the kit's own schedule plays the
result (`project_reproduce`). A bound, not a plan: if even this misses a wall-time target, no choice among those
levers meets it without dropping runs.

    python -m lab.scripts.reproduce_bound RECORD [--whole JOB=SECONDS ...] [--seeds 0 1 2] [--birds-steps 1000]
        [--jobs 2]

RECORD is a timing record with a ``costs`` table (``reproduce_log_times.py``'s); ``--whole`` replaces the cost of a
job that record counts only in part (a resumed one); ``--seeds`` are the birds seeds table 5 keeps (seed 0 always
runs: table 1 reads it). Prints a JSON record: the factors, the scaled costs, the work and the projected wall.
"""
from __future__ import annotations

import argparse
import json

from idckit.reproduce import scheduler
from lab.scripts.project_reproduce import graph, load_costs

#: seconds of one birds chain's stages in the measured run (index of the 554b67c regeneration: 10 fine-tunings in
#: 99.4 min, 10 pre-trainings in 19.1 min, 2 CUB stages in 2.7 min)
BIRDS_FINETUNE, BIRDS_PRETRAIN, BIRDS_CUB = 596.0, 115.0, 81.0

#: what each lever is taken to give, and the measurement behind it (the quiet bench of 2026-11-27 in
#: lab/records/bench/, docs/cpu_profile.md)
FACTORS = {
    "birds": "fine-tuning at --birds-steps of 1000 steps in bf16 autocast (1.19x a step), pre-training and the "
             "CUB stage in bf16 (1.10x)",
    "pcl": "x0.9, as if fewer val decodings cost nothing (bf16 gives 0.97x a step, torch.compile 0.69x, 500 "
           "fine-tuning steps lose semantic CIDEr-D)",
    "duda": "bf16 autocast, 1.25x a step",
    "clip4idc": "x0.5 for every CLIP4IDC notebook: captioner in bf16 (1.43x a step), one stand-in CLIP instead of "
                "two, collapsed captioners stopped at step 100, table 7's adaptations halved",
    "hard twin": "x0.5 for table2_clevr_change's own work (the jitter-1.0 runs)",
    "prepare": "x0.8 for scenes and features (smaller renders)",
}


def scale(costs: dict[str, float], seeds: tuple[int, ...], birds_steps: int = 1000) -> dict[str, float]:
    """``costs`` with every lever of :data:`FACTORS` applied, the birds fine-tuned for ``birds_steps`` steps; birds
    chains of seeds not in ``seeds`` cost 0."""
    out = {}
    for job, s in costs.items():
        if "birds/" in job:
            seed = int(job.rsplit(" ", 1)[1])
            if seed != 0 and seed not in seeds:
                s = 0.0
            else:
                pre = BIRDS_PRETRAIN + (BIRDS_CUB if "birds/cub" in job else 0.0)
                s = s - BIRDS_FINETUNE - pre + BIRDS_FINETUNE * birds_steps / 1000 / 1.19 + pre / 1.10
        elif "pcl/" in job:
            s *= 0.9
        elif "duda/" in job:
            s /= 1.25
        elif job.startswith("clip4idc_") or job == "table2_clevr_change":
            s *= 0.5
        elif job.startswith("prepare"):
            s *= 0.8
        out[job] = round(s, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--whole", nargs="*", default=[], metavar="JOB=SECONDS")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--birds-steps", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    costs = load_costs(a.record)
    for item in a.whole:
        job, _, seconds = item.rpartition("=")
        costs[job] = float(seconds)
    scaled = scale(costs, tuple(a.seeds), a.birds_steps)
    names, after = graph()
    sched = scheduler.simulate(names, {n: scaled.get(n, 0.0) for n in names}, a.jobs, after)
    wall = max(t1 for _, _, t1 in sched.values())
    print(json.dumps({
        "what": f"bound: the levers below taken as if each kept every learned number; table 5's birds seeds "
                f"{a.seeds}, birds fine-tuning {a.birds_steps} steps",
        "from": a.record, "whole": a.whole, "factors": FACTORS,
        "work_lane_min": round(sum(costs.values()) / 60), "bound_work_lane_min": round(sum(scaled.values()) / 60),
        "bound_wall_min": round(wall / 60), "lanes": a.jobs, "costs": scaled}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
