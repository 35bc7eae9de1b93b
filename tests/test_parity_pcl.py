"""IDC-PCL parity: the kit's PCL at the ``paper`` profile computes what the public code (yaolinli/IDC) computes.

Each test loads a recording of the authors' modules (tests/parity/pcl_*.pt, made by ``python -m idckit.authors
record --idc CHECKOUT``: their weights, inputs and outputs), converts the weights with
:func:`idckit.authors.pcl.convert_state_dict`, builds the kit's model through ``model_config("pcl-paper")`` and
asserts the same numbers (fp32, 1e-5 of their scale) and the same decoded tokens. A missing recording fails. The second half shows
that each switch of :class:`idckit.models.pcl.PCLConfig` changes exactly what it says.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from idckit.experiments.config import load_config, model_config
from idckit.losses import class_contrastive, fda_nce, fgvc_loss, judge_loss, mlm_loss, mvcl_logits, mvcl_nce
from idckit.models.decoding import greedy_decode
from idckit.models.pcl import PCL, SWITCHES, StdLayerNorm, public_sinusoid_table, sinusoid_table
from idckit.authors import pcl as parity
from idckit.text.vocab import Vocab
from numeric import assert_close, assert_differ

RECORDINGS = Path(__file__).parent / "parity"
RTOL = 1e-5          # of the output's scale (tests/numeric.py): float32 rounding of any BLAS is ~1e-6 of it


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def recording(name: str) -> dict:
    path = RECORDINGS / f"pcl_{name}.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with python -m idckit.authors record --idc CHECKOUT --out "
                    f"tests/parity/ (docs/parity.md)")
    return torch.load(path, weights_only=True)


def kit_model(rec: dict, family: str = "pcl", **fields) -> tuple[PCL, torch.LongTensor, torch.LongTensor]:
    """(the kit's model at ``<family>-paper`` holding the recording's converted weights, kit id of each authors'
    id, authors' id of each kit id)."""
    sd, words = parity.convert_state_dict(rec["state_dict"], rec["vocab"])
    s = rec["sizes"]
    sizes = {k: v for k, v in parity.paper_config_fields(rec["state_dict"]).items()}
    cfg = model_config(f"{family}-paper", vocab_size=len(words), n_regions=s["regions"], n_heads=s["heads"],
                       max_text_len=rec.get("max_len", s["max_len"]), **{**sizes, **fields})
    model = PCL(cfg, Vocab(words)).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith("mvcl_") for k in missing), (missing, unexpected)
    return model, parity.kit_ids_of_authors(rec["vocab"]), parity.authors_ids_of_kit(rec["vocab"])


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert_close(a.float(), b.float(), rtol=RTOL, what="kit vs authors")


# -- the profile ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["pcl", "pcl-birds"])
def test_paper_profile_holds_the_public_switches_and_cpu_smoke_the_kits(family):
    sizes = dict(vocab_size=20, feat_dim=12, n_regions=4)
    paper = model_config(f"{family}-paper", **sizes)
    assert {k: getattr(paper, k) for k in SWITCHES} == parity.PAPER_SWITCHES
    kit = {"visual_activation": "none", "norm": "torch", "input_norm": False, "final_norm": True,
           "scale_words": False, "mvcl_head": "untied", "special_tokens": "distinct", "pos_table": "vaswani",
           "attend_padding": False, "init": "kit", "mvcl_negatives": "paper",
           "single_image": "blank", "special_words": "drop"}
    for profile in ("cpu", "smoke"):
        cfg = model_config(f"{family}-{profile}", **sizes)
        assert {k: getattr(cfg, k) for k in SWITCHES} == kit, profile


def test_recordings_name_the_authors_commit():
    for name in ("clver_pretrain", "clver_finetune", "bird_pretrain", "bird_cub", "bird_finetune"):
        assert recording(name)["commit"].startswith("6f3aabf"), name


