"""CLIP4IDC's training, whole model: the kit at `paper` takes the authors' adaptation and captioning steps.

``tests/parity/clip4idc_{adapt,caption}_trace.pt`` (``python -m idckit.authors record --clip4idc CHECKOUT``,
:mod:`idckit.authors.clip4idc_traces`) hold 20 steps of the authors' own ``main()`` of main_task_retrieval.py and
main_task_caption.py at a tiny size on CPU (their freezing, ``prep_optimizer``, forward, loss and ``train_epoch``,
fp32, one process, no dropout): each step's loss terms, total, each group's lr and the gradient norm, and the
trainable weights after the last step. Here the recorded batches go through the kit's own loop
(:func:`idckit.train.loop.fit`) and its :class:`~idckit.tasks.clip4idc.AdaptTask` /
:class:`~idckit.tasks.clip4idc.CaptionTask` built from the `paper` profile; the seams are a task subclass whose
``batches`` yields the recorded batches and whose CLIP is the traced one, holding the recorded initial weights. The
trace's sizes, dropout 0, its step count, its lr and ``coef_lr`` (large enough that every group's steps move
weights far beyond fp32 rounding) and its one process (``train.gradient_scale`` 1) replace the profile's;
everything else is the profile's. Loss terms and the
gradient norm are read where the kit computes them (wrappers that only observe).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

import idckit.tasks.clip4idc as tasks
from idckit import checkpoints
from idckit.authors import clip4idc as parity
from idckit.data.images import ImageCache
from idckit.experiments.config import load_config, train_config
from idckit.train import distributed
from idckit.train.loop import fit
from numeric import assert_close

PARITY = Path(__file__).parent / "parity"
RTOL = 1e-5
COMMIT = "ca4946138824d03ff17033cb7ff49b2e65e74d23"


def _trace(stage: str) -> dict:
    path = PARITY / f"clip4idc_{stage}_trace.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with python -m idckit.authors record --clip4idc CHECKOUT --out "
                    "tests/parity/ (docs/parity.md)")
    return torch.load(path, weights_only=True)


def _pair_data(rec: dict, ids: torch.Tensor) -> tasks.PairData:
    """Per scene two pairs, (default, semantic change) then (default, non-semantic change), in the recorded
    images; ``ids`` [scenes, L]: a caption per pair (the batches carry the recorded ones)."""
    pixels = rec["data"]["pixels"]
    scenes = len(pixels) // 3
    before = torch.arange(scenes).repeat_interleave(2) * 3
    after = before + torch.tensor([1, 2]).repeat(scenes)
    change = torch.arange(2 * scenes) % 2 == 0
    names = [f"p{i}" for i in range(2 * scenes)]
    split = tasks.PairSplit(pair_ids=names, types=["color", "distractor"] * scenes, before=before, after=after,
                            is_change=change, distractor_row=torch.where(change, after + 1, -1),
                            references={p: ["x"] for p in names}, sample_pair=torch.arange(2 * scenes),
                            sample_ids=ids.repeat_interleave(2, 0))
    images = ImageCache(pixels, {str(i): i for i in range(len(pixels))})
    return tasks.PairData(images=images, splits={"train": split}, max_len=ids.shape[1])


def _authors_init(rec: dict) -> dict[str, torch.Tensor]:
    return parity.authors_state(rec["spec"], rec["meta"]["seed"])


class _Recorded:
    """The seam: the recorded batches, and the traced CLIP holding the recorded initial weights (built by the
    kit's own build_model, so its freezing is the profile's). No val split: no selection metric, no evaluation."""

    selection_metric = None

    def __init__(self, *args, recorded, init, **kw):
        super().__init__(*args, **kw)
        self.recorded, self.init = recorded, init

    def batches(self, epoch, generator):
        yield from self.recorded

    def build_model(self):
        model = super().build_model()
        checkpoints.load_into(model, self.init, path=None, what="recorded initial weights", fix="re-record")
        return model


class RecordedAdapt(_Recorded, tasks.AdaptTask):
    pass


class RecordedCaption(_Recorded, tasks.CaptionTask):
    pass


def _adapt_task(rec: dict):
    c = load_config("clip4idc_adapt", "paper")
    d = rec["data"]
    ids = d["input_ids"].long()[:, :, 0]                        # [steps, B, L]
    by_scene = {int(s): ids[k, j] for k, row in enumerate(d["scenes"]) for j, s in enumerate(row)}
    data = _pair_data(rec, torch.stack([by_scene[s] for s in range(len(d["pixels"]) // 3)]))
    batches = [{"pairs": 2 * d["scenes"][k], "ids": ids[k], "swap": d["swap"][k]} for k in range(len(ids))]
    state = _authors_init(rec)
    task = RecordedAdapt(data, "traced", None, recorded=batches, init=parity.convert_retrieval(state),
                         n_intra=rec["meta"]["n_intra"], batch_size=len(ids[0]), clip_lr_scale=rec["meta"]["coef_lr"],
                         weight_decay=c["weight_decay"], swap_prob=c["swap_prob"], freeze_intra=c["freeze_intra"],
                         freeze_embeddings=c["freeze_embeddings"], eval_batch_size=c["eval_batch_size"], ks=(1,),
                         decay_rule=c["decay_rule"])
    return task, c, state, parity.convert_retrieval(state)


def _caption_ids(pass_ids: torch.Tensor) -> torch.Tensor:
    """Their (input, output) caption ids of a pass [2, B, 1, L] -> the kit's [B, L + 1]: SOT, the words, EOT, pad
    (their input is SOT + words, their output words + EOT)."""
    inp, out = pass_ids[0, :, 0].long(), pass_ids[1, :, 0].long()
    return torch.cat([inp[:, :1], out], 1)


def _caption_task(rec: dict):
    c = load_config("clip4idc_caption", "paper")
    d, meta = rec["data"], rec["meta"]
    kit_ids = [torch.cat([_caption_ids(step[0]), _caption_ids(step[1])]) for step in d["caption_ids"]]
    data = _pair_data(rec, kit_ids[0][:1].expand(len(d["pixels"]) // 3, -1))
    batches = [{"pairs": torch.cat([2 * sc, 2 * sc + 1]), "ids": ids} for sc, ids in zip(d["scenes"], kit_ids)]
    dec = meta["decoder_config"]
    captioner = {**c["captioner"], "hidden": dec["hidden_size"], "heads": dec["num_attention_heads"],
                 "ffn": dec["intermediate_size"], "enc_layers": dec["num_hidden_layers"],
                 "dec_layers": dec["num_decoder_layers"], "dropout": meta["dropout"], "n_intra": meta["n_intra"]}
    state = _authors_init(rec)
    init = parity.convert_captioner(state, data.max_len)
    optional = {"decode_min_words": c["decode_min_words"]} if "decode_min_words" in c else {}
    task = RecordedCaption(data, "traced", None, captioner, recorded=batches, init=init,
                           batch_size=len(d["scenes"][0]), visual_lr_scale=meta["coef_lr"],
                           captions_per_pair=c["captions_per_pair"], trim_vocab=c["trim_vocab"],
                           eval_batch_size=c["eval_batch_size"], decay_rule=c["decay_rule"],
                           loss_reduction=c["loss_reduction"], weight_decay=c["train"]["weight_decay"],
                           freeze=c["freeze"], **optional)
    return task, c, state, init


def _run(stage: str, rec: dict, tmp_path: Path, monkeypatch) -> dict:
    """The recorded steps through fit() at `paper`; what the kit did at each step."""
    task, c, state, init = (_adapt_task if stage == "adapt" else _caption_task)(rec)
    meta = rec["meta"]
    monkeypatch.setattr(tasks, "load_clip", lambda name, pretrained: (parity.clip_from_authors_state(state),
                                                                       None, None))
    seen: dict[str, list] = {"lr": [], "grad_norm": [], "terms": []}
    clip = torch.nn.utils.clip_grad_norm_

    def clip_and_see(params, max_norm, *a, **kw):
        norm = clip(params, max_norm, *a, **kw)
        seen["grad_norm"].append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_and_see)
    if stage == "adapt":
        infonce = tasks.symmetric_infonce

        def infonce_and_see(logits):
            labels = torch.arange(len(logits))
            x = logits.detach()
            seen["terms"].append((float(F.cross_entropy(x, labels)), float(F.cross_entropy(x.t(), labels))))
            return infonce(logits)

        monkeypatch.setattr(tasks, "symmetric_infonce", infonce_and_see)
    else:
        mean = distributed.global_mean

        def mean_and_see(total, count):
            value = mean(total, count)
            seen["terms"].append(float(value.detach()))
            return value

        monkeypatch.setattr(distributed, "global_mean", mean_and_see)

    def before_step(optimizer, args, kwargs):
        seen["lr"].append([g["lr"] for g in optimizer.param_groups])

    block = {**c["train"], "epochs": None, "max_steps": meta["steps"], "lr": meta["lr"], "log_every": 1,
             "eval_every_epochs": None, "eval_every": 0, "checkpoint_every": 0, "patience": None}
    if "authors_selection" in block:
        block["authors_selection"] = None       # no test split here: nothing to select
    if "gradient_scale" in block:
        # recorded in one process, where their gradient is the global loss's; paper's 0.5 is their 2 GPUs' (the
        # script's nproc_per_node, test_what_the_traces_replace_is_the_paper_profile)
        block["gradient_scale"] = 1.0
    cfg = train_config(block, 0)
    hook = register_optimizer_step_pre_hook(before_step)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = fit(task, cfg, tmp_path / stage, progress=False, device="cpu")
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    logged = [r for r in map(json.loads, (tmp_path / stage / "log.jsonl").read_text().splitlines()) if "loss" in r]
    origin = {id(v): k for k, v in state.items()}
    theirs = {kit: rec["spec"][origin[id(v)]][0] for kit, v in init.items() if id(v) in origin}
    return {"res": res, "cfg": cfg, "logged": logged, "seen": seen, "theirs": theirs, "init": init, "task": task}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for stage in ("adapt", "caption"):
            rec = _trace(stage)
            out[stage] = (rec, _run(stage, rec, tmp_path_factory.mktemp(stage), mp))
            mp.undo()
    return out


STAGES = ["adapt", "caption"]


def test_the_traces_are_the_authors_at_their_commit():
    for stage in STAGES:
        rec = _trace(stage)
        m = rec["meta"]
        assert m["commit"] == COMMIT and m["stage"] == stage
        assert (m["precision"], m["processes"], m["dropout"]) == ("fp32", 1, 0.0)
        assert len(rec["steps"]["loss"]) == m["steps"] >= 5
        assert (PARITY / f"clip4idc_{stage}_trace.pt").stat().st_size < 1_000_000


def test_the_traces_hold_warm_up_decay_and_binding_clips():
    """Step 0 runs at lr 0 and step 1 at half the peak (their warm-up, 0.1 of 20 steps), then the schedule decays;
    the gradient norm exceeds the global clip's 1.0 at every step, so the clip binds."""
    for stage in STAGES:
        lr = _trace(stage)["steps"]["lr"]
        live = lr[:, lr[-1] > 0]
        assert float(lr[0].abs().max()) == 0.0
        # step 2 is the first after the warm-up: 0.5 (1 + cos(0.1 pi)) of the peak (cosine), or all of it (linear)
        after = 0.5 * (1 + math.cos(math.pi * 0.1)) if stage == "adapt" else 1.0
        assert_close(live[1], 0.5 * live[2] / after, rtol=1e-9)
        assert bool((live[3:] < live[2:-1]).all())
        assert bool((_trace(stage)["steps"]["grad_norm"] > 1).all())


