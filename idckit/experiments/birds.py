"""IDC-PCL on Birds-to-Words with cross-task pre-training: the runs behind IDC-PCL's tables 1 and 5.

Each variant is a chain of cached runs (the public code's ``bird/`` stages):

1. GIC stage (variants with CUB): pre-training on CUB image-caption pairs whose second image is empty (all-zero
   features), MLM/MVCL on the real image, FDA with Retrieve + Replace negatives only;
2. Birds-to-Words pre-training (MLM:MVCL:FDA = 9:1:2, Confuse negatives swap ``animal1``/``animal2``), with the
   FGVC task on NABirds pairs mixed in at 3 of every 15 steps (NABirds:Birds-to-Words = 1:4) in variants with
   NABirds; it starts from the GIC stage's weights when there is one;
3. fine-tuning on Birds-to-Words (training pairs also shown mirrored), the checkpoint chosen on val (the
   paper: ROUGE-L; the cpu profile keeps its last one, :func:`selection`), scored without the PTB tokenizer (the
   text is pre-tokenised).

One vocabulary (Birds-to-Words + CUB training text) and one feature store (every image of the three datasets)
serve every variant, so the chains differ only in their data. Deviation: the public code's GIC stage drops the
second image's regions and keeps a lone [IMG2] token; here the second image is present as zero features (the
model's layout stays fixed) and MVCL never masks or contrasts against it.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import torch

from idckit import paths, registry
from idckit.data.nabirds import sample_pairs
from idckit.data.synth.bird_text import difference_recall, verified_share
from idckit.data.synth.birds import pair_animals
from idckit.eval.baselines import NearestFeaturePair, most_frequent
from idckit.eval.captions import CaptionScorer, evaluate_pairs, write_results
from idckit.experiments import base, recipes
from idckit.experiments.base import Setup
from idckit.experiments.config import check_profile, check_seeds, load_config, train_config
from idckit.experiments.data import birds
from idckit.experiments.pcl import MODEL
from idckit.experiments.runs import Run, open_run, variant_result
from idckit.experiments.selection import authors_entry, with_test
from idckit.fileio import check_output_dir
from idckit.reports.report import Provenance
from idckit.tasks.pcl import FinetuneTask, PretrainTask, predict
from idckit.text.negatives import build_negatives
from idckit.text.pcl_inputs import FGVCData, PairRecord, pcl_data_from_records
from idckit.text.vocab import Vocab
from idckit.train import loop

FAMILY = registry.family("birds").recipe_family  # its recipes: pcl-birds/b2w, ... (table 5)
#: table 1's names of the ``b2w`` and ``both`` rows (IDC-PCL, IDC-PCL + extra data)
TABLE1_LABELS = {v: recipes.get_recipe(v, FAMILY).row_label("pcl.table1") for v in ("b2w", "both")}
#: the words a Confuse negative exchanges (Birds-to-Words' two referents)
ANIMALS = (("animal1", "animal2"),)


def setup(profile: str = paths.DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          runs_dir: str | Path | None = None, overrides: dict | None = None, progress: bool = True,
          device: str | None = None) -> Setup:
    """Data (SynthBirds generated on first use unless ``data_root``) and the grid features of every image of its
    three datasets (extracted once, cached). ``device``: None (``configs/runtime.json``'s), ``cpu``, ``cuda:1``, ..."""
    check_profile(profile)
    cfg = load_config("pcl_birds", profile, overrides)
    runs = check_output_dir(Path(runs_dir) if runs_dir else paths.runs_dir(), "runs_dir")
    device, loader = base.runtime(profile, device)   # an unknown device fails before SynthBirds is generated
    data = birds(profile, data_root, progress=progress)
    store = base.features(cfg, data.root, data.cache_name, runs, device=device, progress=progress,
                          images=data.images())
    return Setup(profile, cfg, data, runs, store=store, device=device, loader=loader)


# -- data in memory -------------------------------------------------------------------------------------------
def _rel(s: Setup, path: Path) -> str:
    return Path(path).resolve().relative_to(s.data.root).as_posix()


def _records(s: Setup):
    b2w = s.data.b2w()
    train = b2w.training_examples("train", swap=bool(s.config["swap_augment"]), only_with_images=True)
    train_pairs = list({p.pair_id: p for p, _ in train}.values())
    out = {"train": train_pairs, **{sp: b2w.pairs(sp, only_with_images=True) for sp in ("val", "test")}}
    return {sp: [PairRecord(p.pair_id, _rel(s, p.img1.path), _rel(s, p.img2.path), tuple(p.references),
                            p.selection, True) for p in pairs] for sp, pairs in out.items()}


def _cub_records(s: Setup):
    cub = s.data.cub()
    return [PairRecord(f"cub{im.image_id}", _rel(s, im.path), None, tuple(cub.captions(im)), "cub", True)
            for im in cub.images("train")]


def _negatives(s: Setup, data, ratio, referents=()) -> None:
    train = data.splits["train"]
    neg = build_negatives(train.references, ratio=ratio, seed=s.config["negatives"]["seed"],
                          referents=referents, cache_dir=s.runs_dir / "negatives", progress=False)
    data.negatives = neg.negatives
    data.negative_stats = {"tagger": neg.tagger, **{k: v for k, v in neg.stats.items()
                                                    if isinstance(v, (int, float, str))}}


def loaded_data(s: Setup, kind: str = "b2w"):
    """The in-memory data of a setup (:class:`idckit.text.pcl_inputs.PCLData`, loaded once per process). ``b2w``:
    Birds-to-Words (train/val/test, FDA negatives, NABirds FGVC pairs attached); ``gic``: CUB single-image caption
    pairs (train only, Retrieve + Replace negatives). One shared vocabulary."""
    key = (kind, str(s.data.root), str(s.store.directory), stage_max_len(s, kind), s.config["words_kept"],
           s.config["swap_augment"], s.config["fgvc_pairs"])
    return base.CACHE.get("birds-data", key, lambda: _load(s, kind), keep=2)    # b2w and gic of one setup


def stage_max_len(s: Setup, kind: str = "b2w") -> int:
    """The caption length of a stage's data: ``gic.max_len`` for the CUB stage where set (the authors' CUB config
    has 40, bird/config/pretrain_cub.json:16, their bird stages 80), else the family's ``max_len``."""
    own = s.config["gic"]["max_len"] if kind == "gic" else None
    return s.config["max_len"] if own is None else own


def _load(s: Setup, kind: str):
    records, cub = _records(s), _cub_records(s)
    vocab = Vocab.build([c for r in records["train"] for c in r.references] + [c for r in cub for c in r.references])
    if kind == "gic":
        data = pcl_data_from_records({"train": cub}, s.store, max_len=stage_max_len(s, "gic"), vocab=vocab,
                                     words_kept=s.config["words_kept"])
        _negatives(s, data, s.config["negatives"]["cub_ratio"])
    else:
        nab = s.data.nabirds()
        images = nab.images("train")
        keys = {im.uuid: _rel(s, im.path) for im in images}
        data = pcl_data_from_records(records, s.store, max_len=stage_max_len(s), vocab=vocab,
                                     extra_images=sorted(keys.values()), words_kept=s.config["words_kept"])
        _negatives(s, data, s.config["negatives"]["b2w_ratio"], referents=ANIMALS)
        index = nab.label_index
        pairs = sample_pairs(images, s.config["fgvc_pairs"], seed=s.config["negatives"]["seed"])
        t = lambda xs: torch.tensor(xs, dtype=torch.long)
        data.fgvc = FGVCData(rows1=t([data.rows[keys[p["img1"]]] for p in pairs]),
                             rows2=t([data.rows[keys[p["img2"]]] for p in pairs]),
                             class1=t([index[p["class_id1"]] for p in pairs]),
                             class2=t([index[p["class_id2"]] for p in pairs]), n_classes=len(index))
    return data


# -- the chain of runs ----------------------------------------------------------------------------------------
def _gic_run(s: Setup, seed: int) -> Run:
    c = copy.deepcopy(s.config["gic"])
    c.pop("max_len")        # the key holds the length the stage uses (a cpu GIC run keeps its key)
    return open_run(s.runs_dir, "pcl-birds-gic", {
        "kind": "pcl-birds-gic", **s.identity, "max_len": stage_max_len(s, "gic"), "model": s.config["model"],
        "negatives": s.config["negatives"]["cub_ratio"], "gic": c, "seed": seed})


def _pretrain_run(s: Setup, v: dict, seed: int, gic: Run | None) -> Run:
    c = copy.deepcopy(s.config["pretrain"])
    fgvc = c.pop("fgvc_ratio")
    if v["nabirds"]:
        c["ratios"]["fgvc"] = fgvc
    return open_run(s.runs_dir, "pcl-birds-pretrain", {
        "kind": "pcl-birds-pretrain", **s.identity, "max_len": s.config["max_len"], "model": s.config["model"],
        "negatives": s.config["negatives"]["b2w_ratio"], "swap_augment": s.config["swap_augment"],
        "fgvc_pairs": s.config["fgvc_pairs"] if v["nabirds"] else None, "pretrain": c,
        "init": None if gic is None else gic.key, "seed": seed})


def _pretrain(s: Setup, run: Run, kind: str, init: Run | None, progress: bool) -> None:
    with run.exclusive():
        if run.is_complete():
            return
        data = loaded_data(s, kind)
        c = run.config[kind if kind == "gic" else "pretrain"]
        model = dict(run.config["model"])
        if "fgvc" in c["ratios"]:
            model["n_classes"] = data.fgvc.n_classes
        task = PretrainTask(data, model, batch_size=c["batch_size"], ratios=c["ratios"], mask_prob=c["mask_prob"],
                            eos_prob=c["eos_prob"], region_prob=c["region_prob"], tau_mvcl=c["tau_mvcl"],
                            tau_fda=c["tau_fda"], init_from=None if init is None else init.dir / "best.pt",
                            mask_random_from=c["mask_random_from"], mask_none_chosen=c["mask_none_chosen"],
                            fda_samples=c["fda_samples"], sampling=c["sampling"])
        res = loop.fit(task, train_config(c["train"], run.config["seed"]), run.dir, progress=progress,
                       device=s.device, loader=s.loader)
        run.complete({"steps": res.steps, "wall_seconds": res.wall_seconds})


def run_variant(s: Setup, variant: str = "both", seed: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """The recipe ``pcl-birds/<variant>`` on ``s``: GIC (with CUB), Birds-to-Words pre-training (+ FGVC with
    NABirds), fine-tuning, val selection (:func:`selection`), test decoding and scoring; every stage cached by its
    config.

    Returns :data:`idckit.experiments.runs.RESULT_KEYS` (``test``: ``total`` and each pivot-branch selection, metrics
    on pycocoevalcap's raw scale; ``judge_accuracy`` None: Birds-to-Words has no distractors) and
    ``verified_share`` / ``difference_recall`` (SynthBirds only, else None): the share of the generated paragraphs'
    claims the grammar verifies for the pair, and of the pairs' differences they name.
    """
    recipe = recipes.get_recipe(variant, FAMILY)
    check_seeds([seed])
    v = recipe.settings
    gic = _gic_run(s, seed) if v["cub"] else None
    pre = _pretrain_run(s, v, seed, gic)
    ft = copy.deepcopy(s.config["finetune"])
    run = open_run(s.runs_dir, "pcl-birds-finetune", {
        "kind": "pcl-birds-finetune", **s.identity, "max_len": s.config["max_len"], "model": s.config["model"],
        "swap_augment": s.config["swap_augment"], "init": pre.key, "finetune": ft, "seed": seed})
    with run.exclusive():
        if not run.is_complete():
            if gic is not None:
                _pretrain(s, gic, "gic", None, progress)
            _pretrain(s, pre, "b2w", gic, progress)
            pre_seconds = pre.metrics()["wall_seconds"] + (gic.metrics()["wall_seconds"] if gic else 0.0)
            # the chain's wall time counts its earlier stages once, cached or trained here, as IDC-PCL's does
            _finetune(s, run, pre, progress, pre_seconds=pre_seconds, t0=time.perf_counter())
    return variant_result(MODEL, recipe, seed, run, train_seconds="finetune_seconds")


def _finetune(s: Setup, run: Run, pre: Run, progress: bool, *, pre_seconds: float, t0: float) -> None:
    data = loaded_data(s, "b2w")
    c = run.config["finetune"]
    with CaptionScorer(meteor=False) as quick:
        task = FinetuneTask(data, run.config["model"], batch_size=c["batch_size"], mask_prob=c["mask_prob"],
                            eos_prob=c["eos_prob"], distractor_weight=c["distractor_weight"],
                            loss_reduction=c["loss_reduction"], eval_batch_size=c["eval_batch_size"],
                            decode_min_words=c["decode_min_words"], mask_random_from=c["mask_random_from"],
                            mask_none_chosen=c["mask_none_chosen"], group_by_pair=c["group_by_pair"],
                            captions_per_pair=c["captions_per_pair"], targets=c["targets"],
                            init_from=pre.dir / "best.pt", scorer=quick, selection_metric=c["selection_metric"],
                            tokenize=c["tokenize"])
        res = loop.fit(task, train_config(c["train"], run.config["seed"]), run.dir,
                       progress=progress, device=s.device, loader=s.loader)
    data.vocab.save(run.dir / "vocab.json")
    split = data.splits["test"]

    def test_scores(model) -> dict[str, Any]:
        captions = predict(model, data, "test", batch_size=c["eval_batch_size"], progress=progress,
                           min_words=c["decode_min_words"])["captions"]
        return evaluate_pairs(split.references, captions, dict(zip(split.pair_ids, split.types)),
                              tokenize=c["tokenize"], meteor=s.config["meteor"])

    preds = predict(res.model, data, "test", batch_size=c["eval_batch_size"], progress=progress,
                    min_words=c["decode_min_words"])
    write_results(run.dir / "test", preds["captions"])
    test = evaluate_pairs(split.references, preds["captions"], dict(zip(split.pair_ids, split.types)),
                          tokenize=c["tokenize"], meteor=s.config["meteor"])
    authors = with_test(authors_entry(res, task, run.dir, test_scores), test)
    run.complete({"val": res.best_metrics, "best_step": res.best_step, "history": res.history,
                  "stopped": res.stopped, "test": test, "finetune_seconds": res.wall_seconds,
                  "pretrain_seconds": round(pre_seconds, 1),
                  "wall_seconds": round(time.perf_counter() - t0 + pre_seconds, 1),
                  **grammar_scores(s, preds["captions"]), "negatives": getattr(data, "negative_stats", None),
                  **authors})


def selection(s: Setup) -> str:
    """How ``s``'s profile chooses the fine-tuned checkpoint, in words for a report.

    The paper selects on val ROUGE-L. The cpu profile scores val once, after the last step, and so keeps the last
    checkpoint: on 60 val pairs ROUGE-L is highest for early checkpoints that write one central paragraph for every
    pair, and CIDEr-D selection still picked checkpoints with 2-19 distinct paragraphs on the cross-task chain
    (docs/cpu_profile.md; lab/notes/birds.md, "The collapse ends; the selection brings it back")."""
    c = s.config["finetune"]
    t, metric = c["train"], c["selection_metric"].replace("_", "-")
    if not t.get("eval_every"):
        return f"the last checkpoint (step {t['max_steps']:,}; val {metric} scored once, at the end)"
    return f"the checkpoint with the best val {metric} (scored every {t['eval_every']:,} steps)"


def grammar_scores(s: Setup, paragraphs: dict[str, str], split: str = "test") -> dict[str, float | None]:
    """SynthBirds' truth check of paragraphs (None on real data, which has no attribute ground truth)."""
    if not s.data.synthetic:
        return {"verified_share": None, "difference_recall": None}
    animals = pair_animals(s.data.root, split)
    return {"verified_share": verified_share(paragraphs, animals),
            "difference_recall": difference_recall(paragraphs, animals)}


#: every requested variant (default: every ``pcl-birds/*`` recipe) for every seed on one setup (shared data and
#: features)
runs = base.family_runs(run_variant, FAMILY)


# -- text-only and nearest-neighbour baselines ---------------------------------------------------------------
def baselines(s: Setup) -> list[dict[str, Any]]:
    """The most frequent training paragraph for every pair, and the paragraph of the training pair nearest in
    the (mean-pooled) features of both images; scored like the model (test, no PTB tokenizer)."""
    data = loaded_data(s, "b2w")
    train, test = data.splits["train"], data.splits["test"]
    types = dict(zip(test.pair_ids, test.types))
    predictions = {
        "most frequent paragraph": {p: most_frequent(train.references) for p in test.pair_ids},
        "nearest neighbour (features of both images)": NearestFeaturePair().fit(
            data.features[train.before], data.features[train.after], [train.references[p] for p in train.pair_ids]
        ).predict(data.features[test.before], data.features[test.after], test.pair_ids),
    }
    out = []
    meteor = s.config["meteor"]
    with CaptionScorer(meteor=meteor) as scorer:   # one METEOR start-up for both
        tokenize = s.config["finetune"]["tokenize"]    # the kit's captioners and these baselines on one scale
        scored = {name: evaluate_pairs(test.references, preds, types, tokenize=tokenize, meteor=meteor, scorer=scorer)
                  for name, preds in predictions.items()}
    for name, preds in predictions.items():
        scores = scored[name]
        out.append({"label": name, "test": scores, "distinct_test_captions": len(set(preds.values())),
                    "test_pairs": len(preds), **grammar_scores(s, preds), "captions": preds})
    return out


# -- what the notebooks show (their rows: idckit.experiments.reporting) ------------------------------------------
#: SynthBirds' grammar scores of a result, shown among a row's metrics as percentages
#: (``idckit.experiments.reporting.rows(results, percent=GRAMMAR)``, ``baseline_rows(..., percent=GRAMMAR)``)
GRAMMAR = ("verified_share", "difference_recall")


def provenance(s: Setup, results: Sequence[dict[str, Any]], seeds: Sequence[int], wall_seconds: float):
    return Provenance(profile=s.profile, seeds=list(seeds), wall_seconds=round(wall_seconds, 1),
                      selection_split=f"val: {selection(s)}", data=s.data.description, data_version=s.data.version,
                      backbone=s.store.meta.get("backbone"), weights=s.store.meta.get("weights"),
                      extra={"model_size": s.config["model"], "max_len": s.config["max_len"],
                             "runs": [r["run"] for r in results],
                             "train_seconds": round(sum(r.get("finetune_seconds", 0.0) + r.get("pretrain_seconds", 0.0)
                                                        for r in results), 1),
                             "evaluation": "no PTB tokenisation (the text is pre-tokenised)"})


def shown_pairs(s: Setup, split: str = "test"):
    """The pairs of ``split`` as :func:`idckit.reports.plots.show_pairs` draws them (``before``/``after`` = animal1/animal2,
    ``change_type`` = the pivot-branch selection)."""
    return [SimpleNamespace(pair_id=p.pair_id, before=p.img1.path, after=p.img2.path, captions=list(p.references),
                            change_type=p.selection) for p in s.data.b2w().pairs(split, only_with_images=True)]
