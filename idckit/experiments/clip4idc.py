"""CLIP4IDC experiments on CLEVR-Change: the runs behind the clip4idc_* notebooks, each trained once and cached.

A notebook calls :func:`setup`, then one function per run: :func:`adapt` (retrieval), :func:`run_variant` /
:func:`runs` (captioning: the ``clip4idc/*`` recipes of :mod:`idckit.experiments.recipes`, results with the keys of
:data:`idckit.experiments.runs.RESULT_KEYS`). Between them, each a cached run keyed by its full config
(:mod:`idckit.experiments.runs`):

1. the CLIP: named weights (``pretrained``: an open_clip tag such as ``openai``, or a checkpoint file), or, when
   ``pretrained`` is None, the kit's offline stand-in pre-trained here on the TRAIN images' scene descriptions and
   saved as an open_clip checkpoint (:mod:`idckit.tasks.clip_pretrain`; one run shared by every table);
2. adaptation (:class:`idckit.tasks.clip4idc.AdaptTask`) per intra/inter split and seed; its val-best pair
   encoder starts the CLIP4IDC captioner;
3. captioning (:class:`idckit.tasks.clip4idc.CaptionTask`) per variant (CLIP-FT, CLIP4IDC w/o adaptation,
   CLIP4IDC), split and seed; val CIDEr-D selects; test is decoded once (greedy, KV cache) and scored with the RCC
   breakdown (PTB tokenisation, METEOR where the profile asks for it).

Tables share runs: table 1's seed-0 CLIP4IDC run is table 2's, table 5's CLIP4IDC row and table 7's default split
(at the cpu profile the captioner's encoder is frozen anyway, so the frozen-encoder run of table 7 is the same
config); table 6 reads table 1's adaptation run. Every table uses the one stand-in CLIP.

Settings are data: ``configs/clip_standin.json``, ``configs/clip4idc_adapt.json``, ``configs/clip4idc_caption.json``
(base = the paper's, profiles smoke / cpu / paper; a ``datasets`` block holds what differs on Spot-the-Diff or
IER, see :func:`dataset_settings`). ``train`` blocks may give ``epochs`` (and
``warmup_fraction``, ``eval_every_epochs``) instead of steps; they are converted with the data's size here.

Frozen work is computed once per process: the intra-stage outputs of a frozen stand-in (per split depth) are shared
by every adaptation and captioning run of a notebook (in :data:`idckit.experiments.base.CACHE`). Report rows, captioning and retrieval alike, are
:mod:`idckit.experiments.reporting`'s.
"""
from __future__ import annotations

import atexit
import copy
import hashlib
import os
import time
from pathlib import Path
from typing import Any, Sequence

import open_clip
import torch

from idckit import fileio, paths, registry
from idckit.device import resolve
from idckit.errors import ConfigError, WeightsUnavailableError
from idckit.eval.baselines import most_frequent
from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
from idckit.eval.retrieval import retrieval_metrics
from idckit.experiments import base, recipes, reporting, selection
from idckit.experiments.base import Setup
from idckit.experiments.config import (check_profile, check_seeds, deep_merge, load_config, read_config_file,
                                       train_config)
from idckit.experiments.data import DataChoice, pair_dataset
from idckit.experiments.runs import Run, open_run, variant_result
from idckit.fileio import check_output_dir
from idckit.models import clip4idc as clip4idc_model
from idckit.models.clip4idc import CLIP4IDCRetrieval
# importing clip_loader also registers the kit's stand-in architectures with open_clip (_vision_config reads them)
from idckit.models.clip_loader import load_clip, save_clip_checkpoint
from idckit.reports.report import Provenance, to_paper_scale
from idckit.tasks.clip4idc import AdaptTask, CaptionTask, IntraCache, load_pair_data, with_text_length
from idckit.tasks.clip_pretrain import StandinPretrainTask, load_description_data, read_descriptions
from idckit.train import distributed, loop

FAMILY = registry.family("clip4idc").recipe_family  # its recipes: clip4idc/clip-ft, ...
MODEL = "CLIP4IDC (idckit)"    # the model column of its report rows
STANDIN_LABEL = "idckit stand-in CLIP (synthetic pre-training)"


def clip_model(s: Setup) -> str:
    """The open_clip architecture of the setup's CLIP (``ViT-B-32``, the stand-in's name)."""
    return s.config["clip"]["model"]