@pytest.mark.parametrize("stage", STAGES)
def test_the_kit_freezes_what_they_freeze(runs, stage):
    rec, run = runs[stage]
    model = run["res"].model
    trainable = {run["theirs"][n] for n, p in model.named_parameters() if p.requires_grad}
    frozen = {run["theirs"][n] for n, p in model.named_parameters() if not p.requires_grad and n in run["theirs"]}
    their_frozen = {rec["spec"][k][0] for k in rec["frozen"]}
    assert frozen <= their_frozen, frozen - their_frozen
    assert trainable.isdisjoint(their_frozen), trainable & their_frozen
    # every weight their steps moved is a trainable weight of the kit's model
    assert set(rec["final"]) <= trainable, set(rec["final"]) - trainable


@pytest.mark.parametrize("stage", STAGES)
def test_the_kits_paper_training_reproduces_the_authors_steps(runs, stage):
    """Every step's loss terms, total, lr of each of their groups (at the kit group holding each of its tensors)
    and gradient norm; the weight decay of each tensor's group."""
    rec, run = runs[stage]
    want, seen, logged = rec["steps"], run["seen"], run["logged"]
    steps = rec["meta"]["steps"]
    assert run["res"].steps == steps and len(logged) == steps == len(seen["lr"]) == len(seen["grad_norm"])
    terms = ("t2p", "p2t") if stage == "adapt" else ("change", "no_change")
    got_terms = torch.tensor(seen["terms"]).view(steps, 2)
    for k in range(steps):
        assert_close(logged[k]["loss"], want["loss"][k].item(), rtol=RTOL, what=f"step {k} loss")
        for i, name in enumerate(terms):
            assert_close(got_terms[k, i].item(), want[name][k].item(), rtol=RTOL, what=f"step {k} {name}")
        assert_close(seen["grad_norm"][k], want["grad_norm"][k].item(), rtol=RTOL, what=f"step {k} gradient norm")
    model = run["res"].model
    opt_groups = _kit_groups(run)
    their_group = {n: i for i, g in enumerate(rec["groups"]) for n in g["params"]}
    checked = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        their = run["theirs"][name]
        i, j = their_group[their], opt_groups[id(p)]
        assert run["kit_weight_decay"][j] == rec["groups"][i]["weight_decay"], name
        got = torch.tensor([lrs[j] for lrs in seen["lr"]], dtype=torch.float64)
        assert_close(got, want["lr"][:, i], rtol=1e-9, what=f"{name}'s lr")
        checked.add(i)
    assert checked == {i for i, g in enumerate(rec["groups"]) if set(g["params"]) & set(rec["final"])}


