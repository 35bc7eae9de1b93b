"""The kit's own exception types.

Every error a user can meet (missing files, wrong layout, malformed JSON, no Java, no weights offline) is
raised as an ``IdckitError`` whose message names the path, what was expected, and how to fix it, and is
raised before any output is written.
"""
from __future__ import annotations

from pathlib import Path


class IdckitError(Exception):
    """Base class: a problem the user can fix; the message says how."""

    def __init__(self, message: str, *, path: str | Path | None = None, fix: str | None = None):
        self.path = None if path is None else Path(path)
        self.fix = fix
        parts = [message]
        if path is not None:
            parts.append(f"  path: {path}")
        if fix:
            parts.append(f"  fix:  {fix}")
        super().__init__("\n".join(parts))


class DatasetError(IdckitError):
    """A dataset on disk does not have the expected layout or content."""


class ResultsError(IdckitError):
    """A results file (RCC format) is missing, malformed, or does not match the dataset."""


class MissingDependencyError(IdckitError):
    """A system or Python dependency (Java, a package, model data) is not available."""


class WeightsUnavailableError(IdckitError):
    """Pretrained weights cannot be loaded (offline, or the file is missing)."""


class ConfigError(IdckitError):
    """A configuration or profile is unknown or inconsistent."""
