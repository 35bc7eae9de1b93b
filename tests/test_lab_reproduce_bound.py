"""lab/scripts/reproduce_bound.py: each lever scales its own jobs; dropped birds seeds cost nothing, seed 0 stays."""
import pytest

from lab.scripts.reproduce_bound import BIRDS_CUB, BIRDS_FINETUNE, BIRDS_PRETRAIN, scale


def test_each_family_scales_by_its_own_lever():
    out = scale({"train pcl/full seed 0": 1000.0, "train duda/duda seed 0": 300.0, "table2_clevr_change": 800.0,
                 "clip4idc_table7_layer_split": 2000.0, "prepare scenes clevr-change": 1000.0,
                 "table4_ablation": 28.0}, (0, 1, 2))
    assert out == {"train pcl/full seed 0": 900.0, "train duda/duda seed 0": 240.0, "table2_clevr_change": 400.0,
                   "clip4idc_table7_layer_split": 1000.0, "prepare scenes clevr-change": 800.0,
                   "table4_ablation": 28.0}


def test_a_birds_chain_keeps_what_is_not_training_and_speeds_up_the_rest():
    run = 800.0
    rest = run - BIRDS_FINETUNE - BIRDS_PRETRAIN          # evaluation, start-up: untouched
    out = scale({"train birds/b2w seed 1": run, "train birds/cub seed 1": run + BIRDS_CUB}, (0, 1), birds_steps=750)
    assert out["train birds/b2w seed 1"] == pytest.approx(rest + BIRDS_FINETUNE * 0.75 / 1.19 + BIRDS_PRETRAIN / 1.10,
                                                          abs=0.05)
    assert out["train birds/cub seed 1"] == pytest.approx(
        rest + BIRDS_FINETUNE * 0.75 / 1.19 + (BIRDS_PRETRAIN + BIRDS_CUB) / 1.10, abs=0.05)


def test_dropped_seeds_cost_nothing_but_seed_0_always_runs():
    out = scale({"train birds/b2w seed 0": 800.0, "train birds/b2w seed 2": 800.0}, (0,))
    assert out["train birds/b2w seed 2"] == 0.0
    assert out["train birds/b2w seed 0"] > 0
