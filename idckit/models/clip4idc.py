"""CLIP4IDC (Guo et al., AACL 2022) on open_clip: pair encoder, retrieval adaptation model, captioner.

Follows the paper (section 2 and appendix B) and, where the paper is silent, the authors' public code
(sushizixin/CLIP4IDC; see docs/clip4idc.md). open_clip's modules are wrapped, never copied.

Pair encoder (paper eq. 2-5; public code ``VisualTransformer.forward``). Each image of a pair goes through CLIP's own
patch conv, class token, per-image position embedding, ``ln_pre`` and the first ``N_intra`` residual blocks, the two
images batched as 2B. Then e1 / e2 (image-type embeddings) are added to every token of the before / after image, the
two sequences are concatenated into 2(n+1) tokens [CLS_b, patches_b, CLS_a, patches_a], a new joint position
embedding p is added, a new LayerNorm ``ln_mid`` is applied, and the remaining ``N_inter`` blocks attend over both
images. CLIP's ``ln_post`` and ``proj`` (the paper's W, CLIP's pretrained projection) are applied to all tokens.
The pair vector is the mean of the two projected CLS tokens (eq. 5, positions 1 and n+2, 1-indexed).

* New parameters are initialised like the public code: e1, e2, p ~ scale * N(0, 1) with scale = width^-0.5 (CLIP's
  own scale for its class/position embeddings); ``ln_mid`` weight 1, bias 0. None is copied from CLIP.
* The CLS index of the after image is computed from the patch grid (n+1), not hard-coded: the public code's 50 is
  right only for ViT-B/32 at 224 px.
* Any split N_intra + N_inter = depth works, including depth/0 (no interaction: paper table 7's last row) and
  0/depth. ``joint=False`` drops e1/e2/p/ln_mid altogether (requires N_inter = 0): the two images are encoded by plain
  CLIP independently and concatenated, which is the paper's CLIP-FT baseline (table 5) and reproduces open_clip's
  ``encode_image`` per image exactly (tested).

Captioner (paper 2.4 + appendix B; public code ``modules/module_decoder.py``): projected pair tokens -> a 3-layer
transformer encoder -> a 3-layer transformer decoder with cross-attention -> an LM head over CLIP's BPE vocabulary
(49,408; SOT/EOT from open_clip's tokenizer; pad 0), hidden 512, 8 heads, FFN 2048, GELU, dropout 0.1, at most 32
tokens, word-level cross-entropy. Layers are post-LN BERT layers as in the public code (LayerNorm eps 1e-12,
embedding LayerNorm, LM head = dense + GELU + LayerNorm + tied output matrix + bias). Choices where paper and code
are silent or disagree:
* Cross-attention is layer-wise: decoder layer i attends to the output of caption-encoder layer i (public code; the
  paper says only "multi-layer encoder and decoder"). ``cross_attention="last"`` gives the textbook variant.
* Word embeddings are tied to CLIP's token embedding, as in the public code: the decoder's word and position
  embeddings start as copies of CLIP's ``token_embedding`` and first ``max_len`` text position embeddings, and the
  output matrix is the word embedding. This is also what the paper's parameter counts imply: table 5 gives 135.57M
  (CLIP-FT) and 135.65M (CLIP4IDC) = visual tower 87.85M (+0.08M new) + 22.40M caption layers + CLIP's 25.30M
  token embedding + 77 position rows; this module counts 135.55M / 135.63M because it keeps only max_len = 32
  position rows. The captioner keeps no text tower, so a copy and a shared tensor are the same thing here.
  Needs hidden == CLIP's text width; otherwise set ``tie_clip_embeddings=False`` (fresh N(0, 0.02) embeddings,
  untied from CLIP, input and output still tied to each other).
* ``freeze_clip_embeddings`` (on at ``paper``): the public code's freeze logic leaves CLIP's token and text position
  embeddings fixed on CLEVR (on Spot it puts the token embedding in the 1e-7 group by name de-duplication), so its
  decoder's word and position embeddings, and with them the output matrix, never move; only the LM head's
  transform and bias learn words. The paper says only that the caption model is trained; the cpu and smoke
  profiles turn the switch off and train the embeddings with the caption model at its learning rate.
  ``freeze_visual=True`` freezes the whole pair encoder, the setting of the paper's table 7 captioning columns.
* CLIP-FT: without e1/e2 and a joint position embedding nothing tells the caption encoder which image a token came
  from, so the model would be exactly symmetric under swapping before and after (it could not tell "added" from
  "dropped"; tested). The kit's CLIP-FT therefore adds a 2-row segment embedding (1,024 parameters at width 512,
  invisible in table 5's 135.57M) to the caption encoder's input; ``segment_embedding=False`` restores the literal
  reading. CLIP4IDC does not use it by default (its pair encoder already marks the images).

Decoding follows ``idckit.models.decoding``'s incremental protocol: ``start_decoding`` runs the pair encoder and the
caption encoder once and computes every decoder layer's cross-attention keys/values once; ``decode_step`` embeds one
token, appends its self-attention keys/values to per-layer caches and returns next-token logits; ``full_logits``
recomputes everything (the public code recomputes the caption encoder and the whole prefix at every step).
``visual`` is either the (before, after) images or pair-encoder tokens computed beforehand: with a frozen encoder
(paper table 7; the kit's cpu profile) they are computed once per pair, not once per epoch.

A labelled variant, off by default and not the paper's: ``difference_tokens=True`` appends n+1 tokens to the
caption encoder's input, a new linear map of after - before at each position of the pair encoder's output (the
subtraction DUDA's difference vector makes, here on CLIP4IDC's tokens). It asks whether a small captioner that cannot learn
to compare the two images within the cpu budget describes the change once the comparison is given to it
(docs/clip4idc.md).

Two options for small machines, both off by default and both exact reformulations, not approximations of a
different model:
* ``PairEncoder.encode_intra`` / ``forward_from_intra`` split the forward pass at the intra/inter boundary, so
  frozen intra blocks can run once per image and be cached (tested equal to ``forward``).
* ``output_ids`` trims the captioner's vocabulary to the BPE ids the captions use (plus SOT/EOT/pad). The model is
  the same with every other id's logit fixed at -inf: on CLEVR-like captions ~100 of 49,408 rows, which removes
  most of the LM head's cost (at hidden 128 the full head is 2x the rest of the caption model) and Adam's update
  of a 6.3M-row table every step. Decoding still returns logits over CLIP's BPE ids (-inf off the list), so
  decoded token ids are CLIP's.

Parity (``tests/test_parity_clip4idc.py``, docs/parity.md): on the public code's weights converted by
:mod:`idckit.authors.clip4idc`, the pair encoder at two splits, the text features, the adaptation loss, the captioner's
teacher-forced logits and loss and its greedy tokens equal the public code's (fp32, to 1e-5; tokens exactly). Only
the logits at padded input positions differ: the public decoder also masks padded keys, which the causal mask
already hides from every real token, and nothing reads those rows.

Deviations from the public code, on purpose:
* fp32 throughout. The public code converts CLIP's linear/conv/attention weights to fp16 and trains them with a
  BertAdam at lr 1e-7 with no loss scaling; in fp16 Adam's second moment underflows for small gradients and
  larger updates round away, so "CLIP fine-tuned at 1e-7" would mean something else per gradient scale. Mixed
  precision belongs to autocast. Their fp16 weights load exactly (upcast); on the tiny recording, the public
  code's fp16 pass and the kit's fp32 pass on the same weights differ by up to 4.1e-3 (tokens up to 4.6 in size).
* Caption length: ``max_len`` = 32 counts SOT and EOT, so a training caption keeps at most 30 BPE words and
  greedy decoding runs at most 31 steps; the public code keeps 31 words (SOT + 31 in, 31 + EOT out) and always
  decodes 32 steps. Only captions over 30 BPE words, or a decoding with no EOT in 31 steps, see the difference.
* Text features for captions shorter than CLIP's context (32 of 77 tokens, as in the public code) are computed on
  the first L positions only. Because CLIP's text attention is causal, this equals open_clip's ``encode_text`` on
  the same tokens padded to the full context (tested) at less than half the cost.
* The captioner does not run CLIP's text encoder on a dummy [SOT, EOT] input at every step (~2.4 GFLOP per pair
  that the public code computes and never uses).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import open_clip
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer
from open_clip.transformer import LayerNorm, VisionTransformer, text_global_pool
from torch import nn
from torch.utils.checkpoint import checkpoint

from idckit.losses import clip_logits


# ---------------------------------------------------------------------------------------------------------------
# Pair encoder
# ---------------------------------------------------------------------------------------------------------------

def default_n_intra(depth: int) -> int:
    """The paper's 9 intra + 3 inter for a 12-layer ViT, i.e. three quarters of the depth (6 -> 4 + 2)."""
    return depth * 3 // 4


