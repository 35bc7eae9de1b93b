"""The run cache: a run is keyed by a hash of its full resolved config.

``runs/<kind>-<key>/`` holds ``config.json`` (written first), whatever the run produces (checkpoints,
predictions in the RCC format, logs), ``record.json`` (who finished it: commit, code version, profile, data) and
``metrics.json`` (written last, atomically). A run is complete exactly when ``metrics.json`` exists, so a killed
run is never mistaken for a finished one and simply resumes. Tables that need the same run (tables 2, 3 and row 4
of table 4) compute the same key and train it once.

A key holds what the run is, never where things lie: the data's content identity
(:func:`idckit.experiments.data.content_identity`: its caption, split and type files and its image list, so moved
or copied data keeps its runs and edited data retrains) and :data:`TRAINING_CODE_VERSION` (so changed training
code retrains).

Why a version string and not a hash of the source: runs cost minutes to days, and a hash would throw them all away
for a docstring, a rename or device plumbing that cannot change what a run learns. A version alone could be
forgotten, so ``tests/test_runs.py`` compares :func:`training_fingerprint` (the training modules' code, docstrings
and comments ignored) with :data:`TRAINING_CODE_FINGERPRINT`: any change to that code fails the test until someone
decides: bump the version if the change alters what a run learns, and record the new fingerprint either way.
"""
from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from idckit import paths
from idckit.errors import ConfigError
from idckit.experiments import data
from idckit.fileio import check_output_dir, write_json
from idckit.reports.report import git_commit
from idckit.train import distributed

try:
    import fcntl
except ImportError:          # pragma: no cover - Windows: runs are not locked (Run.exclusive)
    fcntl = None

#: bump when a change to the training code alters what a run learns (every cached run then retrains)
#: 2: grouped IDC-PCL fine-tuning batches (device/DDP plumbing, other datasets, the DataLoader path and the settings
#: tidy-up since: same results on one CPU process)
#: 3: IDC-PCL's every-position fine-tuning runs its last layer on the query rows alone (the same function, but the
#: clean rows' dropout masks are no longer drawn, so a run's random stream and its numbers change)
#: 4: the run keys as the settings are (the compatibility bends that kept older keys are gone: DUDA's settings are
#: no longer reshaped, feature_size and train_fraction always enter a feature-based run's identity, a frozen
#: CLIP4IDC captioner keeps its visual_lr_scale, the stand-in CLIP's data_version is its data's)
#: 5: decoding writes at least one word (a model whose val captions ended at once now writes words, so validation
#: can select another step), and images of other modes and bit depths read as their pixels, not white
TRAINING_CODE_VERSION = "5"
#: (not bumped for features.py's float16 range check, the untrained ResNet-101's zero-initialised residuals and the
#: efficientnet_lite0_b5 backbone: the stores of the existing backbones and weights come out the same; nor for the
#: hybrid stand-in CLIP, a new architecture that builds no existing run differently; nor for the captioner's
#: difference_tokens option, off in every config; nor for the patch-32 stand-in idckit-standin-ViT-12-32, a new
#: architecture no config names; nor for features.py's image_size / pcl.json's feature_size, 224 px as before unless
#: a config says otherwise, and any other size a store and a run key of its own; nor for the loop's stop_on_collapse,
#: off unless a config names it (and then in that run's key), nor for its optional distinct threshold (1, as before,
#: unless the rule names another, and then in that run's key), nor for IDC-PCL's data assembly moving to
#: pcl_inputs.py, the same batches bit for bit, nor for the lock around feature extraction; nor for IDC-PCL
#: fine-tuning's loss_reduction, "mean" as before at cpu and smoke, "sum" (the authors') only at paper; nor for
#: IDC-PCL's MLM head scoring [IMG1]/[IMG2] -inf at special_tokens "shared_cls", which only paper sets; nor for
#: IDC-PCL's special_words, decoded specials left out ("drop") as before at cpu and smoke, "keep" only at paper; nor
#: for CLIP4IDC's bertadam optimizer, train.eps (1e-8, torch's default), grad_clip_per_tensor, the *_bert schedules,
#: decay_rule and the captioning loss_reduction: AdamW and the kit's rules as before at cpu and smoke, theirs at paper;
#: nor for the loop's select_after_step, 0 (every evaluation selectable, as before) unless a config names it: only
#: the birds fine-tuning at paper, 2000 as the authors; nor for the loop's improve_on_tie, false (a strictly higher
#: score, as before) unless a config names it, nor for CLIP4IDC captioning's freeze list and caption_max_len, empty
#: and null (max_len) as before at cpu and smoke: only paper sets the three, as the authors; nor for the package's
#: modules moving into folders (issue 48), imports renamed, the same code; nor for issue 49's settings whose
#: defaults are the old behaviour and only paper sets (noam_public, words_kept, mask_random_from, mask_none_chosen,
#: fda_samples, sampling, decode_min_words, decode_cut, gradient_scale, eval_offset, eval_at_end, authors_selection,
#: the _bert schedules' exact warm-up fraction))
#: :func:`training_fingerprint` when the version was last decided on (tests/test_runs.py keeps the two in step)
TRAINING_CODE_FINGERPRINT = "d395520673723ea3"
#: the code a run's result depends on beyond its config: the loop (and its defaults, which are not in a run's key),
#: models, tasks, losses, text, features and the tensors IDC-PCL and DUDA train on
TRAINING_MODULES = ("train/*.py", "experiments/configs/train.json", "models/*.py", "models/clip_configs/*.json",
                    "tasks/*.py", "losses.py", "text/*.py", "data/features.py", "data/images.py")


