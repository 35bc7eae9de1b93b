"""GPU-hours of a full `make reproduce PROFILE=paper` on one GPU (issue 49, item 7), from a `make gpu-check` record's
measured step times.

    python -m lab.scripts.gpu_hours [--record PATH] [--json OUT] [--clevr-captions-per-pair N]

Every training run a full paper reproduce makes on the four real releases (all four roots given, so no synthetic
hard twin trains): the kit's own job graph (:func:`idckit.reproduce.scheduler.lane_jobs`) for the IDC-PCL, DUDA and
birds runs, each expanded into its cached stages as the experiment modules key them (a stage two recipes share is
counted once), and :data:`CLIP4IDC_CALLS`, the CLIP4IDC notebooks' own training calls at their parameters'
defaults. Each run's steps, batch, evaluation cadence and caption lengths come from
``idckit.experiments.config.load_config(FILE, "paper")``; epochs become steps with the releases' counts of
:data:`idckit.registry.DATASETS`. A run's hours are its steps x the measured step time of its step kind (scaled by
its batch where that differs from the measured one), plus a validation decoding at each evaluation at the measured
decoding rate. Prints a table per run kind and per notebook and the total; ``--json`` writes the record.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from idckit.experiments import clip4idc, recipes
from idckit.experiments.config import load_config, train_config
from idckit.registry import DATASETS, NOTEBOOKS, family
from idckit.reproduce import runner, scheduler

RECORD = Path(__file__).resolve().parents[1] / "records" / "gpu" / "gpu_check_h200_2026-11-27.json"

#: CLEVR-Change change captions per change pair: the registry has no caption count for this release (its split
#: counts are scenes); each caption is one adaptation sample, so the CLEVR adaptations scale with it
CLEVR_CAPTIONS_PER_PAIR = 6.0

#: Birds-to-Words val and test pairs: the release publishes no exact counts (the registry: "about 3.3K pairs"; the
#: kit splits 80/10/10, docs/birds.md), so about a tenth of 3,300 each
BIRDS_SPLIT_PAIRS = 330

#: the CLIP4IDC notebooks' training calls, in the order a reproduce runs them (tables 1, 3, 4 first: the others wait
#: for them, scheduler.AFTER): (notebook, dataset, variants, first seed only, table 7's splits with a frozen
#: encoder, the call in the notebook's source; tests/test_gpu_hours.py checks that each call is there). Seeds are
#: the notebook's (:data:`idckit.registry.NOTEBOOKS`, equal to its ``seeds`` parameter's default).
CLIP4IDC_CALLS: tuple[tuple[str, str, tuple[str, ...], bool, bool, str], ...] = (
    ("clip4idc_table1_clevr_change", "clevr-change", ("clip4idc",), False, False,
     'clip4idc.runs(setup, ["clip4idc"], seeds)'),
    ("clip4idc_table1_clevr_change", "clevr-change", ("clip4idc-diff",), True, False,
     'clip4idc.runs(setup, ["clip4idc-diff"], seeds[:1]) if with_variant'),
    ("clip4idc_table3_spot_the_diff", "spot-the-diff", ("clip-ft", "clip4idc"), False, False,
     'clip4idc.runs(setup, ["clip-ft", "clip4idc"], seeds)'),
    ("clip4idc_table4_editing_request", "editing-request", ("clip-ft", "clip4idc"), False, False,
     'clip4idc.runs(setup, ["clip-ft", "clip4idc"], seeds)'),
    ("clip4idc_table2_change_types", "clevr-change", ("clip4idc",), False, False,
     'clip4idc.runs(setup, ["clip4idc"], seeds)'),
    ("clip4idc_table5_ablation", "clevr-change", ("clip-ft", "no-adapt", "clip4idc"), False, False,
     'clip4idc.runs(setup, ["clip-ft", "no-adapt", "clip4idc"], seeds)'),
    ("clip4idc_table5_ablation", "spot-the-diff", ("clip-ft", "no-adapt", "clip4idc"), False, False,
     'clip4idc.runs(spot, ["clip-ft", "no-adapt", "clip4idc"], seeds)'),
    ("clip4idc_table6_retrieval", "clevr-change", ("adapt",), False, False,
     'retrieval_table.build(profile, clevr_root, "clevr-change", seeds'),
    ("clip4idc_table6_retrieval", "spot-the-diff", ("adapt",), False, False,
     'retrieval_table.build(profile, spot_root, "spot-the-diff", seeds'),
    ("clip4idc_table6_retrieval", "editing-request", ("adapt",), False, False,
     'retrieval_table.build(profile, ier_root, "editing-request", seeds'),
    ("clip4idc_table7_layer_split", "clevr-change", ("clip4idc",), True, True,
     'clip4idc.run_variant(setup, "clip4idc", seed, n_intra=sp["n_intra"], freeze_visual=True)'),
)

NOT_COUNTED = (
    "data loading and host work (image decoding into the caches, batch assembly, checkpoint writes, Python "
    "overhead): the record times the steps alone",
    "feature extraction (ResNet-101 grid features of every CLEVR-Change and bird image; the CLIP image caches): not "
    "measured by the record",
    "test-set decoding and scoring (once per run; the caption metrics run on the CPU); the decoding alone is "
    "estimated in test_decoding_hours",
    "the retrieval evaluations on test before and after each adaptation, and plain CLIP's",
    "early stopping (IDC-PCL and birds fine-tuning, CLIP4IDC captioning): every such run is counted to its last "
    "step, an upper bound",
)


@dataclass
class Run:
    kind: str                   # the table's row: what the run trains
    name: str                   # which run: family/variant or stage, dataset, split, seed
    notebook: str               # the notebook (or lane job) that trains it first
    steps: int
    step_seconds: float         # per step, at the run's batch
    evals: int = 0
    eval_seconds: float = 0.0   # per evaluation
    test_seconds: float = 0.0   # one test decoding (not in the total)
    unscaled_step_seconds: float = 0.0  # per step if no batch below the measured one ran faster
    basis: list[str] = field(default_factory=list)
    proxy_seconds: float = 0.0  # of the run's seconds, those timed on a step kind the record does not measure

    @property
    def hours(self) -> float:
        return (self.steps * self.step_seconds + self.evals * self.eval_seconds) / 3600

    @property
    def unscaled_hours(self) -> float:
        return (self.steps * self.unscaled_step_seconds + self.evals * self.eval_seconds) / 3600


# -- the record -------------------------------------------------------------------------------------------------
class Measured:
    """The step times of a gpu-check record's throughput section."""

    def __init__(self, record: dict[str, Any]):
        self.steps = record["throughput"]["steps"]
        self.device = record.get("device", {}).get("name", "?")

    def _get(self, prefix: str) -> dict[str, Any]:
        hits = [v for k, v in self.steps.items() if k.startswith(prefix)]
        if len(hits) != 1:
            raise KeyError(f"the record has {len(hits)} step kinds named {prefix!r}*")
        return hits[0]

    def step(self, prefix: str) -> tuple[float, int]:
        """(seconds per step, samples per step) of a step kind."""
        row = self._get(prefix)
        return float(row["step_seconds"]), int(row["samples"])

    def rate(self, prefix: str) -> float:
        """Samples per second of a decoding kind."""
        seconds, samples = self.step(prefix)
        return samples / seconds


