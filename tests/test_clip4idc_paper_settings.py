"""CLIP4IDC's caption stage at `paper` against the authors' training scripts (sushizixin/CLIP4IDC at
ca4946138824d03ff17033cb7ff49b2e65e74d23): the caption length, the freeze list and the tie rule of selection.

Each rule below is read from their code and recorded as data (names and numbers, not their code)."""
from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments import clip4idc as experiment
from idckit.experiments.config import load_config, train_config
from idckit.models.clip4idc import tokenize_captions
from idckit.authors import clip4idc as parity
from idckit.tasks.clip4idc import CaptionTask, freeze_named, with_text_length
from idckit.train.loop import fit
from test_clip_tasks import MODEL          # the pairs and clip_file fixtures: conftest

RECORDING = Path(__file__).parent / "parity" / "clip4idc_caption.pt"
SIZES = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1}
TASK = {"batch_size": 2, "captions_per_pair": 1, "visual_lr_scale": 1e-3, "trim_vocab": True, "eval_batch_size": 8}

#: their caption stage, --max_words 32 (scripts/caption_clevr.sh:17): a caption keeps max_words - 1 words
#: (dataloaders/dataloader_clevr_caption.py:150-156), the decoder reads SOT + those words and greedy decoding runs
#: max_words steps (main_task_caption.py:548)
THEIR_MAX_WORDS = 32

#: their caption-stage freeze rule (main_task_caption.py:644-667, --freeze_layer_num 0 in scripts/caption_clevr.sh:21,
#: datatype clevr): of the parameters under ``clip.``, those whose name after ``clip.`` starts with one of these
#: train, every resblock of either tower trains (layer >= 0); every other ``clip.`` parameter is frozen. Parameters
#: outside ``clip.`` (their decoder) all train; the decoder's word/position tables and output matrix ARE CLIP's
#: token and position embeddings (one parameter each, modules/modeling.py:182-195), so they are frozen too.
THEIR_TRAINED_IN_CLIP = ("ln_final.", "text_projection", "logit_scale", "visual.ln_post.", "visual.proj",
                         "visual.bef_embedding", "visual.aft_embedding", "visual.joint_positional_embedding",
                         "visual.ln_mid", "visual.transformer.resblocks.", "transformer.resblocks.")


def their_frozen(name: str) -> bool:
    if not name.startswith("clip."):
        return False
    return not name[len("clip."):].startswith(THEIR_TRAINED_IN_CLIP)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def paper_task(data, clip_file, profile: str = "paper") -> CaptionTask:
    """The caption task as experiments.clip4idc builds it from ``profile``'s config, at the small sizes."""
    c = load_config("clip4idc_caption", profile)
    return CaptionTask(data, MODEL, clip_file, {**c["captioner"], **SIZES, "dropout": 0.0}, **TASK,
                       decay_rule=c["decay_rule"], weight_decay=c["train"]["weight_decay"],
                       loss_reduction=c["loss_reduction"], freeze=c["freeze"])


# -- caption length ------------------------------------------------------------------------------------------------

def test_paper_captions_keep_their_words_and_decode_their_steps(pairs, clip_file):
    c = {p: load_config("clip4idc_caption", p) for p in ("smoke", "cpu", "paper")}
    assert c["smoke"]["caption_max_len"] is None and c["cpu"]["caption_max_len"] is None   # = max_len, unchanged
    n = c["paper"]["caption_max_len"]
    assert c["paper"]["max_len"] == 32          # the adaptation's text length stays theirs (retrieval: 30 words)
    long = " ".join(["cube"] * 40)                              # one BPE token per word
    ids = tokenize_captions([long], n)[0]
    words = ids[1:(ids == ids.max()).nonzero()[0, 0]]          # between SOT and EOT (EOT: CLIP's largest id)
    assert len(words) == THEIR_MAX_WORDS - 1
    data = with_text_length(pairs, n)
    assert data.images is pairs.images                          # the images are shared, not decoded again
    for name, split in data.splits.items():
        texts = [t for pid in split.pair_ids for t in split.references[pid]]
        assert torch.equal(split.sample_ids, tokenize_captions(texts, n))
        assert torch.equal(split.sample_pair, pairs.splits[name].sample_pair)
    task = paper_task(data, clip_file)
    assert task.cfg.max_len - 1 == THEIR_MAX_WORDS              # decoder input / greedy steps: their max_words
    with pytest.raises(ConfigError, match="caption length"):
        with_text_length(pairs, 2)


def test_the_caption_stage_reads_its_own_length(pairs, monkeypatch):
    monkeypatch.setattr(experiment, "loaded_data", lambda s: pairs)
    config = {"caption": {"caption_max_len": None}, "clip": {"model": "idckit-standin-ViT-T-16"}}
    s = types.SimpleNamespace(config=config, data=types.SimpleNamespace(root="r"))
    assert experiment.caption_data(s) is pairs
    s.config["caption"]["caption_max_len"] = 33
    assert experiment.caption_data(s).max_len == 33


# -- freezing ------------------------------------------------------------------------------------------------------