# -- clver/: pre-training -----------------------------------------------------------------------------------------
def test_positional_table_is_the_public_one():
    rec = recording("clver_pretrain")
    model, _, _ = kit_model(rec)
    close(model.pe[:len(rec["pe"])], rec["pe"])
    assert (sinusoid_table(200, rec["sizes"]["d"]) - rec["pe"]).abs().max() > 1.0     # the corrected one is not


def test_pretraining_encoders_and_mlm_logits():
    rec = recording("clver_pretrain")
    model, k_of_a, _ = kit_model(rec, distractor_head=False)
    mlm = rec["mlm"]
    with torch.no_grad():
        single, pair = model.encode_images(rec["f1"], rec["f2"])
        out = model(rec["f1"], rec["f2"], k_of_a[mlm["cap"]], mode="pretrain")
        keep = mlm["cap_label"] != -1
        logits = model.mlm_logits(out.text[keep])[:, k_of_a]
    close(single[:, 0], mlm["single1"][:, 0])
    close(single[:, 1], mlm["single2"][:, 0])
    close(pair, mlm["pair"])
    close(torch.cat([out.visual, out.cls[:, None], out.text], 1), mlm["hidden"])
    close(logits, mlm["logits"])
    labels = mlm["cap_label"][keep]
    close(mlm_loss(logits, labels, "sum"), mlm["loss"].sum())
    close(mlm_loss(logits, labels), mlm["loss"].mean())


def test_mvcl_regression_similarities_and_loss():
    rec = recording("clver_pretrain")
    model, k_of_a, _ = kit_model(rec, distractor_head=False)
    mv = rec["mvcl"]
    n = rec["sizes"]["regions"]
    regions = mv["img_mask"].view(-1, 2, n)
    originals = mv["img_label"].view(-1, 2, n, rec["sizes"]["feat"])
    with torch.no_grad():
        out = model(originals[:, 0], originals[:, 1], k_of_a[mv["cap"]], mode="pretrain", region_mask=regions)
        visual = torch.stack([out.visual[:, 1:1 + n], out.visual[:, 2 + n:2 + 2 * n]], 1)
        pred = model.mvcl_regress(visual[regions])
        negatives = model.mvcl_regress(visual[~regions])
        logits, labels = mvcl_logits(pred, originals[regions], negatives, 1.0, in_batch_targets=True)
        loss = mvcl_nce(pred, originals[regions], negatives, 1.0, "sum", in_batch_targets=True)
    close(out.visual[:, 1:1 + n], mv["hidden"][:, 1:1 + n])
    close(pred, mv["pred"])
    close(logits, mv["similarities"])
    close(loss, mv["loss"].sum())
    assert torch.equal(labels, torch.arange(len(pred)))


def test_fda_scores_and_loss():
    rec = recording("clver_pretrain")
    model, k_of_a, _ = kit_model(rec, distractor_head=False)
    fda = rec["fda"]
    b, g, length = fda["caps"].shape
    with torch.no_grad():
        out = model(rec["f1"].repeat_interleave(g, 0), rec["f2"].repeat_interleave(g, 0),
                    k_of_a[fda["caps"].view(-1, length)], mode="pretrain")
        scores = model.fda_similarity(out).view(b, g)
    close(scores / fda["tau"], fda["logits"])
    close(fda_nce(scores[:, 0], scores[:, 1:], fda["tau"]), fda["loss"])


# -- clver/: fine-tuning and decoding -----------------------------------------------------------------------------
def test_finetuning_caption_and_judge_logits():
    rec = recording("clver_finetune")
    model, k_of_a, _ = kit_model(rec)
    with torch.no_grad():
        out = model(rec["f1"], rec["f2"], k_of_a[rec["cap"]], mode="finetune")
        keep = rec["cap_label"] != -1
        logits = model.mlm_logits(out.text[keep])[:, k_of_a]
        judge = model.judge_logits(out)
    close(logits, rec["logits"])
    close(judge, rec["judge_logits"])
    close(mlm_loss(logits, rec["cap_label"][keep], "sum"), rec["mlm_loss"].sum())
    close(judge_loss(judge, rec["diff_label"], "sum"), rec["judge_loss"].sum())


