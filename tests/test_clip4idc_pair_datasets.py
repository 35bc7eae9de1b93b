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


def test_spot_the_diff_adapts_and_captions(base):
    from idckit.experiments import clip4idc
    from idckit.tasks.clip4idc import CaptionTask

    root = spot_the_diff.generate(base / "spot", n_pairs=16, seed=0, workers=1, progress=False)
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

    data = clip4idc._data(s)
    captioner = {"hidden": 128, "heads": 4, "ffn": 256, "enc_layers": 1, "dec_layers": 1, "dropout": 0.1,
                 "freeze_visual": False}
    task = CaptionTask(data, clip["name"], clip["weights"], captioner, batch_size=4, visual_lr_scale=1e-3,
                       trim_vocab=False, eval_batch_size=100)
    assert not task.with_distractors
    batch = next(task.batches(0, torch.Generator().manual_seed(0)))
    assert len(batch["pairs"]) == 4                   # one pair per scene, no distractor partner


def test_editing_request_captions_and_rejects_unknown_datasets(base):
    from idckit.experiments import clip4idc

    root = editing_request.generate(base / "ier", n_pairs=16, seed=0, workers=1, progress=False)
    s = clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="editing-request")
    r = clip4idc.run_variant(s, "clip-ft", 0)
    assert r["adapt"] is None and set(r["test"]) >= {"total"}
    refs = s.data.dataset().references("test")
    assert all(len(v) == 3 for v in refs.values())
    with pytest.raises(ConfigError, match="unknown dataset"):
        clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, dataset="birds")
