"""Feeding the training loop: a task's batches through PyTorch's own ``DataLoader`` (workers, pinned memory).

A task's ``batches(epoch, generator)`` draws each batch's indices (pairs, captions, masks): cheap, sequential, and
the only place the data order comes from. What can cost time is reading what the indices point at: grid-feature
rows of the memory-mapped feature store, uint8 pixels of the image cache. A task that has ``load(batch) -> batch``
does that read there; this module runs ``load`` in ``workers`` DataLoader processes ahead of the step, into pinned
(page-locked) memory when the device is CUDA, so the step's host-to-device copy (``non_blocking``, see
:func:`idckit.device.copy_to`) overlaps the GPU's work.

The draws stay in the training process, in order (:class:`TaskBatches`, the DataLoader's sampler): a worker only
receives a drawn batch and reads its rows, which is a function of the batch alone, and the DataLoader hands batches
back in the sampler's order. So any number of workers gives the batches of ``workers=0`` bit for bit; under
torchrun each rank shards the global batch (``task.shard``) before its workers read, so a rank reads only its rows;
a resumed run skips the consumed batches of its epoch without reading them.

``workers=0`` (the configs' default) reads in the training process, between steps, as the kit always did. Workers
pay off when a read is slow against a step: a GPU step, features paged in from disk, pixels of the 224 px cache.
On a CPU-only machine they compete with the step for the same cores (``bench/bench_train_loop.py``, mode
``workers``, measures it).
Workers are forked (Linux's default start method) and share the memory-mapped features through the page cache;
under the spawn start method (macOS, Windows) each would pickle the task's data, so keep ``workers=0`` there.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from idckit.errors import ConfigError
from idckit.train import distributed


@dataclass(frozen=True)
class LoaderConfig:
    workers: int = 0     # DataLoader worker processes reading batches ahead; 0 reads in the training process
    prefetch: int = 2    # batches each worker reads ahead (DataLoader's prefetch_factor)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | "LoaderConfig" | None) -> "LoaderConfig":
        if isinstance(d, LoaderConfig):
            return d
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown loader settings {unknown}; known: {sorted(known)}",
                              fix='set e.g. "loader": {"workers": 4} in the config')
        for name in known & set(d):
            value, least = d[name], 0 if name == "workers" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"loader setting {name!r} must be an integer >= {least}, got {value!r}",
                                  fix='set e.g. "loader": {"workers": 4, "prefetch": 2} in the config')
        return cls(**d)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of epoch ``epoch``'s draws: the data order depends only on (run seed, epoch)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class TaskBatches(Sampler):
    """The sampler: the task's batches of the current epoch (this rank's shard under torchrun), after ``skip``."""

    def __init__(self, task: Any, seed: int):
        self.task, self.seed, self.epoch, self.skip = task, seed, 0, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[Any]:
        sharded = distributed.world() > 1
        for i, batch in enumerate(self.task.batches(self.epoch, epoch_generator(self.seed, self.epoch))):
            if i >= self.skip:     # a resumed epoch replays the draws of the consumed batches, not their reads
                yield self.task.shard(batch) if sharded else batch


class _Reads(Dataset):
    """``dataset[batch]``: the batch with its rows read (``task.load``), the batch itself for a task without one."""

    def __init__(self, task: Any):
        self.load = getattr(task, "load", None)

    def __getitem__(self, batch: Any) -> Any:
        return self.load(batch) if self.load is not None else batch


def _as_is(batch: Any) -> Any:
    return batch


class BatchLoader:
    """The loop's batches, epoch by epoch, through one DataLoader (its workers persist across epochs)."""

    def __init__(self, task: Any, seed: int, cfg: LoaderConfig, device: torch.device):
        self.sampler = TaskBatches(task, seed)
        extra = {"persistent_workers": True, "prefetch_factor": cfg.prefetch} if cfg.workers else {}
        # the DataLoader's own generator: without it, starting an epoch would draw from torch's global RNG and
        # shift every later dropout mask
        self.loader: DataLoader | None = DataLoader(
            _Reads(task), batch_size=None, sampler=self.sampler, collate_fn=_as_is, num_workers=cfg.workers,
            pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(seed), **extra)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        """The batches of ``epoch`` after the first ``skip`` (read, and pinned on CUDA)."""
        self.sampler.set_epoch(epoch, skip)
        return iter(self.loader)

    def close(self) -> None:
        """Stop the workers (dropping the DataLoader shuts its persistent iterator down)."""
        self.loader = None
