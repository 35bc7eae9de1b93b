"""CLIP4IDC's training, optimiser level: the kit at `paper` steps as the authors' scripts step.

``tests/parity/clip4idc_optim_trace.pt`` (``python -m idckit.authors record --clip4idc CHECKOUT``,
:func:`idckit.authors.clip4idc.record_optim_trace`) holds, for a few named tensors per stage (their model's names,
spanning their four parameter groups), what their ``prep_optimizer`` (main_task_retrieval.py:165-217,
main_task_caption.py:223-266: BertAdam, their weight-decay name rule, coef_lr) did over 20 steps of fixed gradients,
each step as their ``train_epoch`` takes it (backward, global clip at 1.0, ``optimizer.step()``): the groups, the
scheduled lr of each group at each step, the gradient norm and the parameters after every step. Stages: adaptation,
adaptation without the global clip (so BertAdam's own per-tensor clip binds), captioning.

The kit replays the same gradients through :func:`idckit.train.loop.fit` (the loss sum <p, G_k> has gradient G_k),
with its ``TrainConfig`` from the `paper` profile (``train_config``) and its groups from the tasks' grouping
functions, and must land on the same parameters at every step. lr and the coefficient are the trace's (0.05, 0.2:
large enough to move parameters beyond rounding); everything else is the config's.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idckit.experiments.config import load_config, train_config
from idckit.authors import clip4idc as parity
from idckit.tasks.clip4idc import adapt_param_groups, caption_param_groups
from idckit.train.loop import _optimizer, fit
from idckit.train.optim import BertAdam, clip_per_tensor
from idckit.train.schedules import lr_factor
from tests.numeric import assert_close, assert_differ

TRACE = Path(__file__).parent / "parity" / "clip4idc_optim_trace.pt"
#: their schedule function -> the kit's name for the same formula
SCHEDULE = {"warmup_cosine": "warmup_cosine_bert", "warmup_linear": "warmup_linear_bert"}
#: the caption trace's names in the kit's captioner (idckit.authors.clip4idc.convert_captioner's renaming)
CAPTION_NAMES = {
    "decoder.decoder.layer.0.intermediate.dense.weight": "decoder.0.ffn.fc.weight",
    "decoder.decoder.layer.0.intermediate.dense.bias": "decoder.0.ffn.fc.bias",
    "decoder.decoder.layer.0.output.LayerNorm.weight": "decoder.0.ffn.norm.weight",
    "decoder.classifier.cls.predictions.bias": "head_bias"}
#: modules that are LayerNorms in the kit's captioner (the caption model's, and the pair encoder's CLIP ones)
CAPTION_NORMS = ("decoder.0.ffn.norm", "pair_encoder.visual.ln_post", "pair_encoder.ln_mid")


@pytest.fixture(scope="module")
def trace():
    return torch.load(TRACE, weights_only=True)


def kit_names(stage: str) -> dict[str, str]:
    """Their traced names -> the kit's."""
    names = list(parity.TRACE_PARAMETERS[stage][1])
    if stage == "adapt":
        index = parity.convert_retrieval({n: torch.tensor(float(i)) for i, n in enumerate(names)})
        return {names[int(v)]: k for k, v in index.items()}
    return {n: CAPTION_NAMES.get(n, "pair_encoder." + (n[len("clip.visual."):] if n[len("clip.visual."):]
                                                        in parity.NEW_VISUAL else n[len("clip."):]))
            for n in names}


class TraceTask:
    """Fixed gradients as a task: step k's loss is sum <p, G_k>; the parameters each step starts from are kept."""

    selection_metric = None

    def __init__(self, stage: str, rec: dict, groups):
        self.stage, self.rec, self.groups = stage, rec, groups
        self.names = kit_names(stage)
        self.seen: dict[int, dict[str, torch.Tensor]] = {}

    def build_model(self) -> torch.nn.Module:
        values = {self.names[n]: v for n, v in self.rec["initial"].items()}
        return parity.module_of(values, CAPTION_NORMS if self.stage == "caption" else ())

    def param_groups(self, model):
        return self.groups(model)

    def batches(self, epoch, generator):
        yield from range(parity.TRACE_STEPS)

    def train_step(self, model, k, step):
        params = dict(model.named_parameters())
        self.seen[step] = {n: params[self.names[n]].detach().clone() for n in self.rec["initial"]}
        loss = sum((params[self.names[n]] * g[step]).sum() for n, g in self.rec["grads"].items())
        return loss, {}

    def evaluate(self, model, split="val"):
        return {}