def _kit_groups(run) -> dict[int, int]:
    groups = run["task"].param_groups(run["res"].model)
    run["kit_weight_decay"] = [g.get("weight_decay", run["cfg"].weight_decay) for g in groups]
    return {id(p): j for j, g in enumerate(groups) for p in g["params"]}


def _key_bias(name: str, value: torch.Tensor) -> torch.Tensor | None:
    """The elements of an attention key bias in ``name`` (their decoder's ``att.key.bias``, the middle third of
    CLIP's ``in_proj_bias``), else None. Attention is invariant to a key bias (it shifts every score of a query
    alike): its true gradient is 0 and the computed one rounding noise, which Adam divides by its own size, so the
    steps move it by amounts no two implementations share."""
    if name.endswith("att.key.bias"):
        return torch.ones_like(value, dtype=torch.bool)
    if name.endswith("in_proj_bias"):
        third = len(value) // 3
        return (torch.arange(len(value)) >= third) & (torch.arange(len(value)) < 2 * third)
    return None


@pytest.mark.parametrize("stage", STAGES)
def test_the_kits_weights_after_the_steps_are_the_authors(runs, stage):
    """The trainable weights after the last step to 1e-5 relative, and each tensor's move over the steps to 1e-5
    of its largest move plus 4 fp32 ulps of the weights (the rounding of the weights themselves), so that the
    check is on the steps, not only on the weights they started from. Attention key biases (:func:`_key_bias`)
    move by rounding noise on both sides: each move is bounded by 1e-3 of the lr its group summed over the
    steps (a real gradient moves a tensor by about its lr per step under Adam)."""
    rec, run = runs[stage]
    state = run["res"].model.state_dict()
    kit_of = {their: kit for kit, their in run["theirs"].items()}
    init = _authors_init(rec)
    group_lr = {n: float(rec["steps"]["lr"][:, i].sum()) for i, g in enumerate(rec["groups"]) for n in g["params"]}
    eps = torch.finfo(torch.float32).eps
    for their, value in rec["final"].items():
        got = state[kit_of[their]]
        if their == "clip.logit_scale":
            # they clamp it to ln 100 after each step, the kit before each forward: every forward sees the same
            # value; the kit's last step leaves it unclamped until the next one
            got = got.clamp(max=math.log(100))
        start = init[their]
        noise = _key_bias(their, value)
        if noise is not None:
            bound = 1e-3 * group_lr[rec["spec"][their][0] if their in rec["spec"] else their]
            for side in (got, value):
                assert float((side - start)[noise].abs().max()) <= bound, their
            got, value, start = got[~noise], value[~noise], start[~noise]
            if not len(value):
                continue
        assert_close(got, value, rtol=RTOL, what=their)
        moved = value - start
        floor = 4 * eps * float(value.abs().max()) / RTOL
        assert_close(got - start, moved, rtol=RTOL, scale=max(float(moved.abs().max()), floor),
                     what=f"{their}'s move")
    assert len(rec["final"]) > 20


