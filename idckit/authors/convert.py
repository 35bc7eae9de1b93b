"""``idckit import-checkpoint --from KIND CKPT --out runs/NAME``: an authors' released checkpoint as a kit run.

:data:`CONVERTERS` maps each kind to the function (``"module:function"``) that reads that kind's checkpoint and
writes the run directory; each is called as ``convert(checkpoint, out, force=..., **options)`` and returns a
summary dict. The IDC-PCL kinds (``idc-pcl``: the ``clver/`` code, ``idc-pcl-birds``: ``bird/``) write what
``idckit caption --model runs/NAME`` and the notebooks read: ``best.pt`` (the kit's state_dict, float32, at the
``paper`` switches, so the model computes what the authors' computes: tests/test_parity_pcl.py), ``vocab.json``,
``config.json`` (the model section) and ``import.json`` (the source file's SHA-256, what was filled or dropped).

Checkpoints are read with ``torch.load(weights_only=True)``: tensors and plain containers only, no code runs. The
public pre-training checkpoints also pickle a ``collections.defaultdict(int)`` of per-task batch counts, which
that loader refuses; it is read as a plain dict (:func:`read_authors_checkpoint`) and never executed.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from idckit import checkpoints, fileio
from idckit.authors.pcl import convert_state_dict, paper_config_fields
from idckit.errors import ConfigError
from idckit.experiments.config import load_config, model_config
from idckit.models.pcl import PCL
from idckit.text.vocab import Vocab

#: kind -> "module:function" of its converter
CONVERTERS: dict[str, str] = {
    "idc-pcl": "idckit.authors.convert:import_idc_pcl",
    "idc-pcl-birds": "idckit.authors.convert:import_idc_pcl_birds",
    "clip4idc-adapt": "idckit.authors.clip4idc:import_adapt",
    "clip4idc-caption": "idckit.authors.clip4idc:import_caption",
}
#: what an imported IDC-PCL run directory holds
RUN_FILES = ("best.pt", "vocab.json", "config.json", "import.json")


def converter(kind: str) -> Callable[..., dict[str, Any]]:
    if kind not in CONVERTERS:
        raise ConfigError(f"unknown checkpoint kind {kind!r}", fix=f"pass --from one of {', '.join(CONVERTERS)}")
    module, _, name = CONVERTERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def import_checkpoint(kind: str, checkpoint: str | Path, out: str | Path, *, force: bool = False,
                      **options: Any) -> dict[str, Any]:
    """Convert ``checkpoint`` of ``kind`` into the run directory ``out``; returns the converter's summary."""
    return converter(kind)(Path(checkpoint), Path(out), force=force, **options)


# -- reading ------------------------------------------------------------------------------------------------------
def _counts(factory=None) -> dict:
    """Stands in for ``collections.defaultdict`` while unpickling: the batch counts come back as a plain dict."""
    return {}


def read_authors_checkpoint(path: str | Path) -> dict[str, Any]:
    """The file's top-level object, loaded safely through the kit's checkpoint gate (:func:`idckit.checkpoints.load`:
    ``weights_only``, declared sizes checked first). Clear errors for a missing, truncated or foreign file."""
    path = Path(path)
    obj = checkpoints.load(path, fix="pass the .pt file the authors released; if it is truncated, download it again",
                           safe_globals=[(_counts, "collections.defaultdict"), int])
    if not isinstance(obj, Mapping):
        raise ConfigError(f"the file holds a {type(obj).__name__}, not a state dict", path=path,
                          fix="pass the authors' checkpoint (a state dict, or their {'model_state_dict': ...})")
    return dict(obj)


