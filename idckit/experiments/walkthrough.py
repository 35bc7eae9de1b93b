"""The walkthrough notebook's calls: the data, its counts, the no-learning baselines scored per change type, and
what the notebook teaches with numbers it computes (never typed): the two pipelines, what CIDEr-D rewards, why a
no-change sentence scores what it scores, how to read a report's status."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR, ClevrChange, split_counts
from idckit.data.images import load_image
from idckit.eval import describes
from idckit.eval.baselines import JudgeOracle, MostFrequentCaption, NearestDifference
from idckit.eval.captions import evaluate_pairs
from idckit.experiments.data import DataChoice, clevr_change
from idckit.paths import DEFAULT_PROFILE
from idckit.reports.format import Notes, Table
from idckit.reports.report import Provenance, to_paper_scale
from idckit.reports.status import STATUSES

SUBSETS = ("total", "semantic", DISTRACTOR, *CHANGE_TYPES)
#: baselines that read the test pair's true label: scored beside the others, never the headline
ORACLES = (JudgeOracle.name,)


@dataclass
class WalkthroughResult:
    data: DataChoice
    dataset: ClevrChange
    counts: dict
    predictions: dict[str, dict[str, str]] = field(default_factory=dict)
    breakdowns: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # model -> subset -> metrics
    describes: dict[str, dict] = field(default_factory=dict)                          # model -> describes.score
    identical_distractors: float = 0.0   # share of test distractors whose two images are pixel-identical
    wall_seconds: float = 0.0

    def rows(self, split: str = "test") -> list[dict]:
        """Report rows on the papers' x100 scale: one per baseline and subset."""
        return [{"model": model, "variant": subset, "split": split, "metrics": to_paper_scale(m),
                 **({"describes": self.describes[model]} if subset == "total" and model in self.describes else {})}
                for model, bd in self.breakdowns.items() for subset, m in bd.items()]

    def headline(self) -> dict:
        fair = [m for m in self.breakdowns if m not in ORACLES]
        best = max(fair, key=lambda m: self.breakdowns[m]["total"]["CIDEr-D"])
        return {"label": f"best baseline CIDEr-D, test total ({best})",
                "kit": round(100 * self.breakdowns[best]["total"]["CIDEr-D"], 2), "paper": None, "metric": "CIDEr-D"}

    def table(self, metric: str = "CIDEr-D") -> Table:
        """Baselines (rows) by subset (columns), ``metric`` x100."""
        recs = [{"baseline": model, **{s: 100 * bd[s][metric] for s in SUBSETS if s in bd}}
                for model, bd in self.breakdowns.items()]
        return Table(recs, ["baseline", *[s for s in SUBSETS if any(s in r for r in recs)]],
                     caption=f"{metric} (x100) on test: baselines (rows) by subset (columns)")

    def describes_table(self) -> Table:
        recs = [{"baseline": m, **{k: d.get(k) for k in ("type_named", "type_chance", "attributes_named",
                                                           "attributes_chance")}} for m, d in self.describes.items()]
        return Table(recs, ["baseline", "type_named", "type_chance", "attributes_named", "attributes_chance"],
                     caption="Does the caption name the change? % of the changed test pairs")

    def counts_table(self) -> Table:
        splits = list(self.counts)
        types = [t for t in (*CHANGE_TYPES, DISTRACTOR) if any(t in self.counts[s] for s in splits)]
        return Table([{"type": t, **{s: self.counts[s].get(t, 0) for s in splits}} for t in types],
                     ["type", *splits], caption="Pairs per change type (rows) and split (columns)")


def _identical(pair) -> bool:
    return bool(np.array_equal(np.asarray(load_image(pair.before)), np.asarray(load_image(pair.after))))


def run(profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *, split: str = "test",
        meteor: bool = True, device: str | None = None) -> WalkthroughResult:
    """The no-learning baselines on ``split``. ``device`` is accepted like every notebook entry point's, and unused:
    the baselines run no model."""
    t0 = time.time()
    data = clevr_change(profile, data_root)
    ds = data.dataset()
    res = WalkthroughResult(data, ds, split_counts(ds))
    train, test = ds.pairs("train"), ds.pairs(split)
    refs, types = ds.references(split), ds.types(split)
    records = describes.change_records(test, data.root)
    for baseline in (MostFrequentCaption(), NearestDifference(), JudgeOracle()):
        preds = baseline.fit(train).predict(test)
        res.predictions[baseline.name] = preds
        res.breakdowns[baseline.name] = evaluate_pairs(refs, preds, types, meteor=meteor)
        if records:
            res.describes[baseline.name] = describes.score(preds, records, refs)
    distractors = [p for p in test if not p.is_change]
    res.identical_distractors = sum(map(_identical, distractors)) / max(1, len(distractors))
    res.wall_seconds = time.time() - t0
    return res


def distractor_note(res: WalkthroughResult) -> Notes:
    """What a distractor is on this data, measured: pixel-identical (jitter 0) or a camera / lamp jitter."""
    share = 100 * res.identical_distractors
    if share == 100:
        text = ("Every test distractor here is pixel-identical to its before image (this data's camera and lamp "
                "jitter are 0): its references say \"no change\", and nothing in the pixels moves.")
    elif share == 0:
        text = ("No test distractor here is pixel-identical: each re-renders the scene with a small camera and lamp "
                "jitter, so pixels move although no object changed.")
    else:
        text = f"{share:.0f} % of the test distractors are pixel-identical to their before image; the others jitter."
    return Notes([text])


