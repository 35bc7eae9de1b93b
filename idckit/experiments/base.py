"""The protocol every experiment family follows, and what the families share.

A family module (``pcl``, ``duda``, ``birds``, ``clip4idc``; :data:`idckit.registry.FAMILIES` maps the names) has
``FAMILY`` (its recipes' family), ``MODEL``, ``setup(profile, data_root, *, runs_dir, progress, device, ...)`` which
prepares everything on disk a run reads (the data, generated when synthetic; features) before any training,
``run_variant(setup, variant, seed, *, progress)`` and ``runs`` (:func:`family_runs`). ``idckit train FAMILY``
(:func:`train`) works on any of them.

In-memory data that several runs of one process share (loaded features, vocabularies, decoded images, intra-stage
caches, the final scorer) lives in the one :data:`CACHE`, not in module globals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from idckit import registry
from idckit.experiments import recipes
from idckit.experiments.config import check_seeds, load_config


class Cache:
    """Named slots of in-memory objects shared by the runs of one process. Each slot keeps its ``keep`` most recent
    keys (a notebook's data one after another, not all of them at once); :meth:`clear` empties one slot or all."""

    def __init__(self) -> None:
        self._slots: dict[str, dict[Any, Any]] = {}

    def get(self, slot: str, key: Any, build: Callable[[], Any], *, keep: int = 1) -> Any:
        entries = self._slots.setdefault(slot, {})
        if key not in entries:
            value = build()
            while len(entries) >= keep:
                old = entries.pop(next(iter(entries)))
                close = getattr(old, "close", None)
                if callable(close):
                    close()
            entries[key] = value
        return entries[key]

    def clear(self, slot: str | None = None) -> None:
        for name in ([slot] if slot else list(self._slots)):
            for value in self._slots.pop(name, {}).values():
                close = getattr(value, "close", None)
                if callable(close):
                    close()


#: the process's shared in-memory data (see :class:`Cache`)
CACHE = Cache()


def runtime(profile: str, device: str | None = None) -> tuple[str, dict[str, Any]]:
    """(device, loader settings) of every run at ``profile`` (``configs/runtime.json``; ``device`` overrides it).
    Neither is part of a run key. An unknown device fails here, before any data is generated."""
    # local: idckit.device imports torch (~1.3 s); `idckit reproduce`'s lane workers import this module before they
    # set their thread count, which torch fixes when it is imported
    from idckit.device import resolve

    rt = load_config("runtime", profile)
    device = device or rt["device"]
    resolve(device)
    return device, rt["loader"]


@dataclass
class Setup:
    """What a family's runs read (the one setup of every family): the resolved settings of its profile, the data
    (:class:`~idckit.experiments.data.DataChoice` or ``BirdsChoice``), where runs are cached and where they train
    (neither part of any run key); the feature-based families (IDC-PCL, DUDA, birds) add their grid features, CLIP4IDC
    the data its stand-in CLIP learns from."""

    profile: str
    config: dict[str, Any]
    data: Any
    runs_dir: Path
    store: Any = None           # idckit.data.features.FeatureStore of a feature-based family
    device: str = "auto"
    loader: dict[str, Any] = field(default_factory=dict)   # DataLoader workers (idckit.train.loader)
    progress: bool = True
    #: CLIP4IDC: where the stand-in CLIP learns (prepared by setup, never mid-run): this data if it has scene
    #: descriptions, else the profile's synthetic set of the same dataset; None with named weights
    described: Any = None

    @property
    def identity(self) -> dict[str, Any]:
        """What a run key depends on besides the run's own settings: which data (its content, not its path), which
        features (backbone, weights, grid size) where the family has them, and the share of training pairs where
        the family has one."""
        ident = {"data": self.data.identity, "data_version": self.data.version}
        if self.store is not None:
            ident.update({"features": self.store.meta.get("backbone"), "weights": self.store.meta.get("weights"),
                          "feature_size": self.store.meta.get("image_size")})
        if "train_fraction" in self.config:
            ident["train_fraction"] = self.config["train_fraction"]
        if "words_kept" in self.config:          # IDC-PCL's caption truncation: which token ids a run trains on
            ident["words_kept"] = self.config["words_kept"]
        return ident

    @property
    def train_fraction(self) -> float:
        return float(self.config["train_fraction"])


def features(cfg: dict[str, Any], root: Path, cache_name: str, runs_dir: Path, *, device: str, progress: bool,
             images: Sequence[str] | None = None):
    """The grid features of ``cfg``'s backbone at its ``feature_size`` for the images under ``root`` (extracted once
    into ``runs_dir/features/<data>/<backbone>``, then read back)."""
    from idckit.data.features import extract_features, store_name  # local: torch (~1.3 s), see runtime

    size = cfg["feature_size"]
    out = runs_dir / "features" / cache_name / store_name(cfg["backbone"].replace(":", "_").replace("/", "_"), size)
    return extract_features(root, cfg["backbone"], weights=cfg.get("backbone_weights"), images=images, out_dir=out,
                            progress=progress, device=device, image_size=size)


def family_runs(run_variant: Callable[..., dict[str, Any]], family: str):
    """A family's ``runs(setup, variants=None, seeds=(0,), *, progress=...)``: every requested variant (default:
    every ``<family>/*`` recipe) for every seed, each run trained once then cached. All names and seeds are checked
    before the first run trains."""

    def runs(s, variants: Sequence[str] | None = None, seeds: Sequence[int] = (0,), *,
             progress: bool | None = None) -> list[dict[str, Any]]:
        variants = recipes.check_variants(variants, family)
        seeds = check_seeds(seeds)
        kw = {} if progress is None else {"progress": progress}
        return [run_variant(s, v, seed, **kw) for v in variants for seed in seeds]

    runs.__doc__ = (f"Every requested variant (default: every ``{family}/*`` recipe) for every seed on one setup, "
                    "each run trained once then cached; names and seeds are checked before the first run trains.")
    return runs


def family_module(name: str):
    """The experiment module of family ``name`` (``pcl``, ``duda``, ``birds``, ``clip4idc``, or a registered one)."""
    return registry.family(name).experiment()


def train(name: str, profile: str, data_root: str | Path | None = None, *, variants: Sequence[str] | None = None,
          seeds: Sequence[int] = (0,), runs_dir: str | Path | None = None, device: str | None = None,
          progress: bool = True) -> list[dict[str, Any]]:
    """``idckit train FAMILY``: every requested variant x seed of the family (default: all its recipes), each trained
    once into the run cache the notebooks read. Under torchrun rank 0 prepares the data and features first (the
    other ranks then read them), and every rank trains its share."""
    from idckit.device import resolve  # local: torch (~1.3 s), see runtime
    from idckit.train import distributed  # local: torch (~1.3 s), see runtime

    recipe_family = registry.family(name).recipe_family
    module = family_module(name)
    # checked before any process starts, and before the data and features are prepared
    variants = recipes.check_variants(list(variants) if variants else None, recipe_family)
    seeds = check_seeds(list(seeds))
    distributed.init(resolve(device))
    progress = progress and distributed.is_main()
    s = distributed.main_first(lambda: module.setup(profile, data_root, runs_dir=runs_dir, progress=progress,
                                                    device=device))
    return module.runs(s, variants, seeds, progress=progress)
