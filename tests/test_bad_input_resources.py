"""Resource limits end in one idckit error, not a traceback: a full disk, a quota, a file-size limit, a read-only
place, an over-long name, too little memory or an unreadable file gives ``idckit: error:`` naming the path and the
fix, exit 2 (the CLI boundary, :func:`idckit.cli.main`), and leaves nothing half-written.

Limits a test cannot reach for real (a full disk) are simulated by making the write raise the errno the kernel
would; the file-size limit is a real ``RLIMIT_FSIZE`` in a subprocess, the over-long name a real one.
"""
from __future__ import annotations

import errno
import json
import os
import pathlib
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_clevr_change
from idckit.cli import main


def _fail_writes_under(monkeypatch, where: Path, code: int) -> None:
    """Every write of a file under ``where`` through pathlib (the kit's atomic writes, the generators) raises
    ``code`` as the kernel would: an OSError whose filename is the file."""
    real = pathlib.Path.open

    def fake(self, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and Path(os.path.abspath(self)).is_relative_to(where.resolve()):
            raise OSError(code, os.strerror(code), str(self))
        return real(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", fake)


def _fail_reads_of(monkeypatch, name: str) -> None:
    """Reading a file called ``name`` raises PermissionError, as for a file the user may not read (the tests run
    as root, who may read anything, so chmod would not do)."""
    import builtins
    import io

    real_path_open, real_open = pathlib.Path.open, builtins.open

    def denied(file):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))

    def path_open(self, mode="r", *args, **kwargs):
        if self.name == name:
            raise denied(self)
        return real_path_open(self, mode, *args, **kwargs)

    def plain_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).name == name:
            raise denied(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", plain_open)
    monkeypatch.setattr(io, "open", plain_open)


def _error(capsys, argv: list[str]) -> str:
    """Run the CLI, assert it ended in the kit's own error (exit 2, no traceback) and return that error."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "idckit: error:" in err and "Traceback" not in err
    assert "fix:" in err
    return err


def _leftovers(folder: Path) -> list[str]:
    """Temporary files and staging folders a failed write must not leave behind."""
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or ".idckit-staging-" in p.name)


@pytest.fixture
def clevr(tmp_path) -> Path:
    return write_clevr_change(tmp_path / "clevr")


VERIFY = ["verify-data", "--dataset", "clevr-change", "--counts", "none", "--fast"]


# -- every errno of a failed write, at the CLI boundary ----------------------------------------------------------
@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "no space left"), (errno.EDQUOT, "quota"), (errno.EFBIG, "file-size limit"),
    (errno.EROFS, "read-only"), (errno.EACCES, "permission"), (errno.EPERM, "permission"),
    (errno.ENAMETOOLONG, "too long"), (errno.EMFILE, "open files")])
def test_a_failed_write_is_one_idckit_error_naming_the_file(clevr, tmp_path, capsys, monkeypatch, code, words):
    out = tmp_path / "reports" / "verify.json"
    out.parent.mkdir()
    _fail_writes_under(monkeypatch, out.parent, code)
    err = _error(capsys, [*VERIFY, str(clevr), "--json", str(out)])
    assert words in err.lower()
    assert str(out) in err          # the user's file, not the kit's temporary name beside it
    assert not out.exists() and _leftovers(out.parent) == []


def test_a_full_disk_while_generating_leaves_no_dataset_and_no_staging(tmp_path, capsys, monkeypatch):
    out = tmp_path / "synth"
    _fail_writes_under(monkeypatch, tmp_path, errno.ENOSPC)
    err = _error(capsys, ["generate", "spot-the-diff", "--out", str(out), "--pairs", "20", "--workers", "1"])
    assert "no space left" in err.lower() and f"path: {out}\n" in err    # the output, not its staging folder
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_full_disk_while_scoring_keeps_no_scores_file(clevr, tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    ids = ("000002.png", "000002.png_n", "000005.png", "000005.png_n")
    (results / "sc_results.json").write_text(json.dumps([{"image_id": i, "caption": "the cube is gone"}
                                                         for i in ids if not i.endswith("_n")]))
    (results / "nsc_results.json").write_text(json.dumps([{"image_id": i, "caption": "nothing has changed"}
                                                          for i in ids if i.endswith("_n")]))
    out = tmp_path / "scores" / "scores.json"
    out.parent.mkdir()
    _fail_writes_under(monkeypatch, out.parent, errno.ENOSPC)
    err = _error(capsys, ["evaluate", str(results), "--data", str(clevr), "--no-meteor", "--no-tokenize",
                          "--json", str(out)])
    assert str(out) in err
    assert not out.exists() and _leftovers(out.parent) == []


# -- over-long names: real ones ----------------------------------------------------------------------------------
def test_an_over_long_json_name_is_an_idckit_error(clevr, tmp_path, capsys):
    out = tmp_path / ("x" * 300 + ".json")
    err = _error(capsys, [*VERIFY, str(clevr), "--json", str(out)])
    assert "too long" in err.lower() and "x" * 300 in err


def test_an_over_long_output_folder_name_is_an_idckit_error(tmp_path, capsys):
    out = tmp_path / ("d" * 300)
    err = _error(capsys, ["generate", "spot-the-diff", "--out", str(out), "--pairs", "20", "--workers", "1"])
    assert "too long" in err.lower() and "d" * 300 in err
    assert list(tmp_path.iterdir()) == []


# -- a real file-size limit ----------------------------------------------------------------------------------
def test_a_real_file_size_limit_is_an_idckit_error_and_leaves_no_file(clevr, tmp_path):
    out = tmp_path / "verify.json"
    limit = 256                      # the report is larger; the interpreter writes nothing else (no .pyc)

    def limited():
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # so the write fails with EFBIG, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "idckit.cli", *VERIFY, str(clevr), "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, preexec_fn=limited, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "idckit: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "file-size limit" in proc.stderr and str(out) in proc.stderr and "ulimit -f" in proc.stderr
    assert not out.exists() and _leftovers(tmp_path) == []


# -- memory --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    pytest.param(["generate", "clevr-change", "--pairs", "20", "--size", "100000x100000"], "--size", id="clevr"),
    pytest.param(["generate", "clevr-change", "--pairs", "20", "--size", "4097x320"], "--size", id="clevr-4097"),
    pytest.param(["generate", "birds", "--pairs", "30", "--size", "100000"], "--size", id="birds"),
    pytest.param(["features", "DATA", "--weights", "random", "--image-size", "100000"], "--image-size",
                 id="features"),
])
def test_a_huge_image_size_is_refused_while_parsing(tmp_path, capsys, argv, words):
    argv = [str(tmp_path / "data") if a == "DATA" else a for a in argv]
    if argv[0] == "generate":
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and words in err and "at most 4096" in err
    assert list(tmp_path.iterdir()) == []


def test_numpy_out_of_memory_is_an_idckit_error(capsys, monkeypatch):
    import idckit.cli.verify_data

    def allocate(*args, **kwargs):
        np.empty((1 << 40, 1 << 10), dtype=np.float64)    # 8 PiB: refused at once, nothing touched

    monkeypatch.setattr(idckit.cli.verify_data, "main", allocate)
    err = _error(capsys, [*VERIFY, "anywhere"])
    assert "out of memory" in err.lower() and "PiB" in err


def test_python_out_of_memory_is_an_idckit_error(capsys, monkeypatch):
    import idckit.cli.verify_data

    def allocate(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(idckit.cli.verify_data, "main", allocate)
    err = _error(capsys, [*VERIFY, "anywhere"])
    assert "out of memory" in err.lower()


# -- the feature store's memmap: allocated up front (a full disk is an error, never SIGBUS) ----------------------
class _Tiny:
    """A backbone that costs nothing: every 32nd pixel of the image (a 7x7 grid at 224 px), repeated to 600
    channels so that the store (1 MB) spans many more disk blocks than numpy's header and last byte."""

    def __call__(self, name, weights=None):
        import torch

        return torch.nn.Identity(), (lambda x: x[:, :, ::32, ::32].repeat(1, 200, 1, 1)), "tiny (for tests)"


def test_the_feature_memmap_is_allocated_before_it_is_written(clevr, tmp_path, monkeypatch):
    from idckit.data import features

    monkeypatch.setattr(features, "build_backbone", _Tiny())
    out = tmp_path / "store"
    assert features.extract_features(clevr, "tiny", out_dir=out, max_batches=0, progress=False, device="cpu") is None
    st = (out / "features.npy").stat()
    # a sparse file would take its pages only when the rows are written: on a full disk, a SIGBUS then
    assert st.st_blocks * 512 >= st.st_size


def test_a_full_disk_for_the_feature_memmap_is_an_idckit_error(clevr, tmp_path, capsys, monkeypatch):
    from idckit.data import features

    monkeypatch.setattr(features, "build_backbone", _Tiny())

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    out = tmp_path / "store"
    err = _error(capsys, ["features", str(clevr), "--backbone", "tiny", "--out", str(out), "--device", "cpu"])
    assert "no space left" in err.lower() and str(out / "features.npy") in err
    assert not (out / "features.npy").exists()          # nothing a later run could map and fault on
    assert not json.loads((out / "meta.json").read_text())["complete"]


# -- unreadable files -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["change_captions.json", "splits.json"])
def test_an_unreadable_dataset_file_in_verify_data_is_an_idckit_error(clevr, capsys, monkeypatch, name):
    _fail_reads_of(monkeypatch, name)
    err = _error(capsys, [*VERIFY, str(clevr)])
    assert "permission" in err.lower() and name in err


@pytest.mark.parametrize("name", ["sc_results.json", "type_mapping.json"])
def test_an_unreadable_file_in_evaluate_is_an_idckit_error(clevr, tmp_path, capsys, monkeypatch, name):
    results = tmp_path / "results"
    results.mkdir()
    (results / "sc_results.json").write_text(json.dumps([{"image_id": "000002.png", "caption": "a"},
                                                         {"image_id": "000005.png", "caption": "b"}]))
    (results / "nsc_results.json").write_text(json.dumps([{"image_id": "000002.png_n", "caption": "c"},
                                                          {"image_id": "000005.png_n", "caption": "d"}]))
    _fail_reads_of(monkeypatch, name)
    err = _error(capsys, ["evaluate", str(results), "--data", str(clevr), "--no-meteor", "--no-tokenize"])
    assert "permission" in err.lower() and name in err


# -- the atomic write policy removes its temporary file on these errors ---------------------------------------
def test_an_atomic_write_cut_by_a_full_disk_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    from idckit import fileio

    path = tmp_path / "scores.json"
    path.write_text('{"old": 1}')
    real = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError) as e:
        fileio.write_json(path, {"new": 2})
    monkeypatch.setattr(os, "replace", real)
    assert e.value.filename == str(path)      # the boundary names the user's file, not the temporary one
    assert path.read_text() == '{"old": 1}' and _leftovers(tmp_path) == []


