"""DUDA, the Dual Dynamic Attention Model (Park, Darrell, Rohrbach, "Robust Change Captioning", ICCV 2019),
readable top to bottom. It is the explicit-difference captioner that both papers' tables 2 and 3 list as a baseline.

    grid features X_bef, X_aft [B, N, F] (+ 2 coordinate channels, as RCC's ``AddSpatialInfo``)
        --> X_diff = X_aft - X_bef
        --> dual attention: one spatial map per image, a_bef from [X_bef; X_diff], a_aft from [X_aft; X_diff]
            (one shared 1x1 conv -> GroupNorm -> dropout -> ReLU -> 1x1 conv -> sigmoid)
        --> attended features l_bef = sum_n a_bef[n] X_bef[n], l_aft likewise, l_diff = l_aft - l_bef
        --> dynamic speaker, per word t:
              attention LSTM    h_a(t) = LSTM_a([embed([l_bef; l_diff; l_aft]); h_l(t-1)])
              dynamic weights   w(t)   = softmax(W h_a(t))                 over (before, diff, after)
              language LSTM     h_l(t) = LSTM_l([word(t-1); w_bef l_bef + w_diff l_diff + w_aft l_aft])
              next word         softmax(W_out dropout(h_l(t)))

Reference: RCC's public code (Seth-Park/RobustChangeCaptioning): ``models/modules.py``
(``ChangeDetectorDoubleAttDyn``, ``AddSpatialInfo``), ``models/dynamic_speaker.py`` (``DynamicCore``,
``DynamicSpeaker``), ``train.py`` (the loss) and ``configs/dynamic/dynamic.yaml`` with ``configs/config.py``
(sizes). This is a re-implementation in the kit's style, not a copy. Differences, each deliberate:

- The grid is the kit's feature store (any backbone, [N regions, F]); 1x1 convolutions over an H x W map are the
  same linear maps applied per region, so they are ``nn.Linear`` here. Coordinates are x, y in [-1, 1) per cell,
  as ``AddSpatialInfo``; the grid must be square (the store keeps only N).
- ``attention="sigmoid"`` is the public code's (and the paper's) gate: each region's weight is in (0, 1) and the
  map is not normalised, so l_bef is a sum, not an average. ``"softmax"`` normalises each map over the regions
  (sums to 1), an option for short budgets; it is not in the paper.
- The change detector's 6-way change-type classifier (``fc1``) is left out: ``train.py`` computes it and never
  uses it in the loss.
- Scheduled sampling is left out: the public config starts it at epoch 1,000,000 (never).
- The two LSTM cells are ``nn.LSTMCell`` parameters applied by hand, so the input products of what stays fixed
  over a caption are computed once per caption (same function, a fraction of the work; tested against the plain
  cells). Decoding keeps both cells' states between steps (the kit's :mod:`idckit.models.decoding` drives it)
  and stops once every row has emitted [EOS]; special ids come from the vocabulary.

Kept from the public code: shared attention weights for both images, GroupNorm(32) and dropout 0.5 in the
attention's hidden layer, ReLU + dropout on the word embedding and on the embedded [l_bef; l_diff; l_aft], the
dynamic weights' order (before, diff, after), dropout on h_l before the output layer, zero initial LSTM states,
PyTorch's default initialisation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from idckit.errors import ConfigError

ATTENTIONS = ("sigmoid", "softmax")


@dataclass
class DUDAConfig:
    """No defaults here: the grid and vocabulary come from the data, the rest from the ``model`` section of a
    profile (``idckit/experiments/configs/duda.json``, named ``duda-<profile>`` by
    :func:`idckit.experiments.config.model_config`; base = RCC's public configs)."""
    vocab_size: int
    feat_dim: int            # F of the grid features (before the 2 coordinate channels)
    n_regions: int           # N = side * side
    att_dim: int             # hidden width of the dual attention (public: change_detector.dim)
    att_groups: int          # GroupNorm groups of that hidden layer
    att_dropout: float
    attention: str
    embed_dim: int           # the embedded [l_bef; l_diff; l_aft] fed to the attention LSTM
    word_dim: int
    rnn_dim: int
    dropout: float           # public drop_prob_lm: word embedding, embedded features, h_l before the output

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"unknown DUDA attention {self.attention!r}; known: {', '.join(ATTENTIONS)}")
        if self.att_dim % self.att_groups:
            raise ConfigError(f"att_dim {self.att_dim} must be a multiple of att_groups {self.att_groups} "
                              "(GroupNorm)")
        side = math.isqrt(self.n_regions)
        if side * side != self.n_regions:
            raise ConfigError(f"DUDA needs a square feature grid for its coordinates; got {self.n_regions} regions")


