"""CLIP4IDC training traces: the authors' two training scripts run for a few steps on recorded batches.

:func:`record_traces` (``python -m idckit.authors record --clip4idc CHECKOUT``) runs their ``main()`` of
``main_task_retrieval.py`` (adaptation) and of ``main_task_caption.py`` (captioning) from a checkout at a tiny size
on CPU, with only what reaches outside a CPU process replaced: their argument parsing (the arguments of
``scripts/retrieve_clevr.sh`` / ``caption_clevr.sh`` at the tiny size), their seeding and logger set-up (CUDA
calls), their device count (1), their model loading (their ``CLIP4IDC`` built as their ``init_model`` builds it,
every parameter then set to :func:`idckit.authors.clip4idc.parameter_value`), their data loaders (the recorded
batches, one epoch of ``STEPS``), DDP (their 1-process path), checkpoint writing and evaluation. So their freezing
(``--freeze_layer_num 0``), ``prep_optimizer`` (BertAdam, its four groups, ``coef_lr``, t_total = the epoch's
steps), forward and loss, and ``train_epoch``'s order (backward, global clip at 1.0, BertAdam's per-tensor clip
and scheduled step, the ``logit_scale`` clamp) are theirs, unchanged.

Deliberate: fp32 throughout (their ``convert_weights`` leaves CLIP's matrices in fp16; the kit trains fp32, see
docs/parity.md), one process (their 2-GPU run all-gathers the similarity's inputs), no dropout to replay (CLIP has
none; their caption model's is set to 0, as its masks come from torch's global generator in their module order),
lr and ``coef_lr`` larger than the paper's so that every group's step moves weights far beyond fp32 rounding (the
paper's values, read from their run scripts and stored with each trace, are checked against the `paper` profile by
tests/test_training_trace_clip4idc_model.py).

Per step: the loss terms (adaptation: their ``CrossEn`` of the similarity matrix and of its transpose; captioning:
the change and the no-change pass), the total, each of their groups' scheduled lr, the gradient norm their
global clip measured; and the trainable parameters after the last step (the initial ones are recomputed from the
stored spec). Files: tests/parity/clip4idc_adapt_trace.pt and clip4idc_caption_trace.pt.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.parallel as parallel
from torch.optim.optimizer import register_optimizer_step_pre_hook

from idckit import registry
from idckit.authors import checkout_commit
from idckit.authors.clip4idc import SEED, _authors_code, _set_parameters, authors_state
from idckit.data.images import ImageCache

#: CLEVR-Change as the authors' scripts name it (their --datatype)
AUTHORS_CLEVR = registry.dataset("clevr-change").authors_name

#: the traced CLIP (their ``CLIP`` constructor's sizes; heads = width // 64 = 1): a 7 x 7 patch grid, so 50 tokens
#: per image as their hard-coded after-image CLS index 50 needs, 2 ViT layers split 1 + 1, a 1-layer text tower
CLIP_SIZES = dict(embed_dim=64, image_resolution=14, vision_layers=2, vision_width=64, vision_patch_size=2,
                  context_length=77, vocab_size=49408, transformer_width=64, transformer_heads=1,
                  transformer_layers=1)
N_INTRA = 1
#: their decoder_config.json at the traced size, dropout 0 (module doc)
DECODER_CONFIG = {"attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
                  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 16,
                  "num_attention_heads": 2, "num_hidden_layers": 1, "type_vocab_size": 2, "vocab_size": 49408,
                  "num_decoder_layers": 1, "max_target_embeddings": 77}
STEPS = 20                  # one epoch of STEPS batches: t_total = STEPS, warm-up 0.1 of it = steps 0 and 1
WARMUP = 0.1                # their --warmup_proportion default
MAX_WORDS = 32              # their scripts' --max_words
LR, COEF_LR = 1e-3, 0.1     # (module doc)
SCENES = 6
ADAPT_BATCH, CAPTION_BATCH = 4, 3
COLORS = ["red", "blue", "green", "gray", "cyan", "yellow"]
SHAPES = ["cube", "sphere", "cylinder", "cube", "sphere", "cylinder"]
NO_CHANGE = ["no change was made", "the scene is the same as before"]


def scene_captions(scene: int) -> list[str]:
    """Two change captions of a scene (their loader picks one per step)."""
    c, s = COLORS[scene], SHAPES[scene]
    return [f"the small {c} metal {s} has been moved", f"someone changed the {c} {s} to a large rubber one"]


def images(seed: int = SEED) -> torch.Tensor:
    """[3 * SCENES, 3, S, S] uint8: per scene its default, semantic-change and non-semantic-change image (an
    after image is its before image plus noise, so a pair differs, not wholly)."""
    g = torch.Generator().manual_seed(seed)
    size = CLIP_SIZES["image_resolution"]
    default = torch.randint(0, 256, (SCENES, 3, size, size), generator=g)
    after = [(default + torch.randint(-60, 61, default.shape, generator=g)).clamp(0, 255) for _ in range(2)]
    return torch.stack([default, *after], 1).flatten(0, 1).to(torch.uint8)


def normalised(pixels: torch.Tensor) -> torch.Tensor:
    """The images as the model reads them: the kit's own scaling and CLIP normalisation (ImageCache.batch), so
    both sides see the same fp32 numbers."""
    cache = ImageCache(pixels, {str(i): i for i in range(len(pixels))})
    return cache.batch(torch.arange(len(pixels)))


# ---------------------------------------------------------------------------------------------------------------
# Running their main()
# ---------------------------------------------------------------------------------------------------------------

def _args(task_type: str, out: Path, clip_file: Path, decoder_dir: Path) -> argparse.Namespace:
    """Their get_args() result for the scripts' command lines (scripts/retrieve_clevr.sh, caption_clevr.sh) at the
    traced size; the rest are their parser's defaults."""
    return argparse.Namespace(
        do_pretrain=False, do_train=True, do_eval=False, data_path="", features_path="", num_thread_reader=0,
        lr=LR, epochs=1, batch_size=ADAPT_BATCH if task_type == "retrieval" else CAPTION_BATCH, batch_size_val=4,
        lr_decay=0.9, n_display=100, seed=42, max_words=MAX_WORDS, feature_framerate=1, margin=0.1,
        hard_negative_rate=0.5, negative_weighting=1, n_pair=1, output_dir=str(out), cross_model="cross-base",
        decoder_model=str(decoder_dir), init_model=None, resume_model=None, do_lower_case=False,
        warmup_proportion=WARMUP, gradient_accumulation_steps=1, n_gpu=1, cache_dir="", fp16=False,
        fp16_opt_level="O1", task_type=task_type, datatype=AUTHORS_CLEVR, world_size=1, local_rank=0, rank=0,
        coef_lr=COEF_LR, use_mil=False, sampled_use_mil=False, text_num_hidden_layers=12,
        visual_num_hidden_layers=12, intra_num_hidden_layers=N_INTRA, cross_num_hidden_layers=2,
        decoder_num_hidden_layers=DECODER_CONFIG["num_decoder_layers"], freeze_layer_num=0, linear_patch="2d",
        pretrained_clip_name=str(clip_file))


