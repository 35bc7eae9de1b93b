"""CLIP4IDC's two stages as :class:`idckit.train.task.Task` objects for the one training loop.

* :class:`AdaptTask` (paper 2.3, "adaptation"): symmetric InfoNCE between pair vectors and CLIP text features of
  the change captions, CLIP's learnable temperature (clamped at 100 like the public code), CLIP's own weights at a
  small lr and the new e1/e2/p/ln_mid at 1e-4 (two parameter groups), the distractor-swap augmentation (with
  probability 0.5 the before image is replaced by the scene's non-semantic image: the pair (nsc, sc) keeps the
  change caption), every change caption its own sample. Val text->pair R@1 selects the checkpoint (the public code
  selects on test).
* :class:`CaptionTask` (paper 2.4): the caption transformer on the pair encoder's tokens; each step sees B train
  scenes twice, (default, semantic) with one random change caption and (default, non-semantic) with one random
  no-change caption (the public code's two passes, here one forward over 2B). The pair encoder trains at its own
  small lr or is frozen; val CIDEr-D (greedy decoding, KV cache, PTB tokenisation) selects; early stopping is the
  loop's ``patience``.

Frozen parts are computed once, not once per step (same numbers, less time; tested equal):

* ``freeze_intra`` (adaptation): the intra blocks (and the patch/position embeddings below them) stay at CLIP's
  weights; their per-image output is cached for every image once (:class:`IntraCache`), and each step runs only
  the inter blocks, the text tower and the loss.
* frozen pair encoder (captioning: table 7 always, the cpu profile by choice): the pair tokens of every pair are
  computed once and the caption model trains on them.

All data lives in memory (:class:`PairData`): uint8 images at the CLIP size, caption BPE ids, per-pair rows, on
the CPU; a batch's images (or cached tokens) are copied to the model's device. Every random draw of a batch comes
from the generator the loop passes to ``batches``, so a resumed run replays it.

Under torchrun each rank trains on its rank-strided rows of the global batch: adaptation's InfoNCE scores them
against the ALL-GATHERED pair and text vectors of every rank (the paper's in-batch negatives over the global batch
of 128), captioning divides its local token loss sum by the global token count; decoding for evaluation is split
over the ranks and gathered.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from idckit import checkpoints
from idckit.data.clevr_change import DISTRACTOR, ClevrChange
from idckit.data.images import ImageCache
from idckit.device import copy_to, model_device
from idckit.errors import ConfigError
from idckit.eval.captions import evaluate_pairs
from idckit.eval.retrieval import retrieval_metrics
from idckit.losses import clip_logits, mlm_loss, symmetric_infonce
from idckit.models.clip4idc import (CaptionerConfig, CLIP4IDCCaptioner, CLIP4IDCRetrieval, PairEncoder,
                                    clip_bpe_tokenizer, tokenize_captions)
from idckit.models.clip_loader import load_clip
from idckit.models.decoding import MIN_WORDS, greedy_decode
from idckit.tasks.references import pick_references
from idckit.train import distributed
from idckit.train.loop import DISTINCT_METRIC
from idckit.train.task import weight_decay_groups

MAX_LOGIT_SCALE = math.log(100.0)
#: ``decay_rule``: kit = the kit's own grouping (adaptation: open_clip's, no decay on gains, biases, embeddings, the
#: temperature or the new parameters; captioning: decay on everything); public = the public code's (module doc)
DECAY_RULES = ("kit", "public")
#: captioning ``loss_reduction``: token_mean = one mean over the caption tokens of both passes; pass_means = the
#: public code's sum of the change pass's token mean and the no-change pass's (main_task_caption.py:319-325)
CAPTION_LOSS_REDUCTIONS = ("token_mean", "pass_means")
#: captioning ``decode_cut``: where a greedy output's caption ends. ids = at the first EOT or pad id (0, '!'), the
#: kit's; text = the public code's (main_task_caption.py:589-596): the ids decoded whole, the text cut at the first
#: '<|endoftext|>' and then at the first '!' character, which also cuts at a token that holds a '!' ('!!', '!)')
DECODE_CUTS = ("ids", "text")


def _check_choice(name: str, value: object, known: Sequence[str], config: str) -> None:
    if value not in known:
        raise ConfigError(f"{name} must be one of {', '.join(known)}, got {value!r}", fix=f"set {name} in {config}")


def _public_groups(named: Sequence[tuple[str, torch.nn.Parameter]], no_decay: set[int], weight_decay: float,
                   lr_scale: float) -> list[dict[str, Any]]:
    decay = [p for _, p in named if id(p) not in no_decay]
    return [{"params": decay, "lr_scale": lr_scale, "weight_decay": weight_decay},
            {"params": [p for _, p in named if id(p) in no_decay], "lr_scale": lr_scale, "weight_decay": 0.0}]


def adapt_param_groups(model: torch.nn.Module, new: Sequence[torch.nn.Parameter], *, clip_lr_scale: float,
                       weight_decay: float, decay_rule: str) -> list[dict[str, Any]]:
    """The adaptation's optimiser groups: CLIP's parameters at lr * ``clip_lr_scale``, the ``new`` ones (e1, e2, p,
    ln_mid) at lr. ``decay_rule`` kit: weight decay on CLIP's matrices only. public: the public code's name rule
    (main_task_retrieval.py:171-206: ``no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight']`` matched as
    substrings of their names), in which only the biases escape: their CLIP names its norms ``ln_*``, so CLIP's
    gains, embeddings and temperature and the new e1/e2/p/ln_mid gain all decay. The kit's names contain "bias"
    exactly where theirs do (``idckit.authors.clip4idc.convert_retrieval`` renames nothing else)."""
    _check_choice("decay_rule", decay_rule, DECAY_RULES, "configs/clip4idc_adapt.json")
    fresh = {id(p) for p in new}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    clip = [(n, p) for n, p in trainable if id(p) not in fresh]
    added = [(n, p) for n, p in trainable if id(p) in fresh]
    if decay_rule == "kit":
        return weight_decay_groups(clip, weight_decay, lr_scale=clip_lr_scale) + \
            [{"params": [p for _, p in added], "lr_scale": 1.0, "weight_decay": 0.0}]
    biases = {id(p) for n, p in trainable if "bias" in n}
    return _public_groups(clip, biases, weight_decay, clip_lr_scale) + _public_groups(added, biases, weight_decay, 1.0)


def caption_param_groups(model: torch.nn.Module, *, visual_lr_scale: float, weight_decay: float,
                         decay_rule: str) -> list[dict[str, Any]]:
    """The captioning's optimiser groups: the pair encoder (``pair_encoder.*``) at lr * ``visual_lr_scale``, the
    caption model at lr. ``decay_rule`` kit: ``weight_decay`` on every parameter. public: the public code's name
    rule (main_task_caption.py:229-251): no decay on biases (``head_bias`` is their ``predictions.bias``) nor on
    the caption model's LayerNorms, which their BERT-style decoder names ``LayerNorm``; the pair encoder's norms
    (CLIP's ``ln_*``) decay."""
    _check_choice("decay_rule", decay_rule, DECAY_RULES, "configs/clip4idc_caption.json")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = []
    for lr_scale, part in ((visual_lr_scale, [(n, p) for n, p in trainable if n.startswith("pair_encoder.")]),
                           (1.0, [(n, p) for n, p in trainable if not n.startswith("pair_encoder.")])):
        if decay_rule == "kit":
            groups.append({"params": [p for _, p in part], "lr_scale": lr_scale, "weight_decay": weight_decay})
            continue
        norms = {id(p) for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)
                 and not name.startswith("pair_encoder.") for p in m.parameters()}
        groups += _public_groups(part, norms | {id(p) for n, p in part if "bias" in n}, weight_decay, lr_scale)
    return [g for g in groups if g["params"]]


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------

