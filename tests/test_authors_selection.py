"""The authors' checkpoint selection beside the kit's (issue 49, item 4): the loop keeps both checkpoints, each by
its own rule, resumes both, changes nothing of the val selection; reports carry both numbers, each labelled; at cpu
and smoke nothing of it exists."""
from __future__ import annotations

import json

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments import reporting
from idckit.experiments.config import load_config, train_config
from idckit.experiments.selection import KIT_LABEL, authors_entry, authors_label, with_test
from idckit.reports.card import Card, card_html
from idckit.reports.format import PAPER_SELECTION, comparison
from idckit.train.loop import AUTHORS_BEST, fit, load_best
from numeric import assert_close

# val: the kit picks step 4; test: the authors' rule picks 8 (a tie at 6 and 8 goes to the later one) or 6 (ties
# are no gain); at step 2 nothing beats anything yet
VAL = {2: 0.1, 4: 0.5, 6: 0.3, 8: 0.2, 10: 0.4}
TEST = {2: 0.2, 4: 0.1, 6: 0.6, 8: 0.6, 10: 0.3}


class ScriptedTask:
    """Linear regression whose evaluations are scripted per training step and split, so the two selections are
    known in advance; every evaluation keeps a copy of the weights it saw."""

    selection_metric = "score"

    def __init__(self, crash_at: int | None = None):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        self.y = self.x @ torch.randn(4, 1, generator=g)
        self.crash_at, self.step, self.calls, self.seen = crash_at, 0, [], {}

    def build_model(self):
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))

    def param_groups(self, model):
        return [{"params": model.parameters()}]

    def batches(self, epoch, generator):
        order = torch.randperm(64, generator=generator)
        for i in range(0, 64, 16):
            yield order[i:i + 16]

    def train_step(self, model, idx, step):
        if step == self.crash_at:
            self.crash_at = None
            raise KeyboardInterrupt("simulated kill")
        self.step = step + 1
        loss = torch.nn.functional.mse_loss(model(self.x[idx]), self.y[idx] + 0.01 * torch.randn(len(idx), 1))
        return loss, {}

    def evaluate(self, model, split="val", **kw):
        self.calls.append((self.step, split, kw))
        self.seen[self.step] = {k: v.clone() for k, v in model.state_dict().items()}
        score = (VAL if split == "val" else TEST)[self.step]
        return {"score": score, "other": -score}


def _cfg(**extra):
    return train_config(dict(max_steps=10, lr=1e-2, eval_every=2, checkpoint_every=2, seed=5, **extra))


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


RULE = {"split": "test", "metric": "score"}


