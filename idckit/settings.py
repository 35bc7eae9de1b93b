"""The config files' layers: ``configs/<name>.json`` read and merged, base <- profile <- dataset block <- overrides.

This module owns the config files (the kit's ``idckit/experiments/configs/`` and any folder registered with
:func:`idckit.registry.register`); it sits at the bottom of the package, so the data generators read their defaults
from the same files the experiments do. :mod:`idckit.experiments.config` adds what needs the
models and the loop (model configs, the loop's TrainConfig); :func:`resolved_with_sources` is what
``idckit config`` prints.
"""
from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from idckit.errors import ConfigError
from idckit.paths import DEFAULT_PROFILE

CONFIG_DIR = Path(__file__).parent / "experiments" / "configs"
PROFILES = ("smoke", "cpu", "paper")


def check_profile(profile: object) -> str:
    """``profile`` if it names one of :data:`PROFILES`, else the kit's error (before any data or run is touched)."""
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}",
                          fix=f"pass profile={DEFAULT_PROFILE!r} (the default), 'smoke' (minutes) or 'paper' "
                              "(a GPU's days)")
    return profile


def _unknown_keys(base: Mapping[str, Any], update: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in update.items():
        if key not in base:
            out.append(prefix + str(key))
        # a "train" block is the loop's TrainConfig, which checks its own keys (and has optional ones)
        elif isinstance(value, Mapping) and isinstance(base[key], Mapping) and key != "train":
            out += _unknown_keys(base[key], value, f"{prefix}{key}.")
    return out


#: settings that count something (examples, steps, tokens, heads, widths): below 1 a run cannot start
COUNTS = frozenset({"batch_size", "eval_batch_size", "max_steps", "max_len", "captions_per_pair", "n_heads", "heads",
                    "d_model", "d_ff", "n_layers", "log_every"})
_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "an object", type(None): "null"}


def _kind(value: Any) -> type:
    return dict if isinstance(value, Mapping) else list if isinstance(value, (list, tuple)) else type(value)


