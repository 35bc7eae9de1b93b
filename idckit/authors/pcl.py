"""IDC-PCL parity: record the public code's modules at a tiny size, and convert their weights to the kit's.

``record(checkout, out)`` loads ``clver/`` and ``bird/`` module files of a checkout of the public code
(yaolinli/IDC) by path, builds each model at :data:`SIZES` with a fixed seed on CPU in eval mode, and writes
``pcl_*.pt`` files: the authors' state_dict (their key names), the inputs, and their outputs (captured at the
authors' own return values and, for the similarities, at the cross-entropy their losses call). The kit never
imports the authors' code anywhere else.

:func:`convert_state_dict` maps an authors' state_dict (``clver`` or ``bird`` models, pre-training or fine-tuning)
to the kit's :class:`idckit.models.pcl.PCL` keys at the ``paper`` switches: q/k/v projections fused, the 7-row type
table to the kit's 6 rows (row 0 is never used), the word rows reordered into the kit vocabulary (the authors'
``<CLS>`` row also fills [IMG1]/[IMG2], which no ``shared_cls`` model reads: its MLM head scores them -inf), the
MVCL head's own bias (its weight is tied to the visual projection), the positional buffer dropped (the kit computes
the same table, ``pos_table="public"``, tested against the recording).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from idckit.errors import ConfigError
from idckit.authors import checkout_commit
from idckit.models.pcl import public_sinusoid_table
from idckit.text.vocab import SPECIALS

#: the authors' special words and the kit's names for them
AUTHORS_SPECIALS = {"<PAD>": "[PAD]", "<BOS>": "[BOS]", "<EOS>": "[EOS]", "<UNK>": "[UNK]", "<MASK>": "[MASK]",
                    "<CLS>": "[CLS]"}
#: the recordings' sizes (tiny, so the files stay small)
SIZES = {"d": 32, "heads": 2, "ff": 64, "layers": 2, "regions": 4, "feat": 12, "max_len": 8, "batch": 3, "neg": 3}
#: the recordings' vocabulary in the authors' convention (their fine-tuning code hard-codes BOS = 1, MASK = 5)
RECORDING_VOCAB = {"<PAD>": 0, "<BOS>": 1, "<EOS>": 2, "<UNK>": 3, "<CLS>": 4, "<MASK>": 5,
                   **{w: 6 + i for i, w in enumerate(["the", "a", "cube", "sphere", "red", "blue", "moved",
                                                      "is", "added", "no", "change", "there"])}}
SEED = 0


# -- conversion ------------------------------------------------------------------------------------------------
def kit_words(authors_vocab: Mapping[str, int]) -> list[str]:
    """The kit vocabulary (``Vocab`` words) of an authors' word -> id map: the kit's specials, then the authors'
    other words in their id order."""
    missing = [w for w in AUTHORS_SPECIALS if w not in authors_vocab]
    if missing:
        raise ConfigError(f"the authors' vocabulary lacks {missing}", fix="pass their dict.json (word -> id)")
    ids = sorted(authors_vocab.values())
    if ids != list(range(len(ids))):
        raise ConfigError("the authors' vocabulary ids are not 0..V-1", fix="pass their dict.json unchanged")
    return list(SPECIALS) + sorted((w for w in authors_vocab if w not in AUTHORS_SPECIALS), key=authors_vocab.get)


def authors_ids_of_kit(authors_vocab: Mapping[str, int]) -> torch.LongTensor:
    """[V_kit]: for each kit id the authors' id of the same word ([IMG1]/[IMG2] -> ``<CLS>``)."""
    back = {v: k for k, v in AUTHORS_SPECIALS.items()}
    back["[IMG1]"] = back["[IMG2]"] = "<CLS>"
    return torch.tensor([authors_vocab[back.get(w, w)] for w in kit_words(authors_vocab)])


def kit_ids_of_authors(authors_vocab: Mapping[str, int]) -> torch.LongTensor:
    """[V_authors]: for each authors' id the kit id of the same word (``<CLS>`` -> [CLS])."""
    words = kit_words(authors_vocab)
    index = {w: i for i, w in enumerate(words)}
    out = torch.empty(len(authors_vocab), dtype=torch.long)
    for w, i in authors_vocab.items():
        out[i] = index[AUTHORS_SPECIALS.get(w, w)]
    return out


def _blocks(sd: Mapping[str, torch.Tensor], src: str, dst: str) -> dict[str, torch.Tensor]:
    out = {f"{dst}_in.weight": sd[f"{src}.norm.a_2"], f"{dst}_in.bias": sd[f"{src}.norm.b_2"]}
    i = 0
    while f"{src}.layers.{i}.attn.q_linear.weight" in sd:
        a, b = f"{src}.layers.{i}", f"{dst}.{i}"
        for kind in ("weight", "bias"):
            out[f"{b}.attn.qkv.{kind}"] = torch.cat([sd[f"{a}.attn.{x}_linear.{kind}"] for x in "qkv"], 0)
            out[f"{b}.attn.out.{kind}"] = sd[f"{a}.attn.out.{kind}"]
            out[f"{b}.ffn.0.{kind}"] = sd[f"{a}.feed_forward.w_1.{kind}"]
            out[f"{b}.ffn.3.{kind}"] = sd[f"{a}.feed_forward.w_2.{kind}"]
        for j in (1, 2):
            out[f"{b}.ln{j}.weight"] = sd[f"{a}.sublayer.{j - 1}.norm.a_2"]
            out[f"{b}.ln{j}.bias"] = sd[f"{a}.sublayer.{j - 1}.norm.b_2"]
        i += 1
    return out


