"""How far do more training minutes move the cpu-profile captioners? Val CIDEr-D against minutes of training.

The cpu profile's first aim is CIDEr-D >= 100 on SynthCLEVR-Change; where its budget cannot reach that, a curve
of CIDEr-D against training minutes shows what does. This script trains ONE captioner of the cpu profile for
longer than the table notebooks do (same data, same model, same cached pre-training / stand-in CLIP; only the
step budget, the lr decay points and the eval interval change), records val CIDEr-D at every evaluation, decodes
test at the val-selected step and counts distinct test captions (a collapsed run writes one sentence for all).

    .venv/bin/python -m lab.scripts.budget_curve pcl --steps 1800 --threads 1
    .venv/bin/python -m lab.scripts.budget_curve clip4idc --steps 3000 --threads 1
    .venv/bin/python -m lab.scripts.budget_curve --plot          # lab/notes/img/budget_curve.png from the JSONs
    .venv/bin/python -m lab.scripts.budget_curve pcl --data-root DIR --train-fraction 0.25   # a data-size point
    .venv/bin/python -m lab.scripts.budget_curve pcl --data-root DIR --distractor-weight 5   # a louder judge loss
    .venv/bin/python -m lab.scripts.budget_curve pcl --data-root DIR --pretrain-steps 1000    # more pre-training

Each run writes ``lab/records/budget_curve/budget_curve_<model>[_<data>_f<fraction>[_dw<weight>][_pt<steps>]].json``
(overrides, history, test metrics, diversity, wall time, commit, training pairs); ``--plot`` draws every such
JSON into one figure, one line per model and training-set size. ``--train-fraction`` (IDC-PCL only) keeps a
seeded share of the training before-images, each with both its pairs; val and test stay whole, so the points of
a data-size axis are scored on the same pairs. The runs are cached like every other run, so a re-run with the same
arguments only re-reads them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from idckit.fileio import write_json

from lab.scripts import BUDGET_CURVE, NOTES_IMG


def _overrides(model: str, steps: int, eval_every: int, minutes: float | None, train_fraction: float = 1.0,
               distractor_weight: float | None = None, pretrain_steps: int | None = None) -> dict:
    train = {"max_steps": steps, "eval_every": eval_every}
    if minutes:
        train["max_minutes"] = minutes
    if model == "pcl":
        # the cpu profile halves the lr once, at step 150 of 300; keep that shape over the longer run
        train["decay_every"] = max(1, steps // 2)
        out = {"finetune": {"train": train}}
        if train_fraction != 1:
            out["train_fraction"] = train_fraction
        if distractor_weight is not None:
            out["finetune"]["distractor_weight"] = distractor_weight
        if pretrain_steps is not None:
            out["pretrain"] = {"train": {"max_steps": pretrain_steps}}
        return out
    if train_fraction != 1 or distractor_weight is not None or pretrain_steps is not None:
        raise SystemExit("--train-fraction, --distractor-weight and --pretrain-steps are implemented for IDC-PCL only "
                         "(python -m lab.scripts.budget_curve pcl ...)")
    return {"caption": {"train": train}}


def _json_name(model: str, data_root: Path | None, train_fraction: float,
               distractor_weight: float | None = None, pretrain_steps: int | None = None) -> str:
    suffix = ("" if distractor_weight is None else f"_dw{distractor_weight:g}") + \
        ("" if pretrain_steps is None else f"_pt{pretrain_steps}")
    if data_root is None and train_fraction == 1 and not suffix:
        return f"budget_curve_{model}.json"     # the profile's default data: the name earlier curves have
    data = Path(data_root).name if data_root else "default"
    return f"budget_curve_{model}_{data}_f{train_fraction:g}{suffix}.json"


def text_baseline(dataset, train_fraction: float = 1.0, split: str = "val") -> dict:
    """The most frequent training caption written for every ``split`` pair, scored like the curve (no images).

    Drawn beside each curve for scale: on SynthCLEVR-Change a constant sentence already earns a lot of CIDEr-D,
    so a captioner is only looking at the images once it is above this line. Fit on the same (sub-sampled)
    training pairs the captioner saw."""
    from idckit.eval.baselines import MostFrequentCaption
    from idckit.eval.captions import evaluate_pairs
    from idckit.text.pcl_inputs import subsample_by_before

    train = subsample_by_before(dataset.pairs("train", check_images=False), train_fraction)
    pairs = dataset.pairs(split, check_images=False)
    base = MostFrequentCaption().fit(train)
    scores = evaluate_pairs(dataset.references(split), base.predict(pairs), dataset.types(split), meteor=False)
    return {"name": base.name, "caption": base.caption, "split": split,
            "CIDEr-D": scores["total"]["CIDEr-D"], "CIDEr-D_semantic": scores["semantic"]["CIDEr-D"]}


def run(model: str, steps: int, eval_every: int, minutes: float | None, threads: int, seed: int, *,
        profile: str = "cpu", out_dir: Path = BUDGET_CURVE, data_root: Path | None = None,
        runs_dir: Path | None = None, train_fraction: float = 1.0, distractor_weight: float | None = None,
        pretrain_steps: int | None = None) -> dict:
    import torch

    from idckit.experiments.analytics import output_diversity
    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    overrides = _overrides(model, steps, eval_every, minutes, train_fraction, distractor_weight, pretrain_steps)
    t0 = time.time()
    if model == "pcl":
        from idckit.experiments import pcl
        s = pcl.setup(profile, data_root, runs_dir=runs_dir, overrides=overrides, progress=False)
        r = pcl.run_variant(s, "full", seed)
        train_pairs = len(pcl.loaded_data(s).splits["train"])
        extras = ([f"distractor loss x{distractor_weight:g}"] if distractor_weight is not None else []) + \
            ([f"{pretrain_steps} pre-training steps"] if pretrain_steps is not None else [])
        label = f"IDC-PCL (full, cpu model{''.join(', ' + e for e in extras)})"
    else:
        from idckit.experiments import clip4idc
        s = clip4idc.setup(profile, data_root, runs_dir=runs_dir, overrides=overrides, progress=False)
        r = clip4idc.run_variant(s, "clip4idc", seed)
        train_pairs = len(clip4idc.loaded_data(s).splits["train"])
        label = "CLIP4IDC (cpu captioner, stand-in CLIP)"
    diversity = output_diversity(s.runs_dir, [r])[0]
    out = {"model": model, "label": label, "profile": profile, "data": "SynthCLEVR-Change (synthetic)",
           "overrides": overrides, "threads": threads, "seed": seed, "run": r["run"],
           "best_step": r.get("best_step"), "history": r.get("history", []),
           "test_total": r["test"]["total"], "test_semantic": r["test"].get("semantic"),
           "distinct_test_captions": diversity, "train_seconds": r["train_seconds"], "train_pairs": train_pairs,
           "train_fraction": train_fraction, "distractor_weight": distractor_weight,
           "pretrain_steps": pretrain_steps, "pretrain_seconds": r.get("pretrain_seconds"),
           "data_root": str(s.data.root),
           "text_baseline": text_baseline(s.data.dataset(), train_fraction),
           "wall_seconds": round(time.time() - t0, 1), "commit": git_commit()}
    path = Path(out_dir) / _json_name(model, data_root, train_fraction, distractor_weight, pretrain_steps)
    write_json(path, out, indent=1)
    print(f"{label}: best val step {out['best_step']}, test CIDEr-D {100 * out['test_total']['CIDEr-D']:.1f}, "
          f"{diversity['distinct']} distinct captions for {diversity['pairs']} test pairs; wrote {path}")
    return out


def _data_name(d: dict) -> str:
    """A short name for a curve's data: the synthetic before-image count, e.g. 'n8000'."""
    name = Path(d.get("data_root", "")).name
    return next((part for part in name.split("-") if part[:1] == "n" and part[1:].isdigit()), name or "default")


