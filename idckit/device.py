"""Where computation runs: one device setting for every stage, and the precision that goes with it.

``resolve("auto")`` picks CUDA, then Apple's MPS, then the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"mps"``
name one. Under torchrun every process takes the GPU of its ``LOCAL_RANK`` (``"auto"`` and ``"cuda"`` both mean
that GPU), so ``torchrun --nproc_per_node=8`` needs no per-process setting.

Mixed precision (``amp``) follows the device: bf16 autocast where the device computes in bf16 (CPU, MPS, CUDA
from Ampere on), fp16 autocast with a loss scaler on older CUDA GPUs. On CUDA, TF32 matmuls are allowed (the
fp32 numbers change in the 4th significant digit, the usual trade for a 2-8x faster matmul on Ampere+).

Checkpoints hold CPU tensors (:func:`to_cpu`) and are read with ``map_location="cpu"``, so a run written on a
GPU resumes or decodes on a laptop and the other way round.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from idckit.errors import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def resolve(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch device for ``spec`` (``None`` = ``"auto"``); a clear error when the named device is absent."""
    if isinstance(spec, torch.device):
        return spec
    spec = (spec or "auto").strip().lower()
    local = os.environ.get("LOCAL_RANK")
    if spec == "auto":
        if torch.cuda.is_available():
            spec = "cuda"
        elif torch.backends.mps.is_available():
            spec = "mps"
        else:
            spec = "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        raise ConfigError(f"unknown device {spec!r}", fix=f"use {DEVICE_CHOICES}") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r} asked for, but this PyTorch sees no CUDA GPU",
                              fix="use --device cpu (or auto), or install a CUDA build of torch")
        if device.index is None:   # one process per GPU under torchrun
            device = torch.device("cuda", int(local) if local is not None else torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {spec!r} asked for, but there are {torch.cuda.device_count()} GPUs",
                              fix="use cuda:0 .. cuda:N-1, or auto")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' asked for, but MPS is not available", fix="use --device cpu (or auto)")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"unsupported device {spec!r}", fix=f"use {DEVICE_CHOICES}")
    return device


def prepare(device: torch.device) -> None:
    """Per-process settings for ``device``: on CUDA, the current GPU and TF32 matmuls/convolutions."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True   # CPU and MPS autocast both take bf16 (the CPU emulates it without AVX512-BF16/AMX: slow, not wrong)


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype of mixed precision on ``device``."""
    return torch.bfloat16 if bf16_supported(device) else torch.float16


def autocast(device: torch.device, enabled: bool):
    """Autocast for a training step on ``device`` (a no-op context when not ``enabled``)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype(device))


def grad_scaler(device: torch.device, enabled: bool) -> torch.amp.GradScaler:
    """fp16 needs loss scaling (its exponent range underflows small gradients); bf16 and fp32 do not, and then the
    scaler is disabled (its ``scale``/``step``/``update`` pass through)."""
    fp16 = enabled and amp_dtype(device) == torch.float16
    return torch.amp.GradScaler(device.type if fp16 else "cpu", enabled=fp16)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def copy_to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CPU batch on ``device``; to a GPU through page-locked memory, so the copy runs asynchronously (a DataLoader
    with ``pin_memory`` has pinned it already; pinning again is then free)."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def to_cpu(obj: Any) -> Any:
    """A checkpoint's content with every tensor on the CPU, so the file loads on any machine."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def describe() -> dict[str, Any]:
    """What this machine offers (for ``idckit doctor`` and run provenance)."""
    out: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "auto": str(resolve("auto")),
                           "cuda_available": torch.cuda.is_available(), "gpus": [],
                           "mps_available": torch.backends.mps.is_available(),
                           "cpu_threads": torch.get_num_threads(),
                           "cpu_native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2**30, 1),
                                "capability": f"{p.major}.{p.minor}", "bf16": p.major >= 8})
    return out
