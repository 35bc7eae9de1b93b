"""Every number the README table, the index and the cards print equals the report JSON's raw value after exactly
one rounding, and all three say the one status (:func:`idckit.reports.status.report_status`); on reports built
here, not on the committed reports/ folder."""
from __future__ import annotations

import json
import re
from html import unescape

import pytest

from idckit.reports.card import card_html, summary
from idckit.reports.format import fmt
from idckit.reports.index import render
from idckit.reports.readme import render_results
from idckit.reports.report import read_report, write_report
from idckit.reports.stats import attach_per_pair
from idckit.reports.status import report_status

# raw values whose 2-decimal headline (63.85, 89.15) rounds to another 1-decimal number than the raw value does
RAW_MEAN, RAW_SD, RAW_BASE = 63.846, 0.3149, 89.146


def _run(variant, seed, cider, *, distinct=300, **kw):
    return {"model": "CLIP4IDC (idckit)", "variant": variant, "split": "test", "subset": "total", "seed": seed,
            "run": f"r-{variant}-{seed}", "metrics": {"CIDEr-D": cider, "ROUGE_L": 50.0 + cider / 10},
            "distinct_test_captions": distinct, "test_pairs": 1600, **kw}


def _base(variant, cider, distinct=700):
    return {"model": "baseline (idckit)", "variant": variant, "split": "test", "subset": "total",
            "metrics": {"CIDEr-D": cider, "ROUGE_L": 55.0}, "distinct_test_captions": distinct, "test_pairs": 1600}


def _prov(seeds):
    return {"profile": "cpu", "data": "synthetic: SynthCLEVR-Change (test)", "data_version": "1",
            "backbone": "b", "weights": "w", "seeds": list(seeds), "selection_split": "val", "commit": "abc1234567",
            "wall_seconds": 1130.0, "train_seconds": 1000.0}


def _three_seeds():
    """A three-seed headline (mean 63.846, sd 0.3149) under a 2-decimal headline, beside its baseline."""
    seeds = [_run("CLIP4IDC", s, c) for s, c in ((0, 63.5), (1, 64.2), (2, 63.838))]
    mean = {**_run("CLIP4IDC", "mean", RAW_MEAN), "n_seeds": 3, "sd": {"CIDEr-D": RAW_SD, "ROUGE_L": 0.1}}
    rows = [*seeds, mean, _base("nearest pixel difference", RAW_BASE), _base("most frequent caption", 64.02, 1)]
    head = {"label": "CLIP4IDC CIDEr-D, test total (mean over seeds)", "kit": round(RAW_MEAN, 2), "paper": 150.7,
            "metric": "CIDEr-D", "runs": {"variants": ["CLIP4IDC"]},
            "baseline": {"label": "nearest pixel difference", "kit": round(RAW_BASE, 2)}}
    return "three_seeds", "clip4idc.table1", rows, head, (0, 1, 2)


def _per_type_three_seeds():
    """A per-type headline (a mean over types, no row's metric) of three seeds: no noise is claimed for it, and
    nothing says "one seed"."""
    types = ("color", "move")
    rows = [{**_run("CLIP4IDC", s, 0.0), "metrics": {"color": 0.1 + s / 10, "move": 0.2}} for s in (0, 1, 2)]
    rows.append({**_run("CLIP4IDC", "mean", 0.0), "metrics": {"color": 0.2, "move": 0.2}, "n_seeds": 3,
                 "sd": {"color": 0.1, "move": 0.0}})
    rows.append({**_base("nearest pixel difference", 0.0), "metrics": {"color": 30.146, "move": 20.146}})
    head = {"label": "CLIP4IDC CIDEr-D, mean of the change types", "kit": 0.2, "paper": 91.0, "metric": "CIDEr-D",
            "runs": {"variants": ["CLIP4IDC"]}, "baseline": {"label": "nearest pixel difference",
                                                              "kit": round((30.146 + 20.146) / len(types), 2)}}
    return "per_type", "clip4idc.table2", rows, head, (0, 1, 2)


