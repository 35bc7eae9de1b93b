"""The kit's losses, as plain functions of tensors (formulas in the docstrings).

All of them compute in float32 whatever the input dtype (bf16 autocast feeds bf16 logits), and none of them
normalises by anything the caller cannot see: "mean" is over the terms named in each formula.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Token cross-entropy (masked LM, and teacher-forced captioning): the sum or mean, over the positions i with
    labels[i] != -100, of

        -log softmax(logits[i])[labels[i]]

    ``logits`` [.., V], ``labels`` [..] (the masked tokens' original ids, or a caption's next tokens, -100
    elsewhere: unmasked positions, padding). With no labelled position the loss is 0 (connected to the graph),
    not the NaN of an empty mean. IDC-PCL's pre-training averages (``raw_loss.mean()``); its fine-tuning sums
    (``reduction="sum"``); DUDA and CLIP4IDC's captioner average or sum over the caption words.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)
    if not bool((flat_labels != -100).any()):
        return flat_logits.sum() * 0.0
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction=reduction)


def _reduce(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return losses.mean() if reduction == "mean" else losses.sum()


def mvcl_logits(pred: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor, tau: float,
                in_batch_targets: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MVCL's scores and the column of each row's positive: (logits, labels).

    ``in_batch_targets=False`` (the paper's eq. 8): logits [M, 1 + N] = [cos(p_i, t_i) | cos(p_i, n)] / tau, label 0.
    ``in_batch_targets=True`` (the public code's ``mfm_nce``): logits [M, M + N] = [cos(p_i, t_j) | cos(p_i, n)] / tau,
    label i: every other masked region's original feature is a negative too (the public code passes the
    regression head's outputs at the unmasked positions as ``negatives``)."""
    if pred.shape != target.shape or pred.dim() != 2 or negatives.dim() != 2 or negatives.shape[1] != pred.shape[1]:
        raise ValueError(f"expected pred, target [M, F] and negatives [N, F], got {tuple(pred.shape)}, "
                         f"{tuple(target.shape)}, {tuple(negatives.shape)}")
    p, t = F.normalize(pred.float(), dim=-1), F.normalize(target.float(), dim=-1)
    neg = p @ F.normalize(negatives.float(), dim=-1).T                           # [M, N]
    if in_batch_targets:
        return torch.cat([p @ t.T, neg], dim=1) / tau, torch.arange(len(p), device=p.device)
    pos = (p * t).sum(-1, keepdim=True)                                          # [M, 1]
    return torch.cat([pos, neg], dim=1) / tau, torch.zeros(len(p), dtype=torch.long, device=p.device)


def mvcl_nce(pred: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor, tau: float,
             reduction: str = "mean", in_batch_targets: bool = False) -> torch.Tensor:
    """IDC-PCL's masked visual contrastive loss (paper eq. 8), mean (or sum) over the M masked regions:

        L = 1/M sum_i -log( exp(cos(p_i, t_i)/tau) / (exp(cos(p_i, t_i)/tau) + sum_n exp(cos(p_i, n)/tau)) )

    ``pred`` [M, F]: the regressed feature of each masked region; ``target`` [M, F]: its original feature before
    masking; ``negatives`` [N, F]: the paper's negatives, the unmasked image features in the batch. The public
    code's variant (``in_batch_targets=True``, negatives = the regression head's outputs at all unmasked
    positions) also counts every other masked region's original feature as a negative (:func:`mvcl_logits`).
    tau = 1 in the paper and the code.
    """
    logits, labels = mvcl_logits(pred, target, negatives, tau, in_batch_targets)
    return _reduce(F.cross_entropy(logits, labels, reduction="none"), reduction)


def fda_nce(pos: torch.Tensor, neg: torch.Tensor, tau: float, reduction: str = "mean") -> torch.Tensor:
    """FDA's contrastive loss (paper eq. 9), mean (or sum) over the B pairs:

        L = 1/B sum_b -log( exp(pos_b/tau) / (exp(pos_b/tau) + sum_k exp(neg_bk/tau)) )

    ``pos`` [B]: the score of the pair with its true caption; ``neg`` [B, K]: with its K hard negatives (the
    scores are cosines, ``PCL.fda_similarity``).
    """
    if pos.dim() != 1 or neg.dim() != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"expected pos [B] and neg [B, K], got {tuple(pos.shape)} and {tuple(neg.shape)}")
    logits = torch.cat([pos[:, None], neg], dim=1).float() / tau
    return _reduce(F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=pos.device),
                                   reduction="none"), reduction)