def image_size(s: Setup) -> int:
    size = _vision_config(clip_model(s))["image_size"]
    return size if isinstance(size, int) else size[0]


def depth(s: Setup) -> int:
    """Residual blocks of the CLIP's ViT (N_intra + N_inter); table 7 splits them."""
    return _vision_config(clip_model(s))["layers"]


def default_n_intra(s: Setup) -> int:
    return clip4idc_model.default_n_intra(depth(s))


def setup(profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, clip_model: str | None = None, pretrained: str | None = None,
          overrides: dict | None = None, progress: bool = True, device: str | None = None,
          dataset: str = "clevr-change") -> Setup:
    """The data (generated on first use when synthetic) and every setting of ``profile``.

    ``dataset``: ``clevr-change``, ``spot-the-diff`` or ``editing-request`` (``data_root`` in that layout).

    ``clip_model`` / ``pretrained`` override the profile's CLIP (e.g. ``"ViT-B-32"``, ``"openai"`` for the paper's);
    ``pretrained=None`` with no override means the profile's choice (the stand-in at smoke and cpu).
    ``overrides`` = ``{"standin": {...}, "adapt": {...}, "caption": {...}}`` deep-merged into the configs.
    ``device`` (``auto``, ``cpu``, ``cuda:1``, ...) overrides ``configs/runtime.json``'s.

    Everything a run reads from disk is prepared here, before any training: the data, and the stand-in's
    description data (generated when this data has no scene descriptions)."""
    check_profile(profile)
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"overrides must be a dict, got {overrides!r}",
                          fix="pass e.g. overrides={'caption': {'train': {'max_steps': 100}}}")
    unknown = set(overrides) - {"standin", "adapt", "caption"}
    if unknown:
        raise ConfigError(f"unknown override sections {sorted(unknown)}; known: standin, adapt, caption",
                          fix="put each setting under the section of its config file: standin, adapt or caption")
    def settings(name: str, section: str) -> dict:
        return deep_merge(dataset_settings(name, dataset, profile), overrides.get(section) or {})

    cfg = {"standin": load_config("clip_standin", profile, settings("clip_standin", "standin")),
           "adapt": load_config("clip4idc_adapt", profile, settings("clip4idc_adapt", "adapt")),
           "caption": load_config("clip4idc_caption", profile, settings("clip4idc_caption", "caption"))}
    clip = dict(cfg["adapt"].pop("clip"))
    if clip_model is not None:
        clip = {"model": clip_model, "pretrained": pretrained}
    elif pretrained is not None:
        clip["pretrained"] = pretrained
    cfg["clip"] = clip
    runs = check_output_dir(Path(runs_dir) if runs_dir else paths.runs_dir(), "runs_dir")
    # every setting is checked before the data is generated (a bad one would otherwise leave a dataset behind)
    device, loader = base.runtime(profile, device)
    _vision_config(clip["model"])
    _check_pretrained(clip["model"], clip["pretrained"])
    data = pair_dataset(dataset, profile, data_root, progress=progress)
    described = _description_data(data, profile, progress) if clip["pretrained"] is None else None
    return Setup(profile, cfg, data, runs, device=device, loader=loader, progress=progress, described=described)


def dataset_settings(name: str, dataset: str, profile: str) -> dict[str, Any]:
    """The settings config file ``name`` gives one dataset at ``profile``: its ``datasets`` block,
    ``{"editing-request": {"cpu": {...}}}``, applied on top of the profile (and under a notebook's overrides).
    CLEVR-Change, the files' own subject, has none."""
    block = read_config_file(name).get("datasets", {}).get(dataset, {})
    return copy.deepcopy(block.get(profile, {}))


def _vision_config(model: str) -> dict:
    cfg = open_clip.get_model_config(model)
    if cfg is None:
        raise ConfigError(f"unknown CLIP architecture {model!r}",
                          fix="use one of open_clip.list_models(), e.g. 'ViT-B-32' or 'idckit-standin-ViT-T-16'")
    return cfg["vision_cfg"]