@dataclass
class Attended:
    """What the dual attention hands the speaker, per pair."""

    before: torch.Tensor     # [B, F+2] l_bef
    after: torch.Tensor      # [B, F+2] l_aft
    diff: torch.Tensor       # [B, F+2] l_aft - l_bef
    att_before: torch.Tensor  # [B, N] a_bef
    att_after: torch.Tensor   # [B, N] a_aft


@dataclass
class DecodingState:
    feats: torch.Tensor      # [B, 3, F+2] (before, diff, after)
    att_in: torch.Tensor     # [B, 4H] the attention LSTM's input gates from embed([l_bef; l_diff; l_aft]) (+ biases)
    feats_in: torch.Tensor   # [B, 3, 4H] the language LSTM's input gates from each of the three features
    h: torch.Tensor          # [2, B, H] attention LSTM, language LSTM
    c: torch.Tensor
    weights: list[torch.Tensor]  # the dynamic weights [B, 3] of each step so far


def coordinates(n_regions: int) -> torch.Tensor:
    """[N, 2]: (x, y) of each cell of a row-major square grid, j * 2 / side - 1 as RCC's ``AddSpatialInfo``."""
    side = math.isqrt(n_regions)
    idx = torch.arange(side, dtype=torch.float32) * 2.0 / side - 1.0
    y, x = torch.meshgrid(idx, idx, indexing="ij")
    return torch.stack([x.reshape(-1), y.reshape(-1)], dim=1)