def _authors_tokens(model, rec, a_of_k) -> torch.Tensor:
    """The kit's greedy tokens in the authors' ids and layout: [BOS] then max_len - 1 words, cut at [EOS]."""
    tokens = greedy_decode(model, (rec["f1"], rec["f2"]), rec["max_len"] - 1)
    return torch.cat([torch.full((len(tokens), 1), rec["vocab"]["<BOS>"]), a_of_k[tokens]], 1)


def _cut(tokens: torch.Tensor, eos: int) -> list[list[int]]:
    rows = []
    for row in tokens.tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def test_greedy_decoding_equals_the_public_greedy():
    rec = recording("clver_finetune")
    model, _, a_of_k = kit_model(rec)
    eos = rec["vocab"]["<EOS>"]
    assert _cut(_authors_tokens(model, rec, a_of_k), eos) == _cut(rec["greedy"], eos)
    assert len({tuple(r) for r in rec["greedy"].tolist()}) > 1       # the recording is no constant caption


# -- bird/ --------------------------------------------------------------------------------------------------------
def test_fgvc_heads_and_losses():
    rec = recording("bird_pretrain")
    model, k_of_a, _ = kit_model(rec, family="pcl-birds")
    assert model.cfg.n_classes == rec["n_classes"] == 555
    labels = torch.stack([rec["class1"], rec["class2"]], 1)
    with torch.no_grad():
        classes, match, single = model.fgvc_logits(rec["f1"], rec["f2"])
        total, parts = fgvc_loss(classes, match, single, labels)
    close(classes.transpose(0, 1).reshape(-1, classes.shape[-1]), rec["class_logits"])   # theirs: images 1, then 2
    close(match, rec["match_logits"])
    close(parts["fgvc_contrast"], rec["fgvc_contrast"])
    close(class_contrastive(single.transpose(0, 1).flatten(0, 1), rec["class_labels"]), rec["fgvc_contrast"])
    close(total, rec["fgvc_loss"])


def test_birds_pretraining_mlm_and_fda():
    rec = recording("bird_pretrain")
    model, k_of_a, _ = kit_model(rec, family="pcl-birds")
    mlm, fda = rec["mlm"], rec["fda"]
    b, g, length = fda["caps"].shape
    with torch.no_grad():
        out = model(rec["f1"], rec["f2"], k_of_a[mlm["cap"]], mode="pretrain")
        logits = model.mlm_logits(out.text[mlm["cap_label"] != -1])[:, k_of_a]
        out = model(rec["f1"].repeat_interleave(g, 0), rec["f2"].repeat_interleave(g, 0),
                    k_of_a[fda["caps"].view(-1, length)], mode="pretrain")
        scores = model.fda_similarity(out).view(b, g)
    close(logits, mlm["logits"])
    close(scores, fda["logits"])                                      # bird/'s FDA temperature is fixed at 1
    close(fda_nce(scores[:, 0], scores[:, 1:], 1.0), fda["loss"])


def test_paragraph_model_logits_and_greedy_decoding():
    rec = recording("bird_finetune")
    model, k_of_a, a_of_k = kit_model(rec, family="pcl-birds")
    with torch.no_grad():
        out = model(rec["f1"], rec["f2"], k_of_a[rec["cap"]], mode="finetune")
        logits = model.mlm_logits(out.text[rec["cap_label"] != -1])[:, k_of_a]
    close(logits, rec["logits"])
    eos = rec["vocab"]["<EOS>"]
    assert _cut(_authors_tokens(model, rec, a_of_k), eos) == _cut(rec["greedy"], eos)


