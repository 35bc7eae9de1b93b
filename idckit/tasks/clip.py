"""CLIP4IDC's three kinds of run as :class:`idckit.train.task.Task` objects for the one training loop.

- :class:`ClipPretrainTask`: the offline stand-in CLIP. Symmetric InfoNCE between single images and their scene
  descriptions (``scene_descriptions.json`` of SynthCLEVR-Change), TRAIN images only (before and semantic-after
  images; a distractor image has the same description as its before image, so it would be a false negative).
  Val image<->text R@1 selects the checkpoint. It stands in for OpenAI's ViT-B/32 wherever no hub is reachable.
- :class:`AdaptTask`: the paper's retrieval adaptation (section 3.2): symmetric InfoNCE between pair vectors and
  CLIP text features of change captions, CLIP's weights at a small lr and the new e1/e2/p/ln_mid at the full lr,
  ``logit_scale`` clamped at ln 100 like the public code, and the distractor swap (p = 0.5: the before image is
  replaced by the non-semantic distractor image). Val text->pair R@1 selects the checkpoint (the public code used
  test).
- :class:`CaptionTask`: the captioner with cross-entropy on CLIP's BPE vocabulary. Every train pair (semantic
  and distractor) is one sample per epoch with one random caption, so each epoch is half change, half no-change
  captions, as the public loader's two passes per step. Val CIDEr-D selects the checkpoint.

All images live in memory once (:class:`idckit.data.images.ImageCache`, uint8); captions as CLIP BPE id
matrices. Every random draw comes from the generator the loop passes to ``batches``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F

from idckit.data.clevr_change import ClevrChange
from idckit.data.images import ImageCache
from idckit.errors import ConfigError, DatasetError
from idckit.losses import symmetric_infonce

#: the public code clamps CLIP's logit scale at its pretrained value, ln 100 (temperature 0.01)
MAX_LOGIT_SCALE = math.log(100.0)


@dataclass
class ClipSplit:
    """One split: pairs (rows into the image cache) and (pair, caption) samples as CLIP BPE ids."""

    pair_ids: list[str]
    types: list[str]
    before: torch.Tensor        # [P] image rows
    after: torch.Tensor         # [P]
    nsc: torch.Tensor           # [P] the index's distractor image (the swap partner of a semantic pair)
    is_change: torch.Tensor     # [P] bool
    references: dict[str, list[str]]
    sample_pair: torch.Tensor   # [S] pair of each caption, grouped by pair
    sample_ids: torch.Tensor    # [S, L] [SOT] bpe... [EOT] 0...

    def __len__(self) -> int:
        return len(self.pair_ids)

    @property
    def counts(self) -> torch.Tensor:
        return torch.bincount(self.sample_pair, minlength=len(self))

    @property
    def offsets(self) -> torch.Tensor:
        c = self.counts
        return torch.cumsum(c, 0) - c


@dataclass
class ClipData:
    images: ImageCache
    splits: dict[str, ClipSplit]
    max_len: int
    descriptions: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # split -> rows, ids

    def pair_images(self, split: str, idx: torch.Tensor, swap: torch.Tensor | None = None):
        """Normalised float images (before, after) of pairs ``idx``; ``swap`` rows take the distractor image
        as the before image."""
        s = self.splits[split]
        before = s.before[idx]
        if swap is not None:
            before = torch.where(swap, s.nsc[idx], before)
        return self.images.batch(before), self.images.batch(s.after[idx])


def load_clip_data(dataset: ClevrChange, *, image_size: int, max_len: int,
                   splits: Sequence[str] = ("train", "val", "test"), cache_dir: str | Path | None = None,
                   progress: bool = False) -> ClipData:
    """Images of every pair of ``splits`` decoded once at ``image_size``; captions tokenised with CLIP's BPE.
    Scene descriptions (when the dataset has ``scene_descriptions.json``) of before and semantic-after images."""
    from idckit.models.clip4idc import tokenize_captions

    root = Path(dataset.root)
    per_split = {s: dataset.pairs(s, check_images=False) for s in splits}
    rel = lambda p: Path(p).relative_to(root).as_posix()  # noqa: E731
    paths = [rel(x) for ps in per_split.values() for p in ps for x in (p.before, p.after)]
    images = ImageCache.build(root, paths, image_size, cache_dir=cache_dir, progress=progress)
    out: dict[str, ClipSplit] = {}
    for split, pairs in per_split.items():
        # pairs come as (semantic, distractor) per index: the distractor's after image is the index's nsc image
        nsc_of = {p.index: rel(p.after) for p in pairs if not p.is_change}
        texts = [c for p in pairs for c in p.captions]
        out[split] = ClipSplit(
            pair_ids=[p.pair_id for p in pairs], types=[p.change_type for p in pairs],
            before=images.rows([rel(p.before) for p in pairs]), after=images.rows([rel(p.after) for p in pairs]),
            nsc=images.rows([nsc_of.get(p.index, rel(p.after)) for p in pairs]),
            is_change=torch.tensor([p.is_change for p in pairs]),
            references={p.pair_id: list(p.captions) for p in pairs},
            sample_pair=torch.tensor([i for i, p in enumerate(pairs) for _ in p.captions], dtype=torch.long),
            sample_ids=tokenize_captions(texts, max_len))
    data = ClipData(images=images, splits=out, max_len=max_len)
    desc_path = root / "scene_descriptions.json"
    if desc_path.is_file():
        desc = json.loads(desc_path.read_text())
        for split, pairs in per_split.items():
            imgs = list(dict.fromkeys(x for p in pairs if p.is_change for x in (p.before, p.after)))
            missing = [x.name for x in imgs if x.name not in desc]
            if missing:
                raise DatasetError(f"scene_descriptions.json has no description for {missing[:3]}", path=desc_path,
                                   fix="regenerate the synthetic dataset (the generator writes every image's)")
            data.descriptions[split] = (images.rows([rel(x) for x in imgs]),
                                        tokenize_captions([desc[x.name] for x in imgs], max_len))
    return data


def _batched(n: int, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    size = min(size, n)
    for i in range(0, n - n % size, size):
        yield order[i:i + size]


def _scaled(groups: list[dict], base_lr: float) -> list[dict]:
    """The models' param_groups carry absolute ``lr``; the loop wants ``lr_scale`` of its schedule's lr."""
    out = []
    for g in groups:
        g = dict(g)
        g["lr_scale"] = g.pop("lr") / base_lr
        if g["params"]:
            out.append(g)
    return out


def _clip(name: str, weights: str | Path | None):
    from idckit.models.clip_loader import load_clip

    return load_clip(name, weights)[0]


# ---------------------------------------------------------------------------------------------------------------
# The stand-in CLIP
# ---------------------------------------------------------------------------------------------------------------

class ClipPretrainTask:
    """Contrastive image <-> scene-description training of a small open_clip model from scratch."""

    selection_metric = "t2p_R@1"

    def __init__(self, data: ClipData, model_name: str, *, batch_size: int, eval_batch_size: int = 256):
        if "train" not in data.descriptions:
            raise ConfigError("pre-training the stand-in CLIP needs scene_descriptions.json (synthetic data)",
                              fix="pass a CLIP checkpoint (clip.pretrained) for real CLEVR-Change")
        self.data, self.model_name = data, model_name
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size

    def build_model(self):
        return _clip(self.model_name, None)

    def param_groups(self, model):
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]

    def batches(self, epoch: int, generator: torch.Generator):
        rows, _ = self.data.descriptions["train"]
        yield from _batched(len(rows), self.batch_size, generator)

    def logits(self, model, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[B_text, B_image] = exp(logit_scale) * cos(text, image)."""
        from idckit.models.clip4idc import clip_text_features

        image = F.normalize(model.encode_image(self.data.images.batch(rows)), dim=-1)
        text = F.normalize(clip_text_features(model, ids), dim=-1)
        return model.logit_scale.exp() * text @ image.t()

    def train_step(self, model, batch: torch.Tensor, step: int):
        with torch.no_grad():
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        rows, ids = self.data.descriptions["train"]
        loss = symmetric_infonce(self.logits(model, rows[batch], ids[batch]))
        return loss, {"loss": float(loss.detach()), "scale": float(model.logit_scale.exp().detach())}

    @torch.no_grad()
    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        from idckit.eval.retrieval import retrieval_metrics
        from idckit.models.clip4idc import clip_text_features

        rows, ids = self.data.descriptions[split]
        img, txt = [], []
        for i in range(0, len(rows), self.eval_batch_size):
            img.append(F.normalize(model.encode_image(self.data.images.batch(rows[i:i + self.eval_batch_size])), dim=-1))
            txt.append(F.normalize(clip_text_features(model, ids[i:i + self.eval_batch_size]), dim=-1))
        sim = torch.cat(txt) @ torch.cat(img).t()
        return retrieval_metrics(sim.numpy(), torch.arange(len(rows)).numpy())


