"""``idckit import-checkpoint``: a tiny checkpoint saved with the authors' key names (from the parity recordings)
becomes a run directory whose model computes the recorded logits and greedy tokens; clear errors otherwise."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch

from idckit.cli.caption import _resolve, _run_config
from idckit.authors.convert import CONVERTERS, import_checkpoint
from idckit.cli import main
from idckit.errors import ConfigError
from idckit.models.decoding import greedy_decode
from idckit.models.pcl import PCL, PCLConfig
from idckit.authors.pcl import authors_ids_of_kit, kit_ids_of_authors
from idckit.text.vocab import Vocab
from numeric import assert_close

RECORDINGS = Path(__file__).parent / "parity"


def recording(name: str) -> dict:
    path = RECORDINGS / f"pcl_{name}.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with python -m idckit.authors record (docs/parity.md)")
    return torch.load(path, weights_only=True)


def authors_files(tmp_path: Path, name: str, *, half: bool = False, pretraining: bool = False):
    """(checkpoint, dict.json) as the authors' code writes them: a fine-tuning state_dict, or a pre-training
    {'global_step', 'model_state_dict', 'task_batch_num': defaultdict(int)}."""
    rec = recording(name)
    sd = {k: v.half() if half else v for k, v in rec["state_dict"].items()}
    obj = {"global_step": 7, "model_state_dict": sd, "task_batch_num": collections.defaultdict(int, {"mlm": 5})} \
        if pretraining else sd
    ckpt = tmp_path / f"{name}.pt"
    torch.save(obj, ckpt)
    vocab = tmp_path / "dict.json"
    vocab.write_text(json.dumps(rec["vocab"]))
    return rec, ckpt, vocab


def load_run(run: Path, feat_dim: int, n_regions: int) -> PCL:
    """The run's model, built as ``idckit caption`` builds it (config.json's model section, vocab.json, best.pt)."""
    cfg = _run_config(run)
    vocab = Vocab.load(run / "vocab.json")
    model = PCL(PCLConfig(vocab_size=len(vocab), feat_dim=feat_dim, n_regions=n_regions, max_text_len=cfg["max_len"],
                          **cfg["model"]), vocab)
    model.load_state_dict(torch.load(run / "best.pt", weights_only=True))
    return model.eval()


def test_a_fine_tuning_checkpoint_becomes_a_run_that_computes_the_authors_captions(tmp_path, capsys):
    rec, ckpt, vocab = authors_files(tmp_path, "clver_finetune")
    out = tmp_path / "runs" / "idc-pcl-clevr"
    assert main(["import-checkpoint", "--from", "idc-pcl", str(ckpt), "--out", str(out), "--vocab", str(vocab),
                 "--max-len", str(rec["max_len"]), "--heads", str(rec["sizes"]["heads"])]) == 0
    assert "import.json" in capsys.readouterr().out
    assert _resolve(out, None) == (out, "given by --model")
    info = json.loads((out / "import.json").read_text())
    assert info["stage"] == "fine-tuning" and info["filled_from_seed_0"] == ["mvcl_bias", "mvcl_head.0.bias",
                                                                            "mvcl_head.0.weight", "mvcl_head.2.bias",
                                                                            "mvcl_head.2.weight"]
    assert len(info["sha256"]) == 64
    model = load_run(out, rec["sizes"]["feat"], rec["sizes"]["regions"])
    assert model.cfg.norm == "public" and model.cfg.mvcl_head == "tied"    # the paper profile's switches
    k_of_a, a_of_k = kit_ids_of_authors(rec["vocab"]), authors_ids_of_kit(rec["vocab"])
    with torch.no_grad():
        o = model(rec["f1"], rec["f2"], k_of_a[rec["cap"]], mode="finetune")
        logits = model.mlm_logits(o.text[rec["cap_label"] != -1])[:, k_of_a]
    assert_close(logits, rec["logits"])
    assert_close(model.judge_logits(o), rec["judge_logits"])
    tokens = a_of_k[greedy_decode(model, (rec["f1"], rec["f2"]), rec["max_len"] - 1)]
    eos = rec["vocab"]["<EOS>"]
    cut = lambda rows: [r[:r.index(eos) + 1] if eos in r else r for r in rows]
    assert cut(tokens.tolist()) == cut(rec["greedy"][:, 1:].tolist())


def test_fp16_pretraining_checkpoint_with_its_pickled_counts_loads_safely(tmp_path):
    rec, ckpt, vocab = authors_files(tmp_path, "clver_pretrain", half=True, pretraining=True)
    with pytest.raises(Exception):                                 # what plain weights_only loading does
        torch.load(ckpt, weights_only=True)
    out = tmp_path / "run"
    done = import_checkpoint("idc-pcl", ckpt, out, vocab=vocab, max_len=rec["sizes"]["max_len"],
                             n_heads=rec["sizes"]["heads"])
    assert done["stage"] == "pre-training" and done["global_step"] == 7 and done["filled_from_seed_0"] == []
    assert done["dropped"] == ["pooler.0.bias", "pooler.0.weight", "position_encoding.pe"]
    state = torch.load(out / "best.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())
    model = load_run(out, rec["sizes"]["feat"], rec["sizes"]["regions"])
    k_of_a = kit_ids_of_authors(rec["vocab"])
    mlm = rec["mlm"]
    with torch.no_grad():
        o = model(rec["f1"], rec["f2"], k_of_a[mlm["cap"]], mode="pretrain")
        logits = model.mlm_logits(o.text[mlm["cap_label"] != -1])[:, k_of_a]
    assert_close(logits, mlm["logits"], rtol=3e-3)    # fp16 weights: within their rounding (measured 1.2e-3)


def test_a_birds_checkpoint_keeps_its_nabirds_heads(tmp_path):
    rec, ckpt, vocab = authors_files(tmp_path, "bird_pretrain", pretraining=True)
    done = import_checkpoint("idc-pcl-birds", ckpt, tmp_path / "run", vocab=vocab, n_heads=rec["sizes"]["heads"],
                             max_len=rec["sizes"]["max_len"])
    model = load_run(tmp_path / "run", rec["sizes"]["feat"], rec["sizes"]["regions"])
    assert model.cfg.n_classes == 555 and done["kind"] == "idc-pcl-birds"
    with torch.no_grad():
        _, match, _ = model.fgvc_logits(rec["f1"], rec["f2"])
    assert_close(match, rec["match_logits"])


def test_errors_name_the_problem_and_the_fix(tmp_path, capsys):
    rec, ckpt, vocab = authors_files(tmp_path, "clver_finetune")
    opts = dict(vocab=vocab, n_heads=rec["sizes"]["heads"], max_len=rec["max_len"])
    with pytest.raises(ConfigError, match="(?s)unknown checkpoint kind 'idc'.*idc-pcl"):
        import_checkpoint("idc", ckpt, tmp_path / "a", **opts)
    assert main(["import-checkpoint", "--from", "nope", str(ckpt), "--out", str(tmp_path / "a")]) == 2
    assert "unknown checkpoint kind" in capsys.readouterr().err
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    with pytest.raises(ConfigError, match="not a readable PyTorch checkpoint") as e:
        import_checkpoint("idc-pcl", truncated, tmp_path / "b", **opts)
    assert "download it again" in str(e.value)
    with pytest.raises(ConfigError, match="does not exist"):
        import_checkpoint("idc-pcl", tmp_path / "missing.pt", tmp_path / "b", **opts)
    wrong = dict(rec["state_dict"])
    key = "double_img_encoder.layers.0.feed_forward.w_1.weight"
    wrong[key] = wrong[key][:-1]                                   # the sizes come from the cross-modal layers
    torch.save(wrong, tmp_path / "wrong.pt")
    fit = r"(?s)does not fit.*pair.0.ffn.0.weight: checkpoint \(63, 32\), model \(64, 32\)"
    with pytest.raises(ConfigError, match=fit):
        import_checkpoint("idc-pcl", tmp_path / "wrong.pt", tmp_path / "c", **opts)
    torch.save({"visual.conv1.weight": torch.zeros(2, 3)}, tmp_path / "clip.pt")
    with pytest.raises(ConfigError, match="not an IDC-PCL checkpoint"):
        import_checkpoint("idc-pcl", tmp_path / "clip.pt", tmp_path / "d", **opts)
    _, birds, _ = authors_files(tmp_path, "bird_pretrain")
    with pytest.raises(ConfigError, match="bird/ checkpoint") as e:
        import_checkpoint("idc-pcl", birds, tmp_path / "e", **opts)
    assert "idc-pcl-birds" in e.value.fix
    with pytest.raises(ConfigError, match="clver/ fine-tuning checkpoint"):
        import_checkpoint("idc-pcl-birds", ckpt, tmp_path / "e", **opts)
    with pytest.raises(ConfigError, match="needs the vocabulary"):
        import_checkpoint("idc-pcl", ckpt, tmp_path / "f", n_heads=2)
    assert not any((tmp_path / n).exists() for n in "abcdef")            # nothing written on an error
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="did not write"):
        import_checkpoint("idc-pcl", ckpt, tmp_path / "g", **opts)
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["notes.txt"]


def test_the_registry_names_importable_converters():
    from idckit.authors.convert import converter
    assert {"idc-pcl", "idc-pcl-birds"} <= set(CONVERTERS)
    for kind in CONVERTERS:
        assert callable(converter(kind))
