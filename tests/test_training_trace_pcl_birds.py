"""IDC-PCL's three ``bird/`` stages train as the authors' scripts train them.

``tests/parity/pcl_bird_{gic,fgvc,finetune}_trace.pt`` (``python -m idckit.authors record --idc CHECKOUT``,
:func:`idckit.authors.pcl_bird_traces.record_bird_traces`) hold optimiser steps of their GIC stage
(``bird/pretrain_cub.py``), their Birds-to-Words + NABirds pre-training (``bird/pretrain.py``) and their paragraph
fine-tuning (``bird/finetune.py``): their datasets, DataLoaders and ``MetaLoader`` made the batches and drew each
step's task, their models, loss reductions, ``torch.optim.Adam`` and ``get_lr_sched`` took the steps, and each stage
started from the one before's last weights through their restore code. The kit replays the recorded batches (in its
ids) through its own loop (:func:`idckit.train.loop.fit`) and :class:`~idckit.tasks.pcl.PretrainTask` /
:class:`~idckit.tasks.pcl.FinetuneTask` at the ``pcl_birds`` ``paper`` settings; the only seam is ``batches``.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idckit.authors import pcl as parity
from idckit.experiments.config import load_config
from idckit.tasks.pcl import FinetuneTask, PretrainTask
from idckit.train.schedules import lr_factor
from numeric import assert_close
from trace_replay import PRETRAIN_TASKS, compare_final, kit_inputs, recorded, replay

PARITY = Path(__file__).parent / "parity"
RTOL = 1e-5
#: the FGVC loss's three terms, which NABirds' steps log
FGVC_TERMS = ("fgvc_class", "fgvc_match", "fgvc_contrast")
#: the kit config section of each stage
SECTION = {"gic": "gic", "fgvc": "pretrain", "finetune": "finetune"}


def _trace(stage: str) -> dict:
    path = PARITY / f"pcl_bird_{stage}_trace.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with python -m idckit.authors record --idc CHECKOUT --out "
                    f"tests/parity/ (docs/parity.md)")
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def paper() -> dict:
    return load_config("pcl_birds", "paper")


@pytest.mark.parametrize("stage", ["gic", "fgvc", "finetune"])
def test_the_trace_is_the_authors_at_their_commit(stage):
    rec = _trace(stage)
    assert rec["commit"].startswith("6f3aabf") and rec["stage"] == stage and rec["dropout"] == 0.0
    config = {"gic": {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 4000, "total_train_steps": 60000},
              "fgvc": {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 4000, "total_train_steps": 60000},
              "finetune": {"lr": 3e-5, "weight_decay": 1e-4, "warmup_steps": 4000, "total_train_steps": 20000}}
    assert {k: rec["config"][k] for k in config[stage]} == config[stage]
    assert len(rec["steps"]["loss"]) >= 5
    if stage != "finetune":
        # every task of the stage, and the warm-up's first step (lr 1e-8), its peak and its decay, in the steps
        assert set(rec["tasks"]) == set(rec["pool"])
        assert len(rec["tasks"]) > rec["trace_warmup_steps"] + 2
    assert (PARITY / f"pcl_bird_{stage}_trace.pt").stat().st_size < 1_000_000


def _kit_ratios(paper: dict, stage: str) -> dict:
    c = paper[SECTION[stage]]
    return {**c["ratios"], "fgvc": c["fgvc_ratio"]} if stage == "fgvc" else dict(c["ratios"])


@pytest.mark.parametrize("stage", ["gic", "fgvc"])
def test_the_paper_task_pool_is_the_authors(stage, paper):
    """Their ``MetaLoader`` fills its pool with each task ``r`` times in their config's task order and draws one
    task per step from it; the kit's pool at ``paper`` is the same list (the FGVC stage's NABirds task added as
    :func:`idckit.experiments.birds._pretrain_run` adds it). The draws come from another generator: the trace fixes
    them."""
    rec = _trace(stage)
    data, batches, _ = kit_inputs(rec)
    task = _Recorded(data, batches, **_pretrain_settings(paper, rec, stage))
    assert task.pool == [PRETRAIN_TASKS[t] for t in rec["pool"]]


@pytest.mark.parametrize("stage", ["gic", "fgvc", "finetune"])
def test_the_paper_schedule_and_steps_are_the_authors_over_the_whole_run(stage, paper):
    """Their lr function at their configs' settings at every step where it changes (pre-training: the 1e-8 floor
    at step 0, the warm-up's rise, peak and end, the decay, the last steps; fine-tuning: the halvings at 10k and
    20k) against the kit's ``paper`` schedule. Their pre-training loops update at ``global_step`` 0 .. total
    (``if global_step >= args.total_train_steps: break`` after the step, bird/pretrain_cub.py:224-226,
    bird/pretrain.py:241-243), one update more than ``total_train_steps``: the kit's ``max_steps``."""
    rec = _trace(stage)
    t = paper[SECTION[stage]]["train"]
    assert (t["lr"], t.get("weight_decay", 0.0)) == (rec["config"]["lr"], rec["config"]["weight_decay"])
    if stage != "finetune":
        assert t["warmup_steps"] == rec["config"]["warmup_steps"]
        assert t["max_steps"] == rec["config"]["total_train_steps"] + 1
    factor = lr_factor(t["schedule"], max_steps=t["max_steps"], warmup_steps=t.get("warmup_steps", 0),
                       decay_every=t.get("decay_every", 0), decay_times=t.get("decay_times", 2), lr=t["lr"])
    kit = torch.tensor([t["lr"] * factor(int(s)) for s in rec["schedule"]["steps"]], dtype=torch.float64)
    assert_close(kit, rec["schedule"]["lr"], rtol=1e-12)
    if stage != "finetune":
        # what the trace found: the kit's `noam` (cpu and smoke keep it) counts the step from 1, a step ahead of
        # theirs and without their 1e-8 first step
        assert {load_config("pcl_birds", p)[SECTION[stage]]["train"]["schedule"] for p in ("cpu", "smoke")} == {"noam"}
        noam = lr_factor("noam", max_steps=t["max_steps"], warmup_steps=t["warmup_steps"])
        steps = [int(s) for s in rec["schedule"]["steps"]]
        assert steps[0] == 0 and t["lr"] * noam(0) == t["lr"] / t["warmup_steps"] != rec["schedule"]["lr"][0]
        ahead = torch.tensor([t["lr"] * noam(s - 1) for s in steps[1:]], dtype=torch.float64)
        assert_close(ahead, rec["schedule"]["lr"][1:], rtol=1e-12)


