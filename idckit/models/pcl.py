"""IDC-PCL (Yao, Wang, Jin, AAAI 2022), readable top to bottom.

    features of image 1, image 2 --> projection + type/position embeddings
        --> single-image encoder (shared weights, each image alone with its [IMG] token)
        --> pair-image encoder (both images together)          = the image difference encoder
        --> cross-modal transformer over [IMG1 v1.. IMG2 v2.. (CLS) text..]
        --> heads: MLM (words), MVCL regression (features), FDA similarity, distractor judging

Pre-training runs the cross-modal transformer bidirectionally over ``[IMG1, v1 x n, IMG2, v2 x n, CLS, text]``
(141 tokens on CLEVR-Change); fine-tuning drops CLS (140 tokens, as the public code) and uses the paper's
uni-directional mask: visual tokens see only visual tokens, a text token sees every visual token and the text up
to itself, never [PAD]. Captions are generated as in the paper (section 2.3): the input is
``[BOS] w1 .. w(i-1) [MASK]`` and the next word is read at [MASK].

Kept from the public code where the paper is silent: ReLU FFN, dropout 0.2 on embeddings, attention probabilities,
the FFN hidden layer and both residual branches (attention dropout makes PyTorch take the unfused "math" attention
in training), one embedding norm shared by all inputs, a 2-way judge head on ``[h_IMG1; h_IMG2]``, an untied MLM head
``Linear(d, V)``, the MVCL head's ``Linear(d,d) -> GELU -> norm``. Attention is PyTorch's fused
``scaled_dot_product_attention`` with a boolean mask (True = may attend) instead of -1e9 fills (the same numbers).

Size at the paper's CLEVR-Change setting (V=80, feat_dim 2048, d 512, 3+1+1 layers): 17.17M parameters at the
``paper`` switches, the public fine-tuning model's 16.90M plus the MVCL head (0.27M; the public fine-tuning model
drops its regression head, this module always has it, so pre-training and fine-tuning checkpoints have the same
keys), plus 1,538 for the [IMG1]/[IMG2] rows, less 512 for the smaller type table; 18.21M at the kit's switches
(the untied MVCL output layer +1.05M, the final norm +1,024, no input norms -3,072).

Switches (:class:`PCLConfig`): where the kit departs from the public code (yaolinli/IDC), it is a named switch.
The ``paper`` profile sets every switch to the public code's value, so it computes their function (a converted
checkpoint gives their logits to 1e-5 and their greedy tokens: tests/test_parity_pcl.py, docs/parity.md); the
``cpu`` and ``smoke`` profiles set the kit's:

- ``norm``: ``public`` is their LayerNorm, ``a*(x-mean)/(std+eps)+b`` with the unbiased std (eps 1e-6 in the
  transformer, 1e-12 for the embeddings and the MVCL head); ``torch`` is ``nn.LayerNorm``.
- ``input_norm`` / ``final_norm``: their transformer normalises the input of each stack (single, pair, cross-modal)
  and has no final norm, so its heads read un-normalised residual streams; the kit's normalises after the
  cross-modal stack only. Blocks are pre-LN either way.
- ``scale_words``: they multiply text word vectors by sqrt(d) before adding type and position (the specials are not
  scaled); with ``init="kit"`` the word vectors start at unit scale instead, like the positional table.
- ``visual_activation``: ``sigmoid`` after the visual projection (theirs) or ``none``, the paper's "a linear layer is
  applied". Under the embedding norm the Sigmoid (slope 1/4 at 0) shrinks the visual content to a fraction of the
  positional signal at initialisation, and short runs then ignore the images.
- ``mvcl_head``: ``tied``, their output layer is the transposed visual projection plus its own bias; ``untied``, a
  ``Linear(d, feat_dim)`` of its own (+1.05M parameters at feat_dim 2048). The tie only approximately inverts a
  Linear+Sigmoid and couples the regression target space to the input projection; the paper says only
  "regression to the original feature space".
- ``special_tokens``: ``shared_cls``, one [CLS] word for IMG1, IMG2 and CLS, told apart by type (theirs); ``distinct``,
  ids 5, 6, 7 of :class:`idckit.text.vocab.Vocab`. At ``shared_cls`` the vocabulary's [IMG1]/[IMG2] are no words
  (the authors' vocabulary has only <CLS>): the MLM head's logits there are -inf, so a softmax or an argmax sees one
  <CLS> logit, as theirs (tests/test_parity_defects.py). Either way a special is word + type embedding, no position, and
  the type table has 6 rows (IMG1, image-1 region, IMG2, image-2 region, CLS, text; theirs has a 7th, row 0, never
  read). Special ids come from the vocabulary, never hard-coded (public fine-tuning: BOS=1, MASK=5).
- ``pos_table``: ``public`` is their table with the tutorial bug (exponents 4k/d and 2(2k+1)/d instead of 2k/d),
  which doubles the frequency decay and leaves dimensions >= 256 nearly constant below position 100; ``vaswani`` is
  the correct one. A non-persistent buffer either way. Regions of both images use positions 0..n-1 (as theirs),
  text 0..L-1, the specials none.
- ``attend_padding``: True, [PAD] is a key like any other (their pre-training runs with ``mask=None``, so its
  outputs depend on how far a caption was padded); False, padding is masked as keys everywhere.
- ``init``: ``public`` keeps PyTorch's defaults (theirs); ``kit`` draws N(0, 0.02) with zero biases and unit-scale
  word vectors (see ``__init__``).
- ``mvcl_negatives`` (the pre-training task reads it): ``public``, each masked region's NCE also counts the other
  masked regions' original features and the regression head's outputs at every unmasked region as negatives
  (their ``mfm_nce``); ``paper``, the unmasked regions' raw features of the batch (the paper's eq. 8).
- ``single_image`` (the pre-training task reads it): a caption of one image (the birds' GIC stage on CUB) is, at
  ``lone``, ``[IMG1, regions, IMG2]``: the single-image encoder sees the image, the pair encoder it and a bare [IMG2]
  (their ``modules_pretrain_cub.py``); at ``blank`` the second image is 49 zero regions like any other image.
- ``special_words`` (what decoding's callers read, :meth:`idckit.text.vocab.Vocab.decode`): at ``keep`` a special
  token decoded before [EOS] ([UNK], [PAD], [MASK], [CLS]) is a word of the caption, as the authors' ``transform``
  writes it; at ``drop`` it is left out (the kit's: a caption is scored on its words).

``pos_table`` and ``attend_padding`` at their public values are bugs that contradict the paper; reports carry the
whole model section in their provenance, so the numbers say which function produced them.

Other differences from the public code, none of which changes the function:

- Dropout masks of the special tokens are drawn per sample (the public code embeds them once per batch).
- Decoding caches the keys/values of the visual tokens AND of every committed word in preallocated per-layer
  buffers (the public code caches only the visual side and recomputes all text through every layer at every
  step), skips the work whose result nobody reads (the last layer's attention output and FFN for visual tokens
  and committed words: only their keys/values are needed), stops once every row has emitted [EOS] (the public
  code always runs max_len-1 steps) and works for batch size 1 (the public ``.squeeze()`` raises).
- The paper's section 2.3 says [CLS] is also fed at inference; the public fine-tuning layout has no [CLS] and the
  kit follows the code (the fine-tuning mask makes a [CLS] that no text token reads pointless anyway).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from idckit.errors import ConfigError

# token types
T_IMG1, T_REG1, T_IMG2, T_REG2, T_CLS, T_TEXT = range(6)
SPECIAL_KEYS = ("pad", "bos", "eos", "mask", "img1", "img2", "cls")
#: the PCLConfig fields that choose between the public code's function and the kit's (see the module docstring)
SWITCHES = ("visual_activation", "norm", "input_norm", "final_norm", "scale_words", "mvcl_head", "special_tokens",
            "pos_table", "attend_padding", "init", "mvcl_negatives", "single_image", "special_words")


@dataclass
class PCLConfig:
    """Sizes and switches of the model. No defaults here: the sizes only data knows (vocabulary, feature grid,
    caption length) come from the data, the rest from the ``model`` section of a profile
    (``idckit/experiments/configs/pcl.json``, named ``pcl-<profile>`` by
    :func:`idckit.experiments.config.model_config`)."""
    vocab_size: int
    feat_dim: int                   # 1280 for the efficientnet_lite0 grid; 2048 for resnet101 (the paper's)
    n_regions: int                  # 49: a 7x7 grid
    max_text_len: int
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int                   # cross-modal layers: 3 on CLEVR-Change, 2 on Birds-to-Words
    single_layers: int              # paper table 6 "SE block"
    pair_layers: int                # paper table 6 "PE block"
    dropout: float
    difference_encoder: bool        # False: table 4 row 5, regions go straight to the cross-modal transformer
    distractor_head: bool
    n_classes: int                  # > 0: the FGVC stage's heads (classifier on single-image [IMG], pair matcher);
                                    # 0 in the profiles, the birds' FGVC stage sets it from its data
    visual_activation: str          # "none" (the paper's linear projection) or "sigmoid" (the public code)
    # the switches below: the public code's choice first (the ``paper`` profile), the kit's second; the module
    # docstring says what each changes and why the kit's choice exists
    norm: str                       # "public" (a * (x - mean) / (unbiased std + eps) + b) or "torch" (nn.LayerNorm)
    input_norm: bool                # a norm at the input of each stack (single, pair, cross-modal): the public code
    final_norm: bool                # a norm after the cross-modal stack, read by every head: the kit
    scale_words: bool               # text word vectors times sqrt(d_model) before type and position: the public code
    mvcl_head: str                  # "tied" (output layer = the visual projection transposed) or "untied"
    special_tokens: str             # "shared_cls" (one [CLS] word for IMG1, IMG2, CLS) or "distinct"
    pos_table: str                  # "public" (exponents 4k/d and 2(2k+1)/d) or "vaswani" (2k/d)
    attend_padding: bool            # True: [PAD] is a key like any other (the public code)
    init: str                       # "public" (PyTorch's defaults) or "kit" (N(0, 0.02), unit word vectors)
    mvcl_negatives: str             # MVCL's NCE (read by the pre-training task): "public" (the other masked regions'
                                    # targets and the regression outputs at the unmasked ones) or "paper" (the
                                    # unmasked regions' raw features)
    single_image: str               # a caption of one image (the birds' GIC stage): "lone" ([IMG1, regions, IMG2],
                                    # no second image) or "blank" (a second image of zero features)
    special_words: str              # a decoded special before [EOS] (read by decoding's callers): "keep", a word as
                                    # the authors' transform writes it, or "drop" (the kit's)

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.visual_activation not in ("sigmoid", "none"):
            raise ConfigError(f"visual_activation must be 'sigmoid' or 'none', got {self.visual_activation!r}")
        for name, allowed in (("norm", ("public", "torch")), ("mvcl_head", ("tied", "untied")),
                              ("special_tokens", ("shared_cls", "distinct")), ("pos_table", ("public", "vaswani")),
                              ("init", ("public", "kit")), ("mvcl_negatives", ("public", "paper")),
                              ("single_image", ("lone", "blank")), ("special_words", ("keep", "drop"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.n_layers < 1:
            raise ConfigError(f"the cross-modal transformer needs at least one layer, got n_layers={self.n_layers}")


def sinusoid_table(n: int, d: int) -> torch.Tensor:
    """PE[pos, 2k] = sin(pos / 10000^(2k/d)), PE[pos, 2k+1] = cos(pos / 10000^(2k/d))."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def public_sinusoid_table(n: int, d: int) -> torch.Tensor:
    """The public code's table: PE[pos, 2k] = sin(pos / 10000^(4k/d)), PE[pos, 2k+1] = cos(pos / 10000^(2(2k+1)/d))
    (computed in float64 as theirs, then float32)."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos / 10000.0 ** (2 * i / d))
    table[:, 1::2] = torch.cos(pos / 10000.0 ** (2 * (i + 1) / d))
    return table.float()


class StdLayerNorm(nn.Module):
    """The public code's LayerNorm: weight * (x - mean) / (std + eps) + bias with the unbiased std (n - 1), eps
    added to the std, not to the variance."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        return self.weight * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) + self.bias