def _check_pretrained(model: str, pretrained: object) -> None:
    """Weights that are neither a file nor a tag open_clip knows fail here, not after caches and a run are written."""
    if pretrained is None:
        return
    if not isinstance(pretrained, (str, os.PathLike)):
        raise WeightsUnavailableError(f"pretrained must be a file path or an open_clip tag, got {pretrained!r}",
                                      fix="pass e.g. pretrained='openai' or pretrained='/path/to/clip.pt'")
    if os.path.isfile(pretrained) or open_clip.is_pretrained_cfg(model, str(pretrained)):
        return
    tags = open_clip.list_pretrained_tags_by_model(model)
    raise WeightsUnavailableError(f"CLIP weights {str(pretrained)!r} are neither a file nor an open_clip tag of "
                                  f"{model} ({', '.join(tags[:4]) or 'it has none'})", path=pretrained,
                                  fix="check the path, or run `idckit pretrain-clip` for the offline stand-in and "
                                      "pass the checkpoint it prints; pretrained=None uses the profile's choice")


# -- shared in-memory data and caches -------------------------------------------------------------------------
def _image_cache_dir(s: Setup, data: DataChoice) -> Path:
    # the data's content, not its path: a moved or renamed dataset keeps its cache
    return s.runs_dir / "images" / f"{data.tag}-{image_size(s)}px"


def loaded_data(s: Setup):
    """The in-memory data of a setup (:class:`idckit.tasks.clip4idc.PairData`: images as uint8, decoded once and
    cached on disk beside the runs, and BPE captions), shared by all runs of a process."""
    key = (str(s.data.root), image_size(s), s.config["caption"]["max_len"])
    return base.CACHE.get("clip4idc-data", key, lambda: load_pair_data(
        s.data.dataset(), image_size(s), max_len=s.config["caption"]["max_len"], cache_dir=_image_cache_dir(s, s.data),
        progress=s.progress))


def caption_data(s: Setup):
    """:func:`loaded_data` with the captions at the caption stage's length (``caption_max_len``; null: ``max_len``,
    the adaptation's text length)."""
    data, n = loaded_data(s), s.config["caption"]["caption_max_len"]
    if n is None:
        return data
    key = (str(s.data.root), image_size(s), data.max_len, n)
    return base.CACHE.get("clip4idc-caption-data", key, lambda: with_text_length(data, n))


def _intra_cache(s: Setup, clip: dict, n_intra: int) -> Any:
    """The intra-stage outputs of every image under this CLIP's own (frozen) weights split at ``n_intra`` (once per
    process; the tasks check the weights' fingerprint before using it)."""
    def compute():
        data = loaded_data(s)
        rows = torch.cat([torch.cat([sp.before, sp.after, sp.distractor_row[sp.distractor_row >= 0]])
                          for sp in data.splits.values()])
        torch.manual_seed(0)        # the split's new layers are drawn but never enter the intra stage
        encoder = CLIP4IDCRetrieval(load_clip(clip["name"], clip["weights"])[0], n_intra=n_intra).pair_encoder
        return IntraCache.compute(encoder.to(_device(s)), data.images, rows, progress=s.progress)

    # a notebook's splits come one after another
    return base.CACHE.get("clip4idc-intra", (str(s.data.root), clip["key"], n_intra), compute, keep=3)


def _device(s: Setup):
    return resolve(s.device)