# -- the kit's inputs ----------------------------------------------------------------------------------------------
_Recorded, _RecordedFinetune = recorded(PretrainTask), recorded(FinetuneTask)


def _model(paper: dict, rec: dict) -> dict:
    s = rec["sizes"]
    out = {**paper["model"], "d_model": s["d"], "n_heads": s["heads"], "d_ff": s["ff"], "n_layers": s["layers"],
           "single_layers": 1, "pair_layers": 1, "dropout": rec["dropout"]}
    if rec["stage"] == "fgvc":
        out["n_classes"] = rec["n_classes"]        # as experiments.birds._pretrain sets it from the FGVC data
    return out


def _pretrain_settings(paper: dict, rec: dict, stage: str) -> dict:
    c = paper[SECTION[stage]]
    # every setting experiments.birds._pretrain passes (those that draw batches have no say here: the recorded
    # batches replace them)
    return {"model": _model(paper, rec), "batch_size": rec["batch"], "ratios": _kit_ratios(paper, stage),
            **{k: c[k] for k in ("mask_prob", "eos_prob", "region_prob", "tau_mvcl", "tau_fda", "mask_random_from",
                                 "mask_none_chosen", "fda_samples", "sampling")}}


def _finetune_settings(paper: dict, rec: dict) -> dict:
    ft = paper["finetune"]
    return {"model": _model(paper, rec), "batch_size": rec["batch"], "selection_metric": None,
            **{k: ft[k] for k in ("mask_prob", "eos_prob", "distractor_weight", "eval_batch_size", "group_by_pair",
                                  "captions_per_pair", "targets", "tokenize", "loss_reduction", "decode_min_words",
                                  "mask_random_from", "mask_none_chosen")}}


def _task(paper: dict, rec: dict, init_from: Path):
    data, batches, words = kit_inputs(rec)
    if rec["stage"] == "finetune":
        task = _RecordedFinetune(data, batches, init_from=init_from, **_finetune_settings(paper, rec))
    else:
        task = _Recorded(data, batches, init_from=init_from, **_pretrain_settings(paper, rec, rec["stage"]))
    return task, words


def _saved(tmp_path: Path, name: str, authors_sd: dict, vocab: dict) -> Path:
    sd, _ = parity.convert_state_dict(authors_sd, vocab)
    torch.save(sd, tmp_path / name)
    return tmp_path / name


