"""Learning-rate schedules as multipliers of the base lr, one function of the step each.

- ``noam``: IDC-PCL pre-training (public ``utils.py``): linear warm-up to lr, then lr * sqrt(warmup / step).
- ``step_decay``: IDC-PCL fine-tuning: lr, then halved every ``decay_every`` steps, at most ``decay_times``
  times (the public code: lr until 10k, lr/2 until 20k, lr/4 after).
- ``warmup_cosine`` / ``warmup_linear``: CLIP4IDC (CLIP4Clip's BertAdam warm-up, then cosine or linear decay).
"""
from __future__ import annotations

import math
from typing import Callable

from idckit.errors import ConfigError

SCHEDULES = ("constant", "noam", "step_decay", "warmup_cosine", "warmup_linear")


def lr_factor(name: str, *, max_steps: int, warmup_steps: int = 0, decay_every: int = 0,
              decay_times: int = 2) -> Callable[[int], float]:
    """``f(step)``: the multiplier of the base lr for the optimiser step ``step`` (0-based)."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if name == "step_decay" and decay_every <= 0:
        raise ConfigError("schedule step_decay needs decay_every > 0")

    def warm(step: int) -> float | None:
        s = step + 1
        return s / warmup_steps if s < warmup_steps else None

    def f(step: int) -> float:
        if name == "constant":
            return 1.0
        if name == "step_decay":
            return 0.5 ** min(step // decay_every, decay_times)
        w = warm(step)
        if w is not None:
            return w
        s = step + 1
        if name == "noam":
            return math.sqrt(max(warmup_steps, 1) / s)
        progress = min(1.0, (s - warmup_steps) / max(1, max_steps - warmup_steps))
        if name == "warmup_cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(0.0, 1.0 - progress)

    return f