def cider_story(res: WalkthroughResult) -> Notes:
    """Why the no-change sentence scores what it scores, in this run's numbers."""
    mf = res.breakdowns[MostFrequentCaption.name]
    caption = next(iter(res.predictions[MostFrequentCaption.name].values()))
    n_change = sum(res.counts.get("test", {}).get(t, 0) for t in CHANGE_TYPES)
    n_dis = res.counts.get("test", {}).get(DISTRACTOR, 0)
    c = {s: 100 * mf[s]["CIDEr-D"] for s in ("total", "semantic", DISTRACTOR) if s in mf}
    out = [f"The most frequent training caption is \"{caption}\". Written for every test pair it scores CIDEr-D "
           f"{c.get(DISTRACTOR, float('nan')):.1f} on the {n_dis} distractors, {c.get('semantic', float('nan')):.1f} "
           f"on the {n_change} changed pairs and {c['total']:.1f} on all of them."]
    out.append("CIDEr-D weighs each n-gram by how rare it is among the subset's references (TF-IDF) and rewards a "
               "caption whose n-grams the pair's own references share. The distractors' references repeat a handful "
               "of no-change sentences, so one of those sentences matches them almost word for word; on the changed "
               "pairs it shares nearly nothing, and the total is scored as one corpus over both halves, so it lands "
               "between the two.")
    if JudgeOracle.name in res.breakdowns:
        j = 100 * res.breakdowns[JudgeOracle.name]["total"]["CIDEr-D"]
        out.append(f"A perfect change / no-change judge that writes just two sentences (the judge oracle) scores "
                   f"{j:.1f} total: a model's total CIDEr-D near these numbers says it tells a change from no change, "
                   "not that it describes the change. The semantic CIDEr-D and the change-type rate below say that.")
    return Notes(out, title="What CIDEr-D rewards, in this run's numbers")


def status_legend() -> Table:
    """What each status word on a report's card means (:data:`idckit.reports.status.STATUSES`, in the order the
    rules try them)."""
    return Table([*({"status": w, "meaning": m} for w, m in STATUSES.items()),
                  {"status": "hard data", "meaning": "the same model on CLEVR-Change's own jitter, its own status"}],
                 ["status", "meaning"], caption="Status words on a report's card (the headline run's only; only "
                                                "describes and retrieves are green)")


def pipeline_figure():
    """The two pipelines the kit reproduces, drawn as boxes and arrows."""
    rows = {
        "IDC-PCL (Yao et al. 2022)": [
            ("before / after\nimages", "#ddd"),
            ("grid features\n(ResNet-101; stand-in:\nEfficientNet-Lite0)", "#e8f0e0"),
            ("image difference\nencoder\n(before, after, after-before)", "#dbe8f6"),
            ("cross-modal\ntransformer\n(image + words)", "#dbe8f6"),
            ("caption\n+ change / no-change\njudge", "#f6e6d0")],
        "CLIP4IDC (Guo et al. 2022)": [
            ("before / after\nimages", "#ddd"), ("CLIP ViT\nintra-image layers\n(each image alone)", "#e8f0e0"),
            ("inter-image layers\n(both images' tokens\ntogether)", "#dbe8f6"),
            ("transformer\ncaptioner", "#dbe8f6"), ("caption", "#f6e6d0")]}
    notes = {"IDC-PCL (Yao et al. 2022)": "pre-training: MLM + MVCL + FDA on pairs and hard negative captions, "
                                          "then fine-tuning to caption",
             "CLIP4IDC (Guo et al. 2022)": "adaptation: the encoder first learns to retrieve a pair's caption "
                                           "(pair <-> text contrastive), then the captioner is trained on it"}
    fig, ax = plt.subplots(figsize=(13, 4.6))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 4.6)
    ax.set_axis_off()
    for r, (name, boxes) in enumerate(rows.items()):
        y = 3.0 - 2.3 * r
        ax.text(0.05, y + 1.05, name, fontsize=11, fontweight="bold")
        for i, (label, color) in enumerate(boxes):
            x = 0.1 + i * 2.6
            ax.add_patch(FancyBboxPatch((x, y - 0.45), 2.0, 1.15, boxstyle="round,pad=0.05", fc=color, ec="#555"))
            ax.text(x + 1.0, y + 0.12, label, ha="center", va="center", fontsize=8.5)
            if i:
                ax.add_patch(FancyArrowPatch((x - 0.55, y + 0.12), (x - 0.05, y + 0.12), arrowstyle="-|>",
                                             mutation_scale=14, color="#333"))
        ax.text(2.7, y - 0.75, notes[name], fontsize=8.5, style="italic", color="#333")
    fig.suptitle("The two pipelines the kit reproduces")
    fig.tight_layout()
    return fig


def provenance(res: WalkthroughResult, profile: str) -> Provenance:
    return Provenance(profile=profile, data=res.data.description, data_version=res.data.version,
                      backbone="none (pixels)", weights="none", seeds=[0], selection_split="none (no training)",
                      wall_seconds=round(res.wall_seconds, 1))
