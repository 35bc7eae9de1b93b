"""Parity with the authors' CLIP4IDC: their recorded outputs (tests/parity/clip4idc_*.pt, made by
``python -m idckit.authors record --clip4idc CHECKOUT``) against the kit's modules on their converted weights.

fp32 outputs must agree to 1e-5 of their scale (tests/numeric.py), decoded tokens exactly. The recordings store no weights: each parameter is
``parameter_value(seed, name, shape)``, recomputed here from the recorded key table."""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest
import torch

from idckit.experiments.config import load_config, model_config
from idckit.losses import clip_logits, mlm_loss, symmetric_infonce
from idckit.models.clip4idc import CLIP4IDCCaptioner, CLIP4IDCRetrieval, tokenize_captions
from idckit.models.decoding import greedy_decode
from idckit.authors import clip4idc as parity
from numeric import assert_close, assert_differ

RECORDINGS = Path(__file__).parent / "parity"
RTOL = 1e-5          # of the output's scale: float32 rounding through the network is ~1e-6 of it on any BLAS
FP16_RTOL = 3e-3     # fp16 weights: a few of fp16's 4.9e-4 half-ulps (measured 9.4e-4 of the scale)


@functools.lru_cache(maxsize=None)
def recording(name: str) -> dict:
    path = RECORDINGS / f"clip4idc_{name}.pt"
    if not path.is_file():
        pytest.fail(f"missing parity recording {path}: re-record with `python -m idckit.authors record --clip4idc "
                    "CHECKOUT --out tests/parity/` (a checkout of sushizixin/CLIP4IDC) and commit it")
    return torch.load(path, map_location="cpu", weights_only=True)


@functools.lru_cache(maxsize=None)
def their_state(name: str) -> dict[str, torch.Tensor]:
    rec = recording(name)
    return parity.authors_state(rec["spec"], rec["meta"]["seed"])


def close(ours: torch.Tensor, theirs: torch.Tensor, rtol: float = RTOL) -> None:
    assert_close(ours.float(), theirs.float(), rtol=rtol, what="kit vs authors")


def retrieval(n_intra: int, state: dict[str, torch.Tensor] | None = None) -> CLIP4IDCRetrieval:
    state = their_state("adapt") if state is None else state
    model = CLIP4IDCRetrieval(parity.clip_from_authors_state(state), n_intra=n_intra).eval()
    model.load_state_dict(parity.convert_retrieval(state), strict=True)
    return model


def caption_config(**changes):
    """The paper profile's captioner at the recording's sizes: only sizes (and the split) are overridden."""
    rec = recording("caption")
    sizes = parity.captioner_sizes(their_state("caption"))
    heads = rec["meta"]["decoder_config"]["num_attention_heads"]
    return model_config("clip4idc-paper", **sizes, heads=heads, n_intra=rec["split"], **changes)


def captioner(cfg=None, strict: bool = True) -> CLIP4IDCCaptioner:
    cfg = caption_config() if cfg is None else cfg
    state = their_state("caption")
    model = CLIP4IDCCaptioner(parity.clip_from_authors_state(state), cfg).eval()
    model.load_state_dict(parity.convert_captioner(state, cfg.max_len), strict=strict)
    return model


def teacher_forced(model: CLIP4IDCCaptioner) -> torch.Tensor:
    i = recording("caption")["inputs"]
    with torch.no_grad():
        return model(i["before"], i["after"], i["input_caption_ids"])


def check_logits(summary: dict, theirs: dict) -> None:
    for key in ("columns", "logsumexp", "sketch"):
        close(summary[key], theirs[key])
    assert torch.equal(summary["argmax"], theirs["argmax"])


# ---------------------------------------------------------------------------------------------------------------

