"""CLIP4IDC tasks: stand-in pre-training, adaptation, captioning (train_step, swap augmentation, caches, evaluation).

All on the tiny_clevr fixture with the kit's small stand-in architecture at random initialisation (no network)."""
from __future__ import annotations

import itertools
import json

import open_clip
import pytest
import torch

from idckit.errors import ConfigError
from idckit.losses import mlm_loss
from idckit.models.clip4idc import CLIP4IDCCaptioner, CaptionerConfig, tokenize_captions
from idckit.models.clip_loader import load_clip, save_clip_checkpoint
from idckit.tasks.clip4idc import AdaptTask, CaptionTask, IntraCache, decode_ids
from idckit.tasks.clip_pretrain import (StandinPretrainTask, join_objects, load_description_data,
                                        split_objects)
from numeric import assert_close

MODEL = "idckit-standin-ViT-T-16"
SMALL = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
         "freeze_visual": False,
         "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise", "tie_clip_embeddings": True,
         "freeze_clip_embeddings": False, "segment_embedding": None, "difference_tokens": False}
# the tasks' settings (a profile's in the kit; here the paper's, with the embeddings and intra blocks trainable)
ADAPT = {"batch_size": 128, "clip_lr_scale": 1e-3, "weight_decay": 0.2, "swap_prob": 0.5, "freeze_intra": False,
         "freeze_embeddings": False, "eval_batch_size": 128, "ks": (1, 5, 10)}
CAPTION = {"batch_size": 16, "captions_per_pair": 1, "visual_lr_scale": 1e-3, "trim_vocab": False, "eval_batch_size": 100}
OBJECTS = ["a small red rubber cube", "a large blue metal sphere", "a small gray rubber cylinder",
           "a large green metal cube", "a small cyan rubber sphere", "a large purple metal cylinder",
           "a small brown rubber cube"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def write_descriptions(root):
    names = [p.name for sub in ("images", "sc_images", "nsc_images") for p in sorted((root / sub).iterdir())]
    combos = list(itertools.combinations(OBJECTS, 3))           # 35 distinct 3-object scenes
    desc = {n: join_objects(list(combos[(5 * i) % len(combos)])) for i, n in enumerate(names)}
    (root / "scene_descriptions.json").write_text(json.dumps(desc))
    return desc


def _fixed(batches):
    return next(iter(batches))


def _learns(task, model, batch, steps=8, lr=1e-3):
    groups = [{"params": g["params"], "lr": lr * g.get("lr_scale", 1.0)} for g in task.param_groups(model)]
    opt = torch.optim.Adam(groups)
    model.train()
    losses = []
    for step in range(steps):
        loss, logs = task.train_step(model, batch, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


# -- stand-in pre-training ------------------------------------------------------------------------------------

def test_descriptions_split_join_and_fit_the_context():
    text = join_objects(OBJECTS)
    assert split_objects(text) == OBJECTS and split_objects(join_objects(OBJECTS[:1])) == OBJECTS[:1]
    assert split_objects("nothing here") == ["nothing here"]


def test_standin_pretraining_uses_train_images_only_and_learns(tiny_clevr, tmp_path):
    write_descriptions(tiny_clevr)
    data = load_description_data(tiny_clevr, 112, cache_dir=tmp_path / "img")
    # train scenes 0 and 3 (three images each) and the val default images 1 and 4; nothing of test (2, 5)
    assert sorted(data.images.index) == sorted(
        [f"{d}/CLEVR_{k}_{i:06d}.png" for i in (0, 3) for d, k in
         (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic"))]
        + [f"images/CLEVR_default_{i:06d}.png" for i in (1, 4)])
    row = data.images.index["images/CLEVR_default_000003.png"]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):   # random subsets that fit 32 tokens, objects in their left-to-right order
        objs = split_objects(data.text(row, g))
        assert objs == [o for o in data.objects[row] if o in objs]
        assert tokenize_captions([data.text(row, g)], 32)[0, -1] in (0, 49407)
    data.context_length = 12          # now only some objects fit: the deterministic text keeps the first ones
    assert split_objects(data.text(row)) == data.objects[row][:len(split_objects(data.text(row)))]
    data.context_length = 32

    task = StandinPretrainTask(data, MODEL, batch_size=2, weight_decay=0.2, eval_batch_size=256)
    torch.manual_seed(0)
    model = task.build_model()
    batches = list(task.batches(0, torch.Generator().manual_seed(0)))
    assert len(batches) == 1 and batches[0]["tokens"].shape == (2, 32)
    scenes = data.train_scenes
    assert all(any(int(r) in scenes[i].tolist() for i in range(2)) for r in batches[0]["rows"])
    losses = _learns(task, model, batches[0], steps=8, lr=3e-4)
    assert losses[-1] < losses[0] / 2
    m = task.evaluate(model, "val")
    assert set(m) >= {"t2i_R@1", "i2t_R@1", "R@1"} and 0 <= m["R@1"] <= 100
    with pytest.raises(ValueError, match="val"):
        task.evaluate(model, "test")

    # the checkpoint round-trips through open_clip's pretrained=<file> path
    path = save_clip_checkpoint(model, tmp_path / "standin.pt", MODEL)
    again, _, _ = load_clip(MODEL, path)
    x = data.images.batch(torch.tensor([0, 1]))
    with torch.no_grad():
        assert torch.equal(again.eval().encode_image(x), model.eval().encode_image(x))
    assert open_clip.create_model(MODEL, pretrained=str(path)).logit_scale.item() == model.logit_scale.item()


def test_standin_needs_scene_descriptions(tiny_clevr):
    from idckit.errors import DatasetError

    with pytest.raises(DatasetError, match="scene_descriptions"):
        load_description_data(tiny_clevr, 112)


# -- adaptation -----------------------------------------------------------------------------------------------

def test_pair_data_layout(pairs):
    train = pairs.splits["train"]
    assert train.pair_ids == ["000000.png", "000000.png_n", "000003.png", "000003.png_n"]
    assert train.is_change.tolist() == [True, False, True, False]
    # the distractor row of a scene is its non-semantic image; both pairs of a scene share the before image
    assert torch.equal(train.distractor_row[::2], train.after[1::2]) and torch.equal(train.before[::2], train.before[1::2])
    assert train.sample_ids.shape == (len(train.sample_pair), 32) and train.sample_pair.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_swap_augmentation_replaces_the_before_image_by_the_distractor(pairs, clip_file):
    train = pairs.splits["train"]
    task = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(batch_size=4, swap_prob=1.0)))
    batch = _fixed(task.batches(0, torch.Generator().manual_seed(0)))
    assert bool(batch["swap"].all()) and bool(train.is_change[batch["pairs"]].all())
    assert torch.equal(task.swapped_before(batch["pairs"], batch["swap"]), train.distractor_row[batch["pairs"]])
    none = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(batch_size=4, swap_prob=0.0)))
    b0 = _fixed(none.batches(0, torch.Generator().manual_seed(0)))
    assert not bool(b0["swap"].any())
    assert torch.equal(none.swapped_before(b0["pairs"], b0["swap"]), train.before[b0["pairs"]])
    half = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(batch_size=1, swap_prob=0.5)))
    draws = torch.cat([b["swap"] for e in range(50) for b in half.batches(e, torch.Generator().manual_seed(e))])
    assert 0.35 < draws.float().mean() < 0.65
    with pytest.raises(ValueError, match="non-semantic"):   # a distractor pair has no distractor to swap in
        none.swapped_before(torch.tensor([1]), torch.tensor([True]))