class _Sampler:
    def set_epoch(self, epoch: int) -> None:
        pass


@contextlib.contextmanager
def _patched(obj: Any, **attrs: Any) -> Iterator[None]:
    saved = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(obj, k, v)


def _run_main(script: str, args: argparse.Namespace, model: torch.nn.Module, batches: list[tuple]) -> dict:
    """Their ``script.main()`` on ``model`` and ``batches`` (module doc); returns what each step did."""
    main = importlib.import_module(script)
    from modules.optimization import SCHEDULES  # local: the authors' checkout, on sys.path only here

    steps: dict[str, list] = {"lr": [], "grad_norm": [], "forward": []}
    saved: dict[str, Any] = {}
    optimizers: list = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip_and_record(params, max_norm, *a, **kw):      # their train_epoch's global clip: its norm is recorded
        norm = real_clip(params, max_norm, *a, **kw)
        steps["grad_norm"].append(float(norm))
        return norm

    def before_step(optimizer, _args, _kwargs):            # each group's lr as BertAdam schedules it this step
        k = len(steps["lr"])
        steps["lr"].append([g["lr"] * SCHEDULES[g["schedule"]](k / g["t_total"], g["warmup"])
                            for g in optimizer.param_groups])

    def prep(*a, **kw):
        optimizer, scheduler, wrapped = real_prep(*a, **kw)
        optimizers.append(optimizer)
        return optimizer, scheduler, wrapped

    def save(epoch, args_, model_, optimizer, tr_loss, type_name=""):
        saved["state"] = {n: p.detach().clone() for n, p in model_.named_parameters()}
        saved["trainable"] = sorted(n for n, p in model_.named_parameters() if p.requires_grad)
        saved["tr_loss"] = tr_loss
        return "trace"

    def record_forward(module, inputs, output):
        if module.training:
            steps["forward"].append(float(output.detach()))

    loader = {"train": lambda a, t: (batches, len(batches), _Sampler()), "val": None,
              "test": lambda a, t, subset="test": ([], 0)}
    real_prep = main.prep_optimizer
    with contextlib.ExitStack() as stack:
        def set_seed_logger(a):
            Path(a.output_dir).mkdir(parents=True, exist_ok=True)
            main.logger = main.get_logger(str(Path(a.output_dir) / "log.txt"))
            return a
        stack.enter_context(_patched(main, get_args=lambda *a, **k: args, set_seed_logger=set_seed_logger,
                                     init_device=lambda a, r: (torch.device("cpu"), 1),
                                     init_model=lambda *a: model, DATALOADER_DICT={AUTHORS_CLEVR: loader},
                                     prep_optimizer=prep, save_model=save,
                                     eval_epoch=lambda *a, **k: 0.0))
        stack.enter_context(_patched(parallel, DistributedDataParallel=lambda m, **kw: m))
        stack.enter_context(_patched(torch.nn.utils, clip_grad_norm_=clip_and_record))
        hooks = [register_optimizer_step_pre_hook(before_step), model.register_forward_hook(record_forward)]
        stack.callback(lambda: [h.remove() for h in hooks])
        stack.enter_context(contextlib.redirect_stdout(sys.stderr))     # their freeze loop prints every name
        main.main()
    optimizer = optimizers[0]
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{"params": [names[id(p)] for p in g["params"]], "lr": g["lr"], "weight_decay": g["weight_decay"],
               "b1": g["b1"], "b2": g["b2"], "e": g["e"], "max_grad_norm": g["max_grad_norm"],
               "schedule": g["schedule"], "warmup": g["warmup"], "t_total": g["t_total"]}
              for g in optimizer.param_groups]
    return {"steps": steps, "groups": groups, **saved}


