"""``idckit`` command line. Each subcommand parses its arguments here and calls one function in the package.

Each command imports its own module inside its handler (torch, open_clip, papermill, numpy, the experiments), so
``idckit --help`` is instant; those imports are marked ``# local: --help ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from idckit import paths
from idckit import registry
from idckit.data.detect import open_dataset
from idckit.errors import ConfigError, IdckitError, resource_error
from idckit.registry import RELEASED
from idckit.settings import PROFILES, resolved_with_sources


#: the largest image side a command draws or resizes to: memory grows with its square (the real releases: 480 px)
MAX_SIDE = 4096


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size must look like 240x160, got {text!r}") from e
    if w < 32 or h < 32:     # the generator's own floor: objects are not drawable below it
        raise argparse.ArgumentTypeError(f"size {text} is too small (at least 32x32)")
    if max(w, h) > MAX_SIDE:
        raise argparse.ArgumentTypeError(f"--size {text} is too large (at most {MAX_SIDE}x{MAX_SIDE}; "
                                         "the real CLEVR-Change is 480x320)")
    return w, h


def _side(flag: str):
    """An image side in pixels, 32 to :data:`MAX_SIDE`, refused while parsing (not as an allocation error later)."""
    def parse(text: str) -> int:
        try:
            side = int(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number of pixels, got {text!r}") from e
        if not 32 <= side <= MAX_SIDE:
            raise argparse.ArgumentTypeError(f"{flag} {text} is out of range (at least 32, at most {MAX_SIDE})")
        return side
    return parse


def _at_least(flag: str, low: int):
    """A whole number of at least ``low``, refused while parsing (a negative --limit would cut findings silently)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number, got {text!r}") from e
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be at least {low}, got {value}")
        return value
    return parse


