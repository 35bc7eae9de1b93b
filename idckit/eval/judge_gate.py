"""The judge gate: a simulated distractor judge of known accuracy gating a run's real captions, to measure how much
of a CLEVR-Change score is the distractor decision.

Half the CLEVR-Change test pairs are distractors, and all their references say "no change" in a few words. A
captioner's total CIDEr-D therefore depends heavily on saying "no change" exactly when nothing changed. This
module measures that dependence on a run's own test captions. A simulated judge of accuracy ``p`` errs on a seeded
``round((1 - p) * n)`` of the pairs. A pair it calls a distractor gets one fixed no-change sentence (scripts use
the most frequent caption of the training distractors). A pair it calls a change keeps the captioner's caption.

At ``p = 1`` this is the captioner's ceiling with a perfect judge. The curve of total CIDEr-D against ``p`` says
which judge accuracy a given captioner needs to reach a target. Neither paper does this; it is an analysis of
which part of a run is missing, and every report that uses it says so.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from idckit.data.clevr_change import DISTRACTOR
from idckit.errors import ConfigError
from idckit.eval.captions import CaptionScorer, evaluate_pairs


def gate(captions: Mapping[str, str], types: Mapping[str, str], no_change: str, accuracy: float,
         seed: int = 0) -> dict[str, str]:
    """The captions a judge of ``accuracy`` would let through: 'no change' where it calls a distractor.

    The judge is wrong on exactly ``round((1 - accuracy) * n)`` pairs, drawn by ``seed`` from all pairs alike.
    """
    if not 0 <= accuracy <= 1:
        raise ConfigError(f"judge accuracy must be in [0, 1], got {accuracy}")
    ids = sorted(captions)
    missing = [k for k in ids if k not in types]
    if missing:
        raise ConfigError(f"{len(missing)} caption ids have no change type, e.g. {missing[:3]}")
    wrong = set(np.random.default_rng(seed).permutation(len(ids))[:round((1 - accuracy) * len(ids))].tolist())
    out = {}
    for i, k in enumerate(ids):
        says_change = (types[k] != DISTRACTOR) != (i in wrong)
        out[k] = captions[k] if says_change else no_change
    return out


def judge_curve(references: Mapping[str, Sequence[str]], captions: Mapping[str, str], types: Mapping[str, str],
                no_change: str, accuracies: Sequence[float], seeds: Sequence[int] = (0, 1, 2)) -> list[dict]:
    """CIDEr-D (total, semantic, distractor; pycocoevalcap's raw scale) of the gated captions per accuracy and seed.

    A perfect judge (accuracy 1) has no randomness, so it is scored once, as seed 0.
    """
    rows = []
    with CaptionScorer(meteor=False) as scorer:
        for p in accuracies:
            for seed in (seeds[:1] if p == 1 else seeds):
                scores = evaluate_pairs(references, gate(captions, types, no_change, p, seed), types,
                                        meteor=False, scorer=scorer)
                rows.append({"judge_accuracy": p, "seed": seed,
                             **{f"CIDEr-D_{sub}": scores[sub]["CIDEr-D"] for sub in ("total", "semantic", DISTRACTOR)
                                if sub in scores}})
    return rows
