"""Where the kit keeps data, runs and reports.

In a clone these are ``data/``, ``runs/`` and ``reports/`` beside ``pyproject.toml``; the environment variables
``IDCKIT_DATA_DIR``, ``IDCKIT_RUNS_DIR`` and ``IDCKIT_REPORTS_DIR`` move them (e.g. onto a big disk).
"""
from __future__ import annotations

import os
from pathlib import Path

#: the profile whose reports are committed under reports/ and summarised in the README
DEFAULT_PROFILE = "cpu"


def project_root() -> Path:
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def _dir(env: str, default: str) -> Path:
    """The folder ``env`` names, absolute against the working directory now (a path kept, then used after a
    ``chdir`` or handed to a kernel in ``notebooks/``, still names the same place); else ``default`` in the clone."""
    value = os.environ.get(env)
    return Path(os.path.abspath(os.path.expanduser(value))) if value else project_root() / default


def data_dir() -> Path:
    return _dir("IDCKIT_DATA_DIR", "data")


def runs_dir() -> Path:
    return _dir("IDCKIT_RUNS_DIR", "runs")


def reports_dir(profile: str | None = None) -> Path:
    """``reports/`` for the default profile (the committed reports the README's table shows); ``reports/<profile>/``
    for any other, so a quick smoke run never overwrites them."""
    root = _dir("IDCKIT_REPORTS_DIR", "reports")
    return root if profile in (None, DEFAULT_PROFILE) else root / profile


def notebooks_dir() -> Path:
    return project_root() / "notebooks"
