"""The shared plots: example pairs spread over change types with references and every model's caption."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from idckit.data.clevr_change import ClevrChange  # noqa: E402
from idckit.plots import pick_pairs, show_pairs  # noqa: E402


def test_pick_pairs_spreads_over_change_types(tiny_clevr):
    pairs = ClevrChange(tiny_clevr).pairs("test")          # drop, distractor, material, distractor
    assert [p.change_type for p in pairs[:2]] == ["drop", "distractor"]
    picked = pick_pairs(pairs, 3)
    assert [p.change_type for p in picked] == ["distractor", "drop", "material"]
    assert len(pick_pairs(pairs, 10)) == len(pairs)        # never more than there are


def test_show_pairs_prints_references_and_each_models_caption(tiny_clevr):
    import matplotlib.pyplot as plt

    pairs = ClevrChange(tiny_clevr).pairs("test")
    drop = next(p for p in pairs if p.change_type == "drop")
    captions = {"IDC-PCL, seed 0": {drop.pair_id: "the tiny gray ball is gone"}, "collapsed": {drop.pair_id: ""},
                "most frequent caption": {p.pair_id: "nothing has changed" for p in pairs}}
    fig = show_pairs(pairs, n=2, captions=captions, references=1)
    try:
        axes = fig.get_axes()
        assert len(axes) == 6                               # 2 pairs x (before, after, text)
        assert [ax.get_title() for ax in axes[:2]] == [f"{pairs[1].pair_id}  before", f"{pairs[1].pair_id}  after"]
        text = "\n".join(t.get_text() for ax in axes for t in ax.texts)
        assert "[drop]  references:" in text and "  - the small gray rubber sphere is missing" in text
        assert "collapsed: (empty caption)" in text            # an empty caption is said, not left blank
        assert "(+1 more)" in text                           # the second reference is counted, not shown
        assert "IDC-PCL, seed 0: the tiny gray ball is gone  (= a reference)" in text
        assert "most frequent caption: nothing has changed  (= a reference)" in text   # right for the distractor
        assert text.endswith("most frequent caption: nothing has changed")             # and not for the drop
    finally:
        plt.close(fig)
