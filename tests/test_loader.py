"""The training loop's DataLoader path (idckit.train.loader): workers read feature rows and pixels ahead of the
step, and any number of them gives the batches, the sharding and the training run of reading in process."""
from __future__ import annotations

import importlib.util
import json
import multiprocessing
from pathlib import Path

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments.config import PROFILES, load_config, train_config
from idckit.train import distributed
from idckit.train.loader import BatchLoader, LoaderConfig, epoch_generator
from idckit.train.loop import fit

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("ddp_worker", HERE / "ddp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
CPU = torch.device("cpu")


def assert_same(a, b, where="batch"):
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def make_task(kind: str):
    from idckit.tasks.clip4idc import AdaptTask, CaptionTask
    from idckit.tasks.pcl import PretrainTask

    if kind == "pretrain":     # MLM, MVCL (region masks) and FDA (groups with negatives) batches
        return PretrainTask(worker.tiny_pcl_data(), worker.MODEL, batch_size=6, ratios={"mlm": 2, "mvcl": 1, "fda": 1},
                            **worker.PRETRAIN)
    if kind == "finetune":
        return worker.JudgedFinetune(worker.tiny_pcl_data(), grouped=True)
    if kind == "adapt":        # pixels of the swapped before-images
        return AdaptTask(worker.tiny_pair_data(scenes=8), "idckit-standin-ViT-T-16", None, batch_size=2,
                         clip_lr_scale=1e-3, weight_decay=0.2, swap_prob=0.5, freeze_intra=False,
                         freeze_embeddings=False, eval_batch_size=128, ks=(1, 5, 10))
    captioner = {"hidden": 32, "heads": 2, "ffn": 64, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                 "freeze_visual": False,
                 "variant": "clip4idc", "n_intra": None, "cross_attention": "layerwise",
                 "tie_clip_embeddings": True, "freeze_clip_embeddings": False, "segment_embedding": None,
                 "difference_tokens": False}
    return CaptionTask(worker.tiny_pair_data(scenes=8), "idckit-standin-ViT-T-16", None, captioner, batch_size=2,
                       captions_per_pair=1,
                       visual_lr_scale=1e-3, trim_vocab=False, eval_batch_size=100)


def through_loader(task, workers: int, epochs=(0, 1), skip: int = 0, seed: int = 5) -> list[list]:
    loader = BatchLoader(task, seed, LoaderConfig(workers=workers), CPU)
    try:
        return [list(loader.epoch(e, skip=skip if i == 0 else 0)) for i, e in enumerate(epochs)]
    finally:
        loader.close()


def read_in_process(task, epochs=(0, 1), seed: int = 5) -> list[list]:
    return [[task.load(b) for b in task.batches(e, epoch_generator(seed, e))] for e in epochs]


@pytest.mark.parametrize("kind", ["pretrain", "finetune", "adapt", "caption"])
def test_any_number_of_workers_gives_the_same_batches(kind):
    task = make_task(kind)
    want = read_in_process(task)
    key = "text" if kind in ("pretrain", "finetune") else "pairs"
    assert len(want[0]) >= 3 and not torch.equal(want[0][0][key], want[1][0][key])   # epochs differ
    read = "features" if kind in ("pretrain", "finetune") else "pixels"
    assert all(read in b for e in want for b in e)      # the rows really are read ahead, not in the step
    for workers in (0, 2):   # 2 workers persist from epoch 0 into epoch 1
        assert_same(through_loader(task, workers), want, f"{kind}, {workers} workers")
    # a resumed epoch starts after the consumed batches (their draws replayed, their rows never read)
    assert_same(through_loader(task, 2, epochs=(0,), skip=2), [want[0][2:]], "resumed")


@pytest.mark.parametrize("kind", ["pretrain", "adapt"])
def test_a_step_on_rows_read_ahead_equals_a_step_that_reads_them(kind):
    task = make_task(kind)
    torch.manual_seed(0)
    model = task.build_model()
    seen = set()
    for batch in (b for e in range(3) for b in task.batches(e, epoch_generator(5, e))):
        seen.add(batch.get("task"))
        a, logs_a = task.train_step(model, batch, 0)
        b, logs_b = task.train_step(model, task.load(batch), 0)
        assert torch.equal(a, b) and logs_a == logs_b
    assert kind != "pretrain" or seen == {"mlm", "mvcl", "fda"}


def test_each_rank_reads_only_its_shard(monkeypatch):
    """Under torchrun the sampler shards a global batch before a worker reads it: rank r's batches are the
    in-process shard of rank r, and the two ranks' rows make up the global batch."""
    task = make_task("pretrain")
    whole = read_in_process(task, epochs=(0,))[0]
    monkeypatch.setattr(distributed, "world", lambda: 2)
    per_rank = []
    for r in (0, 1):
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        want = [task.load(task.shard(b)) for b in task.batches(0, epoch_generator(5, 0))]
        got = through_loader(task, 2, epochs=(0,))[0]
        assert_same(got, want, f"rank {r}")
        per_rank.append(got)
    for b, r0, r1 in zip(whole, *per_rank):
        if b["task"] == "mvcl":       # each rank keeps the global batch's features as its negatives
            assert_same(r0["negative_features"], b["features"])
            assert_same(r1["negative_features"], b["features"])
        rows = torch.cat([r0["pairs"], r1["pairs"]])
        assert sorted(rows.tolist()) == sorted(b["pairs"].tolist()) and len(r0["pairs"]) < len(b["pairs"])
        assert torch.equal(torch.cat([r0["features"][0], r1["features"][0]]).sum(0), b["features"][0].sum(0))


def test_workers_train_the_same_run(tmp_path):
    """A run with dropout across an epoch boundary: 2 workers give the losses and weights of reading in process,
    bit for bit, and stop when the run ends."""
    before = len(multiprocessing.active_children())
    model = {**worker.MODEL, "dropout": 0.1}
    out = {}
    for workers in (0, 2):
        task = worker.PretrainTask(worker.tiny_pcl_data(), model, batch_size=6,
                                   ratios={"mlm": 2, "mvcl": 1, "fda": 1}, steps_per_epoch=4, **worker.PRETRAIN)
        fit(task, train_config(dict(max_steps=10, lr=3e-3, log_every=1, seed=5)), tmp_path / str(workers), progress=False,
            loader={"workers": workers})
        rows = [json.loads(line) for line in (tmp_path / str(workers) / "log.jsonl").read_text().splitlines()]
        out[workers] = ([r["loss"] for r in rows if "loss" in r],
                        torch.load(tmp_path / str(workers) / "last.pt", weights_only=True)["model"])
    assert len(out[0][0]) == 10 and len(set(out[0][0])) > 5
    assert out[2][0] == out[0][0]
    assert all(torch.equal(out[0][1][k], out[2][1][k]) for k in out[0][1])
    assert len(multiprocessing.active_children()) == before


def test_starting_an_epoch_leaves_the_global_rng_alone():
    """DataLoader seeds its workers from torch's global RNG unless it has a generator of its own; a draw there
    would move every later dropout mask of a run."""
    task = make_task("pretrain")
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    loader = BatchLoader(task, 5, LoaderConfig(workers=0), CPU)
    next(loader.epoch(0))
    assert torch.equal(torch.rand(4), want)


def test_loader_settings_are_checked():
    assert LoaderConfig.from_dict(None) == LoaderConfig(workers=0, prefetch=2)
    assert LoaderConfig.from_dict({"workers": 4}).workers == 4
    for bad, word in [({"wokers": 2}, "unknown loader settings"), ({"workers": -1}, "integer >= 0"),
                      ({"workers": True}, "integer >= 0"), ({"prefetch": 0}, "integer >= 1")]:
        with pytest.raises(ConfigError, match=word):
            LoaderConfig.from_dict(bad)


def test_every_training_config_reads_in_process_by_default():
    """workers 0 in every profile (the one runtime block): the kit's pinned results were trained that way (workers
    change speed only)."""
    for profile in PROFILES:
        assert LoaderConfig.from_dict(load_config("runtime", profile)["loader"]).workers == 0