def paper_run(stage: str, global_clip: bool = True):
    """(the loop's TrainConfig, the groups function) at `paper`, with the trace's lr, coefficient and length."""
    if stage == "adapt":
        c = load_config("clip4idc_adapt", "paper")
        new = lambda model: [p for n, p in model.named_parameters()    # noqa: E731
                             if n.startswith("pair_encoder.") and n[len("pair_encoder."):] in parity.NEW_VISUAL]
        groups = lambda model: adapt_param_groups(model, new(model), clip_lr_scale=parity.TRACE_COEF_LR,  # noqa: E731
                                                  weight_decay=c["weight_decay"], decay_rule=c["decay_rule"])
    else:
        c = load_config("clip4idc_caption", "paper")
        groups = lambda model: caption_param_groups(model, visual_lr_scale=parity.TRACE_COEF_LR,  # noqa: E731
                                                    weight_decay=c["train"]["weight_decay"],
                                                    decay_rule=c["decay_rule"])
    block = {**c["train"], "epochs": None, "max_steps": parity.TRACE_STEPS, "lr": parity.TRACE_LR,
             "eval_every_epochs": None, "eval_every": 0, "checkpoint_every": 0, "patience": None}
    if not global_clip:
        block["grad_clip"] = None
    if stage == "adapt":
        # the trace ran their adaptation in one process, where their gradient is the global loss's; `paper`'s
        # gradient_scale 0.5 is the same code on their 2 GPUs (AllGather's backward and DDP's average halve it)
        block["gradient_scale"] = 1.0
    return train_config(block, 0), groups, c


def replay(stage: str, rec: dict, tmp_path: Path, global_clip: bool = True, **override):
    cfg, groups, _ = paper_run(stage, global_clip)
    for k, v in override.items():
        setattr(cfg, k, v)
    task = TraceTask(stage, rec, groups)
    res = fit(task, cfg, tmp_path / "run", progress=False, device="cpu")
    final = dict(res.model.named_parameters())
    task.seen[parity.TRACE_STEPS] = {n: final[task.names[n]].detach() for n in rec["initial"]}
    return [task.seen[k + 1] for k in range(parity.TRACE_STEPS)]


STAGES = [("adapt", "adapt", True), ("adapt_no_global_clip", "adapt", False), ("caption", "caption", True)]


@pytest.mark.parametrize("name, stage, global_clip", STAGES, ids=[s[0] for s in STAGES])
def test_paper_config_is_the_traced_optimizer(trace, name, stage, global_clip):
    """Every setting the trace ran with is the `paper` config's: optimiser, betas, eps, decay, clipping, schedule."""
    rec = trace[name]
    cfg, _, c = paper_run(stage, global_clip)
    g = rec["groups"][0]
    assert cfg.optimizer == "bertadam" and cfg.betas == (g["b1"], g["b2"]) and cfg.eps == g["e"]
    assert cfg.grad_clip_per_tensor == g["max_grad_norm"] == 1.0
    assert cfg.schedule == SCHEDULE[g["schedule"]] and cfg.warmup_steps == round(trace["meta"]["warmup_proportion"]
                                                                                 * parity.TRACE_STEPS)
    decayed = {d["weight_decay"] for d in rec["groups"]} - {0.0}
    assert decayed == {c["weight_decay"] if stage == "adapt" else c["train"]["weight_decay"]}
    assert rec["global_clip"] == global_clip and (cfg.grad_clip == 1.0) == global_clip
    # their per-group lr is lr * coef_lr for CLIP's parameters: the paper's coefficient is the config's scale
    scale = c["clip_lr_scale"] if stage == "adapt" else c["visual_lr_scale"]
    assert scale == 1e-3