def layer_norm(cfg: PCLConfig, public_eps: float) -> nn.Module:
    """The norm of ``cfg.norm``; ``public_eps`` is the public code's eps at that place (1e-6 in the transformer,
    1e-12 for the embeddings and the MVCL head); ``torch`` keeps nn.LayerNorm's 1e-5."""
    return StdLayerNorm(cfg.d_model, public_eps) if cfg.norm == "public" else nn.LayerNorm(cfg.d_model)


# -- transformer ----------------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, cfg: PCLConfig):
        super().__init__()
        self.h, self.dropout = cfg.n_heads, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x [B, L, d], each [B, h, L, d/h]."""
        b, length, d = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        return q, k, v

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of x [B, L, d] without computing q, each [B, h, L, d/h]."""
        b, length, d = x.shape
        kv = F.linear(x, self.qkv.weight[d:], self.qkv.bias[d:])
        k, v = kv.view(b, length, 2, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        return k, v

    def attend(self, q, k, v, mask=None) -> torch.Tensor:
        """Queries [B, h, Lq, d/h] over keys/values [B, h, Lk, d/h]; mask [B|1, 1, Lq, Lk] bool, True = may attend."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        b, _, lq, _ = q.shape
        return self.out(y.transpose(1, 2).reshape(b, lq, -1))

    def forward(self, x, mask=None):
        return self.attend(*self.heads(x), mask)


class Block(nn.Module):
    """Pre-LN transformer block: x + drop(attn(LN(x))), then x + drop(ffn(LN(x)))."""

    def __init__(self, cfg: PCLConfig):
        super().__init__()
        self.ln1, self.ln2 = layer_norm(cfg, 1e-6), layer_norm(cfg, 1e-6)
        self.attn = Attention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.ReLU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask=None):
        x = x + self.drop(self.attn(self.ln1(x), mask))
        return self.finish(x)

    def finish(self, x):
        """The FFN half of the block, on the attention half's output."""
        return x + self.drop(self.ffn(self.ln2(x)))

    def keys_values(self, x):
        """This block's keys/values of x [B, L, d] (its input), each [B, h, L, d/h]."""
        return self.attn.keys_values(self.ln1(x))


@dataclass
class PCLOutput:
    visual: torch.Tensor            # [B, 2 + 2n, d]: IMG1, regions 1, IMG2, regions 2
    cls: torch.Tensor | None        # [B, d] (pre-training only)
    text: torch.Tensor              # [B, L, d]
    img1: torch.Tensor              # [B, d]
    img2: torch.Tensor              # [B, d]


@dataclass
class DecodingState:
    """Per cross-modal layer, key/value buffers [B, h, capacity, d/h] whose first ``n_keys`` slots hold the visual
    tokens' and the committed words' keys/values; ``pos`` is the text position of the next committed word."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    n_keys: int
    pos: int = 0


class PCL(nn.Module):
    """The whole model. ``vocab``: a :class:`idckit.text.vocab.Vocab`, or a mapping with the ids of
    ``pad, bos, eos, mask, img1, img2, cls``."""

    def __init__(self, cfg: PCLConfig, vocab):
        super().__init__()
        ids = {k: int(vocab[k] if isinstance(vocab, Mapping) else getattr(vocab, f"{k}_id")) for k in SPECIAL_KEYS}
        if max(ids.values()) >= cfg.vocab_size:
            raise ConfigError(f"special token ids {ids} do not fit vocab_size {cfg.vocab_size}")
        self.cfg = cfg
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = ids["pad"], ids["bos"], ids["eos"], ids["mask"]
        self.img1_id, self.img2_id, self.cls_id = ids["img1"], ids["img2"], ids["cls"]
        # the ids that decode to no word, which decoding's minimum length does not count: the kit's vocabulary
        # reserves its first n_special ids, a mapping names them
        self.special_ids = tuple(range(vocab.n_special)) if hasattr(vocab, "n_special") else \
            tuple(sorted({*ids.values(), *([int(vocab["unk"])] if "unk" in vocab else [])}))
        # The vocabulary's [IMG1]/[IMG2] ids, where they are not [CLS]'s: at ``shared_cls`` no such word exists
        # (the authors have one <CLS> for all three), so the MLM head's columns of those ids are set to -inf: a
        # softmax and an argmax over them would count the <CLS> logit of a converted checkpoint three times
        # (cross-entropy off by ~5e-3) and decode [IMG1] where the authors decode <CLS>.
        not_words = sorted({self.img1_id, self.img2_id} - {self.cls_id}) if cfg.special_tokens == "shared_cls" else []
        self.register_buffer("not_words", torch.tensor(not_words, dtype=torch.long), persistent=False)
        if cfg.special_tokens == "shared_cls":
            self.img1_id = self.img2_id = self.cls_id
        d = cfg.d_model
        self.word = nn.Embedding(cfg.vocab_size, d)
        self.token_type = nn.Embedding(6, d)
        table = public_sinusoid_table if cfg.pos_table == "public" else sinusoid_table
        self.register_buffer("pe", table(max(cfg.n_regions, cfg.max_text_len + 1, 256), d), persistent=False)
        self.project = nn.Linear(cfg.feat_dim, d)
        self.emb_ln = layer_norm(cfg, 1e-12)
        self.emb_drop = nn.Dropout(cfg.dropout)
        stack_input = (lambda: layer_norm(cfg, 1e-6)) if cfg.input_norm else nn.Identity
        if cfg.difference_encoder:
            self.single_in, self.pair_in = stack_input(), stack_input()
            self.single = nn.ModuleList(Block(cfg) for _ in range(cfg.single_layers))
            self.pair = nn.ModuleList(Block(cfg) for _ in range(cfg.pair_layers))
        self.cross_in = stack_input()
        self.cross = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = layer_norm(cfg, 1e-6) if cfg.final_norm else nn.Identity()
        self.mlm_head = nn.Linear(d, cfg.vocab_size)
        if cfg.mvcl_head == "tied":     # the output layer is the visual projection's weight, transposed
            self.mvcl_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), layer_norm(cfg, 1e-12))
            self.mvcl_bias = nn.Parameter(torch.zeros(cfg.feat_dim))
        else:
            self.mvcl_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), layer_norm(cfg, 1e-12),
                                           nn.Linear(d, cfg.feat_dim))
        if cfg.distractor_head:
            self.judge = nn.Linear(2 * d, 2)
        if cfg.n_classes:
            self.classifier = nn.Linear(d, cfg.n_classes)
            self.matcher = nn.Linear(2 * d, 2)
        if cfg.init == "kit":
            self.apply(self._init)
            # Word vectors start at unit scale, like the positional table they are added to: at the usual 0.02
            # the sinusoids (norm ~sqrt(d/2)) would drown the word identity under the embedding LayerNorm, and a
            # short run learns captions by position only ("the the the ...").
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
        """[B, 1, d]: a special token (word + type embedding, no position)."""
        e = self.word.weight[token_id] + self.token_type.weight[type_id]
        return self.emb_drop(self.emb_ln(e).expand(batch, 1, -1))

    def _regions(self, f: torch.Tensor, type_id: int) -> torch.Tensor:
        x = self.project(f)
        if self.cfg.visual_activation == "sigmoid":
            x = torch.sigmoid(x)
        return self.emb_drop(self.emb_ln(x + self.token_type.weight[type_id] + self.pe[:f.shape[1]]))

    def _text(self, ids: torch.Tensor, positions: torch.Tensor | int = 0) -> torch.Tensor:
        """Text embeddings; ``positions`` is the first position (consecutive) or one position per token."""
        pos = self.pe[positions:positions + ids.shape[1]] if isinstance(positions, int) else self.pe[positions]
        words = self.word(ids) * math.sqrt(self.cfg.d_model) if self.cfg.scale_words else self.word(ids)
        return self.emb_drop(self.emb_ln(words + self.token_type.weight[T_TEXT] + pos))

    # -- the image difference encoder ----------------------------------------------------------------------
    def encode_visual(self, f1: torch.Tensor, f2: torch.Tensor, region_mask: torch.Tensor | None = None):
        """[B, 2 + 2n, d]: [IMG1, regions of 1, IMG2, regions of 2]. ``region_mask`` [B, 2, n] (True = zero the
        raw feature, for MVCL) acts before the projection, as in the paper and the public code."""
        return self.encode_images(f1, f2, region_mask)[1]

    def encode_images(self, f1: torch.Tensor, f2: torch.Tensor | None, region_mask: torch.Tensor | None = None):
        """(single, pair): ``single`` [B, 2, d] the [IMG] outputs of the single-image encoder for image 1 and 2
        (None without the difference encoder); ``pair`` [B, 2 + 2n, d] as :meth:`encode_visual`. ``f2=None``: a
        lone image (``single_image="lone"``): ``single`` [B, 1, d], ``pair`` [B, 2 + n, d] = [IMG1, regions, IMG2]."""
        n, fd = self.cfg.n_regions, self.cfg.feat_dim
        if f1.dim() != 3 or tuple(f1.shape[1:]) != (n, fd) or (f2 is not None and f1.shape != f2.shape):
            got = tuple(f1.shape), None if f2 is None else tuple(f2.shape)
            raise ConfigError(f"features must be [B, {n}, {fd}], got {got[0]} and {got[1]}")
        if region_mask is not None:
            if tuple(region_mask.shape) != (f1.shape[0], 2, n):
                raise ConfigError(f"region_mask must be [B, 2, {n}] bool, got {tuple(region_mask.shape)}")
            f1 = f1.masked_fill(region_mask[:, 0, :, None], 0.0)
            f2 = None if f2 is None else f2.masked_fill(region_mask[:, 1, :, None], 0.0)
        b = f1.shape[0]
        x1 = torch.cat([self._special(self.img1_id, T_IMG1, b), self._regions(f1, T_REG1)], 1)
        if f2 is None:
            x2 = self._special(self.img2_id, T_IMG2, b)
        else:
            x2 = torch.cat([self._special(self.img2_id, T_IMG2, b), self._regions(f2, T_REG2)], 1)
        if not self.cfg.difference_encoder:
            return None, torch.cat([x1, x2], 1)
        if f2 is None:                          # the lone image alone, then with a bare [IMG2]
            x = self.single_in(x1)
            for blk in self.single:
                x = blk(x)
            single, x = x[:, :1], self.pair_in(torch.cat([x, x2], 1))
            for blk in self.pair:
                x = blk(x)
            return single, x
        x = self.single_in(torch.cat([x1, x2], 0))  # the single-image encoder sees each image alone (shared weights)
        for blk in self.single:
            x = blk(x)
        single = torch.stack([x[:b, 0], x[b:, 0]], 1)
        x = self.pair_in(torch.cat([x[:b], x[b:]], 1))     # the pair encoder sees both
        for blk in self.pair:
            x = blk(x)
        return single, x

    # -- masks (bool, True = may attend) -------------------------------------------------------------------
    def _text_keys(self, text_ids: torch.Tensor) -> torch.Tensor:
        """[B, L] bool: the text positions that may be attended to (all of them with ``attend_padding``)."""
        return torch.ones_like(text_ids, dtype=torch.bool) if self.cfg.attend_padding else text_ids != self.pad_id

    def _pretrain_mask(self, n_front: int, text_ids: torch.Tensor) -> torch.Tensor | None:
        """[B, 1, 1, n_front + L]: everything attends to everything but [PAD] (None: to everything)."""
        if self.cfg.attend_padding:
            return None
        front = torch.ones(text_ids.shape[0], n_front, dtype=torch.bool, device=text_ids.device)
        return torch.cat([front, self._text_keys(text_ids)], 1)[:, None, None, :]

    def _finetune_mask(self, n_visual: int, text_ids: torch.Tensor) -> torch.Tensor:
        """[B, 1, nv + L, nv + L]: visual rows see visual keys; text rows see visual keys and non-[PAD] text up to
        themselves. Every row sees the visual keys, so none is empty."""
        b, length = text_ids.shape
        n, dev = n_visual + length, text_ids.device
        allowed = torch.zeros(n, n, dtype=torch.bool, device=dev)
        allowed[:, :n_visual] = True
        allowed[n_visual:, n_visual:] = torch.ones(length, length, dtype=torch.bool, device=dev).tril()
        keys = torch.cat([torch.ones(b, n_visual, dtype=torch.bool, device=dev), self._text_keys(text_ids)], 1)
        return (allowed[None] & keys[:, None, :])[:, None]

    # -- forward -------------------------------------------------------------------------------------------
    def _cross(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.cross_in(x)
        for blk in self.cross:
            x = blk(x, mask)
        return self.ln_f(x)

    def forward(self, f1, f2, text_ids: torch.Tensor, mode: str = "pretrain", region_mask=None) -> PCLOutput:
        """f1, f2 [B, n, feat_dim] (f2 None: a lone image, see :meth:`encode_images`); text_ids [B, L]. ``mode``
        picks the layout and mask (see the module doc)."""
        if mode not in ("pretrain", "finetune"):
            raise ConfigError(f"mode must be 'pretrain' or 'finetune', got {mode!r}")
        visual = self.encode_visual(f1, f2, region_mask)
        b, nv = visual.shape[:2]
        text = self._text(text_ids)
        if mode == "pretrain":
            x = self._cross(torch.cat([visual, self._special(self.cls_id, T_CLS, b), text], 1),
                            self._pretrain_mask(nv + 1, text_ids))
        else:
            x = self._cross(torch.cat([visual, text], 1), self._finetune_mask(nv, text_ids))
        n, has_cls = self.cfg.n_regions, mode == "pretrain"
        return PCLOutput(visual=x[:, :nv], cls=x[:, nv] if has_cls else None, text=x[:, nv + has_cls:],
                         img1=x[:, 0], img2=x[:, 1 + n])

    def forward_grouped(self, f1, f2, text_ids: torch.Tensor, queries: bool = False) -> PCLOutput:
        """The fine-tuning forward for k captions of each pair, with the visual side computed once per pair.

        f1, f2 [P, n, feat_dim]; text_ids [P, k, L]. Under the fine-tuning mask visual tokens attend only to visual
        tokens, so their whole stream through the cross-modal layers does not depend on the caption: it runs once
        per pair and each caption's words attend to its pair's visual keys/values. Returns visual / img1 / img2 per
        pair ([P, ...]) and text per caption ([P*k, L, d]); in eval mode the text equals :meth:`forward` in
        ``finetune`` mode on each (pair, caption) row (tested). With dropout, a pair's captions share its visual
        dropout masks.

        ``queries=True`` (the ``every`` fine-tuning targets): ``text_ids`` are clean captions and each position
        i = 1..L-1 also gets a [MASK] query that sees the visual tokens, the clean words before i and itself, which
        is exactly what generation's step i sees (:meth:`decode_step`). ``text`` is then the queries' outputs
        [P*k, L-1, d], one per position to predict (equal to :meth:`forward` on ``[BOS] w1 .. w(i-1) [MASK]``,
        tested), so one forward trains every position of every caption on the context generation will give it.
        """
        p, k, length = text_ids.shape
        flat = text_ids.reshape(p * k, length)
        xv = self.cross_in(self.encode_visual(f1, f2))
        nv = xv.shape[1]
        xt = self._text(flat)
        mask = self._finetune_mask(nv, flat)[:, :, nv:]                # [P*k, 1, L, nv + L]: the text rows
        if queries:
            xt, mask = self._with_queries(xt, flat, mask, nv)
        xt = self.cross_in(xt)
        last = len(self.cross) - 1
        for i, blk in enumerate(self.cross):
            qv, kv, vv = blk.attn.heads(blk.ln1(xv))
            qt, kt, vt = blk.attn.heads(blk.ln1(xt))
            keys = torch.cat([kv.repeat_interleave(k, 0), kt], 2)
            values = torch.cat([vv.repeat_interleave(k, 0), vt], 2)
            if queries and i == last:
                # only the queries' outputs are read: the clean rows serve as keys/values up to here, so the last
                # layer attends and runs its FFN for the query rows alone (about half of its text rows)
                qt, xt, mask = qt[:, :, length:], xt[:, length:], mask[:, :, length:]
            xt = blk.finish(xt + blk.drop(blk.attn.attend(qt, keys, values, mask)))
            xv = blk.finish(xv + blk.drop(blk.attn.attend(qv, kv, vv)))
        xv, xt = self.ln_f(xv), self.ln_f(xt)
        n = self.cfg.n_regions
        return PCLOutput(visual=xv, cls=None, text=xt, img1=xv[:, 0], img2=xv[:, 1 + n])

    def _with_queries(self, xt: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, n_visual: int):
        """The clean text stream ``xt`` [B, L, d] with a [MASK] query per position 1..L-1 appended, and the mask of
        all its rows [B, 1, 2L-1, nv + 2L-1]: the clean rows as before (they never see a query), query i the
        visual keys, the non-[PAD] clean keys at positions < i, and itself."""
        b, length = ids.shape
        dev = ids.device
        q = self._text(torch.full((b, length - 1), self.mask_id, dtype=ids.dtype, device=dev),
                       torch.arange(1, length, device=dev))
        before = torch.ones(length - 1, length, dtype=torch.bool, device=dev).tril()     # query i: positions < i
        query_rows = torch.cat([torch.ones(b, length - 1, n_visual, dtype=torch.bool, device=dev),
                                before[None] & self._text_keys(ids)[:, None, :],
                                torch.eye(length - 1, dtype=torch.bool, device=dev).expand(b, -1, -1)], 2)
        clean_rows = torch.cat([mask[:, 0], torch.zeros(b, length, length - 1, dtype=torch.bool, device=dev)], 2)
        return torch.cat([xt, q], 1), torch.cat([clean_rows, query_rows], 1)[:, None]

    # -- heads ---------------------------------------------------------------------------------------------
    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., V] word logits of text hidden states (pre-training MLM, fine-tuning, generation); -inf at the ids
        that are no word of the model's vocabulary ([IMG1]/[IMG2] at ``special_tokens="shared_cls"``)."""
        logits = self.mlm_head(hidden)
        return logits.index_fill(-1, self.not_words, float("-inf")) if len(self.not_words) else logits

    def mvcl_regress(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., feat_dim]: visual hidden states regressed to the raw feature space (MVCL's prediction)."""
        if self.cfg.mvcl_head == "tied":
            return F.linear(self.mvcl_head(hidden), self.project.weight.t(), self.mvcl_bias)
        return self.mvcl_head(hidden)

    def fda_similarity(self, out: PCLOutput) -> torch.Tensor:
        """[B]: cos(mean(h_IMG1, h_IMG2), h_CLS), the paper's eq. 9 score."""
        if out.cls is None:
            raise ConfigError("FDA needs the pre-training layout (mode='pretrain')")
        return F.cosine_similarity(0.5 * (out.img1 + out.img2), out.cls, dim=-1)

    def judge_logits(self, out: PCLOutput) -> torch.Tensor:
        """[B, 2]: class 1 = a real (semantic) change, 0 = a distractor (viewpoint/lighting only)."""
        if not self.cfg.distractor_head:
            raise ConfigError("this model was built without the distractor-judging head (distractor_head=False)")
        return self.judge(torch.cat([out.img1, out.img2], -1))

    def fgvc_logits(self, f1: torch.Tensor, f2: torch.Tensor):
        """The FGVC stage's heads on the image encoders alone (no text, no cross-modal layers, as the public
        code's ``nabirds_forward``): (class logits [B, 2, n_classes] of each image's single-image [IMG],
        match logits [B, 2] (1 = same class) of the pair encoder's [IMG1; IMG2], the single-image [IMG]
        vectors [B, 2, d] for the in-batch contrastive loss)."""
        if not self.cfg.n_classes or not self.cfg.difference_encoder:
            raise ConfigError("the FGVC heads need n_classes > 0 and the difference encoder")
        single, pair = self.encode_images(f1, f2)
        n = self.cfg.n_regions
        return self.classifier(single), self.matcher(torch.cat([pair[:, 0], pair[:, 1 + n]], -1)), single

    # -- generation: [BOS] w1 .. w(i-1) [MASK] -> w_i ----------------------------------------------------------
    # Under the fine-tuning mask a text position sees only the visual tokens and earlier text, so nothing computed
    # for a position ever changes when later words arrive: the keys/values of the visual tokens (per layer) are
    # computed once, those of each committed word once, and every step runs just two tokens, the newest committed
    # word and a [MASK] after it. The [MASK]'s keys/values are discarded (its slot is overwritten next step).
    def start_decoding(self, visual: tuple[torch.Tensor, torch.Tensor]) -> DecodingState:
        x = self.cross_in(self.encode_visual(*visual))
        b, nv, _ = x.shape
        capacity = nv + self.cfg.max_text_len + 1
        keys, values = [], []
        for i, blk in enumerate(self.cross):
            if i + 1 < len(self.cross):
                q, k, v = blk.attn.heads(blk.ln1(x))
                x = blk.finish(x + blk.attn.attend(q, k, v))
            else:                          # the last layer's visual outputs are never read: keys/values suffice
                k, v = blk.keys_values(x)
            kbuf = k.new_empty(b, k.shape[1], capacity, k.shape[3])
            vbuf = torch.empty_like(kbuf)
            kbuf[:, :, :nv], vbuf[:, :, :nv] = k, v
            keys.append(kbuf)
            values.append(vbuf)
        return DecodingState(keys=keys, values=values, n_keys=nv, pos=0)

    def decode_step(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """Commit ``tokens`` [B] at text position ``state.pos``; return [B, V], the logits read at a [MASK] after it."""
        n = state.n_keys
        if n + 2 > state.keys[0].shape[2]:     # longer than max_text_len: grow the buffers
            grow = lambda t: torch.cat([t, torch.empty_like(t)], 2)
            state.keys, state.values = [grow(t) for t in state.keys], [grow(t) for t in state.values]
        x = self.cross_in(self._text(torch.stack([tokens, torch.full_like(tokens, self.mask_id)], 1), state.pos))
        mask = torch.ones(1, 1, 2, n + 2, dtype=torch.bool, device=tokens.device)
        mask[..., 0, -1] = False               # the committed word does not see the [MASK] after it
        last = len(self.cross) - 1
        for i, (blk, kbuf, vbuf) in enumerate(zip(self.cross, state.keys, state.values)):
            q, k, v = blk.attn.heads(blk.ln1(x))
            kbuf[:, :, n:n + 2], vbuf[:, :, n:n + 2] = k, v
            if i == last:                      # only the [MASK]'s output is read; it may see every key
                x, q, mask = x[:, 1:], q[:, :, 1:], None
            x = blk.finish(x + blk.attn.attend(q, kbuf[:, :, :n + 2], vbuf[:, :, :n + 2], mask))
        state.n_keys, state.pos = n + 1, state.pos + 1
        return self.mlm_logits(self.ln_f(x[:, -1]))

    def reorder_state(self, state: DecodingState, index: torch.LongTensor) -> DecodingState:
        pick = lambda t: t.index_select(0, index)
        return DecodingState(keys=[pick(t) for t in state.keys], values=[pick(t) for t in state.values],
                             n_keys=state.n_keys, pos=state.pos)

    def full_logits(self, visual: tuple[torch.Tensor, torch.Tensor], tokens: torch.LongTensor,
                    every_step: bool = False) -> torch.Tensor:
        """No cache: the whole model, images included.

        ``every_step=False`` (what ``naive_greedy_decode`` uses): one fine-tuning forward over the paper's input
        ``[visual, tokens, [MASK]]``; returns [B, 1, V], the logits at the [MASK], equal to what ``decode_step``
        returns after committing ``tokens``. It is the only prediction in that input: the MLM head at a committed
        word reconstructs that word, it does not predict the next one, so those positions are not returned.

        ``every_step=True``: [B, L, V] whose position t equals ``decode_step``'s output after committing
        ``tokens[:, :t+1]`` (CLIP4IDC's meaning of ``full_logits``), in one forward: L [MASK]s are appended, the one
        at position t+1 seeing the visual tokens, ``tokens[:, :t+1]`` and itself (UniLM's parallel masks). Used to
        check the cache at every position and to score whole captions.
        """
        length = tokens.shape[1]
        visual_x = self.encode_visual(*visual)
        b, nv, _ = visual_x.shape
        n_mask = length if every_step else 1
        dev = tokens.device
        masks = torch.full((b, n_mask), self.mask_id, dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(length, device=dev),                       # the words
                               torch.arange(length + 1 - n_mask, length + 1, device=dev)])  # the [MASK]s
        x = torch.cat([visual_x, self._text(torch.cat([tokens, masks], 1), positions)], 1)
        # fine-tuning mask over [visual, tokens], then the [MASK] rows: visual keys, tokens up to t, themselves
        mask = self._finetune_mask(nv, tokens)[:, 0]                       # [B, nv+L, nv+L]
        n = nv + length + n_mask
        allowed = torch.zeros(b, n, n, dtype=torch.bool, device=dev)
        allowed[:, :nv + length, :nv + length] = mask
        rows = torch.arange(nv + length, n, device=dev)
        allowed[:, rows, :nv] = True
        upto = torch.arange(length, device=dev)[None, :] < positions[length:, None]
        allowed[:, rows, nv:nv + length] = upto[None] & self._text_keys(tokens)[:, None, :]
        allowed[:, rows, rows] = True
        out = self._cross(x, allowed[:, None])
        return self.mlm_logits(out[:, nv + length:])

    def load_pretrained(self, state: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
        """Load the keys this model has with matching shapes (pre-training -> fine-tuning, or a model without the
        distractor head or the difference encoder); report what was left out. ``missing``: this model's keys not in
        ``state`` (they keep their initialisation); ``unexpected``: keys of ``state`` this model lacks;
        ``mismatched``: keys in both with different shapes (not loaded)."""
        own = self.state_dict()
        mismatched = sorted(k for k, v in state.items() if k in own and own[k].shape != v.shape)
        usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        self.load_state_dict(usable, strict=False)
        return {"missing": sorted(set(own) - set(state)), "unexpected": sorted(set(state) - set(own)),
                "mismatched": mismatched}


# -- masking for MLM and MVCL ---------------------------------------------------------------------------------
#: where MLM's random replacement word comes from: "words", the non-special ids (the kit's); "vocabulary", every id
#: of the model's vocabulary, specials too (the authors' ``random.choice(range(len(vocabs)))``,
#: clver/data/dataset_pretrain_clver.py:180), see :func:`replacement_ids`
MASK_RANDOM_FROM = ("words", "vocabulary")
#: which word a caption with no word chosen gets: "smallest", the word with the smallest draw, then 80/10/10
#: (the kit's); "first", its first word, always [MASK] (the authors' ``mask_sent``,
#: clver/data/dataset_pretrain_clver.py:196-199)
MASK_NONE_CHOSEN = ("smallest", "first")


def replacement_ids(vocab, random_from: str, special_tokens: str) -> torch.LongTensor | None:
    """The ids MLM's random replacement draws from (:data:`MASK_RANDOM_FROM`); None: the non-special ids.
    "vocabulary" is every id but [IMG1]/[IMG2] at ``special_tokens="shared_cls"``, where they are no word of the
    model's (the authors' vocabulary has one <CLS> for the three)."""
    if random_from not in MASK_RANDOM_FROM:
        raise ConfigError(f"mask_random_from must be one of {', '.join(MASK_RANDOM_FROM)}, got {random_from!r}",
                          fix='"vocabulary" is the authors\' (paper profile), "words" the kit\'s')
    if random_from == "words":
        return None
    absent = {vocab.img1_id, vocab.img2_id} if special_tokens == "shared_cls" else set()
    return torch.tensor([i for i in range(len(vocab)) if i not in absent], dtype=torch.long)


def mask_tokens(ids: torch.LongTensor, vocab, generator: torch.Generator, p: float = 0.15,
                eos_p: float = 0.15, *, random_ids: torch.LongTensor | None = None,
                none_chosen: str = "smallest") -> tuple[torch.LongTensor, torch.LongTensor]:
    """BERT-style masking of caption words, as the public code does it (``mask_sent``/``random_mask``).

    ``ids`` [B, L] are ``[BOS] words [EOS] [PAD]..``. Each word (non-special id, or [UNK]) is chosen with
    probability ``p``, at least one per caption that has a word (``none_chosen``, :data:`MASK_NONE_CHOSEN`); a
    chosen word becomes [MASK] (80 %), a random word (10 %) or stays (10 %), and is labelled with the original id.
    The random word is drawn uniformly from ``random_ids`` (:func:`replacement_ids`; None: the non-special ids; the
    public code draws from the whole vocabulary, specials included, which feeds the model [PAD]/[BOS] in
    mid-sentence). Separately, with probability ``eos_p`` the [EOS] becomes [MASK] labelled [EOS], which teaches
    generation to stop. [BOS] and [PAD] are never masked. Returns (inputs, labels), labels -100 where nothing is
    predicted. Deterministic given ``generator``.
    """
    if none_chosen not in MASK_NONE_CHOSEN:
        raise ConfigError(f"mask_none_chosen must be one of {', '.join(MASK_NONE_CHOSEN)}, got {none_chosen!r}",
                          fix='"first" is the authors\' (paper profile), "smallest" the kit\'s')
    ids = ids.clone()
    labels = torch.full_like(ids, -100)
    words = (ids >= vocab.n_special) | (ids == vocab.unk_id)
    u = torch.rand(ids.shape, generator=generator)
    chosen = words & (u < p)
    none = words.any(1) & ~chosen.any(1)
    if none.any():
        if none_chosen == "first":
            first = words.int().argmax(1)            # the first word's position (argmax: the first maximum)
        else:
            first = torch.where(words, u, torch.full_like(u, 2.0)).argmin(1)
        chosen[none, first[none]] = True
    labels[chosen] = ids[chosen]
    action = torch.rand(ids.shape, generator=generator)
    if random_ids is None:
        random_words = torch.randint(vocab.n_special, max(len(vocab), vocab.n_special + 1), ids.shape,
                                     generator=generator)
    else:
        random_words = random_ids[torch.randint(len(random_ids), ids.shape, generator=generator)]
    ids = torch.where(chosen & (action < 0.8), torch.full_like(ids, vocab.mask_id), ids)
    ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_words, ids)
    if none_chosen == "first" and none.any():
        ids[none, first[none]] = vocab.mask_id       # theirs sets the forced word to <MASK>, never 80/10/10
    eos = (ids == vocab.eos_id) & (torch.rand(ids.shape, generator=generator) < eos_p)
    labels[eos] = vocab.eos_id
    ids[eos] = vocab.mask_id
    return ids, labels


def mask_regions(batch: int, n_regions: int, generator: torch.Generator, p: float = 0.15) -> torch.Tensor:
    """[B, 2, n] bool, True = masked: per sample one image (p = 0.5 each) gets each region masked with
    probability ``p``, at least one (the region with the smallest draw); the other image is left whole, so the
    masked content can be recovered from the other image and the caption (paper section 2.2)."""
    which = torch.rand(batch, generator=generator) < 0.5
    u = torch.rand(batch, n_regions, generator=generator)
    chosen = u < p
    chosen[torch.arange(batch), u.argmin(1)] = True
    out = torch.zeros(batch, 2, n_regions, dtype=torch.bool)
    out[:, 0] = chosen & ~which[:, None]
    out[:, 1] = chosen & which[:, None]
    return out
