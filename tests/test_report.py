from __future__ import annotations

import math

import pytest

from idckit.errors import ConfigError
from idckit.reports.report import (Provenance, paper_table, read_report, to_paper_scale, write_report)


def _prov(**kw):
    return Provenance(profile="smoke", data="synthetic: test", data_version="v", backbone="b", weights="w",
                      seeds=[0], **kw)


def test_paper_numbers_are_transcribed_from_the_papers():
    t2 = paper_table("pcl.table2")
    idc = next(r for r in t2["rows"] if r["model"] == "IDC-PCL")
    assert idc["metrics"] == {"Bleu_4": 51.2, "METEOR": 36.2, "ROUGE_L": 71.7, "CIDEr-D": 128.9}
    t4 = paper_table("pcl.table4")["rows"]
    assert [r["metrics"]["CIDEr-D"] for r in t4] == [89.8, 94.9, 119.7, 128.9, 107.9, 123.5]
    assert t4[4]["difference_encoder"] is False
    c1 = next(r for r in paper_table("clip4idc.table1")["rows"] if r["model"] == "CLIP4IDC")
    assert c1["metrics"]["CIDEr-D"] == 150.7
    t7 = paper_table("clip4idc.table7")["rows"]
    assert [(r["n_intra"], r["n_inter"]) for r in t7] == [(6, 6), (7, 5), (8, 4), (9, 3), (10, 2), (11, 1), (12, 0)]
    assert t7[3]["metrics"]["t2p_R@1"] == 26.8
    with pytest.raises(ConfigError, match="unknown paper table"):
        paper_table("pcl.table9")


def test_paper_value_reads_one_published_number():
    from idckit.reports.report import paper_value

    assert paper_value("pcl.table2", "CIDEr-D", model="IDC-PCL") == 128.9
    assert paper_value("pcl.table5", "ROUGE_L", model="IDC-PCL", variant="B2W + CUB + NABirds") == 49.1
    assert paper_value("clip4idc.table6", "t2p_R@1", dataset="clevr-change") == 26.8     # the registry's name
    with pytest.raises(ConfigError, match="3 rows"):
        paper_value("clip4idc.table6", "t2p_R@1", model="CLIP4IDC")        # one row per dataset: ambiguous
    with pytest.raises(ConfigError, match="0 rows"):
        paper_value("pcl.table2", "CIDEr-D", model="nobody")


def test_scale_conversion_only_touches_caption_metrics():
    assert to_paper_scale({"CIDEr-D": 1.289, "Bleu_4": 0.512, "t2p_R@1": 26.8}) == pytest.approx(
        {"CIDEr-D": 128.9, "Bleu_4": 51.2, "t2p_R@1": 26.8})


def test_write_report_schema_and_validation(tmp_path):
    rows = [{"model": "IDC-PCL", "variant": "full", "split": "test", "metrics": {"CIDEr-D": 97.5}}]
    path = write_report(tmp_path, "table2_clevr_change", "pcl.table2", rows, _prov(wall_seconds=3.0),
                        headline={"label": "CIDEr-D", "kit": 97.5, "paper": 128.9})
    doc = read_report(path)
    assert doc["notebook"] == "table2_clevr_change" and doc["scale"] == "x100"
    assert doc["paper"] and doc["paper"][-1]["model"] == "IDC-PCL"
    assert {"profile", "data", "commit", "wall_seconds", "selection_split"} <= set(doc["provenance"])
    assert doc["headline"]["kit"] == 97.5 and doc["title"].startswith("IDC-PCL Table 2")

    with pytest.raises(ValueError, match="not a finite number"):
        write_report(tmp_path, "x", "pcl.table2", [{**rows[0], "metrics": {"CIDEr-D": math.nan}}], _prov())
    with pytest.raises(ValueError, match="lacks 'split'"):
        write_report(tmp_path, "x", "pcl.table2", [{"model": "m", "variant": "v", "metrics": {}}], _prov())
    with pytest.raises(ValueError, match="headline"):
        write_report(tmp_path, "x", "pcl.table2", rows, _prov(), headline={"label": "C", "kit": math.inf})
    assert not (tmp_path / "x.json").exists()  # nothing half-written
    undecided = write_report(tmp_path, "y", "pcl.table2", rows, _prov(),
                             headline={"label": "best split (undetermined: all tie)", "kit": None})
    assert read_report(undecided)["headline"]["kit"] is None


