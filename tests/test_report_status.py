"""The status rules on hand-made rows: only the headline run counts, each of the six statuses, a tie is named,
retrieval needs 10x chance; an ordering needs a paired bootstrap over the test pairs."""
from __future__ import annotations

import random

import pytest

from idckit.reports.card import status_class, summary
from idckit.reports.stats import (attach_per_pair, bootstrap_halfwidth, compare, ordering_notes, paper_agreement,
                                  per_pair_values, standing, tie_best)
from idckit.reports.status import GREEN, STATUSES, Status, hard_status, headline_rows, report_status, type_named


def _cap(variant, distinct, seed=0, judge=None, model="IDC-PCL (idckit)", cider=60.0, **kw):
    row = {"model": model, "variant": variant, "split": "test", "seed": seed, "run": f"r-{variant}-{seed}",
           "metrics": {"CIDEr-D": cider}, "distinct_test_captions": distinct, "test_pairs": 400, **kw}
    return row if judge is None else {**row, "judge_accuracy": judge}


def _base(variant, distinct, cider):
    return {"model": "baseline (idckit)", "variant": variant, "split": "test", "metrics": {"CIDEr-D": cider},
            "distinct_test_captions": distinct, "test_pairs": 400}


def _pp(row, scores, metric="CIDEr-D"):
    """``row`` with per-pair scores on the test pairs p0, p1, ... and its metric their mean."""
    attach_per_pair(row, {f"p{i:04d}": v for i, v in enumerate(scores)}, metric)
    vals = per_pair_values(row, metric)
    row["metrics"] = {**row.get("metrics", {}), metric: sum(vals) / len(vals)}
    return row


CI = {"CIDEr-D": 2.0}


def test_a_baseline_row_never_sets_the_status():
    # the most-frequent-paragraph baseline writes one sentence by design: the report is not "collapsed" for it
    doc = {"headline": {"label": "IDC-PCL CIDEr-D", "kit": 60.0, "runs": {"variants": ["IDC-PCL"]}},
           "rows": [_cap("IDC-PCL", 57, ci=CI), _base("most frequent paragraph", 1, 20.0)]}
    assert report_status(doc).verdict == "describes"
    assert report_status({"rows": [_base("most frequent", 1, 20.0)]}).verdict == "no training"


def test_a_side_row_and_a_hard_row_never_set_the_status_but_hard_gets_its_own():
    rows = [_cap("full", 55, judge=0.99, ci=CI), _cap("MLM", 1, judge=0.50),
            _cap("full [hard data]", 36, judge=0.53, data="synthetic: hard"), _base("most frequent caption", 1, 40.0)]
    doc = {"headline": {"label": "CIDEr-D", "kit": 60.0, "runs": {"variants": ["full"]}}, "rows": rows}
    assert [r["variant"] for r in headline_rows(doc)] == ["full"]
    assert report_status(doc).verdict == "describes"
    hard = hard_status(doc)
    assert hard.verdict == "not learned" and "judge accuracy 0.53" in hard.detail
    # without a named run: the variant the label names, else the "(full)" one, else the first
    doc2 = {"headline": {"label": "full model CIDEr-D"}, "rows": [_cap("w/o pre-training", 3),
                                                                  _cap("MLM + MVCL + FDA (full)", 55)]}
    assert report_status(doc2).verdict == "not checked"          # nothing to read it against
    assert "no no-learning baseline" in report_status(doc2).detail
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
    assert report_status(doc(1.3, 0.48)).verdict == "retrieves"        # 10.4x chance, above 0.48
    below = report_status(doc(1.3, 1.5))                               # 10x chance but not above the control
    assert below.verdict == "not learned" and "not above the un-adapted 1.5" in below.detail


def test_a_tie_break_is_named_a_tie():
    best, tied = tie_best({"6/6": 0.1, "7/5": 0.1, "8/4": 0.04}, {"6/6": 0.01})
    assert best is None and tied == ["6/6", "7/5"]
    assert tie_best({"6/6": 5.0, "9/3": 9.0}, {"9/3": 1.0}) == ("9/3", ["9/3"])
    assert tie_best({"6/6": 5.0, "9/3": 9.0}, {"9/3": 6.0})[0] is None  # a gap within the seed sd is a tie
    assert tie_best({"6/6": 5.0, "9/3": 9.0}) == (None, ["6/6", "9/3"])  # no noise measured: no ordering at all


def _pair_rows(n=400, shift=0.0, spread=30.0, seed=0, **kw):
    """Two one-seed rows on the same n test pairs: b's per-pair scores are a's plus ``shift`` plus small noise."""
    rng = random.Random(seed)
    base = [rng.uniform(0, 2 * spread) for _ in range(n)]
    a = _pp({"variant": "full", "seed": 0, **kw.get("a", {})}, base)
    b = _pp({"variant": "MLM", "seed": 0, **kw.get("b", {})}, [v + shift + rng.gauss(0, 5.0) for v in base])
    return a, b


