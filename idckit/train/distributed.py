"""Data-parallel training across processes: torchrun starts them, ``torch.distributed`` connects them.

``torchrun --nproc_per_node=N -m idckit.cli ...`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous
address; :func:`init` joins the process group (NCCL on CUDA, gloo on the CPU). Without those variables every
function here is the identity of a single process, so the same code runs alone or in a group.

How a step is split (the rules :func:`idckit.train.loop.fit` and the tasks follow):

- Every rank draws the same GLOBAL batch from the loop's (seed, epoch) generator and keeps its rank-strided rows
  (``shard``). The data order, the resume position and the paper's batch size stay global: N processes at batch B
  train on exactly the batches one process at batch B would.
- Losses that average over items (tokens, regions, pairs) divide their local sum by the GLOBAL count
  (:func:`global_mean`); DistributedDataParallel averages the gradients over ranks, hence the factor
  ``world``. The result is the gradient of the one-process loss, however unevenly the items fall on ranks.
- Contrastive losses (InfoNCE of CLIP pre-training and of CLIP4IDC's adaptation) use ALL-GATHERED in-batch
  negatives (:func:`gather_with_grad`): every rank scores its rows against the whole global batch, as the papers'
  batch of 128 means, not against its 128/N slice.
"""
from __future__ import annotations

import datetime
import os
import warnings
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


_ALONE = False     # inside main_first: this process acts as a single one (no collectives)

#: How long a rank waits in a collective. torch's default (30 minutes for gloo, 10 for NCCL) is shorter than what
#: rank 0 may spend alone in :func:`main_first` while the others wait at its barrier: rendering the cpu profile's
#: 8,000 SynthCLEVR-Change scenes took 16-32 minutes here, and extracting ResNet-101 features for real CLEVR-Change
#: takes as long on a GPU.
TIMEOUT = datetime.timedelta(hours=6)


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() and not _ALONE else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() and not _ALONE else 0


def is_main() -> bool:
    return rank() == 0


def init(device: torch.device) -> bool:
    """Join the process group torchrun describes in the environment; False when this is a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    return True


def shard(rows: torch.Tensor) -> torch.Tensor:
    """This rank's rank-strided part of a global batch's rows (all of them in a single process)."""
    return rows[rank()::world()] if world() > 1 else rows


def all_sum(value: torch.Tensor) -> torch.Tensor:
    """The sum over ranks (a copy; no gradient)."""
    if world() == 1:
        return value.detach().clone()
    value = value.detach().clone()
    dist.all_reduce(value)
    return value


def global_mean(local_sum: torch.Tensor, local_count: int | torch.Tensor) -> torch.Tensor:
    """``local_sum / global count * world``: under DDP's gradient averaging, the gradient of the one-process mean.

    Its value on one rank is that rank's share times ``world``; the mean over ranks (what the loop logs) is the
    one-process mean. No item at all gives 0 (the sum is 0), not NaN."""
    if world() == 1:
        return local_sum / max(int(local_count), 1)
    count = torch.as_tensor(local_count, dtype=torch.float64, device=local_sum.device)
    return local_sum * world() / all_sum(count).clamp(min=1).to(local_sum.dtype)


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """The rows of ``x`` from every rank, concatenated in rank order; gradients flow back to each rank's rows."""
    if world() == 1:
        return x
    # local: raises ImportError on a torch built without distributed (the module checks dist.is_available())
    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():   # deprecated in favour of a private module; open_clip uses it the same way
        warnings.simplefilter("ignore", FutureWarning)
        return torch.cat(all_gather(x.contiguous()), 0)


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (decisions such as early stopping, so that no rank waits alone)."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any] | None:
    """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere)."""
    if world() == 1:
        return [obj]
    out = [None] * world() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def main_first(fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, then on the other ranks: rank 0 writes a cache (images, features, a generated dataset)
    that the others then only read. The plain call in a single process. Inside, every rank acts as a single
    process (``world()`` is 1), so ``fn`` must not train or evaluate."""
    if world() == 1:
        return fn()
    first = is_main()

    def alone():
        global _ALONE
        _ALONE = True        # nested guards (features, image caches) must not wait for ranks that are not there
        try:
            return fn()
        finally:
            _ALONE = False

    out = alone() if first else None
    barrier()
    if not first:
        out = alone()        # the caches exist now: this only reads them
    barrier()
    return out


def split_evenly(items: Sequence[Any]) -> Sequence[Any]:
    """This rank's rank-strided share of evaluation work."""
    return items[rank()::world()] if world() > 1 else items
