"""Greedy and beam decoding for any captioner that implements :class:`IncrementalCaptioner`.

The visual side runs once per batch (``start_decoding``) and every step feeds only the newest token
(``decode_step``), with earlier text kept in per-layer key/value caches. :func:`naive_greedy_decode` recomputes
everything at every step, as both papers' public code does; it is the benchmarks' baseline and the tests'
reference (identical tokens at the same weights).

Every caption has at least :data:`MIN_WORDS` words: before that many steps the end token and the other specials
(the tokens that decode to no word) are barred, in greedy and beam decoding alike. Without it a model whose likeliest
first token is the end token writes an empty caption, and so does almost any beam search: an empty hypothesis pays
one log-probability against a sentence's many. Neither paper's decoder needs it (both decode greedily, and a trained
model rarely ends at once); a decode whose first token is a word is unchanged by it.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from idckit.errors import ConfigError

#: the fewest words a decoded caption has (see the module docstring)
MIN_WORDS = 1


@runtime_checkable
class IncrementalCaptioner(Protocol):
    """Optionally also ``special_ids``: every other id that decodes to no word (see :data:`MIN_WORDS`)."""
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


def _non_words(model) -> list[int]:
    """The ids that decode to no word: the protocol's bos/eos/pad and the model's ``special_ids`` if it has them."""
    return sorted({model.bos_id, model.eos_id, model.pad_id, *getattr(model, "special_ids", ())})


def _check_lengths(max_len: int, min_len: int) -> None:
    if min_len < 0 or max_len < min_len:
        raise ConfigError(f"decoding needs max_len >= min_len >= 0, got max_len {max_len} and min_len {min_len}: "
                          "no room for the words a caption must have",
                          fix=f"decode with max_len >= {max(min_len, 1)} (a run's max_len - 1)")


def _bar_non_words(model, scores: torch.Tensor, step: int, min_len: int) -> torch.Tensor:
    """``scores`` [N, V] with every non-word at -inf while ``step < min_len``; refused if no word is left."""
    if step >= min_len:
        return scores
    barred = torch.tensor(_non_words(model), dtype=torch.long, device=scores.device)
    scores = scores.index_fill(-1, barred, float("-inf"))
    if step == 0 and not bool((scores > float("-inf")).any(-1).all()):
        raise ConfigError(f"no word can start a caption: the model scores {scores.shape[-1]} tokens, and every one "
                          "that is not a special token (ids " + ", ".join(map(str, barred.tolist())) + ") scores "
                          "-inf or NaN", fix="check the vocabulary has words and the weights are finite "
                                             "(a vocabulary of specials only, or a diverged run, decodes nothing)")
    return scores


def _finish(out: list[torch.Tensor], batch: int, device: torch.device) -> torch.LongTensor:
    return torch.stack(out, dim=1) if out else torch.empty(batch, 0, dtype=torch.long, device=device)


@torch.inference_mode()
def greedy_decode(model, visual: Any, max_len: int, min_len: int = MIN_WORDS) -> torch.LongTensor:
    """[B, <=max_len] token ids after BOS (EOS included); stops once every row has emitted EOS. The first
    ``min_len`` tokens are words."""
    _check_lengths(max_len, min_len)
    was_training = model.training
    model.eval()
    state = model.start_decoding(visual)
    b, dev = _batch_size(visual), _device(visual)
    tokens = torch.full((b,), model.bos_id, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    for step in range(max_len):
        nxt = _bar_non_words(model, model.decode_step(state, tokens), step, min_len).argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, model.pad_id), nxt)
        out.append(nxt)
        done |= nxt == model.eos_id
        tokens = nxt
        if bool(done.all()):
            break
    model.train(was_training)
    return _finish(out, b, dev)


@torch.inference_mode()
def naive_greedy_decode(model, visual: Any, max_len: int, min_len: int = MIN_WORDS) -> torch.LongTensor:
    """The same decision rule with no cache: the whole model re-runs on the full prefix every step."""
    _check_lengths(max_len, min_len)
    was_training = model.training
    model.eval()
    b, dev = _batch_size(visual), _device(visual)
    prefix = torch.full((b, 1), model.bos_id, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    for step in range(max_len):
        nxt = _bar_non_words(model, model.full_logits(visual, prefix)[:, -1], step, min_len).argmax(-1)
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
def beam_search(model, visual: Any, max_len: int, beam_size: int, length_penalty: float = 0.0,
                min_len: int = MIN_WORDS) -> torch.LongTensor:
    """Batched beam search; the score of a finished hypothesis is logprob / len**length_penalty. The first
    ``min_len`` tokens of every hypothesis are words."""
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ConfigError(f"the beam width must be an integer >= 1, got {beam_size!r}", fix="1 is greedy decoding")
    if beam_size == 1:
        return greedy_decode(model, visual, max_len, min_len)
    _check_lengths(max_len, min_len)
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
        logp = _bar_non_words(model, model.decode_step(state, tokens).float().log_softmax(-1), step, min_len)
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
