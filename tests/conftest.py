"""Shared fixtures. Tests never reach a model hub: HF_HUB_OFFLINE=1 makes missing weights fail fast."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: a second torch thread in each would only make them fight for the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# CLEVR-Change's released schemas (RCC's change/no-change captions, splits, type_mapping), with one more index
# per split so no subset is a singleton.
CHANGE = {
    "CLEVR_default_000000.png": ["the small yellow rubber cylinder changed to brown",
                                 "the tiny yellow cylinder turned brown"],
    "CLEVR_default_000001.png": ["the large red metal cube has been added", "the big red thing has been newly placed"],
    "CLEVR_default_000002.png": ["the small gray rubber sphere is missing", "the tiny gray ball is gone"],
    "CLEVR_default_000003.png": ["the large blue metal cube became green", "the big blue block turned green"],
    "CLEVR_default_000004.png": ["the small cyan ball changed its location",
                                 "the tiny cyan sphere is in a different location"],
    "CLEVR_default_000005.png": ["the large purple rubber cylinder turned metallic",
                                 "the big purple cylinder became shiny"],
}
NO_CHANGE = {
    "CLEVR_default_000000.png": ["no change was made", "the two scenes seem identical"],
    "CLEVR_default_000001.png": ["there is no change"],
    "CLEVR_default_000002.png": ["nothing has changed"],
    "CLEVR_default_000003.png": ["there is no difference", "nothing was modified"],
    "CLEVR_default_000004.png": ["the scene remains the same"],
    "CLEVR_default_000005.png": ["no change has occurred"],
}
SPLITS = {"train": [0, 3], "val": [1, 4], "test": [2, 5]}
TYPES = {"color": ["000000.png", "000003.png"], "material": ["000005.png"], "add": ["000001.png"],
         "drop": ["000002.png"], "move": ["000004.png"]}


def write_clevr_change(root: Path, *, image_size=(8, 6)) -> Path:
    from PIL import Image

    for sub, prefix in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            shade = (40 * i, 100 if sub == "sc_images" else 50, 200 if sub == "nsc_images" else 20)
            Image.new("RGB", image_size, shade).save(root / sub / f"CLEVR_{prefix}_{i:06d}.png")
    for name, obj in (("change_captions.json", CHANGE), ("no_change_captions.json", NO_CHANGE),
                      ("splits.json", SPLITS), ("type_mapping.json", TYPES)):
        (root / name).write_text(json.dumps(obj))
    return root


@pytest.fixture
def tiny_clevr(tmp_path) -> Path:
    """A six-index CLEVR-Change directory in the official layout (tiny solid-colour PNGs)."""
    return write_clevr_change(tmp_path / "clevr_change")


@pytest.fixture
def pairs(tiny_clevr, tmp_path):
    """CLIP4IDC's pair data of ``tiny_clevr`` at 112 px, captions of at most 32 tokens."""
    from idckit.data.clevr_change import ClevrChange       # conftest stays light: only CLIP tests pay for these
    from idckit.tasks.clip4idc import load_pair_data

    return load_pair_data(ClevrChange(tiny_clevr), 112, max_len=32, cache_dir=tmp_path / "pairs")


@pytest.fixture
def clip_file(tmp_path):
    """A randomly initialised stand-in CLIP (seed 0) saved as a weights file."""
    import torch

    from idckit.models.clip_loader import load_clip, save_clip_checkpoint

    torch.manual_seed(0)
    clip, _, _ = load_clip("idckit-standin-ViT-T-16", None)
    return str(save_clip_checkpoint(clip, tmp_path / "clip.pt", "idckit-standin-ViT-T-16"))


# -- tests never touch the project tree -------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
#: the kit's folders (idckit.paths), pointed outside the clone for the whole session; a test may set its own
KIT_DIRS = {"IDCKIT_DATA_DIR": "data", "IDCKIT_RUNS_DIR": "runs", "IDCKIT_REPORTS_DIR": "reports"}
#: the clone's folders no test may write, checked after every session (pytest_sessionfinish)
GUARDED = ("data", "runs", "reports")
#: what running Python and pip leave in a clone: not a test's output
_NOT_OUTPUT = ("__pycache__", ".pytest_cache", ".venv", ".egg-info", ".make-stamps")


@pytest.fixture(scope="session", autouse=True)
def kit_dirs_outside_the_clone(tmp_path_factory):
    """Without it a test that forgets its tmp_path, a CLI subprocess or a notebook kernel (they inherit the
    environment) renders datasets and trains runs into the clone; set per process, so per xdist worker too."""
    base = tmp_path_factory.mktemp("kit")
    with pytest.MonkeyPatch.context() as mp:
        for env, sub in KIT_DIRS.items():
            mp.setenv(env, str(base / sub))
        yield base


