"""The registry: every dataset, experiment family (with its recipes) and table notebook of the kit, each said once.

What a dataset is (:class:`Dataset`: its one spelling, loader, synthetic generator and config, layout markers, the
release's counts, the notebook parameter that takes its root, its id in the paper numbers), what a family is
(:class:`Family`: its experiment module, recipes, config files, weights keys, model config, dataset, and
:meth:`Family.load_run`, the one way to load a trained run) and which notebook reproduces which table
(:class:`Notebook`). The command line's choices, ``verify-data``, layout detection, ``doctor``, ``reproduce``, the
Makefile and the paper numbers read these tables; nothing restates them. :func:`register` adds a family or a
dataset from outside the kit (README: "Add a model, a dataset or a table").

It imports nothing heavy: plain data, naming code as ``"module:attribute"`` strings that :func:`resolve` imports on
use (so ``idckit --help`` stays instant and this bottom layer imports no layer above it); tests/test_registry.py
resolves every one of them. Profile-dependent weights are read from the config JSON (:func:`weights`).

One root per dataset: a notebook takes the roots of the datasets it uses as parameters (``clevr_root``,
``spot_root``, ``ier_root``, ``birds_root``); the CLI spells them ``--clevr-root`` ..., the Makefile ``CLEVR_ROOT=``
.... A root that is not given means the profile's synthetic set in that dataset's format.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from idckit import settings
from idckit.errors import ConfigError


def resolve(ref: str) -> Any:
    """The object a ``"module:attribute"`` string names (``"module"`` alone: the module), imported now."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


@dataclass(frozen=True)
class Dataset:
    name: str                 # the one spelling: CLI choices, loaders, ``setup(dataset=...)``, run caches
    title: str                # the release's name in reports
    synthetic: str            # the kit's synthetic set in the same layout
    param: str                # the notebook parameter (and, spelt for each, the CLI option and the Makefile variable)
    layout: str               # what a root must hold, in words (errors name it)
    loader: str | None        # "module:Class" reading a root (pair datasets: ``entries(split)``, ``pairs(split)``)
    generator: str            # the module writing the synthetic set (``generate(root, ...)``, ``GENERATOR_VERSION``)
    config: str               # the synthetic set's config file (its size per profile)
    markers: tuple[str, ...] = ()   # entries of a root that tell this layout apart (``idckit.data.detect``)
    any_marker: bool = False        # one marker suffices (else all must exist)
    images: str = ""                # the folder holding a pair dataset's images (verify-data's extras note)
    release: Mapping[str, Any] = field(default_factory=dict)   # the full release's published counts (verify-data)
    paper_id: str = ""        # its id in idckit/reports/paper_numbers.json
    paper_ks: tuple[int, ...] = ()  # the R@K the paper's retrieval table reports beyond 1/5/10
    authors_name: str = ""    # the authors' own name for it (CLIP4IDC's --datatype), for recorders running their code

    @property
    def option(self) -> str:
        """The command-line option: ``--clevr-root``."""
        return "--" + self.param.replace("_", "-")

    @property
    def variable(self) -> str:
        """The Makefile variable: ``CLEVR_ROOT``."""
        return self.param.upper()

    @property
    def pairs(self) -> bool:
        """A pair dataset (one loader of before/after pairs); the birds' root holds three datasets."""
        return self.loader is not None

    def load(self, root: str | Path):
        """This dataset's loader on ``root``, the layout validated now."""
        if self.loader is None:
            raise ConfigError(f"{self.name} has no pair loader", fix="use idckit.experiments.data.birds for its root")
        return resolve(self.loader)(root)


@dataclass(frozen=True)
class Recipe:
    """A named trained row of the tables: ``<family>/<variant>`` (the family is its :attr:`Family.recipe_family`)."""
    name: str                       # "<family>/<variant>"
    label: str                      # the row's name in the tables and reports
    description: str                # one line: what is trained
    tables: tuple[str, ...]         # the paper tables (report ids) with a row trained by this recipe
    settings: Mapping[str, Any] = field(default_factory=dict)
    table_labels: Mapping[str, str] = field(default_factory=dict)   # table -> the row's label where it differs

    def row_label(self, table: str) -> str:
        """The label of this recipe's row in ``table``."""
        return self.table_labels.get(table, self.label)

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def variant(self) -> str:
        return self.name.split("/", 1)[1]


