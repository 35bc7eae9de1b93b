"""The table manifest: which notebook trains which family on which dataset(s), from which root.

One place that ``idckit reproduce``, ``idckit doctor``, ``idckit train``, the Makefile and the tests read (nothing
guesses a notebook's family from its imports). It imports nothing heavy: plain data, and the profile-dependent
weights read from the config JSON (:func:`weights`), never restated here.

One root per dataset: a notebook takes the roots of the datasets it uses as parameters (``clevr_root``,
``spot_root``, ``ier_root``, ``birds_root``); the CLI spells them ``--clevr-root`` ..., the Makefile ``CLEVR_ROOT=``
.... A root that is not given means the profile's synthetic set in that dataset's format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from idckit.errors import ConfigError


@dataclass(frozen=True)
class Dataset:
    name: str         # what loaders, generators and ``clip4idc.setup(dataset=...)`` call it
    title: str        # the release's name in reports
    synthetic: str    # the kit's synthetic set in the same layout
    param: str        # the notebook parameter (and, spelt for each, the CLI option and the Makefile variable)
    layout: str       # what a root must hold, in words (errors name it)

    @property
    def option(self) -> str:
        """The command-line option: ``--clevr-root``."""
        return "--" + self.param.replace("_", "-")

    @property
    def variable(self) -> str:
        """The Makefile variable: ``CLEVR_ROOT``."""
        return self.param.upper()


DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("clevr-change", "CLEVR-Change", "SynthCLEVR-Change", "clevr_root",
            "images/, sc_images/, nsc_images/ and change_captions.json, no_change_captions.json, splits.json, "
            "type_mapping.json (the release's data/ folder)"),
    Dataset("spot-the-diff", "Spot-the-Diff", "SynthSpot-the-Diff", "spot_root",
            "annotations/{train,val,test}.json and resized_images/ (the release's data/ folder)"),
    Dataset("editing-request", "Image-Editing-Request", "SynthIER", "ier_root",
            "train.json, valid.json, test.json and images/"),
    Dataset("birds", "Birds-to-Words + CUB-200-2011 + NABirds", "SynthBirds", "birds_root",
            "birds_to_words/ (the TSV and images/), CUB_200_2011/ (with the Reed et al. captions) and nabirds/"),
)}

#: experiment family -> (its module, the recipe family of :mod:`idckit.experiments.recipes`, the dataset it
#: trains on with ``idckit train``)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "pcl": ("idckit.experiments.pcl", "pcl", "clevr-change"),
    "duda": ("idckit.experiments.duda", "duda", "clevr-change"),
    "birds": ("idckit.experiments.birds", "pcl-birds", "birds"),
    "clip4idc": ("idckit.experiments.clip4idc", "clip4idc", "clevr-change"),
}

#: the config files a family's runs resolve, in the order ``idckit config FAMILY`` prints them (the loop's
#: ``train.json`` fills what a ``train`` block leaves out; ``runtime.json`` says where runs train)
CONFIGS: dict[str, tuple[str, ...]] = {
    "pcl": ("pcl", "synth_clevr_change", "train", "runtime"),
    "duda": ("duda", "pcl", "synth_clevr_change", "train", "runtime"),
    "birds": ("pcl_birds", "synth_birds", "train", "runtime"),
    "clip4idc": ("clip_standin", "clip4idc_adapt", "clip4idc_caption", "synth_clevr_change", "train", "runtime"),
}

#: where each family's profile-dependent weights are set: (config file, the keys naming the weights)
_WEIGHTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pcl": ("pcl", ("backbone", "backbone_weights")),
    "duda": ("pcl", ("backbone", "backbone_weights")),        # DUDA reads IDC-PCL's features
    "birds": ("pcl_birds", ("backbone",)),
    "clip4idc": ("clip4idc_adapt", ("clip",)),
}


@dataclass(frozen=True)
class Notebook:
    name: str
    table: str                      # the paper and table it reproduces
    families: tuple[str, ...]       # the experiment families it trains (none: the walkthrough's baselines)
    datasets: tuple[str, ...]       # the datasets it reads, the first its main one
    seeds: tuple[int, ...]          # its seeds parameter's default (tests/test_manifest.py keeps the two equal)

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


#: every root parameter, in the order of :data:`DATASETS`
ROOT_PARAMS: tuple[str, ...] = tuple(d.param for d in DATASETS.values())


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


def family(name: str) -> tuple[str, str, str]:
    """(module, recipe family, dataset) of an experiment family (:data:`FAMILIES`)."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown experiment family {name!r}; known: {', '.join(FAMILIES)}",
                          fix=f"pass one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def dataset_of_param(param: str) -> Dataset:
    for d in DATASETS.values():
        if d.param == param:
            return d
    raise ConfigError(f"unknown dataset root {param!r}; known: {', '.join(ROOT_PARAMS)}")


def notebook_roots(name: str, roots: dict[str, Any] | None) -> dict[str, Any]:
    """The root parameters notebook ``name`` takes, from ``roots`` (param -> path or None): every one it takes, None
    where not given (its synthetic set); the roots of datasets it does not read are left out. A notebook outside
    the manifest (not one of the kit's: ``reproduce(notebooks_dir=...)``) takes none."""
    roots = roots or {}
    unknown = set(roots) - set(ROOT_PARAMS)
    if unknown:
        raise ConfigError(f"unknown dataset roots {sorted(unknown)}; known: {', '.join(ROOT_PARAMS)}")
    taken = NOTEBOOKS[name].roots if name in NOTEBOOKS else ()
    return {p: (str(roots[p]) if roots.get(p) else None) for p in taken}


def weights(family_name: str, profile: str) -> dict[str, Any]:
    """The weights family ``family_name`` uses at ``profile``, as its config file sets them (a key -> value dict:
    ``{"backbone": "resnet101", "backbone_weights": None}``, ``{"clip": {"model": ..., "pretrained": ...}}``)."""
    from idckit.settings import load_config

    family(family_name)
    file, keys = _WEIGHTS[family_name]
    cfg = load_config(file, profile)
    return {k: cfg.get(k) for k in keys}