def test_an_ordering_needs_a_gap_beyond_the_paired_noise():
    a, b = _pair_rows(shift=-3.0)                     # MLM 3 below on every pair: a paired test sees it
    o = compare(a, b, "CIDEr-D")
    assert o.tested and o.order == 1 and "paired 95 % bootstrap over 400 test pairs" in o.how
    assert "one seed: no seed spread" in o.how
    # the same gap read against each row's own (unpaired) interval would be within noise: pairing is what orders it
    assert o.noise < bootstrap_halfwidth(per_pair_values(a, "CIDEr-D"))
    assert paper_agreement(o, 128.9 - 110.0) == "agrees" and paper_agreement(o, -1.0) == "differs"


def test_two_models_that_differ_within_the_noise_are_not_ordered():
    a, b = _pair_rows(shift=-0.2)                     # 0.2 apart against per-pair noise of 5: within noise
    o = compare(a, b, "CIDEr-D")
    assert o.tested and o.order == 0 and "within noise" in o.words()
    assert paper_agreement(o, 18.9) == "within noise"
    notes = ordering_notes([a, b], {"full": 128.9, "MLM": 110.0})
    assert len(notes) == 1 and notes[0].startswith("within noise: full is within noise of MLM on CIDEr-D")


def test_the_seed_spread_joins_the_paired_noise():
    a, b = _pair_rows(shift=-3.0)
    paired = compare(a, b, "CIDEr-D")
    a_mean = {**a, "seed": "mean", "n_seeds": 3, "sd": {"CIDEr-D": 6.0}}
    o = compare(a_mean, b, "CIDEr-D")
    assert o.order == 0 and o.noise == pytest.approx((paired.noise ** 2 + 36.0) ** 0.5)
    assert "seed sd over 3 seeds" in o.how


def test_no_ordering_without_paired_scores_at_zero_noise_or_for_a_collapsed_row():
    a = {"variant": "full", "seed": "mean", "n_seeds": 3, "metrics": {"CIDEr-D": 90.0}, "sd": {"CIDEr-D": 1.0}}
    b = {"variant": "MLM", "seed": "mean", "n_seeds": 3, "metrics": {"CIDEr-D": 60.0}, "sd": {"CIDEr-D": 1.0}}
    o = compare(a, b, "CIDEr-D")                      # 30 apart, but no per-pair scores: not a paired test
    assert not o.tested and o.order == 0 and "no per-pair scores" in o.how
    assert o.words() == "full and MLM are not ordered on CIDEr-D (gap +30.0): no per-pair scores on the same test pairs"
    assert paper_agreement(o, 18.9) == "not ordered"
    assert ordering_notes([a, b], {"full": 128.9, "MLM": 110.0})[0].startswith("not ordered: ")
    # zero noise: identical per-pair scores on both rows, and one seed each
    same = _pp({"variant": "x", "seed": 0}, [10.0] * 50)
    other = _pp({"variant": "y", "seed": 0}, [30.0] * 50)
    z = compare(same, other, "CIDEr-D")
    assert not z.tested and z.how == "no noise measured" and z.order == 0
    # a collapsed trained row is never ordered, whatever the gap; a one-sentence baseline row still is
    x, y = _pair_rows(shift=-20.0)
    x.update(distinct_test_captions=1, test_pairs=400)
    c = compare(x, y, "CIDEr-D")
    assert not c.tested and "collapsed" in c.how
    y_base = {k: v for k, v in y.items() if k != "seed"}
    y_base.update(model="baseline (idckit)", distinct_test_captions=1, test_pairs=400)
    assert compare({**x, "distinct_test_captions": 300}, y_base, "CIDEr-D").order == 1
    # pairs on other test pairs are no pairs
    assert not compare(_pp({"variant": "a", "seed": 0}, [1.0, 2.0, 3.0]), y, "CIDEr-D").tested


def test_standing_reads_one_row_against_each_reference():
    a, b = _pair_rows(shift=-3.0)
    b = {**b, "variant": "DUDA"}
    assert standing(a, [b], "CIDEr-D")[0].startswith("full is above DUDA on CIDEr-D: gap +")


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
    assert s.verdict.startswith("collapsed: writes one sentence; not ordered against the baseline (63.8 vs 64.0; "
                                "CLIP4IDC collapsed")
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
    assert summary(doc).verdict == ("collapsed: writes one sentence; not ordered against the baseline (0.0 vs 2.1; "
                                    "no noise measured).")