@dataclass(frozen=True)
class Family:
    """An experiment family: the runs one experiment module trains (``setup``, ``run_variant``, ``runs``,
    ``load_run``: the protocol of :mod:`idckit.experiments.base`)."""
    name: str                       # ``idckit train NAME``, ``idckit config NAME``
    module: str                     # its experiment module
    recipe_family: str              # the ``<family>/`` of its recipes' names (and of its model configs' names)
    dataset: str                    # the dataset ``idckit train`` trains it on (a key of :data:`DATASETS`)
    configs: tuple[str, ...]        # the config files its runs resolve, in the order ``idckit config`` prints them
    weights: tuple[str, tuple[str, ...]]    # (config file, the keys naming its profile-dependent weights)
    model: tuple[str, str, str | None]      # (config file, its model section, the section's caption-length key)
    config_class: str               # "module:Class" of its model config (built by ``model_config``)
    recipes: tuple[Recipe, ...] = ()

    def experiment(self):
        """Its experiment module, imported now."""
        return resolve(self.module)

    def load_run(self, run_dir: str | Path, checkpoint: str = "best", device: str = "cpu", **options: Any):
        """The one way to load a trained run of this family: ``(model, step)``, the model in eval mode on
        ``device`` (the experiment module's ``load_run``, which names its ``options``)."""
        module = self.experiment()
        if not hasattr(module, "load_run"):
            raise ConfigError(f"the {self.name} family has no run loader yet ({self.module} defines no load_run)",
                              fix="its runs are read by its own notebooks; IDC-PCL's (family pcl) load by directory")
        return module.load_run(run_dir, checkpoint=checkpoint, device=device, **options)


# Recipes name the pre-training objectives they switch on; the ratios come from the profile JSON
# (pcl.json pretrain.ratios), the one place a default lives.
_FULL_PRETRAIN = ("mlm", "mvcl", "fda")

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("clevr-change", "CLEVR-Change", "SynthCLEVR-Change", "clevr_root",
            "images/, sc_images/, nsc_images/ and change_captions.json, no_change_captions.json, splits.json, "
            "type_mapping.json (the release's data/ folder)",
            "idckit.data.clevr_change:ClevrChange", "idckit.data.synth.clevr_change", "synth_clevr_change",
            markers=("images", "sc_images", "nsc_images"), images="images",
            # the paper's 67,660 / 3,976 / 7,970 pairs, two per before-image: 39,803 images in each of three folders
            release={"splits": {"train": 33830, "val": 1988, "test": 3985}, "images_per_folder": 39803,
                     "image_size": (480, 320)},
            paper_id="clevr_change", authors_name="clevr"),
    Dataset("spot-the-diff", "Spot-the-Diff", "SynthSpot-the-Diff", "spot_root",
            "annotations/{train,val,test}.json and resized_images/ (the release's data/ folder)",
            "idckit.data.spot_the_diff:SpotTheDiff", "idckit.data.synth.spot_the_diff", "synth_spot_the_diff",
            markers=("annotations", "resized_images"), images="resized_images",
            # counted from the released annotation files
            release={"splits": {"train": {"entries": 9524, "pairs": 8566, "sentences": 17676},
                                "val": {"entries": 1634, "pairs": 1493, "sentences": 3310},
                                "test": {"entries": 1404, "pairs": 1270, "sentences": 2107}},
                     "image_size": (224, 224)},
            paper_id="spot_the_diff", paper_ks=(10, 20, 50)),
    Dataset("editing-request", "Image-Editing-Request", "SynthIER", "ier_root",
            "train.json, valid.json, test.json and images/",
            "idckit.data.editing_request:EditingRequest", "idckit.data.synth.editing_request", "synth_editing_request",
            markers=("train.json", "valid.json", "test.json"), any_marker=True, images="images",
            # counted from dataset/adobe/{train,valid,test}.json
            release={"splits": {"train": {"pairs": 3061, "sentences": 3061}, "val": {"pairs": 383, "sentences": 1149},
                                "test": {"pairs": 495, "sentences": 1485}}},
            paper_id="editing_request"),
    Dataset("birds", "Birds-to-Words + CUB-200-2011 + NABirds", "SynthBirds", "birds_root",
            "birds_to_words/ (the TSV and images/), CUB_200_2011/ (with the Reed et al. captions) and nabirds/",
            None, "idckit.data.synth.birds", "synth_birds",
            # Birds-to-Words publishes no exact pair counts (about 3.3K pairs, 16K paragraphs): its TSV is the fact
            release={"cub_images": 11788, "cub_classes": 200,
                     "unverified": {"cub_train": 5994, "cub_test": 5794, "nabirds_images": 48562,
                                    "nabirds_leaf_classes": 555}},
            paper_id="birds_to_words"),
)}


