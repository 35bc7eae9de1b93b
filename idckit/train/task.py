"""What the one training loop (:func:`idckit.train.loop.fit`) needs from a piece of work.

IDC-PCL pre-training, IDC-PCL fine-tuning, CLIP stand-in pre-training, CLIP4IDC adaptation and CLIP4IDC
captioning are all ``Task`` objects; the loop owns everything they share: the optimiser and schedule,
checkpoints with RNG states, resume, evaluation cadence, checkpoint selection on val, early stopping,
mixed precision, the device, data-parallel training, progress bars and logs.

A task that trains under torchrun also has ``shard(batch) -> batch``: this rank's rows of a global batch
(:func:`idckit.train.distributed.shard`); its ``train_step`` moves what it reads to the model's device
(:func:`idckit.device.model_device`) and its losses follow :mod:`idckit.train.distributed`'s rules, so N processes
compute the one-process gradient.

A task may also have ``load(batch) -> batch``: the batch with the rows its step reads (grid features, pixels)
already read into CPU tensors, so DataLoader workers do the reading ahead of the step (:mod:`idckit.train.loader`).
It must depend on the batch alone (no model, no random draw); ``train_step`` takes a batch with or without them.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

import torch


@runtime_checkable
class Task(Protocol):
    #: metric in the dict returned by :meth:`evaluate` that chooses the checkpoint (higher is better),
    #: e.g. ``"CIDEr-D"`` or ``"t2p_R@1"``.
    selection_metric: str

    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (the loop seeds torch before calling this)."""

    def param_groups(self, model: torch.nn.Module) -> list[dict[str, Any]]:
        """Optimiser parameter groups; each may carry ``lr_scale`` (multiplies the schedule's lr) and
        ``weight_decay``. Return ``[{"params": [...]}]`` for a single group."""

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[Any]:
        """The training batches of one epoch, in an order that depends only on ``epoch`` and
        ``generator`` (seeded by the loop from the run seed and the epoch), so a resumed run replays
        the same data. The loop skips the batches a resumed run already consumed."""

    def train_step(self, model: torch.nn.Module, batch: Any, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Return (loss to backpropagate, scalar logs). ``step`` is the 0-based global step."""

    def evaluate(self, model: torch.nn.Module, split: str = "val") -> dict[str, float]:
        """Metrics on ``split`` (model in eval mode, no grad); must include ``selection_metric``."""


def weight_decay_groups(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float, *,
                        lr_scale: float = 1.0) -> list[dict[str, Any]]:
    """Two optimiser groups of the trainable parameters, open_clip's rule: ``weight_decay`` on matrices, none on
    gains, biases, embeddings and CLIP's temperature (``logit_scale``); both at ``lr_scale``."""
    decay, no_decay = [], []
    for name, p in named_parameters:
        if not p.requires_grad:
            continue
        exclude = p.ndim < 2 or "embedding" in name or "logit_scale" in name
        (no_decay if exclude else decay).append(p)
    return [{"params": decay, "lr_scale": lr_scale, "weight_decay": weight_decay},
            {"params": no_decay, "lr_scale": lr_scale, "weight_decay": 0.0}]