def _build(task_type: str, clip_file: Path, decoder_dir: Path, out: Path, seed: int):
    """Their model as their init_model builds it (fp32: module doc), every parameter parameter_value(seed, name)."""
    # local: the authors' checkout's modules, importable only inside _authors_code (their folder on sys.path)
    from modules.modeling import CLIP4IDC
    args = _args(task_type, out, clip_file, decoder_dir)
    model = CLIP4IDC.from_pretrained(args.cross_model, args.decoder_model, task_config=args)
    model.float()
    spec = _set_parameters(model, seed)
    return model, spec, args


def _texts(script: str, captions: list[str]) -> list[tuple[np.ndarray, ...]]:
    """Their data loader's own text preparation (``_get_text``) of each caption, on a stand-in loader object."""
    # local: the authors' checkout (see _build)
    from modules.tokenization_clip import SimpleTokenizer
    loader_module = importlib.import_module(f"dataloaders.dataloader_clevr_{script}")
    special = {"CLS_TOKEN": "<|startoftext|>", "SEP_TOKEN": "<|endoftext|>", "MASK_TOKEN": "[MASK]",
               "UNK_TOKEN": "[UNK]", "PAD_TOKEN": "[PAD]"}
    loader = types.SimpleNamespace(max_words=MAX_WORDS, tokenizer=SimpleTokenizer(), SPECIAL_TOKEN=special)
    return [loader_module.CLEVR_DataLoader._get_text(loader, 0, c) for c in captions]