def test_cub_stage_lone_image_layout_mlm_mvcl_fda():
    """The GIC (CUB) stage's model: one image, [IMG1, regions, IMG2] (``single_image="lone"``, f2 None)."""
    rec = recording("bird_cub")
    model, k_of_a, _ = kit_model(rec, family="pcl-birds")
    mlm, mv, fda = rec["mlm"], rec["mvcl"], rec["fda"]
    n = rec["sizes"]["regions"]
    with torch.no_grad():
        out = model(rec["f1"], None, k_of_a[mlm["cap"]], mode="pretrain")
        logits = model.mlm_logits(out.text[mlm["cap_label"] != -1])[:, k_of_a]
        masked = mv["img_mask"]
        out = model(rec["f1"], None, k_of_a[mv["cap"]], mode="pretrain",
                    region_mask=torch.stack([masked, torch.zeros_like(masked)], 1))
        visual = out.visual[:, 1:1 + n]
        pred = model.mvcl_regress(visual[masked])
        sims, _ = mvcl_logits(pred, rec["f1"][masked], model.mvcl_regress(visual[~masked]), 1.0, in_batch_targets=True)
        b, g, length = fda["caps"].shape
        out = model(rec["f1"].repeat_interleave(g, 0), None, k_of_a[fda["caps"].view(-1, length)], mode="pretrain")
        scores = model.fda_similarity(out).view(b, g)
    assert out.visual.shape[1] == 2 + n
    close(logits, mlm["logits"])
    close(mlm_loss(logits, mlm["cap_label"][mlm["cap_label"] != -1], "sum"), mlm["loss"].sum())
    close(pred, mv["pred"])
    close(sims, mv["similarities"])
    close(F.cross_entropy(sims, torch.arange(len(sims)), reduction="none"), mv["loss"])
    close(scores, fda["logits"])
    close(fda_nce(scores[:, 0], scores[:, 1:], 1.0), fda["loss"])


def test_switch_single_image_lone_drops_the_blank_image_from_the_pretraining_task():
    """At "lone" a batch of single-image captions runs as [IMG1, regions, IMG2]; at "blank" the same batch runs with
    49 zero regions as its second image, a different function; a batch mixing both is refused."""
    from ddp_worker import MODEL, PRETRAIN, tiny_pcl_data
    from idckit.errors import ConfigError
    from idckit.tasks.pcl import PretrainTask

    data = tiny_pcl_data()
    blank = len(data.features)
    data.features = torch.cat([data.features, torch.zeros_like(data.features[:1])])
    data.blank_row = blank
    data.splits["train"].after[:] = blank                       # every train pair: a single-image caption
    seen = {}
    for layout in ("lone", "blank"):
        task = PretrainTask(data, {**MODEL, "single_image": layout}, batch_size=6, ratios={"mlm": 1, "mvcl": 1},
                            **PRETRAIN)
        torch.manual_seed(0)
        model = task.build_model().eval()
        calls = []
        model.register_forward_pre_hook(lambda mod, args: calls.append(args[1] is None))
        with torch.no_grad():
            for batch in task.batches(0, torch.Generator().manual_seed(0)):
                loss, _ = task.train_step(model, batch, 0)
                assert math.isfinite(float(loss))
        seen[layout] = set(calls)
    assert seen == {"lone": {True}, "blank": {False}}
    data.splits["train"].after[0] = data.splits["train"].before[1]           # one real pair among them
    task = PretrainTask(data, {**MODEL, "single_image": "lone"}, batch_size=len(data.splits["train"].sample_pair),
                        ratios={"mlm": 1}, **PRETRAIN)
    with pytest.raises(ConfigError, match="mixes single-image captions"):
        task.train_step(task.build_model(), next(iter(task.batches(0, torch.Generator().manual_seed(0)))), 0)


