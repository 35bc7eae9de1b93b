"""A notebook refuses a parameter it does not take, in its first cells, not after the work.

papermill runs ``-p NAME VALUE`` as a cell it inserts after the cell tagged ``parameters`` (its first line is
``# Parameters``) and only warns about a name the notebook does not take: ``-p profil smoke`` would silently run
the default profile for many minutes. Each notebook calls :func:`check_parameters` right after its parameters
cell; it reads the two cells from the kernel's input history (``In``) and raises naming the unknown parameters
and the known ones. It also claims the notebook's ``report_dir`` as ``idckit reproduce`` claims its own, so a
folder holding the user's files is refused in seconds, not after the work.
"""
from __future__ import annotations

import ast
from typing import Any, Mapping, Sequence

from idckit import paths
from idckit.errors import ConfigError
from idckit.reports.report import claim_notebook_report_dir

INJECTED_HEADER = "# Parameters"    # papermill's first line of the cell it injects


def assigned_names(source: str) -> list[str]:
    """The names a cell assigns at its top level, in order (``a = 1``, ``a: int = 1``, ``a = b = 2``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in names:
                    names.append(n.id)
    return names


def unknown_parameters(cells: Sequence[str]) -> tuple[list[str], list[str]]:
    """(unknown injected names, known names) from the executed cells in order: the last papermill-injected cell
    against the cell run just before it (the parameters cell). Nothing injected: ([], [])."""
    cells = [c for c in cells if isinstance(c, str) and c.strip()]
    at = next((i for i in range(len(cells) - 1, -1, -1) if cells[i].lstrip().startswith(INJECTED_HEADER)), None)
    if at is None or at == 0:
        return [], []
    known = assigned_names(cells[at - 1])
    return [n for n in assigned_names(cells[at]) if n not in known], known


def check_parameters(namespace: Mapping[str, Any]) -> None:
    """Raise when papermill injected a parameter the notebook's parameters cell does not define, or when its
    ``report_dir`` (default: the profile's reports folder) is one the kit may not write into: a user's own files
    there are refused now, before the work, not met when the report is written."""
    unknown, known = unknown_parameters(namespace.get("In") or [])
    if unknown:
        raise ConfigError(f"unknown notebook parameter{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; this notebook takes: {', '.join(known)}",
                          fix=f"check the spelling of -p {unknown[0]} (papermill -p NAME VALUE, NAME one of the "
                              "above); nothing was run")
    if "report_dir" in namespace:
        claim_notebook_report_dir(namespace["report_dir"] or paths.reports_dir(namespace.get("profile")))
