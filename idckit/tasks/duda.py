"""DUDA's training as a :class:`idckit.train.task.Task` for the one training loop.

A batch is a set of before-images, each with its semantic-change pair and its distractor pair and one reference
drawn at random for each, as RCC's ``rcc_dataset`` serves (default, semantic, nonsemantic) triplets, including its
augmentation: with probability 1/2 the distractor view is the "before" image of both pairs. The loss is RCC's
``train.py``:

    L = 1/2 CE(change captions) + 1/2 CE(no-change captions) + lambda * 1/2 (sum_n a_bef + sum_n a_aft)

where each CE is the mean over the non-padding target tokens of its half (``LanguageModelCriterion``) and the
attention-mass penalty (lambda = 2.5e-3) is averaged over the change pairs only, as the public code does. Val
CIDEr-D (total) selects the checkpoint; the semantic and distractor halves are logged beside it.

The data is IDC-PCL's (:class:`idckit.text.pcl_inputs.PCLData` from
:func:`idckit.text.pcl_inputs.load_pcl_data`): same features, vocabulary and splits, so a DUDA row and an IDC-PCL row
of a table are scored on the same pairs.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
from tqdm.auto import tqdm

from idckit.data.clevr_change import DISTRACTOR
from idckit.device import copy_to, model_device
from idckit.errors import DatasetError
from idckit.eval.captions import evaluate_pairs
from idckit.losses import attention_mass, mlm_loss
from idckit.models.decoding import beam_search, greedy_decode
from idckit.models.duda import DUDA, DUDAConfig
from idckit.text.pcl_inputs import PCLData, SplitData
from idckit.text.vocab import tokenize


def build_config(data: PCLData, model: Mapping[str, Any]) -> DUDAConfig:
    return DUDAConfig(vocab_size=len(data.vocab), feat_dim=data.feat_dim, n_regions=data.features.shape[1],
                      **model)


def triplets(split: SplitData) -> tuple[torch.Tensor, torch.Tensor]:
    """(change pair, distractor pair) indices [T] of every before-image, in the split's order."""
    by_before: dict[int, dict[bool, int]] = {}
    for i, (row, change) in enumerate(zip(split.before.tolist(), split.is_change.tolist())):
        if change in by_before.setdefault(row, {}):
            raise DatasetError(f"before-image row {row} has two {'change' if change else 'distractor'} pairs "
                               f"({split.pair_ids[by_before[row][change]]}, {split.pair_ids[i]})",
                               fix="each before-image needs exactly one semantic and one distractor pair")
        by_before[row][change] = i
    incomplete = [r for r, d in by_before.items() if len(d) != 2]
    if incomplete:
        raise DatasetError(f"{len(incomplete)} before-images lack a semantic or a distractor pair",
                           fix="each before-image needs exactly one semantic and one distractor pair")
    return (torch.tensor([d[True] for d in by_before.values()], dtype=torch.long),
            torch.tensor([d[False] for d in by_before.values()], dtype=torch.long))


