"""stop_on_collapse: the loop ends a captioning run whose val writes one sentence, keeps its best weights, records
why, and a resumed run that stopped stays stopped; the reports say so."""
from __future__ import annotations

import json

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments.analytics import diversity_notes, stopped_early
from idckit.experiments.clip4idc import dataset_settings
from idckit.experiments.config import load_config, train_config
from idckit.train.loop import fit
from test_loop import ToyTask, _weights


class CaptionLike(ToyTask):
    """test_loop's toy regression whose val evaluation also reports a scripted count of distinct decoded captions."""

    selection_metric = "score"

    def __init__(self, distinct, scores=None, crash_at=None):
        super().__init__(crash_at=crash_at, scores=scores)
        self.distinct = distinct

    def evaluate(self, model, split="val"):
        self.evals += 1
        score = self.scores[self.evals - 1] if self.scores else float(self.evals)
        return {"score": score, "distinct_captions": self.distinct[self.evals - 1]}


def _cfg(after=0.5, evals=2, **kw):
    return train_config(dict(max_steps=12, lr=1e-2, eval_every=2, stop_on_collapse={"evals": evals,
                                                                                     "after_fraction": after}, **kw))


def test_one_sentence_stops_at_the_second_counted_evaluation(tmp_path):
    # evaluations at 2, 4, 6, 8, ...; only those at step >= 0.5 * 12 = 6 count, so the second is at step 8
    task = CaptionLike([1] * 6)
    res = fit(task, _cfg(), tmp_path / "r", progress=False)
    assert res.stopped == "collapsed" and res.steps == 8 and res.max_steps == 12
    assert [h["step"] for h in res.history] == [2, 4, 6, 8] and task.evals == 4
    logs = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    stops = [r["stopped"] for r in logs if "stopped" in r]
    assert stops == [{"reason": "collapsed", "step": 8, "of": 12, "rule": {"evals": 2, "after_fraction": 0.5}}]
    stored = json.loads((tmp_path / "r" / "fit.json").read_text())
    assert stored["stopped"] == "collapsed" and stored["steps"] == 8 and stored["max_steps"] == 12


def test_the_best_checkpoint_is_kept_when_stopped(tmp_path):
    res = fit(CaptionLike([1] * 6, scores=[0.1, 0.9, 0.3, 0.2]), _cfg(), tmp_path / "r", progress=False)
    assert res.stopped == "collapsed" and res.best_step == 4
    best = torch.load(tmp_path / "r" / "best.pt", weights_only=True)
    assert all(torch.equal(best[k], v) for k, v in res.model.state_dict().items())


def test_a_run_that_diversifies_is_not_stopped(tmp_path):
    # counted evaluations 6: one sentence, 8: three (the count restarts), 10: one, 12: four
    res = fit(CaptionLike([1, 1, 1, 3, 1, 4]), _cfg(), tmp_path / "r", progress=False)
    assert res.stopped == "max_steps" and res.steps == 12


def test_a_few_sentences_count_as_collapsed_up_to_the_rules_distinct(tmp_path):
    # CLEVR's collapsed captioners write 2-7 sentences on the way to one: with distinct=8 those evaluations count
    few = [1, 1, 1, 4, 2, 9]             # counted at 6 (1), 8 (4) -> stopped at 8; at distinct=1 it is not
    cfg = train_config(dict(max_steps=12, lr=1e-2, eval_every=2,
                            stop_on_collapse={"evals": 2, "after_fraction": 0.5, "distinct": 8}))
    res = fit(CaptionLike(few), cfg, tmp_path / "eight", progress=False)
    assert res.stopped == "collapsed" and res.steps == 8
    assert fit(CaptionLike(few), _cfg(), tmp_path / "one", progress=False).stopped == "max_steps"
    nine = [1, 1, 9, 1, 9, 1]            # 9 distinct restarts the count at every other evaluation
    assert fit(CaptionLike(nine), cfg, tmp_path / "nine", progress=False).stopped == "max_steps"


