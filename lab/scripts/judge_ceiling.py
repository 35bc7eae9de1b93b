"""What would it take to reach CIDEr-D 100? The distractor decision, measured two ways on one SynthCLEVR-Change set.

The budget curves (lab/scripts/budget_curve.py) show IDC-PCL learning to describe changes but never learning when
to say "no change": its distractor judge stays at chance. This script puts numbers on that:

1. **What the features allow.** ``eval.probe.difference_probe``, a logistic regression on sorted region distances, is
   trained on growing shares of the training pairs. Radius 0 compares each grid cell with the same cell of the other
   image; radius 2 compares it with its best match within 2 cells, which forgives the camera jitter.
2. **What a judge is worth.** A run's own test captions are gated by a simulated judge of accuracy p
   (``idckit.eval.judge_gate``): pairs called distractors get the most frequent training no-change sentence. Total
   CIDEr-D against p shows the judge accuracy the run's captioner would need for a target.

    .venv/bin/python -m lab.scripts.judge_ceiling --data-root data/synth-n8000 \\
        --run runs/pcl-finetune-790f644c6849 --checkpoint best last
    .venv/bin/python -m lab.scripts.judge_ceiling --plot        # lab/notes/img/judge_ceiling.png from the JSONs

Writes ``lab/records/budget_curve/judge_ceiling_<data>.json``. Neither paper contains this analysis. It diagnoses
this kit's runs, and every number comes from the run and the data named in the JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from idckit.fileio import write_json

from lab.scripts import BUDGET_CURVE, NOTES_IMG
ACCURACIES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def probe_rows(data_root: Path | None, fractions, radii, runs_dir: Path | None, profile: str) -> list[dict]:
    from idckit.eval.probe import difference_probe
    from idckit.experiments import pcl

    rows = []
    for f in fractions:
        s = pcl.setup(profile, data_root, runs_dir=runs_dir, overrides={"train_fraction": f}, progress=False)
        for r in radii:
            t = time.time()
            res = difference_probe(pcl.loaded_data(s), radius=r)
            rows.append({"train_fraction": f, **res, "seconds": round(time.time() - t, 1)})
            print(f"probe: {res['train_pairs']:>6} train pairs, radius {r}: test accuracy {res['test_accuracy']:.3f}")
    return rows


def gated_rows(data_root: Path | None, run_dir: Path, checkpoint: str, runs_dir: Path | None, profile: str,
               accuracies, seeds) -> dict:
    from idckit.eval.baselines import MostFrequentCaption
    from idckit.eval.judge_gate import judge_curve
    from idckit.experiments import pcl
    from idckit.tasks.pcl import predict

    cfg = json.loads((run_dir / "config.json").read_text())
    fraction = cfg.get("train_fraction", 1.0)
    s = pcl.setup(profile, data_root, runs_dir=runs_dir, overrides={"train_fraction": fraction}, progress=False)
    model, step = pcl.load_run(run_dir, checkpoint, device=s.device,
                               vocab=pcl.loaded_data(s).vocab)
    data = pcl.loaded_data(s)
    preds = predict(model, data, "test", batch_size=200, progress=True)
    train = set(data.splits["train"].pair_ids)      # the pairs the run trained on (its train_fraction)
    no_change = MostFrequentCaption().fit([p for p in s.data.dataset().pairs("train", check_images=False)
                                           if p.pair_id in train and not p.is_change]).caption
    test = data.splits["test"]
    rows = judge_curve(test.references, preds["captions"], dict(zip(test.pair_ids, test.types)), no_change,
                       accuracies, seeds)
    return {"run": run_dir.name, "checkpoint": checkpoint, "step": step, "train_pairs": len(data.splits["train"]),
            "distractor_weight": cfg["finetune"]["distractor_weight"], "no_change_sentence": no_change,
            "model_judge_accuracy": preds["judge_accuracy"],
            "distinct_test_captions": len(set(preds["captions"].values())), "rows": rows}


def run(data_root: Path | None, run_dirs, checkpoints=("best",), *, fractions=(0.125, 0.25, 0.5, 1.0), radii=(0, 2),
        seeds=(0, 1, 2), accuracies=ACCURACIES, threads: int = 2, profile: str = "cpu",
        runs_dir: Path | None = None, out_dir: Path = BUDGET_CURVE) -> dict:
    import torch

    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    t0 = time.time()
    out = {"data_root": str(data_root) if data_root else None, "profile": profile,
           "data": "SynthCLEVR-Change (synthetic)", "probe": probe_rows(data_root, fractions, radii, runs_dir, profile),
           "gated": [gated_rows(data_root, Path(r), c, runs_dir, profile, accuracies, seeds)
                     for r in run_dirs for c in checkpoints],
           "wall_seconds": None, "commit": git_commit()}
    out["wall_seconds"] = round(time.time() - t0, 1)
    name = Path(data_root).name if data_root else "default"
    path = Path(out_dir) / f"judge_ceiling_{name}.json"
    write_json(path, out, indent=1)
    for g in out["gated"]:
        perfect = next(r for r in g["rows"] if r["judge_accuracy"] == 1)
        print(f"{g['run']} ({g['checkpoint']}): own judge {g['model_judge_accuracy']:.3f}; with a perfect judge test "
              f"CIDEr-D {100 * perfect['CIDEr-D_total']:.1f} (semantic {100 * perfect['CIDEr-D_semantic']:.1f})")
    print(f"wrote {path}")
    return out


def plot(out: Path, reports: Path = BUDGET_CURVE):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    paths = sorted(Path(reports).glob("judge_ceiling_*.json"))
    if not paths:
        sys.exit(f"no judge_ceiling_*.json in {reports} yet: run the script on a dataset first")
    gated, probes, own = [], [], []
    for path in paths:
        d = json.loads(path.read_text())
        data = Path(d["data_root"]).name if d["data_root"] else "default data"
        for g in d["gated"]:
            label = f"{g['train_pairs']:,} train pairs, {g['checkpoint']} step {g['step']} ({g['run']})"
            if g["distractor_weight"] != 1:
                label += f", distractor loss x{g['distractor_weight']:g}"
            gated += [{"captions": label, "judge accuracy": r["judge_accuracy"],
                       "test CIDEr-D (x100)": 100 * r["CIDEr-D_total"]} for r in g["rows"]]
            own.append(g["model_judge_accuracy"])
        for p in d["probe"]:
            probes.append({"data": data, "training pairs": p["train_pairs"], "test accuracy": p["test_accuracy"],
                           "probe": f"region distances, radius {p['radius']}"})
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 7))
    sns.lineplot(data=pd.DataFrame(gated), x="judge accuracy", y="test CIDEr-D (x100)", hue="captions",
                 marker="o", errorbar="sd", ax=a)
    a.axhline(100, ls="--", c="grey", lw=1)
    a.text(0.99, 100.8, "the first aim: 100", color="grey", fontsize=8, ha="right",
           transform=a.get_yaxis_transform())
    a.axvspan(min(own), max(own), color="black", alpha=0.15, lw=0)
    a.text(max(own) + 0.004, 0.02, f"the runs' own judges: {min(own):.2f}-{max(own):.2f}", fontsize=7,
           rotation=90, va="bottom", transform=a.get_xaxis_transform())
    best = max(p["test accuracy"] for p in probes)
    a.axvline(best, ls=":", c="tab:red", lw=1)
    a.text(best + 0.004, 0.02, f"best feature probe: {best:.2f}", fontsize=7, rotation=90, va="bottom",
           color="tab:red", transform=a.get_xaxis_transform())
    a.set_title("test captions of a run gated by a simulated judge (an analysis, in neither paper; sd over 3 seeds)",
                fontsize=9)
    a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), title="captions of", title_fontsize=7)
    df = pd.DataFrame(probes)
    several = df["data"].nunique() > 1
    sns.lineplot(data=df, x="training pairs", y="test accuracy", hue="probe", style="data" if several else None,
                 marker="o", ax=b)
    b.axhline(0.5, ls="--", c="grey", lw=1)
    b.text(0.99, 0.505, "chance", color="grey", fontsize=8, ha="right", transform=b.get_yaxis_transform())
    b.set_xscale("log")
    ticks = sorted(df["training pairs"].unique())
    b.set_xticks(ticks, [f"{t:,}" for t in ticks])
    b.minorticks_off()
    b.set_title("change or distractor, from the features alone (logistic probe on sorted region distances, test)",
                fontsize=9)
    b.legend(fontsize=7)
    fig.suptitle("SynthCLEVR-Change (synthetic), efficientnet_lite0 features: what the distractor decision is worth "
                 "and what the features allow", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return fig


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, default=None, help="default: the profile's synthetic data")
    p.add_argument("--run", type=Path, action="append", default=[], help="a pcl-finetune run dir (repeatable)")
    p.add_argument("--checkpoint", choices=("best", "last"), nargs="+", default=["best"],
                   help="which weights of each run: best (val-selected), last, or both")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", default="cpu", help="smoke for a test of the script itself")
    p.add_argument("--runs-dir", type=Path, default=None, help="default: runs/")
    p.add_argument("--out-dir", type=Path, default=BUDGET_CURVE)
    p.add_argument("--plot", action="store_true")
    a = p.parse_args(argv)
    if a.run:
        run(a.data_root, a.run, a.checkpoint, fractions=a.fractions, threads=a.threads, profile=a.profile,
            runs_dir=a.runs_dir, out_dir=a.out_dir)
    if a.plot:
        plot(NOTES_IMG / "judge_ceiling.png" if a.out_dir == BUDGET_CURVE
             else a.out_dir / "judge_ceiling.png", a.out_dir)
    if not a.run and not a.plot:
        p.error("give --run RUN_DIR to measure, --plot, or both")


if __name__ == "__main__":
    main()