def _train_config(c: dict, seed: int, samples_per_epoch: int, batch_size: int):
    """The loop's TrainConfig from a ``train`` block in epochs of ``samples_per_epoch`` samples."""
    return train_config(c, seed, steps_per_epoch=max(1, samples_per_epoch // batch_size))


# -- 1. the CLIP ----------------------------------------------------------------------------------------------
def _file_identity(path: str) -> str:
    p = Path(path)
    h = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"file:{p.name}:{h.hexdigest()[:16]}"


def _description_data(data: DataChoice, profile: str, progress: bool) -> DataChoice:
    """Where the stand-in learns: this data if it has scene descriptions, else the profile's synthetic default of
    the same dataset (a real release has no single-image descriptions)."""
    if (data.root / "scene_descriptions.json").is_file():
        read_descriptions(data.root / "scene_descriptions.json")  # a damaged file is named before a run starts
        return data
    return pair_dataset(data.name, profile, None, progress=progress)


def clip_weights(s: Setup, *, progress: bool | None = None) -> dict[str, Any]:
    """``{"name", "weights", "key", "run", "description", ...}``: what every later run loads with ``load_clip``.

    With named weights nothing is trained. Otherwise the stand-in is pre-trained (once; cached by its config)."""
    progress = s.progress if progress is None else progress
    name, pretrained = clip_model(s), s.config["clip"]["pretrained"]
    if pretrained is not None:
        is_file = os.path.isfile(str(pretrained))
        return {"name": name, "weights": str(pretrained), "run": None, "wall_seconds": 0.0,
                "key": _file_identity(str(pretrained)) if is_file else f"tag:{pretrained}",
                "description": f"open_clip {name} ({'local file ' if is_file else ''}{pretrained})"}
    c = copy.deepcopy(s.config["standin"])
    if c["model"] != name:
        raise ConfigError(f"the stand-in pre-training config builds {c['model']!r} but the CLIP asked for is "
                          f"{name!r}", fix="pass pretrained=<weights> for other architectures, or set "
                                           "overrides={'standin': {'model': ...}}")
    described = s.described
    if described is None:     # a Setup made by hand with named weights, then asked for the stand-in
        raise ConfigError("this setup has no description data for the stand-in CLIP (it was made with named weights)",
                          fix="call clip4idc.setup(...) with pretrained=None for the stand-in")
    root = described.root
    run = open_run(s.runs_dir, "clip-standin", {"kind": "clip-standin", "data": described.identity,
                                                "data_version": described.version, "standin": c, "seed": 0})
    path = run.dir / "clip.pt"
    with run.exclusive():
        if not run.is_complete():
            t0 = time.perf_counter()
            data = load_description_data(root, image_size(s), cache_dir=_image_cache_dir(s, described) / "standin",
                                         progress=progress, dataset=described.dataset())
            task = StandinPretrainTask(data, name, batch_size=c["batch_size"], weight_decay=c["weight_decay"],
                                       eval_batch_size=c["eval_batch_size"])
            res = loop.fit(task, _train_config(c["train"], 0, len(data.train_scenes), c["batch_size"]), run.dir,
                           progress=progress, device=s.device, loader=s.loader)
            if distributed.is_main():
                save_clip_checkpoint(res.model.cpu(), path, name)
                run.complete({"val": res.best_metrics, "best_step": res.best_step, "steps": res.steps,
                              "history": res.history, "train_seconds": res.wall_seconds,
                              "wall_seconds": round(time.perf_counter() - t0, 1), "checkpoint": str(path)},
                             profile=s.profile, data_identity=described.identity)
            distributed.barrier()
    m = run.metrics()
    return {"name": name, "weights": str(path), "key": f"standin:{run.key}", "run": run.dir.name, "val": m["val"],
            "wall_seconds": m["wall_seconds"], "steps": m["steps"],
            "description": f"{STANDIN_LABEL}: {name} pre-trained here on train-image scene descriptions "
                           f"({m['steps']} steps, val image<->text R@1 {m['val']['R@1']:.1f})"}


# -- 2. adaptation --------------------------------------------------------------------------------------------
def retrieval_ks(s: Setup) -> tuple[int, ...]:
    """R@K reported for this dataset: 1/5/10 and the paper's table 6 values (Spot-the-Diff: 10/20/50)."""
    return tuple(sorted({1, 5, 10, *registry.dataset(s.data.name).paper_ks}))


def _adapt_task(s: Setup, clip: dict, n_intra: int, *, freeze_intra: bool | None = None):
    """The adaptation task (``freeze_intra`` None: the config's; False: plain CLIP's whole tower, which the intra
    cache of the split encoder does not serve)."""
    c = s.config["adapt"]
    frozen = c["freeze_intra"] if freeze_intra is None else freeze_intra
    return AdaptTask(loaded_data(s), clip["name"], clip["weights"], n_intra=n_intra, batch_size=c["batch_size"],
                     clip_lr_scale=c["clip_lr_scale"], weight_decay=c["weight_decay"], swap_prob=c["swap_prob"],
                     freeze_intra=frozen, freeze_embeddings=c["freeze_embeddings"],
                     eval_batch_size=c["eval_batch_size"], progress=s.progress, ks=retrieval_ks(s),
                     intra_cache=_intra_cache(s, clip, n_intra) if frozen else None, decay_rule=c["decay_rule"])


def adapt(s: Setup, n_intra: int | None = None, seed: int = 0, *, progress: bool | None = None) -> dict[str, Any]:
    """Retrieval adaptation (cached). Returns ``{"model", "run", "n_intra", "seed", "clip", "val", "test",
    "test_unadapted", "test_plain_clip", "history", "wall_seconds", ...}``: test retrieval after adaptation, of the
    same split encoder before it (fresh e1/e2/p/ln_mid, same seed) and of plain CLIP (mean of the two images'
    embeddings, no joint layers)."""
    progress = s.progress if progress is None else progress
    check_seeds([seed])
    n_intra = default_n_intra(s) if n_intra is None else _check_n_intra(s, n_intra)
    clip = clip_weights(s, progress=progress)
    c = s.config["adapt"]
    run = open_run(s.runs_dir, "clip4idc-adapt", {"kind": "clip4idc-adapt", **s.identity, "clip": clip["key"],
                                                  "clip_model": clip["name"], "n_intra": n_intra,
                                                  "max_len": s.config["caption"]["max_len"], "adapt": c,
                                                  "seed": seed})
    with run.exclusive():
        if not run.is_complete():
            t0 = time.perf_counter()
            task = _adapt_task(s, clip, n_intra)
            dev = _device(s)
            torch.manual_seed(seed)
            before = task.evaluate(task.build_model().to(dev), "test")
            plain_model = CLIP4IDCRetrieval(load_clip(clip["name"], clip["weights"])[0], n_intra=depth(s), joint=False)
            plain = _evaluate_plain(_adapt_task(s, clip, n_intra, freeze_intra=False), plain_model.to(dev))
            samples = len(task.samples)
            res = loop.fit(task, _train_config(c["train"], seed, samples, c["batch_size"]), run.dir, progress=progress,
                           device=dev, loader=s.loader)
            test = task.evaluate(res.model, "test")
            authors = selection.with_test(selection.authors_entry(res, task, run.dir,
                                                                  lambda m: task.evaluate(m, "test")), test)
            if distributed.is_main():
                run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                              "stopped": res.stopped, "test": test, "test_unadapted": before, **authors,
                              "test_plain_clip": plain, "train_seconds": res.wall_seconds,
                              "wall_seconds": round(time.perf_counter() - t0, 1)}, **_about(s))
            distributed.barrier()
    return {"model": MODEL, "run": run.dir.name, "n_intra": n_intra, "n_inter": depth(s) - n_intra, "seed": seed,
            "clip": clip["description"], **run.metrics(), "_best": str(run.dir / "best.pt")}


