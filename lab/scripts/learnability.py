"""Which SynthCLEVR-Change difficulty can the cpu profile learn? One point of the learnability study per call.

The faithful SynthCLEVR-Change moves the camera and the lamps of every after-image by CLEVR-Change's jitter (1.0 per
axis); at the cpu budget no captioner of the kit learns to tell a change from a distractor there. This script
measures, on a set generated at a given jitter (``idckit generate clevr-change --camera-jitter C --lamp-jitter L``):

- the cheap signal first: ``difference_probe`` (a logistic regression on grid-feature distances) at radius 0
  and 2: how separable changes and distractors are in the features alone;
- then IDC-PCL (full) trained for ``--steps`` fine-tuning steps at the cpu profile's model size: val/test judge
  accuracy, total / semantic / distractor CIDEr-D, distinct test captions, and the most-frequent-caption baseline
  on the same test pairs.

    .venv/bin/python -m lab.scripts.learnability run --data-root data/synth-cam0.25 --steps 1500 --eval-every 250
    .venv/bin/python -m lab.scripts.learnability plot             # lab/notes/img/learnability.png from the JSONs

Each run writes ``lab/records/learnability/pcl_<data>_s<steps>[_pt<steps>]_seed<seed><tag>.json`` (records before
2026-11-26 have no ``_seed``; their tags carry it); runs are cached like every other run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from idckit.fileio import write_json

from lab.scripts import LEARNABILITY as OUT, NOTES_IMG


def run(data_root: Path, steps: int, eval_every: int, threads: int, seed: int, runs_dir: Path | None,
        pretrain_steps: int | None, probe_only: bool, out_dir: Path = OUT, extra: dict | None = None,
        tag: str = "") -> dict:
    import torch

    from lab.scripts.budget_curve import text_baseline
    from idckit.eval.probe import difference_probe
    from idckit.experiments import pcl
    from idckit.experiments.analytics import output_diversity
    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    info = json.loads((Path(data_root) / "synth_info.json").read_text())
    train = {"max_steps": steps, "eval_every": eval_every, "decay_every": max(1, steps // 2)}
    overrides = {"finetune": {"train": train}}
    if pretrain_steps is not None:
        overrides["pretrain"] = {"train": {"max_steps": pretrain_steps}}
    from idckit.experiments.config import deep_merge
    overrides = deep_merge(overrides, extra or {})
    t0 = time.time()
    s = pcl.setup("cpu", data_root, runs_dir=runs_dir, overrides=overrides, progress=False)
    probe = {f"radius{r}": difference_probe(pcl.loaded_data(s), radius=r)["test_accuracy"] for r in (0, 2)}
    out = {"data": Path(data_root).name, "camera_jitter": info.get("camera_jitter", 1.0),
           "lamp_jitter": info.get("lamp_jitter", 1.0), "pairs": info.get("pairs"), "probe": probe,
           "threads": threads, "seed": seed, "commit": git_commit()}
    print(f"{out['data']}: probe r0 {probe['radius0']:.3f}, r2 {probe['radius2']:.3f}", flush=True)
    # the seed is in the name, as in the clip4idc_ and duda_ records: a second seed must not overwrite the first
    name = (f"pcl_{out['data']}_s{steps}" + ("" if pretrain_steps is None else f"_pt{pretrain_steps}")
            + f"_seed{seed}{tag}")
    if not probe_only:
        r = pcl.run_variant(s, "full", seed)
        diversity = output_diversity(s.runs_dir, [r])[0]
        ds = s.data.dataset()
        out.update({
            "model": "IDC-PCL (full, cpu model)", "overrides": overrides, "run": r["run"],
            "best_step": r.get("best_step"), "history": r.get("history", []),
            "test": {k: r["test"][k] for k in ("total", "semantic", "distractor") if k in r["test"]},
            "test_judge_accuracy": r.get("judge_accuracy"), "distinct_test_captions": diversity["distinct"],
            "test_pairs": diversity["pairs"], "top_caption_share": diversity["top_share"],
            "text_baseline_test": text_baseline(ds, split="test"),
            "finetune_seconds": r.get("finetune_seconds"), "pretrain_seconds": r.get("pretrain_seconds")})
        t = out["test"]
        print(f"{out['data']} ({steps} steps): best step {out['best_step']}, test judge "
              f"{out['test_judge_accuracy']:.3f}, CIDEr-D total {100 * t['total']['CIDEr-D']:.1f} semantic "
              f"{100 * t['semantic']['CIDEr-D']:.1f} distractor {100 * t['distractor']['CIDEr-D']:.1f}, "
              f"{out['distinct_test_captions']} distinct; text baseline "
              f"{100 * out['text_baseline_test']['CIDEr-D']:.1f}", flush=True)
    else:
        name = f"probe_{out['data']}"
    out["wall_seconds"] = round(time.time() - t0, 1)
    path = out_dir / f"{name}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")
    return out


def says_change(run_dir: Path, data_root: Path) -> dict | None:
    """On a SynthSpot-the-Diff set (its ``changes.json`` holds the truth): how often the run's test captions say
    *whether* the pair changed, i.e. use one of the generator's no-difference sentences exactly when nothing but
    light and noise differs. ``None`` elsewhere."""
    truth_path = Path(data_root) / "changes.json"
    results = Path(run_dir) / "test" / "total_results.json"
    if not truth_path.is_file() or not results.is_file():
        return None
    from idckit.data.synth.spot_the_diff import NO_DIFFERENCE, NO_DIFFERENCE_EXTRA

    truth = json.loads(truth_path.read_text())
    no_change_sentences = set(NO_DIFFERENCE) | set(NO_DIFFERENCE_EXTRA)
    counts = {"changed_said_changed": 0, "changed": 0, "unchanged_said_unchanged": 0, "unchanged": 0}
    for row in json.loads(results.read_text()):
        changed = bool(truth[str(row["image_id"]).removesuffix(".png")])
        said_changed = row["caption"].strip() not in no_change_sentences
        key = "changed" if changed else "unchanged"
        counts[key] += 1
        counts[f"{key}_said_{key}"] += said_changed == changed
    n = counts["changed"] + counts["unchanged"]
    counts["accuracy"] = (counts["changed_said_changed"] + counts["unchanged_said_unchanged"]) / n
    counts["majority"] = max(counts["changed"], counts["unchanged"]) / n
    counts.update(names_change(json.loads(results.read_text()), truth))
    return counts


# the generator's words for each kind (idckit/data/synth/spot_the_diff.py's phrases)
KIND_WORDS = {"car": {"car", "vehicle"}, "person": {"person", "man", "guy", "shirt"}, "bike": {"bike", "bicycle"}}


def names_change(rows: list[dict], truth: dict) -> dict:
    """Of the changed test pairs, the share whose caption names the colour and kind of one of the pair's changes,
    and the same share with each caption scored against every other changed pair (a captioner that writes such
    sentences without looking scores this on average)."""
    def named(caption: str, changes: list[dict]) -> bool:
        words = set(caption.split())
        return any(c["object"]["colour"] in words and words & KIND_WORDS[c["object"]["kind"]] for c in changes)

    pairs = [(row["caption"].strip().lower(), truth[str(row["image_id"]).removesuffix(".png")]) for row in rows]
    pairs = [(caption, changes) for caption, changes in pairs if changes]
    hits = sum(named(caption, changes) for caption, changes in pairs)
    cross = sum(named(caption, changes) for i, (caption, _) in enumerate(pairs)
                for j, (_, changes) in enumerate(pairs) if i != j)
    n = len(pairs)
    return {"names_change": hits / n if n else None,
            "names_change_chance": cross / (n * (n - 1)) if n > 1 else None}


def run_clip4idc(data_root: Path, threads: int, seed: int, runs_dir: Path | None, out_dir: Path = OUT,
                 extra: dict | None = None, tag: str = "", dataset: str = "clevr-change") -> dict:
    """CLIP4IDC (stand-in CLIP pre-training, adaptation, captioning) at the cpu profile plus ``extra`` overrides
    (``{"standin": .., "adapt": .., "caption": ..}``) on ``dataset`` (a ``clip4idc.setup`` name): test retrieval
    before / after adaptation, CIDEr-D, distinct test captions and the most-frequent-caption baseline on the same
    pairs (on SynthCLEVR-Change the curve's, with its semantic share; elsewhere the notebooks' own row)."""
    import torch

    from lab.scripts.budget_curve import text_baseline
    from idckit.experiments import clip4idc
    from idckit.experiments.analytics import output_diversity
    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    info = json.loads((Path(data_root) / "synth_info.json").read_text())
    t0 = time.time()
    s = clip4idc.setup("cpu", data_root, runs_dir=runs_dir, overrides=extra or {}, progress=False, dataset=dataset)
    clip = clip4idc.clip_weights(s)
    r = clip4idc.run_variant(s, "clip4idc", seed)
    diversity = output_diversity(s.runs_dir, [r])[0]
    clevr = dataset == "clevr-change"   # the jitters are SynthCLEVR-Change's (1.0: the faithful default)
    if clevr:
        baseline = text_baseline(s.data.dataset(), split="test")
    else:
        row = clip4idc.text_baseline(s)
        baseline = {"caption": row["sentence"], "split": "test", "CIDEr-D": row["metrics"]["CIDEr-D"] / 100}
    out = {"data": Path(data_root).name, "dataset": dataset,
           "camera_jitter": info.get("camera_jitter", 1.0 if clevr else None),
           "lamp_jitter": info.get("lamp_jitter", 1.0 if clevr else None), "pairs": info.get("pairs"),
           "threads": threads, "seed": seed, "commit": git_commit(), "model": "CLIP4IDC (cpu profile)",
           "overrides": extra or {},
           "standin": {k: clip.get(k) for k in ("run", "val", "steps", "wall_seconds", "description")},
           "adapt": r["adapt"], "run": r["run"], "best_step": r.get("best_step"),
           "test": {k: r["test"][k] for k in ("total", "semantic", "distractor") if k in r["test"]},
           "distinct_test_captions": diversity["distinct"], "test_pairs": diversity["pairs"],
           "top_caption_share": diversity["top_share"],
           "text_baseline_test": baseline, "says_change": says_change(s.runs_dir / r["run"], data_root),
           "caption_seconds": r.get("caption_seconds"),
           "wall_seconds": round(time.time() - t0, 1)}
    t, a = out["test"], out["adapt"]
    print(f"{out['data']}: stand-in val R@1 {clip['val']['R@1']:.1f}; text->pair R@1 "
          f"{a['test_unadapted']['t2p_R@1']:.2f} -> {a['test']['t2p_R@1']:.2f}; CIDEr-D total "
          f"{100 * t['total']['CIDEr-D']:.1f} semantic {100 * t.get('semantic', t['total'])['CIDEr-D']:.1f}, "
          f"{out['distinct_test_captions']} distinct; text baseline {100 * out['text_baseline_test']['CIDEr-D']:.1f}",
          flush=True)
    path = out_dir / f"clip4idc_{out['data']}_cpu_seed{seed}{tag}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")
    return out


def run_duda(data_root: Path, threads: int, seed: int, runs_dir: Path | None, out_dir: Path = OUT,
             backbone: str | None = None, extra: dict | None = None, tag: str = "") -> dict:
    """DUDA (the explicit-difference baseline) at the cpu profile on one data set: does a captioner that compares
    the two images by construction read the change off the same features? Test CIDEr-D, judge accuracy of its
    captions, distinct test captions, the most-frequent-caption baseline."""
    import torch

    from lab.scripts.budget_curve import text_baseline
    from idckit.experiments import duda
    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    info = json.loads((Path(data_root) / "synth_info.json").read_text())
    t0 = time.time()
    s = duda.setup("cpu", data_root, runs_dir=runs_dir, backbone=backbone, overrides=extra, progress=False)
    r = duda.run_variant(s, "duda", seed, progress=False)
    out = {"data": Path(data_root).name, "camera_jitter": info.get("camera_jitter", 1.0),
           "lamp_jitter": info.get("lamp_jitter", 1.0), "pairs": info.get("pairs"), "threads": threads,
           "seed": seed, "commit": git_commit(), "model": "DUDA (idckit, cpu profile)",
           "backbone": s.store.meta.get("backbone"), "overrides": extra or {}, "run": r["run"],
           "best_step": r["best_step"], "history": r["history"], "test": r["test"],
           "caption_judge_accuracy": r.get("caption_judge_accuracy"),  # no judge head: its captions read as judgments
           "distinct_test_captions": r["distinct_test_captions"],
           "test_pairs": r["test_pairs"], "text_baseline_test": text_baseline(s.data.dataset(), split="test"),
           "train_seconds": r.get("train_seconds"), "wall_seconds": round(time.time() - t0, 1)}
    print(f"{out['data']} DUDA ({out['backbone']}): best step {out['best_step']}, test {out['test']}, "
          f"{out['distinct_test_captions']} distinct", flush=True)
    path = out_dir / f"duda_{out['data']}_cpu_seed{seed}{tag}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")
    return out


def plot(out: Path, reports: Path = OUT):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    import re

    rows = []
    for path in sorted(reports.glob("judge_alone_*.json")):
        d = json.loads(path.read_text())
        m = re.search(r"camera jitter ([0-9.]+), lamp jitter ([0-9.]+)", d.get("data", ""))
        if d["setting"] != "data" or not m:
            continue                    # the toy has no jitter: lab/notes/learnability.md quotes it in words
        lamp = "" if m.group(1) == m.group(2) else f", lamp jitter {float(m.group(2)):g}"
        best = max(d["history"], key=lambda r: r["val"])
        scenes = re.search(r"\((\d+) pairs", d["data"])
        how = "".join([f", d_model {d['overrides']['d_model']}" if "d_model" in d.get("overrides", {}) else "",
                       ", through the cross-modal layers" if d.get("through_cross") else "",
                       f", after {d['mvcl_steps']} MVCL steps" if d.get("mvcl_steps") else ""])
        rows.append({"camera jitter": float(m.group(1)),
                     "what": f"judge alone (no captioner), {scenes.group(1)} scenes, "
                     f"{d['steps']} steps{how}, val-selected{lamp}", "value": best["test"],
                     "panel": "change vs distractor accuracy (test)"})
    # probe_* and pcl_* records (judge_alone_* above; clip4idc_* are quoted in the doc)
    for path in sorted(set(reports.glob("probe_*.json")) | set(reports.glob("pcl_*.json"))):
        d = json.loads(path.read_text())
        if d.get("overrides", {}).get("backbone"):
            continue  # features of another backbone: its probe is not the stand-in's (the doc's tables have it)
        # lamps moved as much as the camera unless the label says otherwise
        lamp = "" if d["lamp_jitter"] == d["camera_jitter"] else f", lamp jitter {d['lamp_jitter']:g}"
        row = {"camera jitter": d["camera_jitter"]}
        for r, acc in d["probe"].items():
            rows.append({**row, "what": f"feature probe, {r.replace('radius', 'radius ')}{lamp}", "value": acc,
                         "panel": "change vs distractor accuracy (test)"})
        if "test" in d:
            if "d_model" in d["overrides"].get("model", {}) or d["pairs"] == 8000:
                # the narrow model's settings: the cpu default's recipe (the judge loss x16, 128 pairs a step) and
                # its two earlier fine-tuning targets are drawn, seeds averaged; the record's file-name tag says
                # which (the default's own runs carry no overrides); the rest are the doc's tables, one row each
                if "_every_cpp4_drop0_seed" in path.stem:
                    what = (f"the cpu default (every position, 4 references, no dropout; {d['pairs']} scenes), "
                            "mean of seeds")
                elif "_every_cpp4_seed" in path.stem:
                    what = f"as the cpu default with dropout 0.1 ({d['pairs']} scenes), mean of seeds"
                elif "_every_seed" in path.stem:
                    what = f"as the cpu default with 1 reference per pair ({d['pairs']} scenes), mean of seeds"
                elif "_cpudefault_mvcl8" in path.stem or "_cpudefault_seed" in path.stem:
                    what = f"as the cpu default with masked targets, 1 reference ({d['pairs']} scenes), mean of seeds"
                elif "_dw16" in path.stem and "_b64" not in path.stem:
                    what = f"d_model 64, judge x16, pre-training 8:1:2 ({d['pairs']} scenes), mean of seeds"
                else:
                    continue
            else:
                what = f"{d['overrides']['finetune']['train']['max_steps']} steps (the earlier cpu model)"
            rows.append({**row, "what": f"IDC-PCL judge, {what}{lamp}", "value": d["test_judge_accuracy"],
                         "panel": "change vs distractor accuracy (test)"})
            for sub in ("total", "semantic", "distractor"):
                rows.append({**row, "what": f"IDC-PCL {sub}, {what}{lamp}",
                             "value": 100 * d["test"][sub]["CIDEr-D"], "panel": "test CIDEr-D (x100)"})
            rows.append({**row, "what": f"most frequent caption, total ({d['pairs']} scenes){lamp}",
                         "value": 100 * d["text_baseline_test"]["CIDEr-D"], "panel": "test CIDEr-D (x100)"})
    if not rows:
        sys.exit(f"no JSON in {reports}: run a point first")
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(14, 8.5))
    for ax, panel in zip(axes, ("change vs distractor accuracy (test)", "test CIDEr-D (x100)")):
        part = df[df["panel"] == panel]
        sns.lineplot(data=part, x="camera jitter", y="value", hue="what", marker="o", ax=ax)
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel(panel)
        ax.set_xlim(-0.02, 1.05)
        # below the panel: the labels are long and the points sit in every corner
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        if panel.startswith("change"):
            ax.axhline(0.85, ls="--", c="grey", lw=1)
            ax.axhline(0.5, ls=":", c="grey", lw=1)
            ax.text(0.0, 0.86, "judge target 0.85", fontsize=8, color="grey")
            ax.text(0.0, 0.51, "chance", fontsize=8, color="grey")
    fig.suptitle("SynthCLEVR-Change (synthetic), cpu profile: what the kit learns against the camera jitter",
                 fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")    # the legends below the panels are wider than them
    print(f"wrote {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data-root", type=Path, required=True)
    r.add_argument("--steps", type=int, default=300)
    r.add_argument("--eval-every", type=int, default=100)
    r.add_argument("--pretrain-steps", type=int, default=None)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--runs-dir", type=Path, default=None)
    r.add_argument("--probe-only", action="store_true")
    r.add_argument("--overrides", type=json.loads, default=None,
                   help='more settings over the cpu profile, JSON, e.g. \'{"model": {"d_model": 64}}\'')
    r.add_argument("--tag", default="", help="appended to the JSON's name")
    r.add_argument("--out-dir", type=Path, default=OUT)
    c = sub.add_parser("clip4idc", help="CLIP4IDC at the cpu profile (+ --overrides) on one data set")
    c.add_argument("--data-root", type=Path, required=True)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--runs-dir", type=Path, default=None)
    c.add_argument("--overrides", type=json.loads, default=None,
                   help='{"standin": {...}, "adapt": {...}, "caption": {...}} over the cpu profile')
    c.add_argument("--tag", default="", help="appended to the JSON's name")
    c.add_argument("--out-dir", type=Path, default=OUT)
    c.add_argument("--dataset", default="clevr-change", choices=["clevr-change", "spot-the-diff", "editing-request"])
    d = sub.add_parser("duda", help="DUDA at the cpu profile (+ --overrides) on one data set")
    d.add_argument("--data-root", type=Path, required=True)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--runs-dir", type=Path, default=None)
    d.add_argument("--backbone", default=None, help="a feature backbone other than the profile's")
    d.add_argument("--overrides", type=json.loads, default=None, help="settings over configs/duda.json's cpu profile")
    d.add_argument("--tag", default="", help="appended to the JSON's name")
    d.add_argument("--out-dir", type=Path, default=OUT)
    pl = sub.add_parser("plot")
    pl.add_argument("--out", type=Path, default=NOTES_IMG / "learnability.png")
    pl.add_argument("--reports", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.cmd == "run":
        run(a.data_root, a.steps, a.eval_every, a.threads, a.seed, a.runs_dir, a.pretrain_steps, a.probe_only,
            a.out_dir, a.overrides, a.tag)
    elif a.cmd == "clip4idc":
        run_clip4idc(a.data_root, a.threads, a.seed, a.runs_dir, a.out_dir, a.overrides, a.tag, a.dataset)
    elif a.cmd == "duda":
        run_duda(a.data_root, a.threads, a.seed, a.runs_dir, a.out_dir, a.backbone, a.overrides, a.tag)
    else:
        plot(a.out, a.reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
