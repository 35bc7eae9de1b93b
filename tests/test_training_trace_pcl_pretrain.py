"""IDC-PCL CLEVR pre-training trains as the authors' ``clver/pretrain.py`` trains.

``tests/parity/pcl_clver_pretrain_trace.pt`` (``python -m idckit.authors record --idc CHECKOUT``,
:func:`idckit.authors.pcl_pretrain_trace.record_clver_pretrain_trace`) holds optimiser steps of their pre-training:
their datasets, DataLoaders and ``MetaLoader`` made the batches and drew each step's task (MLM, MVCL, FDA), their
model, ``raw_loss.mean()``, ``torch.optim.Adam`` and ``get_lr_sched(..., pretrain=True)`` took the steps. The kit
replays the recorded batches (in its ids) through its own loop (:func:`idckit.train.loop.fit`) and
:class:`~idckit.tasks.pcl.PretrainTask` at the ``paper`` settings; the only seam is ``batches``.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idckit.authors import pcl as parity
from idckit.experiments.config import load_config
from idckit.tasks.pcl import PretrainTask
from idckit.train.schedules import lr_factor
from numeric import assert_close
from trace_replay import compare_final, kit_inputs, recorded, replay

TRACE = Path(__file__).parent / "parity" / "pcl_clver_pretrain_trace.pt"
RTOL = 1e-5
#: their task names -> the kit's
#: the CLEVR pre-training tasks (the authors' names -> the kit's)
TASKS = {"mlm": "mlm", "mvm_contrst": "mvcl", "fda": "fda"}


def _trace() -> dict:
    if not TRACE.is_file():
        pytest.fail(f"{TRACE} is missing: re-record with python -m idckit.authors record --idc CHECKOUT --out "
                    f"tests/parity/ (docs/parity.md)")
    return torch.load(TRACE, weights_only=True)


def test_the_trace_is_the_authors_at_their_commit():
    rec = _trace()
    assert rec["commit"].startswith("6f3aabf")
    assert rec["dropout"] == 0.0
    assert rec["config"] == {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 8000, "total_train_steps": 250000,
                             "ratios": {"mlm": 8, "mvm_contrst": 1, "fda": 2}, "tmp": 1.0}
    assert len(rec["tasks"]) >= 6 and all(rec["tasks"].count(t) >= 2 for t in TASKS)
    # the warm-up, its peak and the decay after it are inside the recorded steps
    assert len(rec["tasks"]) > rec["trace_warmup"] + 2
    assert TRACE.stat().st_size < 1_000_000


def _settings(paper: dict) -> dict:
    """The task's ``paper`` settings (those that draw batches have no say here: the recorded batches replace them)."""
    c = paper["pretrain"]
    return {k: c[k] for k in ("ratios", "mask_prob", "eos_prob", "region_prob", "tau_mvcl", "tau_fda",
                              "mask_random_from", "mask_none_chosen", "fda_samples", "sampling")}


def test_the_paper_task_pool_and_temperatures_are_the_authors():
    """Their ``MetaLoader`` fills its pool with each task ``r`` times in their config's task order and draws one
    task per step from it; the kit's pool at ``paper`` is the same list. (The draws themselves come from another
    generator: the trace fixes them.) FDA's temperature is their ``--tmp``."""
    rec = _trace()
    paper = load_config("pcl", "paper")
    task = _Recorded(*kit_inputs(rec)[:2], model=_model(paper, rec), batch_size=8, **_settings(paper))
    assert task.pool == [TASKS[t] for t in rec["pool"]]
    assert paper["pretrain"]["tau_fda"] == rec["config"]["tmp"]
    assert paper["pretrain"]["tau_mvcl"] == 1.0          # their nce_temp, hard-coded (modules_pretrain.py:26)


