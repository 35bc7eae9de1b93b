"""Optimiser pieces the loop builds besides torch's Adam and AdamW.

:class:`BertAdam` is the Adam variant of BERT's reference code, which CLIP4Clip and CLIP4IDC train with
(``train.optimizer = "bertadam"``). Per parameter, with gradient g, moments m and v (both start at 0), step
size lr (the group's, already scheduled) and weight decay wd:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    p <- p - lr (m / (sqrt(v) + eps) + wd p)

Two differences from torch's AdamW: the moments are used without bias correction (the first update is
m/sqrt(v) = (1-b1)/sqrt(1-b2) in units of g's sign: 0.71 at b2 0.98, 3.2 at b2 0.999, not 1), and eps is added
to sqrt(v) of the raw moment. The weight decay is decoupled and scaled by the lr exactly as AdamW's. The step
counts from 0, so a schedule multiplies the lr before the step (the loop's LambdaLR does).

:func:`clip_per_tensor` clips every gradient tensor to a norm on its own, the same coefficient as
``torch.nn.utils.clip_grad_norm_`` applied to one tensor (``max_norm / (norm + 1e-6)``, capped at 1); BERT's
optimiser does this inside its step, after the script's global clip (``train.grad_clip_per_tensor``).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

#: the coefficient's guard, as torch.nn.utils.clip_grad_norm_'s
_CLIP_EPS = 1e-6


class BertAdam(torch.optim.Optimizer):
    """Adam without bias correction and with decoupled weight decay (module doc). ``bias_correction=True``
    gives torch's AdamW update (a check of the implementation, not a setting of any run)."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, bias_correction: bool = False):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"BertAdam needs lr, eps, weight_decay >= 0 and betas in [0, 1), got lr={lr}, "
                             f"eps={eps}, weight_decay={weight_decay}, betas={betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("BertAdam does not take sparse gradients")
                state = self.state[p]
                if not state:
                    # a tensor step (not an int) keeps the state_dict loadable into torch's own optimisers' tools
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                g = p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                if group["bias_correction"]:
                    t = float(state["step"])
                    update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
                else:
                    update = m / (v.sqrt() + eps)
                if wd > 0:
                    update.add_(p, alpha=wd)
                p.add_(update, alpha=-lr)
        return loss


@torch.no_grad()
def clip_per_tensor(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> None:
    """Scale each gradient tensor to norm at most ``max_norm``, each on its own (module doc)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])
    coefs = (max_norm / (norms + _CLIP_EPS)).clamp(max=1.0)
    for g, c in zip(grads, coefs):
        g.mul_(c.to(g.dtype))
