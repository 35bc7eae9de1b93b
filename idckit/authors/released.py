"""The authors' released checkpoints as side rows of the tables: "the evaluation agrees" apart from "the training
agrees".

A table notebook given ``released_checkpoint`` (IDC-PCL tables 2-4), ``released_caption_checkpoint`` (CLIP4IDC
tables 1 and 2) or ``released_adapt_checkpoint`` (CLIP4IDC table 6) shows, beside the kit's own training, a row
:data:`LABEL`: the authors' weights, imported (:mod:`idckit.authors.convert`) unless the path already is an
imported run directory, decoded on the notebook's test split by the kit's decoding and scored by its one evaluator
(:func:`idckit.eval.captions.evaluate_pairs`; retrieval :func:`idckit.eval.retrieval.retrieval_metrics` through
the adaptation task). Where the released row matches the paper and the kit's own row does not, the training
differs, not the scoring. Which notebook takes which parameter (and its ``idckit reproduce`` option and Makefile
variable): :data:`idckit.registry.RELEASED`.

The rows carry no seed: they are not runs of the kit, so :mod:`idckit.reports.status` never reads them for a
report's status, and no headline names them. The scoring is cached like a run (``runs/released-*-<key>/``, keyed by
the checkpoint's SHA-256 and the data and features), so tables 2, 3 and 4 decode the test split once.

Features: the IDC-PCL checkpoints read the authors' ResNet-101 7x7 grid, whose extraction code is not public; the
kit's ``paper`` profile extracts torchvision's ImageNet ResNet-101 grid, the closest it can compute, and the row
says which features it was scored on.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from idckit import fileio
from idckit.authors.convert import import_checkpoint
from idckit.device import resolve
from idckit.errors import ConfigError
from idckit.eval.captions import evaluate_pairs, write_results
from idckit.experiments import pcl, yardsticks
from idckit.experiments.config import load_config, model_config
from idckit.experiments.runs import caption_counts, open_run
from idckit.models.decoding import greedy_decode
from idckit.tasks.pcl import predict
from idckit.text.vocab import Vocab

#: the variant column of every released row
LABEL = "authors' released checkpoint, scored by idckit"
#: the model column of every released row
MODEL = "authors' released checkpoint"


# -- the checkpoint as an imported run -------------------------------------------------------------------------
def imported_run(checkpoint: str | Path, kind: str, runs_dir: Path, *, vocab: str | Path | None = None) -> Path:
    """The run directory of ``checkpoint``: itself when it is a run written by ``idckit import-checkpoint --from
    kind``, else the authors' file imported once into ``runs_dir/imported-<kind>-<sha>/`` (IDC-PCL needs their
    ``dict.json``: ``vocab``, default the file beside the checkpoint)."""
    path = Path(checkpoint)
    if path.is_dir():
        info = path / "import.json"
        if not info.is_file():
            raise ConfigError("not an imported checkpoint: the directory has no import.json", path=path,
                              fix=f"pass the authors' file, or a directory written by idckit import-checkpoint "
                                  f"--from {kind}")
        got = json.loads(info.read_text(encoding="utf-8")).get("kind")
        if got != kind:
            raise ConfigError(f"this run was imported --from {got}, this table needs --from {kind}", path=path,
                              fix=f"pass a checkpoint of the {kind} kind")
        return path
    if not path.is_file():
        raise ConfigError("the released checkpoint does not exist", path=path,
                          fix=f"pass the authors' file or a run directory written by idckit import-checkpoint "
                              f"--from {kind}")
    options: dict[str, Any] = {}
    if kind == "idc-pcl":
        vocab = Path(vocab) if vocab else path.parent / "dict.json"
        if not vocab.is_file():
            raise ConfigError("an IDC-PCL checkpoint needs the vocabulary it was trained with", path=vocab,
                              fix="put the authors' dict.json beside the checkpoint, or import it first: idckit "
                                  "import-checkpoint --from idc-pcl CKPT --vocab dict.json --out runs/NAME, and "
                                  "pass runs/NAME")
        options["vocab"] = vocab
    options.update(_released_settings(kind))
    out = runs_dir / f"imported-{kind}-{fileio.sha256(path)[:12]}"
    if not (out / "import.json").is_file():
        import_checkpoint(kind, path, out, **options)
    return out


def _released_settings(kind: str) -> dict[str, int]:
    """The heads and caption length of the authors' released files, which their weights do not record: the values
    of the authors' configurations the files were trained with (the kit's ``paper`` profile holds them). Only the
    released files are imported with them; ``idckit import-checkpoint`` asks for both."""
    if kind == "idc-pcl":
        paper = load_config("pcl", "paper")
        return {"n_heads": paper["model"]["n_heads"], "max_len": paper["max_len"]}
    if kind == "clip4idc-caption":
        cfg = model_config("clip4idc-paper")
        return {"n_heads": cfg.heads, "max_len": cfg.max_len}
    return {}


def _scored(runs_dir: Path, kind: str, config: Mapping[str, Any], score: Callable[[Path], dict[str, Any]],
            about: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(run, metrics) of a cached scoring: ``score(run_dir)`` once, its metrics kept in the run's metrics.json."""
    run = open_run(runs_dir, kind, {"kind": kind, **config})
    with run.exclusive():
        if not run.is_complete():
            t0 = time.perf_counter()
            metrics = score(run.dir)
            run.complete({**metrics, "wall_seconds": round(time.perf_counter() - t0, 1)}, **about)
    return run, run.metrics()


