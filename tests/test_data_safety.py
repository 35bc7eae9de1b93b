"""Nothing lost: feature stores are not overwritten by another backbone's, smoke runs stay out of the committed
reports and the README, and files the kit writes are readable like any other file."""
from __future__ import annotations

import json
import os
import stat

import pytest

from idckit import fileio, paths
from idckit.errors import ConfigError, DatasetError
from idckit.reproduce import Outcome


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        fileio.write_json(tmp_path / "a.json", {"x": 1})
        fileio.write_text(tmp_path / "README.md", "text")
    finally:
        os.umask(old)
    for name in ("a.json", "README.md"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "a.json"]   # no temp file left


def test_features_out_refuses_another_backbones_store_and_keeps_it(tiny_clevr, tmp_path):
    from idckit.data.features import extract_features

    # the small backbone's store, and the refusal comes before the big one (ResNet-101) is built
    out = tmp_path / "store"
    two = ["images/CLEVR_default_000000.png", "sc_images/CLEVR_semantic_000000.png"]
    first = extract_features(tiny_clevr, "efficientnet_lite0", weights="random", images=two, out_dir=out,
                             progress=False)
    digest = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DatasetError, match="'efficientnet_lite0', not 'resnet101'") as err:
        extract_features(tiny_clevr, "resnet101", weights="random", images=two, out_dir=out, progress=False)
    assert str(out) in str(err.value) and err.value.fix
    assert {p.name: p.read_bytes() for p in out.iterdir()} == digest
    # the same backbone with the same weights is reused, not re-extracted
    again = extract_features(tiny_clevr, "efficientnet_lite0", weights="random", images=two, out_dir=out,
                             progress=False)
    assert again.meta == first.meta and {p.name: p.read_bytes() for p in out.iterdir()} == digest