def freeze_named(model: torch.nn.Module, names: Sequence[str], config: str) -> None:
    """Freeze each parameter of ``model`` named in ``names``: a parameter's name, or a module's (all of its
    parameters). An entry that names nothing is an error: a renamed module would otherwise train silently."""
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"a freeze list must be a list of parameter or module names, got {names!r}",
                          fix=f"set it in {config}, e.g. [\"pair_encoder.visual.conv1\"]")
    named = list(model.named_parameters())
    for entry in names:
        hit = [p for n, p in named if n == entry or n.startswith(entry + ".")]
        if not hit:
            raise ConfigError(f"freeze names {entry!r}, which is no parameter or module of "
                              f"{type(model).__name__}", fix=f"correct the freeze list in {config}")
        for p in hit:
            p.requires_grad_(False)


@dataclass
class PairSplit:
    """One split: pairs as image rows (semantic pair of a scene, then its distractor pair) and captions."""

    pair_ids: list[str]
    types: list[str]
    before: torch.Tensor          # [P] image rows
    after: torch.Tensor           # [P]
    is_change: torch.Tensor       # [P] bool
    distractor_row: torch.Tensor  # [P] semantic pairs: the scene's non-semantic image (swap augmentation); else -1
    references: dict[str, list[str]]
    sample_pair: torch.Tensor     # [S] pair index of each caption
    sample_ids: torch.Tensor      # [S, L] SOT ... EOT 0 ... (CLIP BPE)

    def __len__(self) -> int:
        return len(self.pair_ids)

    @property
    def change_pairs(self) -> torch.Tensor:
        return torch.nonzero(self.is_change).flatten()

    def captions_of(self, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sample index offset, count) of each pair's captions (samples are stored grouped by pair)."""
        counts = torch.bincount(self.sample_pair, minlength=len(self))
        offsets = torch.cumsum(counts, 0) - counts
        return offsets[pairs], counts[pairs]


