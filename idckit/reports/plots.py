"""Plots the notebooks share (matplotlib/seaborn), so notebooks stay a parameters cell and a few calls.

Every function returns its matplotlib Figure (a notebook assigns it, ``fig = ...``, and the inline backend draws
it once); none returns an Axes, a FacetGrid or a Text, whose repr would otherwise print into the report.
"""
from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from idckit.data.clevr_change import Pair
from idckit.data.images import load_image
from idckit.errors import ConfigError
from idckit.reports.format import Table, fmt, name


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
    captions_by_run`, in :mod:`idckit.experiments.analytics`); a caption equal to one of the references is marked.
    ``sides`` names the two images
    (Birds-to-Words: ``("animal1", "animal2")``)."""
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
    df = pd.DataFrame([{"split": s, "type": t, "pairs": n} for s, c in counts.items() for t, n in c.items()])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    sns.barplot(data=df, x="type", y="pairs", hue="split", ax=ax)
    ax.set_title("pairs per change type and split")
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def _legend_outside(ax, title: str | None = None) -> None:
    """The legend to the right of the axes, never over the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                  title=title)


def per_type_bars(df, *, title: str, value: str = "CIDEr-D", x: str = "type", hue: str = "model"):
    """Grouped bars of one metric per change type (tables 3 / CLIP4IDC table 2 style); ``title`` names the table
    and the dataset (every figure of a report has its own). ``df``: a DataFrame or records."""
    df = df if isinstance(df, pd.DataFrame) else pd.DataFrame(list(df))
    fig, ax = plt.subplots(figsize=(10, 3.6))
    sns.barplot(data=df, x=x, y=value, hue=hue, ax=ax)
    ax.set_title(title)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def val_curve(results: Sequence[Mapping[str, Any]], *, title: str):
    """Val CIDEr-D (x100) against training steps, one line per seed (steps, not minutes: seeds and machines stay
    comparable); returns (figure, the curve's table)."""
    recs = [{"seed": r["seed"], **h, "CIDEr-D": 100 * h["CIDEr-D"]} for r in results for h in r["history"]]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for seed in sorted({r["seed"] for r in recs}, key=str):
        pts = [r for r in recs if r["seed"] == seed]
        ax.plot([r["step"] for r in pts], [r["CIDEr-D"] for r in pts], marker="o", label=f"seed {seed}")
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("val CIDEr-D (x100)")
    ax.set_title(title)
    _legend_outside(ax)
    fig.tight_layout()
    cols = ["seed", "step", "minutes", "CIDEr-D"] + (["judge_accuracy"] if any("judge_accuracy" in r for r in recs)
                                                     else [])
    return fig, Table(recs, cols, caption="Val CIDEr-D (x100) at each evaluated step")


def seed_dots(results: Sequence[Mapping[str, Any]], labels: Sequence[str], baselines: Sequence[Mapping[str, Any]],
              paper: Mapping[str, Mapping[str, float]], *, metrics: Sequence[str] = ("ROUGE_L", "CIDEr-D"),
              title: str):
    """One panel per metric: each seed's test score as a dot per variant (``labels``), the baselines as grey lines,
    and the paper's number in the variant's tick label (its own scale: never a second axis on the kit's)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(12, 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, label in enumerate(labels):
            ys = [100 * r["test"]["total"][metric] for r in results if r["label"] == label]
            ax.scatter([i] * len(ys), ys, color="steelblue", label="a seed's run" if i == 0 else None)
        for b, style in zip(baselines, ("--", ":", "-.")):
            ax.axhline(100 * b["test"]["total"][metric], color="grey", linestyle=style, label=b["label"])
        ticks = [f"{lb}\n(paper {fmt(paper.get(lb, {}).get(metric))})" for lb in labels]
        ax.set_xticks(range(len(labels)), ticks, fontsize=8)
        ax.set_ylabel(f"{name(metric)} (x100), this run's data")
        ax.set_title(f"{name(metric)}")
    _legend_outside(axes[0][-1])
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def side_by_side_bars(kit: Mapping[str, float], paper: Mapping[str, float], order: Sequence[str], *,
                      title: str | None = None, value: str = "CIDEr-D", kit_label: str = "idckit (synthetic)",
                      paper_label: str = "paper (real CLEVR-Change)"):
    """Two panels of horizontal bars, the paper's rows and the kit's (each on its own axis: the scales differ);
    ``title`` names the table and the dataset."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(order) + 1.6), sharey=True)
    if title:
        fig.suptitle(title)
    for ax, source, values in ((axes[0], paper_label, paper), (axes[1], kit_label, kit)):
        ax.barh(range(len(order)), [values.get(o, float("nan")) for o in order], color="steelblue")
        ax.set_title(source)
        ax.set_xlabel(value)
    axes[0].set_yticks(range(len(order)), order)
    axes[0].invert_yaxis()
    fig.tight_layout()
    return fig


def retrieval_bars(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("t2p_R@1", "t2p_R@5", "p2t_R@1",
                                                                           "p2t_R@5"), *,
                   title: str = "test retrieval (%)"):
    """Grouped bars of retrieval R@K (%) per encoder row, the chance row (``model == "chance"``) among them;
    ``title`` names the dataset."""
    bars = pd.DataFrame([{"encoder": "chance" if r["model"] == "chance" else r["variant"].split(" (")[0],
                          "metric": name(k), "R@K": r["metrics"][k]} for r in rows for k in keys if k in r["metrics"]])
    fig, ax = plt.subplots(figsize=(9, 3.6))
    sns.barplot(data=bars, x="metric", y="R@K", hue="encoder", ax=ax, errorbar=None)
    ax.set_title(title)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def source_panels(points: Sequence[Mapping[str, Any]], *, x: str, metrics: Sequence[str], title: str):
    """One panel per (source, metric): the kit's and the paper's curves each on their own axis (their scales
    differ; never a second y axis on one panel). ``points``: ``{"source", x, metric: value, ...}``."""
    sources = list(dict.fromkeys(p["source"] for p in points))
    fig, axes = plt.subplots(len(sources), len(metrics), figsize=(5 * len(metrics), 2.8 * len(sources)),
                             squeeze=False)
    for i, src in enumerate(sources):
        pts = sorted((p for p in points if p["source"] == src), key=lambda p: p[x])
        for j, m in enumerate(metrics):
            ax = axes[i][j]
            ax.plot([p[x] for p in pts if m in p], [p[m] for p in pts if m in p], marker="o")
            ax.set_title(f"{src}: {name(m)}", fontsize=10)
            ax.set_xlabel(x)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

