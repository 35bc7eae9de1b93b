"""The difference probe (idckit.eval.probe) on hand-made features whose answer is known."""
from __future__ import annotations

import pytest
import torch

from idckit.errors import ConfigError
from idckit.eval.probe import difference_probe
from idckit.tasks.pcl import PCLData, SplitData
from idckit.text.vocab import Vocab


def _data(n_regions: int = 9, dim: int = 4, shift: float = 5.0) -> PCLData:
    """Eight before-images, each with a change pair (one region moved by ``shift`` in every dimension, so its
    distance is shift * sqrt(dim)) and a distractor pair (every region jittered by 0.01); four train, four test."""
    g = torch.Generator().manual_seed(0)
    feats = []
    for i in range(8):
        base = torch.randn(n_regions, dim, generator=g)
        changed = base.clone()
        changed[i % n_regions] += shift
        feats += [base, changed, base + 0.01 * torch.randn(n_regions, dim, generator=g)]

    def split(indices):
        before = [3 * i for i in indices for _ in (0, 1)]
        after = [3 * i + k for i in indices for k in (1, 2)]
        types = ["move", "distractor"] * len(indices)
        return SplitData(pair_ids=[f"{a}" for a in after], types=types, before=torch.tensor(before),
                         after=torch.tensor(after), is_change=torch.tensor([t == "move" for t in types]),
                         references={}, sample_pair=torch.zeros(0, dtype=torch.long),
                         sample_ids=torch.zeros(0, 4, dtype=torch.long))

    return PCLData(vocab=Vocab.build(["no change"]), features=torch.stack(feats).half(), max_len=4,
                   splits={"train": split(range(4)), "test": split(range(4, 8))})


def test_probe_separates_a_one_region_change_from_jitter_and_reports_the_distances():
    res = difference_probe(_data(), steps=200)
    assert res["test_accuracy"] == 1.0 and res["chance"] == 0.5 and res["train_pairs"] == 8
    assert res["max_region_distance_change"] == pytest.approx(5.0 * 4 ** 0.5, rel=1e-2)    # float16 features
    assert res["max_region_distance_distractor"] < 0.1
    assert difference_probe(_data(), steps=200) == res                                      # seeded: deterministic


def test_probe_radius_needs_a_square_grid():
    assert difference_probe(_data(), radius=1, steps=50)["radius"] == 1
    with pytest.raises(ConfigError, match="radius 1 needs a square grid; these features have 8 regions"):
        difference_probe(_data(n_regions=8), radius=1)
    assert difference_probe(_data(n_regions=8), steps=50)["radius"] == 0      # radius 0 compares region by region
