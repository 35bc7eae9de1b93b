"""The tensors IDC-PCL and DUDA train on: pair records of any dataset become feature rows, padded caption ids and
FDA's encoded negatives (:class:`PCLData`), built once before training.

The grid features are the feature store's float16 memmap seen as a tensor, never copied whole (24 GB at the paper's
ResNet-101 on CLEVR-Change; the page cache then holds it once per machine), and a batch's rows are read on demand.
A single-image caption (the birds' GIC stage) has an all-zero second image; the birds' FGVC stage adds image pairs
with class labels (:class:`FGVCData`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from idckit.data.clevr_change import ClevrChange
from idckit.data.features import FeatureStore
from idckit.device import copy_to
from idckit.errors import ConfigError, DatasetError
from idckit.text.vocab import Vocab


@dataclass
class SplitData:
    """One split: pairs (rows into the feature table) and (pair, caption) training samples."""

    pair_ids: list[str]
    types: list[str]
    before: torch.Tensor        # [P] rows of PCLData.features
    after: torch.Tensor         # [P]
    is_change: torch.Tensor     # [P] bool
    references: dict[str, list[str]]
    sample_pair: torch.Tensor   # [S] pair index of each caption sample
    sample_ids: torch.Tensor    # [S, L] [BOS] words [EOS] [PAD]...

    def __len__(self) -> int:
        return len(self.pair_ids)

    def reference_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, counts) [P]: pair i's captions are samples ``offsets[i] .. offsets[i] + counts[i] - 1``
        (samples are stored grouped by pair)."""
        counts = torch.bincount(self.sample_pair, minlength=len(self))
        return torch.cumsum(counts, 0) - counts, counts

    def before_groups(self) -> list[list[int]]:
        """The pair indices sharing each before-image (a change with its distractor), in first-seen order."""
        groups: dict[int, list[int]] = {}
        for i, b in enumerate(self.before.tolist()):
            groups.setdefault(b, []).append(i)
        return list(groups.values())