def test_adaptation_learns_and_the_intra_cache_changes_nothing(pairs, clip_file):
    plain = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(n_intra=4, batch_size=4, swap_prob=0.5)))
    cached = AdaptTask(pairs, MODEL, clip_file,
                       **(ADAPT | dict(n_intra=4, batch_size=4, swap_prob=0.5, freeze_intra=True)))
    batch = _fixed(plain.batches(0, torch.Generator().manual_seed(1)))
    torch.manual_seed(0)
    m1 = plain.build_model()
    torch.manual_seed(0)
    m2 = cached.build_model()
    l1, _ = plain.train_step(m1, batch, 0)
    l2, _ = cached.train_step(m2, batch, 0)
    assert_close(l1, l2)
    assert cached.intra_cache is not None and cached.intra_cache.n_intra == 4
    l2.backward()
    frozen = {n for n, p in m2.named_parameters() if not p.requires_grad}
    assert "pair_encoder.visual.conv1.weight" in frozen and "pair_encoder.visual.transformer.resblocks.3.mlp.c_fc.weight" in frozen
    assert "pair_encoder.visual.transformer.resblocks.4.mlp.c_fc.weight" not in frozen
    assert m2.pair_encoder.joint_positional_embedding.grad is not None
    # param groups: CLIP's weights at the small lr scale, e1/e2/p/ln_mid at 1
    groups = cached.param_groups(m2)
    new = {id(p) for p in m2.pair_encoder.new_parameters()}
    assert {id(p) for p in groups[2]["params"]} == new and groups[2]["lr_scale"] == 1.0
    assert groups[0]["lr_scale"] == groups[1]["lr_scale"] == 1e-3
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in m2.parameters())

    losses = _learns(cached, m2, batch, steps=10, lr=1e-3)
    assert losses[-1] < losses[0] - 0.05