class DualAttention(nn.Module):
    """One spatial attention map per image, each conditioned on that image and the difference."""

    def __init__(self, cfg: DUDAConfig):
        super().__init__()
        d = cfg.feat_dim + 2
        self.cfg = cfg
        self.hidden = nn.Linear(2 * d, cfg.att_dim)
        self.norm = nn.GroupNorm(cfg.att_groups, cfg.att_dim)
        self.drop = nn.Dropout(cfg.att_dropout)
        self.score = nn.Linear(cfg.att_dim, 1)
        self.register_buffer("coords", coordinates(cfg.n_regions), persistent=False)

    def _map(self, x: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
        h = self.hidden(torch.cat([x, diff], -1))                  # [B, N, att]
        h = F.relu(self.drop(self.norm(h.transpose(1, 2)).transpose(1, 2)))   # GroupNorm wants [B, C, N]
        logits = self.score(h).squeeze(-1)                         # [B, N]
        return torch.sigmoid(logits) if self.cfg.attention == "sigmoid" else logits.softmax(-1)

    def forward(self, before: torch.Tensor, after: torch.Tensor) -> Attended:
        coords = self.coords.to(before.dtype).expand(before.shape[0], -1, -1)
        before, after = torch.cat([before, coords], -1), torch.cat([after, coords], -1)
        diff = after - before
        a_bef, a_aft = self._map(before, diff), self._map(after, diff)
        l_bef = (a_bef.unsqueeze(-1) * before).sum(1)
        l_aft = (a_aft.unsqueeze(-1) * after).sum(1)
        return Attended(before=l_bef, after=l_aft, diff=l_aft - l_bef, att_before=a_bef, att_after=a_aft)


class DynamicSpeaker(nn.Module):
    """Two LSTM cells; the first chooses, per word, how much of before / diff / after the second one reads."""

    def __init__(self, cfg: DUDAConfig):
        super().__init__()
        d = cfg.feat_dim + 2
        self.word = nn.Embedding(cfg.vocab_size, cfg.word_dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.embed = nn.Linear(3 * d, cfg.embed_dim)
        self.att_lstm = nn.LSTMCell(cfg.embed_dim + cfg.rnn_dim, cfg.rnn_dim)
        self.weight = nn.Linear(cfg.rnn_dim, 3)
        self.lang_lstm = nn.LSTMCell(cfg.word_dim + d, cfg.rnn_dim)
        self.out = nn.Linear(cfg.rnn_dim, cfg.vocab_size)

    # Both cells are ordinary nn.LSTMCell parameters, applied by hand (same gates, same order i, f, g, o) so that
    # the input products of what stays fixed over a caption are computed once per caption, not once per word:
    # the embedded features for the attention LSTM, and each of before / diff / after for the language LSTM
    # (the weighted read enters linearly: W (sum_k w_k l_k) = sum_k w_k (W l_k)). With 1,280-dim features this
    # is most of a step's work.
    def start(self, a: Attended) -> DecodingState:
        feats = torch.stack([a.before, a.diff, a.after], 1)
        embedded = self.drop(F.relu(self.embed(feats.flatten(1))))
        e = embedded.shape[1]
        att_in = F.linear(embedded, self.att_lstm.weight_ih[:, :e], self.att_lstm.bias_ih + self.att_lstm.bias_hh)
        w = self.word.embedding_dim
        feats_in = F.linear(feats, self.lang_lstm.weight_ih[:, w:])
        zeros = feats.new_zeros(2, feats.shape[0], self.att_lstm.hidden_size)
        return DecodingState(feats=feats, att_in=att_in, feats_in=feats_in, h=zeros, c=zeros.clone(), weights=[])

    @staticmethod
    def _cell(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def step(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """Feed the previous word ``tokens`` [B]; return the next word's logits [B, V] (state advanced)."""
        att, lang = self.att_lstm, self.lang_lstm
        e, w = self.embed.out_features, self.word.embedding_dim
        x = self.drop(F.relu(self.word(tokens)))
        h_prev, c_prev = state.h, state.c
        # attention LSTM: input [embed(l_bef; l_diff; l_aft); h_l(t-1)]
        gates = state.att_in + F.linear(h_prev[1], att.weight_ih[:, e:]) + F.linear(h_prev[0], att.weight_hh)
        h_a, c_a = self._cell(gates, c_prev[0])
        weights = self.weight(h_a).softmax(-1)                                   # [B, 3] before, diff, after
        # language LSTM: input [word(t-1); sum_k w_k l_k]
        gates = (F.linear(x, lang.weight_ih[:, :w], lang.bias_ih + lang.bias_hh)
                 + (weights.unsqueeze(-1) * state.feats_in).sum(1) + F.linear(h_prev[1], lang.weight_hh))
        h_l, c_l = self._cell(gates, c_prev[1])
        state.h, state.c = torch.stack([h_a, h_l]), torch.stack([c_a, c_l])
        state.weights.append(weights)
        return self.out(self.drop(h_l))


@dataclass
class DUDAOutput:
    logits: torch.Tensor     # [B, T, V] the next word after each input token
    weights: torch.Tensor    # [B, T, 3] dynamic attention (before, diff, after) at each step
    attended: Attended


class DUDA(nn.Module):
    def __init__(self, cfg: DUDAConfig, vocab):
        super().__init__()
        self.cfg = cfg
        self.pad_id, self.bos_id, self.eos_id = vocab.pad_id, vocab.bos_id, vocab.eos_id
        self.special_ids = tuple(range(vocab.n_special))   # no word: decoding's minimum length does not count them
        self.attention = DualAttention(cfg)
        self.speaker = DynamicSpeaker(cfg)

    def forward(self, before: torch.Tensor, after: torch.Tensor, tokens: torch.LongTensor) -> DUDAOutput:
        """Teacher forcing: ``tokens`` [B, T] = [BOS] w1 .. (the caption without its last id); logits[:, t]
        predict tokens' successor. Steps after a row's [EOS] are computed and must be masked by the loss."""
        a = self.attention(before, after)
        state = self.speaker.start(a)
        logits = [self.speaker.step(state, tokens[:, t]) for t in range(tokens.shape[1])]
        return DUDAOutput(logits=torch.stack(logits, 1), weights=torch.stack(state.weights, 1), attended=a)

    # -- the kit's decoding protocol (idckit.models.decoding.IncrementalCaptioner) --------------------------
    def start_decoding(self, visual: tuple[torch.Tensor, torch.Tensor]) -> DecodingState:
        return self.speaker.start(self.attention(*visual))

    def decode_step(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        return self.speaker.step(state, tokens)

    def reorder_state(self, state: DecodingState, index: torch.LongTensor) -> DecodingState:
        return DecodingState(feats=state.feats[index], att_in=state.att_in[index], feats_in=state.feats_in[index],
                             h=state.h[:, index], c=state.c[:, index], weights=[w[index] for w in state.weights])

    def full_logits(self, visual: tuple[torch.Tensor, torch.Tensor], tokens: torch.LongTensor) -> torch.Tensor:
        return self(*visual, tokens).logits