def _clevr_doc(model_shift, *, judge=0.99, type_rate=45.0, oracle_shift=-13.0, distinct=300, seeds=(0,), sd=None):
    """A CLEVR-like report on 800 test pairs: the nearest-pixel baseline, the most frequent caption, the judge
    oracle (``oracle_shift`` from the baseline per pair) and the headline run (``model_shift`` from the baseline
    per pair, one row per seed and a mean row when several), each with per-pair CIDEr-D."""
    rng = random.Random(1)
    near = [rng.uniform(0, 180) for _ in range(800)]
    rows = [_pp({"model": "baseline (idckit)", "variant": "nearest pixel difference", "split": "test",
                 "distinct_test_captions": 700, "test_pairs": 800}, near),
            _pp({"model": "baseline (idckit)", "variant": "most frequent caption", "split": "test",
                 "distinct_test_captions": 1, "test_pairs": 800}, [v * 0.6 for v in near]),
            _pp({"model": "baseline (idckit)", "variant": "judge oracle", "split": "test", "distinct_test_captions": 2,
                 "test_pairs": 800}, [v + oracle_shift + rng.gauss(0, 3) for v in near])]
    desc = {"type_named": type_rate, "type_chance": 21.0, "changed_pairs": 400}
    runs = []
    for s in seeds:
        runs.append(_pp(_cap("full", distinct, seed=s, judge=judge, describes=desc),
                        [v + model_shift + rng.gauss(0, 3) for v in near]))
    rows += runs
    if len(seeds) > 1:
        mean = _pp({**_cap("full", distinct, seed="mean", describes=desc), "n_seeds": len(seeds),
                    "sd": {"CIDEr-D": sd}}, [sum(c) / len(c) for c in zip(*[per_pair_values(r, "CIDEr-D")
                                                                           for r in runs])])
        rows.append(mean)
    return {"notebook": "t", "table": "pcl.table2", "title": "T2", "rows": rows, "provenance": {"seeds": list(seeds)},
            "headline": {"label": "full CIDEr-D", "kit": 0.0, "metric": "CIDEr-D", "runs": {"variants": ["full"]},
                         "baseline": {"label": "nearest pixel difference", "kit": 0.0}}}


@pytest.mark.parametrize("verdict, kw", [
    ("describes", dict(model_shift=+10.0)),
    ("judges only", dict(model_shift=-13.0, type_rate=15.0)),          # at the judge oracle, type below chance
    ("judges only", dict(model_shift=+10.0, type_rate=21.5)),          # above the baseline, type at chance
    ("at baseline", dict(model_shift=0.0, judge=None)),
    ("at baseline", dict(model_shift=+10.0, judge=None, type_rate=21.5)),  # above it, but never names the type
    ("below baseline", dict(model_shift=-20.0, judge=None)),
    ("below baseline", dict(model_shift=-20.0, oracle_shift=+5.0)),     # a judge, but nowhere near the oracle
    ("collapsed", dict(model_shift=+10.0, distinct=1)),
    ("not learned", dict(model_shift=+10.0, judge=0.52)),
])
def test_each_status_from_hand_built_rows(verdict, kw):
    doc = _clevr_doc(**kw)
    st = report_status(doc)
    assert st.verdict == verdict, st.text()
    s = summary(doc)
    assert s.status == st and s.verdict.startswith(verdict + ":")
    assert (status_class(st) == "learned") == (verdict in GREEN)       # only describes (retrieves) is green
    assert st.flag == (verdict in ("collapsed", "not learned", "below baseline"))


def test_describes_reads_the_paired_test_and_three_seeds():
    st = report_status(_clevr_doc(+10.0, seeds=(0, 1, 2), sd=1.0))
    assert st.verdict == "describes"
    assert "paired 95 % bootstrap over 800 test pairs and seed sd over 3 seeds" in st.detail
    # the same mean gap with a seed spread larger than it: not shown above the baseline
    assert report_status(_clevr_doc(+10.0, seeds=(0, 1, 2), sd=12.0)).verdict == "at baseline"


def test_the_change_type_must_beat_chance_beyond_a_binomial_margin():
    rows = [{"describes": {"type_named": 23.5, "type_chance": 21.0, "changed_pairs": 800}}]
    above, text = type_named(rows)
    assert above is False and "margin 2.8" in text            # 1.96 x sqrt(.21 x .79 / 800) = 2.8 points
    assert type_named([{"describes": {"type_named": 24.0, "type_chance": 21.0, "changed_pairs": 8000}}])[0] is True
    assert type_named([{"metrics": {}}]) == (None, "")
    spread = [{"describes": {"type_named": t, "type_chance": 21.0, "changed_pairs": 8000}} for t in (18.0, 30.0)]
    assert type_named(spread)[0] is False                     # the seed sd (8.5) swamps the 3-point gain


def test_every_status_word_is_documented_and_only_green_ones_are_green():
    for word in STATUSES:
        assert (status_class(Status(word)) == "learned") == (word in GREEN)
    assert set(GREEN) == {"describes", "retrieves"}


def test_an_ordering_names_its_metric_as_a_reader_does():
    a, b = _pair_rows(shift=-3.0)
    for r in (a, b):
        r["per_pair"]["ROUGE_L"] = r["per_pair"].pop("CIDEr-D")
        r["metrics"]["ROUGE_L"] = r["metrics"].pop("CIDEr-D")
    assert " on ROUGE-L: gap " in compare(a, b, "ROUGE_L").words()
    assert "ROUGE_L" not in compare(a, b, "ROUGE_L").words()