def _label(d: dict) -> str:
    if not d.get("train_pairs"):
        return d["label"]
    return f'{d["label"]}: {d["train_pairs"]:,} train pairs ({_data_name(d)} data)'


def plot(out: Path, reports: Path = BUDGET_CURVE):
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    import seaborn as sns

    subsets = (("total", "CIDEr-D"), ("semantic pairs", "CIDEr-D_semantic"))
    rows, baselines, profiles = [], {}, set()
    for path in sorted(Path(reports).glob("budget_curve_*.json")):
        d = json.loads(path.read_text())
        profiles.add(d["profile"])
        for h in d["history"]:
            for subset, key in subsets:
                if key in h:
                    rows.append({"model": _label(d), "minutes": h["minutes"], "val": subset,
                                 "val CIDEr-D (x100)": 100 * h[key]})
        if d.get("text_baseline"):
            who = f'{_data_name(d)}, {d["train_pairs"]:,} train pairs' if d.get("train_pairs") else _data_name(d)
            baselines[who] = {subset: round(100 * d["text_baseline"][key], 1) for subset, key in subsets}
    if not rows:
        sys.exit(f"no budget_curve_*.json in {reports} yet: run a model first")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows)
    present = list(dict.fromkeys(df["val"]))
    fig, axes = plt.subplots(1, len(present), figsize=(7 * len(present), 5), squeeze=False)
    models = list(dict.fromkeys(df["model"]))
    # one colour per curve in both panels, also when a curve has no point in one (older runs lack semantic CIDEr-D)
    palette = dict(zip(models, sns.color_palette(n_colors=len(models))))
    for ax, subset in zip(axes[0], present):
        sns.lineplot(data=df[df["val"] == subset], x="minutes", y="val CIDEr-D (x100)", hue="model", marker="o",
                     hue_order=models, palette=palette, ax=ax)
        ax.set_title(f"val CIDEr-D, {subset}", fontsize=10)
        # the text-only baseline of each curve's own val split, for scale: above it, a model uses the images.
        # Dashed lines here, their values in the legend (several sit within a point of each other).
        for values in baselines.values():
            ax.axhline(values[subset], ls="--", c="grey", lw=1)
        ax.get_legend().remove()
    fig.suptitle(f"SynthCLEVR-Change (synthetic), {'/'.join(sorted(profiles))} profile: CIDEr-D against training "
                 "minutes and training-set size", fontsize=11)
    handles, labels = axes[0][0].get_legend_handles_labels()   # one legend under both panels, off the lines
    from matplotlib.lines import Line2D

    for who, v in sorted(baselines.items()):
        handles.append(Line2D([], [], ls="--", c="grey", lw=1))
        labels.append(f"most frequent training caption, no image ({who}; val): "
                      f"{v['total']:.1f} total, {v['semantic pairs']:.1f} semantic")
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 1) // 2), 1, 1))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return fig


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", choices=("pcl", "clip4idc"))
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--minutes", type=float, default=None, help="wall budget; the run stops at the next step")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default="cpu", help="smoke for a test of the script itself")
    p.add_argument("--data-root", type=Path, default=None, help="default: the profile's synthetic data")
    p.add_argument("--train-fraction", type=float, default=1.0,
                   help="IDC-PCL: share of the training before-images to train on (val/test stay whole)")
    p.add_argument("--distractor-weight", type=float, default=None,
                   help="IDC-PCL: weight of the distractor-judging loss in fine-tuning (default: the config's, 1)")
    p.add_argument("--pretrain-steps", type=int, default=None,
                   help="IDC-PCL: pre-training steps (default: the profile's, 200 at cpu)")
    p.add_argument("--runs-dir", type=Path, default=None, help="default: runs/")
    p.add_argument("--out-dir", type=Path, default=BUDGET_CURVE,
                   help="where the JSONs go (and --plot reads)")
    p.add_argument("--plot", action="store_true")
    a = p.parse_args(argv)
    if a.model:
        run(a.model, a.steps, a.eval_every, a.minutes, a.threads, a.seed, profile=a.profile, out_dir=a.out_dir,
            data_root=a.data_root, runs_dir=a.runs_dir, train_fraction=a.train_fraction,
            distractor_weight=a.distractor_weight, pretrain_steps=a.pretrain_steps)
    if a.plot:
        plot(NOTES_IMG / "budget_curve.png" if a.out_dir == BUDGET_CURVE
             else a.out_dir / "budget_curve.png", a.out_dir)
    if not a.model and not a.plot:
        p.error("give a model to train, --plot, or both")


if __name__ == "__main__":
    main()
