"""The status rules on hand-made rows: only the headline run counts, a tie is named, retrieval needs 10x chance."""
from __future__ import annotations

from idckit.reports.card import summary
from idckit.reports.stats import bootstrap_halfwidth, compare, ordering_notes, standing, tie_best
from idckit.reports.status import hard_status, headline_rows, report_status


def _cap(variant, distinct, seed=0, judge=None, model="IDC-PCL (idckit)", cider=60.0, **kw):
    row = {"model": model, "variant": variant, "split": "test", "seed": seed, "run": f"r-{variant}-{seed}",
           "metrics": {"CIDEr-D": cider}, "distinct_test_captions": distinct, "test_pairs": 400, **kw}
    return row if judge is None else {**row, "judge_accuracy": judge}


def _base(variant, distinct, cider):
    return {"model": "baseline (idckit)", "variant": variant, "split": "test", "metrics": {"CIDEr-D": cider},
            "distinct_test_captions": distinct, "test_pairs": 400}


def test_a_baseline_row_never_sets_the_status():
    # the most-frequent-paragraph baseline writes one sentence by design: the report is not "collapsed" for it
    doc = {"headline": {"label": "IDC-PCL CIDEr-D", "kit": 60.0, "runs": {"variants": ["IDC-PCL"]}},
           "rows": [_cap("IDC-PCL", 57), _base("most frequent paragraph", 1, 20.0)]}
    assert report_status(doc).verdict == "learned"
    assert report_status({"rows": [_base("most frequent", 1, 20.0)]}).verdict == "no training"


def test_a_side_row_and_a_hard_row_never_set_the_status_but_hard_gets_its_own():
    rows = [_cap("full", 55, judge=0.99), _cap("MLM", 1, judge=0.50),
            _cap("full [hard data]", 36, judge=0.53, data="synthetic: hard")]
    doc = {"headline": {"label": "CIDEr-D", "kit": 60.0, "runs": {"variants": ["full"]}}, "rows": rows}
    assert [r["variant"] for r in headline_rows(doc)] == ["full"]
    assert report_status(doc).verdict == "learned"
    hard = hard_status(doc)
    assert hard.verdict == "not learned" and "judge accuracy 0.53" in hard.detail
    # without a named run: the variant the label names, else the "(full)" one, else the first
    doc2 = {"headline": {"label": "full model CIDEr-D"}, "rows": [_cap("w/o pre-training", 3),
                                                                  _cap("MLM + MVCL + FDA (full)", 55)]}
    assert report_status(doc2).verdict == "learned"
    doc3 = {"headline": {"label": "CLIP4IDC CIDEr-D"}, "rows": [_cap("CLIP-FT", 80), _cap("CLIP4IDC", 1)]}
    assert report_status(doc3).verdict == "collapsed"


def test_collapse_is_read_per_seed_not_from_the_mean_row():
    rows = [_cap("full", 57), _cap("full", 3, seed=1), {**_cap("full", 3, seed="mean"), "n_seeds": 2}]
    st = report_status({"headline": {"runs": "full"}, "rows": rows})
    assert st.verdict == "collapsed" and st.flag and "1 of 2 seed run(s)" in st.detail and "seed 1" in st.detail


def _retr(r1, chance, seed=0, variant="adapted (9/3)"):
    return {"model": "CLIP4IDC (idckit)", "variant": variant, "split": "test", "seed": seed,
            "metrics": {"t2p_R@1": r1}, **({"chance": {"t2p_R@1": chance}} if chance else {})}


def test_retrieval_learns_only_at_ten_times_chance_and_above_the_unadapted_control():
    def doc(adapted, before):
        return {"headline": {"label": "R@1", "runs": "adapted (9/3)"},
                "rows": [_retr(adapted, 0.125), _retr(before, None, variant="before adaptation (9/3, fresh)")]}

    three_x = report_status(doc(0.4, 0.48))
    assert three_x.verdict == "not learned" and "3.2x chance" in three_x.detail
    assert report_status(doc(1.3, 0.48)).verdict == "learned"          # 10.4x chance, above 0.48
    below = report_status(doc(1.3, 1.5))                               # 10x chance but not above the control
    assert below.verdict == "not learned" and "not above the un-adapted 1.5" in below.detail


def test_a_tie_break_is_named_a_tie():
    best, tied = tie_best({"6/6": 0.1, "7/5": 0.1, "8/4": 0.04})
    assert best is None and tied == ["6/6", "7/5"]
    assert tie_best({"6/6": 5.0, "9/3": 9.0}) == ("9/3", ["9/3"])
    assert tie_best({"6/6": 5.0, "9/3": 9.0}, {"9/3": 6.0})[0] is None  # a gap within the seed sd is a tie