def _check_n_intra(s: Setup, n_intra: object) -> int:
    if isinstance(n_intra, bool) or not isinstance(n_intra, int) or not 0 <= n_intra <= depth(s):
        raise ConfigError(f"n_intra={n_intra!r} must be an integer in [0, {depth(s)}] for {clip_model(s)}'s "
                          f"{depth(s)}-layer ViT", fix=f"pass n_intra=None for the default ({default_n_intra(s)}), or "
                                                     "one of layer_splits(s)")
    return n_intra


def _evaluate_plain(task, model) -> dict[str, float]:
    """Retrieval of plain CLIP (``task`` without frozen intra blocks): each image through the whole tower, pair
    vector = mean of the two embeddings."""
    sim, text_pair = task.similarity(model, "test")
    return retrieval_metrics(sim, text_pair, ks=task.ks)


# -- 3. captioning --------------------------------------------------------------------------------------------
def _final_scorer(meteor: bool):
    """One scorer (one METEOR JVM) for every final test scoring of the process (one with METEOR serves both)."""

    def start():
        scorer = CaptionScorer(meteor=meteor)
        atexit.register(scorer.close)
        return scorer

    with_meteor = base.CACHE.get("scorer-meteor", True, start) if meteor else None
    return with_meteor or base.CACHE.get("scorer", False, start)