def test_commit_is_dirty_only_for_code_not_for_generated_reports(tmp_path):
    import subprocess

    from idckit.reports.report import commit_of

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "reports").mkdir()
    for name in ("README.md", "reports/index.html", "idckit.py"):
        (tmp_path / name).write_text("v1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = commit_of(tmp_path)
    assert len(clean) == 10 and not clean.endswith("+dirty")
    (tmp_path / "README.md").write_text("results table regenerated\n")
    (tmp_path / "reports" / "index.html").write_text("v2\n")
    assert commit_of(tmp_path) == clean            # reproduce's own outputs
    (tmp_path / "idckit.py").write_text("v2\n")
    assert commit_of(tmp_path) == clean + "+dirty"  # the code that made the numbers


# -- reports that tell the truth on their own ----------------------------------------------------------------
def test_retrieval_chance():
    from idckit.reports.report import retrieval_chance

    chance = retrieval_chance(200)
    assert chance["t2p_R@1"] == 0.5 and chance["p2t_R@10"] == 5.0 and chance["t2p_MdR"] == chance["p2t_MnR"] == 100.5
    assert retrieval_chance(3)["t2p_R@5"] == 100.0                 # R@K of fewer than K candidates is certain
    with pytest.raises(ValueError, match="at least one"):
        retrieval_chance(0)


def _trained(variant, distinct, seed=0, judge=None, pairs=400):
    row = {"model": "m", "variant": variant, "split": "test", "seed": seed, "run": f"r-{variant}-{seed}",
           "metrics": {"CIDEr-D": 60.1}, "distinct_test_captions": distinct, "test_pairs": pairs, "cider_d": {}}
    return row if judge is None else {**row, "judge_accuracy": judge}


def test_learning_status_tells_ran_from_learned():
    from idckit.reports.report import learning_status

    base = {"rows": [{"model": "most frequent caption", "variant": "total", "split": "test", "metrics": {}}]}
    assert learning_status(base)["verdict"] == "no training"
    one = {"headline": {"runs": "full"}, "rows": [_trained("full", 1), _trained("MLM", 57)]}
    st = learning_status(one)
    assert st["verdict"] == "collapsed" and st["flag"] and st["detail"] == (
        "1 of 1 seed run(s) write fewer than 10 distinct test captions; fewest 1 (full, seed 0)")
    assert learning_status({"rows": [_trained("full", 9)]})["verdict"] == "collapsed"   # fewer than 10
    # every pair its own caption: not collapsed; with no baseline in the report nothing more is claimed
    assert learning_status({"rows": [_trained("full", 8, pairs=8)]})["verdict"] == "not checked"
    # the mean row does not hide a collapsed seed, nor stand in for one
    mean = {**_trained("full", 57, seed="mean"), "n_seeds": 2}
    assert learning_status({"rows": [_trained("full", 57), _trained("full", 3, seed=1), mean]})["flag"]
    judged = learning_status({"rows": [_trained("full", 57, judge=0.5)]})
    assert judged["verdict"] == "not learned" and "judge accuracy 0.50" in judged["detail"]
    ok = learning_status({"rows": [_trained("full", 57, judge=0.91), _trained("MLM", 80)]})
    assert ok == {"verdict": "not checked", "flag": False,
                  "detail": "no no-learning baseline on its test pairs to compare with; judge accuracy 0.91+"}
    retr = {"model": "m", "variant": "adapted (4/2)", "split": "test", "seed": 0,
            "metrics": {"t2p_R@1": 1.8}, "chance": {"t2p_R@1": 1.0}}
    assert learning_status({"rows": [retr]})["verdict"] == "not learned"
    assert learning_status({"rows": [{**retr, "metrics": {"t2p_R@1": 12.0}}]}) == {
        "verdict": "retrieves", "flag": False, "detail": "text->pair R@1 12x chance or more, above the un-adapted control"}
    # a report written before rows recorded their captions: an honest "not checked"
    old = {"rows": [{"model": "m", "variant": "v", "split": "test", "seed": 0, "metrics": {}}]}
    assert learning_status(old)["verdict"] == "not checked"


def test_report_summary_shows_provenance_status_and_notes_but_no_paths(tmp_path):
    from idckit.reports.report import report_summary

    stage = tmp_path / "_tmp-table2_clevr_change"
    path = write_report(stage, "table2_clevr_change", "pcl.table2", [_trained("full", 1)],
                        _prov(wall_seconds=90.0, extra={"train_seconds": 1530.0, "runs": ["pcl-finetune-abc"]}),
                        notes=["COLLAPSED: full wrote \"no change\" for 100 % of the 400 test pairs.", "a < b & c"])
    summary = report_summary(path)
    html = summary._repr_html_()
    for text in ("<h2>Provenance</h2>", "synthetic: test", "smoke", "1.5 min", "25.5 min", "val", "b</td>",
                 "collapsed", "<h2>Notes</h2>", "COLLAPSED: full wrote", "a &lt; b &amp; c",
                 "pcl-finetune-abc", "table2_clevr_change.json, beside this report"):
        assert text in html, text
    assert str(tmp_path) not in html and "_tmp-" not in html and str(tmp_path) not in repr(summary)
    assert repr(summary).startswith("Provenance\ndata: synthetic: test") and " at 0x" not in repr(summary)
    walk = write_report(tmp_path, "w", "walkthrough", [{"model": "m", "variant": "total", "split": "test",
                                                         "metrics": {}}], _prov())
    assert "none (nothing is trained here)" in report_summary(walk)._repr_html_()


def test_a_synthetic_report_says_so_in_its_first_note_without_the_notebook_typing_it(tmp_path):
    from idckit.reports.report import SYNTHETIC_NOTE

    rows = [{"model": "m", "variant": "v", "split": "test", "metrics": {"CIDEr-D": 1.0}}]
    doc = read_report(write_report(tmp_path, "x", "pcl.table2", rows, _prov(), notes=["mine"]))
    assert doc["notes"] == [SYNTHETIC_NOTE, "mine"]
    real = read_report(write_report(tmp_path, "y", "pcl.table2", rows, {**_prov().to_dict(), "data": "real: /d"}))
    assert SYNTHETIC_NOTE not in real["notes"]
    assert {"date", "environment"} <= set(real["provenance"]) and "torch" in real["provenance"]["environment"]