def test_non_default_profiles_report_into_their_own_directory(tmp_path, monkeypatch, fake_reproduce):
    from idckit import reproduce as rp
    from idckit.reproduce import runner

    monkeypatch.setenv("IDCKIT_REPORTS_DIR", str(tmp_path / "reports"))
    assert paths.reports_dir() == paths.reports_dir("cpu") == tmp_path / "reports"
    assert paths.reports_dir("smoke") == tmp_path / "reports" / "smoke"
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    (nbs / "00_walkthrough.ipynb").write_text("{}")   # a name the table manifest knows
    seen = []
    monkeypatch.setattr(runner, "run_one", lambda nb, *, report_dir, **kw: seen.append(report_dir) or
                        Outcome(nb.stem, True, 1.0))
    monkeypatch.setattr(rp, "write_index", lambda d: None)
    rp.reproduce(profile="smoke", runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    assert seen == [tmp_path / "reports" / "smoke"]
    assert json.loads((tmp_path / "reports" / "smoke" / "status.json").read_text())["00_walkthrough"]["profile"] == "smoke"
    assert not (tmp_path / "reports" / "status.json").exists()


@pytest.mark.parametrize("profile, report_dir, touches", [("cpu", None, True), ("smoke", None, False),
                                                          ("paper", None, False), ("cpu", "elsewhere", False)])
def test_only_the_default_profile_into_reports_touches_the_readme(tmp_path, monkeypatch, profile, report_dir,
                                                                    touches):
    from idckit import cli, reproduce as rp
    from idckit.reports import readme

    monkeypatch.setattr(rp, "reproduce", lambda *a, **kw: [Outcome("t", True, 1.0)])
    calls = []
    monkeypatch.setattr(readme, "update_readme", lambda *a, **kw: calls.append(1))
    # the default reports/ of a project of its own (the session points IDCKIT_REPORTS_DIR out of the clone)
    monkeypatch.delenv("IDCKIT_REPORTS_DIR")
    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    argv = ["reproduce", "--profile", profile] + (["--report-dir", str(tmp_path / report_dir)] if report_dir else [])
    assert cli.main(argv) == 0
    assert bool(calls) == touches


def test_readme_command_refuses_a_smoke_report_and_leaves_the_readme(tmp_path):
    from idckit.reports.readme import END, START, update_readme

    reports = tmp_path / "reports"
    reports.mkdir()
    doc = {"notebook": "t", "headline": {"label": "CIDEr-D", "kit": 97.25}, "provenance": {"profile": "smoke"}}
    (reports / "t.json").write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\nthe cpu table\n{END}\n")
    with pytest.raises(ConfigError, match="t.json ran at another profile"):
        update_readme(readme, reports)
    assert readme.read_text() == f"{START}\nthe cpu table\n{END}\n"
    doc["provenance"]["profile"] = "cpu"
    (reports / "t.json").write_text(json.dumps(doc))
    assert update_readme(readme, reports) is True and "97.2" in readme.read_text()


def test_a_damaged_image_cache_is_decoded_again_not_a_traceback(tiny_clevr, tmp_path):
    from idckit.data.images import ImageCache

    rel = ["images/CLEVR_default_000000.png", "sc_images/CLEVR_semantic_000001.png"]
    first = ImageCache.build(tiny_clevr, rel, 16, cache_dir=tmp_path / "cache")
    # the cache is memory-mapped; the damage below rewrites the file in place (the kit itself only renames new
    # files over old ones, which leaves an open map intact), so keep the first pixels in memory
    first_pixels = first.pixels.clone()
    for damage in ({"images.npy": b"junk"}, {"meta.json": b"{"}, {"index.json": b"["}):
        for name, data in damage.items():
            (tmp_path / "cache" / name).write_bytes(data)
        again = ImageCache.build(tiny_clevr, rel, 16, cache_dir=tmp_path / "cache")
        assert again.index == first.index and bool((again.pixels == first_pixels).all())


def test_every_notebook_reports_into_its_profiles_directory():
    """A notebook run directly (papermill -p profile smoke) must not overwrite the committed cpu reports either."""
    import re

    notebooks = sorted(paths.notebooks_dir().glob("*.py"))
    assert notebooks
    for nb in notebooks:
        calls = re.findall(r"paths\.reports_dir\(([^)]*)\)", nb.read_text())
        assert calls == ["profile"], f"{nb.name}: report_dir must default to paths.reports_dir(profile), got {calls}"


# -- the write policy (idckit.fileio.claim_dir): generate ---------------------------------------------------------
GEN = ["generate", "clevr-change", "--pairs", "20", "--workers", "1", "--size", "64x48"]


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def kit_dataset(tmp_path_factory):
    from idckit import cli

    out = tmp_path_factory.mktemp("gen") / "ds"
    assert cli.main([*GEN, "--out", str(out)]) == 0
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_generate_overwrite_refuses_a_dataset_holding_the_users_files_and_features(kit_dataset, tmp_path, capsys):
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    (ds / "NOTES.txt").write_text("my notes")
    (ds / "my_results").mkdir()
    (ds / "my_results" / "r.json").write_text("[]")
    (ds / "features" / "efficientnet_lite0").mkdir(parents=True)
    (ds / "features" / "efficientnet_lite0" / "meta.json").write_text("{}")
    before = _tree(ds)
    assert cli.main([*GEN, "--out", str(ds), "--seed", "1", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "NOTES.txt" in err and "features" in err and "my_results" in err and "--force" in err and str(ds) in err
    assert _tree(ds) == before


def test_generate_force_replaces_only_the_generators_entries_and_keeps_the_rest(kit_dataset, tmp_path):
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    (ds / "NOTES.txt").write_text("my notes")
    (ds / "features" / "x").mkdir(parents=True)
    (ds / "features" / "x" / "meta.json").write_text("{}")
    assert cli.main([*GEN, "--out", str(ds), "--seed", "1", "--overwrite", "--force"]) == 0
    assert (ds / "NOTES.txt").read_text() == "my notes" and (ds / "features" / "x" / "meta.json").read_text() == "{}"
    assert json.loads((ds / "synth_info.json").read_text())["seed"] == 1
    assert not [p for p in tmp_path.rglob(".idckit-*") if p.name != ".idckit-output.json"]   # no staging left


def test_generate_never_replaces_another_kind_of_dataset_even_with_force(kit_dataset, tmp_path, capsys):
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    before = _tree(ds)
    argv = ["generate", "editing-request", "--out", str(ds), "--pairs", "12", "--workers", "1", "--overwrite",
            "--force"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "SynthCLEVR-Change" in err and "SynthIER" in err and str(ds) in err
    assert _tree(ds) == before


def test_generate_out_dot_inside_a_dataset_replaces_it_in_place(kit_dataset, tmp_path, monkeypatch):
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    (ds / "NOTES.txt").write_text("my notes")
    monkeypatch.chdir(ds)
    assert cli.main([*GEN, "--out", ".", "--seed", "2", "--overwrite", "--force"]) == 0
    assert ds.is_dir() and json.loads((ds / "synth_info.json").read_text())["seed"] == 2
    assert (ds / "NOTES.txt").read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_generate_through_a_symlink_writes_into_its_target(tmp_path):
    from idckit import cli

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert cli.main([*GEN, "--out", str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "synth_info.json").is_file()


def test_generate_reuses_a_dataset_holding_the_users_files_without_writing(kit_dataset, tmp_path):
    """Reuse writes nothing, so the user's files there (a features/ store) do not stop a notebook."""
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    (ds / "features").mkdir()
    before = _tree(ds)
    assert cli.main([*GEN, "--out", str(ds)]) == 0
    assert _tree(ds) == before


@pytest.mark.parametrize("same", [True, False], ids=["same-arguments", "other-arguments"])
def test_two_generators_of_one_folder_at_once(tmp_path, monkeypatch, same):
    """Two lanes that generate one dataset at once: the one that publishes second reads the first's folder when
    the arguments match (no OSError), and refuses with the kit's error, replacing nothing, when they do not."""
    from idckit.data.synth import birds, writing

    out, real_claim = tmp_path / "ds", writing.claim

    def claim_then_lose_the_race(path, kind, info, *a, **kw):
        c = real_claim(path, kind, info, *a, **kw)           # the folder is empty: this process will write it
        monkeypatch.setattr(writing, "claim", real_claim)
        birds.generate(path, profile="smoke", seed=0 if same else 1, progress=False)   # the other process
        return c

    monkeypatch.setattr(writing, "claim", claim_then_lose_the_race)
    if same:
        assert birds.generate(out, profile="smoke", seed=0, progress=False) == out
    else:
        with pytest.raises(DatasetError, match="another process wrote this folder") as e:
            birds.generate(out, profile="smoke", seed=0, progress=False)
        assert e.value.path == out
    assert json.loads((out / "synth_info.json").read_text())["seed"] == (0 if same else 1)   # the first's, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]        # no staging folder left


def test_a_dataset_killed_mid_swap_is_not_trusted(kit_dataset, tmp_path, capsys):
    """A dataset whose swap stopped after the marker was moved away is never reused as a finished dataset."""
    from idckit import cli

    ds = _copy(kit_dataset, tmp_path / "ds")
    (ds / "synth_info.json").unlink()
    (ds / ".idckit-output.json").unlink()
    assert cli.main([*GEN, "--out", str(ds)]) == 2
    assert "did not write" in capsys.readouterr().err


# -- reproduce: the report folder -----------------------------------------------------------------------------
NB, NB2 = "00_walkthrough", "table2_clevr_change"     # names the table manifest knows


def _fake_notebooks(tmp_path, *names):
    nbs = tmp_path / "nbs"
    nbs.mkdir(exist_ok=True)
    for n in names:
        (nbs / f"{n}.ipynb").write_text("{}")
    return nbs


@pytest.mark.parametrize("ok", [True, False])
@pytest.mark.parametrize("foreign", ["index.html", "status.json"])
def test_reproduce_refuses_a_foreign_report_folder_even_when_every_notebook_fails(tmp_path, monkeypatch, capsys,
                                                                                   fake_reproduce, foreign, ok):
    from idckit import cli

    fake_reproduce.ok = ok
    nbs = _fake_notebooks(tmp_path, NB)
    monkeypatch.setattr(paths, "notebooks_dir", lambda: nbs)
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / foreign).write_text('{"visitors": 12}' if foreign == "status.json" else "<html>my homepage</html>")
    before = _tree(mine)
    for extra in ([], ["--force"]):     # --force writes beside foreign files, never over them
        assert cli.main(["reproduce", NB, "--report-dir", str(mine), "--runs-dir", str(tmp_path / "runs"),
                         *extra]) == 2
        err = capsys.readouterr().err
        assert foreign in err and str(mine) in err and "fix:" in err
        assert _tree(mine) == before


def test_reproduce_force_writes_beside_the_users_files_in_a_kit_report_folder(tmp_path, fake_reproduce):
    from idckit import reproduce as rp

    nbs = _fake_notebooks(tmp_path, NB)
    reports = tmp_path / "reports"
    rp.reproduce([NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    (reports / "NOTES.txt").write_text("mine")
    with pytest.raises(ConfigError, match="NOTES.txt"):
        rp.reproduce([NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    rp.reproduce([NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs,
                 force=True)
    assert (reports / "NOTES.txt").read_text() == "mine" and (reports / f"{NB}.json").is_file()
    assert "idckit reports" in (reports / "index.html").read_text()


def test_a_second_reproduce_of_a_running_notebook_is_refused_and_the_first_report_stays_fresh(tmp_path,
                                                                                             fake_reproduce):
    from idckit import reproduce as rp

    nbs = _fake_notebooks(tmp_path, NB, NB2)
    reports = tmp_path / "reports"
    rp.reproduce([NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    status = (reports / "status.json").read_bytes()
    fake_reproduce.ok = False
    with fileio.lock(reports, NB, what=NB, fix="wait"):     # the first run, still running t
        with pytest.raises(ConfigError, match=f"{NB} in this report folder is in use by process {os.getpid()}") as e:
            rp.reproduce([NB2, NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs",
                         notebooks_dir=nbs)
        assert "wait for" in e.value.fix
    assert (reports / "status.json").read_bytes() == status     # not marked stale, u not run either
    assert json.loads(status)[NB]["status"] == "ok"


def test_each_reproduce_stages_in_its_own_folder_and_a_dead_ones_is_removed_unread(tmp_path, monkeypatch,
                                                                                   fake_reproduce):
    from idckit import reproduce as rp
    from idckit.reproduce import runner

    seen = []
    monkeypatch.setattr(runner, "run_one", lambda nb, *, report_dir, **kw: seen.append(
        sorted(p.name for p in report_dir.iterdir())) or Outcome(nb.stem, True, 1.0))
    nbs = _fake_notebooks(tmp_path, NB)
    reports = tmp_path / "reports"
    dead = reports / ".idckit-staging-999999999" / NB     # a killed run's (no such pid)
    dead.mkdir(parents=True)
    (dead / f"{NB}.json").write_text(json.dumps({"notebook": NB}))
    rp.reproduce([NB], profile="smoke", report_dir=reports, runs_dir=tmp_path / "runs", notebooks_dir=nbs)
    assert not (reports / ".idckit-staging-999999999").exists() and not (reports / f"{NB}.json").exists()
    assert ".idckit-staging-999999999" not in seen[0]


# -- features: a store knows its data -------------------------------------------------------------------------
TWO = ["images/CLEVR_default_000000.png", "sc_images/CLEVR_semantic_000000.png"]


def _other_clevr(tmp_path):
    """Another dataset with the same image names and sizes on disk but other pixels."""
    from PIL import Image

    from conftest import write_clevr_change

    root = write_clevr_change(tmp_path / "other")
    for rel in TWO:
        Image.new("RGB", (8, 6), (250, 10, 10)).save(root / rel)
    return root


def test_features_of_another_dataset_in_out_are_refused_not_returned(tiny_clevr, tmp_path, capsys):
    from idckit import cli
    from idckit.data.features import clevr_change_images, data_identity

    other = _other_clevr(tmp_path)
    store = tmp_path / "store"
    assert cli.main(["features", str(tiny_clevr), "--weights", "random", "--out", str(store)]) == 0
    capsys.readouterr()
    before = _tree(store)
    assert cli.main(["features", str(other), "--weights", "random", "--out", str(store)]) == 2
    err = capsys.readouterr().err
    assert "other data" in err and str(store) in err and "--force" in err
    assert _tree(store) == before
    # --force extracts the other images into it; the store then says whose they are
    assert cli.main(["features", str(other), "--weights", "random", "--out", str(store), "--force"]) == 0
    meta = json.loads((store / "meta.json").read_text())
    assert meta["data"] == data_identity(other, clevr_change_images(other)) != \
        data_identity(tiny_clevr, clevr_change_images(tiny_clevr))


def test_a_default_store_of_regenerated_data_is_extracted_again(tiny_clevr):
    import numpy as np
    from PIL import Image

    from idckit.data.features import extract_features

    first = extract_features(tiny_clevr, weights="random", images=TWO, progress=False)
    old = np.array(first.array)
    Image.new("RGB", (9, 7), (0, 200, 0)).save(tiny_clevr / TWO[0])    # the dataset changed under its store
    again = extract_features(tiny_clevr, weights="random", images=TWO, progress=False)
    assert again.directory == first.directory and again.meta["data"] != first.meta["data"]
    assert not np.array_equal(np.array(again.array), old)


def test_a_store_without_data_identity_is_not_trusted(tiny_clevr, tmp_path):
    from idckit.data.features import extract_features
    from idckit.errors import DatasetError

    store = tmp_path / "store"
    extract_features(tiny_clevr, weights="random", images=TWO, out_dir=store, progress=False)
    meta = json.loads((store / "meta.json").read_text())
    del meta["data"]                                       # as an older idckit wrote it
    (store / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="records no data identity"):
        extract_features(tiny_clevr, weights="random", images=TWO, out_dir=store, progress=False, other_data="refuse")
    rebuilt = extract_features(tiny_clevr, weights="random", images=TWO, out_dir=store, progress=False)
    assert rebuilt.meta["data"] and rebuilt.meta["complete"]


def test_features_into_a_read_only_dataset_fail_in_the_first_second(tiny_clevr, monkeypatch, capsys):
    """A read-only mount (root can write anywhere else, so os.access is what reports it)."""
    from idckit import cli
    from idckit.data import features

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(tiny_clevr) and mode == os.W_OK
                        else real(p, mode, **kw))
    monkeypatch.setattr(features, "build_backbone", lambda *a, **kw: pytest.fail("loaded the backbone first"))
    assert cli.main(["features", str(tiny_clevr), "--weights", "random"]) == 2
    err = capsys.readouterr().err
    assert "not writable" in err and str(tiny_clevr) in err and "--out" in err
    assert not (tiny_clevr / "features").exists()


def test_a_store_with_the_users_files_is_refused_and_force_keeps_them(tiny_clevr, tmp_path):
    from idckit.data.features import extract_features
    from idckit.errors import DatasetError

    store = tmp_path / "store"
    extract_features(tiny_clevr, weights="random", images=TWO, out_dir=store, progress=False)
    (store / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="notes.txt"):
        extract_features(tiny_clevr, weights="random", images=TWO[:1], out_dir=store, progress=False)
    s = extract_features(tiny_clevr, weights="random", images=TWO[:1], out_dir=store, progress=False, force=True)
    assert s.array.shape[0] == 1 and (store / "notes.txt").read_text() == "mine"


def test_features_interrupted_by_sigint_leave_nothing_trusted_and_resume_to_the_same_store(tiny_clevr, tmp_path,
                                                                                           monkeypatch,
                                                                                           default_sigint):
    import signal

    import numpy as np

    from idckit.data import features
    from idckit.data.features import FeatureStore, clevr_change_images, extract_features
    from idckit.errors import DatasetError

    import torch

    images = clevr_change_images(tiny_clevr)[:6]
    torch.manual_seed(0)      # weights="random": the same untrained network in every call below
    fresh = extract_features(tiny_clevr, weights="random", images=images, batch_size=2, out_dir=tmp_path / "fresh",
                             progress=False)
    real, calls = features.preprocess, []

    def preprocess(paths, size=224):
        calls.append(1)
        if len(calls) == 4:                      # the probe, then two batches, then Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
        return real(paths, size)

    monkeypatch.setattr(features, "preprocess", preprocess)
    store = tmp_path / "store"
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        extract_features(tiny_clevr, weights="random", images=images, batch_size=2, out_dir=store, progress=False)
    monkeypatch.setattr(features, "preprocess", real)
    meta = json.loads((store / "meta.json").read_text())
    assert not meta["complete"] and 0 < meta["rows_done"] < len(images)
    with pytest.raises(DatasetError, match="incomplete"):
        FeatureStore.open(store)
    torch.manual_seed(0)
    again = extract_features(tiny_clevr, weights="random", images=images, batch_size=2, out_dir=store, progress=False)
    assert np.array_equal(np.array(again.array), np.array(fresh.array))


def test_readme_with_a_partial_report_set_refuses_and_keeps_every_row(tmp_path, capsys, monkeypatch):
    from idckit import cli
    from idckit.reports.readme import END, START, render_results

    full = tmp_path / "full"
    full.mkdir()
    for name in ("a", "b", "c"):
        (full / f"{name}.json").write_text(json.dumps({"notebook": name, "headline": {"label": "CIDEr-D", "kit": 1.0},
                                                       "provenance": {"profile": "cpu"}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# kit\n{START}\n{render_results(full)}\n{END}\n")
    before = readme.read_bytes()
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "b.json").write_bytes((full / "b.json").read_bytes())
    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    assert cli.main(["readme", "--report-dir", str(partial)]) == 2
    err = capsys.readouterr().err
    assert "a, c" in err and "idckit reproduce a c" in err and str(partial) in err
    assert readme.read_bytes() == before
    assert cli.main(["readme", "--report-dir", str(full)]) == 0     # the whole set is still fine


# -- every write path of the CLI against a folder holding a foreign file ------------------------------------------
FOREIGN = b"the user's own bytes\x00\xff"
SMALL = {"clevr-change": ["--pairs", "20", "--size", "64x48"], "spot-the-diff": ["--pairs", "12"],
         "editing-request": ["--pairs", "12"],
         "birds": ["--pairs", "30", "--size", "48", "--cub-per-class", "2", "--nabirds-per-class", "2",
                   "--tree", "2", "2", "2", "2"]}    # 16 species, not the cpu profile's 200: 840 renders fewer


def _write_paths(c):
    """(name, argv) of every CLI command that writes, aimed at the folder ``c["dir"]`` (or the file ``c["file"]``)
    that holds the user's file; plain (refused, exit 2) and with --force where it exists (written beside, exit 0)."""
    d, f = str(c["dir"]), str(c["file"])
    out = []
    for name, small in SMALL.items():
        base = ["generate", name, "--out", d, "--workers", "1", *small]
        out += [(f"generate-{name}", base, 2), (f"generate-{name}-overwrite", [*base, "--overwrite"], 2),
                (f"generate-{name}-force", [*base, "--overwrite", "--force"], 0)]
    feats = ["features", str(c["clevr"]), "--weights", "random", "--out", d]
    out += [("features", feats, 2), ("features-force", [*feats, "--force"], 0)]
    rep = ["reproduce", NB, "--report-dir", d, "--runs-dir", str(c["runs"])]
    out += [("reproduce", rep, 2), ("reproduce-force", [*rep, "--force"], 0)]
    out += [("evaluate-json", ["evaluate", str(c["results"]), "--data", str(c["clevr"]), "--no-meteor", "--json", f],
             2),
            ("pretrain-clip-out", ["pretrain-clip", "--profile", "smoke", "--data-root", str(c["clevr"]),
                                   "--runs-dir", str(c["runs"]), "--out", f], 2),
            ("verify-data-json", ["verify-data", str(c["clevr"]), "--dataset", "clevr-change", "--fast",
                                  "--json", f], 2),
            ("doctor-gpu-check", ["doctor", "--gpu-check", "--out", d], 2)]
    return out


_NAMES = [n for n, _, _ in _write_paths({k: "x" for k in ("dir", "file", "clevr", "runs", "results")})]


@pytest.mark.parametrize("name", _NAMES)
def test_every_cli_write_path_leaves_a_foreign_file_byte_identical(name, tmp_path, monkeypatch, capsys,
                                                                   fake_reproduce):
    from conftest import write_clevr_change
    from idckit import cli

    monkeypatch.setattr(paths, "notebooks_dir", lambda: _fake_notebooks(tmp_path, NB))
    c = {"dir": tmp_path / "mine", "file": tmp_path / "mine" / "foreign.txt", "runs": tmp_path / "runs",
         "clevr": write_clevr_change(tmp_path / "clevr"), "results": tmp_path / "results"}
    c["results"].mkdir()
    for sub in ("sc", "nsc"):
        ids = ["000002.png", "000005.png"]
        (c["results"] / f"{sub}_results.json").write_text(json.dumps(
            [{"image_id": i + ("_n" if sub == "nsc" else ""), "caption": "x"} for i in ids]))
    c["dir"].mkdir()
    c["file"].write_bytes(FOREIGN)
    (_, argv, code), = [w for w in _write_paths(c) if w[0] == name]
    assert cli.main(argv) == code, capsys.readouterr().err
    assert c["file"].read_bytes() == FOREIGN
    if name == "reproduce-force":   # past the write policy into the prepare stage, which the fixture builds nothing in
        assert fake_reproduce.prepared == ["scenes clevr-change"] and fake_reproduce.ran == [NB]
    assert not [p for p in tmp_path.rglob(".idckit-st*")] and not list(tmp_path.rglob("*.tmp"))
    if code == 2:
        assert "fix:" in capsys.readouterr().err


# -- killed mid-way: nothing a later run trusts ---------------------------------------------------------------
def _wait_for(predicate, timeout=120.0):
    import time

    t0 = time.time()
    while not predicate():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.1)


def _default_sigint() -> None:
    """In the child before it starts: Ctrl-C's default, whatever the suite inherited (a shell starts a background
    job, `nohup make test &`, with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def default_sigint():
    """Ctrl-C raises KeyboardInterrupt in this process for the test, as in a terminal (see _default_sigint)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _idckit(*argv):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "idckit.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=_default_sigint)


def test_generate_interrupted_by_sigint_leaves_no_dataset_and_no_staging(tmp_path):
    import signal

    out = tmp_path / "ds"
    proc = _idckit("generate", "clevr-change", "--out", str(out), "--pairs", "5000", "--workers", "1",
                   "--size", "64x48")
    _wait_for(lambda: len(list(tmp_path.glob(".idckit-staging-ds-*/images/*"))) >= 5)
    proc.send_signal(signal.SIGINT)
    # communicate drains the pipes: a progress bar that fills stderr would block the exit on its own message
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and b"interrupted" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []       # no dataset, no staging folder


def test_generate_killed_leaves_a_staging_folder_that_the_next_run_removes_unread(tmp_path):
    import signal

    from idckit import cli

    out = tmp_path / "ds"
    proc = _idckit("generate", "clevr-change", "--out", str(out), "--pairs", "5000", "--workers", "1",
                   "--size", "64x48")
    _wait_for(lambda: len(list(tmp_path.glob(".idckit-staging-ds-*/images/*"))) >= 5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    (left,) = tmp_path.glob(".idckit-staging-ds-*")
    assert not out.exists()            # nothing that looks like a dataset
    assert cli.main([*GEN, "--out", str(out)]) == 0
    assert not left.exists() and json.loads((out / "synth_info.json").read_text())["pairs"] == 20
    assert len(list((out / "images").iterdir())) == 20


#: a notebook outside the manifest: reproduce has no prepare step for it, so the kill lands in the notebook at once
SLEEPER = "sleeper"
SLEEPY = '''
import time
open("started", "w").write("1")
time.sleep(120)
'''


def test_reproduce_interrupted_by_sigint_leaves_the_previous_report_and_no_staging(tmp_path):
    import signal
    import subprocess
    import sys

    import nbformat

    nbs, reports = tmp_path / "nbs", tmp_path / "reports"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'cpu'\nclevr_root = None\nreport_dir = None\nruns_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(SLEEPY)]
    nb.metadata["kernelspec"] = {"name": "idckit", "display_name": "Python (idckit)", "language": "python"}
    nbformat.write(nb, str(nbs / f"{SLEEPER}.ipynb"))
    reports.mkdir()
    good = {"notebook": SLEEPER, "provenance": {"profile": "smoke"}}
    (reports / f"{SLEEPER}.json").write_text(json.dumps(good))
    (reports / "status.json").write_text(json.dumps({SLEEPER: {"status": "ok", "when": "earlier"}}))
    before = _tree(reports)
    code = ("from idckit.reproduce import reproduce; from pathlib import Path; "
            f"reproduce(['{SLEEPER}'], profile='smoke', report_dir=Path('{reports}'), "
            f"runs_dir=Path('{tmp_path}/runs'), notebooks_dir=Path('{nbs}'))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    _wait_for(lambda: (nbs / "started").exists())
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    after = {k: v for k, v in _tree(reports).items() if not k.startswith(".idckit-lock-")}   # a lock: no content
    assert after == before            # the previous report, its status (not stale), and no staging folder
