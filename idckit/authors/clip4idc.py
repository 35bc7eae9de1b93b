"""CLIP4IDC parity: recordings of the authors' model (sushizixin/CLIP4IDC) and converters of their state dicts.

Recording (:func:`record`, needs a checkout of their repository; nothing of it is kept): their ``CLIP4IDC`` model
(``modules/modeling.py`` with ``module_clip.py`` and ``module_decoder.py``) is built at a tiny size, in fp32, in
eval mode on CPU: a ViT of width 128 (2 heads), 4 layers, patch 8 at 56 px (7x7 patches, so 50 tokens per image and
their hard-coded after-image CLS index 50 is right, as for ViT-B/32 at 224 px), a 2-layer width-128 text tower over
CLIP's full BPE vocabulary (49,408; their special tokens are BPE ids), and a 2+2-layer width-128 caption model with
dropout 0 (so their training-mode losses are deterministic). CLIP's vocabulary makes even this model 7M parameters,
so no weight is stored: every parameter is :func:`parameter_value` of (seed, its name in their model, its shape),
which the tests recompute (:func:`authors_state`). What is stored: the key -> (parameter, shape) table, the inputs
(images, their tokenizer's and data loaders' ids) and their outputs:

* ``clip4idc_adapt.pt``: per intra/inter split (3+1 and 1+3 of 4 layers) the pair encoder's 100 projected tokens
  and pair vector (``CLIP.encode_image``), the text features (``encode_text``), the similarity matrix and their
  training loss (``CLIP4IDC.forward`` in train mode: all-gather over a 1-process gloo group, ``CrossEn`` both ways).
* ``clip4idc_caption.pt``: the captioner (3+1 split) on three pairs: teacher-forced logits at the positions their
  decoder mask keeps (49,408 columns are too many to store: a fixed set of columns, the log-normaliser and argmax
  of every row, and a fixed random projection of all columns), their training loss (``CLIP4IDC.forward``) and
  ``greedy_decode`` of ``main_task_caption.py`` (32 steps).

* ``clip4idc_optim_trace.pt`` (:func:`record_optim_trace`): their ``prep_optimizer`` of each stage (BertAdam, their
  parameter groups and schedule) stepped 20 times on fixed gradients of a few named tensors, as their ``train_epoch``
  steps (global clip, ``step()``): the groups, each group's lr, the gradient norm, the parameters after each step.

Converters: :func:`clip_from_authors_state` builds the open_clip CLIP of a state dict's sizes, :func:`convert_retrieval`
and :func:`convert_captioner` rename their keys to the kit's :class:`~idckit.models.clip4idc.CLIP4IDCRetrieval` /
:class:`~idckit.models.clip4idc.CLIP4IDCCaptioner` (fp16 tensors upcast to fp32). On them: :func:`read_checkpoint`,
:func:`retrieval_from_checkpoint` / :func:`captioner_from_checkpoint`, and ``idckit import-checkpoint --from
clip4idc-adapt|clip4idc-caption`` (:func:`import_adapt`, :func:`import_caption`; :func:`load_imported` reads the run
back).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import open_clip
import torch
import torch.distributed as dist
import torch.nn.parallel as parallel

from idckit import checkpoints, fileio
from idckit.authors import checkout_commit
from idckit.authors.convert import _need_settings
from idckit.errors import ConfigError
from idckit.experiments.config import model_config
from idckit.models.clip4idc import CaptionerConfig, CLIP4IDCCaptioner, CLIP4IDCRetrieval
from idckit.models.clip4idc import default_n_intra as three_quarters

SEED = 0
#: their ``CLIP`` constructor's sizes (heads = width // 64 in their code)
CLIP_SIZES = dict(embed_dim=128, image_resolution=56, vision_layers=4, vision_width=128, vision_patch_size=8,
                  context_length=77, vocab_size=49408, transformer_width=128, transformer_heads=2,
                  transformer_layers=2)
#: their ``decoder_config.json`` at the tiny size (dropout 0: deterministic training-mode losses)
DECODER_CONFIG = {"attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
                  "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
                  "num_attention_heads": 4, "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 49408,
                  "num_decoder_layers": 2, "max_target_embeddings": 77}
SPLITS = (3, 1)            # intra layers of the 4: 3+1 (the paper's 3/4) and 1+3
CAPTION_SPLIT = 3
MAX_WORDS = 32             # their --max_words
CAPTIONS = ["the small red metal cube has been moved",
            "someone added a large gray rubber sphere",
            "the blue cylinder that was behind the cyan ball changed its color to yellow"]
#: columns of the caption logits stored as they are: pad, SOT, EOT and a few words; plus SKETCH random ones
FIXED_COLUMNS = [0, 49406, 49407, 518, 1004, 2292, 3140, 4160]
RANDOM_COLUMNS, SKETCH = 56, 8


# ---------------------------------------------------------------------------------------------------------------
# Deterministic parameters (recomputed by the tests)
# ---------------------------------------------------------------------------------------------------------------

def parameter_value(seed: int, name: str, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """The value of the authors' parameter ``name`` in a recording: normal draws from a generator seeded by
    sha256(seed, name), scaled so activations stay in range: LayerNorm gains 1 + 0.1 N, biases 0.05 N, vectors
    N / sqrt(length), matrices and embeddings N / sqrt(numel / shape[0]); ``logit_scale`` ln 100 (the paper's)."""
    shape = tuple(shape)
    if name.endswith("logit_scale"):
        return torch.full(shape, math.log(100.0))
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2 ** 63 - 1))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    leaf = name.rsplit(".", 1)[-1]
    is_norm = any(t in name for t in ("ln_", "LayerNorm", "layer_norm"))
    if is_norm and leaf == "weight":
        x = 1 + 0.1 * x
    elif leaf == "bias" or leaf.endswith("_bias"):
        x = 0.05 * x
    elif len(shape) == 1:                      # class / image-type embeddings
        x = x * shape[0] ** -0.5
    else:
        x = x * (math.prod(shape) / shape[0]) ** -0.5
    return x.float()