def test_an_ordering_needs_a_gap_beyond_the_noise():
    a = {"variant": "full", "seed": "mean", "n_seeds": 3, "metrics": {"CIDEr-D": 80.0}, "sd": {"CIDEr-D": 6.0}}
    b = {"variant": "MLM", "seed": "mean", "n_seeds": 3, "metrics": {"CIDEr-D": 76.0}, "sd": {"CIDEr-D": 2.0}}
    o = compare(a, b, "CIDEr-D")
    assert o.order == 0 and o.noise == 6.0 and "within noise" in o.words()
    assert compare({**a, "metrics": {"CIDEr-D": 90.0}}, b, "CIDEr-D").order == 1
    one = {"variant": "x", "seed": 0, "metrics": {"CIDEr-D": 70.0}, "ci": {"CIDEr-D": 1.5}}
    o1 = compare(one, {"variant": "baseline", "metrics": {"CIDEr-D": 64.0}}, "CIDEr-D")
    assert o1.order == 1 and "bootstrap" in o1.how
    notes = ordering_notes([a, b], {"full": 128.9, "MLM": 110.0})
    assert notes == ["within noise: full is within noise of MLM on CIDEr-D: gap +4.0 against a noise of 6.0 "
                     "(seed sd over 3 seeds); the paper has 128.9 vs 110.0."]
    assert ordering_notes([{**a, "metrics": {"CIDEr-D": 60.0}}, b], {"full": 128.9, "MLM": 110.0})[0].startswith(
        "differs")
    assert standing(one, [{"variant": "DUDA", "metrics": {"CIDEr-D": 96.6}}], "CIDEr-D")[0].startswith(
        "x is below DUDA")


def test_bootstrap_halfwidth_shrinks_with_more_pairs_and_is_zero_without_spread():
    assert bootstrap_halfwidth([5.0] * 50) == 0.0
    small = bootstrap_halfwidth([0.0, 100.0] * 20)
    large = bootstrap_halfwidth([0.0, 100.0] * 500)
    assert 10 < small < 25 and large < small / 4


def test_the_card_puts_the_baseline_beside_a_collapsed_headline():
    rows = [_cap("CLIP4IDC", 1, seed=s, cider=c) for s, c in ((0, 63.6), (1, 64.0), (2, 63.9))]
    rows.append({**_cap("CLIP4IDC", 1, seed="mean", cider=63.83), "n_seeds": 3, "sd": {"CIDEr-D": 0.21}})
    rows.append(_base("most frequent caption", 1, 64.0))
    doc = {"notebook": "t", "table": "clip4idc.table1", "title": "T1",
           "headline": {"label": "CLIP4IDC CIDEr-D, test total", "kit": 63.83, "paper": 150.7, "metric": "CIDEr-D",
                        "runs": "CLIP4IDC"}, "rows": rows, "provenance": {"seeds": [0, 1, 2]}}
    s = summary(doc)
    assert s.kit_text() == "63.8 ± 0.2" and s.baseline_text() == "64.0 (most frequent caption)"
    assert s.status.verdict == "collapsed"
    assert s.verdict.startswith("collapsed: writes one sentence; equals the baseline (63.8 vs 64.0")
    assert s.seeds_text() == "3 seeds (0, 1, 2), mean ± sd"


def test_with_card_goes_under_the_title_once_and_keeps_a_card_shown_in_the_body():
    from idckit.reports.card import Card, with_card

    doc = {"notebook": "t", "table": "pcl.table2", "title": "T2", "headline": {"label": "CIDEr-D", "kit": 1.0},
           "rows": [_base("most frequent caption", 1, 64.0)], "provenance": {"seeds": [0]}}
    page = f"<html><body><h1>Title</h1><p>prose</p>{Card(doc)._repr_html_()}</body></html>"
    once = with_card(page, doc)
    assert once.index("</h1>") < once.index("id=idckit-card") < once.index("prose")
    assert with_card(once, doc) == once                       # re-rendering replaces, never stacks
    assert once.count("class='idckit-card'") == 2             # the page's card and the one the body shows


def test_a_per_type_headline_is_compared_with_its_baseline_without_claiming_noise():
    rows = [{**_cap("full", 1), "metrics": {"color": 0.0, "move": 0.0}}]
    doc = {"notebook": "t3", "table": "pcl.table3", "title": "T3", "rows": rows, "provenance": {"seeds": [0]},
           "headline": {"label": "mean of the types", "kit": 0.0, "metric": "CIDEr-D", "runs": "full",
                        "baseline": {"label": "nearest pixel difference", "kit": 2.08}}}
    assert summary(doc).verdict == ("collapsed: writes one sentence; below the baseline (0.0 vs 2.1; one seed, "
                                    "no spread measured).")