# -- torch checkpoints: torch's own writer says only "unexpected pos"; through a Python file the OSError shows --------
def test_a_real_file_size_limit_while_importing_a_checkpoint_is_an_idckit_error(tmp_path):
    from test_checkpoint_import import authors_files

    rec, ckpt, vocab = authors_files(tmp_path, "clver_finetune")
    out = tmp_path / "runs" / "idc-pcl-clevr"
    limit = 4096                   # best.pt is larger

    def limited():
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "idckit.cli", "import-checkpoint", "--from", "idc-pcl", str(ckpt),
                           "--out", str(out), "--vocab", str(vocab), "--max-len", str(rec["max_len"]),
                           "--heads", str(rec["sizes"]["heads"])],
                          capture_output=True, text=True, cwd=tmp_path, env=env, preexec_fn=limited, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "idckit: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "file-size limit" in proc.stderr and f"path: {out}\n" in proc.stderr
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_checkpoint_write_cut_by_a_full_disk_names_the_checkpoint(tmp_path, monkeypatch):
    import io

    import torch

    from idckit import fileio
    from idckit.errors import resource_error

    class Full(io.BytesIO):
        def write(self, data):                      # as a file on a full disk: write() raises, naming no file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "open", lambda path, mode: Full(), raising=False)
    path = tmp_path / "run" / "last.pt"
    with pytest.raises((OSError, RuntimeError)) as e:     # the OSError, or torch's RuntimeError around it
        with fileio.atomic_path(path) as tmp:
            fileio.torch_save({"w": torch.zeros(4)}, tmp)
    monkeypatch.undo()
    mapped = resource_error(e.value)
    assert mapped is not None and "no space left" in str(mapped) and mapped.path == path
    assert not path.exists() and _leftovers(tmp_path) == []