def test_what_the_traces_replace_is_the_paper_profile():
    """The trace runs at its own lr, coef_lr, sizes, step count and process count; the values of their run scripts
    (scripts/retrieve_clevr.sh, caption_clevr.sh, recorded with the trace) are the `paper` profile's."""
    adapt, caption = load_config("clip4idc_adapt", "paper"), load_config("clip4idc_caption", "paper")
    a, c = (_trace(stage)["meta"]["script_arguments"] for stage in STAGES)
    assert float(a["lr"]) == adapt["train"]["lr"] and float(a["coef_lr"]) == adapt["clip_lr_scale"]
    assert int(a["epochs"]) == adapt["train"]["epochs"] and int(a["batch_size"]) == adapt["batch_size"]
    assert float(c["lr"]) == caption["train"]["lr"] and float(c["coef_lr"]) == caption["visual_lr_scale"]
    assert int(c["epochs"]) == caption["train"]["epochs"] and int(c["batch_size"]) == caption["batch_size"]
    # their --max_words counts SOT and EOT in the retrieval text and leaves room for both around the caption words
    assert int(a["max_words"]) == int(c["max_words"]) == caption["max_len"] == caption["caption_max_len"] - 1
    # --freeze_layer_num 0: the embeddings below the first block frozen, every block trained
    assert int(a["freeze_layer_num"]) == int(c["freeze_layer_num"]) == 0
    assert adapt["freeze_embeddings"] and not adapt["freeze_intra"] and not caption["captioner"]["freeze_visual"]
    for stage, cfg in zip(STAGES, (adapt, caption)):
        assert _trace(stage)["meta"]["warmup_proportion"] == cfg["train"]["warmup_fraction"] == 0.1
    # the traces run in one process; the paper runs in their scripts' processes, whose gradient the AllGather
    # backward and DDP's average divide by their number
    for args, cfg in ((a, adapt), (c, caption)):
        assert cfg["train"].get("gradient_scale", 1.0) == 1 / int(args["nproc_per_node"])


