"""lab/scripts/gpu_hours.py: the paper reproduce's GPU-hours account. Every training job of the kit's job graph is
counted once, shared stages once, the CLIP4IDC notebooks' calls are the ones in their source, and the hours follow
the record's step times (doubling a step time doubles what it times, and nothing else)."""
import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from idckit.experiments.config import load_config
from numeric import assert_close

from idckit.registry import NOTEBOOKS
from lab.scripts import gpu_hours
from lab.scripts.gpu_hours import CLIP4IDC_CALLS, RECORD, all_runs, account

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


@pytest.fixture(scope="module")
def counted(record):
    return all_runs(record)


def _times(record, factor, prefix=""):
    """``record`` with the step times of the kinds named ``prefix``* (every kind: "") multiplied by ``factor``."""
    out = copy.deepcopy(record)
    for name, row in out["throughput"]["steps"].items():
        if name.startswith(prefix):
            row["step_seconds"] *= factor
    return out


def test_every_training_job_of_the_graph_is_counted_once(counted):
    _, units, runs = counted
    last = {"pcl": "pcl/{v} seed {s}", "birds": "pcl-birds/{v} seed {s}", "duda": "duda/duda seed {s}"}
    expected = sorted(last[fam].format(v=v, s=s) for fam, v, s in units.values())
    finals = sorted(r.name for r in runs if r.kind.endswith("fine-tuning (CLEVR-Change)") or
                    r.kind in ("birds: fine-tuning", "DUDA (CLEVR-Change)"))
    assert finals == expected
    assert len(expected) == len(set(expected)) == 19     # 6 IDC-PCL, 1 DUDA, 4 birds recipes x 3 seeds
    # shared stages once: no_judge pre-trains with full's run (4 IDC-PCL pre-trainings for 5 pre-training
    # recipes); the birds' cub and both share one CUB stage per seed
    kinds = [r.kind for r in runs]
    assert kinds.count("IDC-PCL pre-training (CLEVR-Change)") == 4
    assert kinds.count("birds: CUB stage (GIC)") == 3
    assert kinds.count("birds: Birds-to-Words pre-training") == 12
    assert len({(r.kind, r.name) for r in runs}) == len(runs)


def test_the_clip4idc_calls_are_the_notebooks_own():
    for nb, _, _, _, _, call in CLIP4IDC_CALLS:
        assert call in (ROOT / "notebooks" / f"{nb}.py").read_text(), (nb, call)
    # every CLIP4IDC notebook that trains is accounted for
    trains = {n for n, nb in NOTEBOOKS.items() if "clip4idc" in nb.families}
    assert trains == {c[0] for c in CLIP4IDC_CALLS}


def test_the_clip4idc_runs_at_paper(counted):
    runs = counted[2]
    by_kind = {}
    for r in runs:
        by_kind.setdefault(r.kind, []).append(r)
    # table 1's 3 seeds + its labelled variant, table 5's CLIP-FT and w/o adaptation; table 7's 7 splits frozen
    assert len(by_kind["CLIP4IDC captioning (CLEVR-Change)"]) == 6
    assert len(by_kind["CLIP4IDC captioning (CLEVR-Change), encoder frozen (table 7)"]) == 7
    assert len(by_kind["CLIP4IDC adaptation (CLEVR-Change)"]) == 7
    assert len(by_kind["CLIP4IDC captioning (Spot-the-Diff)"]) == 3
    assert len(by_kind["CLIP4IDC adaptation (Spot-the-Diff)"]) == 1
    assert len(by_kind["CLIP4IDC captioning (Image-Editing-Request)"]) == 2
    assert len(by_kind["CLIP4IDC adaptation (Image-Editing-Request)"]) == 1