def test_recordings_are_small_and_name_their_source():
    files = sorted(RECORDINGS.glob("clip4idc_*.pt"))
    # the optimiser trace's own checks are in tests/test_training_trace_clip4idc.py
    assert [f.name for f in files] == ["clip4idc_adapt.pt", "clip4idc_adapt_trace.pt", "clip4idc_caption.pt",
                                       "clip4idc_caption_trace.pt", "clip4idc_optim_trace.pt"]
    assert sum(f.stat().st_size for f in files if not f.name.endswith("_trace.pt")) < 2_000_000
    assert all(f.stat().st_size < 1_000_000 for f in files)
    for name in ("adapt", "caption"):
        meta = recording(name)["meta"]
        assert re.fullmatch(r"[0-9a-f]{40}", meta["commit"]), meta["commit"]
        assert meta["clip_sizes"]["vocab_size"] == 49408


def test_parameter_values_are_a_function_of_seed_name_and_shape():
    a = parity.parameter_value(0, "clip.visual.proj", (8, 4))
    assert torch.equal(a, parity.parameter_value(0, "clip.visual.proj", (8, 4)))
    assert not torch.equal(a, parity.parameter_value(1, "clip.visual.proj", (8, 4)))
    assert not torch.equal(a, parity.parameter_value(0, "clip.text_projection", (8, 4)))
    gain = parity.parameter_value(0, "clip.visual.ln_pre.weight", (512,))
    assert abs(float(gain.mean()) - 1) < 0.02
    state = their_state("caption")           # tied keys share one parameter's value
    assert torch.equal(state["decoder.embeddings.word_embeddings.weight"], state["clip.token_embedding.weight"])
    assert torch.equal(state["decoder.classifier.cls.predictions.decoder.weight"],
                       state["clip.token_embedding.weight"])


@pytest.mark.parametrize("n_intra", [3, 1])
def test_pair_encoder_text_and_adaptation_loss_match(n_intra):
    rec = recording("adapt")
    theirs, inputs = rec["splits"][n_intra], rec["inputs"]
    model = retrieval(n_intra)
    with torch.no_grad():
        tokens, pair = model.pair_encoder(inputs["before"], inputs["after"])
        text = model.encode_text(inputs["text_ids"])
        logits = clip_logits(text, pair, model.logit_scale)
    close(tokens, theirs["tokens"])
    close(pair, theirs["pair"][:, 0])
    close(text, theirs["text"][:, 0])
    close(logits, theirs["logits"])
    close(symmetric_infonce(logits), theirs["loss"])


def test_the_two_splits_differ():
    """The recordings tell a 3+1 from a 1+3 encoder (so the split test above could fail)."""
    rec = recording("adapt")["splits"]
    assert float((rec[3]["pair"] - rec[1]["pair"]).abs().max()) > 0.1


def test_their_fp16_checkpoint_converts_and_differs_by_precision_only():
    """Their code keeps CLIP's matrices in fp16; a checkpoint of them upcasts exactly, and the kit's fp32 pass on
    the same (fp16-rounded) weights stays within fp16 rounding of theirs: precision, not a different function."""
    rec = recording("adapt")
    half = rec["fp16"]
    state = dict(their_state("adapt"))
    for key in half["keys"]:
        state[key] = state[key].half()
    converted = parity.convert_retrieval(state)
    assert all(v.dtype == torch.float32 for v in converted.values())
    model = retrieval(half["split"], state)
    with torch.no_grad():
        tokens, pair = model.pair_encoder(rec["inputs"]["before"], rec["inputs"]["after"])
        text = model.encode_text(rec["inputs"]["text_ids"])
    close(tokens, half["tokens"], rtol=FP16_RTOL)
    close(pair, half["pair"][:, 0], rtol=FP16_RTOL)
    close(text, half["text"][:, 0], rtol=FP16_RTOL)


def test_tokenization_matches_their_data_loaders():
    rec_a, rec_c = recording("adapt"), recording("caption")
    ids = tokenize_captions(rec_a["meta"]["captions"], rec_a["meta"]["max_words"])
    assert torch.equal(ids, rec_a["inputs"]["text_ids"])                     # retrieval: SOT words EOT 0...
    keep = rec_c["inputs"]["decoder_mask"].bool()
    assert torch.equal(ids[:, :-1][keep[:, :-1]], rec_c["inputs"]["input_caption_ids"][:, :-1][keep[:, :-1]])
    assert torch.equal(ids[:, 1:], rec_c["inputs"]["output_caption_ids"][:, :-1])