@pytest.mark.parametrize("name, stage, global_clip", STAGES, ids=[s[0] for s in STAGES])
def test_kit_groups_and_lr_per_step_are_theirs(trace, name, stage, global_clip):
    """The loop's optimiser (``_optimizer``) and schedule (``lr_factor`` in a LambdaLR) give each of their tensors
    their group's weight decay and, at every step, their scheduled lr."""
    rec = trace[name]
    cfg, groups, _ = paper_run(stage, global_clip)
    task = TraceTask(stage, rec, groups)
    model = task.build_model()
    opt = _optimizer(cfg, groups(model))
    assert isinstance(opt, BertAdam)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg.schedule, max_steps=cfg.max_steps,
                                                             warmup_steps=cfg.warmup_steps))
    params = dict(model.named_parameters())
    where = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
    theirs = {n: i for i, g in enumerate(rec["groups"]) for n in g["params"]}
    assert set(theirs) == set(rec["initial"])
    for n, i in theirs.items():
        mine = opt.param_groups[where[id(params[task.names[n]])]]
        assert mine["weight_decay"] == rec["groups"][i]["weight_decay"], n
    for k in range(parity.TRACE_STEPS):
        got = torch.tensor([opt.param_groups[where[id(params[task.names[n]])]]["lr"] for n in theirs],
                           dtype=torch.float64)
        want = torch.stack([rec["lr"][k, i] for i in theirs.values()])
        assert_close(got, want, rtol=1e-5, what=f"lr at step {k}")
        opt.step()
        sched.step()
    assert float(rec["lr"][0].abs().max()) == 0.0          # their step 0 runs at lr 0 (x / warmup with x = 0)


@pytest.mark.parametrize("name, stage, global_clip", STAGES, ids=[s[0] for s in STAGES])
def test_kit_at_paper_reproduces_every_step_of_their_optimizer(trace, tmp_path, name, stage, global_clip):
    rec = trace[name]
    after = replay(stage, rec, tmp_path, global_clip)
    for k in range(parity.TRACE_STEPS):
        for n, steps in rec["after"].items():
            want = steps[k]
            assert_close(after[k][n], want, rtol=1e-5, what=f"{n} after step {k}")
            moved = want - rec["initial"][n]
            if k > 0:       # the step itself, not only the parameter it moved: 1e-5 of the largest move
                assert_close(after[k][n] - rec["initial"][n], moved, rtol=1e-5,
                             scale=float(moved.abs().max()), what=f"{n}'s change after step {k}")


def test_trace_exercises_what_it_claims(trace):
    """Warm-up and decay both inside the 20 steps, a tensor over the clip, decayed and undecayed groups at two lrs."""
    for name, _, _ in STAGES:
        rec = trace[name]
        lrs = rec["lr"]
        assert lrs[0].max() == 0 and (lrs[1] > 0).all() and (lrs[-1] < lrs[2]).all()
        assert len({float(x) for x in lrs[2]}) == 2
        assert {g["weight_decay"] > 0 for g in rec["groups"] if g["params"]} == {True, False}
        assert (rec["grad_norm"] > 1).all()
        big = parity.TRACE_LARGE[name.split("_")[0]]
        assert all(float(g.norm()) > 1 for g in rec["grads"][big])


def test_the_kit_differs_from_their_trace_without_the_paper_settings(trace, tmp_path):
    """The trace separates the settings: AdamW (bias-corrected, eps 1e-8) or the kit's own schedule misses it."""
    rec = trace["adapt"]
    for override in ({"optimizer": "adamw", "eps": 1e-8}, {"schedule": "warmup_cosine"}):
        after = replay("adapt", rec, tmp_path / next(iter(override.values())), **override)
        n = "clip.visual.bef_embedding"
        assert_differ(after[-1][n], rec["after"][n][-1], rtol=1e-3, what=str(override))


def test_per_tensor_clip_after_the_global_clip_at_the_same_norm_changes_nothing(trace, tmp_path):
    """Their scripts clip globally to 1.0, then BertAdam clips each tensor to 1.0: no tensor of a set whose norm is
    at most 1 exceeds 1, so the second clip never binds (without the first it does: the no-global-clip stage)."""
    rec = trace["adapt"]
    without = replay("adapt", rec, tmp_path, grad_clip_per_tensor=None)
    for n, steps in rec["after"].items():
        assert_close(without[-1][n], steps[-1], rtol=1e-5, what=n)
    differs = [n for n in rec["initial"]
               if not torch.equal(trace["adapt_no_global_clip"]["after"][n][-1], rec["after"][n][-1])]
    assert differs


