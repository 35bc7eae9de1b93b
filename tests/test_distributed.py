"""torchrun + DistributedDataParallel on the CPU: 2 gloo processes against 1 process at the same global batch.

The 2-process runs are real ``torchrun --nproc_per_node=2`` launches of tests/ddp_worker.py (the kit's IDC-PCL
pre-training and fine-tuning tasks, CLIP4IDC adaptation with all-gathered InfoNCE negatives and captioning on the
stand-in CLIP); the 1-process runs call the same functions in this process.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from numeric import assert_close

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("ddp_worker", HERE / "ddp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "ddp_worker.py"), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"torchrun failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r["eval"].items() if k != "minutes"} for r in rows if "eval" in r]


def weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("model", state)


def assert_close_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        x, y = wa[k], wb[k]
        if k.endswith("key.bias"):     # (see below) a separate key projection's bias: all of it is noise
            continue
        if k.endswith(("attn.qkv.bias", "attn.in_proj_bias")):
            # the key bias adds the same amount to every score of a query, which softmax ignores: its gradient is
            # zero up to rounding, and Adam scales that rounding up to lr-sized steps, so it is noise in any run
            d = x.shape[0] // 3
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        assert_close(x, y, rtol=1e-4, what=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same runs with 2 processes (one torchrun launch) and with 1 (here)."""
    two, one = tmp_path_factory.mktemp("two"), tmp_path_factory.mktemp("one")
    torchrun("all", str(two))
    torch.set_num_threads(1)
    worker.pretrain(one / "pretrain")
    worker.adapt(one / "adapt")
    worker.caption(one / "caption")
    worker.finetune(one / "finetune")
    worker.finetune(one / "finetune_grouped", grouped=True)
    return one, two


@pytest.mark.parametrize("kind", ["pretrain", "adapt", "caption", "finetune", "finetune_grouped"])
def test_two_processes_follow_the_one_process_loss_trajectory(runs, kind):
    one, two = runs
    a, b = losses(one / kind), losses(two / kind)
    assert len(a) == len(b) == (4 if kind in ("adapt", "caption") else 8)
    assert a != pytest.approx(a[0])          # the loss moves, so agreeing is not trivial
    assert_close(b, a, rtol=1e-5)
    assert_close_weights(one / kind / "last.pt", two / kind / "last.pt")
    assert evals(two / kind) == evals(one / kind)


def test_two_process_evaluation_and_selection_equal_one_process(runs):
    one, two = runs
    assert evals(two / "finetune") == evals(one / "finetune")
    stored_one = json.loads((one / "finetune" / "fit.json").read_text())
    stored_two = json.loads((two / "finetune" / "fit.json").read_text())
    assert stored_two["best_step"] == stored_one["best_step"] and stored_two["steps"] == 8
    # decoding split over 2 ranks and gathered gives every pair's caption and judgment, as one process does
    decoded = json.loads((two / "decoded.json").read_text())
    alone = worker.decode(None)
    assert decoded == alone
    assert len(set(alone["captions"].values())) > 2 and len(set(alone["judged"].values())) == 2


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A 2-process fine-tuning run killed at step 5 (both ranks stop; the last checkpoint is from step 4)."""
    out_dir = tmp_path_factory.mktemp("killed")
    out = torchrun("finetune", str(out_dir), "5", check=False)
    assert out.returncode != 0 and "simulated kill" in out.stderr
    assert not (out_dir / "finetune" / "fit.json").exists()
    assert torch.load(out_dir / "finetune" / "last.pt", weights_only=True)["loop"]["step"] == 4
    return out_dir / "finetune"


def test_two_process_checkpoint_loads_and_resumes_in_one_process(runs, killed, tmp_path):
    _, two = runs
    ckpt = torch.load(two / "finetune" / "last.pt", map_location="cpu", weights_only=True)
    assert len(ckpt["rng_ranks"]) == 2 and ckpt["loop"]["step"] == 8
    model = worker.JudgedFinetune(worker.tiny_pcl_data()).build_model()
    model.load_state_dict(ckpt["model"])                  # plain module keys, no DDP "module." prefix
    # the killed 2-process run finishes in 1 process (weights and data order resume; to float tolerance)
    shutil.copytree(killed, tmp_path / "finetune")
    worker.finetune(tmp_path / "finetune")
    assert_close_weights(tmp_path / "finetune" / "last.pt", two / "finetune" / "last.pt")


def test_killed_two_process_run_resumes_to_the_same_result(runs, killed, tmp_path):
    _, two = runs
    shutil.copytree(killed, tmp_path / "finetune")
    torchrun("finetune", str(tmp_path))
    assert losses(tmp_path / "finetune")[-3:] == losses(two / "finetune")[-3:]
    assert evals(tmp_path / "finetune") == evals(two / "finetune")
    whole, resumed = weights(two / "finetune" / "last.pt"), weights(tmp_path / "finetune" / "last.pt")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_ranks_wait_hours_not_torchs_30_minutes_while_rank_0_prepares_the_data(monkeypatch):
    """Rank 0 renders or extracts features alone in ``main_first`` while the other ranks wait at a barrier; torch's
    default collective timeout (30 min for gloo) is shorter than rendering the cpu profile's 8,000 scenes."""
    import datetime

    import torch.distributed as dist

    from idckit.train import distributed

    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    assert distributed.init(torch.device("cpu")) is True
    assert seen["backend"] == "gloo"
    assert seen["timeout"] >= datetime.timedelta(hours=2)