@dataclass
class PairData:
    images: ImageCache
    splits: dict[str, PairSplit]
    max_len: int

    def caption_ids(self) -> list[int]:
        """Every BPE id of the train captions (the trimmed output vocabulary; SOT/EOT/pad are added by the model)."""
        return sorted(set(self.splits["train"].sample_ids.flatten().tolist()))


def load_pair_data(dataset: ClevrChange, size: int, *, max_len: int, cache_dir: str | Path | None = None,
                   splits: Sequence[str] = ("train", "val", "test"), progress: bool = False) -> PairData:
    """Every pair of ``splits`` with its images (decoded once, ``size`` px) and tokenised captions.

    ``dataset`` is any of the kit's pair datasets (``ClevrChange``, ``SpotTheDiff``, ``EditingRequest``): what is
    read is ``root`` and ``pairs(split)``."""
    per_split = {s: dataset.pairs(s, check_images=True) for s in splits}
    rel = lambda p: p.relative_to(dataset.root).as_posix()  # noqa: E731
    paths = [rel(x) for pairs in per_split.values() for p in pairs for x in (p.before, p.after)]
    images = ImageCache.build(dataset.root, paths, size, cache_dir=cache_dir, progress=progress)
    out = {}
    for split, pairs in per_split.items():
        nsc_of = {p.index: images.index[rel(p.after)] for p in pairs if not p.is_change}
        texts = [c for p in pairs for c in p.captions]
        out[split] = PairSplit(
            pair_ids=[p.pair_id for p in pairs], types=[p.change_type for p in pairs],
            before=images.rows([rel(p.before) for p in pairs]), after=images.rows([rel(p.after) for p in pairs]),
            is_change=torch.tensor([p.is_change for p in pairs]),
            distractor_row=torch.tensor([nsc_of.get(p.index, -1) if p.is_change else -1 for p in pairs],
                                        dtype=torch.long),
            references={p.pair_id: list(p.captions) for p in pairs},
            sample_pair=torch.tensor([i for i, p in enumerate(pairs) for _ in p.captions], dtype=torch.long),
            sample_ids=tokenize_captions(texts, max_len))
    return PairData(images=images, splits=out, max_len=max_len)


