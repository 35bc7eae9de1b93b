"""The shared plots: example pairs spread over change types with references and every model's caption."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from idckit.data.clevr_change import ClevrChange  # noqa: E402
from idckit.reports.plots import pick_pairs, show_pairs  # noqa: E402


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


def _history(seed, steps):
    return {"seed": seed, "history": [{"step": s, "minutes": 0.1 * s * (seed + 1), "CIDEr-D": 0.01 * s}
                                      for s in steps]}


def test_val_curve_is_drawn_against_steps_with_the_legend_outside():
    import matplotlib.pyplot as plt

    from idckit.reports.plots import val_curve

    fig, table = val_curve([_history(0, [100, 200]), _history(1, [100, 200])], title="IDC-PCL val, SynthCLEVR")
    try:
        ax = fig.get_axes()[0]
        assert ax.get_xlabel() == "fine-tuning step" and ax.get_title() == "IDC-PCL val, SynthCLEVR"
        assert [list(line.get_xdata()) for line in ax.get_lines()] == [[100, 200], [100, 200]]  # not minutes
        legend = ax.get_legend()
        fig.canvas.draw()
        box = legend.get_window_extent()
        assert box.x0 >= ax.get_window_extent().x1                     # right of the axes, not over the data
        assert table.cells()[1] == ["0", "200", "20.0", "200.0"]          # CIDEr-D on the x100 scale
    finally:
        plt.close(fig)


def test_seed_dots_put_the_paper_in_the_ticks_not_on_a_second_axis():
    import matplotlib.pyplot as plt

    from idckit.reports.plots import seed_dots

    results = [{"label": lb, "seed": s, "test": {"total": {"ROUGE_L": 0.4 + 0.01 * s, "CIDEr-D": 0.2}}}
               for lb in ("B2W", "B2W + CUB") for s in (0, 1)]
    base = [{"label": "most frequent paragraph", "test": {"total": {"ROUGE_L": 0.3, "CIDEr-D": 0.05}}}]
    fig = seed_dots(results, ["B2W", "B2W + CUB"], base, {"B2W": {"ROUGE_L": 48.4, "CIDEr-D": 24.0}},
                    title="Table 5, SynthBirds")
    try:
        axes = fig.get_axes()
        assert len(axes) == 2                                          # one per metric, no twin axes
        ticks = [t.get_text() for t in axes[0].get_xticklabels()]
        assert ticks == ["B2W\n(paper 48.4)", "B2W + CUB\n(paper –)"]
        assert fig._suptitle.get_text() == "Table 5, SynthBirds"
    finally:
        plt.close(fig)