def test_bertadam_with_bias_correction_is_adamw():
    """The update, written from the algorithm, checked on its one known point: with bias correction it is AdamW."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(a.detach().clone())
    mine = BertAdam([a], lr=0.01, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2, bias_correction=True)
    ref = torch.optim.AdamW([b], lr=0.01, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
    for _ in range(6):
        g = torch.randn(5, 3)
        a.grad, b.grad = g.clone(), g.clone()
        mine.step()
        ref.step()
    assert_close(a.detach(), b.detach(), rtol=1e-6)


def test_clip_per_tensor_is_clip_grad_norm_on_each_tensor():
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for p, q, s in zip(ps, qs, (0.01, 1.0, 10.0)):
        p.grad = torch.randn(4, 4) * s
        q.grad = p.grad.clone()
    clip_per_tensor(ps, 1.0)
    for p, q in zip(ps, qs):
        torch.nn.utils.clip_grad_norm_([q], 1.0)
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("family", ["clip4idc_adapt", "clip4idc_caption"])
@pytest.mark.parametrize("profile", ["cpu", "smoke"])
def test_cpu_and_smoke_keep_adamw_and_their_settings(family, profile):
    """The smaller profiles train with torch's AdamW as before: eps 1e-8 (torch's default), no per-tensor clip,
    the kit's schedules, grouping and loss."""
    c = load_config(family, profile)
    cfg = train_config({**c["train"], "epochs": None, "eval_every_epochs": None}, 0, steps_per_epoch=10)
    assert (cfg.optimizer, cfg.eps, cfg.grad_clip_per_tensor) == ("adamw", 1e-8, None)
    assert cfg.schedule == ("warmup_cosine" if family == "clip4idc_adapt" else "warmup_linear")
    assert c["decay_rule"] == "kit"
    if family == "clip4idc_caption":
        assert c["loss_reduction"] == "token_mean"
    p = torch.nn.Parameter(torch.zeros(2))
    opt = _optimizer(cfg, [{"params": [p]}])
    assert type(opt) is torch.optim.AdamW
    assert opt.defaults["eps"] == torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).defaults["eps"]
    assert opt.param_groups[0]["betas"] == tuple(c["train"].get("betas", (0.9, 0.999)))


def test_bert_schedules_are_their_formulas_at_the_raw_fraction():
    """warmup_cosine_bert: 0.976 at x = 0.1 just after a 10% warm-up, 0.5 at mid-run (the kit's re-spread cosine:
    about 0.59); warmup_linear_bert: (1 - x) / (1 - w)."""
    cos = lr_factor("warmup_cosine_bert", max_steps=100, warmup_steps=10)
    assert cos(0) == 0.0 and cos(5) == 0.5 and cos(10) == pytest.approx(0.5 * (1 + torch.cos(torch.tensor(0.1 * 3.141592653589793)).item()))
    assert cos(50) == pytest.approx(0.5) and lr_factor("warmup_cosine", max_steps=100, warmup_steps=10)(49) > 0.55
    lin = lr_factor("warmup_linear_bert", max_steps=100, warmup_steps=10)
    assert lin(10) == pytest.approx(1.0) and lin(55) == pytest.approx(0.5) and lin(100) == 0.0


# -- the grouping rule on their whole model's names, and the captioning loss -----------------------------------

#: their weight-decay exclusion, main_task_retrieval.py:171 and main_task_caption.py:229 (substrings of a name)
THEIR_NO_DECAY = ("bias", "LayerNorm.bias", "LayerNorm.weight")


def _theirs_vs_kit(state: dict, converted: dict, model: torch.nn.Module, groups: list[dict], wd: float,
                   scale: float, new_lr) -> set[str]:
    """Check every trainable kit parameter's (lr scale, weight decay) against their rule on the name it came from;
    return the kit names with no counterpart found (sliced on conversion)."""
    origin = {id(v): k for k, v in state.items()}
    theirs = {kit: origin[id(v)] for kit, v in converted.items() if id(v) in origin}
    where = {id(p): g for g in groups for p in g["params"]}
    unmatched = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name not in theirs:
            unmatched.add(name)
            continue
        their = theirs[name]
        g = where[id(p)]
        assert g["weight_decay"] == (0.0 if any(nd in their for nd in THEIR_NO_DECAY) else wd), (name, their)
        assert g["lr_scale"] == (1.0 if new_lr(their) else scale), (name, their)
    return unmatched


