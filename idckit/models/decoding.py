"""Greedy and beam decoding for any captioner that implements :class:`IncrementalCaptioner`.

The visual side runs once per batch (``start_decoding``) and every step feeds only the newest token
(``decode_step``), with earlier text kept in per-layer key/value caches. :func:`naive_greedy_decode` recomputes
everything at every step, as both papers' public code does; it is the benchmarks' baseline and the tests'
reference (identical tokens at the same weights).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class IncrementalCaptioner(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int

    def start_decoding(self, visual: Any) -> Any: ...

    def decode_step(self, state: Any, tokens: torch.LongTensor) -> torch.Tensor: ...

    def reorder_state(self, state: Any, index: torch.LongTensor) -> Any: ...

    def full_logits(self, visual: Any, tokens: torch.LongTensor) -> torch.Tensor: ...


def _batch_size(visual: Any) -> int:
    if isinstance(visual, torch.Tensor):
        return visual.shape[0]
    return _batch_size(visual[0])


def _device(visual: Any) -> torch.device:
    if isinstance(visual, torch.Tensor):
        return visual.device
    return _device(visual[0])


def _finish(out: list[torch.Tensor], batch: int, device: torch.device) -> torch.LongTensor:
    return torch.stack(out, dim=1) if out else torch.empty(batch, 0, dtype=torch.long, device=device)


@torch.inference_mode()
def greedy_decode(model, visual: Any, max_len: int) -> torch.LongTensor:
    """[B, <=max_len] token ids after BOS (EOS included); stops once every row has emitted EOS."""
    was_training = model.training
    model.eval()
    state = model.start_decoding(visual)
    b, dev = _batch_size(visual), _device(visual)
    tokens = torch.full((b,), model.bos_id, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    for _ in range(max_len):
        nxt = model.decode_step(state, tokens).argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, model.pad_id), nxt)
        out.append(nxt)
        done |= nxt == model.eos_id
        tokens = nxt
        if bool(done.all()):
            break
    model.train(was_training)
    return _finish(out, b, dev)


@torch.inference_mode()
def naive_greedy_decode(model, visual: Any, max_len: int) -> torch.LongTensor:
    """The same decision rule with no cache: the whole model re-runs on the full prefix every step."""
    was_training = model.training
    model.eval()
    b, dev = _batch_size(visual), _device(visual)
    prefix = torch.full((b, 1), model.bos_id, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    for _ in range(max_len):
        nxt = model.full_logits(visual, prefix)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, model.pad_id), nxt)
        out.append(nxt)
        done |= nxt == model.eos_id
        # A finished row keeps feeding EOS-then-pad; its later outputs are masked to pad above.
        prefix = torch.cat([prefix, nxt[:, None]], dim=1)
        if bool(done.all()):
            break
    model.train(was_training)
    return _finish(out, b, dev)


@torch.inference_mode()
def beam_search(model, visual: Any, max_len: int, beam_size: int, length_penalty: float = 0.0) -> torch.LongTensor:
    """Batched beam search; the score of a finished hypothesis is logprob / len**length_penalty."""
    if beam_size == 1:
        return greedy_decode(model, visual, max_len)
    was_training = model.training
    model.eval()
    b, k, dev = _batch_size(visual), beam_size, _device(visual)
    state = model.start_decoding(visual)
    state = model.reorder_state(state, torch.arange(b, device=dev).repeat_interleave(k))
    scores = torch.full((b, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step does not pick duplicates
    seqs = torch.empty(b * k, 0, dtype=torch.long, device=dev)
    tokens = torch.full((b * k,), model.bos_id, dtype=torch.long, device=dev)
    finished = torch.zeros(b * k, dtype=torch.bool, device=dev)
    for step in range(max_len):
        logp = model.decode_step(state, tokens).float().log_softmax(-1)  # [b*k, V]
        v = logp.shape[-1]
        # A finished beam may only extend with pad at no cost.
        frozen = torch.full_like(logp, float("-inf"))
        frozen[:, model.pad_id] = 0.0
        logp = torch.where(finished[:, None], frozen, logp)
        cand = (scores.view(-1, 1) + logp).view(b, k * v)
        top, idx = cand.topk(k, dim=-1)
        beam = idx // v
        word = idx % v
        src = (torch.arange(b, device=dev)[:, None] * k + beam).view(-1)
        state = model.reorder_state(state, src)
        seqs = torch.cat([seqs[src], word.view(-1, 1)], dim=1)
        finished = finished[src] | (word.view(-1) == model.eos_id)
        scores = top
        tokens = word.view(-1)
        if bool(finished.all()):
            break
    lengths = (seqs != model.pad_id).sum(1).clamp(min=1).float().view(b, k)
    final = scores / lengths.pow(length_penalty) if length_penalty else scores
    best = final.argmax(-1)
    model.train(was_training)
    return seqs.view(b, k, -1)[torch.arange(b, device=dev), best]
