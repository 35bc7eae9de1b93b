"""Probes of the grid features themselves, before any model: what could a captioner read off them?

The difference probe: how separable are real changes from distractors?

A logistic regression on the sorted per-region distances between a pair's two images (plus their mean), trained
on train and scored on test. A low accuracy says the features (not the model) make distractor judging hard: the
distractors' viewpoint jitter moves every region about as much as a semantic change moves one. Neither paper does
this; it is an analysis of the data, used by IDC-PCL's table 4 notebook and the lab's scripts (lab/scripts/).

The change-type probe: for the real changes only, can a small classifier name the kind of change (colour, material,
add, drop, move) from the before and after features at the regions that changed most? A captioner that attends to
the change can do no better than what is there, so a low accuracy says the features lose what the captions name.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from idckit.errors import ConfigError


def difference_probe(data, *, radius: int = 0, steps: int = 500, seed: int = 0) -> dict[str, float]:
    """The probe's test accuracy (and its chance level) on ``data``, an :class:`idckit.text.pcl_inputs.PCLData`
    (:func:`idckit.experiments.pcl.loaded_data` of a setup).

    ``radius`` 0 compares each region with the same region of the other image, ``||f1_j - f2_j||``. A radius r > 0
    compares it with its best match among the other image's regions at most r grid cells away (both directions),
    which forgives the viewpoint shift the way an attention over neighbouring regions could.
    """
    n_regions = data.features.shape[1]
    side = int(round(n_regions ** 0.5))
    if radius and side * side != n_regions:
        raise ConfigError(f"radius {radius} needs a square grid; these features have {n_regions} regions")
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).view(-1, 2)
    far = torch.cdist(grid.float(), grid.float(), p=float("inf")) > radius       # [R, R] outside the window

    def xy(split):
        sp = data.splits[split]
        rows = []
        for lo in range(0, len(sp), 256):    # chunks keep memory flat on 14x14 grids
            f1, f2 = data.pair_features(split, torch.arange(lo, min(lo + 256, len(sp))))
            if radius == 0:
                d = (f1 - f2).norm(dim=-1)
            else:
                dist = torch.cdist(f1, f2).masked_fill(far, float("inf"))       # [n, before j, after k]
                d = torch.cat([dist.min(2).values, dist.min(1).values], 1)
            rows.append(torch.cat([d.sort(dim=1, descending=True).values, d.mean(1, keepdim=True)], 1))
        return torch.cat(rows), sp.is_change.float()

    (xtr, ytr), (xte, yte) = xy("train"), xy("test")
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    torch.manual_seed(seed)
    w = torch.zeros(xtr.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], 0.05)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits((xtr - mu) / sd @ w + b, ytr)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = float((((xte - mu) / sd @ w + b > 0).float() == yte).float().mean())
    return {"test_accuracy": acc, "chance": float(max(yte.mean(), 1 - yte.mean())), "radius": radius,
            "train_pairs": len(ytr),
            "max_region_distance_change": float(xtr[ytr == 1, 0].mean()),
            "max_region_distance_distractor": float(xtr[ytr == 0, 0].mean())}


def type_probe_inputs(f1, f2, k: int = 4):
    """[n, 2 * dim + min(8, regions)] probe inputs from before / after grid features [n, regions, dim]: the mean
    before and after features over the ``k`` regions whose features moved most, and the (at most eight) largest
    region distances, largest first."""
    d, top = _most_changed(f1, f2, k)
    top = top[..., None].expand(-1, -1, f1.shape[2])
    return torch.cat([f1.gather(1, top).mean(1), f2.gather(1, top).mean(1),
                      d.sort(1, descending=True).values[:, :8]], 1)


def _most_changed(f1, f2, k: int):
    """(distances [n, regions] between before and after, indices [n, k] of the ``k`` largest)."""
    d = (f2 - f1).norm(dim=-1)
    return d, d.topk(min(k, d.shape[1]), dim=1).indices


def fit_type_probe(x_train, types_train: list[str], x_test, types_test: list[str], *, hidden: int = 256,
                   steps: int = 600, seed: int = 0) -> dict:
    """A one-hidden-layer classifier (``hidden`` 0: multinomial logistic regression) from ``x_train`` to the change
    types, scored on ``x_test``: accuracy, chance (the most frequent test type) and accuracy per type."""
    names = sorted(set(types_train))
    unknown = sorted(set(types_test) - set(names))
    if unknown:
        raise ConfigError(f"test change types {unknown} never occur in train; known: {names}")
    ytr = torch.tensor([names.index(t) for t in types_train])
    yte = torch.tensor([names.index(t) for t in types_test])
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-6
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = (torch.nn.Linear(x_train.shape[1], len(names)) if not hidden else
           torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, len(names))))
    opt = torch.optim.Adam(net.parameters(), 1e-3, weight_decay=1e-4)
    x = (x_train - mu) / sd
    for _ in range(steps):
        b = torch.randint(0, len(x), (min(256, len(x)),), generator=g)
        loss = F.cross_entropy(net(x[b]), ytr[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = net((x_test - mu) / sd).argmax(1)
    return {"test_accuracy": float((pred == yte).float().mean()),
            "chance": float(torch.bincount(yte, minlength=len(names)).max()) / len(yte),
            "per_type": {n: float((pred[yte == i] == i).float().mean()) for i, n in enumerate(names)
                         if (yte == i).any()},
            "train_pairs": len(ytr), "test_pairs": len(yte)}


def change_type_probe(data, *, k: int = 4, hidden: int = 256, steps: int = 600, seed: int = 0,
                      max_pairs: int | None = None) -> dict:
    """The change-type probe on ``data`` (a :class:`idckit.text.pcl_inputs.PCLData`): its real changes of train
    (at most ``max_pairs``) against those of test."""
    def xy(split, limit):
        sp = data.splits[split]
        idx = torch.nonzero(sp.is_change).squeeze(1)[:limit]
        if not len(idx):
            raise ConfigError(f"the {split} split has no change pairs to probe")
        x = torch.cat([type_probe_inputs(*data.pair_features(split, idx[lo:lo + 256]), k=k)
                       for lo in range(0, len(idx), 256)])
        return x, [sp.types[i] for i in idx.tolist()]

    (xtr, ttr), (xte, tte) = xy("train", max_pairs), xy("test", None)
    return {**fit_type_probe(xtr, ttr, xte, tte, hidden=hidden, steps=steps, seed=seed), "k": k, "hidden": hidden}


def changed_regions(f1, f2, k: int = 4):
    """[B, regions] bool: the ``k`` regions of each pair whose features moved most between before and after."""
    d, top = _most_changed(f1.float(), f2.float(), k)
    return torch.zeros_like(d, dtype=torch.bool).scatter_(1, top, True)


def pcl_attention_on_change(model, f1, f2, text_ids, changed) -> dict:
    """Where an IDC-PCL's attention goes, for pairs ``f1``, ``f2`` [B, n, feat_dim], one caption each ``text_ids``
    [B, L] and their changed regions ``changed`` [B, n] (e.g. :func:`changed_regions`).

    The probabilities are recorded from the model's own ``forward_grouped(..., queries=True)`` in eval mode (the
    fine-tuning forward whose [MASK] query rows see what greedy decoding sees), by wrapping each attention's
    ``attend`` for the one call (the model's training mode is restored after); means are per head:

    - ``pair``, per pair-encoder layer: the probability an image-2 region puts on the image-1 region at the same
      grid position (``same_position``; uniform would be 1 / (2n + 2)), also over the changed regions alone;
    - ``cross``, per cross-modal layer, over the query rows whose target is a word or [EOS]: the share of attention
      on the visual tokens (``visual``), and of that visual share the part on the changed regions of both images
      (``changed_of_visual``; uniform would be ``changed_share``, their fraction of the visual tokens) and on
      [IMG1] / [IMG2] (``img_of_visual``).
    """
    pair_blocks = list(model.pair) if model.cfg.difference_encoder else []
    blocks = pair_blocks + list(model.cross)
    seen: dict[int, torch.Tensor] = {}      # each attention's first call: the pair layer's, a cross layer's text rows
    for blk in blocks:
        att = blk.attn

        def recording(q, k, v, mask=None, _att=att, _orig=att.attend):
            if id(_att) not in seen:
                a = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
                seen[id(_att)] = (a if mask is None else a.masked_fill(~mask, float("-inf"))).softmax(-1)
            return _orig(q, k, v, mask)

        att.attend = recording
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            model.forward_grouped(f1, f2, text_ids[:, None], queries=True)
    finally:
        model.train(was_training)
        for blk in blocks:
            del blk.attn.attend
    n, length = model.cfg.n_regions, text_ids.shape[1]
    nv = 2 * n + 2
    vis_changed = torch.zeros(len(changed), nv, dtype=torch.bool)
    vis_changed[:, 1:1 + n], vis_changed[:, 2 + n:] = changed, changed
    out = {"changed_share": float(vis_changed.float().sum(1).mean() / nv), "pair": [], "cross": []}
    for blk in pair_blocks:
        p = seen[id(blk.attn)]                                     # [B, h, nv, nv]
        same = torch.stack([p[:, :, n + 2 + i, 1 + i] for i in range(n)], -1)     # [B, h, n]
        ch = changed[:, None, :].float()
        out["pair"].append({"same_position": same.mean((0, 2)).tolist(),
                            "same_position_changed": ((same * ch).sum((0, 2)) / ch.sum((0, 2))).tolist(),
                            "uniform": 1 / nv})
    real = (text_ids[:, 1:] != model.pad_id).float()[:, None, :]  # query i predicts word i (or [EOS])
    for blk in model.cross:
        p = seen[id(blk.attn)][:, :, -(length - 1):]                # the text call; its last L-1 rows are queries
        vis = p[..., :nv].sum(-1)

        def mean(x):
            return ((x * real).sum((0, 2)) / real.sum((0, 2))).tolist()

        out["cross"].append({"visual": mean(vis),
                             "changed_of_visual": mean((p[..., :nv] * vis_changed[:, None, None]).sum(-1) / vis),
                             "img_of_visual": mean(p[..., [0, 1 + n]].sum(-1) / vis)})
    return out