def test_the_schedules_agree_with_the_records_own(record, counted):
    runs = {r.name: r for r in counted[2]}
    sched = record["throughput"]["schedules"]
    full, pre = runs["pretrain mlm+mvcl+fda seed 0"], sched["IDC-PCL pre-training"]
    # the step count is the paper config's (250,001 since the pre-training trace; the H200 record was made at 250,000)
    assert full.steps == load_config("pcl", "paper")["pretrain"]["train"]["max_steps"]
    assert_close(full.hours / full.steps, pre["hours"] / pre["steps"], rtol=1e-9)
    cap = runs["clip4idc/clip4idc 9/3 seed 0"]
    assert cap.steps == sched["CLIP4IDC captioning (upper bound: 50 epochs of 33,830 scenes)"]["steps"]
    assert cap.evals == 50


def test_doubling_every_step_time_doubles_the_hours(record, counted):
    once = sum(r.hours for r in counted[2])
    twice = sum(r.hours for r in all_runs(_times(record, 2.0))[2])
    assert_close(twice, 2 * once, rtol=1e-9)


def test_a_step_time_times_only_its_own_runs(record, counted):
    slower = {(r.kind, r.name): r for r in all_runs(_times(record, 2.0, "CLIP4IDC adaptation"))[2]}
    for r in counted[2]:
        s = slower[(r.kind, r.name)]
        if r.kind.startswith("CLIP4IDC adaptation"):
            assert_close(s.hours, 2 * r.hours, rtol=1e-9)    # its evaluation is timed from its step too
        else:
            assert s.hours == r.hours


def test_the_clevr_caption_count_scales_the_clevr_adaptations_only(record, counted):
    more = {(r.kind, r.name): r for r in all_runs(record, captions_per_pair=2 * gpu_hours.CLEVR_CAPTIONS_PER_PAIR)[2]}
    for r in counted[2]:
        m = more[(r.kind, r.name)]
        if r.kind == "CLIP4IDC adaptation (CLEVR-Change)":
            assert_close(m.steps * m.step_seconds, 2 * r.steps * r.step_seconds, rtol=1e-3)   # whole batches
        else:
            assert m.hours == r.hours


def test_the_account_adds_up_and_says_what_it_leaves_out(record):
    acc = account(record)
    # each group and the total are rounded apart
    assert_close(sum(g["hours"] for g in acc["by_kind"].values()), acc["total_hours"], rtol=1e-3)
    assert_close(sum(g["hours"] for g in acc["by_notebook"].values()), acc["total_hours"], rtol=1e-3)
    assert acc["total_hours_unscaled_small_batches"] >= acc["total_hours"]
    assert any("feature extraction" in n for n in acc["not_counted"])
    assert any(n.startswith("prepare features") for n in acc["not_counted"])



def test_the_authors_selection_decodes_apart_only_where_it_must():
    second = gpu_hours._second_split
    assert second(SimpleNamespace()) is None                      # a loop without the setting
    assert second(SimpleNamespace(authors_selection=None)) is None
    assert second(SimpleNamespace(authors_selection={"split": "val", "metric": "ROUGE_L"})) is None  # val's scores
    assert second(SimpleNamespace(authors_selection={"split": "val", "metric": "CIDEr-D", "tokenize": False})) == "val"
    assert second(SimpleNamespace(authors_selection={"split": "test", "metric": "CIDEr-D"})) == "test"
    assert gpu_hours._eval_pairs("clevr-change", "test") == 3976 + 7970
    assert gpu_hours._eval_pairs("spot-the-diff", None) == 1493


def test_the_evaluations_follow_the_loops_cadence():
    evals = gpu_hours._evals
    t = SimpleNamespace(max_steps=1000, eval_every=400)
    assert evals(t) == 3                                            # 400, 800 and the last step
    assert evals(SimpleNamespace(max_steps=800, eval_every=400)) == 2
    assert evals(SimpleNamespace(max_steps=1000, eval_every=0)) == 1
    # IDC-PCL's scripts: after updates 1 + k x 85, never at the end off the cadence
    assert evals(SimpleNamespace(max_steps=20002, eval_every=85, eval_offset=1, eval_at_end=False)) == 235
    assert evals(SimpleNamespace(max_steps=50, eval_every=85, eval_offset=1, eval_at_end=False)) == 1