def _layerless(name: str) -> str:
    return re.sub(r"\.\d+\.", ".#.", name)


def test_paper_captioning_freezes_exactly_what_theirs_freezes(pairs, clip_file):
    spec = torch.load(RECORDING, weights_only=True)["spec"]
    params = {param: shape for param, shape in spec.values()}       # their named_parameters (tied: once)
    assert sorted(n for n in params if their_frozen(n)) == sorted([
        "clip.visual.conv1.weight", "clip.visual.class_embedding", "clip.visual.positional_embedding",
        "clip.visual.ln_pre.weight", "clip.visual.ln_pre.bias", "clip.token_embedding.weight",
        "clip.positional_embedding"])
    # their parameter behind each of the kit's names: each parameter filled with its own number, then converted
    number = {param: float(i) for i, param in enumerate(params)}
    state = {key: torch.full(shape, number[param]) for key, (param, shape) in spec.items()}
    by_number = {v: k for k, v in number.items()}
    theirs = {kit: by_number[float(t.flatten()[0])] for kit, t in parity.convert_captioner(state, 32).items()}
    expected = {}
    for kit, their in theirs.items():
        expected.setdefault(_layerless(kit), set()).add(their_frozen(their))
    assert all(len(v) == 1 for v in expected.values()), expected

    model = paper_task(pairs, clip_file).build_model()
    seen = {}
    for name, p in model.named_parameters():
        key = _layerless(name)
        assert key in expected, f"{name}: the kit's paper captioner has a parameter their model has not"
        seen[name] = (not p.requires_grad, expected[key] == {True})
    wrong = {n: v for n, v in seen.items() if v[0] != v[1]}
    assert not wrong, f"(kit frozen, theirs frozen) differ: {wrong}"
    assert any(v[0] for v in seen.values()) and any(not v[0] for v in seen.values())
    # the pair encoder trains (at coef_lr) in their caption stage, beyond the embeddings
    assert model.pair_encoder.visual.transformer.resblocks[0].mlp.c_fc.weight.requires_grad


def test_cpu_and_smoke_freeze_nothing_new(pairs, clip_file):
    for profile in ("smoke", "cpu"):
        assert load_config("clip4idc_caption", profile)["freeze"] == []
    model = paper_task(pairs, clip_file, "cpu").build_model()
    assert model.word_embedding.weight.requires_grad               # cpu's freeze_clip_embeddings is off


def test_a_freeze_entry_naming_nothing_is_refused(pairs, clip_file):
    model = paper_task(pairs, clip_file, "cpu").build_model()
    with pytest.raises(ConfigError, match="pair_encoder.visual.conv"):
        freeze_named(model, ["pair_encoder.visual.conv"], "test")      # a prefix of a name, not a module
    with pytest.raises(ConfigError, match="list"):
        freeze_named(model, "word_embedding", "test")


# -- selection: a tie counts as a gain ---------------------------------------------------------------------------

class ScriptedScores:
    """A one-weight model whose val scores are scripted, to see which evaluation the loop keeps."""

    selection_metric = "score"

    def __init__(self, scores):
        self.scores, self.evals = list(scores), 0

    def build_model(self):
        return torch.nn.Linear(1, 1)

    def param_groups(self, model):
        return [{"params": model.parameters()}]

    def batches(self, epoch, generator):
        yield from range(4)

    def train_step(self, model, batch, step):
        return model(torch.ones(1, 1)).sum(), {}

    def evaluate(self, model, split="val"):
        self.evals += 1
        return {"score": self.scores[self.evals - 1]}


def test_paper_selection_takes_a_tie_as_a_gain(tmp_path):
    # their `if best_score <= CIDEr` (main_task_caption.py:744) and `if best_score <= R1` (main_task_retrieval.py:558):
    # an equal score replaces the kept checkpoint and resets the early-stop count
    ties = {stage: load_config(stage, "paper")["train"]["improve_on_tie"] for stage in ("clip4idc_caption",
                                                                                        "clip4idc_adapt")}
    assert ties == {"clip4idc_caption": True, "clip4idc_adapt": True}
    for profile in ("smoke", "cpu"):
        for stage in ("clip4idc_caption", "clip4idc_adapt"):
            assert train_config(load_config(stage, profile)["train"]).improve_on_tie is False
    scores = [0.5, 0.5, 0.4, 0.5, 0.4, 0.4]              # evaluations at steps 1..6, patience 2
    run = lambda tie, name: fit(ScriptedScores(scores), train_config(dict(  # noqa: E731
        max_steps=6, lr=0.0, eval_every=1, patience=2, improve_on_tie=tie)), tmp_path / name, progress=False)
    theirs, strict = run(True, "theirs"), run(False, "strict")
    assert (theirs.best_step, theirs.stopped, theirs.steps) == (4, "early_stop", 6)
    assert (strict.best_step, strict.stopped, strict.steps) == (1, "early_stop", 3)
    with pytest.raises(ConfigError, match="improve_on_tie"):
        train_config(dict(max_steps=6, lr=0.0, improve_on_tie=1))
