"""CLIP4IDC on the datasets without distractor pairs (Spot-the-Diff, IER), smoke profile on tiny synthetic sets:
the stand-in pre-trains on the set's own descriptions, adaptation and captioning run, the ids are the set's."""
from __future__ import annotations

import pytest
import torch

from idckit.data.synth import editing_request, spot_the_diff
from idckit.errors import ConfigError


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("c4pairs")


@pytest.fixture(scope="module")
def spot_root(base):
    return spot_the_diff.generate(base / "spot", n_pairs=16, seed=0, workers=1, progress=False)


def test_spot_the_diff_adapts_and_captions(base, spot_root):
    from idckit.experiments import clip4idc
    from idckit.tasks.clip4idc import CaptionTask

    root = spot_root
    s = clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="spot-the-diff")
    assert s.data.synthetic and s.data.name == "spot-the-diff" and "SynthSpot-the-Diff" in s.data.description
    clip = clip4idc.clip_weights(s)
    # the stand-in learned on this set's own descriptions: its run is keyed by this data's content identity
    assert clip["run"] is not None and s.data.identity in (s.runs_dir / clip["run"] / "config.json").read_text()
    r = clip4idc.run_variant(s, "clip4idc", 0)
    test_ids = set(s.data.dataset().references("test"))
    assert set(r["test"]["total"]) >= {"CIDEr-D", "Bleu_4"} and "distractor" not in r["test"]
    assert {"t2p_R@1", "t2p_R@10", "t2p_R@20", "t2p_R@50", "p2t_R@50"} <= set(r["adapt"]["test"])   # table 6's K
    import json
    written = json.loads((s.runs_dir / r["run"] / "test" / "total_results.json").read_text())
    assert {w["image_id"] for w in written} == test_ids and all(i.endswith(".png") for i in test_ids)

    data = clip4idc.loaded_data(s)
    captioner = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1, "dropout": 0.1,
                 "freeze_visual": False,
                 "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise",
                 "tie_clip_embeddings": True, "freeze_clip_embeddings": False, "segment_embedding": None,
                 "difference_tokens": False}
    task = CaptionTask(data, clip["name"], clip["weights"], captioner, batch_size=4, captions_per_pair=1,
                       visual_lr_scale=1e-3,
                       trim_vocab=False, eval_batch_size=100)
    assert not task.with_distractors
    batch = next(task.batches(0, torch.Generator().manual_seed(0)))
    assert len(batch["pairs"]) == 4                   # one pair per scene, no distractor partner


@pytest.fixture(scope="module")
def ier_root(base):
    return editing_request.generate(base / "ier", n_pairs=16, seed=0, workers=1, progress=False)


def test_editing_request_captions_and_rejects_unknown_datasets(base, ier_root):
    from idckit.experiments import clip4idc

    root = ier_root
    s = clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="editing-request")
    r = clip4idc.run_variant(s, "clip-ft", 0)
    assert r["adapt"] is None and set(r["test"]) >= {"total"}
    refs = s.data.dataset().references("test")
    assert all(len(v) == 3 for v in refs.values())
    with pytest.raises(ConfigError, match="birds is not a pair dataset; known: clevr-change, spot-the-diff"):
        clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="birds")
    with pytest.raises(ConfigError, match="unknown dataset 'gan'"):
        clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="gan")


def test_a_dataset_block_applies_on_top_of_the_profile_and_under_overrides(base, spot_root, ier_root):
    from idckit.experiments import clip4idc
    from idckit.experiments.config import load_config

    root = spot_root
    kw = {"runs_dir": base / "runs", "progress": False}
    # the public code adapts 12 epochs on CLEVR-Change and 20 on Spot-the-Diff
    assert load_config("clip4idc_adapt", "paper")["train"]["epochs"] == 12
    assert clip4idc.setup("paper", root, dataset="spot-the-diff", **kw).config["adapt"]["train"]["epochs"] == 20
    s = clip4idc.setup("paper", root, dataset="spot-the-diff", overrides={"adapt": {"train": {"epochs": 3}}}, **kw)
    assert s.config["adapt"]["train"]["epochs"] == 3 and s.config["adapt"]["batch_size"] == 128
    assert clip4idc.dataset_settings("clip4idc_adapt", "clevr-change", "paper") == {}
    # IER's captioner trains 1,000 steps at cpu (300 on the other sets); the rest of the profile is kept
    cpu = load_config("clip4idc_caption", "cpu")
    ier = clip4idc.setup("cpu", ier_root, dataset="editing-request", **kw).config["caption"]
    assert (cpu["train"]["max_steps"], ier["train"]["max_steps"], ier["train"]["eval_every"]) == (300, 1000, 100)
    assert ier["train"]["lr"] == cpu["train"]["lr"] and ier["captioner"] == cpu["captioner"]
    spot = clip4idc.setup("cpu", spot_root, dataset="spot-the-diff", **kw).config["caption"]
    assert spot == cpu