def training_fingerprint(package: Path | None = None) -> str:
    """SHA-256 (16 hex) over the training modules' syntax trees with docstrings dropped (comments and layout never
    enter a tree), so only code changes move it. ``package``: the ``idckit`` directory (default: this one)."""
    package = package or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted({p for pattern in TRAINING_MODULES for p in package.glob(pattern)}):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            tree = ast.parse(text)
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                        isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
            text = ast.dump(tree)
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


def canonical_json(config: Mapping[str, Any]) -> str:
    try:
        return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a run config must be plain JSON data ({exc})") from exc


def run_key(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:12]


@dataclass
class Run:
    dir: Path
    key: str
    config: dict[str, Any]

    @property
    def metrics_path(self) -> Path:
        return self.dir / "metrics.json"

    def is_complete(self) -> bool:
        return self.metrics_path.is_file()

    def metrics(self) -> dict[str, Any]:
        if not self.is_complete():
            raise ConfigError("this run has not finished (no metrics.json)", path=self.dir,
                              fix="run the notebook or experiment again; it resumes the run")
        try:
            metrics = json.loads(self.metrics_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"this run's metrics.json is unreadable ({e})", path=self.metrics_path,
                              fix="delete metrics.json and run again: the run resumes from its last checkpoint "
                                  "and writes it anew") from e
        if not isinstance(metrics, dict):
            raise ConfigError("this run's metrics.json must hold a JSON object", path=self.metrics_path,
                              fix="delete metrics.json and run again; the run resumes and writes it anew")
        return metrics

    @property
    def record_path(self) -> Path:
        return self.dir / "record.json"

    def record(self) -> dict[str, Any]:
        """Who finished the run (``{}`` for runs finished before records existed)."""
        try:
            rec = json.loads(self.record_path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return {}
        return rec if isinstance(rec, dict) else {}

    @contextmanager
    def exclusive(self) -> Iterator["Run"]:
        """Hold this run for one process while it is checked, trained and scored. A second notebook (two
        JupyterLab tabs, two ``idckit reproduce`` on one runs dir) that needs the same run waits here, then finds it
        finished, instead of training it a second time beside the first and writing the same files.

        An advisory ``flock`` on ``<run>/.lock``, released when the holder exits, however it exits (so a killed
        holder leaves nothing stale). Not taken under torchrun, whose processes train the run together, nor where
        the OS has no ``fcntl`` (Windows)."""
        if fcntl is None or distributed.world() > 1:
            yield self
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def complete(self, metrics: Mapping[str, Any], **about: Any) -> None:
        """Write the record (commit, code version, time, and ``about``: profile, data, ...), then the metrics
        (last: they mark the run finished)."""
        write_json(self.record_path, {"commit": git_commit(), "training_code": TRAINING_CODE_VERSION,
                                      "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                      **about}, indent=1)
        write_json(self.metrics_path, dict(metrics), indent=1)


def open_run(runs_dir: str | Path | None, kind: str, config: Mapping[str, Any]) -> Run:
    """The run directory for ``config`` plus the training code's version (created with its config.json if new)."""
    config = {**config, "training_code": TRAINING_CODE_VERSION}
    key = run_key(config)
    root = check_output_dir(Path(runs_dir) if runs_dir else paths.runs_dir(), "runs_dir")
    run = Run(dir=root / f"{kind}-{key}", key=key, config=json.loads(canonical_json(config)))
    cfg_path = run.dir / "config.json"
    if not cfg_path.is_file():
        write_json(cfg_path, run.config, indent=1, sort_keys=True)
    return run


def final_train_loss(run_dir: str | Path) -> float | None:
    """The training loss a run logged last (its ``log.jsonl``), None before it logged one. Unlike a collapsed
    smoke run's scores, which sit at 0, it moves with any change to what the run computes."""
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue          # a line cut short by a killed run
        if isinstance(entry, dict) and isinstance(entry.get("loss"), (int, float)):
            last = float(entry["loss"])
    return last


def test_captions(run_dir: str | Path) -> dict[str, str]:
    """A finished captioning run's decoded test captions, pair id -> caption (empty if it wrote none)."""
    path = Path(run_dir) / "test" / "total_results.json"
    if not path.is_file():
        return {}
    try:
        return {x["image_id"]: x["caption"] for x in json.loads(path.read_text())}
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError) as e:
        raise ConfigError(f"this run's test captions are unreadable ({type(e).__name__}: {e})", path=path,
                          fix="delete the run's metrics.json and run again: the run resumes from its last checkpoint "
                              "and decodes test anew") from e


def caption_counts(run_dir: str | Path) -> dict[str, int | None]:
    """``{"distinct_test_captions", "test_pairs"}`` of a captioning run (None before it decoded test)."""
    captions = test_captions(run_dir)
    if not captions:
        return {"distinct_test_captions": None, "test_pairs": None}
    return {"distinct_test_captions": len(set(captions.values())), "test_pairs": len(captions)}


#: what every experiment module's ``run_variant(setup, variant, seed)`` returns (each may add its own keys):
#: the row's ``model`` name, the ``recipe`` (:mod:`idckit.experiments.recipes`) with its ``variant`` and ``label``,
#: the ``seed``, the ``run`` (directory name under the runs dir) and its ``run_dir``, ``val`` / ``test`` scores
#: (``test``: subset -> metric, pycocoevalcap's scale), ``best_step``, ``history``, ``wall_seconds`` (the run and the
#: stages it trained), ``train_seconds`` (its own training), ``distinct_test_captions`` / ``test_pairs``, and
#: ``judge_accuracy`` (test, None for a model without a distractor judge)
RESULT_KEYS = ("model", "recipe", "variant", "label", "seed", "run", "run_dir", "val", "test", "best_step",
               "history", "wall_seconds", "train_seconds", "distinct_test_captions", "test_pairs", "judge_accuracy")


def variant_result(model: str, recipe, seed: int, run: Run, *, train_seconds: str, **extra: Any) -> dict[str, Any]:
    """The result of a finished run of ``recipe`` (:data:`RESULT_KEYS`, then ``extra``, then the rest of its
    metrics.json). ``train_seconds`` names the metrics.json entry with the run's own training time."""
    metrics = run.metrics()
    return {"model": model, "recipe": recipe.name, "variant": recipe.variant, "label": recipe.label, "seed": seed,
            "run": run.dir.name, "run_dir": str(run.dir), **extra, **metrics,
            "train_seconds": metrics.get(train_seconds), "judge_accuracy": metrics.get("judge_accuracy"),
            **caption_counts(run.dir)}


def hard_twin_runs(s, setup, runs, variants: Sequence[str], seeds: Sequence[int], *, progress: bool = True):
    """``runs(h, variants, seeds)`` on the hard twin ``h`` of a synthetic setup ``s`` (CLEVR-Change's own jitter;
    same profile, backbone, device and run cache, built by the calling model's ``setup``), each row labelled
    "[hard data]" and carrying the twin's data description: the hard rows of tables 2 and 3. (None, []) on real
    data or when the profile's default already is the faithful jitter."""
    if not s.data.synthetic or data.synth_settings(s.profile, hard=True) == data.synth_settings(s.profile):
        return None, []
    h = setup(s.profile, runs_dir=s.runs_dir, backbone=s.store.meta["backbone"], hard=True, progress=progress,
              device=s.device)
    results = runs(h, variants, seeds, progress=progress)
    for r in results:
        r["label"] = f"{r['label']} [hard data]"
        r["data"] = h.data.description
    return h, results