def test_the_traces_separate_the_paper_settings(monkeypatch):
    """What the trace checks could fail: the kit's cpu loss reduction misses their step-0 captioning loss, and
    without the paper's embedding freeze the kit would train weights they keep fixed."""
    rec = _trace("caption")
    task, _, state, _ = _caption_task(rec)
    monkeypatch.setattr(tasks, "load_clip", lambda name, pretrained: (parity.clip_from_authors_state(state),
                                                                       None, None))
    model = task.build_model()
    batch = next(iter(task.batches(0, None)))
    with torch.no_grad():
        paper = task.train_step(model, batch, 0)[0]
        task.loss_reduction = "token_mean"
        kit = task.train_step(model, batch, 0)[0]
    want = rec["steps"]["loss"][0]
    assert_close(paper, want, rtol=RTOL)
    assert float((kit - want).abs() / want) > 0.3
    rec = _trace("adapt")
    task, _, state, init = _adapt_task(rec)
    monkeypatch.setattr(tasks, "load_clip", lambda name, pretrained: (parity.clip_from_authors_state(state),
                                                                       None, None))
    task.freeze_embeddings = False
    origin = {id(v): k for k, v in state.items()}
    theirs = {kit: rec["spec"][origin[id(v)]][0] for kit, v in init.items() if id(v) in origin}
    their_frozen = {rec["spec"][k][0] for k in rec["frozen"]}
    wrongly = {theirs[n] for n, p in task.build_model().named_parameters() if p.requires_grad
               and theirs[n] in their_frozen}
    assert {"clip.token_embedding.weight", "clip.visual.conv1.weight"} <= wrongly
