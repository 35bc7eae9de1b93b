"""The kit's losses, as plain functions of tensors (formulas in the docstrings)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over positions whose label is not -100 (the masked tokens)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100,
                           reduction=reduction)


def mvcl_nce(pred: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """IDC-PCL's masked visual contrastive loss, mean over the M masked regions:

    -log( exp(cos(p_i, t_i)/tau) / (exp(cos(p_i, t_i)/tau) + sum_n exp(cos(p_i, n)/tau)) )

    ``pred``/``target`` [M, F]: the regressed feature and the original feature of each masked region;
    ``negatives`` [N, F]: the unmasked image features of the batch (the paper's in-batch negatives).
    """
    p = F.normalize(pred.float(), dim=-1)
    pos = (p * F.normalize(target.float(), dim=-1)).sum(-1, keepdim=True)       # [M, 1]
    neg = p @ F.normalize(negatives.float(), dim=-1).T                           # [M, N]
    logits = torch.cat([pos, neg], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(p), dtype=torch.long, device=p.device))


def fda_nce(pos: torch.Tensor, neg: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """FDA: -log softmax([pos, neg_1..neg_K] / tau)[0], mean over pairs. ``pos`` [B], ``neg`` [B, K]."""
    logits = torch.cat([pos[:, None], neg], dim=1).float() / tau
    return F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=pos.device))


def symmetric_infonce(logits: torch.Tensor) -> torch.Tensor:
    """CLIP's loss: the mean of the row-wise and column-wise cross-entropies with the diagonal as targets."""
    target = torch.arange(len(logits), device=logits.device)
    return 0.5 * (F.cross_entropy(logits.float(), target) + F.cross_entropy(logits.float().T, target))