def _long(arrays) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays)).long()


def _trace_adapt(tmp: Path, clip_file: Path, decoder_dir: Path, seed: int, pixels: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(seed + 11)
    x = normalised(pixels).view(SCENES, 3, 1, *pixels.shape[1:])       # [scene, default/sc/nsc, 1, 3, S, S]
    captions = [scene_captions(s)[0] for s in range(SCENES)]
    text = _texts("retrieval", captions)
    scenes = torch.stack([torch.randperm(SCENES, generator=g)[:ADAPT_BATCH] for _ in range(STEPS)])
    # their loader: with probability 0.5 the before image is the non-semantic one (drawn here and recorded)
    swap = torch.rand(STEPS, ADAPT_BATCH, generator=g) < 0.5
    batches = []
    for k in range(STEPS):
        sc = scenes[k]
        ids, mask, segment = (_long([text[int(s)][i] for s in sc]) for i in range(3))
        before = torch.where(swap[k].view(-1, 1, 1, 1, 1), x[sc, 2], x[sc, 0])
        batches.append((ids, mask, segment, before, x[sc, 1], torch.ones(len(sc), 2, dtype=torch.long)))
    model, spec, args = _build("retrieval", clip_file, decoder_dir, tmp / "adapt", seed)
    # their CrossEn, called on the similarity matrix and on its transpose: the two loss terms
    terms: list[float] = []
    hook = model.loss_fct.register_forward_hook(lambda m, i, o: terms.append(float(o.detach())))
    try:
        run = _run_main("main_task_retrieval", args, model, batches)
    finally:
        hook.remove()
    steps = run["steps"]
    assert len(steps["forward"]) == STEPS == len(steps["lr"]) == len(steps["grad_norm"]) == len(terms) // 2
    return {
        "spec": spec, "frozen": sorted(set(spec) - set(run["trainable"])), "groups": run["groups"],
        "data": {"pixels": pixels, "captions": captions, "scenes": scenes, "swap": swap,
                 "input_ids": torch.stack([b[0] for b in batches]).int()},
        "steps": {"loss": torch.tensor(steps["forward"]),
                  "t2p": torch.tensor(terms[0::2]), "p2t": torch.tensor(terms[1::2]),
                  "lr": torch.tensor(steps["lr"], dtype=torch.float64),
                  "grad_norm": torch.tensor(steps["grad_norm"])},
        "final": _final(run, spec, seed),
    }


def _trace_caption(tmp: Path, clip_file: Path, decoder_dir: Path, seed: int, pixels: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(seed + 12)
    x = normalised(pixels).view(SCENES, 3, 1, *pixels.shape[1:])
    change = [scene_captions(s) for s in range(SCENES)]
    scenes = torch.stack([torch.randperm(SCENES, generator=g)[:CAPTION_BATCH] for _ in range(STEPS)])
    # their loader's random.choice of a change caption and of a no-change caption per item (recorded)
    pick = torch.randint(0, 2, (STEPS, CAPTION_BATCH, 2), generator=g)
    batches, in_ids = [], []
    for k in range(STEPS):
        sc = scenes[k]
        yes = _texts("caption", [change[int(s)][int(p)] for s, p in zip(sc, pick[k, :, 0])])
        no = _texts("caption", [NO_CHANGE[int(p)] for p in pick[k, :, 1]])
        dummy = [_long([t[i] for t in yes]) for i in range(3)]
        pos = [_long([t[i] for t in yes]) for i in range(3, 6)]
        neg = [_long([t[i] for t in no]) for i in range(3, 6)]
        names = [f"{int(s)}.png" for s in sc]
        batches.append((*dummy, x[sc, 0], x[sc, 1], x[sc, 2], torch.ones(len(sc), 2, dtype=torch.long),
                        *pos, *neg, names))
        # their input and output ids of each pass ([pass, input/output, B, 1, L]; the mask is input != 0)
        in_ids.append(torch.stack([torch.stack([pos[0], pos[2]]), torch.stack([neg[0], neg[2]])]))
    model, spec, args = _build("caption", clip_file, decoder_dir, tmp / "caption", seed)
    run = _run_main("main_task_caption", args, model, batches)
    steps = run["steps"]
    forward = torch.tensor(steps["forward"]).view(STEPS, 2)              # their two passes per step
    assert len(steps["lr"]) == STEPS == len(steps["grad_norm"])
    return {
        "spec": spec, "frozen": sorted(set(spec) - set(run["trainable"])), "groups": run["groups"],
        "data": {"pixels": pixels, "captions": change, "no_change": NO_CHANGE, "scenes": scenes, "pick": pick,
                 "caption_ids": torch.stack(in_ids).int()},
        "steps": {"loss": forward.sum(1), "change": forward[:, 0], "no_change": forward[:, 1],
                  "lr": torch.tensor(steps["lr"], dtype=torch.float64),
                  "grad_norm": torch.tensor(steps["grad_norm"])},
        "final": _final(run, spec, seed),
    }


def _final(run: dict, spec: dict, seed: int) -> dict[str, torch.Tensor]:
    """The trainable parameters the steps moved (their text tower, trained in the caption stage, gets no gradient
    there and stays as it was: left out, and the test checks that the kit has no such part)."""
    init = authors_state(spec, seed)
    return {n: run["state"][n] for n in run["trainable"] if not torch.equal(run["state"][n], init[n])}


def script_arguments(checkout: Path, script: str) -> dict[str, str]:
    """The ``--name value`` arguments of one of their run scripts (scripts/retrieve_clevr.sh, caption_clevr.sh):
    the paper's settings that the traces replace (lr, coef_lr, sizes, steps), for the tests to check against the
    `paper` profile."""
    text = (checkout / "scripts" / script).read_text(encoding="utf-8")
    return {name: value for name, value in re.findall(r"--(\w+)[= ]([^\s\\]+)", text)}


def record_traces(checkout: str | Path, out: str | Path, seed: int = SEED) -> list[Path]:
    """Record both traces (module doc) into ``out``/clip4idc_{adapt,caption}_trace.pt."""
    checkout, out = Path(checkout).resolve(), Path(out)
    if not (checkout / "main_task_retrieval.py").is_file():
        raise FileNotFoundError(f"{checkout} is not a checkout of sushizixin/CLIP4IDC (no main_task_retrieval.py)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _authors_code(checkout), tempfile.TemporaryDirectory() as tmp_name:
            # local: the authors' checkout (see _build)
            from modules.module_clip import CLIP
            tmp = Path(tmp_name)
            clip_file = tmp / "tiny_clip.pt"      # their CLIP.get_config reads the base CLIP from a file
            torch.save(CLIP(**CLIP_SIZES).state_dict(), clip_file)
            decoder_dir = tmp / "decoder-tiny"
            decoder_dir.mkdir()
            (decoder_dir / "decoder_config.json").write_text(json.dumps(DECODER_CONFIG))
            pixels = images(seed)
            meta = {"commit": checkout_commit(checkout), "seed": seed, "clip_sizes": CLIP_SIZES, "n_intra": N_INTRA,
                    "decoder_config": DECODER_CONFIG, "steps": STEPS, "warmup_proportion": WARMUP, "lr": LR,
                    "coef_lr": COEF_LR, "max_words": MAX_WORDS, "precision": "fp32", "processes": 1,
                    "dropout": 0.0}
            for stage, fn in (("adapt", _trace_adapt), ("caption", _trace_caption)):
                torch.manual_seed(seed)
                rec = fn(tmp, clip_file, decoder_dir, seed, pixels)
                path = out / f"clip4idc_{stage}_trace.pt"
                script = "retrieve_clevr.sh" if stage == "adapt" else "caption_clevr.sh"
                paper = script_arguments(checkout, script)
                torch.save({"meta": {**meta, "stage": stage, "script": script, "script_arguments": paper}, **rec},
                           path)
                written.append(path)
    finally:
        torch.set_num_threads(threads)
    return written

