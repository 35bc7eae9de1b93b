"""Pre-training the kit's offline stand-in CLIP: contrastive image <-> scene description, train images only.

Where no model hub is reachable there are no OpenAI CLIP weights, so the kit trains its own small CLIP and saves it
as an ordinary open_clip checkpoint, which then loads through the very same ``pretrained=<file>`` path as any other
weights (``idckit.models.clip_loader.load_clip``). Every report names it "idckit stand-in CLIP (synthetic
pre-training)", never CLIP.

Data: the synthetic generator writes ``scene_descriptions.json`` = {image file: "there is a large red metal cube ,
a small ... and a ..."} (objects left to right). Only images of the TRAIN split's scenes are used (their default,
semantic and non-semantic images; a pair's two images for Spot-the-Diff and IER, whose generators write the same
file), so neither val nor test images are ever seen in pre-training. Val default (first) images (never trained on)
select the checkpoint by image <-> text R@1.

What CLIP pre-training is: symmetric InfoNCE over a batch of (image, text) with a learned temperature (open_clip's
init 1/0.07, clamped at 100 as OpenAI's). Choices for this data:

* One image per scene per batch (uniformly one of its three images): a scene's default and non-semantic images have
  the same description, so two of them in one batch would be false negatives.
* Text augmentation: a description of up to 10 objects does not fit in 32 tokens, so each sample keeps a random
  subset of its objects that fits (in their left-to-right order, so relative positions stay true). Evaluation keeps
  the first objects that fit, deterministically.
* No image augmentation: flips would make the left-to-right descriptions false, and crops would cut objects out.

Under torchrun each rank encodes its rank-strided rows of the global batch and the InfoNCE runs over the
all-gathered features: the in-batch negatives are the whole global batch's, as in one process.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F

from idckit.data.clevr_change import ClevrChange
from idckit.data.images import ImageCache
from idckit.device import model_device
from idckit.errors import DatasetError
from idckit.eval.retrieval import retrieval_metrics
from idckit.losses import clip_logits, symmetric_infonce
from idckit.models.clip4idc import clip_bpe_tokenizer, tokenize_captions
from idckit.models.clip_loader import load_clip
from idckit.train import distributed
from idckit.train.task import weight_decay_groups

MAX_LOGIT_SCALE = math.log(100.0)   # OpenAI CLIP (and CLIP4IDC's code) clamp the inverse temperature at 100


def split_objects(description: str) -> list[str]:
    """"there is A , B and C" -> ["a ...", "b ...", "c ..."]; anything else -> [description]."""
    text = " ".join(description.split())
    if not text.startswith("there is "):
        return [text]
    body = text[len("there is "):]
    head, sep, last = body.rpartition(" and ")
    parts = (head.split(" , ") + [last]) if sep else [body]
    return [p for p in parts if p]


def join_objects(objects: Sequence[str]) -> str:
    if len(objects) == 1:
        return "there is " + objects[0]
    return "there is " + " , ".join(objects[:-1]) + " and " + objects[-1]


@dataclass
class DescriptionData:
    """Images (uint8 cache) and their descriptions, split into objects with their BPE lengths."""

    images: ImageCache
    train_scenes: torch.Tensor            # [S, 3] image rows (default, semantic, non-semantic) per train scene;
                                          # [S, 2] (before, after) for Spot-the-Diff and IER
    objects: dict[int, list[str]]         # image row -> objects, left to right
    object_tokens: dict[int, list[int]]   # image row -> BPE length of each object
    val_rows: torch.Tensor                # [V] val default images: checkpoint selection
    context_length: int = 32

    def text(self, row: int, generator: torch.Generator | None = None) -> str:
        """A description of image ``row`` that fits the context: a random object subset (or the first ones)."""
        objs, lens = self.objects[row], self.object_tokens[row]
        budget = self.context_length - 4          # SOT, "there is", EOT
        order = list(range(len(objs)))
        if generator is not None:
            order = torch.randperm(len(objs), generator=generator).tolist()
        keep, used = [], 0
        for i in order:
            cost = lens[i] + (1 if keep else 0)   # a separator ("," or "and") before every object but the first
            if used + cost <= budget:
                keep.append(i)
                used += cost
        if not keep:                               # one object longer than the context: the tokenizer will cut it
            keep = [order[0]]
        return join_objects([objs[i] for i in sorted(keep)])


def read_descriptions(path: Path) -> dict[str, str]:
    """``scene_descriptions.json`` (image file -> description), or the kit's error naming it."""
    try:
        descriptions = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"malformed scene_descriptions.json ({e})", path=path,
                           fix="re-generate the synthetic dataset (`idckit generate clevr-change --overwrite`)") from e
    if not isinstance(descriptions, dict) or not all(isinstance(v, str) for v in descriptions.values()):
        raise DatasetError("scene_descriptions.json must map image file names to description strings", path=path,
                           fix="re-generate the synthetic dataset (`idckit generate clevr-change --overwrite`)")
    return descriptions


