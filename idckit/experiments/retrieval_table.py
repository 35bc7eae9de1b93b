"""CLIP4IDC's table 6 (retrieval after adaptation) per dataset: the adapted encoder beside the same encoder before
adaptation, plain CLIP and chance, the paper's row, and whether adaptation raised R@1 beyond the noise of a
proportion measured on this many test pairs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from idckit.experiments import clip4idc, reporting
from idckit.experiments.yardsticks import dataset_title
from idckit.reports.format import Table, comparison
from idckit.reports.plots import retrieval_bars
from idckit.reports.report import paper_rows

#: the paper's columns of each dataset's rows
PAPER_KEYS = {"clevr-change": reporting.RETRIEVAL_KEYS,
              "spot-the-diff": ("t2p_R@10", "t2p_R@20", "t2p_R@50", "p2t_R@10", "p2t_R@20", "p2t_R@50"),
              "editing-request": ("t2p_R@1", "t2p_R@5", "t2p_R@10", "p2t_R@1", "p2t_R@5", "p2t_R@10")}


def r1_noise(r1: float, n_pairs: int) -> float:
    """95 % half-width (percentage points) of an R@1 of ``r1`` % measured on ``n_pairs`` queries (a proportion)."""
    p = min(max(r1 / 100.0, 0.0), 1.0)
    return 196.0 * math.sqrt(max(p * (1 - p), 1.0 / n_pairs) / n_pairs)


def adaptation_verdict(adapted: Sequence[dict[str, Any]], n_pairs: int, dataset: str = "") -> str:
    """Did adaptation raise text->pair R@1 over the un-adapted encoder (and plain CLIP), beyond the noise?"""
    parts = []
    for a in adapted:
        r1, before, plain = a["test"]["t2p_R@1"], a["test_unadapted"]["t2p_R@1"], a["test_plain_clip"]["t2p_R@1"]
        noise = max(r1_noise(r1, n_pairs), r1_noise(before, n_pairs))
        gap = r1 - before
        word = "raised" if gap > noise else "lowered" if -gap > noise else "did not change (within noise)"
        parts.append(f"seed {a['seed']}: adaptation {word} text->pair R@1 over the un-adapted encoder: {r1:.1f} vs "
                     f"{before:.1f} ({gap:+.1f}, noise {noise:.1f} on {n_pairs} test pairs); plain CLIP {plain:.1f}")
    return (f"{dataset}: " if dataset else "") + "; ".join(parts) + "."


@dataclass
class RetrievalTable:
    name: str
    setup: Any
    adapted: list
    rows: list
    n_pairs: int

    @property
    def title(self) -> str:
        return dataset_title(self.setup.data)

    def comparison(self) -> Table:
        paper = paper_rows("clip4idc.table6", dataset=self.name)
        return comparison(self.rows, paper, PAPER_KEYS[self.name],
                          caption=f"Table 6 ({self.title}): test retrieval, R@K in %, ranks 1-based; last row chance")

    def bars(self, seed):
        keys = [k for k in PAPER_KEYS[self.name] if k.endswith(("R@1", "R@5", "R@10", "R@20", "R@50"))][:4]
        return retrieval_bars([r for r in self.rows if r.get("seed") in (seed, None)], keys=keys,
                              title=f"Table 6, {self.title}: test R@K (%) before and after adaptation, and chance")

    def history(self) -> Table:
        recs = [{"seed": a["seed"], **h} for a in self.adapted for h in a["history"]]
        cols = ["seed", *[k for k in (recs[0] if recs else {}) if k != "seed"]]
        return Table(recs, cols, caption=f"Val retrieval during adaptation ({self.title})")

    def verdict(self) -> str:
        return adaptation_verdict(self.adapted, self.n_pairs, self.title)


def build(profile: str, root, name: str, seeds: Sequence[int], **setup_args) -> RetrievalTable:
    """Adapt (or read the cached adaptation of) the encoder on dataset ``name`` and make its rows (each with the
    chance of a random ranking; rows of a dataset other than CLEVR-Change carry ``dataset``)."""
    s = clip4idc.setup(profile, root, dataset=name, **setup_args)
    adapted = clip4idc.runs(s, ["adapt"], seeds)
    n_pairs = clip4idc.test_pairs_retrieved(s)
    rows = reporting.retrieval_rows(adapted, n_pairs=n_pairs, keys=clip4idc.retrieval_keys(s))
    if name != "clevr-change":
        rows = [{**r, "dataset": name} for r in rows]
    return RetrievalTable(name, s, adapted, rows, n_pairs)


__all__ = ["PAPER_KEYS", "r1_noise", "adaptation_verdict", "RetrievalTable", "build"]
