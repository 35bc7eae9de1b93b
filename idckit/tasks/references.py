"""Which references a training step reads when it takes several captions per pair."""
from __future__ import annotations

import torch


def pick_references(offsets: torch.Tensor, counts: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """[P, k] caption rows: ``k`` distinct references of each pair in a random order (its captions are the rows
    ``offsets[i] .. offsets[i] + counts[i] - 1``), cycling through them where a pair has fewer than ``k``, so every
    reference is read once before any is read twice."""
    order = torch.rand(len(counts), int(counts.max()), generator=generator)
    order[torch.arange(order.shape[1])[None, :] >= counts[:, None]] = 2.0    # absent references sort last
    rank = order.argsort(1)
    pick = rank[:, :k] if rank.shape[1] >= k else rank.repeat(1, k)[:, :k]
    return offsets[:, None] + pick % counts[:, None]
