"""Two honest baselines that any IDC model must beat, scored through the same evaluator as the models.

- :class:`MostFrequentCaption` (language only): predicts the single most frequent training caption for every
  pair. It sees no image at all, so it measures how much the caption distribution alone is worth.
- :class:`NearestDifference` (nearest neighbour): represents a pair by its downsampled pixel difference
  |after - before| and copies a caption of the training pair whose difference is most similar (cosine). It
  sees the images but has no notion of objects, and a camera jitter moves every pixel, so it shows what raw
  pixel comparison can and cannot do.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from idckit.data.clevr_change import Pair, load_image


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
    """L2-normalised, mean-centred |after - before| at a small resolution (RGB, float32)."""
    before = np.asarray(load_image(pair.before).resize(size), dtype=np.float32)
    after = np.asarray(load_image(pair.after).resize(size), dtype=np.float32)
    d = np.abs(after - before).ravel() / 255.0
    d -= d.mean()
    return d / (np.linalg.norm(d) + 1e-8)


@dataclass
class NearestDifference:
    size: tuple[int, int] = (48, 32)
    name: str = "nearest pixel difference"
    _bank: np.ndarray | None = field(default=None, repr=False)
    _captions: list[str] = field(default_factory=list, repr=False)

    def _vectors(self, pairs: Sequence[Pair], desc: str) -> np.ndarray:
        from tqdm.auto import tqdm

        return np.stack([difference_vector(p, self.size) for p in tqdm(pairs, desc=desc, leave=False)])

    def fit(self, train_pairs: Sequence[Pair]) -> "NearestDifference":
        self._bank = self._vectors(train_pairs, "baseline: train differences")
        # The copied caption is the pair's most typical reference: the one sharing most words with the others.
        self._captions = [_central_caption(p.captions) for p in train_pairs]
        return self

    def predict(self, pairs: Sequence[Pair]) -> dict[str, str]:
        if self._bank is None:
            raise RuntimeError("call fit() first")
        q = self._vectors(pairs, "baseline: test differences")
        nearest = (q @ self._bank.T).argmax(axis=1)
        return {p.pair_id: self._captions[j] for p, j in zip(pairs, nearest)}


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
