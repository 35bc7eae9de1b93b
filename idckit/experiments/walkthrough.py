"""The walkthrough notebook's one call: data, counts, and the two baselines scored per change type."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from idckit.baselines import MostFrequentCaption, NearestDifference
from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR, ClevrChange, split_counts
from idckit.experiments.data import DataChoice, clevr_change
from idckit.paths import DEFAULT_PROFILE
from idckit.report import Provenance, to_paper_scale

SUBSETS = ("total", "semantic", DISTRACTOR, *CHANGE_TYPES)


@dataclass
class WalkthroughResult:
    data: DataChoice
    dataset: ClevrChange
    counts: dict
    predictions: dict[str, dict[str, str]] = field(default_factory=dict)
    breakdowns: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # model -> subset -> metrics
    wall_seconds: float = 0.0

    def rows(self, split: str = "test") -> list[dict]:
        """Report rows on the papers' x100 scale: one per baseline and subset."""
        return [{"model": model, "variant": subset, "split": split, "metrics": to_paper_scale(m)}
                for model, bd in self.breakdowns.items() for subset, m in bd.items()]

    def headline(self) -> dict:
        best = max(self.breakdowns, key=lambda m: self.breakdowns[m]["total"]["CIDEr-D"])
        return {"label": f"best baseline CIDEr-D, test total ({best})",
                "kit": round(100 * self.breakdowns[best]["total"]["CIDEr-D"], 2), "paper": None}

    def table(self, metric: str = "CIDEr-D"):
        import pandas as pd

        df = pd.DataFrame({model: {s: 100 * bd[s][metric] for s in SUBSETS if s in bd}
                           for model, bd in self.breakdowns.items()}).T
        return df.round(1)


def run(profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *, split: str = "test",
        meteor: bool = True, device: str | None = None) -> WalkthroughResult:
    """The text-only baselines on ``split``. ``device`` is accepted like every notebook entry point's, and unused:
    the baselines run no model."""
    from idckit.eval.captions import evaluate_pairs

    t0 = time.time()
    data = clevr_change(profile, data_root)
    ds = data.dataset()
    res = WalkthroughResult(data, ds, split_counts(ds))
    train, test = ds.pairs("train"), ds.pairs(split)
    refs, types = ds.references(split), ds.types(split)
    for baseline in (MostFrequentCaption(), NearestDifference()):
        preds = baseline.fit(train).predict(test)
        res.predictions[baseline.name] = preds
        res.breakdowns[baseline.name] = evaluate_pairs(refs, preds, types, meteor=meteor)
    res.wall_seconds = time.time() - t0
    return res


def provenance(res: WalkthroughResult, profile: str) -> Provenance:
    return Provenance(profile=profile, data=res.data.description, data_version=res.data.version,
                      backbone="none (pixels)", weights="none", seeds=[0], selection_split="none (no training)",
                      wall_seconds=round(res.wall_seconds, 1))