def test_captioner_teacher_forcing_and_loss_match():
    rec = recording("caption")
    model = captioner()
    i, o = rec["inputs"], rec["outputs"]
    with torch.no_grad():
        close(model.pair_encoder(i["before"], i["after"])[0], o["pair_tokens"])
    logits = teacher_forced(model)
    check_logits(parity.summarise_logits(logits, i["decoder_mask"].bool()), o["logits"])
    target = i["output_caption_ids"].masked_fill(i["output_caption_ids"] == 0, -100)
    close(mlm_loss(logits, target), o["loss"])


def test_logits_at_padding_differ_and_nothing_reads_them():
    """Their decoder also masks padded keys, so only the rows of padded inputs (which no loss or decoding reads;
    the kit's causal mask already hides padding from every real token) come out different."""
    rec = recording("caption")
    mask = rec["inputs"]["decoder_mask"].bool()
    assert (~mask).any() and not (rec["inputs"]["output_caption_ids"][~mask] != 0).any()
    ours = parity.summarise_logits(teacher_forced(captioner()), ~mask)
    assert_differ(ours["columns"], rec["outputs"]["logits_at_padding"]["columns"], rtol=1e-3)


def test_greedy_decoding_matches_token_for_token():
    rec = recording("caption")
    i, theirs = rec["inputs"], rec["outputs"]["greedy"]
    ours = greedy_decode(captioner(), (i["before"], i["after"]), theirs.shape[1])
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


# --- the paper profile and the switches -------------------------------------------------------------------------

def test_paper_profile_is_the_authors_function():
    """clip4idc-paper through the model factory, only its sizes set to the recording's: the captioner computes
    their logits and tokens; the adaptation profile freezes what their freeze logic freezes."""
    cfg = caption_config()
    paper = model_config("clip4idc-paper")
    assert dataclasses.replace(cfg, hidden=paper.hidden, heads=paper.heads, ffn=paper.ffn,
                               enc_layers=paper.enc_layers, dec_layers=paper.dec_layers, n_intra=paper.n_intra) \
        == paper
    assert paper.freeze_clip_embeddings and paper.tie_clip_embeddings and paper.cross_attention == "layerwise"
    assert not paper.use_segment_embedding and not paper.difference_tokens
    model = captioner(cfg)
    rec = recording("caption")
    check_logits(parity.summarise_logits(teacher_forced(model), rec["inputs"]["decoder_mask"].bool()),
                 rec["outputs"]["logits"])
    i = rec["inputs"]
    assert torch.equal(greedy_decode(model, (i["before"], i["after"]), 32), rec["outputs"]["greedy"])
    assert load_config("clip4idc_adapt", "paper")["freeze_embeddings"] is True


@pytest.mark.parametrize("profile", ["cpu", "smoke"])
def test_small_profiles_keep_training_the_embeddings(profile):
    assert model_config(f"clip4idc-{profile}").freeze_clip_embeddings is False


def test_freeze_clip_embeddings_fixes_exactly_the_tied_tables():
    on, off = captioner(caption_config(freeze_clip_embeddings=True)), \
        captioner(caption_config(freeze_clip_embeddings=False))
    tied = {"word_embedding.weight", "position_embedding.weight"}
    assert {n for n, p in on.named_parameters() if not p.requires_grad} == tied
    assert all(p.requires_grad for p in off.parameters())
    assert torch.equal(teacher_forced(on), teacher_forced(off))           # the same function; training differs
    names = {id(p): n for n, p in on.named_parameters()}
    caption = {names[id(p)] for p in on.param_groups(1e-7, 1e-4)[1]["params"]}
    assert caption == {n for n, _ in off.named_parameters() if not n.startswith("pair_encoder.")} - tied
    i = recording("caption")["inputs"]
    on.train()
    on(i["before"], i["after"], i["input_caption_ids"]).logsumexp(-1).mean().backward()
    assert on.word_embedding.weight.grad is None and on.position_embedding.weight.grad is None
    assert on.head_bias.grad is not None and on.pair_encoder.ln_mid.weight.grad is not None
    with pytest.raises(ValueError, match="tie_clip_embeddings"):
        CLIP4IDCCaptioner(parity.clip_from_authors_state(their_state("caption")),
                          caption_config(tie_clip_embeddings=False))