def authors_state(spec: Mapping[str, tuple[str, tuple[int, ...]]], seed: int = SEED) -> dict[str, torch.Tensor]:
    """A recording's authors' state dict from its ``spec`` (key -> (parameter name, shape)); tied keys (their
    decoder's embeddings are CLIP's) name the same parameter and get equal tensors."""
    values: dict[str, torch.Tensor] = {}
    out = {}
    for key, (param, shape) in spec.items():
        if param not in values:
            values[param] = parameter_value(seed, param, shape)
        out[key] = values[param].clone()
    return out


# ---------------------------------------------------------------------------------------------------------------
# Converters: the authors' keys -> the kit's
# ---------------------------------------------------------------------------------------------------------------

#: the pair encoder's parameters CLIP does not have, under ``clip.visual.`` in their model
NEW_VISUAL = ("bef_embedding", "aft_embedding", "joint_positional_embedding", "ln_mid.weight", "ln_mid.bias")


def _float32(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors only, ``module.`` (DDP) stripped, fp16 (their CLIP matrices) upcast exactly to fp32."""
    out = {}
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            continue
        k = k[len("module."):] if k.startswith("module.") else k
        out[k] = v.float() if v.is_floating_point() else v
    return out


def clip_sizes(state: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """The CLIP sizes of an authors' state dict (keys ``clip.*``), read as their ``CLIP4IDC.__init__`` reads them."""
    s = {k[len("clip."):]: v for k, v in _float32(state).items() if k.startswith("clip.")}
    need = ["visual.proj", "visual.conv1.weight", "visual.positional_embedding", "text_projection",
            "positional_embedding", "token_embedding.weight", "ln_final.weight"]
    missing = [f"clip.{k}" for k in need if k not in s]
    if missing:
        raise KeyError(f"not a CLIP4IDC state dict with a ViT CLIP: missing {missing[:3]}")
    patch = s["visual.conv1.weight"].shape[-1]
    grid = round((s["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    return dict(
        embed_dim=s["text_projection"].shape[1], image_resolution=patch * grid,
        vision_layers=len([k for k in s if k.startswith("visual.") and k.endswith(".attn.in_proj_weight")]),
        vision_width=s["visual.conv1.weight"].shape[0], vision_patch_size=patch,
        context_length=s["positional_embedding"].shape[0], vocab_size=s["token_embedding.weight"].shape[0],
        transformer_width=s["ln_final.weight"].shape[0], transformer_heads=s["ln_final.weight"].shape[0] // 64,
        transformer_layers=len({k.split(".")[2] for k in s if k.startswith("transformer.resblocks")}))


def clip_from_authors_state(state: Mapping[str, torch.Tensor]):
    """An open_clip CLIP with the sizes of an authors' state dict: OpenAI's ViT layout (heads = width / 64,
    QuickGELU, as OpenAI's CLIP the authors start from), randomly initialised; load converted weights into the kit
    model built on it."""
    return clip_from_sizes(clip_sizes(state))


def clip_from_sizes(z: Mapping[str, int]):
    """The open_clip CLIP of :func:`clip_sizes`' dict (what an imported run's config.json records)."""
    return open_clip.CLIP(
        embed_dim=z["embed_dim"], quick_gelu=True,
        vision_cfg=dict(layers=z["vision_layers"], width=z["vision_width"], head_width=64,
                        patch_size=z["vision_patch_size"], image_size=z["image_resolution"]),
        text_cfg=dict(context_length=z["context_length"], vocab_size=z["vocab_size"], width=z["transformer_width"],
                      heads=z["transformer_heads"], layers=z["transformer_layers"]))


def _pair_encoder_keys(s: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in s.items():
        if not k.startswith("clip.visual."):
            continue
        rest = k[len("clip.visual."):]
        out["pair_encoder." + (rest if rest in NEW_VISUAL else "visual." + rest)] = v
    return out


def convert_retrieval(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An adaptation-stage state dict (their ``pytorch_model.bin.*``: ``clip.*``) -> the kit's
    :class:`~idckit.models.clip4idc.CLIP4IDCRetrieval` keys (``pair_encoder.*`` and the text tower's ``clip.*``).
    Keys of other modules (a caption stage's ``decoder.*``) are ignored."""
    s = _float32(state)
    out = _pair_encoder_keys(s)
    out.update({k: v for k, v in s.items() if k.startswith("clip.") and not k.startswith("clip.visual.")})
    return out


#: the kit's caption-model module -> theirs (``decoder.`` = their ``DecoderModel``)
_ATTENTION = {"query": "att.query", "key": "att.key", "value": "att.value", "out": "output.dense",
              "norm": "output.LayerNorm"}
_FFN = {"fc": "intermediate.dense", "proj": "output.dense", "norm": "output.LayerNorm"}


def convert_captioner(state: Mapping[str, Any], max_len: int) -> dict[str, torch.Tensor]:
    """A caption-stage state dict (their ``CLIP4IDC`` with task ``caption``: ``clip.*`` and ``decoder.*``) -> the
    kit's :class:`~idckit.models.clip4idc.CLIP4IDCCaptioner` keys, for captions of ``max_len`` tokens. Their
    decoder's word embedding and output matrix are CLIP's token embedding, its position embedding CLIP's text
    position embedding (first ``max_len`` rows kept); CLIP's text tower is not part of the kit's captioner."""
    s = _Used(_float32(state))
    out = _pair_encoder_keys(s)
    words = s.get("clip.token_embedding.weight", s.get("decoder.embeddings.word_embeddings.weight"))
    positions = s.get("clip.positional_embedding", s.get("decoder.embeddings.position_embeddings.weight"))
    if words is None or positions is None or "decoder.classifier.cls.predictions.bias" not in s:
        raise KeyError("not a CLIP4IDC caption-stage state dict: needs clip.token_embedding.weight, "
                       "clip.positional_embedding and decoder.* (an adaptation checkpoint has no decoder)")
    if positions.shape[0] < max_len:
        raise ValueError(f"the checkpoint has {positions.shape[0]} position rows, fewer than max_len={max_len}")
    out["word_embedding.weight"] = words
    out["position_embedding.weight"] = positions[:max_len]
    out["embed_norm.weight"] = s["decoder.embeddings.LayerNorm.weight"]
    out["embed_norm.bias"] = s["decoder.embeddings.LayerNorm.bias"]
    head = "decoder.classifier.cls.predictions."
    for kit, theirs in (("head_transform.0", "transform.dense"), ("head_transform.2", "transform.LayerNorm")):
        for p in ("weight", "bias"):
            out[f"{kit}.{p}"] = s[f"{head}{theirs}.{p}"]
    out["head_bias"] = s[head + "bias"]
    for stack, sublayers in (("encoder", {"self_attn": "slf_attn"}),
                             ("decoder", {"self_attn": "slf_attn", "cross_attn": "enc_attn"})):
        n = len({k.split(".")[3] for k in s if k.startswith(f"decoder.{stack}.layer.")})
        for i in range(n):
            theirs = f"decoder.{stack}.layer.{i}."
            for kit_sub, their_sub in sublayers.items():
                for a, b in _ATTENTION.items():
                    for p in ("weight", "bias"):
                        out[f"{stack}.{i}.{kit_sub}.{a}.{p}"] = s[f"{theirs}{their_sub}.{b}.{p}"]
            for a, b in _FFN.items():
                for p in ("weight", "bias"):
                    out[f"{stack}.{i}.ffn.{a}.{p}"] = s[f"{theirs}{b}.{p}"]
    # a decoder key the kit has no place for (a layer the counts above skipped, a module it does not know) would
    # leave it computing another function; CLIP's text tower and the decoder's copies of CLIP's tables are unused
    left = sorted(k for k in s if k.startswith("decoder.") and k not in s.used and k not in _TIED)
    if left:
        raise KeyError(f"decoder keys the kit's captioner has no place for: {', '.join(left[:4])}"
                       + (f", ... ({len(left)} in all)" if len(left) > 4 else ""))
    return out


class _Used(dict):
    """A state dict that records which keys were read (``used``), so a conversion's leftovers can be refused."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.used.add(key)
        return super().__getitem__(key)


#: their decoder's copies of CLIP's token table, position table and output matrix (tied in their model)
_TIED = ("decoder.embeddings.word_embeddings.weight", "decoder.embeddings.position_embeddings.weight",
         "decoder.classifier.cls.predictions.decoder.weight")


def captioner_sizes(state: Mapping[str, Any]) -> dict[str, int]:
    """Hidden size, FFN size and layer counts of a caption-stage state dict (heads are not in the weights)."""
    s = _float32(state)
    n = lambda stack: len({k.split(".")[3] for k in s if k.startswith(f"decoder.{stack}.layer.")})  # noqa: E731
    fc = s["decoder.decoder.layer.0.intermediate.dense.weight"]
    return dict(hidden=fc.shape[1], ffn=fc.shape[0], enc_layers=n("encoder"), dec_layers=n("decoder"))


def read_checkpoint(path: str | Path, upcast: bool = True) -> dict[str, torch.Tensor]:
    """Their checkpoint file (``torch.save(model.state_dict())``, fp16 CLIP matrices) loaded safely
    (``weights_only``: tensors and containers only, no code runs) as a plain dict; a ``{"state_dict": ...}``
    wrapper is unwrapped. Clear errors for a missing, truncated or foreign file."""
    path = Path(path)
    state = checkpoints.load(path, what="state dict",
                             fix="pass the file their training wrote (pytorch_model.bin.<epoch>); if it is truncated, "
                                 "download it again")
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError("the file holds no state dict of tensors", path=path,
                          fix="pass a CLIP4IDC checkpoint (their pytorch_model.bin.<epoch>)")
    return _float32(state) if upcast else dict(state)


def default_n_intra(state: Mapping[str, torch.Tensor]) -> int:
    """Intra layers for a checkpoint (the split is not in the weights): their ``--intra_num_hidden_layers`` default,
    9 of 12, i.e. the kit's 3/4 of the depth."""
    return three_quarters(clip_sizes(state)["vision_layers"])


def retrieval_from_checkpoint(state: Mapping[str, torch.Tensor], n_intra: int | None = None, *,
                              path: str | Path | None = None):
    """The kit's :class:`~idckit.models.clip4idc.CLIP4IDCRetrieval` holding an adaptation checkpoint's weights
    (``path``: the file, named in errors)."""
    with _as_config_error("clip4idc-adapt", path):
        n_intra = default_n_intra(state) if n_intra is None else n_intra
        model = CLIP4IDCRetrieval(clip_from_authors_state(state), n_intra=n_intra)
        _load_exactly(model, convert_retrieval(state), path, "clip4idc-adapt")
    return model.eval()


def captioner_from_checkpoint(state: Mapping[str, torch.Tensor], n_intra: int | None = None, *,
                              profile: str = "paper", heads: int | None = None, max_len: int | None = None,
                              path: str | Path | None = None):
    """The kit's :class:`~idckit.models.clip4idc.CLIP4IDCCaptioner` (config ``clip4idc-<profile>`` with the
    checkpoint's sizes) holding a caption checkpoint's weights. Heads are not in the weights: the profile's (8 at
    paper, their ``decoder_config.json``) unless given."""
    with _as_config_error("clip4idc-caption", path):
        if "decoder.classifier.cls.predictions.bias" not in state:
            raise KeyError("no decoder.* weights: an adaptation-stage checkpoint, not a caption-stage one")
        fields = dict(captioner_sizes(state), n_intra=default_n_intra(state) if n_intra is None else n_intra)
        if heads is not None:
            fields["heads"] = heads
        if max_len is not None:
            fields["max_len"] = max_len
        cfg = model_config(f"clip4idc-{profile}", **fields)
        converted = convert_captioner(state, cfg.max_len)      # a key it has no place for: said before any build
        model = CLIP4IDCCaptioner(clip_from_authors_state(state), cfg)
        _load_exactly(model, converted, path, "clip4idc-caption")
    return model.eval()


def _load_exactly(model: torch.nn.Module, converted: Mapping[str, torch.Tensor], path: str | Path | None,
                  kind: str) -> None:
    """Every key, every shape, finite values (:func:`idckit.checkpoints.load_into`), or the kit's error."""
    checkpoints.load_into(model, converted, path=path, what=f"{kind} checkpoint",
                          fix=f"pass an unmodified checkpoint of the public CLIP4IDC code of the --from {kind} stage")


@contextlib.contextmanager
def _as_config_error(kind: str, path: str | Path | None = None) -> Iterator[None]:
    """A checkpoint of the wrong stage, a foreign one or one whose tensors disagree in size -> the kit's error."""
    try:
        yield
    except (KeyError, RuntimeError, ValueError) as e:
        other = "clip4idc-adapt" if kind == "clip4idc-caption" else "clip4idc-caption"
        raise ConfigError(f"not a {kind} checkpoint of the public CLIP4IDC code: {str(e).strip(chr(39))[:300]}",
                          path=path,
                          fix=f"check the file; a checkpoint of the other stage imports with --from {other}") from e


# ---------------------------------------------------------------------------------------------------------------
# `idckit import-checkpoint --from clip4idc-adapt|clip4idc-caption` (registered in idckit.authors.convert)
# ---------------------------------------------------------------------------------------------------------------

#: what an imported CLIP4IDC run directory holds
RUN_FILES = ("best.pt", "config.json", "import.json")
#: OpenAI's ViT-B/32, the CLIP of the released checkpoints, by its open_clip name (QuickGELU, as trained)
VIT_B_32 = ("ViT-B-32-quickgelu", dict(embed_dim=512, image_resolution=224, vision_layers=12, vision_width=768,
                                       vision_patch_size=32, context_length=77, vocab_size=49408,
                                       transformer_width=512, transformer_heads=8, transformer_layers=12))


def import_adapt(checkpoint: Path, out: Path, *, force: bool = False, **options: Any) -> dict[str, Any]:
    """An adaptation-stage checkpoint (their ``ckpts/pretrained/pytorch_model.bin.{clevr,spot}``) as a kit run:
    ``best.pt`` holds :class:`~idckit.models.clip4idc.CLIP4IDCRetrieval`'s weights, so it also serves as a kit
    captioning run's ``init_from``. ``n_intra``: the split (not in the weights; default 3/4 of the depth, their 9)."""
    return _import("clip4idc-adapt", Path(checkpoint), Path(out), force=force, **options)


def import_caption(checkpoint: Path, out: Path, *, force: bool = False, **options: Any) -> dict[str, Any]:
    """A caption-stage checkpoint (their ``ckpts/trained/...``) as a kit run holding
    :class:`~idckit.models.clip4idc.CLIP4IDCCaptioner`'s weights at the ``paper`` switches. Options: ``n_intra``,
    ``n_heads`` (the caption model's heads, not in the weights: default the paper's 8), ``max_len`` (default 32)."""
    return _import("clip4idc-caption", Path(checkpoint), Path(out), force=force, **options)


def _import(kind: str, checkpoint: Path, out: Path, *, force: bool, n_intra: int | None = None,
            n_heads: int | None = None, max_len: int | None = None, vocab: Any = None) -> dict[str, Any]:
    if vocab is not None:
        raise ConfigError("--vocab is for IDC-PCL: CLIP4IDC captions with CLIP's own BPE vocabulary",
                          fix=f"drop --vocab for --from {kind}")
    if kind == "clip4idc-adapt" and (n_heads is not None or max_len is not None):
        raise ConfigError("--heads and --max-len set the caption model; an adaptation checkpoint has none",
                          fix="drop them, or import a caption-stage checkpoint with --from clip4idc-caption")
    claim = fileio.claim_dir(out, "imported-checkpoint", force=force, will_write=RUN_FILES,
                             what="imported checkpoint")
    raw = read_checkpoint(checkpoint, upcast=False)
    half = any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in raw.values())
    state = _float32(raw)
    del raw
    caption_stage = any(k.startswith("decoder.") for k in state)
    if kind == "clip4idc-adapt" and caption_stage:
        raise ConfigError("this is a caption-stage checkpoint (it has the caption decoder's decoder.* weights), not an "
                          "adaptation one", path=checkpoint, fix="import it with --from clip4idc-caption")
    bad = checkpoints.non_finite(state)     # any tensor, the text tower the caption stage drops too
    if bad:
        raise ConfigError(f"the checkpoint has tensors holding NaN or Inf: {checkpoints.listed(bad)}",
                          path=checkpoint, fix="pass a checkpoint of a training run that did not diverge")
    foreign = sorted(k for k in state if not k.startswith(("clip.", "decoder.")))
    if "word_embedding.weight" in foreign:
        raise ConfigError("this is an IDC-PCL checkpoint (it has word_embedding.weight), not a CLIP4IDC one",
                          path=checkpoint, fix="import it with --from idc-pcl (or idc-pcl-birds) and --vocab")
    if foreign:
        raise ConfigError(f"keys no CLIP4IDC model has: {', '.join(foreign[:4])}"
                          + (f", ... ({len(foreign)} in all)" if len(foreign) > 4 else ""), path=checkpoint,
                          fix="pass an unmodified checkpoint of the public CLIP4IDC code")
    if kind == "clip4idc-caption" and caption_stage:
        _need_settings(kind, n_heads=n_heads, max_len=max_len)
    with _as_config_error(kind, checkpoint):
        sizes = clip_sizes(state)
    if kind == "clip4idc-adapt":
        model = retrieval_from_checkpoint(state, n_intra, path=checkpoint)
        config: dict[str, Any] = {"kind": kind, "n_intra": model.pair_encoder.n_intra}
        dropped: list[str] = []
    else:
        model = captioner_from_checkpoint(state, n_intra, heads=n_heads, max_len=max_len, path=checkpoint)
        cfg = dataclasses.asdict(model.cfg)
        config = {"kind": kind, "max_len": cfg.pop("max_len"), "captioner": cfg}
        # CLIP's text tower: the caption stage runs it on a dummy input and never uses the result
        dropped = [k for k in state if not k.startswith(("clip.visual.", "decoder."))
                   and k not in ("clip.token_embedding.weight", "clip.positional_embedding")]
    name = VIT_B_32[0] if sizes == VIT_B_32[1] else None
    config.update({"imported_from": kind, "profile": "paper", "clip_model": name, "clip_sizes": sizes})
    summary = {"kind": kind, "checkpoint": str(checkpoint), "sha256": fileio.sha256(checkpoint),
               "stage": "adaptation" if kind == "clip4idc-adapt" else "captioning",
               "parameters": sum(p.numel() for p in model.parameters()), "n_intra": model.pair_encoder.n_intra,
               "dropped": sorted(dropped), "precision": "fp16 tensors upcast to fp32" if half else "fp32"}
    with claim.staging() as tmp:
        fileio.torch_save(model.state_dict(), tmp / "best.pt")
        fileio.write_json(tmp / "config.json", config, indent=1)
        fileio.write_json(tmp / "import.json", summary, indent=1)
    return {**summary, "out": str(out)}


def load_imported(run: str | Path):
    """The kit model of a run directory written by :func:`import_adapt` / :func:`import_caption`, in eval mode."""
    run = Path(run)
    missing = [f for f in RUN_FILES if not (run / f).is_file()]
    if missing:
        raise ConfigError(f"not an imported CLIP4IDC run: {', '.join(missing)} missing", path=run,
                          fix="write it with idckit import-checkpoint --from clip4idc-adapt|clip4idc-caption")
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    clip = clip_from_sizes(config["clip_sizes"])
    if config["kind"] == "clip4idc-adapt":
        model = CLIP4IDCRetrieval(clip, n_intra=config["n_intra"])
    else:
        model = CLIP4IDCCaptioner(clip, CaptionerConfig(**config["captioner"], max_len=config["max_len"]))
    damaged = "import the checkpoint again (idckit import-checkpoint ... --out DIR --force)"
    state = checkpoints.load(run / "best.pt", fix=damaged)
    checkpoints.load_into(model, state, path=run / "best.pt", fix=damaged)
    return model.eval()


# ---------------------------------------------------------------------------------------------------------------
# Recording (imports the authors' modules from a checkout)
# ---------------------------------------------------------------------------------------------------------------

def _stub_module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


@contextlib.contextmanager
def _authors_code(checkout: Path) -> Iterator[None]:
    """Their checkout on sys.path; stubs for what only their file download (boto3) and image loading (cv2)
    import; ``np.long`` (removed in NumPy 1.24, used by their data loaders); their import-time NCCL
    ``init_process_group`` answered by the 1-process gloo group made here. Everything is undone on exit."""
    saved_modules = dict(sys.modules)
    saved_path = list(sys.path)
    had_long = hasattr(np, "long")
    stubs = {"boto3": _stub_module("boto3"), "botocore": _stub_module("botocore"),
             "botocore.exceptions": _stub_module("botocore.exceptions", ClientError=Exception)}
    try:
        # local: optional, only their image loading imports it; a stub stands in where it is not installed
        import cv2  # noqa: F401
    except ImportError:
        stubs["cv2"] = _stub_module("cv2")
    for name, module in stubs.items():
        sys.modules.setdefault(name, module)
    if not had_long:
        np.long = np.int64
    real_init = dist.init_process_group
    tmp = tempfile.TemporaryDirectory()
    dist.init_process_group("gloo", init_method=f"file://{tmp.name}/pg", rank=0, world_size=1)
    dist.init_process_group = lambda *a, **k: None
    sys.path.insert(0, str(checkout))
    try:
        yield
    finally:
        dist.init_process_group = real_init
        dist.destroy_process_group()
        tmp.cleanup()
        sys.path[:] = saved_path
        for name in list(sys.modules):
            if name not in saved_modules:
                del sys.modules[name]
        if not had_long:
            del np.long


def _set_parameters(model: torch.nn.Module, seed: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every parameter := parameter_value(seed, its first name); returns the spec of the state dict
    (key -> (parameter name, shape)), tied keys naming the one parameter they share."""
    owner = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(parameter_value(seed, name, p.shape))
            owner[p.data_ptr()] = name
    spec = {}
    for key, t in model.state_dict().items():
        if t.data_ptr() not in owner:
            raise RuntimeError(f"{key} is not a parameter; the recording cannot recompute it")
        spec[key] = (owner[t.data_ptr()], tuple(t.shape))
    return spec


def _summarise_logits(logits: torch.Tensor, keep: torch.Tensor, columns: torch.Tensor,
                      sketch: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows [N, V] of caption logits kept by ``keep`` -> what a recording stores of them."""
    rows = logits[keep].double()
    return {"columns": rows[:, columns].float(), "logsumexp": rows.logsumexp(-1).float(),
            "argmax": rows.argmax(-1), "sketch": (rows @ sketch).float()}


def logit_probes(seed: int = SEED, vocab: int = 49408) -> tuple[torch.Tensor, torch.Tensor]:
    """(columns stored as they are, the [vocab, SKETCH] random projection, scaled by 1/sqrt(vocab)) of caption
    logits, recomputed by the tests."""
    g = torch.Generator().manual_seed(seed + 1)
    extra = torch.randperm(vocab, generator=g)[:RANDOM_COLUMNS]
    columns = torch.tensor(sorted(set(FIXED_COLUMNS) | set(extra.tolist())))
    sketch = torch.randn(vocab, SKETCH, generator=g, dtype=torch.float64) / vocab ** 0.5
    return columns, sketch


def summarise_logits(logits: torch.Tensor, keep: torch.Tensor, seed: int = SEED) -> dict[str, torch.Tensor]:
    columns, sketch = logit_probes(seed, logits.shape[-1])
    return _summarise_logits(logits, keep, columns, sketch)


def record(checkout: str | Path, out: str | Path, seed: int = SEED) -> list[Path]:
    """Record the authors' CLIP4IDC at the tiny size (module docstring) into ``out``/clip4idc_{adapt,caption}.pt."""
    checkout, out = Path(checkout).resolve(), Path(out)
    if not (checkout / "modules" / "modeling.py").is_file():
        raise FileNotFoundError(f"{checkout} is not a checkout of sushizixin/CLIP4IDC (no modules/modeling.py); "
                                "clone it and pass its folder as --clip4idc")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with _authors_code(checkout), tempfile.TemporaryDirectory() as tmp:
        return _record(checkout, out, seed, Path(tmp))


def _record(checkout: Path, out: Path, seed: int, tmp: Path) -> list[Path]:
    # local: the authors' checkout's modules, importable only inside _authors_code (their folder on sys.path)
    from modules.module_clip import CLIP
    from modules.modeling import CLIP4IDC  # local: the authors' checkout (see above)
    from modules.tokenization_clip import SimpleTokenizer  # local: the authors' checkout
    from dataloaders.dataloader_clevr_caption import CLEVR_DataLoader as CaptionLoader  # local: their checkout
    from dataloaders.dataloader_clevr_retrieval import CLEVR_DataLoader as RetrievalLoader  # local: the checkout
    import main_task_caption  # local: the authors' checkout

    clip_file = tmp / "tiny_clip.pt"     # their CLIP.get_config reads the base CLIP from a file
    torch.save(CLIP(**CLIP_SIZES).state_dict(), clip_file)
    decoder_dir = tmp / "decoder-tiny"
    decoder_dir.mkdir()
    (decoder_dir / "decoder_config.json").write_text(json.dumps(DECODER_CONFIG))

    tokenizer = SimpleTokenizer()
    special = {"CLS_TOKEN": "<|startoftext|>", "SEP_TOKEN": "<|endoftext|>", "MASK_TOKEN": "[MASK]",
               "UNK_TOKEN": "[UNK]", "PAD_TOKEN": "[PAD]"}
    loader = types.SimpleNamespace(max_words=MAX_WORDS, tokenizer=tokenizer, SPECIAL_TOKEN=special)
    # their data loaders' own text preparation, called on a stand-in for the loader object
    text = [RetrievalLoader._get_text(loader, 0, c) for c in CAPTIONS]
    caption = [CaptionLoader._get_text(loader, 0, c) for c in CAPTIONS]
    as_long = lambda arrays: torch.from_numpy(np.concatenate(arrays)).long()  # noqa: E731
    text_ids, text_mask, text_segment = (as_long([t[i] for t in text]) for i in range(3))
    dummy_ids, dummy_mask, dummy_segment, in_ids, dec_mask, out_ids = (as_long([c[i] for c in caption])
                                                                       for i in range(6))
    batch = len(CAPTIONS)
    g = torch.Generator().manual_seed(seed)
    size = CLIP_SIZES["image_resolution"]
    before = torch.randn(batch, 1, 3, size, size, generator=g)
    after = before + 0.5 * torch.randn(batch, 1, 3, size, size, generator=g)   # a pair differs, not wholly
    image_mask = torch.ones(batch, 2, dtype=torch.long)

    def build(task_type: str, intra: int):
        cfg = argparse.Namespace(task_type=task_type, intra_num_hidden_layers=intra, pretrained_clip_name=str(clip_file),
                                 local_rank=0, world_size=1, rank=0, linear_patch="2d", max_words=MAX_WORDS)
        model = CLIP4IDC.from_pretrained("cross-base", str(decoder_dir), task_config=cfg)
        model.float()           # their convert_weights leaves CLIP's matrices in fp16; the recording is fp32
        spec = _set_parameters(model, seed)
        return model.eval(), spec, cfg

    meta = {"commit": checkout_commit(checkout), "seed": seed, "clip_sizes": CLIP_SIZES,
            "decoder_config": DECODER_CONFIG,
            "captions": CAPTIONS, "max_words": MAX_WORDS}
    written = []

    # -- adaptation stage: pair encoder at two splits, text features, similarities, loss ---------------------------
    adapt: dict[str, Any] = {"meta": meta, "inputs": {"before": before[:, 0], "after": after[:, 0],
                                                      "text_ids": text_ids, "text_mask": text_mask}, "splits": {}}
    for intra in SPLITS:
        model, spec, _ = build("retrieval", intra)
        with torch.no_grad():
            text_feat, visual, _, tokens = model.get_sequence_visual_output(
                text_ids, text_segment, text_mask, torch.cat([before, after], 1), image_mask)
            sim, _ = model.get_similarity_logits(text_feat, visual, text_mask, image_mask, shaped=True)
            model.train()
            loss = model(text_ids, text_segment, text_mask, before, after, image_mask)
            model.eval()
        adapt["spec"] = spec
        adapt["splits"][intra] = {"tokens": tokens, "pair": visual, "text": text_feat, "logits": sim, "loss": loss}
    # their precision: convert_weights leaves CLIP's matrices in fp16 (recorded at the 3+1 split, the one outside fp32)
    model, _, _ = build("retrieval", SPLITS[0])
    from modules.module_clip import convert_weights  # local: the authors' checkout, on sys.path only here
    convert_weights(model.clip)
    half = sorted(k for k, v in model.state_dict().items() if v.dtype == torch.float16)
    with torch.no_grad():
        text_feat, visual, _, tokens = model.get_sequence_visual_output(
            text_ids, text_segment, text_mask, torch.cat([before, after], 1), image_mask)
    adapt["fp16"] = {"split": SPLITS[0], "keys": half, "tokens": tokens.float(), "pair": visual.float(),
                     "text": text_feat.float()}
    path = out / "clip4idc_adapt.pt"
    torch.save(adapt, path)
    written.append(path)

    # -- caption stage: teacher-forced logits, loss, greedy decoding ---------------------------------------------
    model, spec, cfg = build("caption", CAPTION_SPLIT)
    with torch.no_grad():
        _, _, _, visual_tokens = model.get_sequence_visual_output(
            dummy_ids, dummy_segment, dummy_mask, torch.cat([before, after], 1), image_mask)
        ones = torch.ones(visual_tokens.shape[:2], dtype=torch.long)
        logits = model.decoder_caption(visual_tokens, ones, in_ids, dec_mask, shaped=True, get_logits=True)
        model.train()
        loss = model(dummy_ids, dummy_segment, dummy_mask, before, after, image_mask,
                     input_caption_ids=in_ids, decoder_mask=dec_mask, output_caption_ids=out_ids)
        model.eval()
        greedy = torch.tensor(main_task_caption.greedy_decode(cfg, model, tokenizer, dummy_ids, dummy_segment,
                                                              dummy_mask, torch.cat([before, after], 1), image_mask))
    keep = dec_mask.bool()
    caption_rec = {"meta": meta, "spec": spec, "split": CAPTION_SPLIT,
                   "inputs": {"before": before[:, 0], "after": after[:, 0], "input_caption_ids": in_ids,
                              "decoder_mask": dec_mask, "output_caption_ids": out_ids},
                   "outputs": {"pair_tokens": visual_tokens, "logits": summarise_logits(logits, keep, seed),
                               "logits_at_padding": summarise_logits(logits, ~keep, seed),
                               "loss": loss, "greedy": greedy}}
    path = out / "clip4idc_caption.pt"
    torch.save(caption_rec, path)
    written.append(path)
    return written


# ---------------------------------------------------------------------------------------------------------------
# Training trace: their optimiser and schedule, called as their scripts call them (clip4idc_optim_trace.pt)
# ---------------------------------------------------------------------------------------------------------------

#: the traced run: TRACE_STEPS optimiser steps, the whole schedule (t_total = TRACE_STEPS, their warm-up proportion
#: 0.1: 2 steps), at lr / coef_lr large enough that every step moves the parameters far beyond fp32 rounding (the
#: paper's 1e-4 and 1e-3 are config values, checked against the config, not here)
TRACE_STEPS, TRACE_WARMUP, TRACE_LR, TRACE_COEF_LR = 20, 0.1, 0.05, 0.2
#: per stage: (their script, parameter name -> shape). Names are their model's; the set spans their four groups
#: (CLIP vs new parameters x decayed vs not) with the names their rule treats unlike the kit's (CLIP's ln_*, the new
#: embeddings, ``logit_scale``, the decoder's ``LayerNorm``)
TRACE_PARAMETERS = {
    "adapt": ("main_task_retrieval", {
        "clip.visual.transformer.resblocks.0.attn.in_proj_weight": (6, 4),
        "clip.visual.transformer.resblocks.0.attn.in_proj_bias": (6,),
        "clip.visual.ln_post.weight": (4,),
        "clip.visual.proj": (4, 3),
        "clip.logit_scale": (),
        "clip.visual.bef_embedding": (4,),
        "clip.visual.ln_mid.weight": (4,),
        "clip.visual.ln_mid.bias": (4,)}),
    "caption": ("main_task_caption", {
        "clip.visual.transformer.resblocks.0.attn.in_proj_weight": (6, 4),
        "clip.visual.transformer.resblocks.0.attn.in_proj_bias": (6,),
        "clip.visual.ln_post.weight": (4,),
        "clip.visual.ln_mid.weight": (4,),
        "decoder.decoder.layer.0.intermediate.dense.weight": (8, 4),
        "decoder.decoder.layer.0.intermediate.dense.bias": (8,),
        "decoder.decoder.layer.0.output.LayerNorm.weight": (4,),
        "decoder.classifier.cls.predictions.bias": (5,)}),
}
#: the tensor whose gradients are 6x the others': its norm exceeds 1, so the global clip and (without it) BERT's
#: per-tensor clip bind
TRACE_LARGE = {"adapt": "clip.visual.proj", "caption": "decoder.decoder.layer.0.intermediate.dense.weight"}


def module_of(values: Mapping[str, torch.Tensor], layer_norms: tuple[str, ...] = ()) -> torch.nn.Module:
    """A module whose ``named_parameters`` are ``values`` (dotted names -> tensors, copied); the modules named in
    ``layer_norms`` are ``torch.nn.LayerNorm`` (for grouping rules that look at module types)."""
    root = torch.nn.Module()
    for name, value in values.items():
        path, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        m = root
        prefix = []
        for part in path.split(".") if path else []:
            prefix.append(part)
            if not hasattr(m, part):
                norm = ".".join(prefix) in layer_norms
                m.add_module(part, torch.nn.LayerNorm(value.shape[0]) if norm else torch.nn.Module())
            m = getattr(m, part)
        if isinstance(m, torch.nn.LayerNorm):
            getattr(m, leaf).data.copy_(value)
        else:
            m.register_parameter(leaf, torch.nn.Parameter(value.clone()))
    return root


def trace_initial(stage: str, seed: int = SEED) -> dict[str, torch.Tensor]:
    return {n: parameter_value(seed, n, s) if n != "clip.logit_scale" else torch.tensor(2.0)
            for n, s in TRACE_PARAMETERS[stage][1].items()}


def trace_gradients(stage: str, seed: int = SEED) -> list[dict[str, torch.Tensor]]:
    """The fixed gradient of every traced tensor at every step (loss = sum <p, G_k>, so d loss / dp = G_k)."""
    out = []
    for k in range(TRACE_STEPS):
        g = torch.Generator().manual_seed(seed * 1000 + k)
        out.append({n: torch.randn(s, generator=g) * (6.0 if n == TRACE_LARGE[stage] else 0.3)
                    for n, s in TRACE_PARAMETERS[stage][1].items()})
    return out


def record_optim_trace(checkout: str | Path, out: str | Path, seed: int = SEED) -> Path:
    """``out``/clip4idc_optim_trace.pt: their ``prep_optimizer`` (BertAdam, their parameter groups and schedule) and
    their training step's clip/step order, run for TRACE_STEPS steps on fixed gradients, per stage (module doc of
    the trace test, tests/test_training_trace_clip4idc.py)."""
    checkout, out = Path(checkout).resolve(), Path(out)
    if not (checkout / "modules" / "optimization.py").is_file():
        raise FileNotFoundError(f"{checkout} is not a checkout of sushizixin/CLIP4IDC (no modules/optimization.py)")
    out.mkdir(parents=True, exist_ok=True)
    with _authors_code(checkout):
        from modules.optimization import SCHEDULES  # local: the authors' checkout, on sys.path only here
        trace: dict[str, Any] = {"meta": {"commit": checkout_commit(checkout), "seed": seed, "steps": TRACE_STEPS,
                                          "warmup_proportion": TRACE_WARMUP, "lr": TRACE_LR,
                                          "coef_lr": TRACE_COEF_LR}}
        for stage, (script, _) in TRACE_PARAMETERS.items():
            prep = importlib.import_module(script).prep_optimizer
            for global_clip in ((True, False) if stage == "adapt" else (True,)):
                name = stage if global_clip else f"{stage}_no_global_clip"
                trace[name] = _trace_stage(prep, SCHEDULES, stage, global_clip, seed)
    path = out / "clip4idc_optim_trace.pt"
    torch.save(trace, path)
    return path


def _trace_stage(prep, schedules, stage: str, global_clip: bool, seed: int) -> dict[str, Any]:
    initial, grads = trace_initial(stage, seed), trace_gradients(stage, seed)
    model = module_of(initial)
    args = argparse.Namespace(lr=TRACE_LR, warmup_proportion=TRACE_WARMUP)
    ddp = parallel.DistributedDataParallel
    parallel.DistributedDataParallel = lambda m, **kw: m      # their prep_optimizer wraps the model for 2 GPUs
    try:
        optimizer, _, model = prep(args, model, TRACE_STEPS, torch.device("cpu"), 1, 0, coef_lr=TRACE_COEF_LR)
    finally:
        parallel.DistributedDataParallel = ddp
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{"params": [names[id(p)] for p in g["params"]], "lr": g["lr"], "weight_decay": g["weight_decay"],
               "b1": g["b1"], "b2": g["b2"], "e": g["e"], "max_grad_norm": g["max_grad_norm"],
               "schedule": g["schedule"]} for g in optimizer.param_groups]
    params = dict(model.named_parameters())
    lrs, norms, after, losses = [], [], [], []
    for k in range(TRACE_STEPS):
        # their train_epoch: backward, the global clip (main_task_*.py: clip_grad_norm_(model.parameters(), 1.0)),
        # optimizer.step(); the schedule runs inside BertAdam on each tensor's step count (= k here)
        lrs.append([g["lr"] * schedules[g["schedule"]](k / g["t_total"], g["warmup"]) if g["params"] else 0.0
                    for g in optimizer.param_groups])
        loss = sum((params[n] * grads[k][n]).sum() for n in params)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0 if global_clip else float("inf"))))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        after.append({n: p.detach().clone() for n, p in params.items()})
    stacked = lambda steps: {n: torch.stack([s[n] for s in steps]) for n in params}  # noqa: E731  [steps, *shape]
    return {"groups": groups, "initial": initial, "grads": stacked(grads), "lr": torch.tensor(lrs, dtype=torch.float64),
            "grad_norm": torch.tensor(norms), "loss": torch.tensor(losses), "after": stacked(after),
            "global_clip": global_clip}
