"""CLIP4IDC tasks and experiments at tiny size: data wiring, swap augmentation, learning, weight hand-over."""
from __future__ import annotations

import json

import pytest
import torch

from idckit.errors import ConfigError

TINY = "idckit-test-tiny-clip"


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A 2-layer, width-32 open_clip architecture registered for these tests (32 px, patch 16: 4 patches)."""
    import open_clip

    import idckit.models.clip_loader  # noqa: F401  (registers the kit's configs first)

    path = tmp_path_factory.mktemp("cfg") / f"{TINY}.json"
    path.write_text(json.dumps({"embed_dim": 32,
                                "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16,
                                               "patch_size": 16},
                                "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2,
                                             "layers": 1}}))
    if TINY not in open_clip.list_models():
        open_clip.add_model_config(path)
    return TINY


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_clip):
    from idckit.data.clevr_change import ClevrChange
    from idckit.data.synth.clevr_change import generate
    from idckit.tasks.clip import load_clip_data

    root = tmp_path_factory.mktemp("clip") / "synth"
    generate(root, n_pairs=24, seed=1, size=(48, 32), workers=1, progress=False)
    return load_clip_data(ClevrChange(root), image_size=32, max_len=20)


CAPTIONER = {"hidden": 32, "heads": 2, "ffn": 64, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0}


def test_data_rows_swap_partner_and_descriptions(data):
    from idckit.data.images import CLIP_MEAN, CLIP_STD

    train = data.splits["train"]
    assert len(train) % 2 == 0 and train.is_change[0::2].all() and not train.is_change[1::2].any()
    # a semantic pair's swap partner is the after image of its own distractor pair
    assert torch.equal(train.nsc[0::2], train.after[1::2])
    assert torch.equal(train.before[0::2], train.before[1::2])
    assert (train.sample_ids[:, 0] == 49406).all()                          # SOT
    assert data.images.pixels.dtype == torch.uint8 and data.images.size == 32
    rows, ids = data.descriptions["train"]
    # before + semantic-after images of train only, no distractor image
    assert len(rows) == 2 * int(train.is_change.sum()) and not set(rows.tolist()) & set(train.after[1::2].tolist())
    assert ids.shape == (len(rows), 20)
    b, a = data.pair_images("train", torch.tensor([0]), swap=torch.tensor([True]))
    expected = (data.images.pixels[train.nsc[0]].float() / 255 - torch.tensor(CLIP_MEAN)[:, None, None]) \
        / torch.tensor(CLIP_STD)[:, None, None]
    assert torch.allclose(b[0], expected, atol=1e-6)


def test_adapt_batches_use_change_captions_and_swap(data, tiny_clip):
    from idckit.tasks.clip import AdaptTask

    train = data.splits["train"]
    task = AdaptTask(data, tiny_clip, None, batch_size=4, swap_prob=0.5)
    batches = list(task.batches(0, torch.Generator().manual_seed(3)))
    again = list(task.batches(0, torch.Generator().manual_seed(3)))
    assert all(torch.equal(x["samples"], y["samples"]) and torch.equal(x["swap"], y["swap"])
               for x, y in zip(batches, again))
    samples = torch.cat([b["samples"] for b in batches])
    assert train.is_change[train.sample_pair[samples]].all()
    assert len(samples) == len(task.samples) - len(task.samples) % 4
    swaps = torch.cat([b["swap"] for b in batches]).float().mean()
    assert 0.2 < swaps < 0.8
    assert all(not b["swap"].any() for b in AdaptTask(data, tiny_clip, None, batch_size=4, swap_prob=0.0)
               .batches(0, torch.Generator().manual_seed(3)))
    with pytest.raises(ConfigError, match="swap_prob"):
        AdaptTask(data, tiny_clip, None, batch_size=4, swap_prob=1.5)


def test_adapt_param_groups_and_logit_scale_clamp(data, tiny_clip):
    from idckit.tasks.clip import MAX_LOGIT_SCALE, AdaptTask

    torch.manual_seed(0)
    task = AdaptTask(data, tiny_clip, None, batch_size=4, lr_scale_clip=1e-3)
    model = task.build_model()
    groups = {g["name"]: g for g in task.param_groups(model)}
    assert groups["clip"]["lr_scale"] == pytest.approx(1e-3) and groups["new"]["lr_scale"] == 1.0
    # e1, e2, the joint position embedding p and ln_mid's weight and bias, nothing else
    assert {id(p) for p in groups["new"]["params"]} == {id(p) for p in model.pair_encoder.new_parameters()}
    assert len(groups["new"]["params"]) == 5
    with torch.no_grad():
        model.logit_scale.fill_(10.0)
    batch = next(task.batches(0, torch.Generator().manual_seed(0)))
    task.train_step(model, batch, 0)
    assert float(model.logit_scale.detach()) == pytest.approx(MAX_LOGIT_SCALE)


def _learns(task, steps=12, lr=3e-3):
    torch.manual_seed(0)
    model = task.build_model().train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    batch = next(task.batches(0, torch.Generator().manual_seed(0)))
    losses = []
    for step in range(steps):
        loss, logs = task.train_step(model, batch, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model


@pytest.mark.parametrize("kind", ["pretrain", "adapt", "caption"])
def test_every_task_learns_on_a_fixed_batch(data, tiny_clip, kind):
    from idckit.tasks.clip import AdaptTask, CaptionTask, ClipPretrainTask

    task = {"pretrain": lambda: ClipPretrainTask(data, tiny_clip, batch_size=6),
            "adapt": lambda: AdaptTask(data, tiny_clip, None, batch_size=6, lr_scale_clip=1.0),
            "caption": lambda: CaptionTask(data, tiny_clip, None, CAPTIONER, batch_size=6, lr_scale_visual=1.0)}[kind]()
    losses, _ = _learns(task, lr={"pretrain": 3e-4, "adapt": 1e-3, "caption": 1e-2}[kind])
    assert all(torch.isfinite(torch.tensor(losses)))
    # InfoNCE starts near ln 6; the captioner's cross-entropy near ln 49408 = 10.8 and must shed > 3 nats
    assert losses[-1] < (losses[0] - 3 if kind == "caption" else 0.7 * losses[0]), losses


def test_retrieval_evaluation_keys_and_ranges(data, tiny_clip):
    from idckit.tasks.clip import AdaptTask, ClipPretrainTask

    torch.manual_seed(0)
    task = AdaptTask(data, tiny_clip, None, batch_size=4)
    m = task.evaluate(task.build_model(), "val")
    n_sem = int(data.splits["val"].is_change.sum())
    assert {"t2p_R@1", "p2t_R@1", "t2p_MdR"} <= set(m)
    assert m["t2p_R@10"] == 100.0 if n_sem <= 10 else 0 <= m["t2p_R@10"] <= 100
    assert 1 <= m["t2p_MnR"] <= n_sem
    pre = ClipPretrainTask(data, tiny_clip, batch_size=4)
    m = pre.evaluate(pre.build_model(), "val")
    assert 1 <= m["t2p_MnR"] <= len(data.descriptions["val"][0])


def test_captioner_takes_the_adapted_pair_encoder(data, tiny_clip, tmp_path):
    from idckit.tasks.clip import AdaptTask, CaptionTask, pair_encoder_state

    torch.manual_seed(0)
    adapt = AdaptTask(data, tiny_clip, None, batch_size=4).build_model()
    with torch.no_grad():
        adapt.pair_encoder.joint_positional_embedding.add_(1.0)   # differs from any fresh init
    torch.save(adapt.state_dict(), tmp_path / "best.pt")
    cap = CaptionTask(data, tiny_clip, None, {**CAPTIONER, "freeze_visual": True}, batch_size=4,
                      init_pair_encoder=tmp_path / "best.pt")
    model = cap.build_model()
    for k, v in adapt.pair_encoder.state_dict().items():
        assert torch.equal(model.pair_encoder.state_dict()[k], v), k
    groups = cap.param_groups(model)
    assert [g["name"] for g in groups] == ["caption"]   # frozen visual side: no empty optimiser group
    torch.save({"other.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="pair_encoder"):
        pair_encoder_state(tmp_path / "bad.pt")


def test_fit_caption_selects_on_val_and_predicts_every_pair(data, tiny_clip, tmp_path):
    from idckit.tasks.clip import CaptionTask, decode_ids, predict
    from idckit.train.loop import TrainConfig, fit

    task = CaptionTask(data, tiny_clip, None, CAPTIONER, batch_size=8, lr_scale_visual=1.0)
    res = fit(task, TrainConfig(max_steps=4, lr=1e-3, eval_every=2), tmp_path / "run", progress=False)
    assert "CIDEr-D" in res.best_metrics and res.steps == 4
    caps = predict(res.model, data, "test")
    assert set(caps) == set(data.splits["test"].pair_ids) and all(isinstance(c, str) for c in caps.values())
    from idckit.models.clip4idc import tokenize_captions
    ids = tokenize_captions(["the cube is gone"], 12)[0].tolist()
    assert decode_ids(ids[1:] + [320], 49407) == "the cube is gone"


# The experiments module (idckit.experiments.clip4idc) is tested in tests/test_clip4idc_experiments.py.