class PairEncoder(nn.Module):
    """CLIP's ViT split into intra-image and inter-image blocks. Wraps (and owns) an open_clip VisionTransformer."""

    def __init__(self, visual: VisionTransformer, n_intra: int | None = None, joint: bool = True):
        super().__init__()
        if not isinstance(visual, VisionTransformer):
            raise TypeError(f"PairEncoder wraps open_clip's VisionTransformer, got {type(visual).__name__}")
        if visual.attn_pool is not None or visual.pool_type != "tok" or visual.final_ln_after_pool \
                or visual.proj is None:
            raise ValueError("PairEncoder needs a CLIP-style ViT: class-token pooling, ln_post then proj")
        if not isinstance(visual.patch_dropout, nn.Identity):
            raise ValueError("patch dropout would drop tokens and move the after image's CLS; disable it")
        depth = len(visual.transformer.resblocks)
        n_intra = default_n_intra(depth) if n_intra is None else n_intra
        if not 0 <= n_intra <= depth:
            raise ValueError(f"n_intra={n_intra} must be in [0, {depth}] for a {depth}-layer ViT")
        if not joint and n_intra != depth:
            raise ValueError("joint=False (plain CLIP, CLIP-FT) needs n_intra == depth: without e1/e2 and a joint "
                             "position embedding the inter blocks could not tell the two images apart")
        self.visual = visual
        self.n_intra, self.n_inter, self.joint = n_intra, depth - n_intra, joint
        self.width = visual.conv1.out_channels
        self.output_dim = visual.proj.shape[1]
        self.tokens_per_image = visual.grid_size[0] * visual.grid_size[1] + 1   # n + 1
        if joint:
            scale = self.width ** -0.5   # public code: scale * randn, scale = width^-0.5; LN weight 1, bias 0
            self.bef_embedding = nn.Parameter(scale * torch.randn(self.width))                       # e1
            self.aft_embedding = nn.Parameter(scale * torch.randn(self.width))                       # e2
            self.joint_positional_embedding = nn.Parameter(
                scale * torch.randn(2 * self.tokens_per_image, self.width))                         # p
            self.ln_mid = LayerNorm(self.width)

    @property
    def cls_indices(self) -> tuple[int, int]:
        """0-indexed positions of the before and after CLS tokens in the 2(n+1) output tokens."""
        return 0, self.tokens_per_image

    def new_parameters(self) -> list[nn.Parameter]:
        """The parameters CLIP does not have (e1, e2, p, ln_mid); empty for joint=False."""
        if not self.joint:
            return []
        return [self.bef_embedding, self.aft_embedding, self.joint_positional_embedding, *self.ln_mid.parameters()]

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N, n+1, width]: CLIP's patch conv, class token, per-image position embedding, ln_pre."""
        v = self.visual
        x = v.conv1(images.to(v.conv1.weight.dtype))                 # [N, width, gh, gw]
        x = x.flatten(2).transpose(1, 2)                              # [N, n, width]
        cls = v.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + v.positional_embedding.to(x.dtype)
        return v.ln_pre(x)

    def run_blocks(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Residual blocks [start, stop) of CLIP's ViT on batch-first x, whatever layout open_clip runs them in.
        No attention mask: ViT attention is full, within one image (intra) or across both (inter)."""
        transformer = self.visual.transformer
        if start == stop:
            return x
        if not transformer.batch_first:
            x = x.transpose(0, 1)                                     # NLD -> LND
        for block in transformer.resblocks[start:stop]:
            if transformer.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if not transformer.batch_first:
            x = x.transpose(0, 1)
        return x

    def encode_intra(self, images: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N, n+1, width]: the intra stage of each image on its own (embedding + N_intra blocks).

        Depends on one image only, so a caller that keeps these blocks frozen can compute it once per image and
        feed :meth:`forward_from_intra` (the kit's cpu profile does; the result is the same as :meth:`forward`)."""
        return self.run_blocks(self.embed(images), 0, self.n_intra)

    def forward(self, before: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """before, after: [B, 3, H, W] -> (tokens [B, 2(n+1), D], pair vector [B, D]); D = CLIP's embed dim."""
        if before.shape != after.shape:
            raise ValueError(f"before {tuple(before.shape)} and after {tuple(after.shape)} differ in shape")
        batch = before.shape[0]
        x = self.encode_intra(torch.cat([before, after]))            # [2B, n+1, width], one image per row
        return self.forward_from_intra(x[:batch], x[batch:])

    def forward_from_intra(self, bef: torch.Tensor, aft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Intra-stage outputs [B, n+1, width] of the before and after images -> (tokens, pair vector)."""
        if bef.shape != aft.shape or bef.shape[1] != self.tokens_per_image:
            raise ValueError(f"intra outputs must both be [B, {self.tokens_per_image}, width], got "
                             f"{tuple(bef.shape)} and {tuple(aft.shape)}")
        dtype = self.visual.conv1.weight.dtype
        bef, aft = bef.to(dtype), aft.to(dtype)
        if self.joint:
            bef = bef + self.bef_embedding.to(dtype)
            aft = aft + self.aft_embedding.to(dtype)
        x = torch.cat([bef, aft], dim=1)                              # [B, 2(n+1), width]
        if self.joint:
            x = self.ln_mid(x + self.joint_positional_embedding.to(x.dtype))
        x = self.run_blocks(x, self.n_intra, self.n_intra + self.n_inter)
        tokens = self.visual.ln_post(x) @ self.visual.proj            # W on every token, not only the CLS
        i_bef, i_aft = self.cls_indices
        return tokens, (tokens[:, i_bef] + tokens[:, i_aft]) / 2


# ---------------------------------------------------------------------------------------------------------------
# Text side and the retrieval (adaptation) model
# ---------------------------------------------------------------------------------------------------------------

def clip_text_features(clip: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """CLIP's text feature (ln_final + text_projection at the EOT token) for tokens [B, L], L <= context length.

    L == context length is open_clip's ``encode_text`` itself. Shorter inputs (the public code's 32 of 77) run the
    first L positions only: with CLIP's causal mask, position t never sees t' > t, so this is the same feature."""
    length = tokens.shape[1]
    if length == clip.context_length:
        return clip.encode_text(tokens)
    if length > clip.context_length or clip.attn_mask is None:
        raise ValueError(f"text of {length} tokens for a causal context of {clip.context_length}")
    cast_dtype = clip.transformer.get_cast_dtype()
    x = clip.token_embedding(tokens).to(cast_dtype) + clip.positional_embedding[:length].to(cast_dtype)
    x = clip.transformer(x, attn_mask=clip.attn_mask[:length, :length])
    x = clip.ln_final(x)
    x = text_global_pool(x, tokens, clip.text_pool_type, eos_token_id=getattr(clip, "text_eos_id", None))
    projection = clip.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, nn.Linear) else x @ projection


class CLIP4IDCRetrieval(nn.Module):
    """Adaptation model: pair vector v (eq. 5) and text feature g (eq. 1) for IP<->T retrieval (eq. 6-8).

    Takes ownership of ``clip`` (an open_clip CLIP): its visual tower moves into ``self.pair_encoder`` (so every
    weight has exactly one name in the state dict) and ``clip.visual`` is set to None."""

    def __init__(self, clip: nn.Module, n_intra: int | None = None, joint: bool = True):
        super().__init__()
        if not isinstance(clip, open_clip.CLIP):
            raise TypeError(f"CLIP4IDCRetrieval needs an open_clip.CLIP (built-in text tower), "
                            f"got {type(clip).__name__}")
        self.pair_encoder = PairEncoder(clip.visual, n_intra=n_intra, joint=joint)
        clip.visual = None
        self.clip = clip

    @property
    def logit_scale(self) -> nn.Parameter:
        """CLIP's learned log inverse temperature (ln 100 for OpenAI's weights; the public code clamps it there)."""
        return self.clip.logit_scale

    def encode_pair(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        return self.pair_encoder(before, after)[1]

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return clip_text_features(self.clip, tokens)

    def forward(self, before, after, tokens) -> torch.Tensor:
        """Similarity logits [B_text, B_pair] = exp(logit_scale) * cos(g_i, v_j) (:func:`idckit.losses.clip_logits`;
        InfoNCE lives there too)."""
        pair = self.encode_pair(before, after)
        return clip_logits(self.encode_text(tokens), pair, self.logit_scale)

    def freeze_like_public_code(self) -> None:
        """Freeze what the public code's freeze logic freezes with --freeze_layer_num 0: the patch conv, class and
        position embeddings, ln_pre, the token embedding and the text position embedding. Not the default."""
        v = self.pair_encoder.visual
        for p in [v.conv1.weight, v.class_embedding, v.positional_embedding, *v.ln_pre.parameters(),
                  self.clip.token_embedding.weight, self.clip.positional_embedding]:
            p.requires_grad_(False)


# ---------------------------------------------------------------------------------------------------------------
# Captioner
# ---------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def clip_bpe_tokenizer():
    """open_clip's CLIP BPE tokenizer (SOT 49406, EOT 49407, pad 0); its context length is set per call."""
    return SimpleTokenizer()


def tokenize_captions(texts: list[str], max_len: int = 32) -> torch.LongTensor:
    """[SOT, BPE ids..., EOT, 0...] of exactly max_len ids per caption (open_clip lower-cases and cleans;
    over-long captions are cut and end in EOT). Input to the decoder is ids[:, :-1], the target ids[:, 1:]."""
    return clip_bpe_tokenizer()(texts, context_length=max_len)


@dataclass(frozen=True)
class CaptionerConfig:
    """Sizes and switches of the captioner. The sizes have no defaults here: they come from the ``captioner``
    section of a profile (``idckit/experiments/configs/clip4idc_caption.json``, named ``clip4idc-<profile>`` by
    :func:`idckit.experiments.config.model_config`); base is the paper's (appendix B) and the public code's."""
    hidden: int
    heads: int
    ffn: int
    enc_layers: int
    dec_layers: int
    dropout: float                         # hidden and attention-probability dropout, as the public code
    max_len: int                           # tokens including SOT/EOT; greedy decoding runs at most this many steps
    freeze_visual: bool                    # the pair encoder frozen (paper table 7; the cpu profile by choice)
    # the profile gives the paper's; a run's recipe sets variant and its layer split sets n_intra
    variant: str                           # "clip4idc" (split ViT) or "clip-ft" (plain CLIP per image, table 5)
    n_intra: int | None                    # None: 3/4 of the ViT depth (9 of 12); ignored for clip-ft
    cross_attention: str                   # "layerwise" (decoder i <- encoder i, public code) or "last"
    tie_clip_embeddings: bool              # word/position embeddings start from CLIP's text tower
    freeze_clip_embeddings: bool           # ... and stay fixed, as the public code's freeze leaves them (paper)
    segment_embedding: bool | None         # before/after segment embedding in the caption encoder; None: clip-ft only
    difference_tokens: bool                # not the paper's: also feed after - before per position (module doc)

    @property
    def use_segment_embedding(self) -> bool:
        return self.variant == "clip-ft" if self.segment_embedding is None else self.segment_embedding


class Attention(nn.Module):
    """BERT-style multi-head attention sub-layer: LayerNorm(x + dropout(W_o attn(q(x), k(m), v(m))))."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        if d % heads:
            raise ValueError(f"hidden size {d} is not a multiple of {heads} heads")
        self.heads, self.dropout = heads, dropout
        self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))
        self.norm = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:                # [B, L, d] -> [B, heads, L, d/heads]
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.key(memory)), self.split(self.value(memory))

    def attend(self, x, k, v, causal: bool = False) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        ctx = F.scaled_dot_product_attention(self.split(self.query(x)), k, v, dropout_p=p, is_causal=causal)
        return self.norm(x + self.drop(self.out(ctx.transpose(1, 2).flatten(2))))

    def forward(self, x, memory=None, causal: bool = False) -> torch.Tensor:
        return self.attend(x, *self.keys_values(x if memory is None else memory), causal=causal)


class FeedForward(nn.Module):
    def __init__(self, d: int, ffn: int, dropout: float):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.norm(x + self.drop(self.proj(F.gelu(self.fc(x)))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.self_attn = Attention(cfg.hidden, cfg.heads, cfg.dropout)
        self.ffn = FeedForward(cfg.hidden, cfg.ffn, cfg.dropout)

    def forward(self, x):
        return self.ffn(self.self_attn(x))                            # full attention over all visual tokens


class DecoderLayer(nn.Module):
    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.self_attn = Attention(cfg.hidden, cfg.heads, cfg.dropout)
        self.cross_attn = Attention(cfg.hidden, cfg.heads, cfg.dropout)
        self.ffn = FeedForward(cfg.hidden, cfg.ffn, cfg.dropout)

    def forward(self, x, memory):
        return self.ffn(self.cross_attn(self.self_attn(x, causal=True), memory))


@dataclass
class DecodingState:
    """Everything decode_step needs: per decoder layer the cross-attention K/V of the visual memory (computed once)
    and the self-attention K/V of every token fed so far ([B, heads, t, d/heads], grown by one per step)."""
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]
    self_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    position: int = 0


class CLIP4IDCCaptioner(nn.Module):
    """Pair encoder -> caption encoder -> caption decoder -> logits over CLIP's BPE vocabulary.

    Built from an open_clip CLIP model (its visual tower and, if tied, copies of its token/position embeddings;
    the text tower is not kept). To start from an adapted retrieval model, load its pair encoder's weights:
    ``captioner.pair_encoder.load_state_dict(retrieval.pair_encoder.state_dict())``."""

    def __init__(self, clip: nn.Module, cfg: CaptionerConfig,
                 output_ids: "list[int] | torch.Tensor | None" = None):
        super().__init__()
        if cfg.variant not in ("clip4idc", "clip-ft"):
            raise ValueError(f"variant must be 'clip4idc' or 'clip-ft', got {cfg.variant!r}")
        if cfg.cross_attention not in ("layerwise", "last"):
            raise ValueError(f"cross_attention must be 'layerwise' or 'last', got {cfg.cross_attention!r}")
        if cfg.cross_attention == "layerwise" and cfg.enc_layers != cfg.dec_layers:
            raise ValueError("layer-wise cross-attention pairs encoder and decoder layers: need enc_layers == "
                             f"dec_layers, got {cfg.enc_layers} and {cfg.dec_layers}")
        self.cfg = cfg
        tok = clip_bpe_tokenizer()
        self.bos_id, self.eos_id, self.pad_id = tok.sot_token_id, tok.eot_token_id, 0
        depth = len(clip.visual.transformer.resblocks)
        if cfg.variant == "clip-ft":
            self.pair_encoder = PairEncoder(clip.visual, n_intra=depth, joint=False)
        else:
            self.pair_encoder = PairEncoder(clip.visual, n_intra=cfg.n_intra, joint=True)
        d = cfg.hidden
        vis_dim = self.pair_encoder.output_dim
        self.visual_proj = nn.Identity() if vis_dim == d else nn.Linear(vis_dim, d)
        self.segment = nn.Embedding(2, d) if cfg.use_segment_embedding else None
        self.difference_proj = nn.Linear(vis_dim, d) if cfg.difference_tokens else None
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))

        vocab = clip.token_embedding.num_embeddings
        self.register_buffer("vocab_ids", None)        # row -> BPE id when trimmed (see output_ids)
        if output_ids is not None:
            # A trimmed vocabulary: the rows of CLIP's BPE table the captions use (plus SOT, EOT, pad); row r is
            # BPE id vocab_ids[r]. Same model otherwise; see the module docstring.
            ids = sorted({int(i) for i in torch.as_tensor(output_ids).flatten().tolist()}
                         | {self.bos_id, self.eos_id, self.pad_id})
            if ids[0] < 0 or ids[-1] >= vocab:
                raise ValueError(f"output_ids must be CLIP BPE ids in [0, {vocab})")
            self.register_buffer("vocab_ids", torch.tensor(ids, dtype=torch.long))
            rows = torch.full((vocab,), -1, dtype=torch.long)
            rows[self.vocab_ids] = torch.arange(len(ids))
            self.register_buffer("vocab_rows", rows, persistent=False)
            vocab = len(ids)
        self.word_embedding = nn.Embedding(vocab, d)
        self.position_embedding = nn.Embedding(cfg.max_len, d)
        self.embed_norm = nn.LayerNorm(d, eps=1e-12)
        self.embed_drop = nn.Dropout(cfg.dropout)
        self.head_transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d, eps=1e-12))
        self.head_bias = nn.Parameter(torch.zeros(vocab))
        self._init_caption_weights()
        if cfg.tie_clip_embeddings:
            if clip.token_embedding.embedding_dim != d or clip.positional_embedding.shape[0] < cfg.max_len:
                raise ValueError(
                    f"tie_clip_embeddings needs hidden == CLIP's text width ({clip.token_embedding.embedding_dim}, "
                    f"got {d}) and max_len <= its context ({clip.positional_embedding.shape[0]}); "
                    "change the sizes or set tie_clip_embeddings=False")
            with torch.no_grad():
                table = clip.token_embedding.weight
                self.word_embedding.weight.copy_(table if self.vocab_ids is None else table[self.vocab_ids])
                self.position_embedding.weight.copy_(clip.positional_embedding[:cfg.max_len])
        if cfg.freeze_clip_embeddings:
            if not cfg.tie_clip_embeddings:
                raise ValueError("freeze_clip_embeddings keeps CLIP's token and position embeddings fixed; it needs "
                                 "tie_clip_embeddings=True")
            # the output matrix is the word embedding, so only the LM head's transform and bias learn words
            self.word_embedding.weight.requires_grad_(False)
            self.position_embedding.weight.requires_grad_(False)
        if cfg.freeze_visual:
            self.pair_encoder.requires_grad_(False)

    def _init_caption_weights(self):
        """BERT init for the caption model (public code's init_weights): N(0, 0.02) weights, zero biases."""
        for module in [self.visual_proj, self.segment, self.difference_proj, *self.encoder, *self.decoder,
                       self.word_embedding, self.position_embedding, self.head_transform]:
            if module is None:
                continue
            for m in module.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

    # --- teacher forcing ---------------------------------------------------------------------------------------

    def encode(self, before: torch.Tensor, after: torch.Tensor) -> list[torch.Tensor]:
        """Images -> the memory each decoder layer cross-attends to."""
        return self.encode_pair_tokens(self.pair_encoder(before, after)[0])

    def encode_pair_tokens(self, pair_tokens: torch.Tensor) -> list[torch.Tensor]:
        """Pair-encoder tokens [B, 2(n+1), D] -> caption-encoder outputs, one memory per decoder layer."""
        x = self.visual_proj(pair_tokens)
        if self.segment is not None:
            n1 = pair_tokens.shape[1] // 2
            segments = torch.arange(2, device=x.device).repeat_interleave(n1)
            x = x + self.segment(segments)
        if self.difference_proj is not None:
            n1 = pair_tokens.shape[1] // 2
            x = torch.cat([x, self.difference_proj(pair_tokens[:, n1:] - pair_tokens[:, :n1])], dim=1)
        outputs = []
        for layer in self.encoder:
            x = layer(x)
            outputs.append(x)
        if self.cfg.cross_attention == "layerwise":
            return outputs
        return [outputs[-1]] * len(self.decoder)

    def to_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """CLIP BPE ids -> rows of the (possibly trimmed) vocabulary; the identity without trimming."""
        if self.vocab_ids is None:
            return tokens
        rows = self.vocab_rows[tokens]
        if bool((rows < 0).any()):
            unknown = sorted(set(tokens[rows < 0].tolist()))[:5]
            raise ValueError(f"BPE ids {unknown} are not in this captioner's trimmed vocabulary")
        return rows

    def to_vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Row logits -> logits over all CLIP BPE ids (-inf where trimmed away), as decoding expects."""
        if self.vocab_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_rows.shape[0]), float("-inf"))
        full[..., self.vocab_ids] = logits
        return full

    def embed_tokens(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        if start + tokens.shape[1] > self.cfg.max_len:
            raise ValueError(f"a caption prefix longer than max_len={self.cfg.max_len}")
        words = self.word_embedding(self.to_rows(tokens))
        return self.embed_drop(self.embed_norm(words + self.position_embedding(positions)))

    def lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits over the captioner's vocabulary rows (all of CLIP's BPE unless trimmed)."""
        return self.head_transform(x) @ self.word_embedding.weight.t() + self.head_bias

    def decode(self, memories: list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer, memory in zip(self.decoder, memories):
            x = layer(x, memory)
        return self.lm_head(x)

    def forward(self, before: torch.Tensor, after: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: tokens [B, T] (tokens[:, 0] = SOT) -> logits [B, T, V] for the next token at each
        position (V: vocabulary rows). Causal self-attention only: right padding never affects earlier positions."""
        return self.decode(self.encode(before, after), tokens)

    def memories(self, visual) -> list[torch.Tensor]:
        """``visual`` = (before, after) images, or pair-encoder tokens [B, 2(n+1), D] computed beforehand (a
        frozen encoder's output, computed once per pair) -> the memory of each decoder layer."""
        if isinstance(visual, torch.Tensor):
            return self.encode_pair_tokens(visual)
        return self.encode(*visual)

    def teacher_forcing(self, memories: list[torch.Tensor], ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, max_len - 1, V'], labels [B, max_len - 1]) for ``tokenize_captions`` output ids [B, max_len]:
        the next-token logits over the vocabulary rows and the targets as rows, -100 at padding, the input of
        :func:`idckit.losses.mlm_loss` (word-level cross-entropy)."""
        logits = self.decode(memories, ids[:, :-1])
        target = self.to_rows(ids[:, 1:])
        pad_row = int(self.to_rows(torch.tensor([self.pad_id], device=ids.device))[0])
        return logits, target.masked_fill(target == pad_row, -100)

    def param_groups(self, lr_visual: float, lr_caption: float) -> list[dict]:
        """Pair encoder (CLIP's ViT and e1/e2/p/ln_mid; paper: 1e-7) vs the caption model (1e-4); trainable only."""
        visual = {id(p) for p in self.pair_encoder.parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"name": "visual", "lr": lr_visual, "params": [p for p in params if id(p) in visual]},
                {"name": "caption", "lr": lr_caption, "params": [p for p in params if id(p) not in visual]}]

    # --- incremental decoding (idckit.models.decoding protocol); visual: see memories() -------------------------

    def start_decoding(self, visual) -> DecodingState:
        memories = self.memories(visual)
        cross = [layer.cross_attn.keys_values(m) for layer, m in zip(self.decoder, memories)]
        return DecodingState(cross_kv=cross, self_kv=[None] * len(self.decoder))

    def decode_step(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        x = self.embed_tokens(tokens[:, None], start=state.position)    # [B, 1, d]
        for i, layer in enumerate(self.decoder):
            k, v = layer.self_attn.keys_values(x)
            if state.self_kv[i] is not None:
                k = torch.cat([state.self_kv[i][0], k], dim=2)
                v = torch.cat([state.self_kv[i][1], v], dim=2)
            state.self_kv[i] = (k, v)
            x = layer.self_attn.attend(x, k, v)        # the new token sees all cached ones: causal by construction
            x = layer.cross_attn.attend(x, *state.cross_kv[i])
            x = layer.ffn(x)
        state.position += 1
        return self.to_vocab_logits(self.lm_head(x[:, 0]))

    def reorder_state(self, state: DecodingState, index: torch.LongTensor) -> DecodingState:
        pick = lambda kv: None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))
        return DecodingState(cross_kv=[pick(kv) for kv in state.cross_kv],
                             self_kv=[pick(kv) for kv in state.self_kv], position=state.position)

    def full_logits(self, visual, tokens: torch.LongTensor) -> torch.Tensor:
        return self.to_vocab_logits(self.decode(self.memories(visual), tokens))