def run_variant(s: Setup, variant: str = "clip4idc", seed: int = 0, *, n_intra: int | None = None,
                freeze_visual: bool | None = None, progress: bool | None = None) -> dict[str, Any]:
    """The recipe ``clip4idc/<variant>`` on ``s``: adapt (if it does), caption, select on val, decode and score
    test; every stage cached by its config. ``clip4idc/adapt`` stops after the adaptation (at ``seed``; the
    captioners start from seed 0's) and returns :func:`adapt`'s result with the same keys (its caption counts and
    ``judge_accuracy`` None).

    ``freeze_visual`` None: the profile's choice (frozen at smoke/cpu, fine-tuned at its small lr at paper); True
    freezes the pair encoder (paper table 7). Returns :data:`idckit.experiments.runs.RESULT_KEYS` (``test``:
    subset -> metric on pycocoevalcap's raw scale, CIDEr-D 1.0 = 100 in the papers; ``judge_accuracy`` None: the
    captioner has no distractor judge) and ``n_intra``, ``clip`` (the CLIP's description), ``adapt`` (the
    adaptation run's retrieval, None without one), ``caption_seconds``, ``adapt_seconds``, ...."""
    recipe = recipes.get_recipe(variant, FAMILY)
    check_seeds([seed])
    progress = s.progress if progress is None else progress
    v = recipe.settings
    variant = recipe.variant
    n_intra = default_n_intra(s) if n_intra is None else _check_n_intra(s, n_intra)
    if v["captioner"] is None:     # clip4idc/adapt: the retrieval stage alone, at this seed
        ad = adapt(s, n_intra, seed, progress=progress)
        # the keys of every recipe's result: a retrieval run decodes no captions and has no judge
        return {"recipe": recipe.name, "variant": variant, "label": recipe.label, **ad,
                "run_dir": str(s.runs_dir / ad["run"]), "distinct_test_captions": None, "test_pairs": None,
                "judge_accuracy": None}
    clip = clip_weights(s, progress=progress)
    ad = adapt(s, n_intra, 0, progress=progress) if v["adapt"] else None
    c = copy.deepcopy(s.config["caption"])
    frozen = c["captioner"]["freeze_visual"] if freeze_visual is None else bool(freeze_visual)
    captioner = {**c.pop("captioner"), **v["captioner"], "freeze_visual": frozen}
    captioner["n_intra"] = n_intra if variant != "clip-ft" else None
    c["train"] = caption_train(c["train"], captioner)
    run = open_run(s.runs_dir, "clip4idc-caption", {"kind": "clip4idc-caption", **s.identity, "clip": clip["key"],
                                                    "clip_model": clip["name"], "captioner": captioner,
                                                    "init": ad["run"] if ad else None, "caption": c,
                                                    "seed": seed})
    with run.exclusive():
        if not run.is_complete():
            _caption(s, run, clip, captioner, ad, progress)
    return variant_result(MODEL, recipe, seed, run, train_seconds="caption_seconds", n_intra=captioner["n_intra"],
                          clip=clip["description"],
                          adapt={k: ad[k] for k in ("run", "val", "test", "test_unadapted")} if ad else None)


def caption_train(train: dict[str, Any], captioner: dict[str, Any]) -> dict[str, Any]:
    """The captioning run's ``train`` section for ``captioner``: the profile's, without ``stop_on_collapse`` for the
    difference-token variant."""
    if not captioner.get("difference_tokens"):
        return train
    # the collapse stop is sized on the paper's captioner, which writes one sentence at every cpu budget on CLEVR;
    # this variant learns there (lab/notes/clip4idc.md), and early one-sentence evaluations do not say it cannot
    return {k: v for k, v in train.items() if k != "stop_on_collapse"}


