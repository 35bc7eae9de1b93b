"""SynthCLEVR-Change: layout, determinism, idempotence, and every caption true of its scene pair."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from idckit.data.clevr_change import ClevrChange
from idckit.data.synth import captions
from idckit.data.synth.clevr_change import generate
from idckit.data.synth.vocab import NO_CHANGE_SENTENCES, SYNONYMS
from idckit.errors import DatasetError
from numeric import assert_close

SIZE = (96, 64)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("g") / "ds", n_pairs=40, seed=3, size=SIZE, workers=2, progress=False)


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_loads_with_both_pairs_per_index(synth):
    ds = ClevrChange(synth)
    n = sum(len(ds.indices(s)) for s in ("train", "val", "test"))
    assert n == 40 and len(ds.pairs("test")) == 2 * len(ds.indices("test"))
    info = json.loads((synth / "synth_info.json").read_text())
    assert info["synthetic"] is True and info["size"] == list(SIZE)
    types = json.loads((synth / "type_mapping.json").read_text())
    assert {t: len(v) for t, v in types.items()} == {t: 8 for t in ("color", "material", "add", "drop", "move")}
    from PIL import Image
    assert Image.open(synth / "sc_images" / "CLEVR_semantic_000007.png").size == SIZE
    desc = json.loads((synth / "scene_descriptions.json").read_text())
    assert len(desc) == 120 and desc["CLEVR_default_000000.png"].startswith("there is a ")


def test_byte_identical_whatever_the_workers(synth, tmp_path):
    one = generate(tmp_path / "one", n_pairs=40, seed=3, size=SIZE, workers=1, progress=False)
    assert _digest(one) == _digest(synth)


def test_idempotent_and_refuses_foreign_dirs(synth, tmp_path):
    mtime = (synth / "splits.json").stat().st_mtime_ns
    assert generate(synth, n_pairs=40, seed=3, size=SIZE, progress=False) == synth
    assert (synth / "splits.json").stat().st_mtime_ns == mtime
    with pytest.raises(DatasetError, match="another SynthCLEVR-Change dataset"):
        generate(synth, n_pairs=40, seed=4, size=SIZE, progress=False)
    with pytest.raises(DatasetError, match="too small"):
        generate(tmp_path / "x", n_pairs=3, seed=0, size=SIZE)
    assert not (tmp_path / "x").exists()


def test_overwrite_never_deletes_what_the_kit_did_not_write(tmp_path):
    thesis = tmp_path / "thesis"
    (thesis / "images").mkdir(parents=True)
    (thesis / "thesis.tex").write_text("chapter 1")
    (thesis / "images" / "photo.jpg").write_bytes(b"jpeg")
    with pytest.raises(DatasetError, match="did not write") as err:
        generate(thesis, n_pairs=20, seed=0, size=SIZE, overwrite=True, progress=False)
    assert str(thesis) in str(err.value) and "nothing was written or deleted" in str(err.value)
    assert (thesis / "thesis.tex").read_text() == "chapter 1" and (thesis / "images" / "photo.jpg").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]  # no temp folder left behind


def test_out_a_file_fails_before_any_rendering(tmp_path, monkeypatch):
    from idckit.data.synth import clevr_change
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    monkeypatch.setattr(clevr_change, "_make_index", lambda job: pytest.fail("rendered before validating --out"))
    with pytest.raises(DatasetError, match="names a file") as err:
        generate(target, n_pairs=20, seed=0, size=SIZE, overwrite=True, progress=False, workers=1)
    assert str(target) in str(err.value) and target.read_text() == "keep me"
    for bad in ({"camera_jitter": -0.1}, {"lamp_jitter": 9.0}):
        with pytest.raises(DatasetError, match="jitter must be between 0 and 3"):
            generate(tmp_path / "j", n_pairs=20, seed=0, size=SIZE, progress=False, workers=1, **bad)
    assert not (tmp_path / "j").exists()


def test_overwrite_replaces_a_kit_dataset(tmp_path):
    out = generate(tmp_path / "ds", n_pairs=20, seed=0, size=SIZE, workers=1, progress=False)
    again = generate(out, n_pairs=20, seed=1, size=SIZE, workers=1, overwrite=True, progress=False)
    assert json.loads((again / "synth_info.json").read_text())["seed"] == 1


def test_jitter_is_recorded_and_zero_jitter_makes_identical_distractors(tmp_path):
    from PIL import Image
    out = generate(tmp_path / "still", n_pairs=20, seed=5, size=SIZE, camera_jitter=0.0, lamp_jitter=0.0,
                   workers=1, progress=False)
    info = json.loads((out / "synth_info.json").read_text())
    assert (info["camera_jitter"], info["lamp_jitter"]) == (0.0, 0.0)
    ds = ClevrChange(out)
    for i in ds.indices("train")[:3]:
        before = np.asarray(Image.open(out / "images" / f"CLEVR_default_{i:06d}.png"))
        distractor = np.asarray(Image.open(out / "nsc_images" / f"CLEVR_nonsemantic_{i:06d}.png"))
        semantic = np.asarray(Image.open(out / "sc_images" / f"CLEVR_semantic_{i:06d}.png"))
        assert np.array_equal(before, distractor) and not np.array_equal(before, semantic)
    # only the jitter sizes differ: the same draws give the same objects wherever visibility agrees
    jittered = generate(tmp_path / "half", n_pairs=20, seed=5, size=SIZE, camera_jitter=0.5, lamp_jitter=0.5,
                        workers=1, progress=False)
    a, b = _scene(out, "default", 0), _scene(jittered, "default", 0)
    assert a["camera"]["look_at"] == [0.0, 0.0, 0.0] and b["camera"]["look_at"] != [0.0, 0.0, 0.0]
    assert max(abs(v) for v in b["camera"]["look_at"]) <= 0.5


def test_object_count_is_a_knob_recorded_only_off_clevrs_3_to_10(tmp_path):
    from idckit.experiments.data import jitter_words, synth_root

    few = generate(tmp_path / "few", n_pairs=20, seed=5, size=SIZE, objects=(2, 4), workers=1, progress=False)
    info = json.loads((few / "synth_info.json").read_text())
    assert info["objects"] == [2, 4] and jitter_words(info).endswith(", 2-4 objects")
    counts = [len(_scene(few, "default", i)["objects"]) for i in range(20)]
    assert min(counts) >= 2 and max(counts) <= 4 and len(set(counts)) > 1
    # CLEVR's 3-10 is not written, so every set made before the knob keeps its content identity and run keys
    plain = generate(tmp_path / "plain", n_pairs=20, seed=5, size=SIZE, workers=1, progress=False)
    assert "objects" not in json.loads((plain / "synth_info.json").read_text())
    assert jitter_words({}) == "camera jitter 1.0, lamp jitter 1.0"
    assert "-obj" not in synth_root("cpu").name and "-obj" not in synth_root("cpu", hard=True).name
    # asking again for the same set reuses it; another range is another set
    assert generate(few, n_pairs=20, seed=5, size=SIZE, objects=(2, 4), workers=1, progress=False) == few
    with pytest.raises(DatasetError, match="holds another SynthCLEVR-Change dataset"):
        generate(few, n_pairs=20, seed=5, size=SIZE, objects=(3, 10), workers=1, progress=False)
    with pytest.raises(DatasetError, match="--objects 5-3") as err:
        generate(tmp_path / "bad", n_pairs=20, seed=5, size=SIZE, objects=(5, 3), workers=1, progress=False)
    assert "3-10" in str(err.value) and not (tmp_path / "bad").exists()


def _scene(root, kind, i):
    return json.loads((root / "scenes" / f"CLEVR_{kind}_{i:06d}.json").read_text())


KEYS = ("shape", "color", "material", "size")


def test_type_mapping_matches_the_scene_diff(synth):
    types = json.loads((synth / "type_mapping.json").read_text())
    for ctype, ids in types.items():
        for pid in ids:
            i = int(pid[:6])
            before, after = _scene(synth, "default", i)["objects"], _scene(synth, "semantic", i)
            ch, after = after["change"], after["objects"]
            assert ch["type"] == ctype
            if ctype == "add":
                assert len(after) == len(before) + 1 and ch["after_index"] == len(before)
            elif ctype == "drop":
                assert len(after) == len(before) - 1
                strip = lambda objs: [{k: o[k] for k in (*KEYS, "3d_coords")} for o in objs]  # noqa: E731
                assert strip(o for k, o in enumerate(before) if k != ch["before_index"]) == strip(after)
            else:
                assert len(after) == len(before)
                diffs = [k for k in range(len(before)) if any(before[k][a] != after[k][a] for a in KEYS)
                         or before[k]["3d_coords"][:2] != after[k]["3d_coords"][:2]]
                assert diffs == [ch["before_index"]]
                b, a = before[ch["before_index"]], after[ch["before_index"]]
                changed = {x for x in KEYS if b[x] != a[x]} | ({"position"} if b["3d_coords"] != a["3d_coords"] else set())
                assert changed == {"color": {"color"}, "material": {"material"}, "move": {"position"}}[ctype]
            # the distractor keeps every object exactly
            nsc = _scene(synth, "nonsemantic", i)["objects"]
            assert [{k: o[k] for k in (*KEYS, "3d_coords")} for o in nsc] == \
                   [{k: o[k] for k in (*KEYS, "3d_coords")} for o in before]


def test_every_caption_is_true_of_its_scene_pair(synth):
    change = json.loads((synth / "change_captions.json").read_text())
    no_change = json.loads((synth / "no_change_captions.json").read_text())
    n_relational = 0
    for key, caps in change.items():
        i = int(key[-10:-4])
        before, sem = _scene(synth, "default", i), _scene(synth, "semantic", i)
        ch = sem["change"]
        assert 4 <= len(caps) == len(set(caps)) <= 8
        for cap in caps:
            assert cap == cap.lower() and "  " not in cap and not cap.endswith(".")
            parsed = captions.parse_caption(cap)
            assert parsed.change_type == ch["type"], cap
            if ch["type"] in ("color", "material"):
                assert parsed.value == ch["attribute"], cap
            scene, target = (sem, ch["after_index"]) if ch["type"] == "add" else (before, ch["before_index"])
            assert captions.resolve(parsed.referent, scene) == [target], cap
            n_relational += any(w in cap for w in (" of ", "behind", "same"))
        assert set(no_change[key]) <= set(NO_CHANGE_SENTENCES)
    assert n_relational > 0.2 * sum(map(len, change.values()))  # the grammar's relational templates are used


def _hand_scene():
    objs = [dict(shape="cube", color="red", material="metal", size="large"),
            dict(shape="cube", color="red", material="metal", size="large"),
            dict(shape="sphere", color="blue", material="rubber", size="small")]
    # object 0 is left of object 2, object 1 right of it (relationships[r][i] = objects that are r of i)
    rel = {"left": [[], [0, 2], [0]], "right": [[1, 2], [], [1]], "front": [[], [], []], "behind": [[], [], []]}
    return {"objects": objs, "relationships": rel}


def test_parser_on_hand_built_scene_catches_ambiguity():
    s = _hand_scene()
    assert captions.resolve("the red cube", s) == [0, 1]  # ambiguous: twins
    assert captions.resolve("the big red block that is to the left of the tiny ball", s) == [0]
    assert captions.resolve("the shiny thing on the right side of the matte sphere", s) == [1]
    assert captions.resolve("the other thing that is the same color as the blue object", s) == []
    assert captions.resolve("the other cube that is made of the same material as the sphere", s) == []
    p = captions.parse_caption("the tiny yellow rubber cylinder that is behind the rubber block became brown")
    assert (p.change_type, p.value, p.referent) == ("color", "brown", "the tiny yellow rubber cylinder that is behind the rubber block")
    assert captions.parse_caption("the other large cylinder that is the same color as the large matte cylinder turned rubber").value == "rubber"
    assert captions.parse_caption("nothing has changed").change_type == "none"
    with pytest.raises(ValueError):
        captions.parse_caption("the cube flew away")
    with pytest.raises(ValueError):
        captions.resolve("the red cube near the ball", s)


def test_twins_get_a_relational_description_and_unreferable_is_raised():
    s = _hand_scene()
    rng = np.random.default_rng(0)
    caps = captions.change_captions(s, s, {"type": "drop", "before_index": 0, "after_index": None, "attribute": None}, rng, 3)
    for c in caps:
        assert captions.resolve(captions.parse_caption(c).referent, s) == [0]
    twins = {"objects": s["objects"][:2], "relationships": {r: [[], []] for r in ("left", "right", "front", "behind")}}
    with pytest.raises(captions.Unreferable):
        captions.change_captions(twins, twins, {"type": "drop", "before_index": 0, "after_index": None, "attribute": None}, rng, 2)


def test_synonyms_only_from_the_table():
    words = {w for v in SYNONYMS.values() for p in v for w in p.split()}
    assert {"block", "ball", "matte", "shiny", "tiny"} <= words


def test_scenes_follow_clevr_constraints_and_relationship_definition(synth):
    from idckit.data.synth.vocab import SIZES

    for path in sorted((synth / "scenes").glob("CLEVR_default_*.json")):
        s = json.loads(path.read_text())
        objs = s["objects"]
        assert 3 <= len(objs) <= 10
        xy = np.array([o["3d_coords"][:2] for o in objs])
        r = np.array([SIZES[o["size"]] / (np.sqrt(2) if o["shape"] == "cube" else 1) for o in objs])
        for i in range(len(objs)):
            assert_close(objs[i]["3d_coords"][2], r[i])  # resting on the ground
            for j in range(i):
                assert np.linalg.norm(xy[i] - xy[j]) - r[i] - r[j] >= 0.25 - 1e-9  # CLEVR min_dist
        for name in ("left", "right", "front", "behind"):
            d = np.array(s["directions"][name])
            for i, oi in enumerate(objs):
                want = sorted(j for j, oj in enumerate(objs) if j != i and
                              np.dot(np.array(oj["3d_coords"]) - np.array(oi["3d_coords"]), d) > 0.2)
                assert s["relationships"][name][i] == want
        from idckit.data.synth import render, scene as scenes

        ids = render.object_ids(s, SIZE)  # every object keeps CLEVR's minimum visible area (scaled)
        assert all((ids == k).sum() >= scenes.min_visible_pixels(SIZE) for k in range(len(objs)))


def test_hard_setting_is_the_faithful_jitter_and_only_for_synthetic_data(tmp_path):
    from idckit.errors import ConfigError
    from idckit.experiments.data import clevr_change, synth_settings

    for profile in ("smoke", "cpu", "paper"):
        hard = synth_settings(profile, hard=True)
        assert (hard["camera_jitter"], hard["lamp_jitter"]) == (1.0, 1.0) and "hard" not in hard
    # the cpu default is the learnable jitter-0 set; its hard twin is the earlier faithful default (2,000 scenes)
    assert (synth_settings("cpu")["camera_jitter"], synth_settings("cpu")["pairs"]) == (0.0, 8000)
    assert synth_settings("cpu", hard=True)["pairs"] == 2000
    assert synth_settings("smoke") == synth_settings("smoke", hard=True)      # smoke keeps the faithful data
    with pytest.raises(ConfigError, match="cannot be combined with data_root") as err:
        clevr_change("cpu", tmp_path, hard=True)
    assert "fix" in str(err.value).lower() or "drop hard=True" in str(err.value)


def test_the_default_dataset_renders_quietly_when_asked(tmp_path, monkeypatch, capsys):
    """The prepare stage asks for no progress bar: 8,000 renders' worth of bars would bury a reproduce log."""
    from idckit.experiments import data

    tiny = {**data.synth_settings("smoke"), "pairs": 20, "size": [64, 48], "workers": 1}
    monkeypatch.setattr(data, "synth_settings", lambda profile, hard=False: tiny)
    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path))
    quiet = data.clevr_change("smoke", progress=False)
    assert (quiet.root / "synth_info.json").is_file() and "SynthCLEVR-Change" not in capsys.readouterr().err


def test_hard_rows_only_where_the_default_is_easier(monkeypatch):
    from types import SimpleNamespace

    from idckit.experiments import data as data_mod
    from idckit.experiments import pcl

    real = SimpleNamespace(data=SimpleNamespace(synthetic=False), profile="cpu")
    assert pcl.hard_runs(real) == (None, [])
    synthetic = SimpleNamespace(data=SimpleNamespace(synthetic=True), profile="cpu")
    faithful = data_mod.synth_settings("cpu", hard=True)
    monkeypatch.setattr(data_mod, "synth_settings", lambda profile, hard=False: faithful)
    assert pcl.hard_runs(synthetic) == (None, [])       # the default already is the faithful jitter: no twin rows
