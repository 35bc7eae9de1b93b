"""IDC-PCL (Yao, Wang, Jin, AAAI 2022), readable top to bottom.

    features of image 1, image 2 ──► projection + type/position embeddings
        ──► single-image encoder (shared weights, each image with its [IMG] token)
        ──► pair-image encoder (both images together)          = the image difference encoder
        ──► cross-modal transformer over [IMG1 v1.. IMG2 v2.. (CLS) text..]
        ──► heads: MLM (words), MVCL regression (features), FDA similarity, distractor judging

Pre-training runs the cross-modal transformer bidirectionally over ``[IMG1, v1 x n, IMG2, v2 x n, CLS, text]``;
fine-tuning drops CLS and uses the paper's uni-directional mask: visual tokens see only visual tokens, a text
token sees every visual token and the text up to itself. Captions are generated as in the paper: the input is
``[BOS] w1 .. w(i-1) [MASK]`` and the next word is read at ``[MASK]``.

Deviations from the public code (yaolinli/IDC), each deliberate:

- Positions: a correct sinusoidal table (the public one has the tutorial bug that doubles the frequency decay
  and leaves most dimensions constant), as a non-persistent buffer.
- Padding is masked as keys everywhere; the public pre-training attends to [PAD] tokens (``mask=None``).
- ``torch.nn.LayerNorm`` (biased variance) in pre-LN blocks with a final LayerNorm; the public code's LayerNorm
  divides by the unbiased std + eps and has no final norm. Attention is PyTorch's fused
  ``scaled_dot_product_attention``.
- [IMG1]/[IMG2]/[CLS] are distinct vocabulary entries (the public code uses one ``<CLS>`` word with three types).
- The MVCL regression head's last layer is its own ``Linear(d, feat_dim)``; the public code ties it to the
  transposed visual projection (with a Sigmoid in front of the projection the tie is not an inverse anyway).
- Decoding caches the keys/values of visual tokens AND of every committed word (the public code caches only the
  visual side and recomputes all text every step), stops when every row has emitted [EOS] (the public code
  always runs max_len-1 steps), and works for batch size 1 (the public ``.squeeze()`` crashes).
- The visual projection is linear, as the paper describes it; the public code's Sigmoid after it is an option
  (``visual_activation="sigmoid"``). Under the embedding LayerNorm the Sigmoid (slope 1/4 at 0) shrinks the visual
  content to a fraction of the positional signal at initialisation, and short runs then ignore the images.
- Word embeddings are initialised at unit scale (see ``__init__``); the public code multiplies N(0, 1) vectors by
  sqrt(d), which makes positions nearly invisible instead.
- Kept from the public code where the paper is silent: ReLU FFN, one shared embedding LayerNorm, a 2-way
  distractor head on [IMG1; IMG2].
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from idckit.errors import ConfigError

# token types
T_IMG1, T_REG1, T_IMG2, T_REG2, T_CLS, T_TEXT = range(6)


@dataclass
class PCLConfig:
    vocab_size: int
    feat_dim: int = 1280            # efficientnet_lite0 grid; 2048 for resnet101 (the paper's)
    n_regions: int = 49             # a 7x7 grid
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 3               # cross-modal layers: 3 on CLEVR-Change, 2 on Birds-to-Words
    single_layers: int = 1
    pair_layers: int = 1
    dropout: float = 0.2
    max_text_len: int = 40
    difference_encoder: bool = True  # False: table 4 row 5, regions go straight to the cross-modal transformer
    distractor_head: bool = True
    visual_activation: str = "none"     # "none" (the paper's linear projection) or "sigmoid" (the public code)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PCLConfig":
        return cls(**d)


def sinusoid_table(n: int, d: int) -> torch.Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class Attention(nn.Module):
    def __init__(self, cfg: PCLConfig):
        super().__init__()
        self.h, self.dropout = cfg.n_heads, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, mask=None, past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x [B, Lq, d]; ``past`` keys/values [B, h, Lp, d/h] put in front of x's; mask [B|1, 1, Lq, Lp+Lq] bool
        (True = may attend). Returns (output, (k, v) of x's own positions)."""
        b, lq, d = x.shape
        q, k, v = self.qkv(x).view(b, lq, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, lq, d)), (k, v)


class Block(nn.Module):
    """Pre-LN transformer block: x + drop(attn(LN(x))), then x + drop(ffn(LN(x)))."""

    def __init__(self, cfg: PCLConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.ReLU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask=None, past=None):
        a, kv = self.attn(self.ln1(x), mask, past)
        x = x + self.drop(a)
        return x + self.drop(self.ffn(self.ln2(x))), kv