def test_public_decay_rule_on_every_parameter_of_their_models():
    """The parity recordings' full models (their names, the kit's modules): every trainable parameter gets the
    decay and lr their grouping code gives the name it is converted from."""
    from idckit.experiments.config import model_config
    from idckit.models.clip4idc import CLIP4IDCCaptioner, CLIP4IDCRetrieval

    recs = {k: torch.load(TRACE.parent / f"clip4idc_{k}.pt", weights_only=True) for k in ("adapt", "caption")}
    state = parity.authors_state(recs["adapt"]["spec"], recs["adapt"]["meta"]["seed"])
    model = CLIP4IDCRetrieval(parity.clip_from_authors_state(state), n_intra=3)
    model.freeze_like_public_code()
    groups = adapt_param_groups(model, model.pair_encoder.new_parameters(), clip_lr_scale=1e-3, weight_decay=0.2,
                                decay_rule="public")
    new = lambda their: their.startswith("clip.visual.") and their[len("clip.visual."):] in parity.NEW_VISUAL  # noqa
    assert not _theirs_vs_kit(state, parity.convert_retrieval(state), model, groups, 0.2, 1e-3, new)

    state = parity.authors_state(recs["caption"]["spec"], recs["caption"]["meta"]["seed"])
    sizes = parity.captioner_sizes(state)
    cfg = model_config("clip4idc-paper", **sizes, heads=4, n_intra=recs["caption"]["split"])
    model = CLIP4IDCCaptioner(parity.clip_from_authors_state(state), cfg)
    groups = caption_param_groups(model, visual_lr_scale=1e-3, weight_decay=0.01, decay_rule="public")
    left = _theirs_vs_kit(state, parity.convert_captioner(state, cfg.max_len), model, groups, 0.01, 1e-3,
                          lambda their: not their.startswith("clip."))
    assert left <= {"position_embedding.weight"}     # their CLIP text position table, cut to max_len


def _caption_task(loss_reduction: str):
    import importlib.util

    from idckit.tasks.clip4idc import CaptionTask

    spec = importlib.util.spec_from_file_location("ddp_worker", Path(__file__).parent / "ddp_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    captioner = {"hidden": 32, "heads": 2, "ffn": 64, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                 "freeze_visual": False, "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise",
                 "tie_clip_embeddings": False, "freeze_clip_embeddings": False, "segment_embedding": None,
                 "difference_tokens": False}
    return CaptionTask(worker.tiny_pair_data(scenes=4), "idckit-standin-ViT-T-16", None, captioner, batch_size=2,
                       captions_per_pair=1, visual_lr_scale=1e-3, trim_vocab=False, eval_batch_size=100,
                       loss_reduction=loss_reduction)


def test_caption_pass_means_is_their_sum_of_two_pass_means():
    """main_task_caption.py:319-325: loss1 (change pass) + loss2 (no-change pass), each CrossEntropyLoss's mean over
    its pass's caption tokens; the kit's token_mean is one mean over both (about half, weighted by token counts)."""
    import torch.nn.functional as F

    mean, passes = _caption_task("token_mean"), _caption_task("pass_means")
    torch.manual_seed(0)
    model = mean.build_model().eval()
    batch = next(iter(mean.batches(0, torch.Generator().manual_seed(0))))
    change = mean.data.splits["train"].is_change[batch["pairs"]]
    assert change.any() and (~change).any()
    with torch.no_grad():
        logits, labels = model.teacher_forcing(model.memories(mean._visual(model, "train", batch["pairs"])),
                                               batch["ids"])
        ce = lambda rows: F.cross_entropy(logits[rows].flatten(0, 1).float(), labels[rows].flatten())  # noqa: E731
        theirs = ce(change) + ce(~change)
        got = passes.train_step(model, batch, 0)[0]
        kit = mean.train_step(model, batch, 0)[0]
    assert_close(got, theirs, rtol=1e-5)
    assert_close(kit, ce(torch.ones_like(change)), rtol=1e-5)
    assert_differ(got, kit, rtol=1e-2)


def test_trace_names_its_source(trace):
    assert trace["meta"]["commit"] == "ca4946138824d03ff17033cb7ff49b2e65e74d23"
    assert TRACE.stat().st_size < 200_000


def test_bertadam_resumes_from_its_state_dict_to_the_same_parameters():
    """The loop's resume loads the optimiser's state_dict: a BertAdam restarted from one continues exactly."""
    torch.manual_seed(0)
    grads = [torch.randn(4, 3) for _ in range(6)]

    def run(resume_at: int | None) -> torch.Tensor:
        p = torch.nn.Parameter(torch.ones(4, 3))
        opt = BertAdam([p], lr=0.1, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
        for k, g in enumerate(grads):
            if k == resume_at:
                state = opt.state_dict()
                p = torch.nn.Parameter(p.detach().clone())
                opt = BertAdam([p], lr=0.1, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
                opt.load_state_dict(state)
            p.grad = g.clone()
            opt.step()
        return p.detach()

    assert torch.equal(run(None), run(3))