@dataclass
class PCLData:
    vocab: Vocab
    features: torch.Tensor      # [R, n_regions, dim] float16
    splits: dict[str, SplitData]
    max_len: int
    negatives: dict[str, list[str]] = field(default_factory=dict)   # pair_id -> FDA negatives (train)
    rows: dict[str, int] = field(default_factory=dict)              # feature-store key -> row of features
    blank_row: int | None = None     # the all-zero row standing for a missing second image (GIC pairs)
    fgvc: "FGVCData | None" = None   # FGVC-stage image pairs (pre-training with the ``fgvc`` task)
    words_kept: str = "max_len - 2"  # the truncation the samples were encoded with (text.vocab.WORDS_KEPT)

    @property
    def feat_dim(self) -> int:
        return self.features.shape[2]

    def read_pairs(self, split: str, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float16 features [len(idx), n, dim] of the pairs' before and after images, read on the CPU."""
        s = self.splits[split]
        idx = idx.cpu()
        return self.features[s.before[idx]], self.features[s.after[idx]]

    def pair_features(self, split: str, idx: torch.Tensor, device: torch.device | str = "cpu",
                      read: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 features [len(idx), n, dim] of the pairs' before and after images, on ``device``; ``read``:
        :meth:`read_pairs` of them done ahead (by a DataLoader worker)."""
        f1, f2 = self.read_pairs(split, idx) if read is None else read
        return copy_to(f1, device).float(), copy_to(f2, device).float()

    def read_fgvc(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float16 features of FGVC image pairs ``idx``, read on the CPU."""
        return self.features[self.fgvc.rows1[idx]], self.features[self.fgvc.rows2[idx]]

    def is_blank(self, split: str, idx: torch.Tensor) -> torch.Tensor:
        """[len(idx)] bool: the pairs that are a single-image caption (second image the blank row)."""
        return self.splits[split].after[idx] == self.blank_row

    def negative_ids(self) -> torch.Tensor:
        """[P, K, L] FDA's K encoded negatives of every train pair."""
        train = self.splits["train"]
        missing = [p for p in train.pair_ids if p not in self.negatives]
        if missing:
            raise ConfigError(f"FDA needs negatives for every train pair; {len(missing)} have none",
                              fix="build them with idckit.text.negatives.build_negatives")
        counts = {len(v) for v in self.negatives.values()}
        if len(counts) != 1:
            raise ConfigError(f"every pair needs the same number of FDA negatives, got {sorted(counts)}")
        n_neg = counts.pop()
        negs = [self.negatives[p] for p in train.pair_ids]
        return self.vocab.encode_batch([n for ns in negs for n in ns], self.max_len, self.words_kept).view(
            len(train), n_neg, self.max_len)


def subsample_by_before(pairs: Sequence, fraction: float, seed: int = 0) -> list:
    """The pairs of a seeded ``fraction`` of the before-images, in their original order.

    A before-image's semantic and distractor pair stay together, so a smaller training set keeps the 1:1 balance
    of changes and distractors that distractor judging learns from. Nested: a smaller fraction (same seed) keeps a
    subset of a larger one's before-images, so a data-size curve adds data rather than redrawing it.
    """
    if not 0 < fraction <= 1:
        raise ConfigError(f"train_fraction must be in (0, 1], got {fraction}",
                          fix="give the share of training before-images to keep, e.g. 0.25")
    if fraction == 1:
        return list(pairs)
    befores = sorted({str(p.before) for p in pairs})
    keep_n = max(1, round(fraction * len(befores)))
    order = torch.randperm(len(befores), generator=torch.Generator().manual_seed(seed))
    keep = {befores[int(i)] for i in order[:keep_n]}
    return [p for p in pairs if str(p.before) in keep]


@dataclass(frozen=True)
class PairRecord:
    """One captioned image pair, whatever the dataset: the images as feature-store keys (``image2`` None for a
    single-image caption, whose second image is then all-zero features), its references, its type (change type
    or Birds-to-Words selection) and whether it shows a real change."""

    pair_id: str
    image1: str
    image2: str | None
    references: tuple[str, ...]
    type: str
    is_change: bool = True


@dataclass
class FGVCData:
    """Image pairs for the FGVC stage: rows into PCLData.features, leaf-class labels, same-class flags."""

    rows1: torch.Tensor     # [N]
    rows2: torch.Tensor     # [N]
    class1: torch.Tensor    # [N] 0..n_classes-1
    class2: torch.Tensor    # [N]
    n_classes: int

    @property
    def same(self) -> torch.Tensor:
        return self.class1 == self.class2


def load_pcl_data(dataset: ClevrChange, store: FeatureStore, *, max_len: int, vocab: Vocab | None = None,
                  splits: Sequence[str] = ("train", "val", "test"), train_fraction: float = 1.0,
                  words_kept: str = "max_len - 2") -> PCLData:
    """Everything a PCL run on CLEVR-Change reads, in memory. The vocabulary is built on train captions unless
    given.

    ``train_fraction`` < 1 keeps that share of the training before-images (:func:`subsample_by_before`); val and
    test stay whole, so runs on different amounts of data are scored on the same pairs.
    """
    per_split = {s: dataset.pairs(s, check_images=False) for s in splits}
    if "train" in per_split:
        per_split["train"] = subsample_by_before(per_split["train"], train_fraction)
    rel = lambda path: path.relative_to(dataset.root).as_posix()
    records = {s: [PairRecord(p.pair_id, rel(p.before), rel(p.after), tuple(p.captions), p.change_type,
                              bool(p.is_change)) for p in pairs] for s, pairs in per_split.items()}
    return pcl_data_from_records(records, store, max_len=max_len, vocab=vocab, words_kept=words_kept)


def pcl_data_from_records(records: Mapping[str, Sequence[PairRecord]], store: FeatureStore, *, max_len: int,
                          vocab: Vocab | None = None, extra_images: Sequence[str] = (),
                          words_kept: str = "max_len - 2") -> PCLData:
    """:class:`PCLData` from pair records per split (any dataset). The vocabulary is built on the train split's
    references unless given; ``extra_images`` are loaded too (rows for :class:`FGVCData`, see ``data.row``).
    A missing second image is the last feature row, all zeros. Captions keep ``words_kept`` words
    (:data:`idckit.text.vocab.WORDS_KEPT`)."""
    if vocab is None:
        if "train" not in records:
            raise ConfigError("building a vocabulary needs the train split")
        vocab = Vocab.build(c for p in records["train"] for c in p.references)
    rows: dict[str, int] = {}
    blank = "<no image>"
    # with every image present the store's own rows serve, memory-mapped (paper-size features are then held once
    # per machine, not once per process); a missing image needs a zero row, so those (small) sets are copied
    needs_blank = any(p.image1 is None or p.image2 is None for ps in records.values() for p in ps)

    def row(key: str | None) -> int:
        if key is None:
            return rows.setdefault(blank, len(rows))
        if key not in store.index:
            raise DatasetError(f"the feature store has no features for {key}", path=store.directory,
                               fix="re-extract features for this dataset (`idckit features DATA_ROOT`)")
        return rows.setdefault(key, len(rows) if needs_blank else store.index[key])

    out: dict[str, SplitData] = {}
    for split, pairs in records.items():
        before = torch.tensor([row(p.image1) for p in pairs], dtype=torch.long)
        after = torch.tensor([row(p.image2) for p in pairs], dtype=torch.long)
        sample_pair = torch.tensor([i for i, p in enumerate(pairs) for _ in p.references], dtype=torch.long)
        texts = [c for p in pairs for c in p.references]
        out[split] = SplitData(
            pair_ids=[p.pair_id for p in pairs], types=[p.type for p in pairs], before=before, after=after,
            is_change=torch.tensor([p.is_change for p in pairs], dtype=torch.bool),
            references={p.pair_id: list(p.references) for p in pairs},
            sample_pair=sample_pair, sample_ids=vocab.encode_batch(texts, max_len, words_kept))
    for key in extra_images:
        row(key)
    if not needs_blank:
        with warnings.catch_warnings():   # the memmap is read-only; nothing here writes features
            warnings.simplefilter("ignore", UserWarning)
            features = torch.from_numpy(store.array)
        return PCLData(vocab=vocab, features=features, splits=out, max_len=max_len, rows=rows, blank_row=None,
                       words_kept=words_kept)
    order = sorted(rows, key=rows.get)
    real = [k for k in order if k != blank]
    feats = store.get_many(real).astype("float16", copy=False)
    features = torch.zeros(len(order), *feats.shape[1:], dtype=torch.float16)
    features[[rows[k] for k in real]] = torch.from_numpy(feats)
    return PCLData(vocab=vocab, features=features, splits=out, max_len=max_len, rows=rows,
                   blank_row=rows.get(blank), words_kept=words_kept)
