"""Make variables reach the commands as data, never as shell or make code: a value such as ``x; touch PWNED``,
``$(shell touch PWNED)``, backticks, ``$(...)``, blanks or quotes, set on the command line or in the environment,
runs nothing and arrives as one literal argument (NOTEBOOKS: a list, split at blanks only).

The real runs use a copy of the Makefile beside a fake, already set-up venv whose ``python`` and ``torchrun`` only
record their arguments, so `make reproduce` and `make test` run in milliseconds and nothing is installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

PAYLOADS = {"semicolon": "x; touch PWNED", "make-shell": "$(shell touch PWNED)", "backticks": "`touch PWNED`",
            "command-substitution": "$(touch PWNED)", "make-escaped": "$$(touch PWNED)",
            "blanks-and-quotes": "a dir/with 'single' \"double\" quotes", "glob-and-pipe": "* | touch PWNED &",
            "newline": "x\ntouch PWNED", "comment-and-backslash": "x # \\ ; touch PWNED"}
#: every variable a user sets (the Makefile's USER_VARIABLES), with the option that carries it to the kit
OPTIONS = {"CLEVR_ROOT": "--clevr-root", "SPOT_ROOT": "--spot-root", "IER_ROOT": "--ier-root",
           "BIRDS_ROOT": "--birds-root", "PCL_CKPT": "--released-checkpoint",
           "CLIP4IDC_CKPT": "--released-caption-checkpoint", "CLIP4IDC_ADAPT_CKPT": "--released-adapt-checkpoint",
           "PROFILE": "--profile", "DEVICE": "--device", "JOBS": "--jobs"}
OTHERS = ("PYTHON", "NOTEBOOKS", "NPROC", "TEST_WORKERS", "GPU_CHECK_OUT", "GPU_CHECK_PY")

RECORDER = """#!{python}
import json, sys
args = sys.argv[1:]
if args[:1] == ["-c"] and "FAMILIES" in args[1]:
    print("pcl duda")                      # make's $(shell ...) asking for the table manifest's families
else:
    with open({log!r}, "a") as f:
        f.write(json.dumps([sys.argv[0].rsplit("/", 1)[-1], *args]) + "\\n")
"""


@pytest.fixture
def clone(tmp_path):
    """A working copy: the Makefile, pyproject.toml and a fake venv stamped as set up (newer than pyproject.toml),
    a PATH with a fake java, and IDCKIT_CHROMIUM set so `setup` installs nothing."""
    work = tmp_path / "clone"
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", work)
    shutil.copy(ROOT / "pyproject.toml", work)
    log = tmp_path / "argv.jsonl"
    tools = tmp_path / "tools"
    tools.mkdir()
    for exe in (work / ".venv" / "bin" / "python", work / ".venv" / "bin" / "torchrun", tools / "java",
                tools / "recorded-python"):
        exe.write_text(RECORDER.format(python=sys.executable, log=str(log)))
        exe.chmod(0o755)
    stamp = work / ".venv" / ".idckit-installed"
    stamp.touch()
    later = (work / "pyproject.toml").stat().st_mtime + 100
    os.utime(stamp, (later, later))
    return work


def make(work: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in (*OPTIONS, *OTHERS) and not k.startswith("MAKE") and k != "MFLAGS"}
    base.update(PATH=f"{work.parent / 'tools'}{os.pathsep}{os.environ['PATH']}", IDCKIT_CHROMIUM="/bin/true")
    out = subprocess.run(["make", "--no-print-directory", *args], cwd=work, env={**base, **(env or {})},
                         capture_output=True, text=True, timeout=60)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def calls(work: Path) -> list[list[str]]:
    log = work.parent / "argv.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def pwned(work: Path) -> list[Path]:
    return list(work.parent.rglob("PWNED")) + list(ROOT.glob("PWNED"))


def option(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("how", ["environment", "command-line"])
@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_make_reproduce_passes_every_value_as_one_literal_argument(payload, how, clone):
    values = {**{v: payload for v in OPTIONS}, "NOTEBOOKS": payload, "NPROC": payload}
    if how == "environment":
        make(clone, "reproduce", env=values)
    else:
        make(clone, "reproduce", *(f"{k}={v}" for k, v in values.items()))
    assert not pwned(clone)
    runs = calls(clone)
    torchrun = [c for c in runs if c[0] == "torchrun"]
    (notebooks,) = [c for c in runs if c[0] == "python"]
    assert [c[c.index("train") + 1] for c in torchrun] == ["pcl", "duda", "clip4idc"]   # NPROC is not "1"
    for argv in torchrun:
        assert f"--nproc_per_node={payload}" in argv
        assert all(option(argv, OPTIONS[v]) == payload for v in ("CLEVR_ROOT", "BIRDS_ROOT", "PROFILE", "DEVICE"))
    assert notebooks[1:4] == ["-m", "idckit.cli", "reproduce"]
    assert all(option(notebooks, flag) == payload for flag in OPTIONS.values())
    assert notebooks[-len(payload.split()):] == payload.split()      # NOTEBOOKS: names split at blanks, as typed


@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_a_dry_run_shows_no_value_in_the_shell_text(payload, clone):
    """`make -n` prints the shell text make would run: the values are never part of it (they travel in the
    environment), and make's own $(shell ...) (the FAMILIES line) runs nothing either."""
    values = {**{v: payload for v in (*OPTIONS, *OTHERS)}, "NPROC": "2"}
    out = make(clone, "-n", "reproduce", "test", "doctor", "gpu-check", *(f"{k}={v}" for k, v in values.items()))
    assert "PWNED" not in out.stdout and not pwned(clone)
    assert '--clevr-root "$CLEVR_ROOT"' in out.stdout and "for f in pcl duda; do" in out.stdout