def _objects(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split("-"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"objects must look like 3-10, got {text!r}") from e
    return lo, hi


def cmd_generate(args: argparse.Namespace) -> int:
    from idckit.data.synth.clevr_change import generate  # local: --help stays instant (numpy, PIL: 0.1 s)
    from idckit.fileio import check_output_dir  # local: --help stays instant (fileio: +12 ms, +20 %)

    check_output_dir(args.out, "--out")
    generate(args.out, n_pairs=args.pairs, seed=args.seed, size=args.size, camera_jitter=args.camera_jitter,
             lamp_jitter=args.lamp_jitter, objects=args.objects, workers=args.workers, profile=args.profile,
             overwrite=args.overwrite, force=args.force)
    return 0


def cmd_generate_birds(args: argparse.Namespace) -> int:
    from idckit.data.synth.birds import generate  # local: --help stays instant (numpy, PIL: 0.1 s)

    generate(args.out, n_pairs=args.pairs, cub_per_class=args.cub_per_class,
             nabirds_per_class=args.nabirds_per_class, size=args.size, seed=args.seed, workers=args.workers,
             tree=args.tree, profile=args.profile, overwrite=args.overwrite, force=args.force)
    return 0


def cmd_generate_spot_the_diff(args: argparse.Namespace) -> int:
    from idckit.data.synth.spot_the_diff import generate  # local: --help stays instant (numpy, PIL: 0.1 s)

    print(generate(args.out, n_pairs=args.pairs, seed=args.seed, workers=args.workers, overwrite=args.overwrite,
                   light_change=args.light_change, profile=args.profile, force=args.force))
    return 0


def cmd_generate_editing_request(args: argparse.Namespace) -> int:
    from idckit.data.synth.editing_request import generate  # local: --help stays instant (numpy, PIL: 0.1 s)

    print(generate(args.out, n_pairs=args.pairs, seed=args.seed, workers=args.workers, overwrite=args.overwrite,
                   profile=args.profile, force=args.force))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``idckit evaluate RESULTS --data ROOT [--split test] [--json OUT] [--no-tokenize] [--no-meteor]``.

    Prints the x100 table; ``--json`` writes ``{subset: {metric: value}}`` on pycocoevalcap's raw scale (0-1,
    CIDEr-D unscaled), the scale every other idckit metrics file uses.
    """
    # local: --help stays instant (tqdm: 0.04 s; the scorers load pycocoevalcap)
    from idckit.eval.captions import (TABLE_NOTE, evaluate_results, format_table, is_scores_file, load_results,
                                      subsets_of)
    from idckit.fileio import claim_file, write_json  # local: --help stays instant (fileio: +12 ms, +20 %)

    if args.json is not None:  # before minutes of scoring, not after
        args.json = claim_file(args.json, "--json", inputs=[args.data, args.results], recognise=is_scores_file,
                               what="a scores file `idckit evaluate --json` wrote")
    tokenize, meteor = not args.no_tokenize, not args.no_meteor
    captions = load_results(args.results)
    empty = sorted(pid for pid, cap in captions.items() if not cap.strip())
    if empty:   # scored as the papers' evaluators do, but said: a blank caption is usually a decoding bug
        print(f"note: {len(empty)} of {len(captions)} results have an empty caption (e.g. {empty[0]!r}); each "
              "scores 0 on every metric", file=sys.stderr)
    breakdown = evaluate_results(args.results, args.data, args.split, tokenize=tokenize, meteor=meteor)
    types = open_dataset(args.data).types(args.split)
    counts = {name: len(ids) for name, ids in subsets_of(types, types).items()}
    how = ("PTB-tokenised" if tokenize else "untokenised (IDC-PCL's evaluator)") + ("" if meteor else ", no METEOR")
    print(f"{args.results} on {args.data} [{args.split}], pycocoevalcap 1.2, {how}; {TABLE_NOTE}")
    print(format_table(breakdown, counts))
    singletons = [name for name in breakdown if counts.get(name) == 1]
    if singletons:
        print(f"note: {', '.join(singletons)} hold one pair; CIDEr-D of a one-pair corpus is 0 by definition "
              "(its IDF is log 1 = 0)")
    if args.json is not None:
        write_json(args.json, breakdown, indent=1)
        print(f"wrote {args.json} (raw pycocoevalcap scale: 0-1, CIDEr-D unscaled)")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    from idckit.data.features import extract_features  # local: --help stays instant (torch: 1.3 s)

    store = extract_features(args.data_root, args.backbone, weights=args.weights, batch_size=args.batch_size,
                             out_dir=args.out, device=args.device, image_size=args.image_size,
                             other_data="refuse" if args.out else "rebuild", force=args.force)
    print(f"{store.directory}: {store.array.shape[0]} images x {store.n_regions} regions x {store.dim} "
          f"(float16), weights: {store.meta['weights']}")
    return 0


def _print_plan(args: argparse.Namespace) -> int:
    """``idckit reproduce --plan``: the lanes, their jobs and the projected wall time, nothing run."""
    from idckit.reproduce import plan  # local: --help stays instant (papermill: 1.4 s)

    sched, missing = plan(args.notebooks, profile=args.profile, roots=_roots(args), report_dir=args.report_dir,
                          jobs=args.jobs)
    for name, (lane, start, end) in sorted(sched.items(), key=lambda kv: (kv[1][1], kv[1][0])):
        print(f"lane {lane}  {start / 60:6.1f} - {end / 60:6.1f} min  {name}")
    lanes = 1 + max((lane for lane, _, _ in sched.values()), default=0)
    wall = max((end for _, _, end in sched.values()), default=0.0)
    print(f"[idckit reproduce --plan] projected wall {wall / 60:.0f} min on {lanes} lane(s), from the times the last "
          "reproduce recorded (reports' status.json); set-up not included")
    if missing:
        print(f"no time of their own recorded (a run counts its notebook's share, a prepare step 0): "
              f"{', '.join(missing)}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from idckit.reproduce import reproduce, updates_readme  # local: --help stays instant (papermill: 1.4 s)

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:   # every rank would render every notebook
        raise ConfigError("reproduce runs in one process; under torchrun, train the runs instead",
                          fix="torchrun --nproc_per_node=N -m idckit.cli train FAMILY ..., then "
                              "`idckit reproduce` (or: make reproduce NPROC=N)")

    if args.plan:
        return _print_plan(args)
    if args.device:    # every notebook would fail on it, one after the other
        from idckit.device import resolve  # local: --help stays instant (torch: 1.3 s)

        resolve(args.device)
    outcomes = reproduce(args.notebooks, profile=args.profile, roots=_roots(args),
                         report_dir=args.report_dir, runs_dir=args.runs_dir,
                         extra_parameters={"device": args.device} if args.device else None, force=args.force,
                         released={r.param: getattr(args, r.param) for r in RELEASED.values()}, jobs=args.jobs)
    failed = [o.notebook for o in outcomes if not o.ok]
    if updates_readme(args.profile, args.report_dir) and len(failed) < len(outcomes):
        from idckit.reports.readme import update_readme  # local: --help stays instant (tqdm: 0.06 s)

        update_readme()
    total = sum(o.seconds for o in outcomes)
    where = args.report_dir or paths.reports_dir(args.profile)
    print(f"[idckit reproduce] {len(outcomes) - len(failed)}/{len(outcomes)} notebooks ok, {total / 60:.1f} min of "
          "notebook time; "
          f"reports in {where}")
    if failed:
        print(f"idckit: error: notebooks failed (previous reports kept, marked stale): {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def cmd_readme(args: argparse.Namespace) -> int:
    from idckit.reports.readme import update_readme  # local: --help stays instant (tqdm: 0.06 s)

    changed = update_readme(report_dir=args.report_dir)
    print("README.md results table " + ("updated" if changed else "already up to date"))
    return 0


def cmd_caption(args: argparse.Namespace) -> int:
    from idckit.cli.caption import main as caption_main  # local: --help stays instant (torch: 1.3 s)

    return caption_main(args.before, args.after, args.model, args.runs_dir, args.beam, args.profile, args.data_root,
                        args.device)


def cmd_pretrain_clip(args: argparse.Namespace) -> int:
    from idckit.experiments.clip4idc import pretrain_clip  # local: --help stays instant (torch, open_clip: 3 s)

    info = pretrain_clip(args.profile, args.data_root, runs_dir=args.runs_dir, out=args.out, device=args.device)
    print(info["description"])
    print(info["weights"])
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from idckit.experiments.base import train  # local: --help loads none of the experiments
    from idckit.train import distributed  # local: --help stays instant (torch: 1.3 s)

    root = getattr(args, registry.dataset(registry.family(args.family).dataset).param)
    results = train(args.family, args.profile, root, variants=args.variants or None, seeds=args.seeds,
                    runs_dir=args.runs_dir, device=args.device)
    if distributed.is_main():
        for r in results:
            val = r["val"]    # what selected the checkpoint: CIDEr-D for a captioner, R@1 for an adaptation
            score = (f"val CIDEr-D {100 * val['CIDEr-D']:.1f}" if "CIDEr-D" in val
                     else f"val text->pair R@1 {val['t2p_R@1']:.1f} %" if "t2p_R@1" in val
                     else "val " + ", ".join(f"{k} {v:.3f}" for k, v in val.items() if isinstance(v, float)))
            print(f"{r['label']} (seed {r['seed']}): {r['run']}  {score}")
    if distributed.world() > 1:
        import torch.distributed  # local: --help stays instant (torch: 1.3 s)

        torch.distributed.barrier()    # no rank tears gloo down while another is still in a collective
        torch.distributed.destroy_process_group()
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    rows = resolved_with_sources(list(registry.family(args.family).configs), args.profile, dataset=args.dataset)
    if args.json:
        print(json.dumps([{"setting": k, "value": v, "from": w} for k, v, w in rows], indent=1))
        return 0
    width = max(len(k) for k, _, _ in rows)
    print(f"# {args.family} at profile {args.profile}" + (f", dataset {args.dataset}" if args.dataset else "")
          + ": every setting, resolved, and the layer that set it (idckit/experiments/configs/)")
    for key, value, where in rows:
        print(f"{key:<{width}}  {json.dumps(value):<24}  {where}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from idckit.experiments.recipes import describe  # local: --help loads none of the experiments

    print(describe(args.pattern))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from idckit.cli.doctor import main as doctor_main  # local: --help stays instant (torch: 1.3 s)

    return doctor_main(profile=args.profile, roots=_roots(args), runs_dir=args.runs_dir,
                       gpu_check=args.out if args.gpu_check else None)


def cmd_verify_data(args: argparse.Namespace) -> int:
    from idckit.cli.verify_data import main as verify_main  # local: --help stays instant (numpy, PIL: 0.14 s)

    return verify_main(args.root, args.dataset, sample=args.sample, counts=args.counts, fast=args.fast,
                       json_out=args.json, limit=args.limit, workers=args.workers)


def cmd_import_checkpoint(args: argparse.Namespace) -> int:
    from idckit.authors.convert import import_checkpoint  # local: --help stays instant (torch: 1.3 s)

    options = {k: v for k, v in (("vocab", args.vocab), ("max_len", args.max_len), ("n_heads", args.heads))
               if v is not None}
    done = import_checkpoint(args.kind, args.checkpoint, args.out, force=args.force, **options)
    print(f"{done['out']}: {done['kind']} {done.get('stage', '')} checkpoint, {done.get('parameters', 0):,} "
          f"parameters (what was converted: {args.out}/import.json)")
    return 0


def _root_options(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One root per dataset (idckit.registry.DATASETS): --clevr-root, --spot-root, --ier-root, --birds-root."""
    for d in registry.DATASETS.values():
        if only is None or d.name in only:
            parser.add_argument(d.option, dest=d.param, default=None, metavar="DIR",
                                help=f"a real {d.title} root ({d.layout}); default: {d.synthetic}")