def _caption(s: Setup, run: Run, clip: dict, captioner: dict, ad: dict | None, progress: bool) -> None:
    t0 = time.perf_counter()
    c = run.config["caption"]
    data = caption_data(s)
    # a frozen encoder whose intra blocks still hold CLIP's own weights (no adaptation, or one that froze them)
    # reads the notebook's shared intra cache (the task checks the weights' fingerprint before using it)
    shared = captioner["freeze_visual"] and (ad is None or s.config["adapt"]["freeze_intra"])
    split = depth(s) if captioner["n_intra"] is None else captioner["n_intra"]     # CLIP-FT: the whole tower
    intra = _intra_cache(s, clip, split) if shared else None
    with CaptionScorer(meteor=False) as quick:
        task = CaptionTask(data, clip["name"], clip["weights"], captioner, batch_size=c["batch_size"],
                           visual_lr_scale=c["visual_lr_scale"], captions_per_pair=c["captions_per_pair"],
                           init_from=ad["_best"] if ad else None, intra_cache=intra,
                           trim_vocab=c["trim_vocab"], eval_batch_size=c["eval_batch_size"], scorer=quick,
                           progress=progress, decay_rule=c["decay_rule"], loss_reduction=c["loss_reduction"],
                           weight_decay=c["train"]["weight_decay"], freeze=c["freeze"],
                           decode_min_words=c["decode_min_words"], decode_cut=c["decode_cut"])
        scenes = len(task.scenes)
        res = loop.fit(task, _train_config(c["train"], run.config["seed"], scenes, c["batch_size"]), run.dir,
                       progress=progress, device=s.device, loader=s.loader)
        t1 = time.perf_counter()
        preds = task.predict(res.model, "test")
        decode_seconds = time.perf_counter() - t1
    split = data.splits["test"]

    def test_scores(model) -> dict[str, Any]:
        captions = task.predict(model, "test")
        return evaluate_pairs(split.references, captions, dict(zip(split.pair_ids, split.types)),
                              scorer=_final_scorer(c["meteor"]), meteor=c["meteor"]) if distributed.is_main() else {}

    authors = selection.authors_entry(res, task, run.dir, test_scores)
    if not distributed.is_main():      # rank 0 scores and writes; the others wait for the finished run
        distributed.barrier()
        return
    write_results(run.dir / "test", preds)
    test = evaluate_pairs(split.references, preds, dict(zip(split.pair_ids, split.types)),
                          scorer=_final_scorer(c["meteor"]), meteor=c["meteor"])
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "steps": res.steps, "max_steps": res.max_steps,
                  "stop_on_collapse": c["train"].get("stop_on_collapse"), "test": test,
                  "caption_seconds": round(res.wall_seconds, 1),
                  "adapt_seconds": ad["wall_seconds"] if ad else 0.0,
                  "clip_pretrain_seconds": clip.get("wall_seconds", 0.0),
                  "test_decode_seconds": round(decode_seconds, 1),
                  "wall_seconds": round(time.perf_counter() - t0, 1), **selection.with_test(authors, test)},
                 **_about(s))
    distributed.barrier()


def _about(s: Setup) -> dict[str, Any]:
    """What a run's record.json says beside the commit."""
    return {"profile": s.profile, "data": s.data.description, "data_identity": s.data.identity}


#: every requested variant (default: every ``clip4idc/*`` recipe) for every seed on one setup (one CLIP)
runs = base.family_runs(run_variant, FAMILY)


