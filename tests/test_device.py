"""The device setting: resolution, mixed precision by device, and checkpoints that load on any machine."""
from __future__ import annotations

import zipfile

import pytest
import torch

from idckit import device as devices
from idckit.cli import build_parser
from idckit.errors import ConfigError
from idckit.experiments.config import load_config
from idckit.experiments.config import train_config
from idckit.train.loop import fit, load_best


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    """CUDA's answers for a 2-GPU machine, to test the resolution logic on a CPU-only one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_is_cuda_then_mps_then_cpu(no_accelerator, monkeypatch):
    assert devices.resolve("auto") == devices.resolve(None) == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.resolve("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert devices.resolve("auto") == torch.device("cuda", 0)


def test_explicit_devices_and_torchrun_local_rank(two_gpus, monkeypatch):
    assert devices.resolve("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve(" CPU ") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "1")            # torchrun's second process on this node
    assert devices.resolve("cuda") == devices.resolve("auto") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="there are 2 GPUs"):
        devices.resolve("cuda:2")


def test_absent_or_unknown_devices_say_what_to_use(no_accelerator):
    with pytest.raises(ConfigError, match="no CUDA GPU") as err:
        devices.resolve("cuda:1")
    assert "--device cpu" in str(err.value)
    with pytest.raises(ConfigError, match="MPS is not available"):
        devices.resolve("mps")
    with pytest.raises(ConfigError, match="device"):
        devices.resolve("gpu0")


def test_mixed_precision_follows_the_device(monkeypatch):
    assert devices.amp_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)        # e.g. a V100 or a T4
    assert devices.amp_dtype(torch.device("cuda", 0)) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)         # Ampere and later
    assert devices.amp_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert not devices.grad_scaler(torch.device("cpu"), True).is_enabled()      # bf16 needs no loss scaling
    assert not devices.grad_scaler(torch.device("cpu"), False).is_enabled()


class Linear:
    """A one-layer regression whose steps record the dtype their matmul ran in."""

    selection_metric = "neg_mse"

    def __init__(self, crash_at=None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
        self.dtypes, self.crash_at = [], crash_at

    def build_model(self):
        return torch.nn.Linear(4, 1)

    def param_groups(self, model):
        return [{"params": model.parameters()}]

    def batches(self, epoch, generator):
        order = torch.randperm(32, generator=generator)
        yield from order.split(8)

    def train_step(self, model, idx, step):
        if step == self.crash_at:
            raise KeyboardInterrupt("simulated kill")
        dev = devices.model_device(model)
        out = model(self.x[idx].to(dev))
        self.dtypes.append(out.dtype)
        return torch.nn.functional.mse_loss(out.float(), self.y[idx].to(dev)), {}

    def evaluate(self, model, split="val"):
        with torch.no_grad():
            return {"neg_mse": -float(torch.nn.functional.mse_loss(model(self.x), self.y))}


def test_amp_autocasts_the_step_on_the_run_device(tmp_path):
    fp32, amp = Linear(), Linear()
    fit(fp32, train_config(dict(max_steps=2, lr=0.1, seed=0)), tmp_path / "fp32", progress=False, device="cpu")
    fit(amp, train_config(dict(max_steps=2, lr=0.1, seed=0, amp=True)), tmp_path / "amp", progress=False, device="cpu")
    assert fp32.dtypes == [torch.float32] * 2 and amp.dtypes == [torch.bfloat16] * 2


def as_if_written_on_a_gpu(path):
    """Rewrite a torch.save file so that every tensor says it was saved from cuda:0 (as a GPU run writes it)."""
    src = zipfile.ZipFile(path)
    items = [(i.filename, src.read(i.filename)) for i in src.infolist()]
    src.close()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for name, data in items:
            if name.endswith("data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(name, data)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_checkpoints_written_on_a_gpu_resume_and_load_on_the_cpu(tmp_path):
    cfg = train_config(dict(max_steps=8, lr=0.05, eval_every=2, checkpoint_every=2, seed=1))
    whole = fit(Linear(), cfg, tmp_path / "whole", progress=False, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        fit(Linear(crash_at=5), cfg, tmp_path / "gpu", progress=False, device="cpu")
    for name in ("last.pt", "best.pt"):
        as_if_written_on_a_gpu(tmp_path / "gpu" / name)
    with pytest.raises(RuntimeError, match="CUDA"):              # the files really are GPU-tagged
        torch.load(tmp_path / "gpu" / "last.pt", weights_only=True)
    assert load_best(Linear(), tmp_path / "gpu").weight.device.type == "cpu"
    resumed = fit(Linear(), cfg, tmp_path / "gpu", progress=False, device="cpu")
    scores = lambda r: [(h["step"], h["neg_mse"]) for h in r.history]  # noqa: E731
    assert resumed.steps == 8 and scores(resumed) == scores(whole)
    assert torch.equal(resumed.model.weight, whole.model.weight)
    saved = torch.load(tmp_path / "gpu" / "last.pt", weights_only=True)          # what the kit writes: CPU
    assert saved["model"]["weight"].device.type == "cpu"


def test_device_lives_in_the_configs_and_on_the_command_line():
    for profile in ("smoke", "cpu", "paper"):      # one runtime block for every kind of run
        assert load_config("runtime", profile)["device"] == "auto"
    for name in ("pcl", "pcl_birds", "duda", "clip_standin", "clip4idc_adapt", "clip4idc_caption"):
        assert "device" not in load_config(name, "cpu") and "loader" not in load_config(name, "cpu")
    p = build_parser()
    assert p.parse_args(["features", "/d", "--device", "cuda:1"]).device == "cuda:1"
    assert p.parse_args(["caption", "a.png", "b.png", "--device", "cpu"]).device == "cpu"
    assert p.parse_args(["reproduce", "--device", "cuda"]).device == "cuda"
    assert p.parse_args(["pretrain-clip"]).device is None