@dataclass
class PCLOutput:
    visual: torch.Tensor            # [B, 2 + 2n, d]: IMG1, regions 1, IMG2, regions 2
    cls: torch.Tensor | None        # [B, d] (pre-training only)
    text: torch.Tensor              # [B, L, d]
    img1: torch.Tensor              # [B, d]
    img2: torch.Tensor              # [B, d]


@dataclass
class DecodingState:
    past: list[tuple[torch.Tensor, torch.Tensor]]   # per cross-modal layer: keys/values of visual + committed words
    pos: int                                         # text position of the next committed word


class PCL(nn.Module):
    def __init__(self, cfg: PCLConfig, vocab):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ConfigError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        if cfg.visual_activation not in ("sigmoid", "none"):
            raise ConfigError(f"visual_activation must be 'sigmoid' or 'none', got {cfg.visual_activation!r}")
        self.cfg = cfg
        self.pad_id, self.bos_id, self.eos_id = vocab.pad_id, vocab.bos_id, vocab.eos_id
        self.mask_id, self.img1_id, self.img2_id, self.cls_id = vocab.mask_id, vocab.img1_id, vocab.img2_id, vocab.cls_id
        d = cfg.d_model
        self.word = nn.Embedding(cfg.vocab_size, d)
        self.token_type = nn.Embedding(6, d)
        self.register_buffer("pe", sinusoid_table(max(cfg.n_regions, cfg.max_text_len + 1, 256), d), persistent=False)
        self.project = nn.Linear(cfg.feat_dim, d)
        self.emb_ln = nn.LayerNorm(d)
        self.emb_drop = nn.Dropout(cfg.dropout)
        if cfg.difference_encoder:
            self.single = nn.ModuleList(Block(cfg) for _ in range(cfg.single_layers))
            self.pair = nn.ModuleList(Block(cfg) for _ in range(cfg.pair_layers))
        self.cross = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.mlm_head = nn.Linear(d, cfg.vocab_size)
        self.mvcl_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d), nn.Linear(d, cfg.feat_dim))
        if cfg.distractor_head:
            self.judge = nn.Linear(2 * d, 2)
        self.apply(self._init)

        # Word vectors start at unit scale, like the positional table they are added to: at the usual 0.02 the
        # sinusoids (norm ~sqrt(d/2)) would drown the word identity under the embedding LayerNorm, and a short
        # run learns captions by position only ("the the the ...").
        nn.init.normal_(self.word.weight, std=1.0)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    # -- embeddings ---------------------------------------------------------------------------------------
    def _special(self, token_id: int, type_id: int, batch: int) -> torch.Tensor:
        e = self.word.weight[token_id] + self.token_type.weight[type_id]
        return self.emb_drop(self.emb_ln(e)).expand(batch, 1, -1)

    def _regions(self, f: torch.Tensor, type_id: int) -> torch.Tensor:
        x = self.project(f)
        if self.cfg.visual_activation == "sigmoid":
            x = torch.sigmoid(x)
        return self.emb_drop(self.emb_ln(x + self.token_type.weight[type_id] + self.pe[:f.shape[1]]))

    def _text(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        pos = self.pe[start:start + ids.shape[1]]
        return self.emb_drop(self.emb_ln(self.word(ids) + self.token_type.weight[T_TEXT] + pos))

    # -- the image difference encoder ----------------------------------------------------------------------
    def encode_visual(self, f1: torch.Tensor, f2: torch.Tensor, region_mask: torch.Tensor | None = None):
        """[B, 2 + 2n, d]: [IMG1, regions of 1, IMG2, regions of 2]. ``region_mask`` [B, 2, n] (True = zero the
        raw feature, for MVCL) acts before the projection, as in the public code."""
        if f1.shape != f2.shape or f1.dim() != 3 or f1.shape[1:] != (self.cfg.n_regions, self.cfg.feat_dim):
            raise ConfigError(f"features must be [B, {self.cfg.n_regions}, {self.cfg.feat_dim}], got "
                              f"{tuple(f1.shape)} and {tuple(f2.shape)}")
        if region_mask is not None:
            f1 = f1.masked_fill(region_mask[:, 0, :, None], 0.0)
            f2 = f2.masked_fill(region_mask[:, 1, :, None], 0.0)
        b = f1.shape[0]
        x1 = torch.cat([self._special(self.img1_id, T_IMG1, b), self._regions(f1, T_REG1)], 1)
        x2 = torch.cat([self._special(self.img2_id, T_IMG2, b), self._regions(f2, T_REG2)], 1)
        if not self.cfg.difference_encoder:
            return torch.cat([x1, x2], 1)
        x = torch.cat([x1, x2], 0)              # the single-image encoder sees each image alone
        for blk in self.single:
            x = blk(x)[0]
        x = torch.cat([x[:b], x[b:]], 1)       # the pair encoder sees both
        for blk in self.pair:
            x = blk(x)[0]
        return x

    # -- masks ---------------------------------------------------------------------------------------------
    def _finetune_mask(self, n_visual: int, text_ids: torch.Tensor) -> torch.Tensor:
        b, length = text_ids.shape
        n = n_visual + length
        allowed = torch.zeros(n, n, dtype=torch.bool, device=text_ids.device)
        allowed[:, :n_visual] = True
        allowed[n_visual:, n_visual:] = torch.ones(length, length, dtype=torch.bool, device=text_ids.device).tril()
        keys = torch.cat([torch.ones(b, n_visual, dtype=torch.bool, device=text_ids.device),
                          text_ids != self.pad_id], 1)
        allowed = allowed[None] & keys[:, None, :]
        allowed[:, torch.arange(n), torch.arange(n)] = True  # a [PAD] query still sees itself (no empty rows)
        return allowed[:, None]

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, f1, f2, text_ids: torch.Tensor, mode: str = "pretrain", region_mask=None) -> PCLOutput:
        if mode not in ("pretrain", "finetune"):
            raise ConfigError(f"mode must be 'pretrain' or 'finetune', got {mode!r}")
        visual = self.encode_visual(f1, f2, region_mask)
        b, nv = visual.shape[:2]
        text = self._text(text_ids)
        if mode == "pretrain":
            x = torch.cat([visual, self._special(self.cls_id, T_CLS, b), text], 1)
            keys = torch.cat([torch.ones(b, nv + 1, dtype=torch.bool, device=text_ids.device),
                              text_ids != self.pad_id], 1)
            mask = keys[:, None, None, :]
        else:
            x = torch.cat([visual, text], 1)
            mask = self._finetune_mask(nv, text_ids)
        for blk in self.cross:
            x = blk(x, mask)[0]
        x = self.ln_f(x)
        n = self.cfg.n_regions
        has_cls = mode == "pretrain"
        return PCLOutput(visual=x[:, :nv], cls=x[:, nv] if has_cls else None, text=x[:, nv + has_cls:],
                         img1=x[:, 0], img2=x[:, 1 + n])

    # -- heads ---------------------------------------------------------------------------------------------
    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlm_head(hidden)

    def mvcl_regress(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mvcl_head(hidden)

    def fda_similarity(self, out: PCLOutput) -> torch.Tensor:
        """cos(mean(h_IMG1, h_IMG2), h_CLS) per sequence."""
        if out.cls is None:
            raise ConfigError("FDA needs the pre-training layout (mode='pretrain')")
        return F.cosine_similarity(0.5 * (out.img1 + out.img2), out.cls, dim=-1)

    def distractor_logits(self, out: PCLOutput) -> torch.Tensor:
        """[B, 2]: class 1 = a real (semantic) change, 0 = a distractor (viewpoint/lighting only)."""
        if not self.cfg.distractor_head:
            raise ConfigError("this model was built without the distractor-judging head (distractor_head=False)")
        return self.judge(torch.cat([out.img1, out.img2], -1))

    # -- generation: [BOS] w1 .. w(i-1) [MASK] -> w_i, with key/value caches ----------------------------------
    def start_decoding(self, visual: tuple[torch.Tensor, torch.Tensor]) -> DecodingState:
        x = self.encode_visual(*visual)
        past = []
        for blk in self.cross:   # visual tokens only ever attend to visual tokens: compute them once
            x, kv = blk(x)
            past.append(kv)
        return DecodingState(past=past, pos=0)

    def decode_step(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """Commit ``tokens`` at position ``state.pos`` and return the logits read at a [MASK] after it."""
        b = tokens.shape[0]
        ids = torch.stack([tokens, torch.full_like(tokens, self.mask_id)], 1)
        x = self._text(ids, start=state.pos)
        n_past = state.past[0][0].shape[2]
        mask = torch.ones(2, n_past + 2, dtype=torch.bool, device=tokens.device)
        mask[0, -1] = False  # the committed word does not see the [MASK] after it
        new_past = []
        for blk, past in zip(self.cross, state.past):
            x, (k, v) = blk(x, mask[None, None], past)
            new_past.append((torch.cat([past[0], k[:, :, :1]], 2), torch.cat([past[1], v[:, :, :1]], 2)))
        state.past, state.pos = new_past, state.pos + 1
        return self.mlm_head(self.ln_f(x[:, 1]))

    def reorder_state(self, state: DecodingState, index: torch.LongTensor) -> DecodingState:
        return DecodingState(past=[(k[index], v[index]) for k, v in state.past], pos=state.pos)

    def full_logits(self, visual: tuple[torch.Tensor, torch.Tensor], tokens: torch.LongTensor) -> torch.Tensor:
        """No cache: the whole fine-tuning forward on ``[tokens, [MASK]]``. Returns [B, 1, V], the logits at the
        [MASK] (the next word after ``tokens``); only that position is a prediction in this generation scheme."""
        ids = torch.cat([tokens, torch.full_like(tokens[:, :1], self.mask_id)], 1)
        out = self(*visual, ids, mode="finetune")
        return self.mlm_head(out.text[:, -1:])

    def recompute_text_logits(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """The public code's step: visual keys/values cached, ``[tokens, [MASK]]`` recomputed through every layer.
        Used by the decoding benchmark as the baseline; ``state`` must hold visual keys/values only."""
        ids = torch.cat([tokens, torch.full_like(tokens[:, :1], self.mask_id)], 1)
        x = self._text(ids)
        length = ids.shape[1]
        n_past = state.past[0][0].shape[2]
        mask = torch.ones(length, n_past + length, dtype=torch.bool, device=ids.device)
        mask[:, n_past:] = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        for blk, past in zip(self.cross, state.past):
            x = blk(x, mask[None, None], past)[0]
        return self.mlm_head(self.ln_f(x[:, -1]))

    def load_pretrained(self, state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
        """Load the keys this model has (pre-training -> fine-tuning); report what was skipped."""
        own = self.state_dict()
        usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        self.load_state_dict(usable, strict=False)
        return {"missing": sorted(set(own) - set(usable)), "unexpected": sorted(set(state) - set(usable))}


# -- masking for MLM and MVCL ---------------------------------------------------------------------------------
def mask_tokens(ids: torch.LongTensor, vocab, generator: torch.Generator, p: float = 0.15,
                eos_p: float = 0.15) -> tuple[torch.LongTensor, torch.LongTensor]:
    """BERT-style masking of caption words, as the public code does it (``mask_sent``/``random_mask``).

    Each word is chosen with probability ``p`` (at least one per caption); a chosen word becomes [MASK] (80 %),
    a random word (10 %; drawn from real words, where the public code also draws special tokens) or stays (10 %).
    Separately, with probability ``eos_p`` the [EOS] becomes [MASK] and must be predicted, which teaches
    generation to stop. [BOS] and [PAD] are never masked. Labels are -100 where nothing is predicted.
    """
    ids = ids.clone()
    labels = torch.full_like(ids, -100)
    words = (ids >= vocab.n_special) | (ids == vocab.unk_id)
    u = torch.rand(ids.shape, generator=generator)
    chosen = words & (u < p)
    # at least one word per caption: force the word with the smallest draw where none was chosen
    has_words = words.any(1)
    none = has_words & ~chosen.any(1)
    if none.any():
        first = torch.where(words, u, torch.full_like(u, 2.0)).argmin(1)
        chosen[none, first[none]] = True
    labels[chosen] = ids[chosen]
    action = torch.rand(ids.shape, generator=generator)
    random_words = torch.randint(vocab.n_special, max(len(vocab), vocab.n_special + 1), ids.shape,
                                 generator=generator)
    ids = torch.where(chosen & (action < 0.8), torch.full_like(ids, vocab.mask_id), ids)
    ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_words, ids)
    eos = (ids == vocab.eos_id) & (torch.rand(ids.shape, generator=generator) < eos_p)
    labels[eos] = vocab.eos_id
    ids[eos] = vocab.mask_id
    return ids, labels


def mask_regions(batch: int, n_regions: int, generator: torch.Generator, p: float = 0.15) -> torch.Tensor:
    """[B, 2, n] bool: per sample one image (p = 0.5 each) gets ``p`` of its regions masked, at least one."""
    which = torch.rand(batch, generator=generator) < 0.5
    u = torch.rand(batch, n_regions, generator=generator)
    chosen = u < p
    chosen[torch.arange(batch), u.argmin(1)] = True
    out = torch.zeros(batch, 2, n_regions, dtype=torch.bool)
    out[:, 0] = chosen & ~which[:, None]
    out[:, 1] = chosen & which[:, None]
    return out
