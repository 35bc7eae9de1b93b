"""The registry of named recipes: every trained row of the tables, by name (``pcl/full``, ``clip4idc/clip-ft``, ...).

A recipe is ``<family>/<variant>``: the family is the experiment module that trains it (``pcl``: IDC-PCL on
CLEVR-Change, :mod:`idckit.experiments.pcl`; ``pcl-birds``: IDC-PCL on Birds-to-Words, :mod:`~idckit.experiments.birds`;
``clip4idc``: :mod:`~idckit.experiments.clip4idc`; ``duda``: the DUDA baseline, :mod:`~idckit.experiments.duda`), the
variant is what that module's ``run_variant(setup, variant, seed)`` is asked for. ``settings`` hold what the recipe
switches on top of the profile's config (the profile JSON keeps every size and step count); they enter run keys as
they are, so editing one retrains that row. ``idckit list`` prints the registry, as timm's ``list_models`` does.
"""
from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping

from idckit.errors import ConfigError

# A recipe names the pre-training objectives it switches on; their ratios come from the profile JSON
# (pcl.json pretrain.ratios), the one place a default lives.
_FULL_PRETRAIN = ("mlm", "mvcl", "fda")


@dataclass(frozen=True)
class Recipe:
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


_RECIPES = (
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
    # IDC-PCL on Birds-to-Words, table 5's rows (table 1 shows b2w as IDC-PCL and both as IDC-PCL + extra data)
    Recipe("pcl-birds/b2w", "B2W", "IDC-PCL pre-trained and fine-tuned on Birds-to-Words alone",
           ("pcl.table1", "pcl.table5"), {"cub": False, "nabirds": False}, {"pcl.table1": "IDC-PCL"}),
    Recipe("pcl-birds/cub", "B2W + CUB", "a CUB image-caption pre-training stage before Birds-to-Words",
           ("pcl.table5",), {"cub": True, "nabirds": False}),
    Recipe("pcl-birds/nabirds", "B2W + NABirds", "NABirds fine-grained classification pairs mixed into "
           "Birds-to-Words pre-training", ("pcl.table5",), {"cub": False, "nabirds": True}),
    Recipe("pcl-birds/both", "B2W + CUB + NABirds", "both extra datasets: the CUB stage and the NABirds pairs",
           ("pcl.table1", "pcl.table5"), {"cub": True, "nabirds": True}, {"pcl.table1": "IDC-PCL (+extra data)"}),
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
    # the explicit-difference baseline beside IDC-PCL
    Recipe("duda/duda", "DUDA", "the dual dynamic attention baseline, on IDC-PCL's data and features",
           ("pcl.table2", "pcl.table3")),
)

#: every recipe by name, each family's variants in table order
RECIPES: dict[str, Recipe] = {r.name: r for r in _RECIPES}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(r.family for r in _RECIPES))


def list_recipes(pattern: str = "*") -> list[str]:
    """Recipe names matching the shell-style ``pattern`` (e.g. ``"pcl/*"``, ``"*adapt*"``), in registry order."""
    return [name for name in RECIPES if fnmatch.fnmatchcase(name, pattern)]


def variants(family: str) -> list[str]:
    """The variant names of ``family`` that are rows of a paper table, in table order (what that module's ``runs``
    and ``idckit train`` train by default); a recipe in no table would train only by name."""
    _check_family(family)
    return [r.variant for r in _RECIPES if r.family == family and r.tables]


def get_recipe(name: object, family: str | None = None) -> Recipe:
    """The recipe ``name`` (``"pcl/full"``), or with ``family`` also its variant alone (``"full"``).

    An unknown name is the kit's :class:`~idckit.errors.ConfigError`, naming the closest known names."""
    if family is not None:
        _check_family(family)
    if isinstance(name, str):
        full = name if "/" in name or family is None else f"{family}/{name}"
        if full in RECIPES and (family is None or RECIPES[full].family == family):
            return RECIPES[full]
    known = [r.name for r in _RECIPES if family is None or r.family == family]
    close = _close_matches(str(name), family)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    where = f"{family} recipe" if family else "recipe"
    raise ConfigError(f"unknown {where} {name!r}{hint}; known: {', '.join(known)}",
                      fix="`idckit list` prints every recipe with the tables that use it")


def _close_matches(query: str, family: str | None) -> list[str]:
    """Known names close to ``query``, compared by variant within its family (or within every family when the
    family is unknown), written as the query was: ``full`` for ``ful`` in family pcl, ``pcl/full`` for ``pcl/ful``."""
    fam, _, var = query.rpartition("/")
    pool = [r for r in _RECIPES if r.family == (family or fam)] or list(_RECIPES)
    by_variant: dict[str, list[str]] = {}
    for r in pool:
        by_variant.setdefault(r.variant, []).append(r.variant if family and not fam else r.name)
    return [n for hit in difflib.get_close_matches(var, by_variant, n=3, cutoff=0.6) for n in by_variant[hit]]


def check_variants(names: object, family: str) -> list[str]:
    """A notebook's ``variants`` for ``family``: a non-empty list of its variant names (None: every one), all
    checked before the first run trains. Returns the variant names (``"pcl/full"`` given as ``"full"``)."""
    if names is None:
        return variants(family)
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"variants must be a non-empty list of {family} variant names, got {names!r}",
                          fix=f"pass a list drawn from: {', '.join(variants(family))}")
    return [get_recipe(n, family).variant for n in names]


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ConfigError(f"unknown recipe family {family!r}; known: {', '.join(FAMILIES)}")


def describe(pattern: str = "*") -> str:
    """The recipes matching ``pattern`` as ``idckit list`` prints them: per recipe its name and one line, then its
    row's label and the tables that have that row."""
    names = list_recipes(pattern)
    if not names:
        raise ConfigError(f"no recipe matches {pattern!r}; known: {', '.join(RECIPES)}",
                          fix="give a shell-style pattern such as 'pcl/*' or '*clip*', or none for every recipe")
    width = max(len(n) for n in names)
    lines = []
    for n in names:
        r = RECIPES[n]
        lines.append(f"{n:<{width}}  {r.description}")
        by_label: dict[str, list[str]] = {}
        for t in r.tables:
            by_label.setdefault(r.row_label(t), []).append(t)
        rows = ("; ".join(f"row \"{label}\" in {', '.join(ts)}" for label, ts in by_label.items())
                or f"\"{r.label}\": in no table; trained only when named")
        lines.append(f"{'':<{width}}  {rows}")
    return "\n".join(lines)


__all__ = ["Recipe", "RECIPES", "FAMILIES", "list_recipes", "variants", "get_recipe", "check_variants", "describe"]