def _result(run, metrics: Mapping[str, Any], imported: Path) -> dict[str, Any]:
    """A result shaped as a run's (:data:`idckit.experiments.runs.RESULT_KEYS`), but with no seed: its rows are
    side rows (:mod:`idckit.reports.status` counts only rows with a seed)."""
    info = json.loads((imported / "import.json").read_text(encoding="utf-8"))
    return {"model": MODEL, "recipe": None, "variant": "released", "label": LABEL, "seed": None,
            "run": run.dir.name, "run_dir": str(run.dir), **metrics, "checkpoint": info.get("checkpoint"),
            "sha256": info.get("sha256"), "imported": str(imported), **caption_counts(run.dir)}


def _about(s) -> dict[str, Any]:
    return {"profile": s.profile, "data": s.data.description, "data_identity": s.data.identity}


# -- IDC-PCL ---------------------------------------------------------------------------------------------------
def pcl_result(s, checkpoint: str | Path, *, vocab: str | Path | None = None,
               progress: bool = False) -> dict[str, Any]:
    """The released IDC-PCL checkpoint's test result on ``s`` (:func:`idckit.experiments.pcl.setup`): greedy
    captions of every test pair, the distractor judge's accuracy, RCC's breakdown (:func:`evaluate_pairs`)."""
    imported = imported_run(checkpoint, "idc-pcl", s.runs_dir, vocab=vocab)
    sha = json.loads((imported / "import.json").read_text(encoding="utf-8"))["sha256"]
    min_words = s.config["finetune"]["decode_min_words"]       # the profile's decoding, 0 (theirs) at paper
    config = {**s.identity, "checkpoint": sha, "decoding": "greedy", "decode_min_words": min_words}

    def score(out: Path) -> dict[str, Any]:
        model, data = _pcl_model(s, imported)
        preds = predict(model, data, "test", batch_size=s.config["finetune"]["eval_batch_size"], progress=progress,
                        min_words=min_words)
        write_results(out / "test", preds["captions"])
        split = data.splits["test"]
        test = evaluate_pairs(split.references, preds["captions"], dict(zip(split.pair_ids, split.types)))
        return {"test": test, "judge_accuracy": preds["judge_accuracy"], "features": pcl.provenance_fields(s),
                "checkpoint_features": json.loads((imported / "config.json").read_text())["features"]}

    run, metrics = _scored(s.runs_dir, "released-pcl", config, score, _about(s))
    return _result(run, metrics, imported)