@pytest.mark.parametrize("change", [{"cross_attention": "last"}, {"segment_embedding": True},
                                    {"difference_tokens": True}])
def test_the_kits_other_captioner_switches_leave_the_authors_function(change):
    """Each option the public code does not have changes the recorded logits (so a profile that turned one on
    could not pass for the paper's)."""
    torch.manual_seed(0)
    model = captioner(caption_config(**change), strict=False)
    rec = recording("caption")
    ours = parity.summarise_logits(teacher_forced(model), rec["inputs"]["decoder_mask"].bool())
    assert_differ(ours["columns"], rec["outputs"]["logits"]["columns"], rtol=100 * RTOL)


# --- converters -------------------------------------------------------------------------------------------------

def test_converters_reject_the_wrong_stage_and_foreign_dicts():
    adapt = their_state("adapt")
    with pytest.raises(KeyError, match="caption-stage"):
        parity.convert_captioner(adapt, 32)
    with pytest.raises(KeyError, match="missing"):
        parity.clip_sizes({"decoder.embeddings.LayerNorm.weight": torch.ones(4)})
    with pytest.raises(ValueError, match="position rows"):
        parity.convert_captioner(their_state("caption"), 100)


def test_converters_accept_ddp_prefixed_keys():
    state = {"module." + k: v for k, v in their_state("adapt").items()}
    assert parity.convert_retrieval(state).keys() == parity.convert_retrieval(their_state("adapt")).keys()


# --- their checkpoint files -------------------------------------------------------------------------------------

def _write(path: Path, state: dict[str, torch.Tensor]) -> Path:
    torch.save(state, path)                   # as their save_model writes it: model.state_dict(), no wrapper
    return path


def test_a_caption_checkpoint_file_imports_to_their_function(tmp_path):
    rec = recording("caption")
    ckpt = _write(tmp_path / "pytorch_model.bin.19", their_state("caption"))
    heads = rec["meta"]["decoder_config"]["num_attention_heads"]
    model = parity.captioner_from_checkpoint(parity.read_checkpoint(ckpt), n_intra=rec["split"], heads=heads)
    assert model.cfg.freeze_clip_embeddings                                  # the paper profile's switches
    check_logits(parity.summarise_logits(teacher_forced(model), rec["inputs"]["decoder_mask"].bool()),
                 rec["outputs"]["logits"])
    i = rec["inputs"]
    assert torch.equal(greedy_decode(model, (i["before"], i["after"]), 32), rec["outputs"]["greedy"])


def test_an_fp16_adaptation_checkpoint_imports(tmp_path):
    rec = recording("adapt")
    half = rec["fp16"]
    state = dict(their_state("adapt"))
    for key in half["keys"]:
        state[key] = state[key].half()
    ckpt = _write(tmp_path / "pytorch_model.bin.clevr", {"state_dict": state})   # a wrapper is unwrapped too
    loaded = parity.read_checkpoint(ckpt)
    assert all(v.dtype == torch.float32 for v in loaded.values())
    assert parity.default_n_intra(loaded) == 3                                  # 3/4 of 4 layers, as 9 of 12
    model = parity.retrieval_from_checkpoint(loaded, n_intra=half["split"])
    with torch.no_grad():
        pair = model.encode_pair(rec["inputs"]["before"], rec["inputs"]["after"])
    close(pair, half["pair"][:, 0], rtol=FP16_RTOL)