#: the experiment families, each with its recipes (the trained rows of the tables, in table order): ``idckit list``
#: prints them, as timm's ``list_models`` does; a recipe's ``settings`` hold what it switches on top of the profile's
#: config (the profile JSON keeps every size and step count) and enter run keys as they are, so editing one retrains
#: that row
_PCL = (
    # IDC-PCL, table 4's rows in the paper's order (tables 2 and 3 and CLIP4IDC's table 1 read the full row)
    Recipe("pcl/none", "w/o pre-training", "IDC-PCL fine-tuned from scratch, no pre-training", ("pcl.table4",),
           {"pretrain": None}),
    Recipe("pcl/mlm", "MLM", "pre-training with masked language modelling only, then fine-tuning", ("pcl.table4",),
           {"pretrain": ("mlm",)}),
    Recipe("pcl/mlm+mvcl", "MLM + MVCL", "pre-training with MLM and masked visual contrastive learning, then "
           "fine-tuning", ("pcl.table4",), {"pretrain": ("mlm", "mvcl")}),
    Recipe("pcl/full", "MLM + MVCL + FDA (full)", "the full IDC-PCL: MLM + MVCL + FDA pre-training, then fine-tuning "
           "with the distractor judge",
           ("pcl.table2", "pcl.table3", "pcl.table4", "clip4idc.table1"), {"pretrain": _FULL_PRETRAIN}),
    Recipe("pcl/no_diff_encoder", "full w/o image difference encoder", "the full recipe without the image difference "
           "encoder", ("pcl.table4",), {"pretrain": _FULL_PRETRAIN, "model": {"difference_encoder": False}}),
    Recipe("pcl/no_judge", "full w/o distractor judging", "the full recipe fine-tuned without the distractor judge "
           "(shares full's pre-training run)", ("pcl.table4",),
           {"pretrain": _FULL_PRETRAIN, "finetune_model": {"distractor_head": False}}),
)
_DUDA = (
    Recipe("duda/duda", "DUDA", "the dual dynamic attention baseline, on IDC-PCL's data and features",
           ("pcl.table2", "pcl.table3")),
)
_BIRDS = (
    # IDC-PCL on Birds-to-Words, table 5's rows (table 1 shows b2w as IDC-PCL and both as IDC-PCL + extra data)
    Recipe("pcl-birds/b2w", "B2W", "IDC-PCL pre-trained and fine-tuned on Birds-to-Words alone",
           ("pcl.table1", "pcl.table5"), {"cub": False, "nabirds": False}, {"pcl.table1": "IDC-PCL"}),
    Recipe("pcl-birds/cub", "B2W + CUB", "a CUB image-caption pre-training stage before Birds-to-Words",
           ("pcl.table5",), {"cub": True, "nabirds": False}),
    Recipe("pcl-birds/nabirds", "B2W + NABirds", "NABirds fine-grained classification pairs mixed into "
           "Birds-to-Words pre-training", ("pcl.table5",), {"cub": False, "nabirds": True}),
    Recipe("pcl-birds/both", "B2W + CUB + NABirds", "both extra datasets: the CUB stage and the NABirds pairs",
           ("pcl.table1", "pcl.table5"), {"cub": True, "nabirds": True}, {"pcl.table1": "IDC-PCL (+extra data)"}),
)
_CLIP4IDC = (
    # CLIP4IDC, table 5's rows (the other tables caption with the full recipe)
    Recipe("clip4idc/clip-ft", "CLIP-FT", "CLIP's image encoder per image, fine-tuned for captioning; no "
           "adaptation", ("clip4idc.table3", "clip4idc.table4", "clip4idc.table5"),
           {"captioner": {"variant": "clip-ft"}, "adapt": False}),
    Recipe("clip4idc/no-adapt", "CLIP4IDC w/o adaptation", "the split pair encoder captioning straight from CLIP, "
           "without retrieval adaptation", ("clip4idc.table5",),
           {"captioner": {"variant": "clip4idc"}, "adapt": False}),
    Recipe("clip4idc/clip4idc", "CLIP4IDC", "retrieval adaptation of the split pair encoder, then captioning from it",
           ("clip4idc.table1", "clip4idc.table2", "clip4idc.table3", "clip4idc.table4", "clip4idc.table5",
            "clip4idc.table7"), {"captioner": {"variant": "clip4idc"}, "adapt": True},
           {"clip4idc.table7": "N_intra/N_inter (one row per split, encoder frozen)"}),
    # not the paper's: what the captioner does when handed the comparison (docs/clip4idc.md); table 1 shows it
    # as a labelled extra row beside the paper's (first seed only), never as the headline
    Recipe("clip4idc/clip4idc-diff", "CLIP4IDC + difference tokens (idckit variant)", "not the paper's: the "
           "CLIP4IDC recipe whose captioner also reads after - before of the pair tokens per position",
           ("clip4idc.table1",), {"captioner": {"variant": "clip4idc", "difference_tokens": True}, "adapt": True}),
    # table 6 retrieves with the adaptation alone: the first stage of clip4idc/clip4idc, the same cached run
    Recipe("clip4idc/adapt", "CLIP4IDC adaptation", "retrieval adaptation of the split pair encoder (pair <-> text "
           "InfoNCE) without the captioning stage", ("clip4idc.table6",), {"captioner": None, "adapt": True}),
)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("pcl", "idckit.experiments.pcl", "pcl", "clevr-change", ("pcl", "synth_clevr_change", "train", "runtime"),
           ("pcl", ("backbone", "backbone_weights")), ("pcl", "model", "max_text_len"), "idckit.models.pcl:PCLConfig",
           recipes=_PCL),
    # the explicit-difference baseline beside IDC-PCL; it reads IDC-PCL's features
    Family("duda", "idckit.experiments.duda", "duda", "clevr-change",
           ("duda", "pcl", "synth_clevr_change", "train", "runtime"), ("pcl", ("backbone", "backbone_weights")),
           ("duda", "model", None), "idckit.models.duda:DUDAConfig",
           recipes=_DUDA),
    # IDC-PCL on Birds-to-Words with cross-task data (the authors' bird/ stages)
    Family("birds", "idckit.experiments.birds", "pcl-birds", "birds", ("pcl_birds", "synth_birds", "train", "runtime"),
           ("pcl_birds", ("backbone",)), ("pcl_birds", "model", "max_text_len"), "idckit.models.pcl:PCLConfig",
           recipes=_BIRDS),
    Family("clip4idc", "idckit.experiments.clip4idc", "clip4idc", "clevr-change",
           ("clip_standin", "clip4idc_adapt", "clip4idc_caption", "synth_clevr_change", "train", "runtime"),
           ("clip4idc_adapt", ("clip",)), ("clip4idc_caption", "captioner", "max_len"),
           "idckit.models.clip4idc:CaptionerConfig",
           recipes=_CLIP4IDC),
)}