def test_retrieval_evaluation_shapes(pairs, clip_file):
    task = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(batch_size=4)))
    torch.manual_seed(0)
    model = task.build_model()
    sim, text_pair = task.similarity(model, "val")
    val = pairs.splits["val"]
    n_change = int(val.is_change.sum())
    n_caps = int(val.is_change[val.sample_pair].sum())
    assert sim.shape == (n_caps, n_change) and text_pair.tolist() == [0, 0, 1, 1]
    m = task.evaluate(model, "val")
    for d in ("t2p", "p2t"):
        assert {f"{d}_R@1", f"{d}_R@5", f"{d}_R@10", f"{d}_MdR", f"{d}_MnR"} <= set(m)
    assert m["t2p_R@5"] == 100.0    # two candidate pairs only
    with torch.no_grad():
        logit_scale = model.logit_scale.fill_(100.0)   # the task clamps it at ln 100 before each step
    task.train_step(model, _fixed(task.batches(0, torch.Generator().manual_seed(0))), 0)
    assert model.logit_scale.item() == pytest.approx(torch.log(torch.tensor(100.0)).item())
    del logit_scale


# -- captioning -----------------------------------------------------------------------------------------------

def test_caption_task_learns_with_cached_frozen_encoder_equal_to_images(pairs, clip_file):
    live = CaptionTask(pairs, MODEL, clip_file, {**SMALL, "freeze_visual": True}, **(CAPTION | dict(batch_size=2)))
    cached = CaptionTask(pairs, MODEL, clip_file, {**SMALL, "freeze_visual": True},
                         **(CAPTION | dict(batch_size=2, visual_lr_scale=0.0)))
    assert cached.frozen and live.frozen
    batch = _fixed(cached.batches(0, torch.Generator().manual_seed(0)))
    train = pairs.splits["train"]
    # each step: B scenes as (default, sc) with a change caption and (default, nsc) with a no-change caption
    assert train.is_change[batch["pairs"][:2]].all() and not train.is_change[batch["pairs"][2:]].any()
    caps = [c for p in pairs.splits["train"].references.values() for c in p]
    assert all(t in caps for t in decode_ids(batch["ids"][:, 1:].tolist()))
    torch.manual_seed(0)
    m = cached.build_model().eval()
    with torch.no_grad():
        a = mlm_loss(*m.teacher_forcing(m.memories(cached._visual(m, "train", batch["pairs"])), batch["ids"]))
        s = pairs.splits["train"]
        imgs = (pairs.images.batch(s.before[batch["pairs"]]), pairs.images.batch(s.after[batch["pairs"]]))
        b = mlm_loss(*m.teacher_forcing(m.memories(imgs), batch["ids"]))
    assert_close(a, b)
    assert cached.param_groups(m) and all(not p.requires_grad for p in m.pair_encoder.parameters())
    losses = _learns(cached, m, batch, steps=10, lr=3e-3)
    assert losses[-1] < losses[0] - 1.0
    preds = cached.predict(m, "val")
    assert sorted(preds) == sorted(pairs.splits["val"].pair_ids) and all(isinstance(v, str) for v in preds.values())


def test_k_references_per_pair_read_the_pair_memory_k_times(pairs, clip_file):
    task = CaptionTask(pairs, MODEL, clip_file, {**SMALL, "freeze_visual": True},
                       **(CAPTION | dict(batch_size=2, captions_per_pair=3, visual_lr_scale=0.0)))
    batch = _fixed(task.batches(0, torch.Generator().manual_seed(0)))
    train = pairs.splits["train"]
    ids = batch["ids"]
    assert ids.shape[:2] == (len(batch["pairs"]), 3)
    for p, rows in zip(batch["pairs"].tolist(), ids):
        refs = train.references[train.pair_ids[p]]
        got = decode_ids(rows[:, 1:].tolist())
        assert all(t in refs for t in got)
    # distinct references where the pair has that many, every reference once before any repeats
    rows = task._pick(batch["pairs"], torch.Generator().manual_seed(1))
    for p, r in zip(batch["pairs"].tolist(), rows.tolist()):
        first, n = int(task.offsets[p]), int(task.counts[p])
        assert all(first <= i < first + n for i in r) and len(set(r)) == min(3, n)
    # the loss equals the per-caption loss with each pair's memory repeated by hand
    torch.manual_seed(0)
    m = task.build_model().eval()
    with torch.no_grad():
        loss, _ = task.train_step(m, batch, 0)
        memories = m.memories(task._visual(m, "train", batch["pairs"].repeat_interleave(3)))
        ref = mlm_loss(*m.teacher_forcing(memories, ids.flatten(0, 1)), "sum")
        words = int((ids[:, :, 1:] != m.pad_id).sum())
    assert_close(loss, ref / words)
    with pytest.raises(ConfigError, match="captions_per_pair"):
        CaptionTask(pairs, MODEL, clip_file, SMALL, **(CAPTION | dict(captions_per_pair=0)))


