"""Parity with the authors' public code: recordings of their modules' outputs, and converters of their weights.

The kit never contains the authors' code. ``python -m idckit.authors record`` imports their modules from checkouts
named on the command line, builds each at a tiny size with a fixed seed on CPU and saves the state_dict, inputs and
outputs as small ``.pt`` files (``tests/parity/``). The parity tests load a recording, convert its weights with
the functions here (the same ones ``idckit import-checkpoint`` uses for released checkpoints) and assert that the
kit's module computes the same numbers. One module per family: :mod:`idckit.authors.pcl` (IDC-PCL, ``clver/`` and
``bird/``) and :mod:`idckit.authors.clip4idc`.
"""
from __future__ import annotations

import subprocess
from pathlib import Path


def checkout_commit(checkout: Path) -> str:
    """The commit a recording was made from (``unknown`` where the checkout is no git work tree)."""
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
