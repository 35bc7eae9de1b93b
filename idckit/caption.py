"""Caption any two images with a trained IDC-PCL run: ``idckit caption BEFORE AFTER``.

The default model is the best finished fine-tuning run in the run cache (highest val CIDEr-D; test never
decides). Images of any size are resized exactly as the run's training features were (the backbone and its
weights are read from the run's feature store), so a caption here is what the run would write for a dataset
pair.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from idckit import paths
from idckit.errors import ConfigError, DatasetError


@dataclass
class Captioned:
    caption: str
    changed: bool | None          # the distractor-judging head's verdict, where the model has one
    p_changed: float | None
    run: Path


def finished_runs(runs_dir: str | Path | None = None) -> list[tuple[float, Path]]:
    """(val CIDEr-D, run dir) of every finished IDC-PCL fine-tuning run, best first."""
    root = Path(runs_dir) if runs_dir else paths.runs_dir()
    found = []
    for metrics in root.glob("pcl-finetune-*/metrics.json"):
        try:
            val = json.loads(metrics.read_text())["val"]["CIDEr-D"]
        except (json.JSONDecodeError, KeyError):
            continue
        if (metrics.parent / "best.pt").is_file() and (metrics.parent / "vocab.json").is_file():
            found.append((float(val), metrics.parent))
    return sorted(found, key=lambda t: (-t[0], str(t[1])))


def resolve_model(model: str | Path | None, runs_dir: str | Path | None = None) -> Path:
    if model is None:
        runs = finished_runs(runs_dir)
        if not runs:
            raise ConfigError("no trained IDC-PCL run found in the run cache", path=Path(runs_dir or paths.runs_dir()),
                              fix="train one first: `make reproduce PROFILE=smoke` (minutes) or run "
                                  "notebooks/table2_clevr_change.ipynb; or pass --model RUN_DIR")
        return runs[0][1]
    run = Path(model)
    if not run.is_dir():
        candidate = Path(runs_dir or paths.runs_dir()) / str(model)
        run = candidate if candidate.is_dir() else run
    for need in ("best.pt", "vocab.json", "config.json"):
        if not (run / need).is_file():
            raise ConfigError(f"not a finished IDC-PCL run: {need} is missing", path=run / need,
                              fix="pass a runs/pcl-finetune-<key> directory whose training finished")
    return run


def caption_pair(before: str | Path, after: str | Path, *, model: str | Path | None = None,
                 runs_dir: str | Path | None = None, beam: int = 1, device: str | None = None) -> Captioned:
    """Caption one pair on ``device`` (None: auto)."""
    import torch

    from idckit.device import resolve

    from idckit.data.clevr_change import load_image
    from idckit.data.features import build_backbone, preprocess
    from idckit.models.decoding import beam_search, greedy_decode
    from idckit.models.pcl import PCL, PCLConfig
    from idckit.text.vocab import Vocab

    for p in (before, after):
        load_image(p)  # a clear DatasetError for a missing or unreadable file, before any model work
    if beam < 1:
        raise ConfigError(f"--beam must be >= 1, got {beam}")
    run = resolve_model(model, runs_dir)
    cfg = json.loads((run / "config.json").read_text())
    vocab = Vocab.load(run / "vocab.json")
    dev = resolve(device)
    net, forward, label = build_backbone(cfg["features"], None)
    net.to(dev)
    if label != cfg.get("weights"):
        raise DatasetError(f"this run was trained on {cfg['features']} features with weights {cfg.get('weights')!r}, "
                           f"but only {label!r} can be loaded here", path=run,
                           fix="caption with a run trained on features this machine can compute")
    with torch.inference_mode():
        grid = forward(preprocess([Path(before), Path(after)]).to(dev))   # [2, C, h, w]
        grid = grid.flatten(2).transpose(1, 2).half().float()              # as stored: float16, row-major
        f1, f2 = grid[0:1], grid[1:2]
        state = torch.load(run / "best.pt", map_location="cpu", weights_only=True)
        pcl = PCL(PCLConfig(vocab_size=len(vocab), feat_dim=grid.shape[2], n_regions=grid.shape[1],
                            max_text_len=cfg["max_len"], **cfg["model"]), vocab)
        pcl.load_state_dict(state)
        pcl.to(dev).eval()
        decode = (lambda v: beam_search(pcl, v, cfg["max_len"] - 1, beam)) if beam > 1 else \
            (lambda v: greedy_decode(pcl, v, cfg["max_len"] - 1))
        text = vocab.decode(decode((f1, f2))[0].tolist())
        changed = p = None
        if pcl.cfg.distractor_head:
            out = pcl(f1, f2, torch.full((1, 1), vocab.bos_id, device=dev), mode="finetune")
            p = float(pcl.distractor_logits(out).softmax(-1)[0, 1])
            changed = p >= 0.5
    return Captioned(caption=text, changed=changed, p_changed=p, run=run)


def main(before: str, after: str, model: str | None, runs_dir: str | None, beam: int, device: str | None = None) -> int:
    res = caption_pair(before, after, model=model, runs_dir=runs_dir, beam=beam, device=device)
    print(res.caption)
    if res.changed is not None:
        verdict = "a real change" if res.changed else "no real change (distractor: viewpoint/lighting only)"
        print(f"judgment: {verdict} (p(change) = {res.p_changed:.2f})")
    print(f"model: {res.run}")
    return 0


__all__: Sequence[str] = ("caption_pair", "finished_runs", "resolve_model", "main")