def test_trimmed_vocabulary_is_the_full_model_restricted(pairs):
    torch.manual_seed(0)
    clip, _, _ = load_clip(MODEL, None)
    cfg = CaptionerConfig(**SMALL, max_len=32)
    ids = pairs.caption_ids()
    torch.manual_seed(1)
    full = CLIP4IDCCaptioner(clip, cfg).eval()
    torch.manual_seed(1)
    clip2, _, _ = load_clip(MODEL, None)
    clip2.load_state_dict(clip.state_dict())
    trimmed = CLIP4IDCCaptioner(clip2, cfg, output_ids=ids).eval()
    state = {k: v for k, v in full.state_dict().items()}
    keep = trimmed.vocab_ids
    state["word_embedding.weight"] = state["word_embedding.weight"][keep]
    state["head_bias"] = state["head_bias"][keep]
    trimmed.load_state_dict({**state, "vocab_ids": keep})
    s = pairs.splits["train"]
    visual = (pairs.images.batch(s.before[:2]), pairs.images.batch(s.after[:2]))
    tokens = s.sample_ids[:2, :6]
    with torch.no_grad():
        a, b = full.full_logits(visual, tokens), trimmed.full_logits(visual, tokens)
    assert torch.isinf(b[..., 1000]).all()                          # an id no caption uses
    assert_close(b[..., keep], a[..., keep])
    # the loss is the softmax over the kept ids only: equal to the full model's restricted to them
    with torch.no_grad():
        mem = full.memories(visual)
        la = torch.nn.functional.cross_entropy(full.decode(mem, s.sample_ids[:2, :-1])[..., keep].flatten(0, 1),
                                               trimmed.to_rows(s.sample_ids[:2, 1:]).flatten(),
                                               ignore_index=int(trimmed.to_rows(torch.tensor([0]))[0]))
        lb = mlm_loss(*trimmed.teacher_forcing(trimmed.memories(visual), s.sample_ids[:2]))
    assert_close(la, lb)
    with pytest.raises(ValueError, match="trimmed vocabulary"):
        trimmed.embed_tokens(torch.tensor([[1000]]))


def test_captioner_starts_from_the_adapted_encoder(pairs, clip_file, tmp_path):
    adapt = AdaptTask(pairs, MODEL, clip_file, **(ADAPT | dict(n_intra=4)))
    torch.manual_seed(3)
    retrieval = adapt.build_model()
    with torch.no_grad():
        retrieval.pair_encoder.bef_embedding.fill_(0.5)
    torch.save(retrieval.state_dict(), tmp_path / "best.pt")
    task = CaptionTask(pairs, MODEL, clip_file, {**SMALL, "n_intra": 4}, init_from=tmp_path / "best.pt", **CAPTION)
    model = task.build_model()
    assert torch.equal(model.pair_encoder.bef_embedding, retrieval.pair_encoder.bef_embedding)
    assert torch.equal(model.pair_encoder.visual.proj, retrieval.pair_encoder.visual.proj)


def test_decode_ids_cuts_at_end_of_text():
    ids = tokenize_captions(["the red cube moved", "no change"], 12)[:, 1:].tolist()
    assert decode_ids(ids) == ["the red cube moved", "no change"]
    assert decode_ids([[49407, 320]]) == [""]


def test_intra_cache_lookup_refuses_unknown_rows(pairs):
    torch.manual_seed(0)
    clip, _, _ = load_clip(MODEL, None)
    from idckit.models.clip4idc import PairEncoder

    enc = PairEncoder(clip.visual, n_intra=2)
    cache = IntraCache.compute(enc, pairs.images, torch.tensor([3, 1, 3]))
    assert cache.rows.tolist() == [1, 3] and cache.values.shape == (2, 50, 128)
    with torch.no_grad():
        assert_close(cache[torch.tensor([3])], enc.encode_intra(pairs.images.batch(torch.tensor([3]))))
    with pytest.raises(KeyError):
        cache[torch.tensor([0])]
