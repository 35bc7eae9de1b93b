"""Looking up named recipes: every trained row of the tables, by name (``pcl/full``, ``clip4idc/clip-ft``, ...).

The recipes themselves are data of their families in :mod:`idckit.registry`; this module finds, checks and prints
them. A recipe is ``<family>/<variant>``: the family is the experiment module that trains it (``pcl``: IDC-PCL on
CLEVR-Change, :mod:`idckit.experiments.pcl`; ``pcl-birds``: IDC-PCL on Birds-to-Words, :mod:`~idckit.experiments.birds`;
``clip4idc``: :mod:`~idckit.experiments.clip4idc`; ``duda``: the DUDA baseline, :mod:`~idckit.experiments.duda`), the
variant is what that module's ``run_variant(setup, variant, seed)`` is asked for. ``settings`` hold what the recipe
switches on top of the profile's config (the profile JSON keeps every size and step count); they enter run keys as
they are, so editing one retrains that row. ``idckit list`` prints them, as timm's ``list_models`` does.
"""
from __future__ import annotations

import difflib
import fnmatch

from idckit import registry
from idckit.errors import ConfigError
from idckit.registry import Recipe


def all_recipes() -> dict[str, Recipe]:
    """Every recipe by name, each family's variants in table order (the families' recipes in
    :data:`idckit.registry.FAMILIES`, registered ones included)."""
    return {r.name: r for r in registry.recipes()}


def families() -> tuple[str, ...]:
    """The recipe families (``pcl``, ``duda``, ``pcl-birds``, ``clip4idc``, and any registered)."""
    return tuple(dict.fromkeys(r.family for r in registry.recipes()))


def list_recipes(pattern: str = "*") -> list[str]:
    """Recipe names matching the shell-style ``pattern`` (e.g. ``"pcl/*"``, ``"*adapt*"``), in registry order."""
    return [name for name in all_recipes() if fnmatch.fnmatchcase(name, pattern)]


def variants(family: str) -> list[str]:
    """The variant names of ``family`` that are rows of a paper table, in table order (what that module's ``runs``
    and ``idckit train`` train by default); a recipe in no table would train only by name."""
    _check_family(family)
    return [r.variant for r in registry.recipes() if r.family == family and r.tables]


def get_recipe(name: object, family: str | None = None) -> Recipe:
    """The recipe ``name`` (``"pcl/full"``), or with ``family`` also its variant alone (``"full"``).

    An unknown name is the kit's :class:`~idckit.errors.ConfigError`, naming the closest known names."""
    if family is not None:
        _check_family(family)
    if isinstance(name, str):
        full = name if "/" in name or family is None else f"{family}/{name}"
        found = all_recipes().get(full)
        if found is not None and (family is None or found.family == family):
            return found
    known = [r.name for r in registry.recipes() if family is None or r.family == family]
    close = _close_matches(str(name), family)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    where = f"{family} recipe" if family else "recipe"
    raise ConfigError(f"unknown {where} {name!r}{hint}; known: {', '.join(known)}",
                      fix="`idckit list` prints every recipe with the tables that use it")


def _close_matches(query: str, family: str | None) -> list[str]:
    """Known names close to ``query``, compared by variant within its family (or within every family when the
    family is unknown), written as the query was: ``full`` for ``ful`` in family pcl, ``pcl/full`` for ``pcl/ful``."""
    fam, _, var = query.rpartition("/")
    pool = [r for r in registry.recipes() if r.family == (family or fam)] or registry.recipes()
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
    if family not in families():
        raise ConfigError(f"unknown recipe family {family!r}; known: {', '.join(families())}")


def describe(pattern: str = "*") -> str:
    """The recipes matching ``pattern`` as ``idckit list`` prints them: per recipe its name and one line, then its
    row's label and the tables that have that row."""
    names, recipes = list_recipes(pattern), all_recipes()
    if not names:
        raise ConfigError(f"no recipe matches {pattern!r}; known: {', '.join(recipes)}",
                          fix="give a shell-style pattern such as 'pcl/*' or '*clip*', or none for every recipe")
    width = max(len(n) for n in names)
    lines = []
    for n in names:
        r = recipes[n]
        lines.append(f"{n:<{width}}  {r.description}")
        by_label: dict[str, list[str]] = {}
        for t in r.tables:
            by_label.setdefault(r.row_label(t), []).append(t)
        rows = ("; ".join(f"row \"{label}\" in {', '.join(ts)}" for label, ts in by_label.items())
                or f"\"{r.label}\": in no table; trained only when named")
        lines.append(f"{'':<{width}}  {rows}")
    return "\n".join(lines)


__all__ = ["Recipe", "all_recipes", "families", "list_recipes", "variants", "get_recipe", "check_variants", "describe"]
