"""Honest baselines that any IDC model must beat, scored through the same evaluator as the models.

- :class:`MostFrequentCaption` (language only): predicts the single most frequent training caption for every
  pair. It sees no image at all, so it measures how much the caption distribution alone is worth.
- :class:`NearestDifference` (nearest neighbour): represents a pair by its downsampled pixel difference
  |after - before| and copies a caption of the training pair whose difference is most similar (cosine). It
  sees the images but has no notion of objects, and a camera jitter moves every pixel, so it shows what raw
  pixel comparison can and cannot do. A zero difference (a pixel-identical distractor) has no direction to compare,
  so it gets the no-change caption of the training pairs whose difference is zero as well.
- :class:`JudgeOracle` (a perfect judge that cannot describe): the true change / no-change label of the pair, then
  the most frequent training caption of that kind. What "tells a change from no change" alone is worth.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from idckit.data.clevr_change import DISTRACTOR, Pair
from idckit.data.images import load_image

#: below this (max |after - before| in [0, 1]) a pair's two images count as identical
ZERO_DIFFERENCE = 1e-6


class MostFrequentCaption:
    name = "most frequent caption"

    def fit(self, train_pairs: Sequence[Pair]) -> "MostFrequentCaption":
        counts = Counter(c for p in train_pairs for c in p.captions)
        if not counts:
            raise ValueError("no training captions to count")
        # Ties broken alphabetically so the baseline is deterministic.
        self.caption = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        return self

    def predict(self, pairs: Sequence[Pair]) -> dict[str, str]:
        return {p.pair_id: self.caption for p in pairs}


def difference_vector(pair: Pair, size: tuple[int, int] = (48, 32)) -> np.ndarray:
    """L2-normalised, mean-centred |after - before| at a small resolution (RGB, float32); all zeros for two
    identical images (nothing to normalise)."""
    before = np.asarray(load_image(pair.before).resize(size), dtype=np.float32)
    after = np.asarray(load_image(pair.after).resize(size), dtype=np.float32)
    d = np.abs(after - before).ravel() / 255.0
    if d.max() <= ZERO_DIFFERENCE:
        return np.zeros_like(d)
    d -= d.mean()
    return d / (np.linalg.norm(d) + 1e-8)


def _most_frequent(captions) -> str | None:
    counts = Counter(captions)
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else None


@dataclass
class NearestDifference:
    size: tuple[int, int] = (48, 32)
    name: str = "nearest pixel difference"
    _bank: np.ndarray | None = field(default=None, repr=False)
    _captions: list[str] = field(default_factory=list, repr=False)

    def _vectors(self, pairs: Sequence[Pair], desc: str) -> np.ndarray:
        return np.stack([difference_vector(p, self.size) for p in tqdm(pairs, desc=desc, leave=False)])

    _zero_caption: str | None = field(default=None, repr=False)

    def fit(self, train_pairs: Sequence[Pair]) -> "NearestDifference":
        self._bank = self._vectors(train_pairs, "baseline: train differences")
        # The copied caption is the pair's most typical reference: the one sharing most words with the others.
        self._captions = [_central_caption(p.captions) for p in train_pairs]
        zero = ~self._bank.any(axis=1)
        # a zero difference matches nothing by cosine (argmax would return training pair 0): it gets the most
        # frequent reference of the zero-difference training pairs, else of the training distractors
        self._zero_caption = (_most_frequent(c for p, z in zip(train_pairs, zero) if z for c in p.captions)
                              or _most_frequent(c for p in train_pairs if p.change_type == DISTRACTOR
                                                for c in p.captions))
        return self

    def predict(self, pairs: Sequence[Pair]) -> dict[str, str]:
        if self._bank is None:
            raise RuntimeError("call fit() first")
        q = self._vectors(pairs, "baseline: test differences")
        nearest = (q @ self._bank.T).argmax(axis=1)
        zero = ~q.any(axis=1)
        return {p.pair_id: (self._zero_caption if z and self._zero_caption is not None else self._captions[j])
                for p, j, z in zip(pairs, nearest, zero)}


class JudgeOracle:
    """The true change / no-change label, then the most frequent training caption of that kind: a perfect
    distractor judge that writes two sentences."""
    name = "judge oracle"

    def fit(self, train_pairs: Sequence[Pair]) -> "JudgeOracle":
        self.change = _most_frequent(c for p in train_pairs if p.is_change for c in p.captions)
        self.no_change = _most_frequent(c for p in train_pairs if not p.is_change for c in p.captions)
        if self.change is None or self.no_change is None:
            raise ValueError("the judge oracle needs training pairs of both kinds (changed and distractor)")
        return self

    def predict(self, pairs: Sequence[Pair]) -> dict[str, str]:
        return {p.pair_id: self.change if p.is_change else self.no_change for p in pairs}


def _central_caption(captions: Sequence[str]) -> str:
    bags = [set(c.split()) for c in captions]

    def overlap(i: int) -> float:
        return sum(len(bags[i] & b) / max(1, len(bags[i] | b)) for j, b in enumerate(bags) if j != i)

    return captions[max(range(len(captions)), key=lambda i: (overlap(i), -i))]


def most_frequent(references: Mapping[str, Sequence[str]]) -> str:
    """The most frequent reference over all pairs (ties broken alphabetically): the text-only baseline."""
    counts = Counter(c for refs in references.values() for c in refs)
    if not counts:
        raise ValueError("no training captions to count")
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


@dataclass
class NearestFeaturePair:
    """Copies the most typical reference of the training pair nearest in grid features (cosine over the
    mean-pooled features of image 1 and of image 2, concatenated): a pair model that sees both images but
    composes nothing."""
    name: str = "nearest neighbour (features of both images)"
    _bank: np.ndarray | None = field(default=None, repr=False)
    _captions: list[str] = field(default_factory=list, repr=False)

    @staticmethod
    def _vectors(f1, f2) -> np.ndarray:
        v = np.concatenate([np.asarray(f1, dtype=np.float32).mean(1), np.asarray(f2, dtype=np.float32).mean(1)], 1)
        v -= v.mean(1, keepdims=True)
        return v / (np.linalg.norm(v, axis=1, keepdims=True) + 1e-8)

    def fit(self, f1, f2, references: Sequence[Sequence[str]]) -> "NearestFeaturePair":
        """``f1``, ``f2`` [N, regions, dim] features of the training pairs; ``references`` their references."""
        self._bank = self._vectors(f1, f2)
        self._captions = [_central_caption(list(r)) for r in references]
        return self

    def predict(self, f1, f2, pair_ids: Sequence[str]) -> dict[str, str]:
        nearest = (self._vectors(f1, f2) @ self._bank.T).argmax(1)
        return {pid: self._captions[int(j)] for pid, j in zip(pair_ids, nearest)}
