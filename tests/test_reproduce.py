"""The reproduce runner: papermill execution, HTML conversion, staging, stale marking, the index page."""
from __future__ import annotations

import json

import nbformat
import pytest

from idckit.reproduce import reproduce, write_index
from idckit.reports.status import STATUSES

GOOD = '''
import json, pathlib
from idckit.reports.report import write_report, Provenance
write_report(report_dir, "good", "pcl.table2",
             [{"model": "m", "variant": "v", "split": "test", "metrics": {"CIDEr-D": 42.0}}],
             Provenance(profile=profile, data="synthetic: test", data_version="v", backbone="b", weights="w", seeds=[0]),
             headline={"label": "CIDEr-D", "kit": 42.0, "paper": 128.9})
print("a visible table")
'''


def _notebook(path, code):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'cpu'\ndata_root = None\nreport_dir = None\nruns_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "idckit", "display_name": "Python (idckit)", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.mark.slow
def test_good_then_failing_notebook_keeps_the_previous_report_marked_stale(tmp_path):
    nbs, reports = tmp_path / "nbs", tmp_path / "reports"
    nbs.mkdir()
    _notebook(nbs / "good.ipynb", GOOD)
    out = reproduce(profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    assert [o.ok for o in out] == [True]
    html = (reports / "good.html").read_text()
    assert "a visible table" in html and "write_report(" not in html  # code hidden, outputs shown
    before = (reports / "good.json").read_text()
    assert json.loads(before)["provenance"]["profile"] == "smoke"

    _notebook(nbs / "good.ipynb", "raise RuntimeError('boom')")
    out = reproduce(profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    assert [o.ok for o in out] == [False] and "boom" in out[0].error
    assert (reports / "good.json").read_text() == before  # previous good report kept
    assert json.loads((reports / "status.json").read_text())["good"]["status"] == "stale"
    index = (reports / "index.html").read_text()
    assert 'href="good.html"' in index and "stale" in index and "42.0" in index and "128.9" in index
    assert not list(reports.glob("_tmp-*"))  # staging cleaned up


def test_index_lists_every_report(tmp_path):
    for name, kit in (("a", 1.5), ("b", 2.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "notebook": name, "table": "t", "title": f"Table {name}", "headline": {"label": "C", "kit": kit},
            "provenance": {"profile": "cpu", "data": "synthetic: x", "seeds": [0, 1], "wall_seconds": 120,
                           "commit": "abc", **({"train_seconds": 1530} if name == "a" else {})}}))
    page = write_index(tmp_path).read_text()
    assert page.count("<tr>") == 3 and "Table a" in page and "2.5" in page and "0, 1" in page and "2.0 min" in page
    assert "training 25.5 min" in page        # the cached runs' training, not the render
    assert page.count("synthetic: x") == 3 and ">D1</span>" in page   # a key per row (text on hover), once below


def test_index_keys_each_data_description_once(tmp_path):
    for name, data in (("a", "synthetic: x"), ("b", "real: /data/clevr")):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "notebook": name, "table": "t", "headline": {"label": "C", "kit": 1.0},
            "provenance": {"profile": "cpu", "data": data, "seeds": [0], "wall_seconds": 60, "commit": "abc"}}))
    page = write_index(tmp_path).read_text()
    assert "<li><b>D1</b>: synthetic: x; backbone </li>" in page and "<li><b>D2</b>: real: /data/clevr" in page


def test_html_hides_code_and_stderr_but_keeps_errors_and_sets_the_title(tmp_path):
    import nbformat

    from idckit.reproduce.runner import to_html

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('x')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="progress 50%|#####"),
                    nbformat.v4.new_output("stream", name="stdout", text="a visible line"),
                    nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=["ValueError: boom"])]
    nb.cells = [cell]
    src = tmp_path / "t.ipynb"
    nbformat.write(nb, str(src))
    to_html(src, tmp_path / "t.html")
    html = (tmp_path / "t.html").read_text()
    assert "a visible line" in html and "boom" in html
    assert "progress 50%" not in html and "print(&#39;x&#39;)" not in html and "print('x')" not in html
    assert "<title>idckit: t</title>" in html


def test_index_status_tells_ran_from_learned(tmp_path):
    def row(variant, distinct, seed=0):
        return {"model": "m", "variant": variant, "split": "test", "seed": seed, "run": f"r{variant}{seed}",
                "metrics": {"CIDEr-D": 60.1}, "distinct_test_captions": distinct, "test_pairs": 400,
                "ci": {"CIDEr-D": 2.0}}

    base = {"model": "baseline (idckit)", "variant": "most frequent caption", "split": "test",
            "metrics": {"CIDEr-D": 40.0}}
    docs = {"collapsed": [row("full", 57), row("MLM", 1), base],
            "learned": [row("full", 57), row("full", 80, seed=1), base],
            "baselines": [{"model": "most frequent caption", "variant": "total", "split": "test", "metrics": {}}]}
    for name, rows in docs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "notebook": name, "table": "t", "headline": {"label": "CIDEr-D", "kit": 60.1}, "rows": rows,
            "provenance": {"profile": "cpu", "data": "synthetic: x", "seeds": [0], "wall_seconds": 60}}))
    (tmp_path / "status.json").write_text(json.dumps({"learned": {"status": "stale"}}))
    page = write_index(tmp_path).read_text()
    cells = {name: page.split(f'href="{name}.html"')[1].split("</tr>")[0] for name in docs}
    # the status is the headline run's (the first variant here): MLM's collapse is a side row's
    assert '<span class="learned">describes</span>' in cells["collapsed"]
    assert '<span class="learned">describes</span>' in cells["learned"]
    assert "CIDEr-D +20.1 against most frequent caption" in cells["learned"]
    assert "stale: last run failed" in cells["learned"] and "stale" not in cells["collapsed"]
    assert '<span class="ran">no training</span>' in cells["baselines"] and "collapsed" not in cells["baselines"]
    rows = [row("full", 57), row("full", 3, seed=1)]
    (tmp_path / "collapsed.json").write_text(json.dumps({
        "notebook": "collapsed", "table": "t", "headline": {"label": "CIDEr-D", "kit": 60.1}, "rows": rows,
        "provenance": {"profile": "cpu", "data": "synthetic: x", "seeds": [0, 1], "wall_seconds": 60}}))
    page = write_index(tmp_path).read_text()
    cell = page.split('href="collapsed.html"')[1].split("</tr>")[0]
    assert '<span class="flag">collapsed</span>' in cell and "fewest 3 (full, seed 1)" in cell
    assert "fewer than 10" in page          # the legend states the rule with the kit's own threshold
    assert all(f"<i>{w}</i>" in page for w in STATUSES)   # and every status word, once


@pytest.mark.slow
def test_status_keeps_what_another_reproduce_recorded_meanwhile(tmp_path):
    nbs, reports = tmp_path / "nbs", tmp_path / "reports"
    nbs.mkdir()
    # while this notebook runs, "another process" records its own notebook in the shared status file
    _notebook(nbs / "good.ipynb", GOOD + '''
status = pathlib.Path(report_dir).parents[1] / "status.json"   # report_dir is <reports>/<staging of this pid>/good
status.write_text(json.dumps({"other": {"status": "ok", "seconds": 1.0}}))
''')
    out = reproduce(profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    assert [o.ok for o in out] == [True]
    status = json.loads((reports / "status.json").read_text())
    assert status["other"] == {"status": "ok", "seconds": 1.0} and status["good"]["status"] == "ok"
