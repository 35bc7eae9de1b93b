"""CLIP loading: the stand-in architecture, the checkpoint round trip, and clear errors offline (never network)."""
from __future__ import annotations

import os
import time

import open_clip
import pytest
import torch
from PIL import Image

from idckit.errors import ConfigError, WeightsUnavailableError
from idckit.models import clip_loader
from idckit.models.clip_loader import STANDIN_CLIP, load_clip, register_standin_configs, save_clip_checkpoint
from numeric import assert_close


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)


def test_standin_is_registered_once_and_builds_the_documented_architecture():
    from open_clip import factory
    assert STANDIN_CLIP in open_clip.list_models()
    n_paths = len(factory._MODEL_CONFIG_PATHS)
    assert STANDIN_CLIP in register_standin_configs()
    assert len(factory._MODEL_CONFIG_PATHS) == n_paths               # idempotent: nothing added twice
    model, preprocess, tokenizer = load_clip(STANDIN_CLIP, None)
    v = model.visual
    assert v.grid_size == (7, 7) and v.conv1.out_channels == 128 and len(v.transformer.resblocks) == 6
    assert v.proj.shape == (128, 128) and len(model.transformer.resblocks) == 3
    assert model.token_embedding.weight.shape == (49408, 128) and model.context_length == 32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = tokenizer(["the red cube moved"])
    assert ids.shape == (1, 32) and ids[0, 0] == 49406 and 49407 in ids[0]
    # squash resize (public code): a 480x320 CLEVR-shaped image keeps its whole width, no centre crop
    img = Image.new("RGB", (480, 320), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 40, 320))                      # a white stripe at the far left
    x = preprocess(img)
    assert x.shape == (3, 112, 112)
    assert x[:, :, :5].mean() > x[:, :, 40:].mean() + 1.0             # the stripe survived


def test_checkpoint_round_trip_through_open_clip_pretrained_path(tmp_path):
    torch.manual_seed(0)
    model, _, _ = load_clip(STANDIN_CLIP, None)
    with torch.no_grad():
        model.logit_scale.fill_(4.2)
    path = save_clip_checkpoint(model, tmp_path / "standin.pt", STANDIN_CLIP)
    assert [p.name for p in tmp_path.iterdir()] == ["standin.pt"]     # no temp file left behind
    raw = torch.load(path, weights_only=True)
    assert raw["model_name"] == STANDIN_CLIP
    reloaded = open_clip.create_model(STANDIN_CLIP, pretrained=str(path))
    ref = model.state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in reloaded.state_dict().items())
    again, _, _ = load_clip(STANDIN_CLIP, path)
    img = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        assert torch.equal(again.eval().encode_image(img), model.eval().encode_image(img))


def test_saving_under_the_wrong_architecture_writes_nothing(tmp_path):
    model, _, _ = load_clip(STANDIN_CLIP, None)
    with pytest.raises(ConfigError, match="architecture"):
        save_clip_checkpoint(model, tmp_path / "x.pt", "ViT-B-32")
    assert list(tmp_path.iterdir()) == []


def test_paper_weights_offline_fail_fast_with_the_fix():
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError) as err:
        load_clip("ViT-B-32", "openai")
    assert time.monotonic() - start < 10
    message = str(err.value)
    for needle in ("openai", "offline", "pretrained=<path>", "idckit pretrain-clip", STANDIN_CLIP):
        assert needle in message


def test_bad_weights_and_names_raise_kit_errors(tmp_path):
    with pytest.raises(WeightsUnavailableError, match="nor an existing file") as err:
        load_clip(STANDIN_CLIP, tmp_path / "missing.pt")
    assert err.value.path == tmp_path / "missing.pt"
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(os.urandom(256))
    with pytest.raises(WeightsUnavailableError, match="could not load"):
        load_clip(STANDIN_CLIP, corrupt)
    with pytest.raises(ConfigError, match="unknown CLIP architecture"):
        load_clip("ViT-Z-99", None)


def test_openai_tag_forces_quick_gelu(monkeypatch):
    """OpenAI's weights need QuickGELU; the loader must ask open_clip for it (checked without downloading)."""
    seen = {}

    def fake_create(name, pretrained=None, **kwargs):
        seen.update(kwargs, name=name, pretrained=pretrained)
        raise RuntimeError("stop here")

    monkeypatch.setattr(clip_loader.open_clip, "create_model_and_transforms", fake_create)
    with pytest.raises(WeightsUnavailableError):
        load_clip("ViT-B-32", "openai")
    assert seen["force_quick_gelu"] is True and seen["precision"] == "fp32" and seen["pretrained"] == "openai"


HYBRID = "idckit-standin-hybrid-ViT-12"


def test_hybrid_standin_reads_imagenet_features_through_a_frozen_trunk():
    from open_clip.constants import IMAGENET_MEAN, IMAGENET_STD, OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    from idckit.data.features import build_backbone

    torch.manual_seed(0)
    model, preprocess, _ = load_clip(HYBRID, None)
    v = model.visual
    assert isinstance(v.conv1, clip_loader.HybridStem) and v.grid_size == (7, 7)
    assert len(v.transformer.resblocks) == 12 and v.conv1.out_channels == 96 and v.conv1.weight is v.conv1.proj.weight
    # the trunk is EfficientNet-Lite0's ImageNet stem + blocks 0-4, exactly
    net, _, _ = build_backbone("efficientnet_lite0")
    ref = torch.nn.Sequential(net.conv_stem, net.bn1, *net.blocks[:5]).eval()
    assert all(torch.equal(a, b) for a, b in zip(v.conv1.trunk.state_dict().values(), ref.state_dict().values()))
    # a CLIP-normalised image reaches the trunk ImageNet-normalised
    img = torch.rand(2, 3, 112, 112)
    as_clip = (img - torch.tensor(OPENAI_DATASET_MEAN).view(1, 3, 1, 1)) / torch.tensor(OPENAI_DATASET_STD).view(1, 3, 1, 1)
    as_imagenet = (img - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        assert_close(v.conv1(as_clip), v.conv1.proj(ref(as_imagenet)))
    # training moves the projection and the ViT, never the trunk (weights or batch-norm statistics)
    before = {k: t.clone() for k, t in v.conv1.trunk.state_dict().items()}
    model.train()
    assert not v.conv1.trunk.training and v.conv1.proj.training
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.encode_image(as_clip).square().sum().backward()
    assert v.conv1.proj.weight.grad is not None and v.conv1.proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in v.conv1.trunk.parameters())
    opt.step()
    model.encode_image(as_clip)
    assert all(torch.equal(t, before[k]) for k, t in v.conv1.trunk.state_dict().items())


def test_hybrid_standin_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model, _, _ = load_clip(HYBRID, None)
    with torch.no_grad():
        model.visual.conv1.proj.weight.mul_(3.0)
    path = save_clip_checkpoint(model, tmp_path / "hybrid.pt", HYBRID)
    assert any(k.startswith("visual.conv1.trunk.") for k in torch.load(path, weights_only=True)["state_dict"])
    again, _, _ = load_clip(HYBRID, path)
    img = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        assert torch.equal(again.eval().encode_image(img), model.eval().encode_image(img))
    with pytest.raises(ConfigError, match="architecture"):       # a plain stand-in's weights are not a hybrid's
        save_clip_checkpoint(load_clip(STANDIN_CLIP, None)[0], tmp_path / "x.pt", HYBRID)