# ---------------------------------------------------------------------------------------------------------------
# Adaptation (retrieval)
# ---------------------------------------------------------------------------------------------------------------

class AdaptTask:
    """Pair <-> change-caption InfoNCE on the pair encoder built from CLIP (section 3.2)."""

    selection_metric = "t2p_R@1"

    def __init__(self, data: ClipData, clip_name: str, clip_weights: str | Path | None, *, batch_size: int,
                 n_intra: int | None = None, joint: bool = True, lr_scale_clip: float = 1e-3,
                 swap_prob: float = 0.5, eval_batch_size: int = 128):
        if not 0.0 <= swap_prob <= 1.0:
            raise ConfigError(f"swap_prob must be in [0, 1], got {swap_prob}")
        self.data, self.clip_name, self.clip_weights = data, clip_name, clip_weights
        self.batch_size, self.n_intra, self.joint = batch_size, n_intra, joint
        self.lr_scale_clip, self.swap_prob, self.eval_batch_size = lr_scale_clip, swap_prob, eval_batch_size
        train = data.splits["train"]
        # change captions of semantic pairs only (the public code leaves no-change captions out of adaptation)
        self.samples = torch.nonzero(train.is_change[train.sample_pair]).flatten()

    def build_model(self):
        from idckit.models.clip4idc import CLIP4IDCRetrieval

        return CLIP4IDCRetrieval(_clip(self.clip_name, self.clip_weights), n_intra=self.n_intra, joint=self.joint)

    def param_groups(self, model):
        return _scaled(model.param_groups(self.lr_scale_clip, 1.0), 1.0)

    def batches(self, epoch: int, generator: torch.Generator):
        for idx in _batched(len(self.samples), self.batch_size, generator):
            swap = torch.rand(len(idx), generator=generator) < self.swap_prob
            yield {"samples": self.samples[idx], "swap": swap}

    def train_step(self, model, batch, step: int):
        with torch.no_grad():
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        train = self.data.splits["train"]
        pairs = train.sample_pair[batch["samples"]]
        before, after = self.data.pair_images("train", pairs, batch["swap"])
        loss = symmetric_infonce(model(before, after, train.sample_ids[batch["samples"]]))
        return loss, {"loss": float(loss.detach())}

    @torch.no_grad()
    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        """T->IP and IP->T over the semantic pairs of ``split`` and all their change captions."""
        from idckit.eval.retrieval import retrieval_metrics

        was = model.training
        model.eval()
        s = self.data.splits[split]
        pairs = torch.nonzero(s.is_change).flatten()
        position = {int(p): i for i, p in enumerate(pairs)}
        keep = torch.tensor([int(p) in position for p in s.sample_pair])
        texts, text_pair = s.sample_ids[keep], [position[int(p)] for p in s.sample_pair[keep]]
        bs = self.eval_batch_size
        vecs = [F.normalize(model.encode_pair(*self.data.pair_images(split, pairs[i:i + bs])), dim=-1)
                for i in range(0, len(pairs), bs)]
        txt = [F.normalize(model.encode_text(texts[i:i + bs]), dim=-1) for i in range(0, len(texts), bs)]
        model.train(was)
        sim = torch.cat(txt) @ torch.cat(vecs).t()
        return retrieval_metrics(sim.numpy(), torch.tensor(text_pair).numpy())