def test_the_paper_schedule_is_the_authors_over_the_whole_run():
    """Their lr function at their warm-up of 8000, at every step where it changes (the 1e-8 floor at step 0, the
    warm-up's start, peak and end, the decay, the last step), against the kit's ``paper`` pre-training schedule;
    the kit's cpu-era ``noam`` (the step counted from 1) is one step ahead of it."""
    rec = _trace()
    t = load_config("pcl", "paper")["pretrain"]["train"]
    # their loop updates at global_step 0 .. total_train_steps and then breaks (clver/pretrain.py:133,155,199-201)
    assert (t["lr"], t["warmup_steps"], t["max_steps"]) == (rec["config"]["lr"], rec["config"]["warmup_steps"],
                                                            rec["config"]["total_train_steps"] + 1)
    steps = [int(s) for s in rec["schedule"]["steps"]]
    factor = lr_factor(t["schedule"], max_steps=t["max_steps"], warmup_steps=t["warmup_steps"], lr=t["lr"])
    kit = torch.tensor([t["lr"] * factor(s) for s in steps], dtype=torch.float64)
    assert_close(kit, rec["schedule"]["lr"], rtol=1e-12)
    noam = lr_factor("noam", max_steps=t["max_steps"], warmup_steps=t["warmup_steps"])
    shifted = torch.tensor([t["lr"] * noam(s - 1) for s in steps[1:]], dtype=torch.float64)
    assert_close(shifted, rec["schedule"]["lr"][1:], rtol=1e-12)


def test_noam_public_needs_a_warm_up_and_the_lr():
    from idckit.errors import ConfigError

    for kw in ({"warmup_steps": 0, "lr": 1e-4}, {"warmup_steps": 4}):
        with pytest.raises(ConfigError, match="noam_public needs"):
            lr_factor("noam_public", max_steps=10, **kw)
    f = lr_factor("noam_public", max_steps=10, warmup_steps=4, lr=1e-3)
    assert_close([f(s) for s in range(6)], [1e-5, 0.25, 0.5, 0.75, 1.0, 2 / 5 ** 0.5], rtol=1e-12)


_Recorded = recorded(PretrainTask)


def _model(paper: dict, rec: dict) -> dict:
    s = rec["sizes"]
    return {**paper["model"], "d_model": s["d"], "n_heads": s["heads"], "d_ff": s["ff"], "n_layers": s["layers"],
            "single_layers": 1, "pair_layers": 1, "dropout": rec["dropout"]}


def test_the_kits_paper_pre_training_reproduces_the_authors_trace(tmp_path):
    """The recorded steps through :func:`idckit.train.loop.fit` at the ``paper`` pre-training settings (tiny
    sizes, dropout 0 and the trace's short warm-up, as recorded): every step's task, loss, lr of each group and
    gradient norm, and the weights after the last step, to 1e-5 relative. The gradient norm and lr are read where
    the loop hands them to the optimiser (a step pre-hook), the losses from the loop's own log."""
    rec = _trace()
    data, batches, words = kit_inputs(rec)
    sd, _ = parity.convert_state_dict(rec["init"], rec["vocab"])
    torch.save(sd, tmp_path / "init.pt")
    paper = load_config("pcl", "paper")
    task = _Recorded(data, batches, model=_model(paper, rec), batch_size=len(rec["batches"][0]["cap"]),
                     init_from=tmp_path / "init.pt", **_settings(paper))
    res, logged, seen = replay(task, paper["pretrain"]["train"], len(batches), tmp_path,
                               warmup_steps=rec["trace_warmup"])
    want = rec["steps"]
    for k, task_name in enumerate(rec["tasks"]):
        name = TASKS[task_name]
        assert set(logged[k]) == {"step", "lr", "loss", name}, f"step {k}"
        assert_close(logged[k]["loss"], want["loss"][k].item(), rtol=RTOL, what=f"step {k} {name} loss")
        assert_close(logged[k][name], want["loss"][k].item(), rtol=RTOL, what=f"step {k} {name} term")
        assert_close(seen[k][0], want["lr"][k], rtol=1e-12, what=f"step {k} lr")
        assert_close(seen[k][1], want["grad_norm"][k], rtol=RTOL, what=f"step {k} gradient norm")
    moved = compare_final(rec, res.model, words)
    assert moved > len(rec["final"]) // 2          # the steps moved the weights, so the comparison says something