def test_evaluations_before_the_fraction_do_not_count(tmp_path):
    # after 0.9: only step 12 >= 10.8 counts, one evaluation short of two
    late = fit(CaptionLike([1] * 6), _cfg(after=0.9), tmp_path / "late", progress=False)
    assert late.stopped == "max_steps" and late.steps == 12
    # after 0: steps 2 and 4 count
    early = fit(CaptionLike([1] * 6), _cfg(after=0.0), tmp_path / "early", progress=False)
    assert early.stopped == "collapsed" and early.steps == 4


def test_off_by_default_and_without_it_the_metric_is_ignored(tmp_path):
    cfg = train_config(dict(max_steps=12, lr=1e-2, eval_every=2))
    assert cfg.stop_on_collapse is None
    assert fit(CaptionLike([1] * 6), cfg, tmp_path / "r", progress=False).stopped == "max_steps"


def test_a_stopped_run_stays_stopped_when_resumed(tmp_path):
    whole = fit(CaptionLike([1] * 6), _cfg(), tmp_path / "whole", progress=False)
    # killed after the stopping checkpoint, before fit.json: the resumed run trains no further
    (tmp_path / "whole" / "fit.json").unlink()
    again_task = CaptionLike([5] * 6)
    again = fit(again_task, _cfg(), tmp_path / "whole", progress=False)
    assert again_task.evals == 0 and again.stopped == "collapsed" and again.steps == 8
    assert torch.equal(_weights(again.model), _weights(whole.model))


def test_resume_mid_run_stops_where_the_whole_run_did(tmp_path):
    whole = fit(CaptionLike([1] * 6), _cfg(), tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(CaptionLike([1] * 6, crash_at=7), _cfg(), tmp_path / "killed", progress=False)
    # the checkpoint of step 6 holds one counted evaluation; the resumed run's evaluations continue the script
    task = CaptionLike([1] * 6)
    task.evals = 3
    resumed = fit(task, _cfg(), tmp_path / "killed", progress=False)
    assert resumed.stopped == "collapsed" and resumed.steps == 8 == whole.steps
    assert torch.equal(_weights(resumed.model), _weights(whole.model))


def test_bad_settings_and_a_task_without_the_metric_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match=r"the keys evals, after_fraction and \(optional\) distinct"):
        _cfg().from_dict({**vars(_cfg()), "stop_on_collapse": {"evals": 2}})
    with pytest.raises(ConfigError, match="distinct must be an integer >= 1"):
        train_config(dict(max_steps=12, lr=1e-2, eval_every=2, stop_on_collapse={"evals": 2, "after_fraction": 0.5,
                                                                         "distinct": 0}))
    with pytest.raises(ConfigError, match="evals must be an integer >= 1"):
        _cfg(evals=0)
    with pytest.raises(ConfigError, match=r"after_fraction must be a number in \[0, 1\]"):
        _cfg(after=1.5)

    class NoDistinct(CaptionLike):
        def evaluate(self, model, split="val"):
            return {"score": 1.0}

    with pytest.raises(ConfigError, match="'distinct_captions'"):
        fit(NoDistinct([1]), _cfg(), tmp_path / "r", progress=False)


def test_on_for_clevr_captioning_at_cpu_only():
    def train(dataset, profile):
        return load_config("clip4idc_caption", profile, dataset_settings("clip4idc_caption", dataset, profile))["train"]

    assert train("clevr-change", "cpu")["stop_on_collapse"] == {"evals": 2, "after_fraction": 0.25, "distinct": 8}
    cpu = train("clevr-change", "cpu")
    # 300 steps, evaluations every 75: both the first two count (75 >= 0.25 * 300), so a collapsed run stops at 150
    assert (cpu["max_steps"], cpu["eval_every"]) == (300, 75)
    assert train_config(train("clevr-change", "cpu")).stop_on_collapse is not None
    for dataset, profile in [("clevr-change", "smoke"), ("clevr-change", "paper"), ("spot-the-diff", "cpu"),
                             ("editing-request", "cpu")]:
        assert "stop_on_collapse" not in train(dataset, profile), (dataset, profile)


