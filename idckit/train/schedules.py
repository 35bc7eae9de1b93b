"""Learning-rate schedules as multipliers of the base lr, one function of the step each.

- ``noam``: IDC-PCL pre-training (public ``utils.py``): linear warm-up to lr, then lr * sqrt(warmup / step), the
  kit's reading: the step counted from 1, so the first step's lr is lr / warmup and the peak comes a step early.
- ``noam_public``: the same formula as the authors' ``utils.get_lr_sched(global_step, args, pretrain=True)``
  computes it (``clver/utils.py:149-153,188-197``, ``bird/utils.py:151-155,174-183``): the step counted from 0,
  lr * step / warmup up to and including step ``warmup``, then lr * sqrt(warmup / step), and an lr of 1e-8 at
  step 0, where the formula gives 0 (their floor, :data:`PUBLIC_NOAM_FLOOR`; it needs the base lr).
- ``step_decay``: IDC-PCL fine-tuning: lr, then halved every ``decay_every`` steps, at most ``decay_times``
  times (the public code: lr until 10k, lr/2 until 20k, lr/4 after).
- ``warmup_cosine`` / ``warmup_linear``: CLIP4IDC (CLIP4Clip's BertAdam warm-up, then cosine or linear decay),
  the kit's reading: the step counted from 1 and the cosine spread over the steps after the warm-up.
- ``warmup_cosine_bert`` / ``warmup_linear_bert``: the same two as BERT's optimiser computes them inside its step
  (CLIP4IDC's ``modules/optimization.py:26-29`` and ``:38-43``), on the raw fraction x = step / max_steps with the
  step counted from 0 (so the first step's lr is 0) and w = warmup_steps / max_steps: x / w during the warm-up,
  then 0.5 (1 + cos(pi x)) (not re-spread over the rest: 0.976 at x = 0.1, 0.5 at mid-run) or (1 - x) / (1 - w).
  The warm-up is a whole number of steps here where theirs is w = 0.1 of their step count; for a count not a
  multiple of 10 the two differ by under half a step.
"""
from __future__ import annotations

import math
from typing import Callable

from idckit.errors import ConfigError

SCHEDULES = ("constant", "noam", "noam_public", "step_decay", "warmup_cosine", "warmup_linear", "warmup_cosine_bert",
             "warmup_linear_bert")

#: the lr ``noam_public`` gives step 0 (the authors' ``if lr_this_step <= 0: lr_this_step = 1e-8``)
PUBLIC_NOAM_FLOOR = 1e-8


def lr_factor(name: str, *, max_steps: int, warmup_steps: int = 0, decay_every: int = 0,
              decay_times: int = 2, lr: float | None = None) -> Callable[[int], float]:
    """``f(step)``: the multiplier of the base lr for the optimiser step ``step`` (0-based). ``lr``: the base lr,
    which only ``noam_public`` reads (its floor is an lr, not a multiplier)."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if name == "step_decay" and decay_every <= 0:
        raise ConfigError("schedule step_decay needs decay_every > 0")
    if name == "noam_public":
        if warmup_steps < 1 or lr is None or lr <= 0:
            raise ConfigError(f"schedule noam_public needs warmup_steps >= 1 and the base lr > 0, got "
                              f"{warmup_steps} and {lr}")

        def public(step: int) -> float:
            f = step / warmup_steps if step <= warmup_steps else (warmup_steps ** 0.5) * (step ** -0.5)
            return f if f > 0 else PUBLIC_NOAM_FLOOR / lr

        return public

    def warm(step: int) -> float | None:
        s = step + 1
        return s / warmup_steps if s < warmup_steps else None

    def bert(step: int) -> float:
        x, w = step / max_steps, warmup_steps / max_steps
        if x < w:
            return x / w
        if name == "warmup_cosine_bert":
            return 0.5 * (1.0 + math.cos(math.pi * x))
        return max((x - 1.0) / (w - 1.0), 0.0)

    if name.endswith("_bert"):
        if max_steps <= 0 or not 0 <= warmup_steps < max_steps:
            raise ConfigError(f"schedule {name} needs max_steps > 0 and 0 <= warmup_steps < max_steps, got "
                              f"{max_steps} and {warmup_steps}")
        return bert

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
