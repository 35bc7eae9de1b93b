"""Caption any two images with a trained IDC-PCL run: ``idckit caption BEFORE AFTER``.

The default model is the best finished fine-tuning run (highest val CIDEr-D; test never decides) among the runs of
one profile on one dataset, since val scores of different data or training lengths do not compare; the command says
which it took (:func:`choose_run`). Images of any size are resized exactly as the run's training features were
(the backbone and its weights are read from the run's feature store), so a caption here is what the run would
write for a dataset pair.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from idckit import paths, registry
from idckit.data.clevr_change import ClevrChange
from idckit.data.features import IMAGE_SIZE, build_backbone, preprocess
from idckit.data.images import load_image
from idckit.device import resolve
from idckit.errors import ConfigError, DatasetError
from idckit.experiments.config import check_profile
from idckit.experiments.data import content_identity, synth_root
from idckit.experiments.runs import Run
from idckit.fileio import read_run_file
from idckit.models.decoding import MIN_WORDS, beam_search, greedy_decode
from idckit.text.vocab import Vocab


@dataclass
class Captioned:
    caption: str
    changed: bool | None          # the distractor-judging head's verdict, where the model has one
    p_changed: float | None
    run: Path
    why: str = ""                 # how the run was chosen (which profile and data it is the best of)


@dataclass(frozen=True)
class FinishedRun:
    val: float                    # val CIDEr-D (raw scale)
    dir: Path
    profile: str | None           # from its record.json; None for runs finished before records existed
    data: str | None              # the data's content identity
    description: str


#: which profile's runs `idckit caption` prefers when not told: the default, then the longer-trained paper runs
PROFILE_PREFERENCE = (paths.DEFAULT_PROFILE, "paper", "smoke")


def _finished(runs_dir: str | Path | None) -> list[FinishedRun]:
    root = Path(runs_dir) if runs_dir else paths.runs_dir()
    found = []
    for metrics in root.glob("pcl-finetune-*/metrics.json"):
        run = metrics.parent
        try:
            val = float(json.loads(metrics.read_text())["val"]["CIDEr-D"])
            config = json.loads((run / "config.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
            continue  # not a run this command can use; --model still names it explicitly
        if not ((run / "best.pt").is_file() and (run / "vocab.json").is_file()):
            continue
        record = Run(run, run.name.rsplit("-", 1)[-1], config).record()
        found.append(FinishedRun(val, run, record.get("profile"), record.get("data_identity") or config.get("data"),
                                 record.get("data") or "data unknown (finished before runs kept a record)"))
    return sorted(found, key=lambda r: (-r.val, str(r.dir)))


def finished_runs(runs_dir: str | Path | None = None) -> list[tuple[float, Path]]:
    """(val CIDEr-D, run dir) of every finished IDC-PCL fine-tuning run, best first."""
    return [(r.val, r.dir) for r in _finished(runs_dir)]


def _default_data(profile: str | None) -> str | None:
    """The content identity of ``profile``'s synthetic default, if it has been generated."""
    if profile is None:
        return None
    root = synth_root(profile)
    return content_identity(root) if (root / "synth_info.json").is_file() else None