def test_reports_say_a_run_was_stopped():
    r = {"stopped": "collapsed", "steps": 150, "max_steps": 300}
    assert stopped_early(r) == ("training stopped at step 150 of 300, val having written one sentence at "
                                "consecutive evaluations")
    assert stopped_early({"stopped": "max_steps"}) is None and stopped_early({}) is None
    base = {"label": "CLIP4IDC", "seed": 0, "pairs": 100, "distinct": 1, "top_caption": "no change",
            "top_share": 1.0}
    [note] = diversity_notes([{**base, "stopped_early": stopped_early(r)}])
    assert note.startswith("COLLAPSED: CLIP4IDC, seed 0 wrote") and note.endswith("step 150 of 300, val having "
                                                                                  "written one sentence at "
                                                                                  "consecutive evaluations.")
    assert stopped_early({**r, "stop_on_collapse": {"evals": 2, "after_fraction": 0.25, "distinct": 8}}).endswith(
        "val having written at most 8 distinct sentences at consecutive evaluations")
    [plain] = diversity_notes([{**base, "stopped_early": None}])
    assert "stopped" not in plain
    [odd] = diversity_notes([{**base, "distinct": 40, "top_share": 0.2, "stopped_early": stopped_early(r)}])
    assert odd.startswith("STOPPED EARLY: CLIP4IDC, seed 0: training stopped at step 150 of 300")


def test_the_difference_token_variant_is_never_stopped():
    from idckit.experiments.clip4idc import caption_train

    train = {"max_steps": 300, "eval_every": 75, "stop_on_collapse": {"evals": 2, "after_fraction": 0.25}}
    assert caption_train(train, {"difference_tokens": False}) == train
    assert caption_train(train, {"difference_tokens": True}) == {"max_steps": 300, "eval_every": 75}


def test_the_cpu_clevr_schedule_stops_a_one_sentence_run_at_step_150(tmp_path):
    block = load_config("clip4idc_caption", "cpu", dataset_settings("clip4idc_caption", "clevr-change", "cpu"))["train"]
    task = CaptionLike([4, 1, 1, 1])     # the records' first two evaluations: a few sentences, then one
    res = fit(task, train_config(block), tmp_path / "r", progress=False)
    assert (res.stopped, res.steps, res.max_steps, task.evals) == ("collapsed", 150, 300, 2)


def test_a_smoke_captioner_that_writes_one_sentence_is_stopped_and_its_report_says_so(tmp_path, monkeypatch):
    import itertools

    from conftest import write_clevr_change

    from idckit.experiments import clip4idc
    from idckit.experiments.analytics import collapse_check
    from idckit.tasks.clip4idc import CaptionTask

    torch.set_num_threads(1)
    root = write_clevr_change(tmp_path / "clevr")
    names = [p.name for sub in ("images", "sc_images", "nsc_images") for p in sorted((root / sub).iterdir())]
    objects = ["a small red rubber cube", "a large blue metal sphere", "a small gray rubber cylinder"]
    combos = list(itertools.combinations(objects, 2))
    (root / "scene_descriptions.json").write_text(json.dumps(
        {n: "there is " + " and ".join(combos[i % len(combos)]) for i, n in enumerate(names)}))
    # the captioner writes its first caption for every pair: one distinct val sentence at every evaluation
    predict = CaptionTask.predict
    monkeypatch.setattr(CaptionTask, "predict", lambda self, model, split: dict.fromkeys(
        (out := predict(self, model, split)), next(iter(out.values()))))
    s = clip4idc.setup("smoke", root, runs_dir=tmp_path / "runs", progress=False, overrides={"caption": {"train": {
        "max_steps": 4, "eval_every": 1, "stop_on_collapse": {"evals": 2, "after_fraction": 0.5}}}})
    r = clip4idc.run_variant(s, "no-adapt", 0)
    # evaluations at steps 1, 2, 3: those at >= 2 count, the second of them ends the run
    assert (r["stopped"], r["steps"], r["max_steps"]) == ("collapsed", 3, 4)
    assert [h["distinct_captions"] for h in r["history"]] == [1, 1, 1]
    _, notes = collapse_check(s.runs_dir, [r])
    assert len(notes) == 1 and notes[0].startswith("COLLAPSED: CLIP4IDC w/o adaptation, seed 0 wrote")
    assert "training stopped at step 3 of 4" in notes[0]