def convert_state_dict(authors_sd: Mapping[str, torch.Tensor], authors_vocab: Mapping[str, int]
                       ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(the kit's state_dict at the ``paper`` switches, the kit vocabulary's words) of an authors' model
    (``clver/modules_{pretrain,finetune}.py``, ``bird/modules_{pretrain_bird,pretrain_cub,finetune_bird}.py``),
    in float32. Keys the authors' model lacks (the fine-tuning model has no MVCL head) are absent here too.
    Dropped: the positional buffer (recomputed), the pre-training ITM ``pooler`` ([3d -> 2], unused by the paper's
    tasks), ``aligner`` of a pre-training model (the same)."""
    sd = _Used({k.removeprefix("module."): v.float() if v.is_floating_point() else v for k, v in authors_sd.items()})
    if "word_embedding.weight" not in sd:
        raise ConfigError("not an IDC-PCL state_dict: no 'word_embedding.weight'",
                          fix="pass the authors' checkpoint of clver/ or bird/ (model_state_dict)")
    words = kit_words(authors_vocab)
    if sd["word_embedding.weight"].shape[0] != len(authors_vocab):
        raise ConfigError(f"the checkpoint's vocabulary has {sd['word_embedding.weight'].shape[0]} words, the "
                          f"dict has {len(authors_vocab)}", fix="pass the dict.json the checkpoint was trained with")
    rows = authors_ids_of_kit(authors_vocab)
    d = sd["word_embedding.weight"].shape[1]
    out = {"word.weight": sd["word_embedding.weight"][rows],
           "token_type.weight": sd["position_encoding.type_pe.weight"][1:],
           "project.weight": sd["img_project.0.weight"], "project.bias": sd["img_project.0.bias"],
           "emb_ln.weight": sd["position_encoding.layernorm.a_2"], "emb_ln.bias": sd["position_encoding.layernorm.b_2"],
           "mlm_head.weight": sd["output_layer.weight"][rows], "mlm_head.bias": sd["output_layer.bias"][rows]}
    out.update(_blocks(sd, "single_img_encoder", "single"))
    out.update(_blocks(sd, "double_img_encoder", "pair"))
    out.update(_blocks(sd, "encoder", "cross"))
    sd.used.add("feat_regress.weight")            # tied to the visual projection: the kit has no copy of it
    if "feat_regress.bias" in sd:
        out.update({"mvcl_head.0.weight": sd["feat_regress.net.0.weight"], "mvcl_head.0.bias": sd["feat_regress.net.0.bias"],
                    "mvcl_head.2.weight": sd["feat_regress.net.2.a_2"], "mvcl_head.2.bias": sd["feat_regress.net.2.b_2"],
                    "mvcl_bias": sd["feat_regress.bias"]})
    if "pooler.0.weight" in sd and sd["pooler.0.weight"].shape[1] == 2 * d:      # the fine-tuning judge
        out["judge.weight"], out["judge.bias"] = sd["pooler.0.weight"], sd["pooler.0.bias"]
    if "classifier.0.weight" in sd:                                              # bird/: NABirds heads
        out["classifier.weight"], out["classifier.bias"] = sd["classifier.0.weight"], sd["classifier.0.bias"]
        out["matcher.weight"], out["matcher.bias"] = sd["aligner.0.weight"], sd["aligner.0.bias"]
    # what the paper's tasks never read (the positional buffer the kit recomputes, a pre-training model's ITM pooler
    # and aligner) is dropped; any other key left over (a layer more than the blocks hold, a module the kit does not
    # know) would leave the kit computing another function, so it is refused
    left = sorted(k for k in sd if k not in sd.used and k != "position_encoding.pe"
                  and not k.startswith(("pooler.", "aligner.")))
    if left:
        shown = ", ".join(left[:4]) + (f", ... ({len(left)} in all)" if len(left) > 4 else "")
        raise ConfigError(f"the checkpoint has keys the model has no place for: {shown}",
                          fix="pass an unmodified checkpoint of the public clver/ or bird/ code")
    return out, words


class _Used(dict):
    """A state dict that records which keys were read (``used``): what a conversion left over is refused."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise ConfigError(f"the checkpoint lacks {key!r}, which its other keys imply",
                              fix="pass an unmodified checkpoint of the public clver/ or bird/ code")
        self.used.add(key)
        return super().__getitem__(key)