@dataclass(frozen=True)
class Notebook:
    name: str
    table: str                      # the paper and table it reproduces
    families: tuple[str, ...]       # the experiment families it trains (none: the walkthrough's baselines)
    datasets: tuple[str, ...]       # the datasets it reads, the first its main one
    seeds: tuple[int, ...]          # its seeds parameter's default (tests/test_registry.py keeps the two equal)

    @property
    def roots(self) -> tuple[str, ...]:
        """Its root parameters: ``("clevr_root",)``, ``("clevr_root", "spot_root", "ier_root")``, ..."""
        return tuple(DATASETS[d].param for d in self.datasets)


NOTEBOOKS: dict[str, Notebook] = {n.name: n for n in (
    Notebook("00_walkthrough", "walkthrough", (), ("clevr-change",), (0,)),
    Notebook("table1_birds_to_words", "IDC-PCL table 1", ("birds",), ("birds",), (0,)),
    Notebook("table2_clevr_change", "IDC-PCL table 2", ("pcl", "duda"), ("clevr-change",), (0,)),
    Notebook("table3_change_types", "IDC-PCL table 3", ("pcl", "duda"), ("clevr-change",), (0,)),
    Notebook("table4_ablation", "IDC-PCL table 4", ("pcl",), ("clevr-change",), (0,)),
    Notebook("table5_cross_task", "IDC-PCL table 5", ("birds",), ("birds",), (0, 1, 2)),
    Notebook("clip4idc_table1_clevr_change", "CLIP4IDC table 1", ("clip4idc", "pcl"), ("clevr-change",),
             (0, 1, 2)),
    Notebook("clip4idc_table2_change_types", "CLIP4IDC table 2", ("clip4idc",), ("clevr-change",), (0, 1, 2)),
    Notebook("clip4idc_table3_spot_the_diff", "CLIP4IDC table 3", ("clip4idc",), ("spot-the-diff",), (0,)),
    Notebook("clip4idc_table4_editing_request", "CLIP4IDC table 4", ("clip4idc",), ("editing-request",), (0,)),
    Notebook("clip4idc_table5_ablation", "CLIP4IDC table 5", ("clip4idc",), ("clevr-change", "spot-the-diff"),
             (0,)),
    Notebook("clip4idc_table6_retrieval", "CLIP4IDC table 6", ("clip4idc",),
             ("clevr-change", "spot-the-diff", "editing-request"), (0,)),
    Notebook("clip4idc_table7_layer_split", "CLIP4IDC table 7", ("clip4idc",), ("clevr-change",), (0,)),
)}