def _one_seed_paired():
    """A one-seed headline with per-pair scores on the same pairs as its baselines: the paired test orders it."""
    run = _run("IDC-PCL", 0, 0.0)
    base = _base("nearest neighbour", 0.0)
    attach_per_pair(run, {f"p{i:04d}": 45.0 + (i % 7) for i in range(1600)}, "CIDEr-D")
    attach_per_pair(base, {f"p{i:04d}": 40.0 + (i % 5) for i in range(1600)}, "CIDEr-D")
    run["metrics"]["CIDEr-D"], base["metrics"]["CIDEr-D"] = 47.846, 41.996
    head = {"label": "IDC-PCL CIDEr-D, test", "kit": round(47.846, 2), "paper": 48.4, "metric": "CIDEr-D",
            "runs": {"variants": ["IDC-PCL"]}, "baseline": {"label": "nearest neighbour", "kit": round(41.996, 2)}}
    return "one_seed", "pcl.table1", [run, base], head, (0,)


BUILDERS = (_three_seeds, _per_type_three_seeds, _one_seed_paired)


@pytest.fixture
def reports(tmp_path):
    out = tmp_path / "reports"
    for build in BUILDERS:
        name, table, rows, head, seeds = build()
        notes = ["CLIP4IDC is above nearest pixel difference on CIDEr-D: gap +1.0 against a noise of 0.5.",
                 "agrees: CLIP4IDC is above nearest pixel difference on CIDEr-D: gap +1.0 against a noise of 0.5; "
                 "the paper has 1.0 vs 0.0.", "A note said twice.", "A note said twice."]
        write_report(out, name, table, rows, _prov(seeds), headline=head, notes=notes)
    return out


def _raw_row(doc):
    """The JSON's own row behind the headline: the mean row of a multi-seed run, else its one seed."""
    runs = [r for r in doc["rows"] if r.get("seed") is not None]
    return next((r for r in runs if r["seed"] == "mean"), runs[0])


def _expected(doc):
    """What every page must print, computed from the raw JSON values by one rounding each."""
    head, metric = doc["headline"], doc["headline"]["metric"]
    row = _raw_row(doc)
    if metric in row["metrics"]:
        kit = f"{row['metrics'][metric]:.1f}"
        if row.get("seed") == "mean":
            kit += f" ± {row['sd'][metric]:.1f}"
    else:                               # a mean over types is no row's number: the headline's own value
        kit = f"{head['kit']:.1f}"
    base_row = next(r for r in doc["rows"] if r["variant"] == head["baseline"]["label"])
    base = f"{base_row['metrics'][metric]:.1f}" if metric in base_row["metrics"] else f"{head['baseline']['kit']:.1f}"
    return {"kit": kit, "baseline": base, "paper": f"{head['paper']:.1f}", "status": report_status(doc).verdict}