# ---------------------------------------------------------------------------------------------------------------
# Captioning
# ---------------------------------------------------------------------------------------------------------------

def pair_encoder_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``pair_encoder.*`` weights of a saved retrieval (or captioning) model, prefix removed."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    out = {k[len("pair_encoder."):]: v for k, v in state.items() if k.startswith("pair_encoder.")}
    if not out:
        raise ConfigError(f"{path} holds no pair_encoder weights", path=path,
                          fix="pass the best.pt of an adaptation run")
    return out


class CaptionTask:
    """CLIP4IDC / CLIP-FT captioning; the pair encoder optionally starts from an adaptation run."""

    selection_metric = "CIDEr-D"

    def __init__(self, data: ClipData, clip_name: str, clip_weights: str | Path | None, captioner: Mapping[str, Any],
                 *, batch_size: int, init_pair_encoder: str | Path | None = None, lr_scale_visual: float = 1e-3,
                 eval_batch_size: int = 128, scorer=None):
        self.data, self.clip_name, self.clip_weights = data, clip_name, clip_weights
        self.captioner = {**dict(captioner), "max_len": data.max_len}
        self.batch_size, self.lr_scale_visual, self.eval_batch_size = batch_size, lr_scale_visual, eval_batch_size
        self.init_pair_encoder = Path(init_pair_encoder) if init_pair_encoder else None
        self.scorer = scorer

    def build_model(self):
        from idckit.models.clip4idc import CaptionerConfig, CLIP4IDCCaptioner

        model = CLIP4IDCCaptioner(_clip(self.clip_name, self.clip_weights), CaptionerConfig(**self.captioner))
        if self.init_pair_encoder is not None:
            model.pair_encoder.load_state_dict(pair_encoder_state(self.init_pair_encoder))
        return model

    def param_groups(self, model):
        return _scaled(model.param_groups(self.lr_scale_visual, 1.0), 1.0)

    def batches(self, epoch: int, generator: torch.Generator):
        train = self.data.splits["train"]
        counts, offsets = train.counts, train.offsets
        for pairs in _batched(len(train), self.batch_size, generator):
            pick = offsets[pairs] + (torch.rand(len(pairs), generator=generator) * counts[pairs]).long()
            yield {"pairs": pairs, "ids": train.sample_ids[pick]}

    def train_step(self, model, batch, step: int):
        before, after = self.data.pair_images("train", batch["pairs"])
        loss = model.loss(before, after, batch["ids"])
        return loss, {"loss": float(loss.detach())}

    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        from idckit.eval.captions import evaluate_pairs

        captions = predict(model, self.data, split, batch_size=self.eval_batch_size)
        s = self.data.splits[split]
        scores = evaluate_pairs(s.references, captions, dict(zip(s.pair_ids, s.types)), meteor=False,
                                scorer=self.scorer)
        return {"CIDEr-D": scores["total"]["CIDEr-D"], "Bleu_4": scores["total"]["Bleu_4"]}


def decode_ids(ids: Sequence[int], eos_id: int) -> str:
    """CLIP BPE ids after SOT -> text, cut at the first EOT, padding dropped."""
    from idckit.models.clip4idc import clip_bpe_tokenizer

    ids = list(ids)
    if eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return clip_bpe_tokenizer().decode([i for i in ids if i != 0]).strip()


@torch.inference_mode()
def predict(model, data: ClipData, split: str, *, batch_size: int = 128, progress: bool = False) -> dict[str, str]:
    """Greedy captions (KV cache, visual side computed once) for every pair of ``split``."""
    from tqdm.auto import tqdm

    from idckit.models.decoding import greedy_decode

    was = model.training
    model.eval()
    s = data.splits[split]
    out: dict[str, str] = {}
    for i in tqdm(range(0, len(s), batch_size), desc=f"decode {split}", disable=not progress):
        idx = torch.arange(i, min(i + batch_size, len(s)))
        tokens = greedy_decode(model, data.pair_images(split, idx), data.max_len - 1)
        for j, row in zip(idx.tolist(), tokens.tolist()):
            out[s.pair_ids[j]] = decode_ids(row, model.eos_id)
    model.train(was)
    return out
