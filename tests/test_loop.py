"""The training loop: schedules, val selection, early stopping, and bit-identical resume after a kill."""
from __future__ import annotations

import json
import math

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments.config import deep_merge, load_config
from idckit.experiments.runs import open_run, run_key
from idckit.experiments.config import train_config
from idckit.train.loop import fit
from idckit.train.schedules import lr_factor
from numeric import assert_close


class ToyTask:
    """Noisy linear regression with dropout, so resume must restore data order, RNG and optimiser state."""

    selection_metric = "neg_mse"

    def __init__(self, crash_at: int | None = None, scores: list[float] | None = None):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 8, generator=g)
        self.y = self.x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
        self.crash_at = crash_at
        self.scores = scores  # scripted val metrics, to test selection and early stopping
        self.evals = 0

    def build_model(self):
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))

    def param_groups(self, model):
        return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr_scale": 0.5}]

    def batches(self, epoch, generator):
        order = torch.randperm(64, generator=generator)
        for i in range(0, 64, 16):
            yield order[i:i + 16]

    def train_step(self, model, idx, step):
        if self.crash_at is not None and step == self.crash_at:
            self.crash_at = None
            raise KeyboardInterrupt("simulated kill")
        noise = torch.randn(len(idx), 1) * 0.01  # a draw from the global RNG, like masking in real tasks
        loss = torch.nn.functional.mse_loss(model(self.x[idx]), self.y[idx] + noise)
        return loss, {"mse": float(loss.detach())}

    def evaluate(self, model, split="val"):
        self.evals += 1
        if self.scores is not None:
            return {"neg_mse": self.scores[self.evals - 1]}
        with torch.no_grad():
            return {"neg_mse": -float(torch.nn.functional.mse_loss(model.eval()(self.x), self.y))}


def _weights(model):
    return torch.cat([p.detach().flatten() for p in model.state_dict().values()])


def test_resume_after_kill_is_bit_identical(tmp_path):
    cfg = train_config(dict(max_steps=40, lr=1e-2, schedule="warmup_cosine", warmup_steps=5, eval_every=8,
                            checkpoint_every=4, seed=3))
    whole = fit(ToyTask(), cfg, tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(ToyTask(crash_at=22), cfg, tmp_path / "killed", progress=False)
    assert (tmp_path / "killed" / "last.pt").is_file() and not (tmp_path / "killed" / "fit.json").exists()
    resumed = fit(ToyTask(), cfg, tmp_path / "killed", progress=False)
    assert resumed.steps == whole.steps == 40
    assert resumed.best_step == whole.best_step
    assert resumed.best_metrics == whole.best_metrics
    assert [h["neg_mse"] for h in resumed.history] == [h["neg_mse"] for h in whole.history]
    assert torch.equal(_weights(resumed.model), _weights(whole.model))
    last_whole = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)["model"]
    last_resumed = torch.load(tmp_path / "killed" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(last_whole[k], last_resumed[k]) for k in last_whole)


def test_same_seed_same_result_other_seed_differs(tmp_path):
    cfg = train_config(dict(max_steps=12, lr=1e-2, eval_every=6, seed=1))
    a = fit(ToyTask(), cfg, tmp_path / "a", progress=False)
    b = fit(ToyTask(), cfg, tmp_path / "b", progress=False)
    c = fit(ToyTask(), train_config(dict(max_steps=12, lr=1e-2, eval_every=6, seed=2)), tmp_path / "c", progress=False)
    assert torch.equal(_weights(a.model), _weights(b.model))
    assert not torch.equal(_weights(a.model), _weights(c.model))


def test_selects_best_on_val_and_stops_early(tmp_path):
    task = ToyTask(scores=[0.1, 0.5, 0.3, 0.2, 0.4, 0.9, 0.9])
    res = fit(task, train_config(dict(max_steps=100, lr=1e-2, eval_every=2, patience=3)), tmp_path / "r",
              progress=False)
    assert res.stopped == "early_stop"
    assert res.best_step == 4 and res.best_metrics == {"neg_mse": 0.5}
    assert res.steps == 10 and task.evals == 5
    # the model handed back carries the weights saved at the best step
    best = torch.load(tmp_path / "r" / "best.pt", weights_only=True)
    assert all(torch.equal(best[k], v) for k, v in res.model.state_dict().items())


