"""The authors' checkpoint selection beside the kit's: what a run's metrics.json records of it.

The kit selects on val with its headline metric; the authors' scripts select otherwise (CLIP4IDC on the TEST split,
IDC-PCL with CIDEr-D on whitespace-split text). Where a run's ``train.authors_selection`` is set (the ``paper``
profile), the one training loop also keeps the checkpoint their rule picks (:data:`idckit.train.loop.AUTHORS_BEST`);
:func:`authors_entry` scores it on test like the val-selected one, and the report rows
(:mod:`idckit.experiments.reporting`) carry both numbers, each labelled. Stopping stays the val selection's: the
authors' pick is the best, by their rule, of the evaluations the kit's run made.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from idckit.device import model_device
from idckit.train import loop

#: how a report names the val-selected numbers where the authors' ones stand beside them
KIT_LABEL = "val-selected (kit)"


def authors_label(rule: Mapping[str, Any]) -> str:
    """How a report names the numbers of the checkpoint ``rule`` (a ``train.authors_selection``) picks, e.g.
    ``selected as the authors (test split, CIDEr-D)``."""
    text = f"{rule['split']} split, {rule['metric']}"
    if rule.get("tokenize") is False:
        text += " on whitespace-split text"
    return f"selected as the authors ({text})"


def authors_entry(res: loop.FitResult, task: Any, run_dir: str | Path,
                  test: Callable[[torch.nn.Module], Any]) -> dict[str, Any]:
    """``{"authors_selection": {...}}`` for a run's metrics.json, or ``{}`` when the run has no authors' selection
    (then nothing changes). Call it on every rank (``test`` may decode on all of them).

    ``test(model)`` scores a model on test as the run scores its val-selected one. Where the authors' rule picked
    the val selection's own step (the same weights), nothing is decoded again: ``test`` is None until
    :func:`with_test` fills in the val-selected scores."""
    a = res.authors
    if a is None:
        return {}
    same = a["best_step"] == res.best_step
    scores = None
    if not same:
        model = loop.load_best(task, run_dir, model_device(res.model), file=loop.AUTHORS_BEST)
        scores = test(model)
        del model
    rule = a["rule"]
    return {"authors_selection": {"rule": dict(rule), "label": authors_label(rule), "best_step": a["best_step"],
                                  "val_best_step": res.best_step, "same_as_val": same,
                                  "selection_score": a["best_metrics"].get(rule["metric"]),
                                  "history": a["history"], "test": scores}}


def with_test(entry: dict[str, Any], test: Any) -> dict[str, Any]:
    """``entry`` (:func:`authors_entry`) with the val-selected ``test`` scores where both picked the same step."""
    if entry and entry["authors_selection"]["test"] is None:
        entry["authors_selection"]["test"] = test
    return entry


__all__ = ["KIT_LABEL", "authors_label", "authors_entry", "with_test"]