def _roots(args: argparse.Namespace) -> dict[str, str | None]:
    return {d.param: getattr(args, d.param, None) for d in registry.DATASETS.values()}


def _device_option(parser: argparse.ArgumentParser, default_help: str = "default: auto") -> None:
    parser.add_argument("--device", default=None,
                        help=f"auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps; {default_help}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="idckit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="write a synthetic dataset in a real dataset's on-disk format")
    gsub = g.add_subparsers(dest="dataset", required=True)
    # every setting's default is the profile's in configs/synth_*.json (None here: generate() reads the file)
    def _synth(parser: argparse.ArgumentParser, config: str) -> argparse.ArgumentParser:
        parser.add_argument("--out", type=Path, required=True, help="output directory (created)")
        parser.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES,
                            help=f"whose settings the options left out take (idckit/experiments/configs/{config}.json; "
                                 f"default {paths.DEFAULT_PROFILE})")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--workers", type=int, default=None,
                            help="processes drawing the images (the output does not depend on it)")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace another dataset of this generator at --out (only one the kit wrote: its "
                                 "synth_info.json)")
        parser.add_argument("--force", action="store_true",
                            help="write beside files in --out that the generator did not write (they are kept, never "
                                 "deleted)")
        return parser

    gc = _synth(gsub.add_parser("clevr-change", help="SynthCLEVR-Change in the official CLEVR-Change layout"),
                "synth_clevr_change")
    gc.add_argument("--pairs", type=int, default=None, help="number of before images (each gives 2 pairs)")
    gc.add_argument("--size", type=_size, default=None, help="WxH (the real release: 480x320)")
    gc.add_argument("--camera-jitter", type=float, default=None,
                    help="CLEVR's camera jitter L: each image moves the camera by U(-L, L) per axis (CLEVR-Change: "
                         "1.0, CLEVR's argparse default 0.5); smaller is easier")
    gc.add_argument("--lamp-jitter", type=float, default=None,
                    help="CLEVR's lamp jitter L for the key, fill and back lamps (CLEVR-Change: 1.0)")
    gc.add_argument("--objects", type=_objects, default=None,
                    help="fewest-most objects in a before scene, e.g. 2-4 (CLEVR and CLEVR-Change: 3-10)")
    gc.set_defaults(func=cmd_generate)
    gb = _synth(gsub.add_parser("birds", help="SynthBirds: Birds-to-Words, CUB-200-2011 (+ captions) and NABirds "
                                              "layouts"), "synth_birds")
    gb.add_argument("--pairs", type=int, default=None, help="Birds-to-Words pairs (4-5 paragraphs each)")
    gb.add_argument("--cub-per-class", type=int, default=None, help="CUB images per species")
    gb.add_argument("--nabirds-per-class", type=int, default=None, help="NABirds images per leaf class")
    gb.add_argument("--size", type=_side("--size"), default=None, help="square image side in pixels")
    gb.add_argument("--tree", type=int, nargs=4, default=None, metavar=("ORDERS", "FAMILIES", "GENERA", "SPECIES"),
                    help="the taxonomy: orders, families per order, genera per family, species per genus")
    gb.set_defaults(func=cmd_generate_birds)
    for name, helptext, config, func in (
            ("spot-the-diff", "SynthSpot-the-Diff (street and parking-lot cameras) in the Spot-the-Diff layout",
             "synth_spot_the_diff", cmd_generate_spot_the_diff),
            ("editing-request", "SynthIER (edited procedural photos, raw requests) in the Image-Editing-Request "
                                "layout", "synth_editing_request", cmd_generate_editing_request)):
        gx = _synth(gsub.add_parser(name, help=helptext), config)
        gx.add_argument("--pairs", type=int, default=None, help="number of image pairs (ids 0..N-1)")
        if name == "spot-the-diff":
            gx.add_argument("--light-change", type=float, default=None,
                            help="how much the light differs between the two frames (1.0: up to 12 %% in gain where "
                                 "nothing else changed; 0: the same light, only sensor noise)")
        gx.set_defaults(func=func)

    e = sub.add_parser("evaluate", help="score RCC-format results against a dataset (BLEU, METEOR, ROUGE-L, CIDEr-D)")
    e.add_argument("results", type=Path,
                   help="a results directory with sc_results.json + nsc_results.json, or one JSON list")
    e.add_argument("--data", type=Path, required=True,
                   help="dataset root: CLEVR-Change, Spot-the-Diff or Image-Editing-Request layout (detected)")
    e.add_argument("--split", default="test", choices=["train", "val", "test"])
    e.add_argument("--json", type=Path, default=None, help="write {subset: {metric: value}} here")
    e.add_argument("--no-tokenize", action="store_true",
                   help="skip the PTB tokenizer (reproduces IDC-PCL's own evaluator)")
    e.add_argument("--no-meteor", action="store_true", help="skip METEOR (saves the JVM start)")
    e.set_defaults(func=cmd_evaluate)

    f = sub.add_parser("features", help="extract grid features (7x7 at 224 px) of every image into float16 memmaps (resumable)")
    f.add_argument("data_root", type=Path, help="a CLEVR-Change root")
    f.add_argument("--backbone", default="efficientnet_lite0",
                   help="efficientnet_lite0 (offline default), efficientnet_lite0_b5, resnet101, "
                        "or clip:<open_clip model>")
    f.add_argument("--weights", default=None, help="a local state-dict file ('random' for tests only)")
    f.add_argument("--batch-size", type=int, default=16)
    f.add_argument("--image-size", type=_side("--image-size"), default=224,
                   help="square side the images are resized to (224: a 7x7 grid; 160: 5x5; 320: 10x10)")
    f.add_argument("--out", type=Path, default=None,
                   help="default: DATA_ROOT/features/BACKBONE (BACKBONE-SIZEpx at other sizes)")
    f.add_argument("--force", action="store_true",
                   help="extract into an --out holding another dataset's store (or files the kit did not write, "
                        "which are kept)")
    _device_option(f)
    f.set_defaults(func=cmd_features)

    r = sub.add_parser("reproduce", help="run notebooks with papermill into HTML reports + reports/index.html")
    r.add_argument("notebooks", nargs="*", help="notebook names (default: all in notebooks/)")
    r.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES)
    _root_options(r)
    r.add_argument("--report-dir", type=Path, default=None)
    r.add_argument("--runs-dir", type=Path, default=None)
    r.add_argument("--force", action="store_true",
                   help="write into a --report-dir that also holds files the kit did not write (they are kept)")
    _device_option(r, "passed to every notebook as its device parameter (default: each config's device)")
    r.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="notebooks run at once, each on cores // N torch threads (default: runtime.json's "
                        "reproduce_jobs)")
    r.add_argument("--plan", action="store_true",
                   help="print the lanes' jobs and the projected wall time from the last recorded times; run nothing")
    for rel in RELEASED.values():
        r.add_argument(rel.option, dest=rel.param, default=None, metavar="CKPT",
                       help=f"the authors' released {rel.kind} checkpoint (their file, or a run written by "
                            f"import-checkpoint), scored beside the kit's runs in {', '.join(rel.notebooks)}")
    r.set_defaults(func=cmd_reproduce)

    c = sub.add_parser("caption", help="say what changed between two images (any size) with a trained model")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--model", default=None,
                   help="a run directory or its name in the run cache (default: the best finished run on val)")
    c.add_argument("--runs-dir", type=Path, default=None)
    c.add_argument("--beam", type=int, default=1, help="beam width (1 = greedy, the papers' decoding)")
    c.add_argument("--profile", default=None, help="only runs of this profile (default: "
                                                   f"{paths.DEFAULT_PROFILE}'s, else paper's, else smoke's)")
    c.add_argument("--data-root", default=None, help="only runs trained on this dataset (default: the profile's "
                                                     "synthetic default)")
    _device_option(c)
    c.set_defaults(func=cmd_caption)

    pc = sub.add_parser("pretrain-clip", help="train the offline stand-in CLIP (open_clip checkpoint; cached) and "
                                              "print its path, to pass as pretrained=")
    pc.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES, help="training length")
    pc.add_argument("--data-root", default=None,
                    help="a CLEVR-Change root with scene_descriptions.json (default: the profile's synthetic data)")
    pc.add_argument("--runs-dir", type=Path, default=None, help="run cache (default runs/)")
    pc.add_argument("--out", type=Path, default=None, help="also copy the checkpoint here")
    _device_option(pc, "default: the config's device")
    pc.set_defaults(func=cmd_pretrain_clip)

    t = sub.add_parser("train", help="train the runs behind the notebooks into the run cache; under "
                                     "`torchrun --nproc_per_node=N -m idckit.cli train ...` on N processes (DDP)")
    t.add_argument("family", choices=list(registry.FAMILIES),
                   help="pcl, duda and clip4idc train on CLEVR-Change (--clevr-root), birds on --birds-root")
    t.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES)
    _root_options(t)
    t.add_argument("--variants", nargs="*", default=None,
                   help="recipe variants, e.g. full no_judge (default: every recipe of the family; see `idckit list`)")
    t.add_argument("--seeds", nargs="*", type=int, default=[0])
    t.add_argument("--runs-dir", type=Path, default=None)
    _device_option(t, "default: the configs' device")
    t.set_defaults(func=cmd_train)

    cf = sub.add_parser("config", help="print a family's resolved settings at a profile, each with the JSON layer "
                                       "that set it")
    cf.add_argument("family", choices=list(registry.FAMILIES))
    cf.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES)
    cf.add_argument("--dataset", default=None, choices=registry.pair_datasets(),
                    help="also the config files' block for this dataset (CLIP4IDC's Spot-the-Diff / IER settings)")
    cf.add_argument("--json", action="store_true", help="a JSON list of {setting, value, from}")
    cf.set_defaults(func=cmd_config)

    ls = sub.add_parser("list", help="the named recipes (pcl/full, clip4idc/clip-ft, ...): what each trains and "
                                     "which paper tables have a row from it")
    ls.add_argument("pattern", nargs="?", default="*", help="shell-style filter on the names, e.g. 'pcl/*'")
    ls.set_defaults(func=cmd_list)

    dr = sub.add_parser("doctor", help="what this machine offers: devices, bf16, Java, weights, datasets")
    dr.add_argument("--profile", default=paths.DEFAULT_PROFILE, choices=PROFILES)
    _root_options(dr)
    dr.add_argument("--runs-dir", type=Path, default=None)
    dr.add_argument("--gpu-check", action="store_true",
                    help="also run the GPU check (idckit/cli/gpu_check.py, minutes; `make gpu-check` runs it alone)")
    dr.add_argument("--out", type=Path, default=Path("gpu_check"), help="where --gpu-check writes gpu_check.json")
    dr.set_defaults(func=cmd_doctor)

    vd = sub.add_parser("verify-data", help="is a dataset copy complete and readable: files, splits, caption "
                                            "schema, every image decoded; exit 1 on any problem")
    vd.add_argument("root", type=Path, help="the dataset's root (the folder its loader takes; see docs/real_data.md)")
    vd.add_argument("--dataset", required=True, choices=list(registry.DATASETS))
    vd.add_argument("--sample", type=int, default=None, help="decode N images drawn at random (seed 0), not all")
    vd.add_argument("--fast", action="store_true", help="decode no image (what `idckit doctor` runs)")
    vd.add_argument("--counts", default="auto", choices=["auto", "release", "declared", "none"],
                    help="compare with the full release's published counts (release), with a synthetic set's "
                         "synth_info.json (declared), or check structure only (none); auto: declared when "
                         "synth_info.json is there, else release")
    vd.add_argument("--json", type=Path, default=None, help="also write the findings here")
    vd.add_argument("--limit", type=_at_least("--limit", 0), default=20, help="findings printed per kind (default 20)")
    vd.add_argument("--workers", type=_at_least("--workers", 1), default=None,
                    help="decoding threads (default: the cores, at most 8)")
    vd.set_defaults(func=cmd_verify_data)

    ic = sub.add_parser("import-checkpoint", help="turn an authors' released checkpoint into a kit run directory "
                                                  "(idckit caption --model DIR, the notebooks)")
    ic.add_argument("--from", dest="kind", required=True,
                    help="idc-pcl (clver/), idc-pcl-birds (bird/); idckit.authors.convert.CONVERTERS lists all")
    ic.add_argument("checkpoint", type=Path, help="the authors' checkpoint file")
    ic.add_argument("--out", type=Path, required=True, help="the run directory to write, e.g. runs/idc-pcl-clevr")
    ic.add_argument("--vocab", type=Path, default=None, help="IDC-PCL: the authors' dict.json the checkpoint used")
    ic.add_argument("--max-len", type=int, default=None,
                    help="IDC-PCL and clip4idc-caption: the caption length it was trained with (required)")
    ic.add_argument("--heads", type=int, default=None,
                    help="IDC-PCL and clip4idc-caption: its attention heads (required: not in the weights)")
    ic.add_argument("--force", action="store_true", help="write beside files in --out the kit did not write")
    ic.set_defaults(func=cmd_import_checkpoint)

    rd = sub.add_parser("readme", help="regenerate the README's results table from reports/*.json")
    rd.add_argument("--report-dir", type=Path, default=None)
    rd.set_defaults(func=cmd_readme)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except IdckitError as err:
        print(f"idckit: error: {err}", file=sys.stderr)
        return 2
    except (OSError, MemoryError, RuntimeError) as err:   # a full disk, a limit, no permission: said one way
        # (RuntimeError: torch's file writer wraps the OSError of a failed write in one)
        mapped = resource_error(err)
        if mapped is None:
            raise
        print(f"idckit: error: {mapped}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("idckit: interrupted", file=sys.stderr)
        return 130

