"""The decoding driver on a toy captioner whose next-token logits depend on the visual input and the prefix."""
from __future__ import annotations

import torch

from idckit.models.decoding import beam_search, greedy_decode, naive_greedy_decode


class Toy(torch.nn.Module):
    bos_id, eos_id, pad_id = 1, 2, 0

    def __init__(self, vocab=7, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(vocab, 8, generator=g))
        self.out = torch.nn.Parameter(torch.randn(8, vocab, generator=g))

    def _logits(self, visual, prefix):  # prefix [B, T] -> logits for the next token
        logits = (visual + self.emb[prefix].mean(1)) @ self.out
        eos_bias = torch.zeros(logits.shape[1])
        eos_bias[self.eos_id] = 0.8 * prefix.shape[1]  # EOS grows likelier with length, so rows end at different steps
        return logits + eos_bias

    def start_decoding(self, visual):
        return {"visual": visual, "prefix": torch.empty(visual.shape[0], 0, dtype=torch.long)}

    def decode_step(self, state, tokens):
        state["prefix"] = torch.cat([state["prefix"], tokens[:, None]], 1)
        return self._logits(state["visual"], state["prefix"])

    def reorder_state(self, state, index):
        return {"visual": state["visual"][index], "prefix": state["prefix"][index]}

    def full_logits(self, visual, tokens):
        return torch.stack([self._logits(visual, tokens[:, : t + 1]) for t in range(tokens.shape[1])], 1)


def test_cached_equals_naive_and_stops_when_all_rows_ended():
    model = Toy()
    visual = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    cached, naive = greedy_decode(model, visual, 30), naive_greedy_decode(model, visual, 30)
    assert torch.equal(cached, naive)
    assert cached.shape[1] < 30  # the growing EOS bias ends every row early
    for row in cached.tolist():
        k = row.index(Toy.eos_id)
        assert all(t == Toy.pad_id for t in row[k + 1:])  # pad after each row's EOS


def test_batch_of_one_works():  # the IDC-PCL public code crashes here (.squeeze())
    model = Toy()
    visual = torch.randn(1, 8)
    assert torch.equal(greedy_decode(model, visual, 10), naive_greedy_decode(model, visual, 10))


def test_beam_of_one_is_greedy_and_beam_scores_at_least_as_well():
    model = Toy(seed=3)
    visual = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    greedy = greedy_decode(model, visual, 12)
    assert torch.equal(beam_search(model, visual, 12, beam_size=1), greedy)
    beam = beam_search(model, visual, 12, beam_size=4)

    def logprob(seq):
        prefix = torch.full((visual.shape[0], 1), Toy.bos_id)
        total = torch.zeros(visual.shape[0])
        for t in range(seq.shape[1]):
            lp = model._logits(visual, prefix).log_softmax(-1)
            alive = (prefix[:, 1:] != Toy.eos_id).all(1) if prefix.shape[1] > 1 else torch.ones_like(total, dtype=torch.bool)
            total += torch.where(alive, lp.gather(1, seq[:, t:t + 1]).squeeze(1), torch.zeros_like(total))
            prefix = torch.cat([prefix, seq[:, t:t + 1]], 1)
        return total

    with torch.no_grad():
        assert (logprob(beam) >= logprob(greedy) - 1e-5).all()