def _file_kinds(name: str) -> dict[tuple[str, ...], tuple[set[type], Any]]:
    """Every setting of config file ``name`` -> (the JSON types its base, profiles and dataset blocks give it, an
    example value); a ``train`` block's settings also take train.json's (the loop's defaults)."""
    out: dict[tuple[str, ...], tuple[set[type], Any]] = {}

    def walk(tree: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in tree.items():
            kinds, example = out.setdefault((*prefix, key), (set(), None))
            kinds.add(_kind(value))
            if example is None and value is not None:
                out[(*prefix, key)] = (kinds, value)
            if isinstance(value, Mapping):
                walk(value, (*prefix, key))

    raw = read_config_file(name)
    datasets = [d for d in raw.get("datasets", {}).values() if isinstance(d, Mapping)]
    for layer in [raw["base"], *raw["profiles"].values(), *(block for d in datasets for block in d.values())]:
        if isinstance(layer, Mapping):      # beside the layers, a file may hold an "_about" note
            walk(layer, ())
    loop = {} if name == "train" else read_config_file("train")["base"]
    for path in [p for p, (kinds, _) in out.items() if p[-1] == "train" and dict in kinds]:
        walk(loop, path)
    return out


def _check_kinds(name: str, overrides: Mapping[str, Any], kinds, prefix: tuple[str, ...] = ()) -> None:
    """An override must have a type its config file gives that setting (an integer where a float goes, anything
    where the file only has null), and a count at least 1: a wrong one would fail deep inside a run, or silently
    train and cache a run under a setting no code reads as meant."""
    for key, value in overrides.items():
        path = (*prefix, str(key))
        if path not in kinds:      # unknown: refused by name above, or a train setting TrainConfig checks
            continue
        seen, example = kinds[path]
        example = json.dumps(example) if len(json.dumps(example)) <= 40 else json.dumps(example)[:36] + " ..."
        got = _kind(value)
        dotted = ".".join(path)
        if got is dict and dict in seen:
            _check_kinds(name, value, kinds, path)
            continue
        fits = seen == {type(None)} or got in seen or (got is int and float in seen)
        if not fits:
            expected = " or ".join(_KIND_NAMES[k] for k in sorted(seen, key=list(_KIND_NAMES).index))
            raise ConfigError(f"override {dotted} = {value!r} is {_KIND_NAMES.get(got, got.__name__)}; {name}.json "
                              f"gives it {expected}", path=config_path(name),
                              fix=f"pass {expected} for {dotted}, like the file's {example}")
        if path[-1] in COUNTS and got is int and value < 1:
            raise ConfigError(f"override {dotted} = {value} must be an integer >= 1 (it counts)",
                              path=config_path(name),
                              fix=f"pass a count >= 1 for {dotted}, like the file's {example}")


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: config folders registered from outside the kit (:func:`idckit.registry.register`), read after CONFIG_DIR
_EXTRA_DIRS: list[Path] = []


@contextlib.contextmanager
def extra_config_dir(folder: str | Path | None) -> Iterator[None]:
    """Config files of ``folder`` are known while the block runs (None: nothing added)."""
    if folder is not None:
        _EXTRA_DIRS.append(Path(folder))
    try:
        yield
    finally:
        if folder is not None:
            _EXTRA_DIRS.remove(Path(folder))


def config_path(name: str) -> Path:
    """The file of config ``name``: the kit's own, else a registered folder's (the kit's path when none has it)."""
    for folder in (CONFIG_DIR, *_EXTRA_DIRS):
        if (folder / f"{name}.json").is_file():
            return folder / f"{name}.json"
    return CONFIG_DIR / f"{name}.json"


def config_names() -> list[str]:
    return sorted({p.stem for folder in (CONFIG_DIR, *_EXTRA_DIRS) for p in folder.glob("*.json")})


def read_config_file(name: str) -> dict[str, Any]:
    path = config_path(name)
    if not path.is_file():
        raise ConfigError(f"no config named {name!r}; known: {', '.join(config_names())}", path=path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config is not valid JSON ({exc})", path=path, fix="fix the JSON syntax") from exc
    if not isinstance(raw, dict) or "base" not in raw or "profiles" not in raw:
        raise ConfigError('a config file must be {"base": {...}, "profiles": {...}}', path=path)
    return raw


def _layers(name: str, profile: str) -> list[tuple[str, Mapping[str, Any]]]:
    raw = read_config_file(name)
    check_profile(profile)
    if profile not in raw["profiles"]:
        raise ConfigError(f"unknown profile {profile!r} for config {name!r}; known: {', '.join(raw['profiles'])}",
                          path=config_path(name), fix=f"use one of {', '.join(PROFILES)}")
    return [(f"{name}.json base", raw["base"]), (f"{name}.json profiles.{profile}", raw["profiles"][profile])]


def load_config(name: str, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config of kind ``name`` at ``profile`` (smoke, cpu or paper) with ``overrides`` on top."""
    resolved: dict[str, Any] = {}
    for _, layer in _layers(name, profile):
        resolved = deep_merge(resolved, layer)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides must be a dict of settings, got {overrides!r}", path=config_path(name),
                          fix="pass e.g. overrides={'finetune': {'train': {'max_steps': 100}}}")
    unknown = _unknown_keys(resolved, overrides or {})
    if unknown:  # a typo would otherwise train (and cache) a run with the setting silently ignored
        raise ConfigError(f"unknown settings in overrides for {name!r}: {', '.join(unknown)}",
                          path=config_path(name), fix="use the setting names of this config file")
    _check_kinds(name, overrides or {}, _file_kinds(name))
    return deep_merge(resolved, overrides or {})


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolved_with_sources(names: list[str], profile: str, dataset: str | None = None
                          ) -> list[tuple[str, Any, str]]:
    """(setting, value, the layer that set it) for every leaf of the config files ``names`` at ``profile``: each
    file's base, its profile block and, with ``dataset``, its ``datasets.<dataset>.<profile>`` block; settings are
    prefixed with the file's name (``pcl.model.d_model``)."""
    out = []
    for name in names:
        layers = _layers(name, profile)
        if dataset is not None:
            block = read_config_file(name).get("datasets", {}).get(dataset, {}).get(profile)
            if block:
                layers.append((f"{name}.json datasets.{dataset}.{profile}", block))
        where: dict[str, str] = {}
        resolved: dict[str, Any] = {}
        for label, layer in layers:
            for key in _flatten(layer):
                where[key] = label
            resolved = deep_merge(resolved, layer)
        for key, value in _flatten(resolved).items():
            out.append((f"{name}.{key}", value, where.get(key, "?")))
    return out
