"""IDC-PCL fine-tuning trains as the authors' ``clver/finetune.py`` trains.

The first half checks the loss reduction by hand: ``finetune.loss_reduction`` "sum" (the authors', the ``paper``
profile's: ``mlm_loss.sum() + itm_loss.sum()``, clver/finetune.py:156-157; ``loss.sum()``, bird/finetune.py:162)
against "mean" (the kit's cpu and smoke runs). The second half replays a recorded training trace of the authors'
code (tests/parity/pcl_clver_finetune_trace.pt, made by ``python -m idckit.authors record --idc CHECKOUT``) through
the kit's own loop (:func:`idckit.train.loop.fit`) and fine-tuning task at the ``paper`` settings.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ddp_worker as worker
from idckit.errors import ConfigError
from idckit.experiments.config import load_config
from idckit.tasks.pcl import FinetuneTask
from numeric import assert_close
from trace_replay import compare_final, recorded, replay

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


# -- the recorded trace ------------------------------------------------------------------------------------------
TRACE = Path(__file__).parent / "parity" / "pcl_clver_finetune_trace.pt"
RTOL = 1e-5


def _trace() -> dict:
    if not TRACE.is_file():
        pytest.fail(f"{TRACE} is missing: re-record with python -m idckit.authors record --idc CHECKOUT --out "
                    f"tests/parity/ (docs/parity.md)")
    return torch.load(TRACE, weights_only=True)


_Recorded = recorded(FinetuneTask)


def _kit_inputs(rec: dict):
    """(PCLData holding the recorded features, the recorded batches in the kit's ids, the kit's words)."""
    from idckit.text.pcl_inputs import PCLData, SplitData
    from idckit.authors import pcl as parity
    from idckit.text.vocab import Vocab

    _, words = parity.convert_state_dict(rec["init"], rec["vocab"])
    k_of_a = parity.kit_ids_of_authors(rec["vocab"])
    b = rec["batches"]
    steps, size, n, feat = b["img1"].shape
    pairs = steps * size
    features = torch.cat([b["img1"].flatten(0, 1), b["img2"].flatten(0, 1)]).half()
    assert torch.equal(features.float(), torch.cat([b["img1"].flatten(0, 1), b["img2"].flatten(0, 1)]))
    train = SplitData(pair_ids=[f"p{i}" for i in range(pairs)], types=["x"] * pairs, before=torch.arange(pairs),
                      after=torch.arange(pairs, 2 * pairs), is_change=b["diff_label"].flatten().bool(),
                      references={}, sample_pair=torch.arange(pairs), sample_ids=b["cap"].flatten(0, 1))
    data = PCLData(vocab=Vocab(words), features=features, splits={"train": train}, max_len=rec["max_len"])
    label = b["cap_label"]
    labels = torch.where(label == -1, torch.full_like(label, -100), k_of_a[label.clamp(min=0)])
    batches = [{"pairs": torch.arange(k * size, (k + 1) * size), "text": k_of_a[b["cap"][k]], "labels": labels[k]}
               for k in range(steps)]
    return data, batches, words


def test_the_trace_is_the_authors_at_their_commit():
    rec = _trace()
    assert rec["commit"].startswith("6f3aabf")
    assert rec["dropout"] == 0.0 and rec["config"] == {"lr": 3e-5, "weight_decay": 0.0, "total_train_steps": 100000}
    assert len(rec["steps"]["loss"]) >= 5
    assert TRACE.stat().st_size < 1_000_000


def test_the_paper_schedule_is_the_authors_over_the_whole_run():
    """No warm-up in their fine-tuning; the step decays at 10k and 20k lie past the trace, so their lr function's
    values are checked at every step where it changes (recorded numbers) against the kit's paper schedule."""
    from idckit.train.schedules import lr_factor

    rec = _trace()
    t = load_config("pcl", "paper")["finetune"]["train"]
    assert t["lr"] == rec["config"]["lr"]
    factor = lr_factor(t["schedule"], max_steps=t["max_steps"], warmup_steps=t.get("warmup_steps", 0),
                       decay_every=t["decay_every"], decay_times=t.get("decay_times", 2))
    kit = torch.tensor([t["lr"] * factor(int(s)) for s in rec["schedule"]["steps"]], dtype=torch.float64)
    assert_close(kit, rec["schedule"]["lr"], rtol=1e-12)


def test_the_kits_paper_fine_tuning_reproduces_the_authors_trace(tmp_path):
    """The recorded K steps through :func:`idckit.train.loop.fit` at the ``paper`` finetune settings (tiny sizes,
    dropout 0 as recorded): every step's loss terms, total, lr of each group and gradient norm, and the weights
    after the last step, to 1e-5 relative. The gradient norm and lr are read where the loop hands them to the
    optimiser (a step pre-hook), the losses from the loop's own log."""
    from idckit.authors import pcl as parity

    rec = _trace()
    data, batches, words = _kit_inputs(rec)
    sd, _ = parity.convert_state_dict(rec["init"], rec["vocab"])
    torch.save(sd, tmp_path / "init.pt")
    paper = load_config("pcl", "paper")
    ft, s = paper["finetune"], rec["sizes"]
    model = {**paper["model"], "d_model": s["d"], "n_heads": s["heads"], "d_ff": s["ff"], "n_layers": s["layers"],
             "single_layers": 1, "pair_layers": 1, "dropout": rec["dropout"]}
    settings = {k: ft[k] for k in ("mask_prob", "eos_prob", "distractor_weight", "eval_batch_size", "group_by_pair",
                                   "captions_per_pair", "targets", "tokenize", "loss_reduction")}
    # no val split here: selection_metric None keeps the last step's weights without decoding val
    task = _Recorded(data, batches, model=model, batch_size=len(batches[0]["pairs"]), selection_metric=None,
                     init_from=tmp_path / "init.pt", **settings)
    steps = len(batches)
    res, logged, seen = replay(task, ft["train"], steps, tmp_path)
    want = rec["steps"]
    for k in range(steps):
        for name in ("mlm", "judge", "loss"):
            assert_close(logged[k][name], want[name][k].item(), rtol=RTOL, what=f"step {k} {name}")
        assert_close(seen[k][0], want["lr"][k], rtol=1e-12, what=f"step {k} lr")
        assert_close(seen[k][1], want["grad_norm"][k], rtol=RTOL, what=f"step {k} gradient norm")
    moved = compare_final(rec, res.model, words, unused=())      # the judge reads their pooler here
    assert moved > len(rec["final"]) // 2          # the steps moved the weights, so the comparison says something