def _scene_images(dataset, split: str) -> list[list[str]]:
    """The distinct images of each index of ``split`` (relative paths, in pair order): CLEVR-Change's (default,
    semantic, non-semantic), a Spot-the-Diff or IER pair's (before, after)."""
    out: dict[int, list[str]] = {}
    for p in dataset.pairs(split):
        images = out.setdefault(p.index, [])
        for path in (p.before, p.after):
            rel = path.relative_to(dataset.root).as_posix()
            if rel not in images:
                images.append(rel)
    return list(out.values())


def load_description_data(root: str | Path, size: int, *, context_length: int = 32,
                          cache_dir: str | Path | None = None, progress: bool = False,
                          dataset=None) -> DescriptionData:
    """Train-scene images and val first images (CLEVR: default) of a root that has ``scene_descriptions.json``.

    ``dataset`` is the loader of ``root`` (default ``ClevrChange(root)``; a ``SpotTheDiff`` or ``EditingRequest``
    works the same way, its scenes being the pairs)."""
    root = Path(root)
    path = root / "scene_descriptions.json"
    if not path.is_file():
        raise DatasetError(
            "no scene_descriptions.json: the stand-in CLIP is pre-trained on the synthetic generator's "
            "single-image scene descriptions", path=path,
            fix="pre-train on the synthetic default (leave data_root unset, or `idckit generate clevr-change`), or "
                "use real CLIP weights (clip_model='ViT-B-32', pretrained='openai')")
    descriptions = read_descriptions(path)
    ds = ClevrChange(root) if dataset is None else dataset
    train = _scene_images(ds, "train")
    width = min(len(scene) for scene in train)       # 3 per CLEVR scene, 2 per pair elsewhere
    train = [scene[:width] for scene in train]
    val = [scene[0] for scene in _scene_images(ds, "val")]
    rels = [p for scene in train for p in scene] + val
    for rel in rels:
        if Path(rel).name not in descriptions:
            raise DatasetError(f"scene_descriptions.json has no description of {Path(rel).name}", path=path,
                               fix="re-generate the synthetic dataset")
    images = ImageCache.build(root, rels, size, cache_dir=cache_dir, progress=progress)
    tok = clip_bpe_tokenizer()
    objects, lengths = {}, {}
    for rel in rels:
        row = images.index[rel]
        objs = split_objects(descriptions[Path(rel).name])
        objects[row] = objs
        lengths[row] = [len(tok.encode(o)) for o in objs]
    scenes = torch.tensor([[images.index[p] for p in scene] for scene in train], dtype=torch.long).view(-1, width)
    return DescriptionData(images=images, train_scenes=scenes, objects=objects, object_tokens=lengths,
                           val_rows=images.rows(val), context_length=context_length)