def layer_splits(s: Setup) -> list[dict[str, Any]]:
    """Table 7's splits for this CLIP: N_intra from half the depth to all of it (the paper's 6/6 ... 12/0 of 12).

    Each comes with the paper's split at the same relative depth (N_intra / depth), when there is one."""
    out = []
    for k in range(depth(s) // 2, depth(s) + 1):
        paper = 12 * k / depth(s)
        out.append({"n_intra": k, "n_inter": depth(s) - k, "label": f"{k}/{depth(s) - k}",
                    "paper_split": f"{int(paper)}/{12 - int(paper)}" if paper == int(paper) else None,
                    "relative_depth": k / depth(s)})
    return out


# -- what the notebooks show (their rows: idckit.experiments.reporting) ------------------------------------------
def test_pairs_retrieved(s: Setup) -> int:
    """How many candidate pairs test retrieval ranks: the change pairs of the test split (distractors have no
    change caption to retrieve)."""
    return sum(p.is_change for p in s.data.dataset().pairs("test", check_images=False))


def retrieval_keys(s: Setup) -> tuple[str, ...]:
    """The retrieval metrics of this dataset's rows, both directions: R@K for :func:`retrieval_ks`, MdR, MnR
    (:data:`idckit.experiments.reporting.RETRIEVAL_KEYS` on CLEVR-Change; Spot-the-Diff adds the paper's R@20 and
    R@50)."""
    return tuple(f"{d}_{m}" for d in ("t2p", "p2t") for m in (*(f"R@{k}" for k in retrieval_ks(s)), "MdR", "MnR"))


BASELINE_VARIANT = "most frequent training sentence"


def text_baseline(s: Setup) -> dict[str, Any]:
    """The text-only baseline as a report row (x100): the most frequent training sentence (every annotator's
    sentences pooled, ties broken alphabetically) written for every test pair, scored like the captioners (the same
    references, PTB tokenisation and METEOR setting). It sees no image, so a captioner below it has learned less
    from the images than the sentence distribution alone is worth. ``sentence`` holds the sentence."""
    ds = s.data.dataset()
    sentence = most_frequent(ds.references("train"))
    refs = ds.references("test")
    meteor = s.config["caption"]["meteor"]
    test = evaluate_pairs(refs, dict.fromkeys(refs, sentence), ds.types("test"), scorer=_final_scorer(meteor),
                          meteor=meteor)
    return {"model": reporting.BASELINE_MODEL, "variant": BASELINE_VARIANT, "split": "test", "subset": "total",
            "sentence": sentence, "metrics": to_paper_scale(test["total"])}


def provenance(s: Setup, results: Sequence[dict[str, Any]], seeds: Sequence[int], wall_seconds: float,
               selection: str = "val (CIDEr-D)"):
    clip = clip_weights(s, progress=False)
    # wall_seconds is this notebook's; the training behind it happened once, in the cached runs
    adapt_runs = {r["adapt"]["run"]: r["adapt_seconds"] for r in results if r.get("adapt")}
    adapt_runs.update({r["run"]: r["wall_seconds"] for r in results if "test_plain_clip" in r})
    train_seconds = (sum(r.get("caption_seconds", 0.0) for r in results) + sum(adapt_runs.values())
                     + clip.get("wall_seconds", 0.0))
    weights = clip["description"] if clip["run"] else f"{clip['weights']} (not the stand-in)"
    return Provenance(profile=s.profile, data=s.data.description, data_version=s.data.version,
                      backbone=f"CLIP {clip['name']} on pixels ({image_size(s)} px, {depth(s)} layers)",
                      weights=weights, seeds=list(seeds), wall_seconds=round(wall_seconds, 1),
                      selection_split=selection,
                      extra={"clip": STANDIN_LABEL if clip["run"] else f"OpenAI/open_clip weights: {clip['weights']}",
                             "clip_run": clip["run"], "runs": [r["run"] for r in results],
                             "train_seconds": round(train_seconds, 1),
                             "caption_model": s.config["caption"]["captioner"],
                             "visual_encoder_in_captioning": "frozen (pair tokens computed once)"
                             if s.config["caption"]["captioner"]["freeze_visual"] else
                             f"fine-tuned at {s.config['caption']['visual_lr_scale']} x the caption lr"})


# -- the `idckit pretrain-clip` command -------------------------------------------------------------------------
def pretrain_clip(profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
                  runs_dir: str | Path | None = None, out: str | Path | None = None, progress: bool = True,
                  device: str | None = None, dataset: str = "clevr-change") -> dict[str, Any]:
    """Pre-train (or find in the run cache) the offline stand-in CLIP; ``out`` also copies the checkpoint there.

    ``dataset`` names the layout of ``data_root`` (and whose synthetic default is used without one).

    Returns :func:`clip_weights`' dict; ``weights`` is the file to pass as ``pretrained=`` (or ``--weights`` of
    ``idckit features --backbone clip:idckit-standin-ViT-T-16``)."""
    if out is not None:  # before minutes of training, not after; never onto the data or a file the kit did not write
        out = fileio.claim_file(out, "--out", inputs=[data_root] if data_root else [], recognise=_is_clip_checkpoint,
                                what="a CLIP checkpoint idckit wrote")
    s = setup(profile, data_root, runs_dir=runs_dir, clip_model=load_config("clip_standin", profile)["model"],
              pretrained=None, progress=progress, device=device, dataset=dataset)
    info = clip_weights(s, progress=progress)
    if out is not None:
        fileio.copy_file(info["weights"], out)     # complete or absent, never half a checkpoint
        info = {**info, "weights": str(out)}
    return info


def _is_clip_checkpoint(path: Path) -> bool:
    """What ``save_clip_checkpoint`` writes: {"state_dict": tensors, "model_name": str}."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - any unreadable file is not one
        return False
    return isinstance(ckpt, dict) and isinstance(ckpt.get("model_name"), str) and isinstance(ckpt.get("state_dict"),
                                                                                               dict)


__all__ = ["FAMILY", "MODEL", "STANDIN_LABEL", "Setup", "setup", "loaded_data", "caption_data", "clip_weights",
           "adapt", "run_variant", "runs", "layer_splits", "retrieval_keys", "test_pairs_retrieved", "text_baseline",
           "BASELINE_VARIANT", "provenance", "pretrain_clip"]
