"""Plots the notebooks share (matplotlib/seaborn), so notebooks stay a parameters cell and a few calls.

Every function returns its matplotlib Figure (a notebook assigns it, ``fig = ...``, and the inline backend draws
it once); none returns an Axes, a FacetGrid or a Text, whose repr would otherwise print into the report.
"""
from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

from idckit.data.clevr_change import Pair, load_image
from idckit.errors import ConfigError


def pick_pairs(pairs: Sequence[Pair], n: int = 4) -> list[Pair]:
    """``n`` pairs spread over the change types (one of each in turn, in the data's order), so a handful of examples
    shows semantic changes and distractors alike instead of the first few pairs of one kind."""
    by_type: dict[str, list[Pair]] = {}
    for p in pairs:
        by_type.setdefault(p.change_type, []).append(p)
    out: list[Pair] = []
    queues = [list(v) for _, v in sorted(by_type.items())]
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def _caption_text(p: Pair, captions: Mapping[str, Mapping[str, str]] | None, references: int, width: int) -> str:
    refs = [c.strip().lower() for c in p.captions]
    lines = [f"[{p.change_type}]  references:"]
    lines += [textwrap.fill(f"  - {c}", width, subsequent_indent="    ") for c in p.captions[:references]]
    if len(p.captions) > references:
        lines.append(f"    (+{len(p.captions) - references} more)")
    for model, preds in (captions or {}).items():
        if p.pair_id in preds:
            said = preds[p.pair_id]
            mark = "  (= a reference)" if said.strip().lower() in refs else ""
            lines.append(textwrap.fill(f"{model}: {said.strip() or '(empty caption)'}{mark}", width,
                                       subsequent_indent="    "))
    return "\n".join(lines)


def show_pairs(pairs: Sequence[Pair], *, n: int = 4, captions: Mapping[str, Mapping[str, str]] | None = None,
               references: int = 2, width: float = 13.0, sides: tuple[str, str] = ("before", "after")):
    """A grid, one row per pair (:func:`pick_pairs`): before | after | its change type, references and what each
    model said. ``captions`` = ``{model label: {pair id: caption}}`` (e.g. :func:`idckit.experiments.runs.
    captions_by_run`); a caption equal to one of the references is marked. ``sides`` names the two images
    (Birds-to-Words: ``("animal1", "animal2")``)."""
    import matplotlib.pyplot as plt

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:   # the walkthrough's n_show parameter
        raise ConfigError(f"the number of pairs to show must be an integer >= 1, got {n!r}",
                          fix="pass e.g. n_show=4")
    shown = pick_pairs(pairs, n)
    texts = [_caption_text(p, captions, references, 70) for p in shown]
    heights = [max(2.3, 0.2 * t.count("\n") + 0.6) for t in texts]
    fig, axes = plt.subplots(len(shown), 3, figsize=(width, sum(heights)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1, 1.9], "height_ratios": heights})
    for row, p, text in zip(axes, shown, texts):
        for ax, path, label in ((row[0], p.before, sides[0]), (row[1], p.after, sides[1])):
            ax.imshow(load_image(path))
            ax.set_axis_off()
            ax.set_title(f"{p.pair_id}  {label}", fontsize=9)
        row[2].set_axis_off()
        row[2].text(0.0, 0.5, text, transform=row[2].transAxes, fontsize=9, va="center", family="monospace")
    fig.tight_layout()
    return fig


def change_type_counts(counts: Mapping[str, Mapping[str, int]]):
    """Bar plot of pairs per change type, one hue per split."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    df = pd.DataFrame([{"split": s, "type": t, "pairs": n} for s, c in counts.items() for t, n in c.items()])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    sns.barplot(data=df, x="type", y="pairs", hue="split", ax=ax)
    ax.set_title("pairs per change type")
    fig.tight_layout()
    return fig


def per_type_bars(df, *, value: str = "CIDEr-D", x: str = "type", hue: str = "model", title: str | None = None):
    """Grouped bars of one metric per change type (tables 3 / CLIP4IDC table 2 style)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(9, 3.6))
    sns.barplot(data=df, x=x, y=value, hue=hue, ax=ax)
    ax.set_title(title or f"{value} by change type")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def val_curve(results: Sequence[Mapping[str, Any]], *, title: str):
    """Val CIDEr-D (x100) against minutes of training, one line per seed; returns (figure, the curve's table)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    curve = pd.DataFrame([{**h, "seed": r["seed"]} for r in results for h in r["history"]])
    curve["CIDEr-D"] *= 100
    fig, ax = plt.subplots(figsize=(7, 3.4))
    sns.lineplot(data=curve, x="minutes", y="CIDEr-D", hue="seed", marker="o", ax=ax)
    ax.set_title(title)
    fig.tight_layout()
    return fig, curve


def side_by_side_bars(kit: Mapping[str, float], paper: Mapping[str, float], order: Sequence[str], *,
                      value: str = "CIDEr-D", kit_label: str = "idckit (synthetic)",
                      paper_label: str = "paper (real CLEVR-Change)"):
    """Two panels of horizontal bars, the paper's rows and the kit's (each on its own axis: the scales differ)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(order) + 1.4), sharey=True)
    for ax, source, values in ((axes[0], paper_label, paper), (axes[1], kit_label, kit)):
        ax.barh(range(len(order)), [values.get(o, float("nan")) for o in order], color="steelblue")
        ax.set_title(source)
        ax.set_xlabel(value)
    axes[0].set_yticks(range(len(order)), order)
    axes[0].invert_yaxis()
    fig.tight_layout()
    return fig


def retrieval_bars(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("t2p_R@1", "t2p_R@5", "p2t_R@1",
                                                                           "p2t_R@5")):
    """Grouped bars of retrieval R@K (%) per encoder row, the chance row (``model == "chance"``) among them."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    bars = pd.DataFrame([{"encoder": "chance" if r["model"] == "chance" else r["variant"].split(" (")[0],
                          "metric": k, "R@K": r["metrics"][k]} for r in rows for k in keys if k in r["metrics"]])
    fig, ax = plt.subplots(figsize=(9, 3.6))
    sns.barplot(data=bars, x="metric", y="R@K", hue="encoder", ax=ax, errorbar=None)
    ax.set_title("test retrieval (%)")
    fig.tight_layout()
    return fig