# -- the switches: each changes exactly what it says --------------------------------------------------------------
def tiny(seed: int = 0, **switches) -> PCL:
    """A small paper-profile model with ``switches`` flipped, every parameter drawn from one seed (so two models
    built with different switches share every parameter they have in common)."""
    vocab = Vocab.build(["the red cube moved", "no change", "a blue sphere was added"])
    cfg = model_config("pcl-paper", vocab_size=len(vocab), feat_dim=12, n_regions=4, d_model=32, n_heads=2, d_ff=64,
                       n_layers=2, max_text_len=10, **switches)
    torch.manual_seed(seed)
    m = PCL(cfg, vocab).eval()
    with torch.no_grad():
        for name, p in sorted(m.named_parameters()):
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if "ln" in name or
                    name.endswith("_in.weight") else 0.0))
    return m


def inputs(b=3, pad_to=10):
    g = torch.Generator().manual_seed(1)
    f1, f2 = torch.randn(b, 4, 12, generator=g).relu(), torch.randn(b, 4, 12, generator=g).relu()
    vocab = Vocab.build(["the red cube moved", "no change", "a blue sphere was added"])
    ids = vocab.encode_batch(["the red cube moved", "no change", "a blue sphere was added"][:b], pad_to)
    return f1, f2, ids


def run(m: PCL, mode="pretrain", ids=None):
    f1, f2, t = inputs()
    with torch.no_grad():
        out = m(f1, f2, t if ids is None else ids, mode=mode)
    return out


def test_switch_pos_table_changes_only_the_table():
    a, b = tiny(), tiny(pos_table="vaswani")
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert_close(b.pe, sinusoid_table(len(b.pe), 32))
    assert_close(a.pe, public_sinusoid_table(len(a.pe), 32))
    b.pe.copy_(a.pe)
    assert_close(run(a).text, run(b).text)


def test_switch_norm_is_the_unbiased_std_formula():
    x = torch.randn(4, 7, 32)
    n = StdLayerNorm(32, 1e-6)
    with torch.no_grad():
        n.weight.uniform_(0.5, 1.5)
        n.bias.normal_()
    want = n.weight * (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=True, keepdim=True).sqrt() + 1e-6) + n.bias
    assert_close(n(x), want)
    a, b = tiny(), tiny(norm="torch")
    assert a.state_dict().keys() == b.state_dict().keys()       # a converted checkpoint loads at either
    assert isinstance(a.emb_ln, StdLayerNorm) and a.emb_ln.eps == 1e-12 and a.cross[0].ln1.eps == 1e-6
    assert isinstance(b.emb_ln, torch.nn.LayerNorm) and b.emb_ln.eps == 1e-5
    assert_differ(run(a).text, run(b).text, rtol=1e-4)


def test_switch_input_norm_normalises_each_stacks_input():
    a, b = tiny(), tiny(input_norm=False)
    assert set(a.state_dict()) - set(b.state_dict()) == {f"{s}_in.{p}" for s in ("single", "pair", "cross")
                                                         for p in ("weight", "bias")}
    assert set(b.state_dict()) <= set(a.state_dict())
    # b with a's input norms put in front of its first block of each stack computes a
    for stack in ("single", "pair", "cross"):
        norm = getattr(a, f"{stack}_in")
        getattr(b, stack)[0].register_forward_pre_hook(lambda mod, args, norm=norm: (norm(args[0]), *args[1:]))
    assert_close(run(a).text, run(b).text)
    assert_close(run(a, "finetune").visual, run(b, "finetune").visual)


def test_switch_final_norm_normalises_what_the_heads_read():
    a, b = tiny(final_norm=True), tiny()
    assert set(a.state_dict()) - set(b.state_dict()) == {"ln_f.weight", "ln_f.bias"}
    oa, ob = run(a), run(b)
    with torch.no_grad():
        assert_close(oa.text, a.ln_f(ob.text))
        assert_close(oa.visual, a.ln_f(ob.visual))


