from __future__ import annotations

import json
import math

import pytest

from idckit.errors import ConfigError
from idckit.report import (Provenance, paper_table, read_report, side_by_side, to_paper_scale, write_report)


def _prov(**kw):
    return Provenance(profile="smoke", data="synthetic: test", data_version="v", backbone="b", weights="w",
                      seeds=[0], **kw)


def test_paper_numbers_are_transcribed_from_the_papers():
    t2 = paper_table("idcpcl.table2")
    idc = next(r for r in t2["rows"] if r["model"] == "IDC-PCL")
    assert idc["metrics"] == {"Bleu_4": 51.2, "METEOR": 36.2, "ROUGE_L": 71.7, "CIDEr-D": 128.9}
    t4 = paper_table("idcpcl.table4")["rows"]
    assert [r["metrics"]["CIDEr-D"] for r in t4] == [89.8, 94.9, 119.7, 128.9, 107.9, 123.5]
    assert t4[4]["difference_encoder"] is False
    c1 = next(r for r in paper_table("clip4idc.table1")["rows"] if r["model"] == "CLIP4IDC")
    assert c1["metrics"]["CIDEr-D"] == 150.7
    t7 = paper_table("clip4idc.table7")["rows"]
    assert [(r["n_intra"], r["n_inter"]) for r in t7] == [(6, 6), (7, 5), (8, 4), (9, 3), (10, 2), (11, 1), (12, 0)]
    assert t7[3]["metrics"]["t2p_R@1"] == 26.8
    with pytest.raises(ConfigError, match="unknown paper table"):
        paper_table("idcpcl.table9")


def test_scale_conversion_only_touches_caption_metrics():
    assert to_paper_scale({"CIDEr-D": 1.289, "Bleu_4": 0.512, "t2p_R@1": 26.8}) == pytest.approx(
        {"CIDEr-D": 128.9, "Bleu_4": 51.2, "t2p_R@1": 26.8})


def test_write_report_schema_and_validation(tmp_path):
    rows = [{"model": "IDC-PCL", "variant": "full", "split": "test", "metrics": {"CIDEr-D": 97.5}}]
    path = write_report(tmp_path, "table2_clevr_change", "idcpcl.table2", rows, _prov(wall_seconds=3.0),
                        headline={"label": "CIDEr-D", "kit": 97.5, "paper": 128.9})
    doc = read_report(path)
    assert doc["notebook"] == "table2_clevr_change" and doc["scale"] == "x100"
    assert doc["paper"] and doc["paper"][-1]["model"] == "IDC-PCL"
    assert {"profile", "data", "commit", "wall_seconds", "selection_split"} <= set(doc["provenance"])
    assert doc["headline"]["kit"] == 97.5 and doc["title"].startswith("IDC-PCL Table 2")

    with pytest.raises(ValueError, match="not a finite number"):
        write_report(tmp_path, "x", "idcpcl.table2", [{**rows[0], "metrics": {"CIDEr-D": math.nan}}], _prov())
    with pytest.raises(ValueError, match="lacks 'split'"):
        write_report(tmp_path, "x", "idcpcl.table2", [{"model": "m", "variant": "v", "metrics": {}}], _prov())
    with pytest.raises(ValueError, match="headline"):
        write_report(tmp_path, "x", "idcpcl.table2", rows, _prov(), headline={"label": "C", "kit": math.inf})
    assert not (tmp_path / "x.json").exists()  # nothing half-written
    undecided = write_report(tmp_path, "y", "idcpcl.table2", rows, _prov(),
                             headline={"label": "best split (undetermined: all tie)", "kit": None})
    assert read_report(undecided)["headline"]["kit"] is None


def test_side_by_side_keeps_sources_apart():
    rows = [{"model": "IDC-PCL", "variant": "full", "metrics": {"CIDEr-D": 97.5, "Bleu_4": 40.0}}]
    df = side_by_side(rows, paper_table("idcpcl.table2")["rows"])
    assert set(df["source"]) == {"paper (real data)", "idckit (this run)"}
    kit = df[df["source"] == "idckit (this run)"]
    assert kit["CIDEr-D"].tolist() == [97.5] and math.isnan(kit["METEOR"].iloc[0])


def test_commit_is_dirty_only_for_code_not_for_generated_reports(tmp_path):
    import subprocess

    from idckit.report import commit_of

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