def _tokenize(texts: list[str], context_length: int) -> torch.Tensor:
    return tokenize_captions(texts, context_length)


class StandinPretrainTask:
    """The loop's Task for the stand-in: symmetric InfoNCE on (train image, description); val R@1 selects."""

    selection_metric = "R@1"

    def __init__(self, data: DescriptionData, model_name: str, *, batch_size: int, weight_decay: float,
                 eval_batch_size: int):
        self.data, self.model_name, self.batch_size = data, model_name, batch_size
        self.weight_decay, self.eval_batch_size = weight_decay, eval_batch_size

    def build_model(self):
        model, _, _ = load_clip(self.model_name, None)
        if model.visual.image_size[0] != self.data.images.size or model.context_length != self.data.context_length:
            raise ValueError(f"{self.model_name} expects {model.visual.image_size[0]} px and "
                             f"{model.context_length} tokens; the data has {self.data.images.size} px and "
                             f"{self.data.context_length}")
        return model

    def param_groups(self, model) -> list[dict[str, Any]]:
        return weight_decay_groups(model.named_parameters(), self.weight_decay)

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        scenes = self.data.train_scenes
        order = torch.randperm(len(scenes), generator=generator)
        size = min(self.batch_size, len(scenes))
        for start in range(0, len(scenes) - size + 1, size):
            idx = order[start:start + size]
            which = torch.randint(scenes.shape[1], (len(idx),), generator=generator)
            rows = scenes[idx, which]
            texts = [self.data.text(int(r), generator) for r in rows]
            yield {"rows": rows, "tokens": _tokenize(texts, self.data.context_length)}

    def load(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch with its uint8 pixels read: a DataLoader worker's part of the step."""
        return {**batch, "pixels": self.data.images.read(batch["rows"])}

    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = distributed.shard(torch.arange(len(batch["rows"])))
        return {k: v[rows] for k, v in batch.items()}

    def train_step(self, model, batch: dict[str, torch.Tensor], step: int):
        with torch.no_grad():                      # the clamp after the previous step, as OpenAI and CLIP4IDC do
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        dev = model_device(model)
        image = model.encode_image(self.data.images.batch(batch["rows"], dev, batch.get("pixels")))
        text = model.encode_text(batch["tokens"].to(dev))
        # under torchrun over the rows of every rank (all-gathered with their gradients)
        logits = clip_logits(text, image, model.logit_scale, gather=distributed.gather_with_grad)
        loss = symmetric_infonce(logits)
        acc = (logits.argmax(1) == torch.arange(len(logits), device=dev)).float().mean()
        return loss, {"t2i_acc": float(acc), "logit_scale": float(model.logit_scale.detach().exp())}

    @torch.inference_mode()
    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        """Image <-> text R@1/5 on the val default images (one deterministic description each)."""
        if split != "val":
            raise ValueError("the stand-in is evaluated on val images only (test images are never touched)")
        model.eval()
        dev = model_device(model)
        rows = self.data.val_rows
        img, txt = [], []
        for i in range(0, len(rows), self.eval_batch_size):
            r = rows[i:i + self.eval_batch_size]
            img.append(F.normalize(model.encode_image(self.data.images.batch(r, dev)), dim=-1))
            tokens = _tokenize([self.data.text(int(x)) for x in r], self.data.context_length)
            txt.append(F.normalize(model.encode_text(tokens.to(dev)), dim=-1))
        sim = (torch.cat(txt) @ torch.cat(img).t()).cpu()
        m = retrieval_metrics(sim, torch.arange(len(rows)), ks=(1, 5))
        out = {"t2i_R@1": m["t2p_R@1"], "i2t_R@1": m["p2t_R@1"], "t2i_R@5": m["t2p_R@5"], "i2t_R@5": m["p2t_R@5"]}
        out["R@1"] = (out["t2i_R@1"] + out["i2t_R@1"]) / 2
        return out