def _scaled(m: Measured, prefix: str, samples: int) -> tuple[float, float]:
    """(the step time at ``samples``, scaled linearly from the measured batch; that time never below the measured)."""
    seconds, measured = m.step(prefix)
    ratio = samples / measured
    return seconds * ratio, seconds * max(ratio, 1.0)


def _fda_samples(batch: int, ratio: Sequence[int]) -> int:
    """Captions of an FDA step: ``batch // (1 + negatives)`` pairs, each with its positive and its negatives
    (:class:`idckit.tasks.pcl.PretrainTask`)."""
    group = 1 + sum(ratio)
    return max(1, batch // group) * group


def pretrain_step(m: Measured, ratios: dict[str, int], batch: int, neg_ratio: Sequence[int]
                  ) -> tuple[float, float, list[str], float]:
    """Mean step time of a pre-training pool (one task per step, drawn by ``ratios``) at ``batch``: (seconds, seconds
    unscaled below the measured batch, notes, the seconds of it timed by a proxy)."""
    names = {"mlm": "IDC-PCL pre-training MLM", "mvcl": "IDC-PCL pre-training MVCL", "fda": "IDC-PCL pre-training FDA",
             "fgvc": "IDC-PCL pre-training MLM"}
    notes = []
    total = unscaled = proxy = 0.0
    for task, r in ratios.items():
        samples = _fda_samples(batch, neg_ratio) if task == "fda" else batch
        s, u = _scaled(m, names[task], samples)
        total, unscaled = total + r * s, unscaled + r * u
        if task == "fgvc":
            notes.append("FGVC steps not measured: timed as MLM steps at the same batch (proxy)")
            proxy += r * s
    n = sum(ratios.values())
    return total / n, unscaled / n, notes, proxy / n


def _evals(t) -> int:
    """Evaluations of a run of TrainConfig ``t`` as train/loop.py makes them: after updates ``eval_offset`` + k x
    ``eval_every`` (k >= 1), and at the last step when that is off the cadence and ``eval_at_end`` (or nothing was
    scored yet)."""
    offset, at_end = getattr(t, "eval_offset", 0), getattr(t, "eval_at_end", True)
    cadence = max(0, t.max_steps - offset) // t.eval_every if t.eval_every else 0
    on_cadence = bool(t.eval_every) and t.max_steps > offset and (t.max_steps - offset) % t.eval_every == 0
    return cadence + (0 if on_cadence or not (at_end or cadence == 0) else 1)


def _second_split(t) -> str | None:
    """The split a run's evaluation decodes a second time for the authors' selection (``authors_selection``:
    train/loop.py scores it apart on test, or on val with its own tokenisation), None when it reuses val's scores
    or the run has none."""
    rule = getattr(t, "authors_selection", None)
    if not rule or (rule["split"] == "val" and "tokenize" not in rule):
        return None
    return rule["split"]


def _pairs(dataset: str, split: str) -> int:
    """Pairs of a release's split as the kit's loaders give them (CLEVR-Change: two per scene)."""
    splits = DATASETS[dataset].release["splits"]
    n = splits[split]
    if dataset == "clevr-change":
        return 2 * n
    return n["pairs"]


def _eval_pairs(dataset: str, second: str | None) -> int:
    """Pairs decoded at one evaluation: val's, and those of the authors' selection's split when it decodes apart."""
    return _pairs(dataset, "val") + (_pairs(dataset, second) if second else 0)


def _second_note(second: str | None) -> str:
    if not second:
        return ""
    return f"; authors_selection evaluates {second} {'a second time' if second == 'val' else 'too'} at each evaluation"


# -- IDC-PCL, DUDA and the birds: the job graph's units ---------------------------------------------------------
def graph_units(names: Sequence[str] | None = None) -> tuple[list[str], dict[str, tuple[str, str, int]]]:
    """The paper reproduce's job graph: its prepare steps and its training jobs ({job: (family, variant, seed)})."""
    names = list(names) if names is not None else [p.stem for p in runner.discover()]
    with tempfile.TemporaryDirectory() as tmp:
        order, units, _, _ = scheduler.lane_jobs(names, profile="paper", roots=None, runs_dir=Path(tmp) / "runs",
                                                 report_dir=Path(tmp) / "reports")
    return [j for j in order if j.startswith(scheduler.PREPARE)], units


def _owner(job: str) -> str:
    """The first notebook of :data:`idckit.registry.TRAINS` whose units include lane job ``job``."""
    for nb in NOTEBOOKS:
        if job in {scheduler.unit_name(u) for u in scheduler.training_units(nb)}:
            return nb
    return job


def pcl_runs(m: Measured, units: dict[str, tuple[str, str, int]]) -> list[Run]:
    """Every stage the IDC-PCL, DUDA and birds units train, each once (the run-cache keys of
    idckit/experiments/pcl.py, birds.py and duda.py decide what two recipes share)."""
    runs: dict[tuple, Run] = {}
    for job, (fam, variant, seed) in units.items():
        nb = _owner(job)
        for key, run in _unit_stages(m, fam, variant, seed, nb):
            runs.setdefault(key, run)
    return list(runs.values())


def _unit_stages(m: Measured, fam: str, variant: str, seed: int, nb: str) -> list[tuple[tuple, Run]]:
    settings = recipes.get_recipe(variant, family(fam).recipe_family).settings
    if fam == "pcl":
        return _pcl_stages(m, variant, settings, seed, nb)
    if fam == "birds":
        return _birds_stages(m, variant, settings, seed, nb)
    if fam == "duda":
        return [_duda_stage(m, seed, nb)]
    raise ValueError(f"no accounting for family {fam!r}")


def _pcl_stages(m: Measured, variant: str, v: dict, seed: int, nb: str) -> list[tuple[tuple, Run]]:
    cfg = load_config("pcl", "paper")
    out = []
    if v["pretrain"] is not None:
        pre = cfg["pretrain"]
        ratios = {k: pre["ratios"][k] for k in v["pretrain"]}
        model = {**cfg["model"], **v.get("model", {})}
        t = train_config(pre["train"], seed)
        step, unscaled, notes, _ = pretrain_step(m, ratios, pre["batch_size"], cfg["negatives"]["ratio"])
        key = ("pcl-pretrain", json.dumps([ratios, model], sort_keys=True), seed)
        out.append((key, Run("IDC-PCL pre-training (CLEVR-Change)", f"pretrain {'+'.join(ratios)} seed {seed}"
                             + (" (no difference encoder)" if "model" in v else ""), nb, t.max_steps, step,
                             unscaled_step_seconds=unscaled,
                             basis=[f"MLM/MVCL/FDA steps at batch {pre['batch_size']}, mixed {ratios}", *notes])))
    ft = cfg["finetune"]
    t = train_config(ft["train"], seed)
    step, unscaled = _scaled(m, "IDC-PCL fine-tuning", ft["batch_size"])
    decode = m.rate("IDC-PCL greedy decoding")
    second = _second_split(t)
    out.append((("pcl-finetune", variant, seed), Run(
        "IDC-PCL fine-tuning (CLEVR-Change)", f"pcl/{variant} seed {seed}", nb, t.max_steps, step, _evals(t),
        _eval_pairs("clevr-change", second) / decode, _pairs("clevr-change", "test") / decode, unscaled,
        [f"fine-tuning step at batch {ft['batch_size']}; val decoding every {t.eval_every} steps"
         + _second_note(second), f"upper bound: patience {t.patience} evaluations may stop it sooner"])))
    return out


def _birds_stages(m: Measured, variant: str, v: dict, seed: int, nb: str) -> list[tuple[tuple, Run]]:
    cfg = load_config("pcl_birds", "paper")
    shape = (f"birds' model: {cfg['model']['n_layers']} layers and {cfg['max_len']}-token captions against "
             f"CLEVR's measured {load_config('pcl', 'paper')['model']['n_layers']} and "
             f"{load_config('pcl', 'paper')['max_len']}: only the batch is scaled")
    out = []
    if v["cub"]:
        g = cfg["gic"]
        t = train_config(g["train"], seed)
        step, unscaled, notes, _ = pretrain_step(m, g["ratios"], g["batch_size"], cfg["negatives"]["cub_ratio"])
        out.append((("birds-gic", seed), Run(
            "birds: CUB stage (GIC)", f"gic seed {seed}", nb, t.max_steps, step, unscaled_step_seconds=unscaled,
            basis=[f"MLM/MVCL/FDA steps scaled to batch {g['batch_size']}; the second image is zero features "
                   "(same sequence layout)", *notes])))
    pre = cfg["pretrain"]
    ratios = dict(pre["ratios"], **({"fgvc": pre["fgvc_ratio"]} if v["nabirds"] else {}))
    t = train_config(pre["train"], seed)
    step, unscaled, notes, proxy = pretrain_step(m, ratios, pre["batch_size"], cfg["negatives"]["b2w_ratio"])
    out.append((("birds-pretrain", bool(v["cub"]), bool(v["nabirds"]), seed), Run(
        "birds: Birds-to-Words pre-training", f"pretrain {variant} seed {seed}", nb, t.max_steps, step,
        unscaled_step_seconds=unscaled, proxy_seconds=proxy * t.max_steps,
        basis=[f"steps scaled to batch {pre['batch_size']}, mixed {ratios}", *notes, shape])))
    ft = cfg["finetune"]
    t = train_config(ft["train"], seed)
    step, unscaled = _scaled(m, "IDC-PCL fine-tuning", ft["batch_size"])
    # decoding time grows with the caption length: the rate was measured at CLEVR's
    decode = m.rate("IDC-PCL greedy decoding") * load_config("pcl", "paper")["max_len"] / cfg["max_len"]
    second = _second_split(t)
    out.append((("birds-finetune", variant, seed), Run(
        "birds: fine-tuning", f"pcl-birds/{variant} seed {seed}", nb, t.max_steps, step, _evals(t),
        BIRDS_SPLIT_PAIRS * (1 + (second is not None)) / decode, BIRDS_SPLIT_PAIRS / decode, unscaled,
        [f"fine-tuning step scaled to batch {ft['batch_size']}; val decoding ({BIRDS_SPLIT_PAIRS} pairs, about) "
         f"every {t.eval_every} steps at the IDC-PCL rate x {cfg['max_len']}/"
         f"{load_config('pcl', 'paper')['max_len']} tokens" + _second_note(second), shape,
         f"upper bound: patience {t.patience} evaluations may stop it sooner"])))
    return out


def _duda_stage(m: Measured, seed: int, nb: str) -> tuple[tuple, Run]:
    cfg = load_config("duda", "paper")
    t = train_config(cfg["train"], seed)
    step, unscaled = _scaled(m, "IDC-PCL fine-tuning", cfg["batch_size"])
    decode = m.rate("IDC-PCL greedy decoding")
    run = Run("DUDA (CLEVR-Change)", f"duda/duda seed {seed}", nb, t.max_steps, step, _evals(t),
              _eval_pairs("clevr-change", _second_split(t)) / decode, _pairs("clevr-change", "test") / decode,
              unscaled,
              [f"DUDA's step and decoding are not measured: timed as IDC-PCL's fine-tuning step scaled to batch "
               f"{cfg['batch_size']} and IDC-PCL's decoding (proxy)"])
    run.proxy_seconds = run.hours * 3600
    return ("duda", seed), run


# -- CLIP4IDC: the notebooks' calls -----------------------------------------------------------------------------
def _clip_setup(dataset: str) -> SimpleNamespace:
    """What :mod:`idckit.experiments.clip4idc` reads of a setup to split the CLIP and train: its paper configs on
    ``dataset`` (with the dataset's own block, as ``clip4idc.setup`` merges it)."""
    cfg = {name: load_config(file, "paper", clip4idc.dataset_settings(file, dataset, "paper"))
           for name, file in (("adapt", "clip4idc_adapt"), ("caption", "clip4idc_caption"))}
    cfg["clip"] = cfg["adapt"].pop("clip")
    return SimpleNamespace(config=cfg, dataset=dataset)


def _adapt_samples(dataset: str, captions_per_pair: float) -> int:
    """Adaptation samples per epoch: every change caption of train (:class:`idckit.tasks.clip4idc.AdaptTask`)."""
    if dataset == "clevr-change":
        return int(DATASETS[dataset].release["splits"]["train"] * captions_per_pair)
    return DATASETS[dataset].release["splits"]["train"]["sentences"]


def _caption_scenes(dataset: str) -> tuple[int, int]:
    """(train scenes per epoch, passes per scene): CLEVR-Change's scenes give a semantic and a distractor pass
    (:class:`idckit.tasks.clip4idc.CaptionTask`); the other sets' pairs one."""
    if dataset == "clevr-change":
        return DATASETS[dataset].release["splits"]["train"], 2
    return DATASETS[dataset].release["splits"]["train"]["pairs"], 1


def clip4idc_runs(m: Measured, calls=CLIP4IDC_CALLS, captions_per_pair: float = CLEVR_CAPTIONS_PER_PAIR
                  ) -> list[Run]:
    """Every adaptation and captioning run the CLIP4IDC notebooks train, each once (the run keys of
    :func:`idckit.experiments.clip4idc.adapt` and :func:`~idckit.experiments.clip4idc.run_variant`)."""
    runs: dict[tuple, Run] = {}
    for nb, dataset, variants, first_seed, splits, _ in calls:
        s = _clip_setup(dataset)
        seeds = NOTEBOOKS[nb].seeds[:1] if first_seed else NOTEBOOKS[nb].seeds
        n_intras = [sp["n_intra"] for sp in clip4idc.layer_splits(s)] if splits else [clip4idc.default_n_intra(s)]
        for variant in variants:
            v = recipes.get_recipe(variant, clip4idc.FAMILY).settings
            for seed in seeds:
                for n_intra in n_intras:
                    if v["adapt"]:
                        key = ("adapt", dataset, n_intra, seed if v["captioner"] is None else 0)
                        runs.setdefault(key, _adapt_run(m, s, n_intra, key[3], nb, captions_per_pair))
                    if v["captioner"] is None:
                        continue
                    captioner = {**s.config["caption"]["captioner"], **v["captioner"]}
                    frozen = True if splits else captioner["freeze_visual"]
                    split = n_intra if variant != "clip-ft" else None
                    key = ("caption", dataset, json.dumps(captioner, sort_keys=True), split, frozen, v["adapt"], seed)
                    runs.setdefault(key, _caption_run(m, s, variant, split, frozen, seed, nb))
    return list(runs.values())


def _adapt_run(m: Measured, s, n_intra: int, seed: int, nb: str, captions_per_pair: float) -> Run:
    c = s.config["adapt"]
    samples = _adapt_samples(s.dataset, captions_per_pair)
    t = train_config(c["train"], seed, steps_per_epoch=max(1, samples // c["batch_size"]))
    step, unscaled = _scaled(m, "CLIP4IDC adaptation", c["batch_size"])
    # a retrieval evaluation encodes the split's change pairs and captions once, forward only: a third of a
    # training step (forward + backward) per batch (not measured)
    second = _second_split(t)
    change = 2 if s.dataset == "clevr-change" else 1        # CLEVR-Change retrieves its change pairs only
    eval_seconds = _eval_pairs(s.dataset, second) // change / c["batch_size"] * step / 3
    basis = [f"{c['train']['epochs']} epochs of {samples:,} change captions at batch {c['batch_size']}; a val "
             "retrieval each epoch timed as a third of a training step per batch (proxy)" + _second_note(second)]
    if s.dataset == "clevr-change":
        basis.append(f"ASSUMED {captions_per_pair:g} change captions per change pair (not in the registry)")
    return Run(f"CLIP4IDC adaptation ({DATASETS[s.dataset].title})",
               f"adapt {n_intra}/{clip4idc.depth(s) - n_intra} seed {seed}",
               nb, t.max_steps, step, _evals(t), eval_seconds, 0.0, unscaled, basis, _evals(t) * eval_seconds)


def _caption_run(m: Measured, s, variant: str, n_intra: int | None, frozen: bool, seed: int, nb: str) -> Run:
    c = s.config["caption"]
    scenes, passes = _caption_scenes(s.dataset)
    t = train_config(c["train"], seed, steps_per_epoch=max(1, scenes // c["batch_size"]))
    step, unscaled = _scaled(m, "CLIP4IDC captioning", c["batch_size"] * passes)
    decode = m.rate("CLIP4IDC greedy decoding")
    kind = f"CLIP4IDC captioning ({DATASETS[s.dataset].title})"
    second = _second_split(t)
    basis = [f"{c['train']['epochs']} epochs of {scenes:,} scenes, batch {c['batch_size']} x {passes} pass(es); "
             f"val decoding ({_pairs(s.dataset, 'val'):,} pairs) each epoch" + _second_note(second),
             f"upper bound: patience {t.patience} evaluations may stop it sooner"]
    if frozen:
        kind += ", encoder frozen (table 7)"
        basis.append("upper bound: the encoder is frozen and its pair tokens cached, the measured step trains it")
    split = "CLIP-FT" if n_intra is None else f"{n_intra}/{clip4idc.depth(s) - n_intra}"
    return Run(kind, f"clip4idc/{variant} {split} seed {seed}", nb, t.max_steps, step, _evals(t),
               _eval_pairs(s.dataset, second) / decode, _pairs(s.dataset, "test") / decode, unscaled, basis)


# -- the account ------------------------------------------------------------------------------------------------
def all_runs(record: dict[str, Any], *, names: Sequence[str] | None = None,
             captions_per_pair: float = CLEVR_CAPTIONS_PER_PAIR, calls=CLIP4IDC_CALLS
             ) -> tuple[list[str], dict[str, tuple[str, str, int]], list[Run]]:
    """(the graph's prepare steps, its training jobs, every run a paper reproduce trains) timed by ``record``."""
    m = Measured(record)
    prepare, units = graph_units(names)
    return prepare, units, pcl_runs(m, units) + clip4idc_runs(m, calls, captions_per_pair)


def account(record: dict[str, Any], *, names: Sequence[str] | None = None,
            captions_per_pair: float = CLEVR_CAPTIONS_PER_PAIR, calls=CLIP4IDC_CALLS) -> dict[str, Any]:
    """Every run, the hours per run kind and per notebook, the total, and what is not counted."""
    m = Measured(record)
    prepare, units, runs = all_runs(record, names=names, captions_per_pair=captions_per_pair, calls=calls)

    def group(key) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in runs:
            g = out.setdefault(key(r), {"runs": 0, "steps": 0, "train_hours": 0.0, "eval_hours": 0.0, "hours": 0.0})
            g["runs"] += 1
            g["steps"] += r.steps
            g["train_hours"] += r.steps * r.step_seconds / 3600
            g["eval_hours"] += r.evals * r.eval_seconds / 3600
            g["hours"] += r.hours
        return {k: {n: round(x, 3) if isinstance(x, float) else x for n, x in v.items()} for k, v in out.items()}

    proxy = sum(r.proxy_seconds for r in runs) / 3600
    return {
        "what": "GPU-hours of a full `make reproduce PROFILE=paper` (all four real releases) on one GPU, from a "
                "gpu-check record's measured step times (bf16 autocast)",
        "device": m.device,
        "training_jobs": sorted(units),
        "by_kind": group(lambda r: r.kind),
        "by_notebook": group(lambda r: r.notebook),
        "total_hours": round(sum(r.hours for r in runs), 2),
        "total_hours_unscaled_small_batches": round(sum(r.unscaled_hours for r in runs), 2),
        "proxy_hours": round(proxy, 3),
        "test_decoding_hours": round(sum(r.test_seconds for r in runs) / 3600, 3),
        "assumptions": [
            "steps: every run to its configured last step (max_steps, or epochs x the release's train count // "
            "batch); evaluations on train/loop.py's cadence (eval_every, eval_offset, eval_at_end), each with a "
            "second one where authors_selection scores test or val apart (CLIP4IDC: test; IDC-PCL: val again)",
            "a run whose batch differs from the measured one: the measured step time x batch / measured batch "
            "(linear; total_hours_unscaled_small_batches keeps the measured time for smaller batches, as a GPU "
            "step does not shrink in proportion)",
            "validation decoding: the val pairs x the measured greedy decoding rate (samples/s) of the family",
            f"CLEVR-Change adaptation: {captions_per_pair:g} change captions per change pair, ASSUMED (the "
            "registry has no caption count for it); each further caption per pair adds "
            f"{_per_caption_hours(runs, captions_per_pair):.2f} h",
            f"Birds-to-Words val and test: about {BIRDS_SPLIT_PAIRS} pairs each (no exact published count)",
            "real roots given for all four datasets: no synthetic hard twin trains; the stand-in CLIP is not "
            "trained at paper (open_clip ViT-B-32 openai)",
        ],
        "not_counted": [*NOT_COUNTED, *(f"{p} (a prepare step)" for p in prepare)],
        "runs": [{**asdict(r), "hours": round(r.hours, 4)} for r in runs],
    }


def _per_caption_hours(runs: Sequence[Run], captions_per_pair: float) -> float:
    """Hours the CLEVR adaptations' training steps add per further change caption per pair."""
    clevr = [r for r in runs if r.kind == f"CLIP4IDC adaptation ({DATASETS['clevr-change'].title})"]
    return sum(r.steps * r.step_seconds for r in clevr) / 3600 / captions_per_pair


def render(acc: dict[str, Any]) -> str:
    lines = [f"GPU-hours of a full `make reproduce PROFILE=paper` on one {acc['device']}", ""]
    for title, key in (("run kind", "by_kind"), ("notebook (the one that trains a shared run first)", "by_notebook")):
        lines.append(f"{title:70s} {'runs':>5s} {'steps':>10s} {'train h':>8s} {'eval h':>7s} {'hours':>7s}")
        for name, g in acc[key].items():
            lines.append(f"{name:70s} {g['runs']:5d} {g['steps']:10,d} {g['train_hours']:8.2f} "
                         f"{g['eval_hours']:7.2f} {g['hours']:7.2f}")
        lines.append("")
    lines += [f"total: {acc['total_hours']:.1f} GPU-hours ({acc['total_hours_unscaled_small_batches']:.1f} if no "
              f"batch below the measured one ran faster; {acc['proxy_hours']:.2f} h of it timed on proxies)",
              f"test decoding, not in the total: {acc['test_decoding_hours']:.2f} h", "", "assumptions:"]
    lines += [f"- {a}" for a in acc["assumptions"]] + ["", "not counted:"] + [f"- {n}" for n in acc["not_counted"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=RECORD, help="a `make gpu-check` record (gpu_check.json)")
    ap.add_argument("--json", type=Path, default=None, help="also write the account here")
    ap.add_argument("--clevr-captions-per-pair", type=float, default=CLEVR_CAPTIONS_PER_PAIR,
                    help="CLEVR-Change change captions per change pair (count change_captions.json)")
    args = ap.parse_args(argv)
    record = json.loads(args.record.read_text())
    acc = account(record, captions_per_pair=args.clevr_captions_per_pair)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    acc = {"record": args.record.name, "commit": commit or None, **acc}
    print(render(acc))
    if args.json:
        args.json.write_text(json.dumps(acc, indent=1) + "\n")
    return acc


if __name__ == "__main__":
    main()
