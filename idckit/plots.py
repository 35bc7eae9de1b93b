"""Plots the notebooks share (matplotlib/seaborn), so notebooks stay a parameters cell and a few calls."""
from __future__ import annotations

from typing import Mapping, Sequence

from idckit.data.clevr_change import Pair, load_image


def show_pairs(pairs: Sequence[Pair], *, n: int = 4, predictions: Mapping[str, str] | None = None,
               width: float = 11.0):
    """A grid: one row per pair, before | after, with its change type and first reference (and a prediction)."""
    import matplotlib.pyplot as plt

    pairs = list(pairs)[:n]
    fig, axes = plt.subplots(len(pairs), 2, figsize=(width, 2.6 * len(pairs)), squeeze=False)
    for row, p in zip(axes, pairs):
        for ax, path, label in ((row[0], p.before, "before"), (row[1], p.after, "after")):
            ax.imshow(load_image(path))
            ax.set_axis_off()
            ax.set_title(f"{p.pair_id}  {label}", fontsize=9)
        text = f"[{p.change_type}] {p.captions[0]}"
        if predictions and p.pair_id in predictions:
            text += f"\npredicted: {predictions[p.pair_id]}"
        row[1].text(1.03, 0.5, text, transform=row[1].transAxes, fontsize=9, va="center", wrap=True)
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
