"""The experiments' side of the config system: named model configs, the loop's settings and a notebook's seeds.

A run's settings are data, one JSON file per kind of run (read and layered by :mod:`idckit.settings`, which owns the
files): ``configs/<name>.json`` holds ``{"base": {...}, "profiles": {"smoke": {...}, "cpu": {...}, "paper": {...}}}``;
a resolved config is base <- profile <- overrides, merged key by key at every depth. The resolved dict is
what the run cache hashes, so two notebooks asking for the same settings share one run.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from idckit import registry
from idckit.errors import ConfigError
# the files' layers live low in the package (the generators read them too); re-exported here for the experiments
from idckit.settings import (CONFIG_DIR, PROFILES, check_profile, deep_merge, load_config,  # noqa: F401
                             read_config_file)


def check_seeds(seeds: object) -> list[int]:
    """A notebook's ``seeds`` parameter: a non-empty list of distinct non-negative integers."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (list, tuple)) or not seeds:
        raise ConfigError(f"seeds must be a non-empty list of integers, got {seeds!r}",
                          fix="pass e.g. seeds=[0] or seeds=[0, 1, 2]")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise ConfigError(f"seeds must be integers >= 0; bad: {bad!r}", fix="pass e.g. seeds=[0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds repeat a value: {list(seeds)!r} (a repeated seed is the same cached run, and "
                          "would count twice in the mean)", fix="list each seed once")
    return list(seeds)


# -- named model configs -----------------------------------------------------------------------------------------
def model_names() -> list[str]:
    """Every named model config, e.g. ``pcl-cpu``, ``clip4idc-paper``."""
    return [f"{family}-{profile}" for family in registry.model_families() for profile in PROFILES]


def model_config(name: str, **fields: Any):
    """The model config ``name`` = ``<family>-<profile>`` (:func:`model_names`): the model section of that
    profile's JSON (plus its caption length: ``caption_max_len`` where the profile sets one, CLIP4IDC's captioning
    length, else ``max_len``), with ``fields`` on top: the sizes only data knows (``vocab_size``,
    ``feat_dim``, ``n_regions`` for IDC-PCL and DUDA) and any override. Returns the family's dataclass
    (:class:`~idckit.models.pcl.PCLConfig`, :class:`~idckit.models.clip4idc.CaptionerConfig`,
    :class:`~idckit.models.duda.DUDAConfig`)."""
    family, _, profile = str(name).rpartition("-")
    families = registry.model_families()
    if family not in families or profile not in PROFILES:
        raise ConfigError(f"unknown model config {name!r}; known: {', '.join(model_names())}")
    file, section, length_key = families[family].model
    cfg = load_config(file, profile)
    settings = dict(cfg[section])
    if length_key is not None:
        # the length the family's captioner trains with (experiments.clip4idc.caption_data reads the same)
        own = cfg.get("caption_max_len")
        settings[length_key] = cfg["max_len"] if own is None else own
    cls = registry.resolve(families[family].config_class)
    try:
        return cls(**{**settings, **fields})
    except TypeError as exc:   # a missing data size or a misspelt override
        raise ConfigError(f"cannot build {name!r}: {exc}", path=CONFIG_DIR / f"{file}.json",
                          fix="pass the data's sizes (vocab_size, feat_dim, n_regions) and only known fields") from exc


# -- the training loop's settings ----------------------------------------------------------------------------------
def train_config(block: Mapping[str, Any], seed: int | None = None, *, steps_per_epoch: int | None = None):
    """The loop's :class:`~idckit.train.loop.TrainConfig` from a profile's ``train`` section (the one dialect of
    every run): ``configs/train.json``'s defaults <- ``block`` <- ``seed``. ``epochs``, ``warmup_fraction`` and
    ``eval_every_epochs`` (null or absent: not used) become steps for ``steps_per_epoch`` optimiser steps per epoch."""
    # local: idckit.train.loop imports torch (~1.3 s); `idckit reproduce`'s lane workers import this module before
    # they set their thread count, which torch fixes when it is imported
    from idckit.train.loop import TrainConfig

    t = dict(block)
    epochs, warmup, every = t.pop("epochs", None), t.pop("warmup_fraction", None), t.pop("eval_every_epochs", None)
    if (epochs is not None or every is not None) and steps_per_epoch is None:
        raise ConfigError("a train section in epochs needs the data's steps per epoch",
                          fix="give max_steps and eval_every instead of epochs and eval_every_epochs")
    if epochs is not None:                       # a profile sets these to null to give steps directly
        t["max_steps"] = int(math.ceil(epochs * steps_per_epoch))
    if warmup is not None:
        # BERT's schedules compare step / total with the fraction itself (their warm-up may end mid-step); the
        # others count whole warm-up steps
        bert = str(t.get("schedule", read_config_file("train")["base"]["schedule"])).endswith("_bert")
        t["warmup_steps"] = warmup * t["max_steps"] if bert else int(round(warmup * t["max_steps"]))
    if every is not None:
        t["eval_every"] = max(1, int(every * steps_per_epoch))
    if seed is not None:
        t["seed"] = seed
    return TrainConfig.from_dict({**read_config_file("train")["base"], **t})
