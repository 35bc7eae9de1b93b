"""The difference probe (idckit.eval.probe) on hand-made features whose answer is known."""
from __future__ import annotations

import pytest
import torch

from idckit.errors import ConfigError
from idckit.eval.probe import difference_probe
from idckit.text.pcl_inputs import PCLData, SplitData
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


def _typed_features(n: int, informative: bool, seed: int):
    """Before / after grids [n, 9, 6] whose one changed region moves along a direction that names the pair's type
    (``informative``) or along a random one; the changed region is random, so only the features can tell."""
    g = torch.Generator().manual_seed(seed)
    types = ["add", "color", "drop", "material", "move"]
    f1 = torch.randn(n, 9, 6, generator=g)
    f2 = f1.clone()
    labels = [types[i % 5] for i in range(n)]
    for i in range(n):
        region = int(torch.randint(0, 9, (1,), generator=g))
        kind = i % 5 if informative else int(torch.randint(0, 5, (1,), generator=g))
        f2[i, region, kind] += 6.0
    return f1, f2, labels


def test_type_probe_names_the_change_where_the_features_hold_it_and_not_otherwise():
    from idckit.eval.probe import fit_type_probe, type_probe_inputs

    def score(informative):
        tr, te = _typed_features(400, informative, 0), _typed_features(200, informative, 1)
        return fit_type_probe(type_probe_inputs(tr[0], tr[1], k=1), tr[2],
                              type_probe_inputs(te[0], te[1], k=1), te[2], steps=300)

    good, blind = score(True), score(False)
    assert good["test_accuracy"] >= 0.95 and set(good["per_type"]) == {"add", "color", "drop", "material", "move"}
    assert good["chance"] == 0.2 and good["train_pairs"] == 400 and good["test_pairs"] == 200
    assert blind["test_accuracy"] < 0.4                     # chance is 0.2: nothing to read off
    assert score(True) == good                              # seeded: deterministic


def test_type_probe_inputs_take_the_most_changed_regions():
    from idckit.eval.probe import type_probe_inputs

    f1 = torch.zeros(1, 4, 2)
    f2 = f1.clone()
    f2[0, 2] = torch.tensor([3.0, 4.0])                    # distance 5, the only change
    x = type_probe_inputs(f1, f2, k=1)
    assert x.shape == (1, 2 + 2 + 4)                       # four regions: four distances, largest first
    assert torch.equal(x[0], torch.tensor([0.0, 0.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0]))


def test_change_type_probe_reads_a_pcl_datas_change_pairs_and_refuses_unknown_test_types():
    from idckit.eval.probe import change_type_probe, fit_type_probe

    res = change_type_probe(_data(), k=1, steps=50)
    assert res["train_pairs"] == 4 and res["test_pairs"] == 4 and res["per_type"] == {"move": 1.0}
    with pytest.raises(ConfigError, match="never occur in train"):
        fit_type_probe(torch.zeros(2, 3), ["add", "add"], torch.zeros(1, 3), ["move"])