def _readme(report_dir):
    rows = {}
    for line in render_results(report_dir).splitlines():
        m = re.match(r"\| \[([^\]]+)\]", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[m.group(1)] = {"kit": cells[2], "baseline": cells[3].split(" (")[0], "paper": cells[4],
                                "status": cells[5]}
    return rows


def _index(report_dir):
    page = render(report_dir)
    out = {}
    for m in re.finditer(r'<tr><td class="c-report"><a href="([^"]+)\.html">.*?</tr>', page, re.DOTALL):
        cells = {k: unescape(re.sub(r"<[^>]+>", " ", v)).split()
                 for k, v in re.findall(r'<td class="c-([a-z-]+)">(.*?)</td>', m.group(0), re.DOTALL)}
        out[m.group(1)] = {"kit": " ".join(cells["idckit"]), "baseline": cells["no-learning"][0],
                           "paper": " ".join(cells["paper"]), "status": cells["status"][0]}
    return out


def _card(doc):
    page = unescape(card_html(doc))
    big = re.findall(r"<td class='big'>(.*?)</td>", page)
    status = re.search(r"<th>status</th><td><span class='[a-z]+'>([^<]+)</span>", page).group(1)
    return {"kit": big[0], "baseline": big[1].split(" (")[0], "paper": big[2], "status": status}, page


def test_the_readme_the_index_and_the_cards_print_the_json_rounded_once(reports):
    readme, index = _readme(reports), _index(reports)
    docs = [read_report(p) for p in sorted(reports.glob("*.json"))]
    assert len(docs) == len(BUILDERS)
    for doc in docs:
        nb, want = doc["notebook"], _expected(doc)
        card, page = _card(doc)
        for where, got in (("README", readme[nb]), ("index", index[nb]), ("card", card)):
            got = dict(got)
            if where == "index":    # the index's status cell is the word alone, its first word the same
                assert want["status"].startswith(got.pop("status")), (nb, where)
                got["status"] = want["status"]
            assert got == want, f"{nb}: the {where} prints {got}, the JSON rounded once is {want}"
        # the verdict reads the same numbers the table prints
        s = summary(doc)
        assert f"({want['kit'].split(' ± ')[0]} vs {want['baseline']};" in s.verdict or s.status.verdict in (
            "no training", "not checked"), s.verdict


def test_the_double_rounding_the_headline_would_cause_is_not_printed(reports):
    doc = read_report(reports / "three_seeds.json")
    assert fmt(doc["headline"]["kit"], "CIDEr-D") == "63.9"          # 63.85, itself rounded: a second rounding
    assert summary(doc).kit_text() == "63.8 ± 0.3" == _readme(reports)["three_seeds"]["kit"]
    assert _readme(reports)["three_seeds"]["baseline"] == "89.1"       # not 89.15's "89.2"


def test_a_verdict_never_says_one_seed_of_a_three_seed_run(reports):
    for name in ("three_seeds", "per_type"):
        doc = read_report(reports / f"{name}.json")
        card = _card(doc)[1]
        assert "one seed" not in card and "3 seeds (0, 1, 2), mean ± sd" in card, name
    assert "one seed" in _card(read_report(reports / "one_seed.json"))[1]


def test_each_card_states_its_test_set_and_notes_are_said_once(reports):
    for jp in sorted(reports.glob("*.json")):
        doc = read_report(jp)
        assert "; test set: 1600 pairs" in _card(doc)[1], jp.name
        notes = json.loads(jp.read_text())["notes"]
        assert notes.count("A note said twice.") == 1
        assert not any(n.startswith("CLIP4IDC is above nearest pixel difference") for n in notes)
        assert any(n.startswith("agrees: CLIP4IDC is above") for n in notes)


def test_the_status_is_the_one_function_s_on_every_page(reports):
    readme, index = _readme(reports), _index(reports)
    seen = set()
    for jp in sorted(reports.glob("*.json")):
        doc = read_report(jp)
        st = report_status(doc)
        seen.add(st.verdict)
        assert readme[doc["notebook"]]["status"] == st.verdict == _card(doc)[0]["status"]
        assert st.verdict.startswith(index[doc["notebook"]]["status"])
    # the three builders cover a green and a grey status: the paired one-seed run describes, the others do not
    assert report_status(read_report(reports / "one_seed.json")).verdict == "describes"
    assert report_status(read_report(reports / "three_seeds.json")).verdict == "below baseline"
    assert len(seen) >= 2


def test_a_retrieval_card_states_its_test_set_from_its_chance_rate():
    from idckit.reports.card import test_set_text

    row = {"model": "CLIP4IDC (idckit)", "variant": "adapted (9/3)", "split": "test", "seed": 0,
           "metrics": {"t2p_R@1": 0.46}, "chance": {"t2p_R@1": 100 / 800}}
    assert test_set_text({"headline": {"runs": "adapted (9/3)"}, "rows": [row]}) == "; test set: 800 pairs"