def clip_logits(text: torch.Tensor, image: torch.Tensor, logit_scale: torch.Tensor,
                gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """CLIP's score matrix [B_text, B_image] = exp(logit_scale) * cos(text_i, image_j), the input of
    :func:`symmetric_infonce` (CLIP pre-training, CLIP4IDC's adaptation on pair vectors).

    ``gather`` (e.g. :func:`idckit.train.distributed.gather_with_grad`) is applied to the unit vectors, so under
    torchrun the scores cover the rows of every rank."""
    text, image = F.normalize(text, dim=-1), F.normalize(image, dim=-1)
    if gather is not None:
        text, image = gather(text), gather(image)
    return logit_scale.exp() * text @ image.t()


def symmetric_infonce(logits: torch.Tensor) -> torch.Tensor:
    """CLIP's (and CLIP4IDC's retrieval) loss on a [B, B] score matrix whose diagonal holds the matching pairs:

        L = 1/2 ( 1/B sum_i -log softmax(logits[i, :])[i]  +  1/B sum_j -log softmax(logits[:, j])[j] )

    (any temperature is already applied to ``logits``).
    """
    if logits.dim() != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"expected a square [B, B] score matrix, got {tuple(logits.shape)}")
    target = torch.arange(len(logits), device=logits.device)
    return 0.5 * (F.cross_entropy(logits.float(), target) + F.cross_entropy(logits.float().T, target))


def judge_loss(logits: torch.Tensor, is_change: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """IDC-PCL's distractor-judging loss, the mean (or sum) over the B pairs of -log softmax(logits[b])[is_change[b]],
    with ``logits`` [B, 2] (class 1 = a real change, 0 = a distractor) and ``is_change`` [B] bool or 0/1."""
    if logits.dim() != 2 or logits.shape[1] != 2 or is_change.shape != logits.shape[:1]:
        raise ValueError(f"expected logits [B, 2] and is_change [B], got {tuple(logits.shape)} and "
                         f"{tuple(is_change.shape)}")
    return F.cross_entropy(logits.float(), is_change.long(), reduction=reduction)


def attention_mass(att_before: torch.Tensor, att_after: torch.Tensor) -> torch.Tensor:
    """DUDA's attention penalty (RCC's ``train.py``), the mean over the B pairs of the two maps' average mass

        1/B sum_b 0.5 (sum_n a_bef[b, n] + sum_n a_aft[b, n])

    with ``att_before``, ``att_after`` [B, N] (sigmoid gates, so the mass is not fixed at 1). The caller weights it
    and picks the pairs it applies to (the public code: change pairs only)."""
    if att_before.dim() != 2 or att_before.shape != att_after.shape:
        raise ValueError(f"expected two [B, N] attention maps, got {tuple(att_before.shape)} and "
                         f"{tuple(att_after.shape)}")
    return 0.5 * (att_before.float().sum(1) + att_after.float().sum(1)).mean()


def class_contrastive(z: torch.Tensor, labels: torch.Tensor, margin: float = 0.4) -> torch.Tensor:
    """The FGVC stage's in-batch contrastive loss over N image vectors (the public code's ``con_loss``):

        L = 1/N^2 sum_{i,j} [ y_i = y_j ] (1 - cos(z_i, z_j)) + [ y_i != y_j ] max(0, cos(z_i, z_j) - margin)

    same-class vectors are pulled to cosine 1, others pushed below ``margin`` (the diagonal adds 0).
    ``z`` [N, d], ``labels`` [N]."""
    if z.dim() != 2 or labels.shape != z.shape[:1]:
        raise ValueError(f"expected z [N, d] and labels [N], got {tuple(z.shape)} and {tuple(labels.shape)}")
    zn = F.normalize(z.float(), dim=-1)
    cos = zn @ zn.T
    same = labels[:, None] == labels[None, :]
    terms = torch.where(same, 1 - cos, (cos - margin).clamp(min=0))
    return terms.sum() / len(z) ** 2


def fgvc_loss(class_logits: torch.Tensor, match_logits: torch.Tensor, features: torch.Tensor,
              labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The FGVC stage's objective on N image pairs (the public code's ``nabirds_forward``), summed unweighted:

        L = CE(class_logits, labels) + CE(match_logits, [labels[:, 0] == labels[:, 1]]) + class_contrastive

    each cross-entropy the mean over its terms (2N images, N pairs); ``class_logits`` [N, 2, C], ``match_logits``
    [N, 2] (class 1 = same class), ``features`` [N, 2, d] (each image alone), ``labels`` [N, 2]. Returns
    (L, its three terms)."""
    if class_logits.shape[:2] != labels.shape or match_logits.shape != (len(labels), 2) or \
            features.shape[:2] != labels.shape:
        raise ValueError(f"expected class_logits [N, 2, C], match_logits [N, 2], features [N, 2, d] and labels "
                         f"[N, 2], got {tuple(class_logits.shape)}, {tuple(match_logits.shape)}, "
                         f"{tuple(features.shape)} and {tuple(labels.shape)}")
    parts = {"fgvc_class": F.cross_entropy(class_logits.flatten(0, 1).float(), labels.flatten()),
             "fgvc_match": F.cross_entropy(match_logits.float(), (labels[:, 0] == labels[:, 1]).long()),
             "fgvc_contrast": class_contrastive(features.flatten(0, 1), labels.flatten())}
    return parts["fgvc_class"] + parts["fgvc_match"] + parts["fgvc_contrast"], parts