def test_switch_scale_words_multiplies_text_words_by_sqrt_d():
    a, b = tiny(), tiny(scale_words=False)
    with torch.no_grad():
        special = torch.tensor([b.img1_id, b.img2_id, b.cls_id])     # the specials stay unscaled
        keep = b.word.weight[special].clone()
        b.word.weight.mul_(math.sqrt(32))
        b.word.weight[special] = keep
    assert_close(run(a).text, run(b).text)


def test_switch_visual_activation_is_a_sigmoid_after_the_projection():
    a, b = tiny(), tiny(visual_activation="none")
    b.project.register_forward_hook(lambda mod, args, out: torch.sigmoid(out))
    assert_close(run(a).visual, run(b).visual)


def test_switch_mvcl_head_ties_the_output_layer_to_the_projection():
    a, b = tiny(), tiny(mvcl_head="untied")
    assert set(a.state_dict()) ^ set(b.state_dict()) == {"mvcl_bias", "mvcl_head.3.weight", "mvcl_head.3.bias"}
    h = torch.randn(5, 32)
    with torch.no_grad():
        b.mvcl_head[3].weight.copy_(a.project.weight.t())
        b.mvcl_head[3].bias.copy_(a.mvcl_bias)
        assert_close(a.mvcl_regress(h), b.mvcl_regress(h))
    assert_close(run(a).text, run(b).text)               # nothing else differs


def test_switch_special_tokens_shares_the_cls_word():
    a, b = tiny(), tiny(special_tokens="distinct")
    assert (a.img1_id, a.img2_id) == (a.cls_id, a.cls_id) and len({b.img1_id, b.img2_id, b.cls_id}) == 3
    before = run(a).visual
    with torch.no_grad():
        a.word.weight[[b.img1_id, b.img2_id]] += 1.0                     # rows the shared layout never reads
    assert_close(run(a).visual, before)
    with torch.no_grad():
        b.word.weight[[b.img1_id, b.img2_id]] = a.word.weight[a.cls_id]
    assert_close(run(a).text, run(b).text)


def test_switch_attend_padding_lets_pad_change_pretraining_only():
    a, b = tiny(), tiny(attend_padding=False)
    f1, f2, ids = inputs(pad_to=10)
    longer = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], 1)    # the same captions, padded further
    with torch.no_grad():
        for m, moves in ((a, True), (b, False)):
            short, long = m(f1, f2, ids).text, m(f1, f2, longer).text[:, :10]
            real = ids != 0
            (assert_differ if moves else assert_close)(short[real], long[real])
        # fine-tuning: a real word never sees a later [PAD], so the switch changes no read output
        fa, fb = a(f1, f2, ids, mode="finetune"), b(f1, f2, ids, mode="finetune")
        assert_close(fa.text[ids != 0], fb.text[ids != 0])


def test_switch_init_public_keeps_pytorch_defaults():
    vocab = Vocab.build(["the red cube moved"])
    sizes = dict(vocab_size=len(vocab), feat_dim=12, n_regions=4, d_model=64, n_heads=2, d_ff=128, n_layers=1,
                 max_text_len=10)
    torch.manual_seed(0)
    public = PCL(model_config("pcl-paper", **sizes), vocab).requires_grad_(False)
    torch.manual_seed(0)
    kit = PCL(model_config("pcl-paper", **sizes, init="kit"), vocab).requires_grad_(False)
    assert public.state_dict().keys() == kit.state_dict().keys()
    bound = 1 / math.sqrt(64)                                          # nn.Linear's kaiming-uniform bound
    assert public.cross[0].ffn[0].weight.abs().max() <= bound and public.cross[0].ffn[0].bias.abs().max() > 0
    assert abs(float(public.token_type.weight.std()) - 1.0) < 0.2       # nn.Embedding's N(0, 1)
    assert abs(float(kit.cross[0].ffn[0].weight.std()) - 0.02) < 0.005 and not kit.cross[0].ffn[0].bias.any()
    assert abs(float(kit.token_type.weight.std()) - 0.02) < 0.005
    assert abs(float(kit.word.weight.std()) - 1.0) < 0.2