def with_text_length(data: PairData, max_len: int) -> PairData:
    """``data`` with every caption tokenised again to ``max_len`` ids, sharing its images. The public code's caption
    stage keeps more words than its adaptation stage at the same --max_words (its captioning cuts after the words,
    its retrieval counts SOT and EOT), so the kit's captioning reads its own length (``caption_max_len``)."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 3:
        raise ConfigError(f"a caption length must be a whole number >= 3 (SOT, a word, EOT), got {max_len!r}",
                          fix="set caption_max_len in configs/clip4idc_caption.json (null: max_len)")
    if max_len == data.max_len:
        return data
    splits = {name: replace(split, sample_ids=tokenize_captions(
        [c for pid in split.pair_ids for c in split.references[pid]], max_len)) for name, split in data.splits.items()}
    return PairData(images=data.images, splits=splits, max_len=max_len)


def decode_ids(rows: Sequence[Sequence[int]], cut: str = "ids") -> list[str]:
    """Greedy output ids (after SOT) -> caption strings, cut at EOT (and at pad, which never follows a word), or
    with ``cut="text"`` as the public code cuts them (:data:`DECODE_CUTS`)."""
    _check_choice("decode_cut", cut, DECODE_CUTS, "configs/clip4idc_caption.json")
    tok = clip_bpe_tokenizer()
    out = []
    for ids in rows:
        if cut == "text":
            # open_clip spells EOT <end_of_text> where their tokenizer writes <|endoftext|>
            text = tok.decode([int(i) for i in ids]).split(tok.decode([tok.eot_token_id]), 1)[0]
            out.append(text.split("!", 1)[0].strip())
            continue
        words = []
        for i in ids:
            if i in (tok.eot_token_id, 0):
                break
            words.append(int(i))
        out.append(" ".join(tok.decode(words).split()))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Caches of frozen computation
# ---------------------------------------------------------------------------------------------------------------

def fingerprint(params: Sequence[torch.Tensor]) -> float:
    """A checksum of frozen weights, to tell whether a cache was computed from these exact weights."""
    with torch.no_grad():
        return float(sum((p.detach().cpu().double()
                          * (1 + torch.arange(p.numel(), dtype=torch.float64).view(p.shape) % 7)).sum()
                         for p in params))


_FROZEN_KEYS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, float]]" = weakref.WeakKeyDictionary()


def frozen_key(module: torch.nn.Module, what: str, params: Sequence[torch.Tensor]) -> float:
    """:func:`fingerprint` of frozen ``params`` of ``module``, computed once per (module object, what): at first
    use, i.e. after the loop has loaded any checkpoint into it; frozen weights do not change after that."""
    keys = _FROZEN_KEYS.setdefault(module, {})
    if what not in keys:
        keys[what] = fingerprint(params)
    return keys[what]


def intra_frozen_params(encoder: PairEncoder) -> list[torch.Tensor]:
    v = encoder.visual
    params = [v.conv1.weight, v.class_embedding, v.positional_embedding, *v.ln_pre.parameters()]
    for block in v.transformer.resblocks[:encoder.n_intra]:
        params += list(block.parameters())
    return params


def freeze_intra(encoder: PairEncoder) -> None:
    for p in intra_frozen_params(encoder):
        p.requires_grad_(False)


@dataclass
class IntraCache:
    """Intra-stage outputs [rows, n+1, width] of images (keyed by image row) under frozen intra weights."""

    rows: torch.Tensor           # image rows cached, sorted
    values: torch.Tensor         # [len(rows), n+1, width] float32
    n_intra: int
    key: float                   # fingerprint of the frozen weights
    _lookup: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        size = int(self.rows.max()) + 1 if len(self.rows) else 0
        self._lookup = torch.full((size,), -1, dtype=torch.long)
        self._lookup[self.rows] = torch.arange(len(self.rows))

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        idx = self._lookup[rows]
        if bool((idx < 0).any()):
            raise KeyError("image rows not in the intra cache")
        return self.values[idx]

    @classmethod
    @torch.inference_mode()
    def compute(cls, encoder: PairEncoder, images: ImageCache, rows: torch.Tensor, *, batch_size: int = 128,
                progress: bool = False) -> "IntraCache":
        rows = torch.unique(rows)
        was = encoder.training
        encoder.eval()
        out = []
        for i in tqdm(range(0, len(rows), batch_size), desc=f"intra cache ({encoder.n_intra} blocks)",
                      disable=not progress, leave=False):
            batch = images.batch(rows[i:i + batch_size], model_device(encoder))
            out.append(encoder.encode_intra(batch).float().cpu())
        encoder.train(was)
        return cls(rows=rows, values=torch.cat(out), n_intra=encoder.n_intra,
                   key=fingerprint(intra_frozen_params(encoder)))


@torch.inference_mode()
def pair_tokens(encoder: PairEncoder, images: ImageCache, before: torch.Tensor, after: torch.Tensor, *,
                intra: IntraCache | None = None, batch_size: int = 64, progress: bool = False) -> torch.Tensor:
    """[P, 2(n+1), D] pair-encoder tokens of the given pairs (from the intra cache when it matches)."""
    was = encoder.training
    encoder.eval()
    out = []
    for i in tqdm(range(0, len(before), batch_size), desc="pair tokens", disable=not progress, leave=False):
        b, a = before[i:i + batch_size], after[i:i + batch_size]
        out.append(_encode(encoder, images, b, a, intra)[0].float().cpu())
    encoder.train(was)
    return torch.cat(out) if out else torch.empty(0)


def _encode(encoder: PairEncoder, images: ImageCache, before: torch.Tensor, after: torch.Tensor,
            intra: IntraCache | None, pixels: tuple[torch.Tensor, torch.Tensor] | None = None):
    """``pixels``: the two images' uint8 pixels read ahead (by a DataLoader worker)."""
    dev = model_device(encoder)
    if intra is not None:
        return encoder.forward_from_intra(intra[before].to(dev), intra[after].to(dev))
    pixels = pixels or (None, None)
    return encoder(images.batch(before, dev, pixels[0]), images.batch(after, dev, pixels[1]))


def _usable_intra(cache: IntraCache | None, encoder: PairEncoder) -> IntraCache | None:
    if cache is None or cache.n_intra != encoder.n_intra:
        return None
    return cache if cache.key == frozen_key(encoder, "intra", intra_frozen_params(encoder)) else None


# ---------------------------------------------------------------------------------------------------------------
# Adaptation
# ---------------------------------------------------------------------------------------------------------------

