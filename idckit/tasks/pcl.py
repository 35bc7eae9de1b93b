"""IDC-PCL's two kinds of run as :class:`idckit.train.task.Task` objects for the one training loop.

- :class:`PretrainTask`: each step draws ONE task from a pool filled by the ratios (MLM:MVCL:FDA = 8:1:2 on
  CLEVR), as the public ``MetaLoader`` does, and the step's batch serves only that task.
- :class:`FinetuneTask`: seq2seq masked-LM fine-tuning under the uni-directional mask (the paper's section 2.3,
  the public code's ``dataset_finetune_clver``) plus the distractor-judging loss; val CIDEr-D selects the
  checkpoint (ROUGE-L on Birds-to-Words).

The data arrives built (:class:`idckit.text.pcl_inputs.PCLData`); a batch's feature rows are read, copied to the
model's device and converted there. Every random draw of a batch (order, task, masks) comes from the generator the
loop passes to ``batches``, so a resumed run replays the same batches.

Under torchrun each rank trains on its rank-strided rows of the global batch (``shard``); every loss divides its
local sum by the global count (:func:`idckit.train.distributed.global_mean`), MVCL's negatives are the unmasked
regions of the whole global batch (raw features, so every rank has them without communication) and FDA is
sharded by whole groups (a pair with its caption and its negatives). The N-process gradient is the one-process
gradient at the same global batch. Decoding for evaluation is split over the ranks and gathered.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from tqdm.auto import tqdm

from idckit import checkpoints
from idckit.data.clevr_change import DISTRACTOR
from idckit.text.pcl_inputs import PCLData
from idckit.device import copy_to, model_device
from idckit.errors import ConfigError
from idckit.eval.captions import evaluate_pairs
from idckit.losses import fda_nce, fgvc_loss, judge_loss, mlm_loss, mvcl_nce
from idckit.models.decoding import MIN_WORDS, beam_search, greedy_decode
from idckit.models.pcl import MASK_NONE_CHOSEN, PCL, PCLConfig, mask_regions, mask_tokens, replacement_ids
from idckit.tasks.references import pick_references
from idckit.train import distributed

PRETRAIN_TASKS = ("mlm", "mvcl", "fda", "fgvc")
#: what an FDA batch draws: "pairs", train pairs uniformly, each with one random reference as the positive (the
#: kit's); "captions", (pair, caption) samples uniformly, every caption of a pair a positive with the pair's
#: negatives (the authors' load_neg_data, one sample per caption: clver/utils.py:135-142)
FDA_SAMPLES = ("pairs", "captions")
#: how pre-training draws each task's rows: "fresh", a fresh random subset every step (the kit's); "epochs", each
#: task walks its own shuffled epochs without replacement, the last batch of an epoch short, then reshuffles (the
#: authors' per-task DataLoader(shuffle=True) in their MetaLoader: clver/pretrain.py:100,
#: clver/data/dataset_pretrain_clver.py:206-242)
PRETRAIN_SAMPLING = ("fresh", "epochs")
#: what fine-tuning predicts: "masked", the paper's ~mask_prob of the words (and eos_prob of the [EOS]) replaced by
#: [MASK] in the caption; "every", each position through its own [MASK] query over the clean words before it
#: (:meth:`PCL.forward_grouped` with ``queries``), the context greedy decoding gives it
FINETUNE_TARGETS = ("masked", "every")
#: how fine-tuning reduces its terms: "mean", the caption CE averaged over the labelled tokens plus
#: ``distractor_weight`` x the judge CE averaged over the pairs; "sum", both summed over the batch, as the authors'
#: ``clver/finetune.py:156-157`` and ``bird/finetune.py:162`` do (``loss.sum()`` of per-token and per-pair terms).
#: The sum weighs the judge by pairs against the caption by tokens (about 1.6x less than the mean does on
#: CLEVR-Change) and scales every gradient by the batch's token count, which is what Adam's coupled
#: ``weight_decay`` is weighed against (birds: 1e-4 against a sum of ~100 tokens per sample)
LOSS_REDUCTIONS = ("mean", "sum")


def _batched(n: int, size: int, generator: torch.Generator, drop_last: bool = True) -> Iterator[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    stop = n - n % size if drop_last and n >= size else n
    for i in range(0, stop, size):
        yield order[i:i + size]


def build_config(model: Mapping[str, Any], *, vocab_size: int, feat_dim: int, n_regions: int,
                 max_text_len: int) -> PCLConfig:
    """The one place a :class:`PCLConfig` is put together from a run's model section and the sizes only data
    knows (training here, :func:`idckit.experiments.pcl.load_run` from a run's files); a named config of a profile
    is :func:`idckit.experiments.config.model_config`."""
    return PCLConfig(vocab_size=vocab_size, feat_dim=feat_dim, n_regions=n_regions, max_text_len=max_text_len,
                     **model)


def data_sizes(data: PCLData) -> dict[str, int]:
    """The sizes a model config takes from the data it trains on."""
    return {"vocab_size": len(data.vocab), "feat_dim": data.feat_dim, "n_regions": data.features.shape[1],
            "max_text_len": data.max_len}


class _PCLTask:
    def __init__(self, data: PCLData, model: Mapping[str, Any], *, batch_size: int, init_from: str | Path | None,
                 mask_random_from: str = "words", mask_none_chosen: str = "smallest"):
        self.data, self.model_settings, self.batch_size = data, dict(model), batch_size
        self.init_from = Path(init_from) if init_from else None
        if mask_none_chosen not in MASK_NONE_CHOSEN:
            raise ConfigError(f"mask_none_chosen must be one of {', '.join(MASK_NONE_CHOSEN)}, got "
                              f"{mask_none_chosen!r}", fix='"first" is the authors\' (paper profile), "smallest" '
                                                           'the kit\'s')
        # MLM's masking rules (models.pcl.MASK_RANDOM_FROM, MASK_NONE_CHOSEN): the authors' at paper
        self.masking = {"random_ids": replacement_ids(data.vocab, mask_random_from,
                                                      self.model_settings["special_tokens"]),
                        "none_chosen": mask_none_chosen}

    def build_model(self) -> PCL:
        model = PCL(build_config(self.model_settings, **data_sizes(self.data)), self.data.vocab)
        if self.init_from is not None:
            state = checkpoints.load(self.init_from, what="init_from checkpoint",
                                     fix="pass the best.pt or last.pt of a finished pre-training run as init_from")
            # a pre-training model's other heads may differ (load_pretrained reports them); NaN or Inf, a number
            # where a float belongs, or no state dict at all may not
            bad = [p for p in checkpoints.problems(state, model.state_dict(), allow_missing=model.state_dict())
                   if not p.startswith(("keys the model does not have", "shapes that do not fit"))]
            if bad:
                raise ConfigError(f"the init_from checkpoint cannot start this model: {'; '.join(bad)}",
                                  path=self.init_from, fix="pass the best.pt of a pre-training run of this data")
            model.load_pretrained(state)
        return model

    def param_groups(self, model):
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]


class PretrainTask(_PCLTask):
    """MLM, MVCL, FDA (and, on birds, FGVC), one task per step drawn from the ratio pool."""

    selection_metric = None  # the public code keeps the last pre-training checkpoint

    def __init__(self, data: PCLData, model: Mapping[str, Any], *, batch_size: int, ratios: Mapping[str, int],
                 mask_prob: float, eos_prob: float, region_prob: float, tau_mvcl: float, tau_fda: float,
                 steps_per_epoch: int | None = None, init_from=None, mask_random_from: str = "words",
                 mask_none_chosen: str = "smallest", fda_samples: str = "pairs", sampling: str = "fresh"):
        super().__init__(data, model, batch_size=batch_size, init_from=init_from, mask_random_from=mask_random_from,
                         mask_none_chosen=mask_none_chosen)
        if fda_samples not in FDA_SAMPLES:
            raise ConfigError(f"fda_samples must be one of {', '.join(FDA_SAMPLES)}, got {fda_samples!r}",
                              fix='"captions" is the authors\' (paper profile), "pairs" the kit\'s')
        if sampling not in PRETRAIN_SAMPLING:
            raise ConfigError(f"sampling must be one of {', '.join(PRETRAIN_SAMPLING)}, got {sampling!r}",
                              fix='"epochs" is the authors\' (paper profile), "fresh" the kit\'s')
        self.fda_samples, self.sampling = fda_samples, sampling
        unknown = set(ratios) - set(PRETRAIN_TASKS)
        if unknown or not any(ratios.values()):
            raise ConfigError(f"pre-training ratios must name some of {PRETRAIN_TASKS} with positive counts, "
                              f"got {dict(ratios)}")
        self.pool = [t for t in PRETRAIN_TASKS for _ in range(int(ratios.get(t, 0)))]
        if "fgvc" in self.pool and data.fgvc is None:
            raise ConfigError("the fgvc task needs FGVC image pairs (PCLData.fgvc)",
                              fix="load NABirds pairs, or drop fgvc from the ratios")
        if "fda" in self.pool:
            self.neg_ids = data.negative_ids()
            self.n_neg = self.neg_ids.shape[1]
        train = data.splits["train"]
        self.offsets, self.counts = train.reference_ranges()
        self.steps_per_epoch = steps_per_epoch or max(1, len(train.sample_pair) // batch_size)
        self.mask_prob, self.eos_prob, self.region_prob = mask_prob, eos_prob, region_prob
        self.tau_mvcl, self.tau_fda = tau_mvcl, tau_fda

    def _units(self, task: str) -> tuple[int, int]:
        """(how many rows ``task`` draws from, how many a batch takes): train pairs or (pair, caption) samples for
        FDA (``fda_samples``) with batch_size // (1 + negatives) positives, FGVC's image pairs, else samples."""
        train = self.data.splits["train"]
        if task == "fda":
            n = len(train) if self.fda_samples == "pairs" else len(train.sample_pair)
            return n, max(1, self.batch_size // (self.n_neg + 1))
        if task == "fgvc":
            return len(self.data.fgvc.rows1), self.batch_size
        return len(train.sample_pair), self.batch_size

    def _fresh(self, generator: torch.Generator) -> Iterator[tuple[str, torch.Tensor]]:
        """(task, rows) of each step of an epoch, the rows a fresh random subset."""
        for _ in range(self.steps_per_epoch):
            task = self.pool[int(torch.randint(len(self.pool), (1,), generator=generator))]
            n, size = self._units(task)
            yield task, torch.randperm(n, generator=generator)[:size]

    def _epochs(self, generator: torch.Generator) -> Iterator[tuple[str, torch.Tensor]]:
        """(task, rows) of every step, without end (the loop stops at max_steps, and a resumed run replays the
        draws): each task walks its own shuffled epochs, as a DataLoader(shuffle=True) per task does."""
        orders: dict[str, torch.Tensor] = {}
        at: dict[str, int] = {}
        while True:
            task = self.pool[int(torch.randint(len(self.pool), (1,), generator=generator))]
            n, size = self._units(task)
            if task not in orders or at[task] >= n:
                orders[task], at[task] = torch.randperm(n, generator=generator), 0
            yield task, orders[task][at[task]:at[task] + size]
            at[task] += size

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, Any]]:
        train, vocab = self.data.splits["train"], self.data.vocab
        draws = self._epochs(generator) if self.sampling == "epochs" else self._fresh(generator)
        for task, rows in draws:
            if task == "fda":
                if self.fda_samples == "pairs":
                    # one reference per pair as the positive, then its negatives
                    pairs = rows
                    pick = self.offsets[pairs] + (torch.rand(len(pairs), generator=generator)
                                                  * self.counts[pairs]).long()
                else:                          # each (pair, caption) sample: its caption, then its pair's negatives
                    pairs, pick = train.sample_pair[rows], rows
                pos = train.sample_ids[pick][:, None]
                texts = torch.cat([pos, self.neg_ids[pairs]], dim=1).flatten(0, 1)   # [P*(1+K), L]
                yield {"task": "fda", "pairs": pairs.repeat_interleave(self.n_neg + 1), "text": texts,
                       "groups": self.n_neg + 1}
                continue
            if task == "fgvc":
                yield {"task": "fgvc", "pairs": rows}
                continue
            samples = rows
            ids = train.sample_ids[samples]
            batch = {"task": task, "pairs": train.sample_pair[samples]}
            if task == "mlm":
                batch["text"], batch["labels"] = mask_tokens(ids, vocab, generator, p=self.mask_prob,
                                                             eos_p=self.eos_prob, **self.masking)
            else:
                batch["text"] = ids
                regions = mask_regions(len(samples), self.data.features.shape[1], generator, p=self.region_prob)
                if self.data.blank_row is not None:
                    # a single-image caption pair: MVCL masks its one real image, never the blank
                    lone = self.data.is_blank("train", batch["pairs"])
                    regions[lone, 0] |= regions[lone, 1]
                    regions[lone, 1] = False
                batch["regions"] = regions
            yield batch

    def load(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its feature rows read (float16, CPU): a DataLoader worker's part of the step."""
        if batch["task"] == "fgvc":
            return {**batch, "features": self.data.read_fgvc(batch["pairs"])}
        out = {**batch, "features": self.data.read_pairs("train", batch["pairs"])}
        if "negative_pairs" in batch:
            out["negative_features"] = self.data.read_pairs("train", batch["negative_pairs"])
        return out

    def shard(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's rows of a global batch (whole FDA groups); MVCL keeps the global batch for its negatives."""
        if batch["task"] == "fda":
            g = batch["groups"]
            groups = distributed.shard(torch.arange(len(batch["pairs"]) // g))
            rows = (groups[:, None] * g + torch.arange(g)).flatten()
        else:
            rows = distributed.shard(torch.arange(len(batch["pairs"])))
        out = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        if batch["task"] == "mvcl":
            out["negative_pairs"], out["negative_regions"] = batch["pairs"], batch["regions"]
        return out

    def train_step(self, model: PCL, batch: dict[str, Any], step: int):
        dev = model_device(model)
        task = batch["task"]
        if task == "fgvc":
            return self._fgvc_step(model, batch["pairs"], batch.get("features"))
        f1, f2 = self.data.pair_features("train", batch["pairs"], dev, batch.get("features"))
        if self._lone(model, batch["pairs"]):
            f2 = None                          # one image each: [IMG1, regions, IMG2] (single_image="lone")
        if task == "mlm":
            out = model(f1, f2, batch["text"].to(dev), mode="pretrain")
            labels = batch["labels"].to(dev)
            keep = labels != -100
            loss = distributed.global_mean(mlm_loss(model.mlm_logits(out.text[keep]), labels[keep], "sum"),
                                           int(keep.sum()))
        elif task == "mvcl":
            regions = batch["regions"].to(dev)
            out = model(f1, f2, batch["text"].to(dev), mode="pretrain", region_mask=regions)
            n = regions.shape[2]
            if f2 is None:                     # lone images: the batches mask image 1 of a single-image caption
                regions = regions[:, :1]
                visual, original = out.visual[:, None, 1:1 + n], f1[:, None]                        # [B, 1, n, .]
            else:
                visual = torch.stack([out.visual[:, 1:1 + n], out.visual[:, 2 + n:2 + 2 * n]], dim=1)  # [B, 2, n, d]
                original = torch.stack([f1, f2], dim=1)                                                 # [B, 2, n, F]
            pred = model.mvcl_regress(visual[regions])
            public = model.cfg.mvcl_negatives == "public"
            if public:                         # the regression outputs at this process's unmasked regions
                neg_pairs, free, pool = batch["pairs"], ~regions, None
            elif "negative_pairs" in batch:    # a rank's shard: the negatives are those of the whole batch
                neg_pairs, free = batch["negative_pairs"], ~batch["negative_regions"].to(dev)[:, :regions.shape[1]]
                g1, g2 = self.data.pair_features("train", neg_pairs, dev, batch.get("negative_features"))
                pool = torch.stack([g1, g2], dim=1)[:, :regions.shape[1]]
            else:
                neg_pairs, free, pool = batch["pairs"], ~regions, original
            if self.data.blank_row is not None and f2 is not None:    # a blank image's zero regions are no negatives
                blank = self.data.is_blank("train", neg_pairs)
                free = free.clone()
                free[:, 1] &= ~blank.to(dev)[:, None]
            negatives = model.mvcl_regress(visual[free]) if public else pool[free]
            loss = distributed.global_mean(
                mvcl_nce(pred, original[regions], negatives, tau=self.tau_mvcl, reduction="sum",
                         in_batch_targets=public), int(regions.sum()))
        elif task == "fda":
            out = model(f1, f2, batch["text"].to(dev), mode="pretrain")
            sims = model.fda_similarity(out).view(-1, batch["groups"])
            loss = distributed.global_mean(fda_nce(sims[:, 0], sims[:, 1:], tau=self.tau_fda, reduction="sum"),
                                           len(sims))
        else:
            raise ConfigError(f"unknown pre-training task {task!r}")
        return loss, {task: float(loss.detach())}

    def _lone(self, model: PCL, pairs: torch.Tensor) -> bool:
        """Whether the batch is single-image captions to lay out as lone images (``single_image="lone"``)."""
        if model.cfg.single_image != "lone" or self.data.blank_row is None:
            return False
        blank = self.data.is_blank("train", pairs)
        if bool(blank.any()) and not bool(blank.all()):
            raise ConfigError("a pre-training batch mixes single-image captions with image pairs, which the lone "
                              "layout cannot batch", fix="set the model's single_image to 'blank', or pre-train "
                                                         "the single-image captions in a stage of their own")
        return bool(blank.all())

    def _fgvc_step(self, model: PCL, idx: torch.Tensor, read: tuple[torch.Tensor, torch.Tensor] | None):
        """Classification of each image + same-class matching of the pair + in-batch class contrast, summed
        unweighted (the public code's ``nabirds_forward``)."""
        fg, dev = self.data.fgvc, model_device(model)
        if read is None:
            read = self.data.read_fgvc(idx)
        f1, f2 = copy_to(read[0], dev).float(), copy_to(read[1], dev).float()
        classes, match, single = model.fgvc_logits(f1, f2)
        labels = torch.stack([fg.class1[idx], fg.class2[idx]], 1).to(dev)
        loss, parts = fgvc_loss(classes, match, single, labels)
        return loss, {k: float(v.detach()) for k, v in parts.items()}

    def evaluate(self, model, split: str = "val") -> dict[str, float]:
        return {}


class FinetuneTask(_PCLTask):
    """Masked-LM captioning under the uni-directional mask, plus the distractor-judging loss.

    Two batch layouts:

    - ``group_by_pair=False`` (the public code's): ``batch_size`` (pair, caption) samples drawn uniformly, so a
      pair with more references is seen more often and the judge sees a pair once per caption;
    - ``group_by_pair=True``: ``batch_size // captions_per_pair`` pairs, ``captions_per_pair`` references each
      (without replacement where a pair has enough), the visual side computed once per pair
      (:meth:`PCL.forward_grouped`). Pairs come as whole before-images, each with its change and its distractor,
      so every batch is balanced and the judge compares the same scene with and without a change.
    """

    selection_metric = "CIDEr-D"

    def __init__(self, data: PCLData, model: Mapping[str, Any], *, batch_size: int, mask_prob: float,
                 eos_prob: float, distractor_weight: float, eval_batch_size: int, group_by_pair: bool,
                 captions_per_pair: int, targets: str, selection_metric: str, tokenize: bool, loss_reduction: str,
                 init_from=None, scorer=None, decode_min_words: int = MIN_WORDS, mask_random_from: str = "words",
                 mask_none_chosen: str = "smallest"):
        super().__init__(data, model, batch_size=batch_size, init_from=init_from, mask_random_from=mask_random_from,
                         mask_none_chosen=mask_none_chosen)
        if isinstance(decode_min_words, bool) or not isinstance(decode_min_words, int) or decode_min_words < 0:
            raise ConfigError(f"finetune.decode_min_words must be an integer >= 0, got {decode_min_words!r}",
                              fix="0 is the authors' greedy decoding (paper profile), 1 the kit's")
        self.decode_min_words = decode_min_words
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ConfigError(f"finetune.loss_reduction must be one of {', '.join(LOSS_REDUCTIONS)}, got "
                              f"{loss_reduction!r}", fix='"sum" is the authors\' (paper profile), "mean" the kit\'s')
        self.loss_reduction = loss_reduction
        if targets not in FINETUNE_TARGETS:
            raise ConfigError(f"finetune.targets must be one of {', '.join(FINETUNE_TARGETS)}, got {targets!r}",
                              fix='"masked" is the paper\'s masked-LM fine-tuning; "every" trains every position')
        if targets == "every" and not group_by_pair:
            raise ConfigError('finetune.targets "every" needs finetune.group_by_pair true',
                              fix="set finetune.group_by_pair to true (the grouped forward holds the queries)")
        self.targets = targets
        # Birds-to-Words selects on ROUGE-L and its text is already tokenised (no PTB tokenizer)
        self.selection_metric, self.tokenize = selection_metric, tokenize
        self.mask_prob, self.eos_prob, self.distractor_weight = mask_prob, eos_prob, distractor_weight
        self.eval_batch_size = eval_batch_size
        self.scorer = scorer
        self.group_by_pair, self.captions_per_pair = bool(group_by_pair), int(captions_per_pair)
        if self.group_by_pair:
            if self.captions_per_pair < 1 or batch_size < 2 * self.captions_per_pair:
                raise ConfigError(f"captions_per_pair must be >= 1 and batch_size >= 2 x captions_per_pair, got "
                                  f"{self.captions_per_pair} and {batch_size}",
                                  fix="set finetune.captions_per_pair (e.g. 4) and batch_size (e.g. 128) in the config")
            train = data.splits["train"]
            self.offsets, self.counts = train.reference_ranges()
            self.before_groups = train.before_groups()

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, Any]]:
        if self.group_by_pair:
            yield from self._grouped_batches(generator)
            return
        train = self.data.splits["train"]
        for samples in _batched(len(train.sample_pair), self.batch_size, generator):
            text, labels = mask_tokens(train.sample_ids[samples], self.data.vocab, generator,
                                       p=self.mask_prob, eos_p=self.eos_prob, **self.masking)
            yield {"pairs": train.sample_pair[samples], "text": text, "labels": labels}

    def _grouped_batches(self, generator: torch.Generator) -> Iterator[dict[str, Any]]:
        train, k = self.data.splits["train"], self.captions_per_pair
        per_group = max(1, round(len(train) / len(self.before_groups)))
        n_groups = max(1, self.batch_size // k // per_group)
        for chosen in _batched(len(self.before_groups), n_groups, generator):
            pairs = torch.tensor([i for g in chosen.tolist() for i in self.before_groups[g]], dtype=torch.long)
            samples = pick_references(self.offsets[pairs], self.counts[pairs], k, generator)
            ids = train.sample_ids[samples.flatten()]
            length = ids.shape[1]
            if self.targets == "every":       # clean text; the label of query i is the word at position i
                text, labels = ids, ids[:, 1:].masked_fill(ids[:, 1:] == self.data.vocab.pad_id, -100)
            else:
                text, labels = mask_tokens(ids, self.data.vocab, generator, p=self.mask_prob, eos_p=self.eos_prob,
                                           **self.masking)
            yield {"pairs": pairs, "text": text.view(len(pairs), k, length),
                   "labels": labels.reshape(len(pairs), k, -1)}

    def load(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its pairs' features read (float16, CPU): a DataLoader worker's part of the step."""
        return {**batch, "features": self.data.read_pairs("train", batch["pairs"])}

    def shard(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's rows of a global batch: pairs (with all their captions when grouped)."""
        rows = distributed.shard(torch.arange(len(batch["pairs"])))
        return {k: v[rows] for k, v in batch.items()}

    def train_step(self, model: PCL, batch: dict[str, Any], step: int):
        dev = model_device(model)
        f1, f2 = self.data.pair_features("train", batch["pairs"], dev, batch.get("features"))
        text, labels = batch["text"].to(dev), batch["labels"].to(dev)
        if text.dim() == 3:
            out = model.forward_grouped(f1, f2, text, queries=self.targets == "every")
            labels = labels.flatten(0, 1)
        else:
            out = model(f1, f2, text, mode="finetune")
        keep = labels != -100
        loss = self._reduce(mlm_loss(model.mlm_logits(out.text[keep]), labels[keep], "sum"), int(keep.sum()))
        logs = {"mlm": float(loss.detach())}
        if model.cfg.distractor_head and self.distractor_weight:
            target = self.data.splits["train"].is_change[batch["pairs"]].to(dev)
            judge = self._reduce(judge_loss(model.judge_logits(out), target, reduction="sum"), len(target))
            loss = loss + self.distractor_weight * judge
            logs["judge"] = float(judge.detach())
        return loss, logs

    def _reduce(self, local_sum: torch.Tensor, local_count: int) -> torch.Tensor:
        """A term's loss from this rank's sum of it (:data:`LOSS_REDUCTIONS`). Under DDP's gradient averaging,
        ``local_sum * world`` has the gradient of the global batch's sum, as ``global_mean`` has its mean's."""
        if self.loss_reduction == "sum":
            return local_sum * distributed.world()
        return distributed.global_mean(local_sum, local_count)

    def evaluate(self, model: PCL, split: str = "val", *, tokenize: bool | None = None) -> dict[str, float]:
        """Val metrics, scored once on rank 0 (the other ranks of a torchrun group decode their share and
        return {}). ``tokenize`` None: the task's own text rule; False: the raw strings split on spaces, as the
        authors' selection scores them (the loop's ``authors_selection``)."""
        preds = predict(model, self.data, split, batch_size=self.eval_batch_size, min_words=self.decode_min_words)
        if not distributed.is_main():
            return {}
        s = self.data.splits[split]
        scores = evaluate_pairs(s.references, preds["captions"], dict(zip(s.pair_ids, s.types)),
                                meteor=False, scorer=self.scorer,
                                tokenize=self.tokenize if tokenize is None else tokenize)
        out = {k: scores["total"][k] for k in ("CIDEr-D", "Bleu_4", "ROUGE_L")}
        # the total rewards a constant "no change" caption on the distractor half; the halves show what it hides
        for sub in ("semantic", DISTRACTOR):
            if sub in scores:
                out[f"CIDEr-D_{sub}"] = scores[sub]["CIDEr-D"]
        if preds["judge_accuracy"] is not None:
            out["judge_accuracy"] = preds["judge_accuracy"]
        return out


@torch.inference_mode()
def predict(model: PCL, data: PCLData, split: str, *, batch_size: int, beam: int = 1,
            progress: bool = False, min_words: int = MIN_WORDS) -> dict[str, Any]:
    """Greedy (or beam) captions for every pair of ``split``, and the distractor judgment's accuracy. Each
    caption's first ``min_words`` tokens are words (:data:`idckit.models.decoding.MIN_WORDS`).

    On the model's device. Under torchrun each rank decodes its rank-strided share of the pairs and every rank
    gets the whole result (gathered in pair order)."""
    was_training = model.training
    model.eval()
    s = data.splits[split]
    dev = model_device(model)
    captions: dict[str, str] = {}
    judged: dict[str, bool] = {}
    mine = distributed.split_evenly(torch.arange(len(s)))
    for idx in tqdm(mine.split(batch_size), desc=f"decode {split}", disable=not progress):
        f1, f2 = data.pair_features(split, idx, dev)
        if beam > 1:
            tokens = beam_search(model, (f1, f2), data.max_len - 1, beam, min_len=min_words)
        else:
            tokens = greedy_decode(model, (f1, f2), data.max_len - 1, min_words)
        for j, row in zip(idx.tolist(), tokens.tolist()):
            captions[s.pair_ids[j]] = data.vocab.decode(row, model.cfg.special_words)
        if model.cfg.distractor_head:
            # visual tokens never attend to text in fine-tuning, so one [BOS] stands for any caption
            bos = torch.full((len(idx), 1), data.vocab.bos_id, dtype=torch.long, device=dev)
            out = model(f1, f2, bos, mode="finetune")
            judged.update(zip((s.pair_ids[j] for j in idx.tolist()),
                              model.judge_logits(out).argmax(-1).bool().tolist()))
    model.train(was_training)
    if distributed.world() > 1:
        parts = distributed.gather((captions, judged))
        if parts is not None:
            captions = {k: v for c, _ in parts for k, v in c.items()}
            judged = {k: v for _, j in parts for k, v in j.items()}
        captions, judged = distributed.broadcast((captions, judged))
    captions = {p: captions[p] for p in s.pair_ids}
    judged_change = [judged[p] for p in s.pair_ids] if judged else []
    accuracy = None
    if judged_change:
        accuracy = float((torch.tensor(judged_change) == s.is_change).float().mean())
    return {"captions": captions, "judged_change": dict(zip(s.pair_ids, judged_change)),
            "judge_accuracy": accuracy}