def choose_run(runs_dir: str | Path | None = None, *, profile: str | None = None,
               data_root: str | Path | None = None) -> tuple[Path, str]:
    """The best finished run (highest val CIDEr-D; test never decides) among runs of ONE profile on ONE dataset,
    and a sentence saying which: val scores of different data or training lengths do not compare.

    ``profile`` / ``data_root`` restrict the choice; otherwise the default profile is preferred (then paper, then
    smoke) and, within a profile, its synthetic default data; a choice between two other datasets is refused."""
    root = Path(runs_dir or paths.runs_dir())
    if profile is not None:
        check_profile(profile)
    ident = None
    if data_root is not None:
        ClevrChange(Path(data_root).expanduser())  # a wrong root is named here, with the layout it needs
        ident = content_identity(Path(data_root).expanduser())
    _check_runs_dir(root)
    runs = _finished(runs_dir)
    if not runs:
        raise ConfigError("no trained IDC-PCL run found in the run cache", path=root,
                          fix="train one first: `make reproduce` (or `idckit reproduce table2_clevr_change "
                              "--profile smoke` for minutes) or run notebooks/table2_clevr_change.ipynb; "
                              "or pass --model RUN_DIR")
    wanted = runs
    if profile is not None:
        wanted = [r for r in wanted if r.profile == profile]
    if data_root is not None:
        wanted = [r for r in wanted if r.data == ident]
    groups: dict[tuple, list[FinishedRun]] = {}
    for r in wanted:
        groups.setdefault((r.profile, r.data), []).append(r)
    have = sorted({f"profile {r.profile or 'unknown'} on {r.description}" for r in runs})
    if not groups:
        raise ConfigError("no finished IDC-PCL run matches"
                          + (f" profile {profile!r}" if profile else "")
                          + (f" data {data_root}" if data_root else ""), path=root,
                          fix="choose among the finished runs: " + "; ".join(have))
    defaults = {p: _default_data(p) for p in PROFILE_PREFERENCE}

    def rank(key: tuple) -> tuple[int, int]:
        p, data = key
        order = PROFILE_PREFERENCE.index(p) if p in PROFILE_PREFERENCE else len(PROFILE_PREFERENCE)
        return order, 0 if data is not None and data == defaults.get(p) else 1

    best_rank = min(rank(k) for k in groups)
    tied = [k for k in groups if rank(k) == best_rank]
    if len(tied) > 1:
        raise ConfigError(f"finished runs of profile {tied[0][0] or 'unknown'} on {len(tied)} different datasets; "
                          "their val scores do not compare", path=root,
                          fix="pass --data-root ROOT (the data to caption like), or --model RUN_DIR; found: "
                              + "; ".join(groups[k][0].description for k in tied))
    chosen = groups[tied[0]]
    best = chosen[0]
    others = len(runs) - len(chosen)
    why = (f"best val CIDEr-D {100 * best.val:.1f} of {len(chosen)} finished run(s) at profile "
           f"{best.profile or 'unknown'} on {best.description}")
    if others:
        why += f"; {others} run(s) of other profiles or data not compared (--profile, --data-root choose)"
    return best.dir, why


