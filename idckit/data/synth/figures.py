"""Sample figures of a dataset: pairs with every reference sentence (the README's pictures of the synthetic sets)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from idckit.data.clevr_change import Pair, load_image


def pairs_with_references(pairs: Sequence[Pair], *, title: str | None = None, max_refs: int = 5,
                          width: float = 11.0):
    """One row per pair: before | after | its references (all annotators pooled), wrapped."""
    import matplotlib.pyplot as plt

    pairs = list(pairs)
    fig, axes = plt.subplots(len(pairs), 3, figsize=(width, 2.5 * len(pairs)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1, 1.5]})
    for row, p in zip(axes, pairs):
        for ax, path, label in ((row[0], p.before, "before"), (row[1], p.after, "after")):
            ax.imshow(load_image(path))
            ax.set_title(f"{p.pair_id}  {label}", fontsize=8)
            ax.set_axis_off()
        refs = list(p.captions[:max_refs]) + ([f"(+{len(p.captions) - max_refs} more)"]
                                               if len(p.captions) > max_refs else [])
        text = "\n".join(textwrap.fill(f"- {r}", 48, subsequent_indent="  ") for r in refs)
        row[2].text(0.0, 0.5, text, fontsize=8, va="center", ha="left", transform=row[2].transAxes)
        row[2].set_axis_off()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save_sample(root: str | Path, out: str | Path, *, dataset: str, split: str = "test", n: int = 4,
                dpi: int = 72) -> Path:
    """Draw ``n`` evenly spaced pairs of ``split`` of a Spot-the-Diff or IER root and save the figure as PNG."""
    import matplotlib.pyplot as plt

    from idckit import fileio

    if dataset == "spot-the-diff":
        from idckit.data.spot_the_diff import SpotTheDiff as Loader
        name = "Spot-the-Diff"
    elif dataset == "editing-request":
        from idckit.data.editing_request import EditingRequest as Loader
        name = "Image-Editing-Request"
    else:
        raise ValueError(f"unknown dataset {dataset!r} (spot-the-diff or editing-request)")
    root = Path(root)
    pairs = Loader(root).pairs(split)
    step = max(1, len(pairs) // n)
    synthetic = (root / "synth_info.json").is_file()
    fig = pairs_with_references(pairs[::step][:n], title=f"{'synthetic ' if synthetic else ''}{name}, {split} pairs "
                                                         "and their references")
    with fileio.atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    plt.close(fig)
    return Path(out)