class AdaptTask:
    """Pair <-> text retrieval on the change captions (the paper's adaptation stage)."""

    selection_metric = "t2p_R@1"

    def __init__(self, data: PairData, clip_model: str, pretrained: str | None, *, batch_size: int,
                 clip_lr_scale: float, weight_decay: float, swap_prob: float, freeze_intra: bool,
                 freeze_embeddings: bool, eval_batch_size: int, ks: Sequence[int], n_intra: int | None = None,
                 intra_cache: IntraCache | None = None, progress: bool = False, decay_rule: str = "kit"):
        self.data, self.clip_model, self.pretrained = data, clip_model, pretrained
        self.ks = tuple(sorted({1, *ks}))                      # R@1 always: it selects the checkpoint
        self.n_intra, self.batch_size, self.clip_lr_scale = n_intra, batch_size, clip_lr_scale
        if not 0.0 <= swap_prob <= 1.0:
            raise ConfigError(f"swap_prob must be a probability, got {swap_prob}")
        self.weight_decay, self.swap_prob, self.freeze_intra = weight_decay, swap_prob, freeze_intra
        self.freeze_embeddings = freeze_embeddings
        _check_choice("decay_rule", decay_rule, DECAY_RULES, "configs/clip4idc_adapt.json")
        self.decay_rule = decay_rule
        self.eval_batch_size, self.intra_cache, self.progress = eval_batch_size, intra_cache, progress
        train = data.splits["train"]
        keep = train.is_change[train.sample_pair]
        self.samples = torch.nonzero(keep).flatten()           # every change caption is a sample

    def build_model(self) -> CLIP4IDCRetrieval:
        clip, _, _ = load_clip(self.clip_model, self.pretrained)
        model = CLIP4IDCRetrieval(clip, n_intra=self.n_intra)
        if self.freeze_embeddings:      # the public code's freeze list: patch/position/token embeddings, ln_pre
            model.freeze_like_public_code()
        if self.freeze_intra:
            freeze_intra(model.pair_encoder)
        return model

    def param_groups(self, model: CLIP4IDCRetrieval) -> list[dict[str, Any]]:
        """CLIP's weights at lr * clip_lr_scale (paper 1e-7 = 1e-4 * 1e-3), the new e1/e2/p/ln_mid at lr; weight
        decay by ``decay_rule`` (:func:`adapt_param_groups`)."""
        return adapt_param_groups(model, model.pair_encoder.new_parameters(), clip_lr_scale=self.clip_lr_scale,
                                  weight_decay=self.weight_decay, decay_rule=self.decay_rule)

    def _intra(self, model: CLIP4IDCRetrieval) -> IntraCache | None:
        """The intra cache for this model's frozen weights (computed on first use, on every image needed)."""
        if not self.freeze_intra:
            return None
        cache = _usable_intra(self.intra_cache, model.pair_encoder)
        if cache is None:
            rows = torch.cat([torch.cat([s.before, s.after, s.distractor_row[s.distractor_row >= 0]])
                              for s in self.data.splits.values()])
            cache = self.intra_cache = IntraCache.compute(model.pair_encoder, self.data.images, rows,
                                                          progress=self.progress)
        return cache

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        train = self.data.splits["train"]
        n = len(self.samples)
        size = min(self.batch_size, n)
        order = self.samples[torch.randperm(n, generator=generator)]
        for start in range(0, n - size + 1, size):
            s = order[start:start + size]
            pairs = train.sample_pair[s]
            # the swap needs the scene's non-semantic image: datasets without distractor pairs never swap
            swap = (torch.rand(len(s), generator=generator) < self.swap_prob) & (train.distractor_row[pairs] >= 0)
            yield {"pairs": pairs, "ids": train.sample_ids[s], "swap": swap}

    def load(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The batch with its images' uint8 pixels read (a DataLoader worker's part of the step); with frozen intra
        blocks the step reads the intra cache instead."""
        if self.freeze_intra:
            return batch
        images, before = self.data.images, self.swapped_before(batch["pairs"], batch["swap"])
        after = self.data.splits["train"].after[batch["pairs"]]
        return {**batch, "pixels": (images.read(before), images.read(after))}

    def swapped_before(self, pairs: torch.Tensor, swap: torch.Tensor) -> torch.Tensor:
        """Before-image rows with the distractor swap applied: (nsc, sc) instead of (default, sc) where swap."""
        train = self.data.splits["train"]
        nsc = train.distractor_row[pairs]
        if bool((swap & (nsc < 0)).any()):
            raise ValueError("a swapped pair has no non-semantic image")
        return torch.where(swap, nsc, train.before[pairs])

    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = distributed.shard(torch.arange(len(batch["pairs"])))
        return {k: v[rows] for k, v in batch.items()}

    def train_step(self, model: CLIP4IDCRetrieval, batch: dict[str, torch.Tensor], step: int):
        with torch.no_grad():
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        train = self.data.splits["train"]
        dev = model_device(model)
        before = self.swapped_before(batch["pairs"], batch["swap"])
        _, pair = _encode(model.pair_encoder, self.data.images, before, train.after[batch["pairs"]],
                          self._intra(model), batch.get("pixels"))
        text = model.encode_text(batch["ids"].to(dev))
        # gathered: the global batch's negatives
        logits = clip_logits(text, pair, model.logit_scale, gather=distributed.gather_with_grad)
        loss = symmetric_infonce(logits)
        acc = (logits.argmax(1) == torch.arange(len(logits), device=dev)).float().mean()
        return loss, {"t2p_acc": float(acc), "temperature": float(1 / model.logit_scale.detach().exp())}

    @torch.inference_mode()
    def similarity(self, model: CLIP4IDCRetrieval, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """[n_caption, n_pair] cosine similarities over the change pairs of ``split`` and their captions."""
        model.eval()
        s = self.data.splits[split]
        pairs = s.change_pairs
        column = torch.full((len(s),), -1, dtype=torch.long)
        column[pairs] = torch.arange(len(pairs))
        samples = torch.nonzero(column[s.sample_pair] >= 0).flatten()
        intra = self._intra(model)
        dev = model_device(model)
        vecs = [F.normalize(_encode(model.pair_encoder, self.data.images, s.before[p], s.after[p], intra)[1], dim=-1)
                for p in pairs.split(self.eval_batch_size)]
        texts = [F.normalize(model.encode_text(s.sample_ids[x].to(dev)), dim=-1) for x in samples.split(256)]
        return (torch.cat(texts) @ torch.cat(vecs).t()).cpu(), column[s.sample_pair[samples]]

    def evaluate(self, model: CLIP4IDCRetrieval, split: str = "val") -> dict[str, float]:
        """R@K (``ks``: 1/5/10 by default), MdR, MnR in both directions (CLIP4IDC's protocol, idckit.eval.retrieval)."""
        sim, text_pair = self.similarity(model, split)
        return retrieval_metrics(sim, text_pair, ks=self.ks)


# ---------------------------------------------------------------------------------------------------------------
# Captioning
# ---------------------------------------------------------------------------------------------------------------

class CaptionTask:
    """CLIP4IDC / CLIP-FT captioning with val CIDEr-D selection."""

    selection_metric = "CIDEr-D"

    def __init__(self, data: PairData, clip_model: str, pretrained: str | None, captioner: Mapping[str, Any], *,
                 batch_size: int, visual_lr_scale: float, trim_vocab: bool, eval_batch_size: int,
                 captions_per_pair: int, init_from: str | Path | None = None,
                 intra_cache: IntraCache | None = None, scorer=None, progress: bool = False,
                 decay_rule: str = "kit", weight_decay: float | None = None, loss_reduction: str = "token_mean",
                 freeze: Sequence[str] = (), decode_min_words: int = MIN_WORDS, decode_cut: str = "ids"):
        self.data, self.clip_model, self.pretrained = data, clip_model, pretrained
        _check_choice("decode_cut", decode_cut, DECODE_CUTS, "configs/clip4idc_caption.json")
        self.decode_cut = decode_cut
        if isinstance(decode_min_words, bool) or not isinstance(decode_min_words, int) or decode_min_words < 0:
            raise ConfigError(f"decode_min_words must be an integer >= 0, got {decode_min_words!r}",
                              fix="0 is the authors' greedy decoding (paper profile), 1 the kit's "
                                  "(configs/clip4idc_caption.json)")
        self.decode_min_words = decode_min_words
        self.freeze = list(freeze)
        if not isinstance(captions_per_pair, int) or isinstance(captions_per_pair, bool) or captions_per_pair < 1:
            raise ConfigError(f"captions_per_pair must be an integer >= 1, got {captions_per_pair!r}",
                              fix="set captions_per_pair in configs/clip4idc_caption.json (1 = the paper's)")
        self.captions_per_pair = captions_per_pair
        _check_choice("decay_rule", decay_rule, DECAY_RULES, "configs/clip4idc_caption.json")
        _check_choice("loss_reduction", loss_reduction, CAPTION_LOSS_REDUCTIONS, "configs/clip4idc_caption.json")
        if decay_rule != "kit" and weight_decay is None:
            raise ConfigError(f"decay_rule {decay_rule!r} needs the run's weight_decay (its train.weight_decay)")
        self.decay_rule, self.weight_decay, self.loss_reduction = decay_rule, weight_decay, loss_reduction
        self.cfg = CaptionerConfig(**{**dict(captioner), "max_len": data.max_len})
        if visual_lr_scale == 0 and not self.cfg.freeze_visual:
            raise ConfigError("visual_lr_scale 0 would train the pair encoder at lr 0",
                              fix="freeze it explicitly: captioner.freeze_visual = true")
        self.batch_size, self.visual_lr_scale = batch_size, visual_lr_scale
        self.init_from = Path(init_from) if init_from else None
        self.trim_vocab, self.eval_batch_size = trim_vocab, eval_batch_size
        self.intra_cache, self.scorer, self.progress = intra_cache, scorer, progress
        self._tokens: dict[str, torch.Tensor] = {}
        self._tokens_key: float | None = None
        train = data.splits["train"]
        self.scenes = train.change_pairs                     # semantic pair i; its distractor pair is i + 1
        # datasets without distractor pairs (Spot-the-Diff, IER): a scene is one pair
        self.with_distractors = bool((~train.is_change).any())
        nxt = self.scenes + 1
        if self.with_distractors and not (bool((nxt < len(train)).all())
                                          and bool((~train.is_change[nxt.clamp(max=len(train) - 1)]).all())):
            raise ConfigError("train pairs must alternate semantic, distractor (ClevrChange.pairs order)")
        self.offsets, self.counts = train.captions_of(torch.arange(len(train)))

    @property
    def frozen(self) -> bool:
        return self.cfg.freeze_visual

    def build_model(self) -> CLIP4IDCCaptioner:
        clip, _, _ = load_clip(self.clip_model, self.pretrained)
        out_ids = self.data.caption_ids() if self.trim_vocab else None
        model = CLIP4IDCCaptioner(clip, self.cfg, output_ids=out_ids)
        if self.init_from is not None:
            fix = "pass the best.pt of an adaptation run (or of idckit import-checkpoint --from clip4idc-adapt)"
            state = checkpoints.load(self.init_from, what="init_from checkpoint", fix=fix)
            encoder = {k[len("pair_encoder."):]: v for k, v in state.items() if k.startswith("pair_encoder.")} \
                if isinstance(state, dict) else {}
            if not encoder:
                raise ConfigError("the adaptation checkpoint has no pair_encoder weights", path=self.init_from, fix=fix)
            checkpoints.load_into(model.pair_encoder, encoder, path=self.init_from, what="init_from checkpoint",
                                  fix=fix)
        freeze_named(model, self.freeze, "configs/clip4idc_caption.json (freeze)")
        return model

    def param_groups(self, model: CLIP4IDCCaptioner) -> list[dict[str, Any]]:
        if self.decay_rule == "kit":     # the loop gives every group train.weight_decay
            groups = model.param_groups(self.visual_lr_scale, 1.0)
            return [{"params": g["params"], "lr_scale": g["lr"]} for g in groups if g["params"]]
        return caption_param_groups(model, visual_lr_scale=self.visual_lr_scale, weight_decay=self.weight_decay,
                                    decay_rule=self.decay_rule)

    def _visual(self, model: CLIP4IDCCaptioner, split: str, pairs: torch.Tensor,
                pixels: tuple[torch.Tensor, torch.Tensor] | None = None):
        """What the captioner reads for ``pairs``: cached pair tokens (frozen encoder) or the two images (``pixels``:
        their uint8 pixels read ahead by a DataLoader worker)."""
        s = self.data.splits[split]
        dev = model_device(model)
        if not self.frozen:
            pixels = pixels or (None, None)
            return (self.data.images.batch(s.before[pairs], dev, pixels[0]),
                    self.data.images.batch(s.after[pairs], dev, pixels[1]))
        key = frozen_key(model.pair_encoder, "all", list(model.pair_encoder.parameters()))
        if self._tokens_key != key:
            self._tokens, self._tokens_key = {}, key
        if split not in self._tokens:
            intra = _usable_intra(self.intra_cache, model.pair_encoder)
            self._tokens[split] = pair_tokens(model.pair_encoder, self.data.images, s.before, s.after, intra=intra,
                                              progress=self.progress)
        return copy_to(self._tokens[split][pairs.cpu()], dev)

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        scenes = self.scenes[torch.randperm(len(self.scenes), generator=generator)]
        size = min(self.batch_size, len(scenes))
        for start in range(0, len(scenes) - size + 1, size):
            sc = scenes[start:start + size]
            pairs = torch.cat([sc, sc + 1]) if self.with_distractors else sc   # (default, sc) then (default, nsc)
            yield {"pairs": pairs, "ids": self.data.splits["train"].sample_ids[self._pick(pairs, generator)]}

    def _pick(self, pairs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Caption rows: one random reference per pair ([P], the paper's), or ``captions_per_pair`` = k > 1 distinct
        references per pair in a random order, cycling where a pair has fewer ([P, k]); the decoder reads each
        pair's memory k times, so a step learns from k captions for one pass of the encoder."""
        offsets, counts = self.offsets[pairs], self.counts[pairs]
        if self.captions_per_pair == 1:
            return offsets + (torch.rand(len(pairs), generator=generator) * counts).long()
        return pick_references(offsets, counts, self.captions_per_pair, generator)

    def load(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The batch with its images' uint8 pixels read (a DataLoader worker's part of the step); a frozen pair
        encoder's step reads the cached pair tokens instead."""
        if self.frozen:
            return batch
        s, images = self.data.splits["train"], self.data.images
        return {**batch, "pixels": (images.read(s.before[batch["pairs"]]), images.read(s.after[batch["pairs"]]))}

    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = distributed.shard(torch.arange(len(batch["pairs"])))
        return {k: v[rows] for k, v in batch.items()}

    def train_step(self, model: CLIP4IDCCaptioner, batch: dict[str, torch.Tensor], step: int):
        memories = model.memories(self._visual(model, "train", batch["pairs"], batch.get("pixels")))
        ids = batch["ids"].to(model_device(model))
        if ids.dim() == 3:          # [P, k, L]: k references per pair, each reading its pair's memory
            memories = [m.repeat_interleave(ids.shape[1], 0) for m in memories]
            ids = ids.flatten(0, 1)
        words = int((ids[:, 1:] != model.pad_id).sum())
        if self.loss_reduction == "token_mean":
            loss = distributed.global_mean(mlm_loss(*model.teacher_forcing(memories, ids), "sum"), words)
            return loss, {}
        # pass_means: a row's pass is its pair's kind (semantic: the change pass), known after a shard too
        change = self.data.splits["train"].is_change[batch["pairs"].cpu()]
        if batch["ids"].dim() == 3:
            change = change.repeat_interleave(batch["ids"].shape[1])
        logits, labels = model.teacher_forcing(memories, ids)
        loss = logits.new_zeros(())
        for rows in (change, ~change):
            if not bool(rows.any()) and distributed.world() == 1:
                continue       # a dataset without distractor pairs: one pass, one mean (as their Spot-the-Diff)
            rows = rows.to(logits.device)
            words = int((ids[rows, 1:] != model.pad_id).sum())
            loss = loss + distributed.global_mean(mlm_loss(logits[rows], labels[rows], "sum"), words)
        return loss, {}

    @torch.inference_mode()
    def predict(self, model: CLIP4IDCCaptioner, split: str) -> dict[str, str]:
        """Greedy captions (KV cache, at most max_len - 1 tokens after SOT) for every pair of ``split``; under
        torchrun each rank decodes its rank-strided share and every rank gets the whole result."""
        was = model.training
        model.eval()
        s = self.data.splits[split]
        out: dict[str, str] = {}
        mine = distributed.split_evenly(torch.arange(len(s)))
        for idx in tqdm(mine.split(self.eval_batch_size), desc=f"decode {split}",
                        disable=not self.progress, leave=False):
            tokens = greedy_decode(model, self._visual(model, split, idx), self.data.max_len - 1,
                                   self.decode_min_words)
            for j, text in zip(idx.tolist(), decode_ids(tokens.tolist(), self.decode_cut)):
                out[s.pair_ids[j]] = text
        model.train(was)
        if distributed.world() > 1:
            parts = distributed.gather(out)
            out = distributed.broadcast({k: v for part in parts for k, v in part.items()} if parts else None)
        return {p: out[p] for p in s.pair_ids}

    def evaluate(self, model: CLIP4IDCCaptioner, split: str = "val") -> dict[str, float]:
        preds = self.predict(model, split)
        if not distributed.is_main():     # scored once, on rank 0
            return {}
        s = self.data.splits[split]
        scores = evaluate_pairs(s.references, preds, dict(zip(s.pair_ids, s.types)), meteor=False,
                                scorer=self.scorer)
        out = {"CIDEr-D": scores["total"]["CIDEr-D"], "Bleu_4": scores["total"]["Bleu_4"],
               DISTINCT_METRIC: len(set(preds.values()))}     # the loop's stop_on_collapse reads it
        for sub in ("semantic", DISTRACTOR):
            if sub in scores:
                out[f"CIDEr-D_{sub}"] = scores[sub]["CIDEr-D"]
        return out