def test_checkpoint_errors_say_what_is_wrong(tmp_path):
    from idckit.errors import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        parity.read_checkpoint(tmp_path / "missing.bin")
    whole = _write(tmp_path / "whole.bin", their_state("adapt")).read_bytes()
    (tmp_path / "cut.bin").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match="not a readable PyTorch state dict"):
        parity.read_checkpoint(tmp_path / "cut.bin")
    torch.save({"epoch": 3}, tmp_path / "foreign.bin")
    with pytest.raises(ConfigError, match="no state dict"):
        parity.read_checkpoint(tmp_path / "foreign.bin")
    adapt = parity.read_checkpoint(tmp_path / "whole.bin")
    with pytest.raises(ConfigError, match="--from clip4idc-adapt"):
        parity.captioner_from_checkpoint(adapt)
    wrong = dict(adapt, **{"clip.visual.ln_mid.weight": torch.ones(3)})
    with pytest.raises(ConfigError, match="ln_mid"):
        parity.retrieval_from_checkpoint(wrong)


# --- idckit import-checkpoint --from clip4idc-adapt|clip4idc-caption --------------------------------------------

def test_import_checkpoint_writes_a_caption_run_that_computes_their_function(tmp_path):
    import json

    from idckit.cli import main

    rec = recording("caption")
    state = dict(their_state("caption"))
    for key in recording("adapt")["fp16"]["keys"]:       # their CLIP matrices are fp16 in a saved checkpoint
        state[key] = state[key].half()
    ckpt = _write(tmp_path / "pytorch_model.bin.19", state)
    heads = rec["meta"]["decoder_config"]["num_attention_heads"]
    out = tmp_path / "runs" / "clip4idc-released"
    assert main(["import-checkpoint", "--from", "clip4idc-caption", str(ckpt), "--out", str(out),
                 "--heads", str(heads), "--max-len", str(parity.MAX_WORDS)]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(parity.RUN_FILES)
    record = json.loads((out / "import.json").read_text())
    assert record["precision"] == "fp16 tensors upcast to fp32" and record["n_intra"] == 3
    assert record["dropped"] and all(k.startswith("clip.") and not k.startswith("clip.visual.")
                                     for k in record["dropped"])              # CLIP's text tower only
    config = json.loads((out / "config.json").read_text())
    assert config["captioner"]["freeze_clip_embeddings"] and config["clip_model"] is None   # tiny, not ViT-B/32
    model = parity.load_imported(out)
    fp32 = parity.captioner_from_checkpoint(parity.read_checkpoint(ckpt), 3, heads=heads)
    assert torch.equal(teacher_forced(model), teacher_forced(fp32))


def test_import_checkpoint_adaptation_run_feeds_a_kit_captioner(tmp_path):
    from idckit.authors.convert import import_checkpoint

    ckpt = _write(tmp_path / "pytorch_model.bin.clevr", their_state("adapt"))
    done = import_checkpoint("clip4idc-adapt", ckpt, tmp_path / "adapt", n_intra=1)
    assert done["stage"] == "adaptation" and done["dropped"] == [] and done["n_intra"] == 1
    model = parity.load_imported(tmp_path / "adapt")
    rec = recording("adapt")
    with torch.no_grad():
        close(model.encode_pair(rec["inputs"]["before"], rec["inputs"]["after"]), rec["splits"][1]["pair"][:, 0])
    best = torch.load(tmp_path / "adapt" / "best.pt", weights_only=True)      # what CaptionTask's init_from reads
    assert any(k.startswith("pair_encoder.") for k in best)


def test_import_checkpoint_refuses_wrong_kinds_and_options(tmp_path):
    from idckit.authors.convert import import_checkpoint
    from idckit.errors import ConfigError

    adapt = _write(tmp_path / "adapt.bin", their_state("adapt"))
    with pytest.raises(ConfigError, match="--from clip4idc-adapt"):
        import_checkpoint("clip4idc-caption", adapt, tmp_path / "a")
    with pytest.raises(ConfigError, match="--vocab is for IDC-PCL"):
        import_checkpoint("clip4idc-adapt", adapt, tmp_path / "b", vocab=tmp_path / "dict.json")
    with pytest.raises(ConfigError, match="caption model"):
        import_checkpoint("clip4idc-adapt", adapt, tmp_path / "c", n_heads=8)
    assert not any((tmp_path / d).exists() for d in "abc")                    # nothing written on refusal