# -- the stages hand their weights on as theirs do -----------------------------------------------------------------
@pytest.mark.parametrize("stage,before", [("fgvc", "gic"), ("finetune", "fgvc")])
def test_each_stage_starts_from_the_stage_before_as_theirs_does(stage, before, paper, tmp_path):
    """Their restore (bird/pretrain.py:151-158, bird/finetune.py:127-134) takes every key of the previous stage's
    checkpoint the model has and leaves the rest at their initialisation; the kit's ``init_from`` (the previous
    run's best.pt, :func:`idckit.experiments.birds._pretrain` / ``_finetune``) builds the same model: every
    restored weight equal, and the same heads left fresh (the FGVC classifier and matcher; nothing in
    fine-tuning)."""
    rec, prev = _trace(stage), _trace(before)
    task, words = _task(paper, rec, _saved(tmp_path, "prev.pt", prev["final"], prev["vocab"]))
    model = task.build_model()
    got, _ = parity.authors_state_dict_of_kit(model.state_dict(), words, rec["vocab"])
    fresh = sorted(set(rec["init"]) - set(rec["restored"]))
    assert fresh == (["aligner.0.bias", "aligner.0.weight", "classifier.0.bias", "classifier.0.weight"]
                     if stage == "fgvc" else [])
    compared = 0
    for key in rec["restored"]:
        if key == "position_encoding.pe" or key.startswith("pooler."):   # a buffer; their ITM head, the kit has none
            continue
        value, mine = rec["init"][key], got[key]
        if key == "position_encoding.type_pe.weight":    # their row 0 is never used (the kit has no such row)
            value, mine = value[1:], mine[1:]
        assert torch.equal(mine, value), key          # copied, not recomputed: bit for bit
        compared += 1
    assert compared >= len(rec["restored"]) - 3
    for key in fresh:                                  # the kit's own initialisation, not the previous stage's
        assert key not in prev["final"]


# -- the recorded steps through the kit's loop ---------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["gic", "fgvc"])
def test_the_kits_paper_pre_training_reproduces_the_authors_trace(stage, paper, tmp_path):
    """The recorded steps of a pre-training stage through :func:`idckit.train.loop.fit` at the ``paper`` settings
    (tiny sizes, dropout 0 and the trace's short warm-up, as recorded): every step's task, loss (and the FGVC
    loss's three terms), lr of each group and gradient norm, and the weights after the last step, to 1e-5
    relative. The gradient norm and lr are read where the loop hands them to the optimiser (a step pre-hook), the
    losses from the loop's own log."""
    rec = _trace(stage)
    task, words = _task(paper, rec, _saved(tmp_path, "init.pt", rec["init"], rec["vocab"]))
    block = {**paper[SECTION[stage]]["train"], "warmup_steps": rec["trace_warmup_steps"]}
    res, logged, seen = replay(task, block, len(rec["tasks"]), tmp_path)
    want = rec["steps"]
    for k, name in enumerate(PRETRAIN_TASKS[t] for t in rec["tasks"]):
        terms = FGVC_TERMS if name == "fgvc" else (name,)
        assert set(logged[k]) == {"step", "lr", "loss", *terms}, f"step {k}"
        assert_close(logged[k]["loss"], want["loss"][k].item(), rtol=RTOL, what=f"step {k} {name} loss")
        for term in terms:
            expected = want[term][k].item() if name == "fgvc" else want["loss"][k].item()
            assert_close(logged[k][term], expected, rtol=RTOL, what=f"step {k} {term}")
        assert_close(seen[k][0], want["lr"][k], rtol=1e-12, what=f"step {k} lr")
        assert_close(seen[k][1], want["grad_norm"][k], rtol=RTOL, what=f"step {k} gradient norm")
    assert compare_final(rec, res.model, words) > len(rec["final"]) // 2   # the steps moved the weights


def test_the_kits_paper_fine_tuning_reproduces_the_authors_trace(paper, tmp_path):
    """The recorded fine-tuning steps through the loop at the ``paper`` settings: each step's summed loss
    (``loss.sum()``, bird/finetune.py:162), lr, gradient norm, and the weights after the last step under Adam's
    coupled weight decay of 1e-4, to 1e-5 relative."""
    rec = _trace("finetune")
    task, words = _task(paper, rec, _saved(tmp_path, "init.pt", rec["init"], rec["vocab"]))
    res, logged, seen = replay(task, paper["finetune"]["train"], len(rec["batches"]), tmp_path)
    want = rec["steps"]
    for k in range(len(rec["batches"])):
        assert set(logged[k]) == {"step", "lr", "loss", "mlm"}, f"step {k}"
        for name in ("loss", "mlm"):
            assert_close(logged[k][name], want["loss"][k].item(), rtol=RTOL, what=f"step {k} {name}")
        assert_close(seen[k][0], want["lr"][k], rtol=1e-12, what=f"step {k} lr")
        assert_close(seen[k][1], want["grad_norm"][k], rtol=RTOL, what=f"step {k} gradient norm")
    assert compare_final(rec, res.model, words) > len(rec["final"]) // 2