def targets(ids: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) for teacher forcing, trimmed to the longest caption: inputs [BOS] w1 .. , labels w1 ..
    [EOS] with -100 at padding."""
    length = int((ids != pad_id).sum(1).max())
    ids = ids[:, :length]
    labels = ids[:, 1:].masked_fill(ids[:, 1:] == pad_id, -100)
    return ids[:, :-1], labels


class DUDATask:
    selection_metric = "CIDEr-D"

    def __init__(self, data: PCLData, model: Mapping[str, Any], *, batch_size: int, attention_l1: float,
                 swap_before: float, eval_batch_size: int, scorer=None):
        self.data, self.model_settings, self.batch_size = data, dict(model), batch_size
        self.attention_l1, self.swap_before = attention_l1, swap_before
        self.eval_batch_size, self.scorer = eval_batch_size, scorer
        train = data.splits["train"]
        self.change, self.distractor = triplets(train)
        self.offsets, self.counts = train.reference_ranges()
        self.no_change = no_change_sentences(data)

    def build_model(self) -> DUDA:
        return DUDA(build_config(self.data, self.model_settings), self.data.vocab)

    def param_groups(self, model):
        return [{"params": list(model.parameters())}]

    def _one_reference(self, pairs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        pick = self.offsets[pairs] + (torch.rand(len(pairs), generator=generator) * self.counts[pairs]).long()
        return self.data.splits["train"].sample_ids[pick]

    def batches(self, epoch: int, generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        """Feature rows of before / after images [2B] (B change pairs, then their B distractors) and one
        reference each. With probability ``swap_before`` a before-image trades places with its distractor image
        (RCC's augmentation: the distractor view becomes "before" of both pairs)."""
        train = self.data.splits["train"]
        n, size = len(self.change), self.batch_size
        order = torch.randperm(n, generator=generator)
        stop = n - n % size if n >= size else n
        for i in range(0, stop, size):
            t = order[i:i + size]
            change, distractor = self.change[t], self.distractor[t]
            ids = torch.cat([self._one_reference(change, generator), self._one_reference(distractor, generator)])
            default, view, changed = train.before[change], train.after[distractor], train.after[change]
            swap = torch.rand(len(t), generator=generator) < self.swap_before
            before = torch.where(swap, view, default)
            yield {"before": torch.cat([before, before]),
                   "after": torch.cat([changed, torch.where(swap, default, view)]), "ids": ids}

    def load(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The batch with its feature rows read (float16, CPU): a DataLoader worker's part of the step."""
        return {**batch, "features": (self.data.features[batch["before"]], self.data.features[batch["after"]])}

    def loss(self, model: DUDA, before: torch.Tensor, after: torch.Tensor, ids: torch.Tensor,
             read: tuple[torch.Tensor, torch.Tensor] | None = None):
        """(loss, logs) for feature rows ``before``, ``after`` [2B] whose first half are change pairs and second
        half distractor pairs, with their reference ``ids`` [2B, L]; ``read``: their features read ahead."""
        if read is None:
            read = self.data.features[before], self.data.features[after]
        dev = model_device(model)
        f1, f2 = copy_to(read[0], dev).float(), copy_to(read[1], dev).float()
        inputs, labels = targets(ids.to(dev), self.data.vocab.pad_id)
        out = model(f1, f2, inputs)
        b = len(before) // 2
        change = mlm_loss(out.logits[:b], labels[:b])
        no_change = mlm_loss(out.logits[b:], labels[b:])
        a = out.attended
        mass = attention_mass(a.att_before[:b], a.att_after[:b])
        loss = 0.5 * change + 0.5 * no_change + self.attention_l1 * mass
        return loss, {"ce_change": float(change.detach()), "ce_no_change": float(no_change.detach()),
                      "attention_mass": float(mass.detach())}

    def train_step(self, model: DUDA, batch: dict[str, torch.Tensor], step: int):
        return self.loss(model, batch["before"], batch["after"], batch["ids"], batch.get("features"))

    def evaluate(self, model: DUDA, split: str = "val") -> dict[str, float]:
        preds = predict(model, self.data, split, batch_size=self.eval_batch_size)
        s = self.data.splits[split]
        scores = evaluate_pairs(s.references, preds["captions"], dict(zip(s.pair_ids, s.types)),
                                meteor=False, scorer=self.scorer)
        out = {"CIDEr-D": scores["total"]["CIDEr-D"], "Bleu_4": scores["total"]["Bleu_4"],
               "distinct_captions": len(set(preds["captions"].values())),
               "caption_judge_accuracy": caption_judge_accuracy(preds["captions"], s, self.no_change)}
        # the total rewards a constant "no change" caption on the distractor half; the halves show what it hides
        for sub in ("semantic", DISTRACTOR):
            if sub in scores:
                out[f"CIDEr-D_{sub}"] = scores[sub]["CIDEr-D"]
        return out


def no_change_sentences(data: PCLData) -> set[str]:
    """The training distractors' references, as the decoder spells them (lower-case tokens joined by spaces)."""
    train = data.splits["train"]
    return {" ".join(tokenize(c)) for pid, change in zip(train.pair_ids, train.is_change.tolist()) if not change
            for c in train.references[pid]}


def caption_judge_accuracy(captions: Mapping[str, str], split: SplitData, no_change: set[str]) -> float:
    """DUDA has no judge head; its captions judge: a pair counts as called "no change" when its caption is one of
    the training no-change sentences. The share of pairs called right, comparable with IDC-PCL's judge accuracy."""
    right = [(captions[pid] in no_change) != change for pid, change in zip(split.pair_ids, split.is_change.tolist())]
    return sum(right) / len(right)


@torch.inference_mode()
def predict(model: DUDA, data: PCLData, split: str, *, batch_size: int, beam: int = 1,
            progress: bool = False) -> dict[str, Any]:
    """Greedy (or beam) captions for every pair of ``split``: ``{"captions": {pair_id: caption}}``."""
    was_training = model.training
    model.eval()
    s = data.splits[split]
    captions: dict[str, str] = {}
    for i in tqdm(range(0, len(s), batch_size), desc=f"decode {split}", disable=not progress):
        idx = torch.arange(i, min(i + batch_size, len(s)))
        visual = data.pair_features(split, idx, model_device(model))
        if beam > 1:
            tokens = beam_search(model, visual, data.max_len - 1, beam)
        else:
            tokens = greedy_decode(model, visual, data.max_len - 1)
        for j, row in zip(idx.tolist(), tokens.tolist()):
            captions[s.pair_ids[j]] = data.vocab.decode(row)
    model.train(was_training)
    return {"captions": captions}