def test_paper_switches_keep_cached_decoding_equal_to_the_full_forward():
    from idckit.models.decoding import naive_greedy_decode
    m = tiny()
    f1, f2, _ = inputs()
    assert torch.equal(greedy_decode(m, (f1, f2), 9), naive_greedy_decode(m, (f1, f2), 9))
    ids = inputs()[2]
    with torch.no_grad():
        grouped = m.forward_grouped(f1, f2, ids[:, None]).text
        plain = m(f1, f2, ids, mode="finetune").text
    assert_close(grouped[ids != 0], plain[ids != 0])


def test_convert_rejects_a_foreign_state_dict_and_a_wrong_vocabulary():
    from idckit.errors import ConfigError
    rec = recording("clver_finetune")
    with pytest.raises(ConfigError, match="word_embedding"):
        parity.convert_state_dict({"foo": torch.zeros(1)}, rec["vocab"])
    with pytest.raises(ConfigError, match="vocabulary has"):
        parity.convert_state_dict(rec["state_dict"], {**rec["vocab"], "extra": len(rec["vocab"])})
    with pytest.raises(ConfigError, match="lacks"):
        parity.convert_state_dict(rec["state_dict"], {k: v for k, v in rec["vocab"].items() if k != "<CLS>"})


def test_paper_size_is_the_public_models():
    """At the paper's CLEVR-Change size (V = 80 kit words, feat 2048) the kit's paper-profile model less its MVCL
    head is the public fine-tuning model (16,900,688 parameters at their 78 words, counted on yaolinli/IDC
    6f3aabf) plus the kit's [IMG1]/[IMG2] rows of the word table and the MLM head, less the unused 7th type row."""
    from idckit.text.vocab import SPECIALS
    m = PCL(model_config("pcl-paper", vocab_size=80, feat_dim=2048, n_regions=49),
            Vocab(list(SPECIALS) + [f"w{i}" for i in range(72)]))
    n = sum(p.numel() for p in m.parameters())
    mvcl = sum(p.numel() for p in m.mvcl_head.parameters()) + m.mvcl_bias.numel()
    assert mvcl == 512 * 512 + 512 + 2 * 512 + 2048
    assert n - mvcl == 16_900_688 + 2 * 512 + 2 * 513 - 512


def test_switch_mvcl_negatives_picks_the_public_nce_in_the_pretraining_task():
    """At "public" the task's MVCL loss is the public code's (the NCE parity-tested on the recording above: the
    other masked regions' targets and the regression outputs at the unmasked regions are negatives); at "paper"
    the unmasked raw features are."""
    from ddp_worker import MODEL, PRETRAIN, tiny_pcl_data
    from idckit.tasks.pcl import PretrainTask

    data = tiny_pcl_data()
    losses = {}
    for negatives in ("public", "paper"):
        task = PretrainTask(data, {**MODEL, "mvcl_negatives": negatives}, batch_size=6, ratios={"mvcl": 1},
                            **PRETRAIN)
        batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
        torch.manual_seed(0)
        model = task.build_model().eval()
        with torch.no_grad():
            losses[negatives], _ = task.train_step(model, batch, 0)
            f1, f2 = data.pair_features("train", batch["pairs"])
            regions = batch["regions"]
            out = model(f1, f2, batch["text"], mode="pretrain", region_mask=regions)
            n = regions.shape[2]
            visual = torch.stack([out.visual[:, 1:1 + n], out.visual[:, 2 + n:2 + 2 * n]], 1)
            original = torch.stack([f1, f2], 1)
            pred = model.mvcl_regress(visual[regions])
            pool = model.mvcl_regress(visual[~regions]) if negatives == "public" else original[~regions]
            want = mvcl_nce(pred, original[regions], pool, PRETRAIN["tau_mvcl"], in_batch_targets=negatives == "public")
        close(losses[negatives], want)
    assert_differ(losses["public"], losses["paper"], rtol=1e-4)