#: the runs a notebook trains, as (experiment family, variants or None for every table recipe of the family, seeds
#: or None for the notebook's): with several lanes ``idckit reproduce`` trains them first, one (family, variant,
#: seed) per lane job, so a notebook of many runs in a row (table 5's twelve birds chains) does not hold one lane for
#: all of them; the notebook then finds them in the run cache. What is not listed trains inside its notebook.
TRAINS: dict[str, tuple[tuple[str, tuple[str, ...] | None, tuple[int, ...] | None], ...]] = {
    "table1_birds_to_words": (("birds", ("b2w", "both"), None),),
    "table2_clevr_change": (("pcl", ("full",), None), ("duda", ("duda",), None)),
    "table4_ablation": (("pcl", None, None),),
    "table5_cross_task": (("birds", None, None),),
    "clip4idc_table1_clevr_change": (("pcl", ("full",), (0,)),),    # its IDC-PCL row: table 2's run
}

#: (family, variant) -> the variant of the same family and seed whose run it starts from (its pre-training, or the
#: CUB stage): trained after that one, never beside it, so no lane waits on the other's run lock
STARTS_FROM: dict[tuple[str, str], str] = {
    ("pcl", "no_judge"): "full",
    ("birds", "both"): "cub",
}


def root_params() -> tuple[str, ...]:
    """Every root parameter, in the order of :data:`DATASETS`."""
    return tuple(d.param for d in DATASETS.values())


@dataclass(frozen=True)
class Released:
    """An authors' released checkpoint a table scores beside its own training (:mod:`idckit.authors.released`)."""
    param: str                      # the notebook parameter (None: no released row)
    kind: str                       # what ``idckit import-checkpoint --from`` calls the checkpoint
    variable: str                   # the Makefile variable
    notebooks: tuple[str, ...]      # the notebooks that take it

    @property
    def option(self) -> str:
        """The ``idckit reproduce`` option: ``--released-checkpoint``."""
        return "--" + self.param.replace("_", "-")


RELEASED: dict[str, Released] = {r.param: r for r in (
    Released("released_checkpoint", "idc-pcl", "PCL_CKPT",
             ("table2_clevr_change", "table3_change_types", "table4_ablation")),
    Released("released_caption_checkpoint", "clip4idc-caption", "CLIP4IDC_CKPT",
             ("clip4idc_table1_clevr_change", "clip4idc_table2_change_types")),
    Released("released_adapt_checkpoint", "clip4idc-adapt", "CLIP4IDC_ADAPT_CKPT", ("clip4idc_table6_retrieval",)),
)}