def test_eval_every_zero_scores_val_once_at_the_end_and_keeps_the_last_weights(tmp_path):
    # the birds cpu profile's selection: with no periodic evaluation the last checkpoint is the one kept
    task = ToyTask(scores=[0.2])
    res = fit(task, train_config(dict(max_steps=10, lr=1e-2, eval_every=0, checkpoint_every=4)), tmp_path / "r",
              progress=False)
    assert task.evals == 1 and res.best_step == 10 and [h["step"] for h in res.history] == [10]
    last = torch.load(tmp_path / "r" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(last[k], v) for k, v in res.model.state_dict().items())


def test_finished_run_is_not_trained_again(tmp_path):
    cfg = train_config(dict(max_steps=8, lr=1e-2, eval_every=4))
    first = fit(ToyTask(), cfg, tmp_path / "r", progress=False)
    again_task = ToyTask()
    again = fit(again_task, cfg, tmp_path / "r", progress=False)
    assert again_task.evals == 0 and again.best_metrics == first.best_metrics
    assert torch.equal(_weights(again.model), _weights(first.model))
    logs = [json.loads(l) for l in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert any("eval" in r for r in logs) and any("mse" in r for r in logs)


def test_param_group_lr_scale_and_unknown_setting():
    with pytest.raises(ConfigError, match="unknown training settings"):
        train_config({"max_steps": 1, "lr": 1.0, "learning_rate": 2})
    cfg = train_config({"max_steps": 1, "lr": 1.0, "betas": [0.9, 0.98]})
    assert cfg.betas == (0.9, 0.98)


def test_train_config_fills_train_json_and_converts_epochs():
    from idckit.experiments.config import read_config_file
    from idckit.train.loop import TrainConfig

    defaults = read_config_file("train")["base"]
    cfg = train_config({"max_steps": 5, "lr": 0.1}, seed=7)
    assert cfg.seed == 7 and cfg.optimizer == defaults["optimizer"] and cfg.log_every == defaults["log_every"]
    with pytest.raises(ConfigError, match="missing"):
        TrainConfig.from_dict({"max_steps": 5, "lr": 0.1})                 # no defaults outside the JSON
    # 10 steps per epoch: 3 epochs = 30 steps, 10 % warm-up = 3 steps, evaluation every half epoch = 5 steps
    cfg = train_config({"epochs": 3, "lr": 0.1, "warmup_fraction": 0.1, "eval_every_epochs": 0.5},
                       steps_per_epoch=10)
    assert (cfg.max_steps, cfg.warmup_steps, cfg.eval_every) == (30, 3, 5)
    with pytest.raises(ConfigError, match="steps per epoch"):
        train_config({"epochs": 3, "lr": 0.1})


def test_schedules_hand_values():
    noam = lr_factor("noam", max_steps=100, warmup_steps=4)
    assert [noam(s) for s in range(3)] == [0.25, 0.5, 0.75]
    assert noam(3) == 1.0
    assert_close(noam(15), math.sqrt(4 / 16))
    step = lr_factor("step_decay", max_steps=100, decay_every=10)
    assert [step(0), step(9), step(10), step(25), step(99)] == [1.0, 1.0, 0.5, 0.25, 0.25]
    cos = lr_factor("warmup_cosine", max_steps=12, warmup_steps=2)
    assert cos(0) == 0.5 and cos(1) == 1.0 and cos(11) == 0.0
    assert_close(cos(6), 0.5)
    lin = lr_factor("warmup_linear", max_steps=12, warmup_steps=2)
    assert lin(11) == 0.0
    assert_close(lin(6), 0.5)
    with pytest.raises(ConfigError):
        lr_factor("cosine", max_steps=1)


def test_config_profiles_and_run_keys(tmp_path):
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    smoke = load_config("synth_clevr_change", "smoke", {"seed": 5})
    assert smoke["pairs"] == 60 and smoke["seed"] == 5 and smoke["workers"] == 2
    with pytest.raises(ConfigError, match="unknown profile"):
        load_config("synth_clevr_change", "gpu")
    with pytest.raises(ConfigError, match="no config named"):
        load_config("nope", "cpu")
    assert run_key({"a": 1, "b": [1, 2]}) == run_key({"b": [1, 2], "a": 1}) != run_key({"a": 2, "b": [1, 2]})
    run = open_run(tmp_path, "toy", {"a": 1})
    assert run.dir.name == f"toy-{run.key}" and (run.dir / "config.json").is_file() and not run.is_complete()
    with pytest.raises(ConfigError, match="has not finished"):
        run.metrics()
    run.complete({"CIDEr-D": 1.5})
    assert open_run(tmp_path, "toy", {"a": 1}).metrics() == {"CIDEr-D": 1.5}


def test_select_after_step_gates_selection_counts_patience_and_survives_resume(tmp_path):
    # IDC-PCL's bird fine-tuning (bird/finetune.py:190): no evaluation at or before the gate is kept, each counts
    # as not beating the best; the best of the later ones wins even when an earlier score was higher
    scores = [0.9, 0.8, 0.7, 0.1, 0.5, 0.3]            # evaluations at steps 2, 4, ..., 12
    cfg = train_config(dict(max_steps=12, lr=1e-2, eval_every=2, checkpoint_every=2, select_after_step=6))
    whole = fit(ToyTask(scores=scores), cfg, tmp_path / "whole", progress=False)
    assert whole.best_step == 10 and whole.best_metrics == {"neg_mse": 0.5}
    ungated = fit(ToyTask(scores=scores), train_config(dict(max_steps=12, lr=1e-2, eval_every=2)),
                  tmp_path / "ungated", progress=False)
    assert ungated.best_step == 2
    # killed before the gate passes (last.pt at step 4): the resumed run still refuses step 6's 0.7
    with pytest.raises(KeyboardInterrupt):
        fit(ToyTask(crash_at=5, scores=scores), cfg, tmp_path / "killed", progress=False)
    resumed = fit(ToyTask(scores=scores[2:]), cfg, tmp_path / "killed", progress=False)
    assert resumed.best_step == 10 and resumed.best_metrics == {"neg_mse": 0.5}
    assert torch.equal(_weights(resumed.model), _weights(whole.model))


def test_select_after_step_patience_before_the_gate_keeps_the_last_weights(tmp_path):
    # evaluations before the gate count towards patience, as the authors' no_beat does; a run that stops before
    # any evaluation could be selected keeps the weights it stopped with, and says so in its log
    task = ToyTask(scores=[0.9, 0.8, 0.7])
    res = fit(task, train_config(dict(max_steps=20, lr=1e-2, eval_every=2, patience=2, select_after_step=10)),
              tmp_path / "r", progress=False)
    assert res.stopped == "early_stop" and res.steps == 4 and res.best_step == 4
    assert res.best_metrics == {"neg_mse": 0.8}
    logs = [json.loads(l) for l in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert {"selected_before_gate": {"step": 4, "select_after_step": 10}} in logs
    with pytest.raises(ConfigError, match="select_after_step"):
        train_config(dict(max_steps=20, lr=1e-2, select_after_step=-1))


def test_eval_offset_and_eval_at_end_score_on_the_authors_cadence(tmp_path):
    # IDC-PCL's fine-tuning scripts score after the update at global_step 85k (counted from 0: 85k + 1 updates) and
    # never score the updates after their last evaluation (bird/finetune.py:178,211; clver/finetune.py:179,214)
    cfg = train_config(dict(max_steps=11, lr=1e-2, eval_every=3, eval_offset=1, eval_at_end=False))
    task = ToyTask(scores=[0.1, 0.2, 0.3])
    res = fit(task, cfg, tmp_path / "authors", progress=False)
    assert [h["step"] for h in res.history] == [4, 7, 10] and res.steps == 11 and res.best_step == 10
    kit = fit(ToyTask(scores=[0.1, 0.2, 0.3, 0.4]), train_config(dict(max_steps=11, lr=1e-2, eval_every=3)),
              tmp_path / "kit", progress=False)
    assert [h["step"] for h in kit.history] == [3, 6, 9, 11] and kit.best_step == 11
    # a run that scored nothing on the cadence still scores its last step, so that it keeps weights
    none = fit(ToyTask(scores=[0.5]), train_config(dict(max_steps=3, lr=1e-2, eval_every=3, eval_offset=1,
                                                        eval_at_end=False)), tmp_path / "none", progress=False)
    assert [h["step"] for h in none.history] == [3] and none.best_step == 3
    for bad in ({"eval_offset": -1}, {"eval_offset": True}, {"eval_at_end": 1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            train_config(dict(max_steps=3, lr=1e-2, **bad))