@pytest.mark.parametrize("tie, picked", [(True, 8), (False, 6)])
def test_both_checkpoints_are_kept_each_by_its_own_rule(tmp_path, tie, picked):
    task = ScriptedTask()
    res = fit(task, _cfg(improve_on_tie=tie, authors_selection=RULE), tmp_path / "r", progress=False)
    assert res.best_step == 4 and res.best_metrics["score"] == 0.5          # the kit's: val
    assert res.authors["best_step"] == picked and res.authors["best_metrics"]["score"] == 0.6
    assert res.authors["rule"] == RULE and [h["step"] for h in res.authors["history"]] == [2, 4, 6, 8, 10]
    assert [c[:2] for c in task.calls[:2]] == [(2, "val"), (2, "test")]
    best = torch.load(tmp_path / "r" / "best.pt", weights_only=True)
    authors = torch.load(tmp_path / "r" / AUTHORS_BEST, weights_only=True)
    assert _same(best, task.seen[4]) and _same(authors, task.seen[picked]) and not _same(best, authors)
    stored = json.loads((tmp_path / "r" / "fit.json").read_text())
    assert stored["authors"]["best_step"] == picked
    logs = [json.loads(line) for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert [r["eval_authors"]["step"] for r in logs if "eval_authors" in r] == [2, 4, 6, 8, 10]
    # a finished run hands both back without training
    again = fit(ScriptedTask(), _cfg(improve_on_tie=tie, authors_selection=RULE), tmp_path / "r", progress=False)
    assert again.authors["best_step"] == picked
    assert _same(load_best(ScriptedTask(), tmp_path / "r", file=AUTHORS_BEST).state_dict(), task.seen[picked])


def test_the_gate_holds_for_the_authors_pick_too(tmp_path):
    res = fit(ScriptedTask(), _cfg(select_after_step=6, authors_selection=RULE), tmp_path / "r", progress=False)
    assert res.best_step == 10 and res.authors["best_step"] == 8       # steps <= 6 may not be picked


def test_a_val_rule_with_its_own_text_rule_asks_the_task_for_it(tmp_path):
    task = ScriptedTask()
    res = fit(task, _cfg(authors_selection={"split": "val", "metric": "score", "tokenize": False}),
              tmp_path / "r", progress=False)
    assert (2, "val", {"tokenize": False}) in task.calls and (2, "val", {}) in task.calls
    assert res.authors["best_step"] == res.best_step == 4
    # the same split and text as the val selection: its scores are reused, nothing is decoded twice
    task = ScriptedTask()
    res = fit(task, _cfg(authors_selection={"split": "val", "metric": "other"}), tmp_path / "s", progress=False)
    assert [c[1] for c in task.calls] == ["val"] * 5 and res.authors["best_step"] == 2     # lowest val score


def test_a_killed_run_resumes_both_selections(tmp_path):
    cfg = _cfg(improve_on_tie=True, authors_selection=RULE)
    whole_task = ScriptedTask()
    whole = fit(whole_task, cfg, tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(ScriptedTask(crash_at=7), cfg, tmp_path / "killed", progress=False)
    assert (tmp_path / "killed" / AUTHORS_BEST).is_file() and not (tmp_path / "killed" / "fit.json").exists()
    resumed = fit(ScriptedTask(), cfg, tmp_path / "killed", progress=False)
    assert resumed.authors["best_step"] == whole.authors["best_step"] == 8
    assert resumed.authors["history"] == whole.authors["history"] and resumed.best_step == whole.best_step
    for name in ("best.pt", AUTHORS_BEST):
        assert _same(torch.load(tmp_path / "whole" / name, weights_only=True),
                     torch.load(tmp_path / "killed" / name, weights_only=True))


def test_off_nothing_changes(tmp_path):
    on = fit(ScriptedTask(), _cfg(authors_selection=RULE), tmp_path / "on", progress=False)
    off_task = ScriptedTask()
    off = fit(off_task, _cfg(), tmp_path / "off", progress=False)
    assert off.authors is None and not (tmp_path / "off" / AUTHORS_BEST).exists()
    assert "authors" not in json.loads((tmp_path / "off" / "fit.json").read_text())
    assert all(c[1] == "val" for c in off_task.calls)
    # the extra evaluations draw nothing: the val selection and its weights are those of the run without them
    def scores(history):      # the evaluations without their wall-clock minutes
        return [{k: v for k, v in h.items() if k != "minutes"} for h in history]

    assert (on.best_step, on.best_metrics, scores(on.history)) == (off.best_step, off.best_metrics, scores(off.history))
    assert _same(on.model.state_dict(), off.model.state_dict())
    last = {n: torch.load(tmp_path / n / "last.pt", weights_only=True)["model"] for n in ("on", "off")}
    assert _same(last["on"], last["off"])
    assert authors_entry(off, off_task, tmp_path / "off", lambda m: 1 / 0) == {}


@pytest.mark.parametrize("bad", [{"split": "train", "metric": "score"}, {"metric": "score"},
                                 {"split": "test", "metric": ""}, {"split": "test", "metric": "s", "tokenize": 1},
                                 {"split": "test", "metric": "s", "extra": 1}, "test"])
def test_bad_rules_fail_before_training(bad):
    with pytest.raises(ConfigError, match="authors_selection"):
        _cfg(authors_selection=bad)


def test_a_metric_the_task_lacks_is_named(tmp_path):
    with pytest.raises(ConfigError, match="'CIDEr-D'"):
        fit(ScriptedTask(), _cfg(authors_selection={"split": "test", "metric": "CIDEr-D"}), tmp_path / "r",
            progress=False)


def test_paper_sets_the_authors_rule_cpu_and_smoke_do_not():
    stages = {("pcl", "finetune"): {"split": "val", "metric": "CIDEr-D", "tokenize": False},
              ("pcl_birds", "finetune"): {"split": "val", "metric": "ROUGE_L"},
              ("clip4idc_adapt", None): {"split": "test", "metric": "t2p_R@1"},
              ("clip4idc_caption", None): {"split": "test", "metric": "CIDEr-D"}}
    for (name, section), rule in stages.items():
        for profile in ("smoke", "cpu", "paper"):
            cfg = load_config(name, profile)
            train = (cfg[section] if section else cfg)["train"]
            if profile == "paper":
                assert train["authors_selection"] == rule
            else:   # absent from the run's key, so cached cpu runs keep their keys
                assert "authors_selection" not in train
                assert train_config({"max_steps": 1, "lr": 1.0, **train}).authors_selection is None


# -- what a report shows -------------------------------------------------------------------------------------------
def _scores(cider: float) -> dict:
    one = {"Bleu_4": 0.5, "METEOR": 0.3, "ROUGE_L": 0.6, "CIDEr-D": cider}
    return {"total": one, "semantic": dict(one), "distractor": dict(one), "color": dict(one)}


def _result(seed: int, kit: float, authors: float | None) -> dict:
    r = {"model": "IDC-PCL (idckit)", "recipe": "pcl/full", "variant": "full", "label": "full", "seed": seed,
         "run": f"pcl-finetune-{seed}", "test": _scores(kit), "best_step": 400, "distinct_test_captions": 40,
         "test_pairs": 40, "judge_accuracy": 0.9}
    if authors is not None:
        rule = {"split": "test", "metric": "CIDEr-D"}
        r["authors_selection"] = {"rule": rule, "label": authors_label(rule), "best_step": 800, "val_best_step": 400,
                                  "same_as_val": False, "selection_score": authors, "history": [],
                                  "test": _scores(authors)}
    return r


def test_report_rows_carry_both_numbers_labelled():
    rows = reporting.rows([_result(0, 1.20, 1.30), _result(1, 1.00, 1.40)])
    assert [r["seed"] for r in rows] == [0, 1, "mean"]
    assert rows[0]["metrics"]["CIDEr-D"] == pytest.approx(120.0) and rows[0]["selection"] == KIT_LABEL
    a = rows[0]["authors_selection"]
    assert a["label"] == "selected as the authors (test split, CIDEr-D)" and a["step"] == 800 and a["val_step"] == 400
    assert a["metrics"]["CIDEr-D"] == pytest.approx(130.0)
    mean = rows[2]["authors_selection"]
    assert mean["metrics"]["CIDEr-D"] == pytest.approx(135.0) and mean["sd"]["CIDEr-D"] > 0 and mean["steps"] == [800,
                                                                                                                 800]
    types = reporting.per_type_rows([_result(0, 1.2, 1.3)])
    assert types[0]["authors_selection"]["metrics"]["color"] == pytest.approx(130.0)
    # a run without the authors' checkpoint (cpu, smoke), alone or beside one: its rows say nothing of it
    plain = reporting.rows([_result(0, 1.2, None)])
    assert "authors_selection" not in plain[0] and "selection" not in plain[0]
    mixed = reporting.rows([_result(0, 1.2, None), _result(1, 1.0, 1.4)])
    assert "authors_selection" not in mixed[-1]


def test_the_tables_and_the_card_show_both(tmp_path):
    rows = reporting.rows([_result(0, 1.20, 1.30)])
    paper = [{"model": "IDC-PCL", "variant": "paper", "metrics": {"CIDEr-D": 128.9}}]
    table = comparison(rows, paper, metrics=("CIDEr-D",))
    assert "selection" in table.columns
    cells = [(r["selection"], r["CIDEr-D"]) for r in table.records]
    assert cells == [(PAPER_SELECTION, 128.9), (KIT_LABEL, pytest.approx(120.0)),
                     ("selected as the authors (test split, CIDEr-D)", pytest.approx(130.0))]
    plain = comparison(reporting.rows([_result(0, 1.2, None)]), paper, metrics=("CIDEr-D",))
    assert "selection" not in plain.columns and len(plain.records) == 2
    doc = {"notebook": "table2_clevr_change", "table": "pcl.table2", "title": "CLEVR-Change", "rows": rows,
           "headline": {"label": "IDC-PCL CIDEr-D, test total", "kit": 120.0, "paper": 128.9, "metric": "CIDEr-D",
                        "runs": {"variants": ["full"]}},
           "provenance": {"profile": "paper", "seeds": [0], "data": "real: CLEVR-Change"}}
    card = card_html(doc)
    assert "IDC-PCL CIDEr-D, test total: val-selected (kit)" in card and "120.0" in card
    assert "IDC-PCL CIDEr-D, test total: selected as the authors (test split, CIDEr-D)" in card and "130.0" in card
    assert "selected as the authors" in repr(Card(doc))
    doc["rows"] = reporting.rows([_result(0, 1.20, None)])
    assert "selected as the authors" not in card_html(doc) and "val-selected" not in card_html(doc)


def test_the_entry_of_metrics_json(tmp_path):
    task = ScriptedTask()
    res = fit(task, _cfg(improve_on_tie=True, authors_selection=RULE), tmp_path / "r", progress=False)
    scored = []
    entry = authors_entry(res, ScriptedTask(), tmp_path / "r", lambda m: scored.append(m) or {"total": 1})
    a = entry["authors_selection"]
    assert (a["best_step"], a["val_best_step"], a["same_as_val"], a["selection_score"]) == (8, 4, False, 0.6)
    assert a["test"] == {"total": 1} and _same(scored[0].state_dict(), task.seen[8])
    assert a["label"] == "selected as the authors (test split, score)"
    # the same step as the val selection: the val-selected test scores, not a second decoding
    res = fit(ScriptedTask(), _cfg(authors_selection={"split": "val", "metric": "score"}), tmp_path / "s",
              progress=False)
    entry = authors_entry(res, ScriptedTask(), tmp_path / "s", lambda m: 1 / 0)
    assert entry["authors_selection"]["same_as_val"] and with_test(entry, {"t": 2})["authors_selection"]["test"] == \
        {"t": 2}
    assert authors_label({"split": "val", "metric": "CIDEr-D", "tokenize": False}) == \
        "selected as the authors (val split, CIDEr-D on whitespace-split text)"


# -- end to end: the experiments score both checkpoints on test --------------------------------------------------
@pytest.mark.slow
@pytest.mark.java
def test_clip4idc_runs_score_both_checkpoints_and_rows_show_both(tmp_path):
    """The paper's rules on both CLIP4IDC stages, at smoke size on the tiny CLEVR-Change fixture."""
    import itertools

    from conftest import write_clevr_change

    from idckit.experiments import clip4idc

    root = write_clevr_change(tmp_path / "clevr")
    names = [p.name for sub in ("images", "sc_images", "nsc_images") for p in sorted((root / sub).iterdir())]
    objects = ["a small red cube", "a large blue sphere", "a small gray cylinder", "a large green cube"]
    combos = list(itertools.combinations(objects, 2))
    (root / "scene_descriptions.json").write_text(json.dumps(
        {n: "there is " + " and ".join(combos[i % len(combos)]) for i, n in enumerate(names)}))
    rules = {section: {"train": {"authors_selection": load_config(name, "paper")["train"]["authors_selection"]}}
             for section, name in (("adapt", "clip4idc_adapt"), ("caption", "clip4idc_caption"))}
    torch.set_num_threads(1)
    s = clip4idc.setup("smoke", root, runs_dir=tmp_path / "runs", progress=False, overrides=rules)
    r = clip4idc.run_variant(s, "clip4idc", progress=False)
    ad = clip4idc.adapt(s, progress=False)
    for result, metric in ((r, "CIDEr-D"), (ad, "t2p_R@1")):
        a = result["authors_selection"]
        assert a["rule"]["split"] == "test" and a["rule"]["metric"] == metric
        assert a["label"] == f"selected as the authors (test split, {metric})"
        assert a["val_best_step"] == result["best_step"]
        assert (tmp_path / "runs" / result["run"] / AUTHORS_BEST).is_file()
        tests = a["test"]["total"] if metric == "CIDEr-D" else a["test"]
        # the pick's test score is the score it was picked by (same decoding, same scorer)
        assert_close(tests[metric], a["selection_score"])
        if a["same_as_val"]:
            assert a["test"] == result["test"]
    rows = reporting.rows([r])
    assert rows[0]["selection"] == KIT_LABEL
    assert rows[0]["authors_selection"]["metrics"]["CIDEr-D"] == pytest.approx(
        100 * r["authors_selection"]["test"]["total"]["CIDEr-D"])
    retrieval = reporting.retrieval_rows([ad], unadapted=False)
    assert retrieval[0]["authors_selection"]["metrics"]["t2p_R@1"] == ad["authors_selection"]["test"]["t2p_R@1"]
    split = reporting.layer_split_rows([{"label": "x", "paper_split": None, "n_intra": ad["n_intra"]}], [ad], [r])
    assert set(split[0]["authors_selection"]["metrics"]) == set(split[0]["metrics"])


@pytest.mark.slow
@pytest.mark.java
def test_pcl_run_scores_its_authors_pick_on_whitespace_text(tmp_path):
    """IDC-PCL's rule (CIDEr-D on whitespace-split text), here on test so the pick's score can be checked
    against its own test captions; smoke size on a tiny synthetic CLEVR-Change."""
    from idckit.data.synth.clevr_change import generate
    from idckit.eval.captions import evaluate_pairs
    from idckit.experiments import pcl
    from idckit.experiments.runs import test_captions
    from idckit.tasks.pcl import predict

    generate(tmp_path / "synth", n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    rule = {"split": "test", "metric": "CIDEr-D", "tokenize": False}
    s = pcl.setup("smoke", tmp_path / "synth", runs_dir=tmp_path / "runs", progress=False,
                  overrides={"finetune": {"train": {"authors_selection": rule, "eval_every": 2}}})
    r = pcl.run_variant(s, "none", progress=False)       # fine-tuning alone: the stage the rule is for
    a = r["authors_selection"]
    assert a["label"] == "selected as the authors (test split, CIDEr-D on whitespace-split text)"
    assert [h["step"] for h in a["history"]] == [h["step"] for h in r["history"]]
    data = pcl.loaded_data(s)
    model, _ = pcl.load_run(s.runs_dir / r["run"], device="cpu")
    model.load_state_dict(torch.load(s.runs_dir / r["run"] / AUTHORS_BEST, weights_only=True))
    split = data.splits["test"]
    captions = predict(model, data, "test", batch_size=64, min_words=s.config["finetune"]["decode_min_words"])
    raw = evaluate_pairs(split.references, captions["captions"], dict(zip(split.pair_ids, split.types)),
                         tokenize=False, meteor=False)
    assert_close(raw["total"]["CIDEr-D"], a["selection_score"])
    # its reported test numbers are the kit's test scoring (PTB), as the val-selected run's are
    ptb = evaluate_pairs(split.references, captions["captions"], dict(zip(split.pair_ids, split.types)))
    assert_close(a["test"]["total"]["CIDEr-D"], ptb["total"]["CIDEr-D"])
    if a["same_as_val"]:
        assert set(captions["captions"].values()) == set(test_captions(s.runs_dir / r["run"]).values())