def paper_config_fields(authors_sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The sizes an authors' state_dict implies (PCLConfig fields other than the data's and the switches)."""
    sd = {k.removeprefix("module."): v for k, v in authors_sd.items()}
    count = lambda src: len({k.split(".")[2] for k in sd if k.startswith(f"{src}.layers.")})
    return {"d_model": sd["word_embedding.weight"].shape[1], "feat_dim": sd["img_project.0.weight"].shape[1],
            "d_ff": sd["encoder.layers.0.feed_forward.w_1.weight"].shape[0],
            "n_layers": count("encoder"), "single_layers": count("single_img_encoder"),
            "pair_layers": count("double_img_encoder"),
            "distractor_head": "pooler.0.weight" in sd and sd["pooler.0.weight"].shape[1] == 2 * sd[
                "word_embedding.weight"].shape[1],
            "n_classes": sd["classifier.0.weight"].shape[0] if "classifier.0.weight" in sd else 0}


def authors_vocab_of_kit(words: Sequence[str]) -> dict[str, int]:
    """The authors' word -> id map of a kit vocabulary: their specials at the ids their fine-tuning code hard-codes
    (:data:`RECORDING_VOCAB`'s first six), then the kit's other words in its order ([IMG1]/[IMG2] have no word of
    their own there: the authors' ``<CLS>`` stands for both)."""
    authors = {a: i for i, a in enumerate(w for w in RECORDING_VOCAB if w in AUTHORS_SPECIALS)}
    kit_specials = set(SPECIALS)
    authors.update({w: len(authors) + i for i, w in enumerate(w for w in words if w not in kit_specials)})
    return authors


def _inverse_blocks(sd: Mapping[str, torch.Tensor], src: str, dst: str) -> dict[str, torch.Tensor]:
    """:func:`_blocks` backwards: the kit's ``{src}_in`` / ``{src}.{i}`` to the authors' ``{dst}.*``."""
    out = {f"{dst}.norm.a_2": sd[f"{src}_in.weight"], f"{dst}.norm.b_2": sd[f"{src}_in.bias"]}
    i = 0
    while f"{src}.{i}.attn.qkv.weight" in sd:
        a, b = f"{dst}.layers.{i}", f"{src}.{i}"
        for kind in ("weight", "bias"):
            for x, part in zip("qkv", sd[f"{b}.attn.qkv.{kind}"].chunk(3, 0)):
                out[f"{a}.attn.{x}_linear.{kind}"] = part
            out[f"{a}.attn.out.{kind}"] = sd[f"{b}.attn.out.{kind}"]
            out[f"{a}.feed_forward.w_1.{kind}"] = sd[f"{b}.ffn.0.{kind}"]
            out[f"{a}.feed_forward.w_2.{kind}"] = sd[f"{b}.ffn.3.{kind}"]
        for j in (1, 2):
            out[f"{a}.sublayer.{j - 1}.norm.a_2"] = sd[f"{b}.ln{j}.weight"]
            out[f"{a}.sublayer.{j - 1}.norm.b_2"] = sd[f"{b}.ln{j}.bias"]
        i += 1
    return out


def authors_state_dict_of_kit(kit_sd: Mapping[str, torch.Tensor], words: Sequence[str],
                              authors_vocab: Mapping[str, int] | None = None
                              ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """:func:`convert_state_dict` backwards: (the authors' state_dict, their word -> id map) of a kit
    :class:`~idckit.models.pcl.PCL` at the ``paper`` switches (``words``: its vocabulary). What the authors' model
    has and the kit's does not is made up as their code would hold it: the type table's never-used row 0 zeros,
    the positional buffer the public table of 200 rows, ``feat_regress.weight`` the visual projection (tied).
    ``authors_vocab`` (default :func:`authors_vocab_of_kit`) fixes their word ids, so a converted checkpoint
    converts back to itself (tests/test_released.py). The kit's [IMG1]/[IMG2] rows are dropped: at
    ``special_tokens="shared_cls"`` the model reads [CLS]'s instead."""
    sd = {k: v.detach().float().clone() for k, v in kit_sd.items()}
    authors_vocab = dict(authors_vocab) if authors_vocab is not None else authors_vocab_of_kit(words)
    if kit_words(authors_vocab) != list(words):
        raise ConfigError("the authors' vocabulary does not hold the kit vocabulary's words in its order",
                          fix="pass the dict.json the kit vocabulary was converted from, or none")
    rows = kit_ids_of_authors(authors_vocab)
    d = sd["word.weight"].shape[1]
    out = {"word_embedding.weight": sd["word.weight"][rows],
           "img_project.0.weight": sd["project.weight"], "img_project.0.bias": sd["project.bias"],
           "position_encoding.pe": public_sinusoid_table(200, d)[None],
           "position_encoding.type_pe.weight": torch.cat([torch.zeros(1, d), sd["token_type.weight"]]),
           "position_encoding.layernorm.a_2": sd["emb_ln.weight"], "position_encoding.layernorm.b_2": sd["emb_ln.bias"]}
    out.update(_inverse_blocks(sd, "single", "single_img_encoder"))
    out.update(_inverse_blocks(sd, "pair", "double_img_encoder"))
    out.update(_inverse_blocks(sd, "cross", "encoder"))
    out["output_layer.weight"], out["output_layer.bias"] = sd["mlm_head.weight"][rows], sd["mlm_head.bias"][rows]
    if "judge.weight" in sd:
        out["pooler.0.weight"], out["pooler.0.bias"] = sd["judge.weight"], sd["judge.bias"]
    if "mvcl_bias" in sd:
        out.update({"feat_regress.weight": sd["project.weight"], "feat_regress.bias": sd["mvcl_bias"],
                    "feat_regress.net.0.weight": sd["mvcl_head.0.weight"],
                    "feat_regress.net.0.bias": sd["mvcl_head.0.bias"],
                    "feat_regress.net.2.a_2": sd["mvcl_head.2.weight"], "feat_regress.net.2.b_2": sd["mvcl_head.2.bias"]})
    if "classifier.weight" in sd:
        out["classifier.0.weight"], out["classifier.0.bias"] = sd["classifier.weight"], sd["classifier.bias"]
        out["aligner.0.weight"], out["aligner.0.bias"] = sd["matcher.weight"], sd["matcher.bias"]
    return out, authors_vocab


#: the PCLConfig switches at which the kit computes the public code's function (the ``paper`` profile's)
PAPER_SWITCHES = {"norm": "public", "input_norm": True, "final_norm": False, "visual_activation": "sigmoid",
                  "scale_words": True, "mvcl_head": "tied", "special_tokens": "shared_cls", "pos_table": "public",
                  "attend_padding": True, "init": "public", "mvcl_negatives": "public",
                  "single_image": "lone", "special_words": "keep"}


# -- recording -------------------------------------------------------------------------------------------------
def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise ConfigError(f"{path} is not a file", path=path, fix="pass a checkout of yaolinli/IDC (--idc)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _CrossEntropySpy:
    """Stands in for ``torch.nn.functional`` inside an authors' module: records every cross_entropy input."""

    def __init__(self, functional):
        self._f, self.calls = functional, []

    def __getattr__(self, name):
        return getattr(self._f, name)

    def cross_entropy(self, logits, target, *args, **kwargs):
        self.calls.append((logits.detach().clone(), target.detach().clone()))
        return self._f.cross_entropy(logits, target, *args, **kwargs)


def _perturb(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Move every parameter off its initial value (LayerNorm gains 1, biases 0) so a missed gain, bias or eps
    shows in the outputs."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


def _decisive(model, f1, f2, caps: torch.Tensor) -> None:
    """Make greedy decoding depend on the images and the step: at random weights the logits share one large
    offset, so every pair would decode the same constant word. The visual projection is scaled up, the type table
    down, and the output bias centred on the mean teacher-forced logits of ``caps``."""
    v = RECORDING_VOCAB
    with torch.no_grad():
        model.img_project[0].weight.mul_(8.0)
        model.position_encoding.type_pe.weight.mul_(0.2)
        label = torch.where(caps != v["<PAD>"], caps, torch.full_like(caps, -1))
        label[:, 0] = -1
        batch = {"img1": f1, "img2": f2, "cap": caps, "cap_label": label, "diff_label": torch.zeros(len(caps)).long()}
        logits = model(batch, compute_loss=False)
        logits = logits[0] if isinstance(logits, tuple) else logits
        model.output_layer.bias.sub_(logits.mean(0))


def _caption(words: list[str], length: int) -> list[int]:
    v = RECORDING_VOCAB
    ids = [v["<BOS>"], *(v[w] for w in words), v["<EOS>"]]
    return ids + [v["<PAD>"]] * (length - len(ids))


def record(checkout: str | Path, out: str | Path) -> list[Path]:
    """Record the public modules of ``checkout`` into ``out`` (``pcl_clver_pretrain.pt``, ``pcl_clver_finetune.pt``,
    ``pcl_bird_pretrain.pt``, ``pcl_bird_cub.pt``, ``pcl_bird_finetune.pt``); returns the files written."""
    checkout, out = Path(checkout), Path(out)
    if not (checkout / "clver" / "modules_pretrain.py").is_file():
        raise ConfigError(f"{checkout} is not a checkout of the public IDC-PCL code (no clver/modules_pretrain.py)",
                          path=checkout, fix="git clone https://github.com/yaolinli/IDC and pass its folder")
    # the public code puts every tensor on the GPU with .cuda(); here everything stays on the CPU
    saved = torch.Tensor.cuda, torch.nn.Module.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    try:
        with torch.no_grad():
            return [*_record_clver(checkout, out), *_record_bird(checkout, out)]
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda = saved


def _inputs(g: torch.Generator, n_images: int = 2) -> dict[str, torch.Tensor]:
    s, v = SIZES, RECORDING_VOCAB
    feats = [torch.randn(s["batch"], s["regions"], s["feat"], generator=g).relu() for _ in range(n_images)]
    caps = torch.tensor([_caption(["the", "red", "cube", "moved"], s["max_len"]),
                         _caption(["there", "is", "no", "change"], s["max_len"]),
                         _caption(["a", "sphere", "added", "blue", "cube", "the"], s["max_len"])])
    return {"features": feats, "cap": caps}


def _mlm_batch(caps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' MLM input: some words [MASK]ed, one [EOS] [MASK]ed, labels -1 elsewhere."""
    v = RECORDING_VOCAB
    cap, label = caps.clone(), torch.full_like(caps, -1)
    for b, i in ((0, 2), (1, 4), (2, 1), (2, 5)):
        label[b, i], cap[b, i] = cap[b, i], v["<MASK>"]
    eos = (caps[1] == v["<EOS>"]).nonzero()[0, 0]
    label[1, eos], cap[1, eos] = v["<EOS>"], v["<MASK>"]
    label[0, 4] = cap[0, 4]                                   # a labelled word left as is (the 10 % case)
    return cap, label


def _negatives(caps: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """[B, 1 + K, L]: each caption, then K shuffled copies of its words (FDA's hard negatives)."""
    v, k = RECORDING_VOCAB, SIZES["neg"]
    groups = []
    for row in caps:
        n = int((row != v["<PAD>"]).sum())
        negs = [row.clone() for _ in range(k)]
        for neg in negs:
            perm = torch.randperm(n - 2, generator=g) + 1
            neg[1:n - 1] = row[perm]
        groups.append(torch.stack([row, *negs]))
    return torch.stack(groups)


def _mvcl_batch(f1, f2, g):
    """The authors' MVCL input: one image per sample with some regions zeroed; the mask [B, 2n]; the originals."""
    b, n, _ = f1.shape
    mask = torch.zeros(b, 2 * n, dtype=torch.bool)
    which = torch.tensor([0, 1, 0])
    for i in range(b):
        regions = torch.randperm(n, generator=g)[:1 + i % 2]
        mask[i, which[i] * n + regions] = True
    label = torch.cat([f1, f2], 1)
    m1, m2 = f1.masked_fill(mask[:, :n, None], 0.0), f2.masked_fill(mask[:, n:, None], 0.0)
    return m1, m2, mask, label


def _hidden_hooks(model, names) -> dict[str, list[torch.Tensor]]:
    captured: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for n in names:
        getattr(model, n).register_forward_hook(lambda mod, inp, outp, n=n: captured[n].append(outp.detach().clone()))
    return captured


def _record_clver(checkout: Path, out: Path) -> tuple[Path, Path]:
    s, v = SIZES, RECORDING_VOCAB
    pre_mod = _load(checkout / "clver" / "modules_pretrain.py", "idc_clver_modules_pretrain")
    fin_mod = _load(checkout / "clver" / "modules_finetune.py", "idc_clver_modules_finetune")
    spy = pre_mod.F = _CrossEntropySpy(pre_mod.F)
    g = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    pre = pre_mod.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"], n_block=s["layers"],
                        img_enc_block=1, vocab_size=len(v), dropout=0.2, max_len=s["max_len"],
                        tasks=["mlm", "mvm_contrst", "fda"], tmp=0.5, CLS=v["<CLS>"]).eval()
    _perturb(pre, g)
    x = _inputs(g)
    f1, f2 = x["features"]
    hidden = _hidden_hooks(pre, ["single_img_encoder", "double_img_encoder", "encoder"])
    rec: dict[str, Any] = {"commit": checkout_commit(checkout), "sizes": dict(s), "vocab": dict(v),
                           "state_dict": {k: t.clone() for k, t in pre.state_dict().items()},
                           "f1": f1, "f2": f2}
    # MLM (under the pre-training layout, mask=None: every token attends to every other, [PAD] included)
    cap, label = _mlm_batch(x["cap"])
    loss, logits = pre({"img1": f1, "img2": f2, "cap": cap, "cap_label": label}, "mlm")
    rec["mlm"] = {"cap": cap, "cap_label": label, "loss": loss, "logits": logits,
                  "hidden": hidden["encoder"][-1], "pair": hidden["double_img_encoder"][-1],
                  "single1": hidden["single_img_encoder"][-2], "single2": hidden["single_img_encoder"][-1]}
    # MVCL (mvm_contrst)
    m1, m2, img_mask, img_label = _mvcl_batch(f1, f2, g)
    spy.calls.clear()
    loss, pred = pre({"img1": m1, "img2": m2, "cap": x["cap"], "cap_label": torch.full_like(x["cap"], -1),
                      "img_mask": img_mask, "img_label": img_label}, "mvm_contrst")
    (sims, _), = spy.calls
    rec["mvcl"] = {"img1": m1, "img2": m2, "cap": x["cap"], "img_mask": img_mask, "img_label": img_label,
                   "loss": loss, "pred": pred, "similarities": sims, "hidden": hidden["encoder"][-1]}
    # FDA: each (pair, caption) a separate joint forward; score = cos(mean(CLS1, CLS2), CLS3)
    caps = _negatives(x["cap"], g)
    spy.calls.clear()
    loss, (avg_pos, avg_neg, acc) = pre({"img1": f1, "img2": f2, "caps": caps}, "fda")
    (scores, _), = spy.calls
    rec["fda"] = {"caps": caps, "tau": pre.fda_tmp, "loss": loss, "logits": scores, "avg_pos": avg_pos,
                  "avg_neg": avg_neg}
    rec["pe"] = pre.position_encoding.pe[0].clone()
    pre_path = out / "pcl_clver_pretrain.pt"
    torch.save(rec, pre_path)

    # fine-tuning: caption logits at every labelled position, judge logits, greedy decoding
    torch.manual_seed(SEED + 1)
    fin = fin_mod.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"], n_block=s["layers"],
                        img_enc_block=1, vocab_size=len(v), dropout=0.2, max_len=s["max_len"] + 2,
                        CLS=v["<CLS>"]).eval()
    _perturb(fin, g)
    _decisive(fin, f1, f2, x["cap"])
    cap, label = _mlm_batch(x["cap"])
    full = torch.where(x["cap"] != v["<PAD>"], x["cap"], torch.full_like(x["cap"], -1))
    full[:, 0] = -1
    label = torch.where(label != -1, label, full)              # every word position labelled
    diff = torch.tensor([1, 0, 1])
    batch = {"img1": f1, "img2": f2, "cap": cap, "cap_label": label, "diff_label": diff}
    logits, judge = fin(batch, compute_loss=False)
    mlm_loss, judge_loss = fin(batch, compute_loss=True)
    tokens = fin.greedy(f1, f2)
    fin_path = out / "pcl_clver_finetune.pt"
    torch.save({"commit": rec["commit"], "sizes": dict(s), "vocab": dict(v), "max_len": fin.max_len,
                "state_dict": {k: t.clone() for k, t in fin.state_dict().items()}, "f1": f1, "f2": f2,
                "cap": cap, "cap_label": label, "diff_label": diff, "logits": logits, "judge_logits": judge,
                "mlm_loss": mlm_loss, "judge_loss": judge_loss, "greedy": tokens}, fin_path)
    return pre_path, fin_path


def _record_bird(checkout: Path, out: Path) -> list[Path]:
    s, v = SIZES, RECORDING_VOCAB
    common = dict(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"], n_block=s["layers"],
                  vocab_size=len(v), dropout=0.2, max_len=s["max_len"], CLS=v["<CLS>"])
    g = torch.Generator().manual_seed(SEED + 10)
    x = _inputs(g)
    f1, f2 = x["features"]
    commit = checkout_commit(checkout)
    paths = []

    # the FGVC stage (NABirds) of bird/pretrain.py: heads on the image encoders alone, and its three losses
    mod = _load(checkout / "bird" / "modules_pretrain_bird.py", "idc_bird_modules_pretrain")
    spy = mod.F = _CrossEntropySpy(mod.F)
    torch.manual_seed(SEED + 2)
    model = mod.Model(se_block=1, de_block=1, tasks=["mlm", "mvm_contrst", "fda"], **common).eval()
    _perturb(model, g)
    class1, class2 = torch.tensor([3, 7, 3]), torch.tensor([3, 5, 7])
    batch = {"img1": f1, "img2": f2, "class1": class1, "class2": class2, "label": (class1 == class2).long()}
    total, _ = model.nabirds_forward(batch, compute_loss=True)
    contrast, class_logits, class_labels, match_logits, match_labels = model.nabirds_forward(batch, compute_loss=False)
    spy.calls.clear()
    cap, label = _mlm_batch(x["cap"])
    mlm_loss, mlm_logits = model({"img1": f1, "img2": f2, "cap": cap, "cap_label": label}, "mlm")
    caps = _negatives(x["cap"], g)
    fda_loss, _ = model({"img1": f1, "img2": f2, "caps": caps}, "fda")
    (fda_scores, _), = spy.calls[-1:]
    path = out / "pcl_bird_pretrain.pt"
    torch.save({"commit": commit, "sizes": dict(s), "vocab": dict(v), "n_classes": model.num_classes,
                "state_dict": {k: t.clone() for k, t in model.state_dict().items()}, "f1": f1, "f2": f2,
                "class1": class1, "class2": class2, "fgvc_loss": total, "fgvc_contrast": contrast,
                "class_logits": class_logits, "class_labels": class_labels, "match_logits": match_logits,
                "match_labels": match_labels, "mlm": {"cap": cap, "cap_label": label, "loss": mlm_loss,
                                                      "logits": mlm_logits},
                "fda": {"caps": caps, "loss": fda_loss, "logits": fda_scores}}, path)
    paths.append(path)

    # the GIC stage (CUB) of bird/pretrain_cub.py: one image, [CLS1, img, CLS2, CLS3, text]
    mod = _load(checkout / "bird" / "modules_pretrain_cub.py", "idc_bird_modules_pretrain_cub")
    spy = mod.F = _CrossEntropySpy(mod.F)
    torch.manual_seed(SEED + 3)
    model = mod.Model(tasks=["mlm", "mvm_contrst", "fda"], **common).eval()
    _perturb(model, g)
    mlm_loss, mlm_logits = model({"img": f1, "cap": cap, "cap_label": label}, "mlm")
    img_mask = torch.zeros(s["batch"], s["regions"], dtype=torch.bool)
    img_mask[0, 1] = img_mask[1, 0] = img_mask[1, 3] = img_mask[2, 2] = True
    spy.calls.clear()
    mvcl_loss, mvcl_pred = model({"img": f1.masked_fill(img_mask[..., None], 0.0), "cap": x["cap"],
                                  "cap_label": torch.full_like(x["cap"], -1), "img_mask": img_mask,
                                  "img_label": f1}, "mvm_contrst")
    (mvcl_sims, _), = spy.calls
    spy.calls.clear()
    fda_loss, _ = model({"img": f1, "caps": caps}, "fda")
    (fda_scores, _), = spy.calls
    path = out / "pcl_bird_cub.pt"
    torch.save({"commit": commit, "sizes": dict(s), "vocab": dict(v),
                "state_dict": {k: t.clone() for k, t in model.state_dict().items()}, "f1": f1,
                "mlm": {"cap": cap, "cap_label": label, "loss": mlm_loss, "logits": mlm_logits},
                "mvcl": {"cap": x["cap"], "img_mask": img_mask, "loss": mvcl_loss, "pred": mvcl_pred,
                         "similarities": mvcl_sims},
                "fda": {"caps": caps, "loss": fda_loss, "logits": fda_scores}}, path)
    paths.append(path)

    # the paragraph model (bird/modules_finetune_bird.py): teacher-forced logits and greedy decoding
    mod = _load(checkout / "bird" / "modules_finetune_bird.py", "idc_bird_modules_finetune")
    torch.manual_seed(SEED + 4)
    common["max_len"] = s["max_len"] + 2
    model = mod.Model(se_block=1, de_block=1, **common).eval()
    _perturb(model, g)
    _decisive(model, f1, f2, x["cap"])
    full = torch.where(x["cap"] != v["<PAD>"], x["cap"], torch.full_like(x["cap"], -1))
    full[:, 0] = -1
    logits = model({"img1": f1, "img2": f2, "cap": x["cap"], "cap_label": full}, compute_loss=False)
    tokens = model.greedy(f1, f2)
    path = out / "pcl_bird_finetune.pt"
    torch.save({"commit": commit, "sizes": dict(s), "vocab": dict(v), "max_len": model.max_len,
                "state_dict": {k: t.clone() for k, t in model.state_dict().items()}, "f1": f1, "f2": f2,
                "cap": x["cap"], "cap_label": full, "logits": logits, "greedy": tokens}, path)
    paths.append(path)
    return paths


# -- training trace ------------------------------------------------------------------------------------------------
#: the fine-tuning trace: K optimiser steps, each on its own batch of TRACE_BATCH samples
TRACE_STEPS, TRACE_BATCH = 6, 4
#: where ``get_lr_sched(step, args, pretrain=False)`` is sampled over the whole run (0 .. total_train_steps + 1):
#: every step where it changes, and its neighbours
TRACE_SCHEDULE_STEPS = (0, 1, 9998, 9999, 10000, 10001, 19999, 20000, 20001, 50000, 100000, 100001)


def grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """The 2-norm over every gradient after backward, as a trace stores it per step."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in grads]))


def group_lrs(optim: torch.optim.Optimizer) -> torch.Tensor:
    """Each parameter group's lr as the step will use it."""
    return torch.tensor([group["lr"] for group in optim.param_groups], dtype=torch.float64)


def _authors_args(checkout: Path, stage: str, config: str):
    """The ``args`` of an authors' script as their ``para.parse_args`` builds it from their config file, and their
    ``utils`` module (both read ``sys.argv`` when imported: the script's command line is given to them)."""
    folder = checkout / stage
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [f"{stage}/finetune.py", "--dataset", stage, "--exp_name", "trace", "--mode", "train",
                "--config", str(folder / "config" / config)]
    sys.path.insert(0, str(folder))
    try:
        para = _load(folder / "para.py", f"idc_{stage}_para")
        utils = _load(folder / "utils.py", f"idc_{stage}_utils")
        return para.parse_args(), utils
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _trace_batch(g: torch.Generator) -> dict[str, torch.Tensor]:
    """One fine-tuning batch as the authors' ``dataset_finetune_clver`` yields it: features (float16 values, as the
    kit stores them), the masked caption, its labels (-1 where nothing is predicted) and ``diff_label`` [B, 1]."""
    s, v = SIZES, RECORDING_VOCAB
    words = [w for w in v if w not in AUTHORS_SPECIALS]
    b, n = TRACE_BATCH, s["regions"]
    f1, f2 = (torch.randn(b, n, s["feat"], generator=g).relu().half().float() for _ in range(2))
    caps = torch.tensor([_caption([words[int(i)] for i in torch.randint(len(words), (int(k),), generator=g)],
                                  s["max_len"] + 2) for k in torch.randint(2, s["max_len"] - 1, (b,), generator=g)])
    cap, label = caps.clone(), torch.full_like(caps, -1)
    for i, row in enumerate(caps):
        n_words = int((row != v["<PAD>"]).sum()) - 2
        chosen = torch.randperm(n_words, generator=g)[:max(1, n_words // 3)] + 1
        label[i, chosen] = row[chosen]
        cap[i, chosen[:-1]] = v["<MASK>"]                 # the last chosen word stays as is (BERT's 10 % case)
        if i % 2 == 0:                                    # the [EOS] masked and labelled, as eos_prob does
            eos = n_words + 1
            label[i, eos], cap[i, eos] = v["<EOS>"], v["<MASK>"]
    diff = (torch.rand(b, generator=g) < 0.5).long()[:, None]
    return {"img1": f1, "img2": f2, "cap": cap, "cap_label": label, "diff_label": diff}


def record_finetune_trace(checkout: str | Path, out: str | Path) -> Path:
    """``pcl_clver_finetune_trace.pt``: TRACE_STEPS optimiser steps of the authors' ``clver/`` fine-tuning at
    :data:`SIZES`, from their model (``modules_finetune.Model``, weights perturbed off their initialisation), with
    their loss (``mlm_loss.sum() + itm_loss.sum()``), their optimiser (``torch.optim.Adam`` with their config's
    ``lr`` and ``weight_decay``) and their lr schedule (``utils.get_lr_sched(global_step, args, pretrain=False)``),
    in the order ``clver/finetune.py:137-165`` calls them (train mode, zero_grad, forward, sum, backward, set every
    group's lr, step). Dropout is off (``dropout=0.0``): its masks cannot be replayed by another implementation.
    The batches are recorded (the MLM masks fixed in them). Stored per step: each loss term, the total, every
    group's lr, the gradient norm (2-norm over all gradients, after backward); the initial and the final
    state_dict; and the schedule at :data:`TRACE_SCHEDULE_STEPS` (no warm-up in fine-tuning: its decays at 10k and
    20k lie past any short trace, so they are checked there)."""
    checkout, out = Path(checkout), Path(out)
    args, utils = _authors_args(checkout, "clver", "finetune_clver.json")
    if args.l2_wd > 0:
        raise ConfigError("the trace assumes the public config's l2_wd 0", fix="record from an unmodified checkout")
    s, v = SIZES, RECORDING_VOCAB
    fin_mod = _load(checkout / "clver" / "modules_finetune.py", "idc_clver_modules_finetune")
    g = torch.Generator().manual_seed(SEED + 20)
    torch.manual_seed(SEED + 20)
    saved = torch.Tensor.cuda, torch.nn.Module.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    try:
        model = fin_mod.Model(ff_dim=s["ff"], img_embs=s["feat"], n_hidden=s["d"], n_head=s["heads"],
                              n_block=s["layers"], img_enc_block=1, vocab_size=len(v), dropout=0.0,
                              max_len=s["max_len"] + 2, CLS=v["<CLS>"])
        _perturb(model, g)
        init = {k: t.detach().clone() for k, t in model.state_dict().items()}
        optim = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr,
                                 weight_decay=args.weight_decay)
        batches, steps = [], []
        for global_step in range(TRACE_STEPS):
            batch = _trace_batch(g)
            batches.append(batch)
            model.train()
            model.zero_grad()
            mlm_loss, itm_loss = model(batch, compute_loss=True)
            mlm_loss, itm_loss = mlm_loss.sum(), itm_loss.sum()
            loss = mlm_loss + itm_loss
            loss.backward()
            lr_this_step = utils.get_lr_sched(global_step, args, pretrain=False)
            for group in optim.param_groups:
                group["lr"] = lr_this_step
            steps.append({"mlm": mlm_loss.detach(), "judge": itm_loss.detach(), "loss": loss.detach(),
                          "lr": group_lrs(optim), "grad_norm": grad_norm(model)})
            optim.step()
        final = {k: t.detach().clone() for k, t in model.state_dict().items()}
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda = saved
    schedule = torch.tensor([utils.get_lr_sched(i, args, pretrain=False) for i in TRACE_SCHEDULE_STEPS],
                            dtype=torch.float64)
    stacked = {k: torch.stack([st[k] for st in steps]) for k in steps[0]}
    path = out / "pcl_clver_finetune_trace.pt"
    torch.save({"commit": checkout_commit(checkout), "sizes": dict(s), "vocab": dict(v), "max_len": model.max_len,
                "dropout": 0.0, "config": {"lr": args.lr, "weight_decay": args.weight_decay,
                                           "total_train_steps": args.total_train_steps},
                "batches": {k: torch.stack([b[k] for b in batches]) for k in batches[0]},
                "init": init, "final": final, "steps": stacked,
                "schedule": {"steps": torch.tensor(TRACE_SCHEDULE_STEPS), "lr": schedule}}, path)
    return path