def notebook_released(name: str, released: dict[str, Any] | None) -> dict[str, str]:
    """The released-checkpoint parameters notebook ``name`` takes, from ``released`` (param -> path or None): only
    the given ones it takes (a notebook's default is None, no released row)."""
    released = released or {}
    unknown = set(released) - set(RELEASED)
    if unknown:
        raise ConfigError(f"unknown released-checkpoint parameters {sorted(unknown)}; known: {', '.join(RELEASED)}")
    return {p: str(v) for p, v in released.items() if v and name in RELEASED[p].notebooks}


def notebook(name: str) -> Notebook:
    if name not in NOTEBOOKS:
        raise ConfigError(f"no notebook {name!r} in the table manifest; known: {', '.join(NOTEBOOKS)}",
                          fix="add it to idckit/registry.py's NOTEBOOKS (its family, datasets and seeds)")
    return NOTEBOOKS[name]


def family(name: str) -> Family:
    """The experiment family ``name`` (:data:`FAMILIES`)."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown experiment family {name!r}; known: {', '.join(FAMILIES)}",
                          fix=f"pass one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def dataset(name: str) -> Dataset:
    """The dataset ``name`` (:data:`DATASETS`), in its one spelling."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}",
                          fix=f"pass one of {', '.join(DATASETS)}")
    return DATASETS[name]


def pair_datasets() -> list[str]:
    """The datasets with a pair loader (what ``setup(dataset=...)`` of CLIP4IDC and layout detection take)."""
    return [d.name for d in DATASETS.values() if d.pairs]


def recipes() -> list[Recipe]:
    """Every recipe of every family, in registry order (:mod:`idckit.experiments.recipes` reads them)."""
    return [r for f in FAMILIES.values() for r in f.recipes]


def model_families() -> dict[str, Family]:
    """The families by the ``<family>`` of their named model configs ``<family>-<profile>`` (their recipe family:
    ``pcl-birds-cpu``; :func:`idckit.experiments.config.model_config`)."""
    return {f.recipe_family: f for f in FAMILIES.values()}


def dataset_of_param(param: str) -> Dataset:
    for d in DATASETS.values():
        if d.param == param:
            return d
    raise ConfigError(f"unknown dataset root {param!r}; known: {', '.join(root_params())}")


def notebook_roots(name: str, roots: dict[str, Any] | None) -> dict[str, Any]:
    """The root parameters notebook ``name`` takes, from ``roots`` (param -> path or None): every one it takes, None
    where not given (its synthetic set); the roots of datasets it does not read are left out. A notebook outside
    the manifest (not one of the kit's: ``reproduce(notebooks_dir=...)``) takes none."""
    roots = roots or {}
    unknown = set(roots) - set(root_params())
    if unknown:
        raise ConfigError(f"unknown dataset roots {sorted(unknown)}; known: {', '.join(root_params())}")
    taken = NOTEBOOKS[name].roots if name in NOTEBOOKS else ()
    return {p: (str(roots[p]) if roots.get(p) else None) for p in taken}


def weights(family_name: str, profile: str) -> dict[str, Any]:
    """The weights family ``family_name`` uses at ``profile``, as its config file sets them (a key -> value dict:
    ``{"backbone": "resnet101", "backbone_weights": None}``, ``{"clip": {"model": ..., "pretrained": ...}}``)."""
    file, keys = family(family_name).weights
    cfg = settings.load_config(file, profile)
    return {k: cfg.get(k) for k in keys}


@contextlib.contextmanager
def register(*records: Family | Dataset, config_dir: str | Path | None = None) -> Iterator[None]:
    """Make families and datasets from outside the kit known to every command while the block runs (the built-in
    ones are the tables above): ``with register(Family(...), Dataset(...), config_dir=...):``. ``config_dir`` holds
    their config files (``<name>.json``, read after the kit's own). A name the kit already has is refused."""
    added: list[tuple[dict, str]] = []
    try:
        for r in records:
            table = FAMILIES if isinstance(r, Family) else DATASETS
            if r.name in table:
                raise ConfigError(f"{type(r).__name__.lower()} {r.name!r} is already registered",
                                  fix="give the new one a name of its own")
            table[r.name] = r
            added.append((table, r.name))
        with settings.extra_config_dir(config_dir):
            yield
    finally:
        for table, name in added:
            table.pop(name, None)