def _pcl_model(s, imported: Path):
    """(model on the setup's device in eval mode, the setup's test data with the checkpoint's vocabulary)."""
    data = pcl.loaded_data(s)
    model, _ = pcl.load_run(imported, device=s.device, n_regions=data.features.shape[1])
    if model.cfg.feat_dim != data.feat_dim:
        cfg = json.loads((imported / "config.json").read_text(encoding="utf-8"))
        raise ConfigError(f"the checkpoint reads {model.cfg.feat_dim}-d region features ({cfg.get('features')}), "
                          f"this setup's are {data.feat_dim}-d ({s.store.meta.get('backbone')})", path=imported,
                          fix="score it at PROFILE=paper (ResNet-101 features, backbone=resnet101)")
    # the test pairs are the setup's; only the words and the caption length are the checkpoint's
    return model, dataclasses.replace(data, vocab=Vocab.load(imported / "vocab.json"), max_len=model.cfg.max_text_len)


def pcl_rows(s, checkpoint: str | Path | None, *, per_type: bool = False,
             progress: bool = False) -> list[dict[str, Any]]:
    """The released row of an IDC-PCL table ([] when ``checkpoint`` is None): test total x100 with what the captions
    say and its bootstrap interval (tables 2 and 4), or CIDEr-D per change type (``per_type``: table 3)."""
    if checkpoint is None:
        return []
    result = pcl_result(s, checkpoint, progress=progress)
    return yardsticks.type_rows(s, [result]) if per_type else yardsticks.clevr_rows(s, [result])


# -- CLIP4IDC --------------------------------------------------------------------------------------------------
def _pair_data(s, size: int, max_len: int, progress: bool):
    """The setup's pairs with images at the checkpoint's resolution (cached beside the kit's own image caches)."""
    # local: tasks.clip4idc imports open_clip (~6.5 s at import, torchvision with it); the IDC-PCL tables import
    # this module and never need it. The same holds for every CLIP4IDC import below.
    from idckit.tasks.clip4idc import load_pair_data

    return load_pair_data(s.data.dataset(), size, max_len=max_len, progress=progress,
                          cache_dir=s.runs_dir / "images" / f"{s.data.tag}-{size}px")