def _check_runs_dir(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise ConfigError("--runs-dir names a file, not a run cache directory", path=root,
                          fix="pass the directory runs are cached in (default runs/)")


def resolve_model(model: str | Path | None, runs_dir: str | Path | None = None, *, profile: str | None = None,
                  data_root: str | Path | None = None) -> Path:
    return _resolve(model, runs_dir, profile=profile, data_root=data_root)[0]


def _resolve(model, runs_dir, *, profile=None, data_root=None) -> tuple[Path, str]:
    if model is None:
        return choose_run(runs_dir, profile=profile, data_root=data_root)
    run = Path(model)
    if not run.is_dir():
        root = Path(runs_dir or paths.runs_dir())
        _check_runs_dir(root)
        candidate = root / str(model)
        if not candidate.is_dir():
            raise ConfigError(f"--model {model} is neither a run directory nor the name of a run in the run cache",
                              path=candidate, fix="pass a runs/pcl-finetune-<key> directory (or its name), or omit "
                                                  "--model to take the best finished run")
        run = candidate
    for need in ("best.pt", "vocab.json", "config.json"):
        if not (run / need).is_file():
            raise ConfigError(f"not a finished IDC-PCL run: {need} is missing", path=run / need,
                              fix="pass a runs/pcl-finetune-<key> directory whose training finished")
    return run, "given by --model"


def _run_config(run: Path) -> dict:
    return read_run_file(run / "config.json", {"features": str, "max_len": int, "model": dict},
                         fix="pass another run (a runs/pcl-finetune-<key> directory) with --model; this one's "
                             "config.json is damaged or not an IDC-PCL fine-tuning run's")


def caption_pair(before: str | Path, after: str | Path, *, model: str | Path | None = None,
                 runs_dir: str | Path | None = None, beam: int = 1, profile: str | None = None,
                 data_root: str | Path | None = None, device: str | None = None) -> Captioned:
    """Caption one pair on ``device`` (None: auto)."""
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ConfigError(f"--beam must be an integer >= 1, got {beam!r}", fix="pass --beam 1 (greedy) or a width")
    for name, p in (("BEFORE", before), ("AFTER", after)):
        if not Path(p).is_file():
            raise DatasetError(f"the {name} image " + ("is a directory" if Path(p).is_dir() else "does not exist"),
                               path=p, fix="pass the paths of two image files (PNG, JPEG, ...): idckit caption "
                                           "BEFORE AFTER")
        load_image(p)  # a clear DatasetError for an unreadable file, before any model work
    dev = resolve(device)
    run, why = _resolve(model, runs_dir, profile=profile, data_root=data_root)
    cfg = _run_config(run)
    net, forward, label = build_backbone(cfg["features"], None)
    net.to(dev)
    if label != cfg.get("weights"):
        raise DatasetError(f"this run was trained on {cfg['features']} features with weights {cfg.get('weights')!r}, "
                           f"but only {label!r} can be loaded here", path=run,
                           fix="caption with a run trained on features this machine can compute")
    damaged = "pass another run with --model, or train this one again (delete its directory)"
    with torch.inference_mode():
        size = cfg.get("feature_size", IMAGE_SIZE)                        # the grid the run was trained on
        grid = forward(preprocess([Path(before), Path(after)], size).to(dev))   # [2, C, h, w]
        grid = grid.flatten(2).transpose(1, 2).half().float()              # as stored: float16, row-major
        f1, f2 = grid[0:1], grid[1:2]
        pcl, _ = registry.family("pcl").load_run(run, device=dev, n_regions=grid.shape[1])
        if pcl.cfg.feat_dim != grid.shape[2]:
            raise ConfigError(f"the run's model reads {pcl.cfg.feat_dim}-d features, {cfg['features']} gives "
                              f"{grid.shape[2]}-d ones here", path=run / "best.pt", fix=damaged)
        vocab = Vocab.load(run / "vocab.json")
        # the run's own decoding (0 at paper, as the authors); a run from before the setting decoded at MIN_WORDS
        least = (cfg.get("finetune") or {}).get("decode_min_words", MIN_WORDS)
        decode = (lambda v: beam_search(pcl, v, cfg["max_len"] - 1, beam, min_len=least)) if beam > 1 else \
            (lambda v: greedy_decode(pcl, v, cfg["max_len"] - 1, least))
        text = vocab.decode(decode((f1, f2))[0].tolist(), pcl.cfg.special_words)
        changed = p = None
        if pcl.cfg.distractor_head:
            out = pcl(f1, f2, torch.full((1, 1), vocab.bos_id, device=dev), mode="finetune")
            p = float(pcl.judge_logits(out).softmax(-1)[0, 1])
            if not math.isfinite(p):     # finite weights can still overflow: never print "nan" as a judgment
                raise ConfigError(f"the model's change judgment is {p} for this pair, not a probability",
                                  path=run / "best.pt", fix=damaged)
            changed = p >= 0.5
    return Captioned(caption=text, changed=changed, p_changed=p, run=run, why=why)


def main(before: str, after: str, model: str | None, runs_dir: str | None, beam: int, profile: str | None = None,
         data_root: str | None = None, device: str | None = None) -> int:
    res = caption_pair(before, after, model=model, runs_dir=runs_dir, beam=beam, profile=profile,
                       data_root=data_root, device=device)
    print(res.caption)
    if res.changed is not None:
        verdict = "a real change" if res.changed else "no real change (distractor: viewpoint/lighting only)"
        print(f"judgment: {verdict} (p(change) = {res.p_changed:.2f})")
    print(f"model: {res.run} ({res.why})")
    return 0


__all__: Sequence[str] = ("caption_pair", "choose_run", "finished_runs", "resolve_model", "main")