@pytest.mark.parametrize("name", ["VENV", "PY", "STAMP", "FAMILIES", "ROOT_ARGS", "TRAIN_ARGS",
                                  "SCREENSHOT_REPORTS"])
def test_the_kits_own_make_names_cannot_be_overridden_into_code(name, clone):
    for args in (["-n", "reproduce", "NPROC=2"], ["-n", "screenshots"]):
        out = make(clone, *args, f"{name}=x; touch PWNED $(shell touch PWNED)", check=False)
        assert not pwned(clone), (name, args, out.stdout + out.stderr)
        assert "touch PWNED" not in out.stdout


@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_make_test_doctor_and_gpu_check_pass_their_values_literally(payload, clone):
    recorder = str(clone.parent / "tools" / "recorded-python")
    make(clone, "test", "doctor", "gpu-check", env={"TEST_WORKERS": payload, "PROFILE": payload,
                                                     "SPOT_ROOT": payload, "DEVICE": payload,
                                                     "GPU_CHECK_OUT": payload, "GPU_CHECK_PY": recorder})
    assert not pwned(clone)
    test, doctor, gpu = calls(clone)
    assert test[1:] == ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", payload]    # what CI runs
    assert doctor[1:4] == ["-m", "idckit.cli", "doctor"] and option(doctor, "--profile") == payload
    assert option(doctor, "--spot-root") == payload
    assert gpu[0] == "recorded-python" and gpu[1:3] == ["-m", "idckit.cli.gpu_check"]
    assert option(gpu, "--out") == payload and option(gpu, "--device") == payload


@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_an_interpreter_name_is_one_program_never_a_command_line(payload, clone):
    (clone / ".venv" / ".idckit-installed").unlink()                 # so the venv recipe runs: PYTHON is asked for
    out = make(clone, "setup", env={"PYTHON": payload}, check=False)
    assert out.returncode != 0 and f"idckit: {payload} not found" in out.stdout
    out = make(clone, "gpu-check", env={"GPU_CHECK_PY": payload}, check=False)
    assert out.returncode != 0 and not pwned(clone)


def test_help_shows_the_values_as_text(clone):
    payload = "x\"; touch PWNED; echo \"$(touch PWNED)"
    out = make(clone, "help", env={"PROFILE": payload, "TEST_WORKERS": payload})
    assert not pwned(clone)
    assert f"(PROFILE={payload}; smoke|cpu|paper;" in out.stdout
    assert f"(TEST_WORKERS={payload} processes)" in out.stdout


def test_plain_values_keep_their_meaning(clone):
    """Normal use is unchanged: defaults, NOTEBOOKS as a list, NPROC=1 training in the notebooks."""
    make(clone, "reproduce", "NOTEBOOKS=table2_clevr_change table3_change_types", "JOBS=2")
    make(clone, "test", "TEST_WORKERS=0")
    make(clone, "gpu-check", "DEVICE=cpu")
    notebooks, test, gpu = calls(clone)
    assert notebooks[1:] == ["-m", "idckit.cli", "reproduce", "--profile", "cpu", "--jobs", "2",
                             "table2_clevr_change", "table3_change_types"]
    assert test[1:] == ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    assert gpu[1:] == ["-m", "idckit.cli.gpu_check", "--out", "gpu_check", "--device", "cpu"]   # the venv's python


def test_nproc_trains_every_family_under_torchrun_with_plain_values(clone):
    make(clone, "reproduce", "NPROC=2", "PROFILE=smoke", "DEVICE=cpu", "NOTEBOOKS=table2_clevr_change")
    *trains, notebooks = calls(clone)
    common = ["--standalone", "--nproc_per_node=2", "-m", "idckit.cli", "train"]
    assert trains == [["torchrun", *common, "pcl", "--profile", "smoke", "--device", "cpu"],
                      ["torchrun", *common, "duda", "--profile", "smoke", "--device", "cpu"],
                      ["torchrun", *common, "clip4idc", "--profile", "smoke", "--device", "cpu",
                       "--variants", "clip4idc", "--seeds", "1", "2"]]
    assert notebooks[1:] == ["-m", "idckit.cli", "reproduce", "--profile", "smoke", "--device", "cpu",
                             "table2_clevr_change"]