def clip4idc_caption_result(s, checkpoint: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """The released CLIP4IDC caption-stage checkpoint's test result on ``s``
    (:func:`idckit.experiments.clip4idc.setup`): greedy captions (at most max_len - 1 BPE tokens after SOT, their
    ``greedy_decode``) of every test pair from both images at the checkpoint's resolution, scored as the kit's
    captioners are (the profile's METEOR setting)."""
    imported = imported_run(checkpoint, "clip4idc-caption", s.runs_dir)
    sha = json.loads((imported / "import.json").read_text(encoding="utf-8"))["sha256"]
    meteor = s.config["caption"]["meteor"]
    min_words = s.config["caption"]["decode_min_words"]        # the profile's decoding, 0 (theirs) at paper
    cut = s.config["caption"]["decode_cut"]                    # "text" (theirs) at paper
    config = {**s.identity, "checkpoint": sha, "decoding": "greedy", "meteor": meteor, "decode_min_words": min_words,
              **({"decode_cut": cut} if cut != "ids" else {})}    # the key only where it is not the kit's

    def score(out: Path) -> dict[str, Any]:
        from idckit.authors.clip4idc import load_imported  # local: open_clip (~6.5 s), see _pair_data
        from idckit.experiments.clip4idc import _final_scorer  # local: the CLIP4IDC side, see _pair_data
        from idckit.tasks.clip4idc import decode_ids  # local: open_clip (~6.5 s), see _pair_data

        cfg = json.loads((imported / "config.json").read_text(encoding="utf-8"))
        dev = resolve(s.device)
        model = load_imported(imported).to(dev)
        data = _pair_data(s, cfg["clip_sizes"]["image_resolution"], cfg["max_len"], progress)
        split = data.splits["test"]
        preds: dict[str, str] = {}
        with torch.inference_mode():
            for idx in torch.arange(len(split)).split(s.config["caption"]["eval_batch_size"]):
                visual = (data.images.batch(split.before[idx], dev), data.images.batch(split.after[idx], dev))
                tokens = greedy_decode(model, visual, cfg["max_len"] - 1, min_words)
                preds.update(zip((split.pair_ids[j] for j in idx.tolist()), decode_ids(tokens.tolist(), cut)))
        write_results(out / "test", preds)
        test = evaluate_pairs(split.references, preds, dict(zip(split.pair_ids, split.types)),
                              scorer=_final_scorer(meteor), meteor=meteor)
        return {"test": test, "judge_accuracy": None, "clip_sizes": cfg["clip_sizes"]}

    run, metrics = _scored(s.runs_dir, "released-clip4idc-caption", config, score, _about(s))
    return _result(run, metrics, imported)


def clip4idc_caption_rows(s, checkpoint: str | Path | None, *, per_type: bool = False,
                          progress: bool = False) -> list[dict[str, Any]]:
    """The released row of CLIP4IDC table 1 (test total x100) or, ``per_type``, table 2; [] without a checkpoint."""
    if checkpoint is None:
        return []
    result = clip4idc_caption_result(s, checkpoint, progress=progress)
    return yardsticks.type_rows(s, [result]) if per_type else yardsticks.clevr_rows(s, [result])


def clip4idc_retrieval_result(s, checkpoint: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """The released CLIP4IDC adaptation checkpoint's test retrieval on ``s``: both directions, the setup's R@K
    (:func:`idckit.experiments.clip4idc.retrieval_ks`), the adaptation task's protocol and metrics."""
    imported = imported_run(checkpoint, "clip4idc-adapt", s.runs_dir)
    sha = json.loads((imported / "import.json").read_text(encoding="utf-8"))["sha256"]
    from idckit.experiments import clip4idc  # local: the CLIP4IDC side, see _pair_data

    ks = clip4idc.retrieval_ks(s)
    config = {**s.identity, "checkpoint": sha, "ks": list(ks), "max_len": s.config["caption"]["max_len"]}

    def score(out: Path) -> dict[str, Any]:
        from idckit.authors.clip4idc import load_imported  # local: open_clip (~6.5 s), see _pair_data
        from idckit.tasks.clip4idc import AdaptTask  # local: open_clip (~6.5 s), see _pair_data

        cfg = json.loads((imported / "config.json").read_text(encoding="utf-8"))
        model = load_imported(imported).to(resolve(s.device))
        data = _pair_data(s, cfg["clip_sizes"]["image_resolution"], s.config["caption"]["max_len"], progress)
        task = AdaptTask(data, cfg.get("clip_model"), None, batch_size=1, clip_lr_scale=1.0, weight_decay=0.0,
                         swap_prob=0.0, freeze_intra=False, freeze_embeddings=False, ks=ks,
                         eval_batch_size=s.config["adapt"]["eval_batch_size"])
        return {"test": task.evaluate(model, "test"), "n_intra": cfg["n_intra"],
                "n_inter": cfg["clip_sizes"]["vision_layers"] - cfg["n_intra"]}

    run, metrics = _scored(s.runs_dir, "released-clip4idc-adapt", config, score, _about(s))
    return _result(run, metrics, imported)


def add_retrieval_rows(table, checkpoint: str | Path | None, *, progress: bool = False) -> list[dict[str, Any]]:
    """Put the released adaptation checkpoint's row into a :class:`idckit.experiments.retrieval_table
    .RetrievalTable` (before its chance row, which stays last); returns the rows added ([] without a checkpoint)."""
    if checkpoint is None:
        return []
    from idckit.experiments import clip4idc  # local: the CLIP4IDC side, see _pair_data

    r = clip4idc_retrieval_result(table.setup, checkpoint, progress=progress)
    row = {"model": MODEL, "variant": f"{LABEL} ({r['n_intra']}/{r['n_inter']})", "split": "test", "run": r["run"],
           "metrics": {k: r["test"][k] for k in clip4idc.retrieval_keys(table.setup)}, "checkpoint": r["checkpoint"]}
    if table.name != "clevr-change":
        row["dataset"] = table.name
    at = len(table.rows) - 1 if table.rows and table.rows[-1].get("model") == "chance" else len(table.rows)
    table.rows.insert(at, row)
    return [row]


__all__ = ["LABEL", "MODEL", "imported_run", "pcl_result", "pcl_rows", "clip4idc_caption_result",
           "clip4idc_caption_rows", "clip4idc_retrieval_result", "add_retrieval_rows"]