class FakeReproduce:
    """What :func:`fake_reproduce` saw: the prepare steps it skipped and the notebooks it "ran"."""

    def __init__(self):
        self.ok, self.prepared, self.ran = True, [], []

    def run_one(self, nb, *, report_dir, **kw):
        from idckit.reproduce import Outcome

        self.ran.append(nb.stem)
        if self.ok:
            (report_dir / f"{nb.stem}.json").write_text(json.dumps({"notebook": nb.stem, "provenance": {}}))
            (report_dir / f"{nb.stem}.html").write_text("<html></html>")
        return Outcome(nb.stem, self.ok, 1.0, "" if self.ok else "RuntimeError: boom")


@pytest.fixture
def fake_reproduce(monkeypatch) -> FakeReproduce:
    """``reproduce`` (and the CLI's) with its two costly stages faked, for tests of what it writes where: each notebook
    writes a minimal report (``.ok = False``: fails instead), each prepare step is recorded, not built (the cpu
    profile's would render 8,000 scenes). The steps themselves are the real ones (one lane; spawned lanes run them)."""
    from idckit.reproduce import prepare, runner

    fake, real_steps = FakeReproduce(), prepare.prepare_steps

    def prepare_steps(names, **kw):
        return {label: (lambda label=label: fake.prepared.append(label)) for label in real_steps(names, **kw)}

    monkeypatch.setattr(prepare, "prepare_steps", prepare_steps)
    monkeypatch.setattr(runner, "run_one", fake.run_one)
    return fake


def _fingerprint(p: Path) -> str:
    if p.is_dir():
        return "dir"
    try:
        return hashlib.sha1(p.read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable: {e.strerror}"


def tree_state(root: Path, *, tracked: bool) -> dict[str, str]:
    """``{path: fingerprint}`` of everything under ``root``'s data/, runs/ and reports/ (size and mtime: data/ may
    hold gigabytes); with ``tracked``, also of what ``git status`` lists elsewhere (edited or added files, by content),
    so a clean tracked file that a test edits appears as a new entry."""
    state = {}
    for top in GUARDED:
        for dirpath, dirnames, filenames in os.walk(root / top):
            here = Path(dirpath)
            state[f"{here.relative_to(root).as_posix()}/"] = "dir"
            for name in filenames:
                try:
                    st = (here / name).lstat()
                except OSError:          # removed while walking
                    continue
                state[(here / name).relative_to(root).as_posix()] = f"{st.st_size}:{st.st_mtime_ns}"
    if tracked:
        try:
            out = subprocess.run(["git", "status", "--porcelain", "-z", "--ignored", "--", ".",
                                  *(f":(exclude){top}" for top in GUARDED)], cwd=root, capture_output=True,
                                 check=True).stdout.decode("utf-8", "surrogateescape")
        except (OSError, subprocess.CalledProcessError):     # not a git clone (an sdist): the folders above only
            return state
        entries = iter(out.split("\0"))
        for entry in entries:
            code, rel = entry[:2], entry[3:]
            if code[:1] in ("R", "C"):      # a rename or copy: its source path follows
                next(entries, None)
            if rel and not any(part in rel for part in _NOT_OUTPUT):
                state[rel] = f"{code} {_fingerprint(root / rel)}"
    return state


def tree_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths added, removed or changed between two :func:`tree_state` s."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def whole_suite(config) -> bool:
    """Tracked files are checked on the whole suite (no paths given, or the testpaths) and under CI only: a developer
    running a few tests may be editing the sources meanwhile."""
    if os.environ.get("CI", "").lower() == "true":
        return True
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return True
    given = {(config.invocation_params.dir / a).resolve() for a in config.args}
    return given == {(config.rootpath / t).resolve() for t in config.getini("testpaths")}


_TREE = pytest.StashKey[tuple]()
_CHANGED = pytest.StashKey[list]()


def pytest_sessionstart(session):
    if hasattr(session.config, "workerinput"):        # an xdist worker: the controller checks the whole run
        return
    whole = whole_suite(session.config)
    session.config.stash[_TREE] = (whole, tree_state(ROOT, tracked=whole))


def pytest_sessionfinish(session):
    if _TREE not in session.config.stash:
        return
    whole, before = session.config.stash[_TREE]
    changed = tree_changes(before, tree_state(ROOT, tracked=whole))
    if os.environ.get("IDCKIT_UPDATE_EXPECTED"):      # re-pinning the smoke numbers writes them on purpose
        changed = [p for p in changed if p != "tests/expected_smoke.json"]
    if changed:
        session.config.stash[_CHANGED] = changed
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    changed = config.stash.get(_CHANGED, [])
    if changed:
        terminalreporter.section("the tests changed the project tree", sep="=", red=True, bold=True)
        for p in changed[:50]:
            terminalreporter.line(f"  {p}")
        if len(changed) > 50:
            terminalreporter.line(f"  ... and {len(changed) - 50} more")
        terminalreporter.line("a test wrote into the clone: give it a tmp_path (or a monkeypatched IDCKIT_*_DIR)")
