"""The difference probe: how separable are real changes from distractors in the grid features themselves?

A logistic regression on the sorted per-region distances between a pair's two images (plus their mean), trained
on train and scored on test. A low accuracy says the features (not the model) make distractor judging hard: the
distractors' viewpoint jitter moves every region about as much as a semantic change moves one. Neither paper does
this; it is an analysis of the data, used by IDC-PCL's table 4 notebook and the learnability scripts.
"""
from __future__ import annotations

from idckit.errors import ConfigError


def difference_probe(data, *, radius: int = 0, steps: int = 500, seed: int = 0) -> dict[str, float]:
    """The probe's test accuracy (and its chance level) on ``data``, an :class:`idckit.tasks.pcl.PCLData`
    (:func:`idckit.experiments.pcl.loaded_data` of a setup).

    ``radius`` 0 compares each region with the same region of the other image, ``||f1_j - f2_j||``. A radius r > 0
    compares it with its best match among the other image's regions at most r grid cells away (both directions),
    which forgives the viewpoint shift the way an attention over neighbouring regions could.
    """
    import torch
    import torch.nn.functional as F

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