def test_torch_out_of_memory_is_an_idckit_error(capsys, monkeypatch):
    import torch

    import idckit.cli.verify_data

    def allocate(*args, **kwargs):
        torch.empty(1 << 50, dtype=torch.uint8)      # 1 PiB: torch's CPU allocator refuses with a RuntimeError

    monkeypatch.setattr(idckit.cli.verify_data, "main", allocate)
    err = _error(capsys, [*VERIFY, "anywhere"])
    assert "out of memory" in err.lower() and "1048576.0 GiB" in err and "enforce fail" not in err


@pytest.mark.parametrize("option, value", [("--limit", "-1"), ("--workers", "0"), ("--workers", "-2")])
def test_verify_data_counts_below_their_floor_are_refused_while_parsing(clevr, capsys, option, value):
    # a --limit of -1 printed all findings but one and "... and N+1 more"; a worker count below 1 was ignored
    with pytest.raises(SystemExit) as exit_:
        main([*VERIFY, str(clevr), option, value])
    assert exit_.value.code == 2 and f"{option} must be at least" in capsys.readouterr().err


def test_a_full_disk_while_logging_a_run_names_its_log(tmp_path, monkeypatch):
    import io

    from test_loop import ToyTask

    from idckit.errors import resource_error
    from idckit.experiments.config import train_config
    from idckit.train.loop import fit

    class Full(io.StringIO):
        def write(self, text):                  # as a file on a full disk: write() raises, naming no file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = pathlib.Path.open
    monkeypatch.setattr(pathlib.Path, "open", lambda self, mode="r", *a, **k: Full() if self.name == "log.jsonl"
                        else real(self, mode, *a, **k))
    with pytest.raises(OSError) as e:
        fit(ToyTask(), train_config(dict(max_steps=4, lr=1e-2, eval_every=2)), tmp_path / "run", progress=False)
    mapped = resource_error(e.value)
    assert mapped is not None and mapped.path == tmp_path / "run" / "log.jsonl"
