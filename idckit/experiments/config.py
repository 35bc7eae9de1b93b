"""The one config system: a run's settings are data, one JSON file per kind of run.

``configs/<name>.json`` holds ``{"base": {...}, "profiles": {"smoke": {...}, "cpu": {...}, "paper": {...}}}``;
a resolved config is base <- profile <- overrides, merged key by key at every depth. The resolved dict is
what the run cache hashes, so two notebooks asking for the same settings share one run.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

from idckit.errors import ConfigError
from idckit.paths import DEFAULT_PROFILE

CONFIG_DIR = Path(__file__).parent / "configs"
PROFILES = ("smoke", "cpu", "paper")


def check_profile(profile: object) -> str:
    """``profile`` if it names one of :data:`PROFILES`, else the kit's error (before any data or run is touched)."""
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}",
                          fix=f"pass profile={DEFAULT_PROFILE!r} (the default), 'smoke' (minutes) or 'paper' "
                              "(a GPU's days)")
    return profile


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_config_file(name: str) -> dict[str, Any]:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
        raise ConfigError(f"no config named {name!r}; known: {', '.join(known)}", path=path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config is not valid JSON ({exc})", path=path, fix="fix the JSON syntax") from exc
    if not isinstance(raw, dict) or "base" not in raw or "profiles" not in raw:
        raise ConfigError('a config file must be {"base": {...}, "profiles": {...}}', path=path)
    return raw


def load_config(name: str, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config of kind ``name`` at ``profile`` (smoke, cpu or paper) with ``overrides`` on top."""
    raw = read_config_file(name)
    if profile not in raw["profiles"]:
        raise ConfigError(f"unknown profile {profile!r} for config {name!r}; known: {', '.join(raw['profiles'])}",
                          path=CONFIG_DIR / f"{name}.json", fix=f"use one of {', '.join(PROFILES)}")
    return deep_merge(deep_merge(raw["base"], raw["profiles"][profile]), overrides or {})