def authors_state_dict(obj: Mapping[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """The model weights of an IDC-PCL checkpoint: ``model_state_dict`` of a pre-training checkpoint, or the
    fine-tuning checkpoint itself (a bare state_dict); ``module.`` prefixes (DataParallel) dropped."""
    state = obj.get("model_state_dict", obj)
    tensors = {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if "word_embedding.weight" not in tensors:
        raise ConfigError("not an IDC-PCL checkpoint: it has no 'word_embedding.weight'", path=path,
                          fix="pass a checkpoint written by the public clver/ or bird/ code, or pick the --from "
                              "kind of the model it holds")
    return tensors


# -- IDC-PCL -------------------------------------------------------------------------------------------------------
def import_idc_pcl(checkpoint: Path, out: Path, *, force: bool = False, **options: Any) -> dict[str, Any]:
    """A ``clver/`` (CLEVR-Change) checkpoint, pre-training or fine-tuning."""
    return _import_pcl("pcl", checkpoint, out, force=force, **options)


def import_idc_pcl_birds(checkpoint: Path, out: Path, *, force: bool = False, **options: Any) -> dict[str, Any]:
    """A ``bird/`` checkpoint: the CUB stage, the Birds-to-Words + NABirds stage, or the paragraph model."""
    return _import_pcl("pcl-birds", checkpoint, out, force=force, **options)


def _import_pcl(family: str, checkpoint: Path, out: Path, *, force: bool, vocab: str | Path | None = None,
                max_len: int | None = None, n_heads: int | None = None, n_regions: int | None = None) -> dict:
    kind = "idc-pcl" if family == "pcl" else "idc-pcl-birds"
    claim = fileio.claim_dir(out, "imported-checkpoint", force=force, will_write=RUN_FILES,
                             what="imported checkpoint")
    if vocab is None:
        raise ConfigError(f"--from {kind} needs the vocabulary the checkpoint was trained with",
                          fix="pass --vocab with the authors' dict.json (word -> id), e.g. dataset_clver/dict.json")
    authors_vocab = _read_vocab(Path(vocab))
    obj = read_authors_checkpoint(checkpoint)
    sd = authors_state_dict(obj, checkpoint)
    birds_only = "classifier.0.weight" in sd
    judge = "pooler.0.weight" in sd and sd["pooler.0.weight"].shape[1] == 2 * sd["word_embedding.weight"].shape[1]
    if family == "pcl" and birds_only:
        raise ConfigError("this is a bird/ checkpoint (it has the NABirds heads)", path=checkpoint,
                          fix="pass --from idc-pcl-birds")
    if family == "pcl-birds" and judge:
        raise ConfigError("this is a clver/ fine-tuning checkpoint (it has the distractor judge)", path=checkpoint,
                          fix="pass --from idc-pcl")
    _need_settings(kind, n_heads=n_heads, max_len=max_len)
    try:
        kit_sd, words = convert_state_dict(sd, authors_vocab)
    except ConfigError as e:
        raise ConfigError(str(e).split("\n")[0], path=checkpoint, fix=e.fix) from e
    paper = load_config(family.replace("-", "_"), "paper")
    sizes = {**paper_config_fields(sd), "vocab_size": len(words), "max_text_len": max_len, "n_heads": n_heads,
             "n_regions": n_regions or 49}
    cfg = model_config(f"{family}-paper", **sizes)
    torch.manual_seed(0)            # the MVCL head a fine-tuning model lacks starts here (recorded as filled)
    model = PCL(cfg, Vocab(words))
    own = model.state_dict()
    mvcl = [k for k in own if k.startswith(("mvcl_head.", "mvcl_bias"))] if "feat_regress.bias" not in sd else []
    checkpoints.check_state(kit_sd, own, path=checkpoint, allow_missing=mvcl,
                            fix="pass an unmodified checkpoint of the public code, with the --from kind, --heads "
                                "and --max-len it was trained with")
    model.load_state_dict(kit_sd, strict=False)
    filled = sorted(set(own) - set(kit_sd))
    dropped = sorted(k for k in sd if not k.startswith(("word_embedding", "img_project", "position_encoding.type_pe",
                                                        "position_encoding.layernorm", "single_img_encoder",
                                                        "double_img_encoder", "encoder", "output_layer",
                                                        "feat_regress", "classifier", "aligner"))
                     and not (k.startswith("pooler") and judge))
    model_section = {f: getattr(cfg, f) for f in paper["model"]}     # the paper profile's, sized as the weights
    summary = {"kind": kind, "checkpoint": str(checkpoint), "sha256": fileio.sha256(checkpoint),
               "stage": "pre-training" if "model_state_dict" in obj or "feat_regress.bias" in sd else "fine-tuning",
               "global_step": obj.get("global_step"), "parameters": sum(p.numel() for p in model.parameters()),
               "filled_from_seed_0": filled, "dropped": dropped,
               "features": "the authors' ResNet-101 7x7 grid (2048-d); their extraction code is not public"}
    config = {"kind": "pcl-finetune", "imported_from": kind, "profile": "paper", "features": "resnet101",
              "weights": "ImageNet (torchvision IMAGENET1K_V1)", "feature_size": 224, "max_len": cfg.max_text_len, "model": model_section}
    with claim.staging() as tmp:
        fileio.torch_save(model.state_dict(), tmp / "best.pt")
        Vocab(words).save(tmp / "vocab.json")
        fileio.write_json(tmp / "config.json", config, indent=1)
        fileio.write_json(tmp / "import.json", summary, indent=1)
    return {**summary, "out": str(out)}


def _need_settings(kind: str, *, n_heads: int | None, max_len: int | None) -> None:
    """Heads and the caption length are not in any checkpoint's weights, and another value is another function
    (other logits, other captions): the user says them, the kit never assumes the paper's."""
    missing = [flag for flag, value in (("--heads", n_heads), ("--max-len", max_len)) if value is None]
    if missing:
        raise ConfigError(f"--from {kind} needs {' and '.join(missing)}: the attention heads and the caption length "
                          "are not in the checkpoint's weights, and other values compute another function",
                          fix="pass the values the checkpoint was trained with (the authors' released checkpoints: "
                              "their configuration's num_heads / max_len)")
    for flag, value in (("--heads", n_heads), ("--max-len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value!r}", fix=f"pass {flag} N")


def _read_vocab(path: Path) -> dict[str, int]:
    fix = "pass the authors' dict.json (a JSON object word -> id) that the checkpoint was trained with"
    if not path.is_file():
        raise ConfigError("the vocabulary file does not exist", path=path, fix=fix)
    try:
        words = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"the vocabulary is not JSON ({e})", path=path, fix=fix) from e
    if not isinstance(words, dict) or not all(isinstance(v, int) for v in words.values()):
        raise ConfigError("the vocabulary must map each word to an integer id", path=path, fix=fix)
    return words


