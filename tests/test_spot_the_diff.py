"""Spot-the-Diff: the real layout (grouping, pooled references, result ids, errors, missing images) and the
synthetic set written in it (round trip, counts, determinism, the no-difference share, sentences true of the pair)."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from PIL import Image

from idckit.cli import main as cli_main
from idckit.data.spot_the_diff import SpotTheDiff, pair_id, parse_pair_id, split_counts
from idckit.data.synth import spot_the_diff as synth
from idckit.errors import DatasetError

# Spot-the-Diff's released schema (harsh19/spot-the-diff), plus one more pair per split
TRAIN = [{"img_id": "256", "sentences": ["person with umbrella is gone", "person with red coat is moved"]},
         {"img_id": "294", "sentences": ["on the top left side of the right image there is a red car that is not "
                                         "in the left image"]},
         {"img_id": "256", "sentences": ["there is no difference"]}]
VAL = [{"img_id": "7", "sentences": ["the white car is gone"]}]
TEST = [{"img_id": "1203", "sentences": ["a person appeared", "the blue car moved"]},
        {"img_id": "42", "sentences": ["nothing has changed"]},
        {"img_id": "1203", "sentences": ["a man in black walked in"]}]


def write_spot(root, splits=None):
    splits = splits or {"train": TRAIN, "val": VAL, "test": TEST}
    (root / "annotations").mkdir(parents=True)
    (root / "resized_images").mkdir()
    for split, entries in splits.items():
        (root / "annotations" / f"{split}.json").write_text(json.dumps(entries))
        for img_id in {e["img_id"] for e in entries}:
            ext = ".jpg" if img_id == "294" else ".png"        # the release's scripts accept either
            Image.new("RGB", (8, 8), (int(img_id) % 255, 0, 0)).save(root / "resized_images" / f"{img_id}{ext}")
            Image.new("RGB", (8, 8), (0, int(img_id) % 255, 0)).save(root / "resized_images" / f"{img_id}_2{ext}")
    return root


@pytest.fixture
def spot(tmp_path):
    return write_spot(tmp_path / "data")


def test_entries_grouped_per_pair_with_every_annotators_sentences(spot):
    ds = SpotTheDiff(spot)
    pairs = ds.pairs("train")
    assert [p.pair_id for p in pairs] == ["256.png", "294.png"]
    assert pairs[0].captions == ("person with umbrella is gone", "person with red coat is moved",
                                 "there is no difference")
    assert pairs[0].before == spot / "resized_images" / "256.png"
    assert pairs[0].after == spot / "resized_images" / "256_2.png"
    assert pairs[1].before.suffix == ".jpg" and pairs[1].after.name == "294_2.jpg"
    assert {p.change_type for p in pairs} == {"change"} and all(p.is_change for p in pairs)
    assert [p.pair_id for p in ds.pairs("test")] == ["42.png", "1203.png"]     # numeric order, not string order
    assert ds.references("test")["1203.png"] == ["a person appeared", "the blue car moved", "a man in black walked in"]
    assert split_counts(ds) == {"train": {"entries": 3, "pairs": 2, "sentences": 4, "missing_images": 0},
                                "val": {"entries": 1, "pairs": 1, "sentences": 1, "missing_images": 0},
                                "test": {"entries": 3, "pairs": 2, "sentences": 4, "missing_images": 0}}


def test_coco_ground_truth_is_clip4idcs_pooled_reference_file(spot):
    gt = SpotTheDiff(spot).coco_ground_truth("test")
    assert gt["info"] == "" and gt["licenses"] == ""
    assert [a["image_id"] for a in gt["annotations"]] == ["42.png", "1203.png", "1203.png", "1203.png"]
    assert [a["id"] for a in gt["annotations"]] == [0, 1, 2, 3]
    assert [i["id"] for i in gt["images"]] == ["42.png", "1203.png", "1203.png"]    # one record per annotator entry
    assert {a["caption"] for a in gt["annotations"]} == {s for e in TEST for s in e["sentences"]}


def test_pair_ids_round_trip():
    assert pair_id("400") == "400.png" and parse_pair_id("400.png") == "400"
    for bad in ("0400.png", "400", "400.png_n", "x.png"):
        with pytest.raises(ValueError):
            parse_pair_id(bad)


def test_missing_images_are_flagged_and_counted_not_fatal(spot):
    (spot / "resized_images" / "1203_2.png").unlink()
    ds = SpotTheDiff(spot)
    with pytest.warns(UserWarning, match="1 of 2 pairs have a missing image"):
        pairs = ds.pairs("test")
    assert [p.pair_id for p in pairs] == ["42.png"]
    assert ds.missing["test"] == {"1203.png": [spot / "resized_images" / "1203_2.png"]}
    assert len(ds.pairs("test", check_images=False)) == 2 and len(ds.references("test")) == 2
    assert split_counts(ds)["test"]["missing_images"] == 1


@pytest.mark.parametrize("case, message", [
    ("no_annotations", "missing folder annotations/"),
    ("no_images", "missing folder resized_images/"),
    ("repo_root", "not its data/ folder"),
    ("padded_id", "not an un-padded decimal string"),
    ("int_id", "not an un-padded decimal string"),
    ("extra_key", "is not {'img_id', 'sentences'}"),
    ("empty_sentences", "sentences must be a non-empty list"),
    ("not_a_list", "must be a JSON list"),
    ("bad_json", "malformed JSON"),
    ("no_split_file", "missing file annotations/val.json"),
])
def test_wrong_layouts_name_the_path_and_the_fix(tmp_path, case, message):
    root = write_spot(tmp_path / "data")
    load = lambda r: SpotTheDiff(r).pairs("val")  # noqa: E731
    ann = root / "annotations" / "val.json"
    if case == "no_annotations":
        (root / "annotations" / "val.json").unlink(); (root / "annotations" / "train.json").unlink()
        (root / "annotations" / "test.json").unlink(); (root / "annotations").rmdir()
    elif case == "no_images":
        for p in (root / "resized_images").iterdir():
            p.unlink()
        (root / "resized_images").rmdir()
    elif case == "repo_root":
        root = tmp_path
    else:
        entry = {"padded_id": {"img_id": "007", "sentences": ["x"]}, "int_id": {"img_id": 7, "sentences": ["x"]},
                 "extra_key": {"img_id": "7", "sentences": ["x"], "img_diff": "7_diff.jpg"},
                 "empty_sentences": {"img_id": "7", "sentences": []}}.get(case)
        if entry is not None:
            ann.write_text(json.dumps([entry]))
        elif case == "not_a_list":
            ann.write_text(json.dumps({"7": ["x"]}))
        elif case == "bad_json":
            ann.write_text("[{")
        elif case == "no_split_file":
            ann.unlink()
    with pytest.raises(DatasetError, match=re.escape(message)) as err:
        load(root)
    assert "path:" in str(err.value) and "fix:" in str(err.value)


# -- the synthetic set ------------------------------------------------------------------------------------------
N = 24


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    return synth.generate(tmp_path_factory.mktemp("sd") / "spot", n_pairs=N, seed=5, workers=2, progress=False)


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_set_round_trips_through_the_real_loader(synth_root):
    ds = SpotTheDiff(synth_root)
    counts = split_counts(ds)
    info = json.loads((synth_root / "synth_info.json").read_text())
    assert info["synthetic"] is True and info["generator"] == synth.GENERATOR_VERSION
    assert sum(c["pairs"] for c in counts.values()) == N and all(c["pairs"] >= 1 for c in counts.values())
    assert all(c["missing_images"] == 0 for c in counts.values())
    for s in ("train", "val", "test"):
        assert {k: counts[s][k] for k in ("pairs", "entries", "sentences")} == \
            {k: info["counts"][s][k] for k in ("pairs", "entries", "sentences")}
    ids = sorted(i for s in ("train", "val", "test") for i in ds.indices(s))
    assert ids == list(range(N))                                      # ids 0..N-1, each in one split
    names = {p.name for p in (synth_root / "resized_images").iterdir()}
    assert names == {f"{i}.png" for i in range(N)} | {f"{i}_2.png" for i in range(N)}   # un-padded
    assert Image.open(synth_root / "resized_images" / "3_2.png").size == (224, 224)
    desc = json.loads((synth_root / "scene_descriptions.json").read_text())
    assert set(desc) == names and all(d.startswith("there is ") for d in desc.values())
    for e in ds.entries("train"):
        assert 1 <= len(e["sentences"]) <= 4
        for sent in e["sentences"]:
            assert sent == sent.lower() and re.fullmatch(r"[a-z0-9 ]+", sent), sent


def test_synthetic_bytes_do_not_depend_on_workers(synth_root, tmp_path):
    one = synth.generate(tmp_path / "one", n_pairs=N, seed=5, workers=1, progress=False)
    assert _digest(one) == _digest(synth_root)


def test_reuses_its_own_output_and_never_replaces_a_foreign_directory(synth_root, tmp_path):
    mtime = (synth_root / "synth_info.json").stat().st_mtime_ns
    assert synth.generate(synth_root, n_pairs=N, seed=5, progress=False) == synth_root
    assert (synth_root / "synth_info.json").stat().st_mtime_ns == mtime
    with pytest.raises(DatasetError, match="another synthetic dataset"):
        synth.generate(synth_root, n_pairs=N, seed=6, progress=False)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="no synth_info.json"):
        synth.generate(foreign, n_pairs=N, seed=5, overwrite=True, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert cli_main(["generate", "spot-the-diff", "--out", str(foreign), "--pairs", "12"]) == 2
    with pytest.raises(DatasetError, match="too small"):
        synth.generate(tmp_path / "x", n_pairs=3, progress=False)
    assert not (tmp_path / "x").exists()


def test_cli_writes_a_loadable_set(tmp_path):
    assert cli_main(["generate", "spot-the-diff", "--out", str(tmp_path / "s"), "--pairs", "12", "--workers",
                     "1"]) == 0
    assert len(SpotTheDiff(tmp_path / "s").pairs("train")) >= 8


def test_about_30_percent_of_references_say_no_difference():
    plans = [synth.plan_pair(0, i)[0] for i in range(1500)]
    sents = [s for p in plans for a in p["annotators"] for s in a]
    share = np.mean([s in synth.NO_DIFFERENCE or s in synth.NO_DIFFERENCE_EXTRA for s in sents])
    assert 0.25 <= share <= 0.35, share
    n_annot = np.array([len(p["annotators"]) for p in plans])
    assert set(n_annot) == {1, 2, 3} and 1.05 < n_annot.mean() < 1.25           # real: ~1.1 entries per pair
    assert {len(p["changes"]) for p in plans} == {0, 1, 2, 3}
    assert {c["change"] for p in plans for c in p["changes"]} == {"appeared", "gone", "moved"}


def test_changes_are_true_of_the_frames():
    for i in range(200):
        p, _ = synth.plan_pair(3, i)
        key = lambda o: (o["kind"], o["colour"], round(o["x"], 3), round(o["y"], 3))  # noqa: E731
        before, after = {key(o) for o in p["before"]}, {key(o) for o in p["after"]}
        for c in p["changes"]:
            if c["change"] == "appeared":
                assert key(c["object"]) in after - before
            elif c["change"] == "gone":
                assert key(c["object"]) in before - after
            else:
                assert key(c["object"]) in before - after and key(c["to"]) in after - before
                assert c["to"]["colour"] == c["object"]["colour"] and c["to"]["kind"] == c["object"]["kind"]
        if not p["changes"]:
            assert before == after and p["descriptions"][0] == p["descriptions"][1]
            assert all(s in synth.NO_DIFFERENCE + synth.NO_DIFFERENCE_EXTRA for a in p["annotators"] for s in a)


def test_no_change_frames_differ_only_by_light_and_noise():
    """A no-change pair's frames differ everywhere a little; a change pair's differ somewhere a lot."""
    def diff(i):
        plan, _ = synth.plan_pair(0, i)
        r = synth.make_pair((0, i, 1.0))
        return plan["changes"], np.abs(r["images"][0].astype(int) - r["images"][1].astype(int)).max(axis=2)
    found = {}
    for i in range(40):
        changes, d = diff(i)
        found.setdefault(bool(changes), d)
        if len(found) == 2:
            break
    still, changed = found[False], found[True]
    assert np.percentile(still, 99.9) < 60                  # light + noise: no object-sized jump anywhere
    assert (changed > 60).sum() > 30                         # an object appeared / left / moved


def test_light_change_scales_only_the_light_between_the_frames():
    """light_change 0: a no-change pair's frames differ by sensor noise alone (no global shift); the before frame,
    the objects, the sentences and the noise draws are the same at every value, so only the after-light moves."""
    i = next(i for i in range(40) if not synth.plan_pair(0, i)[0]["changes"])
    default, flat = synth.make_pair((0, i, 1.0)), synth.make_pair((0, i, 0.0))
    assert np.array_equal(default["images"][0], flat["images"][0])
    assert default["annotators"] == flat["annotators"] and default["after"] == flat["after"]
    shift = lambda r: abs(float(r["images"][1].astype(float).mean() - r["images"][0].astype(float).mean()))
    noise = flat["images"][1].astype(int) - flat["images"][0].astype(int)
    assert shift(flat) < 0.5 < shift(default)                 # the default moves the light of a still scene
    assert np.abs(noise).max() < 30 and 2 < noise.std() < 6    # two frames' noise of sigma 1.5-3.5, clipped


def test_light_change_is_recorded_and_checked_before_writing(tmp_path):
    assert cli_main(["generate", "spot-the-diff", "--out", str(tmp_path / "flat"), "--pairs", "12", "--workers",
                     "1", "--light-change", "0"]) == 0
    info = json.loads((tmp_path / "flat" / "synth_info.json").read_text())
    assert info["light_change"] == 0.0
    default = synth.generate(tmp_path / "default", n_pairs=12, seed=0, workers=1, progress=False)
    marker = default / "synth_info.json"
    legacy = {k: v for k, v in json.loads(marker.read_text()).items() if k != "light_change"}
    marker.write_text(json.dumps(legacy))                      # a set written before the knob existed
    mtime = marker.stat().st_mtime_ns
    assert synth.generate(default, n_pairs=12, seed=0, progress=False) == default   # reused: it is light 1.0
    assert marker.stat().st_mtime_ns == mtime
    with pytest.raises(DatasetError, match="another synthetic dataset"):
        synth.generate(default, n_pairs=12, seed=0, light_change=0.0, progress=False)
    with pytest.raises(DatasetError, match="another synthetic dataset"):   # a different light is a different set
        synth.generate(tmp_path / "flat", n_pairs=12, seed=0, progress=False)
    from idckit.errors import ConfigError
    with pytest.raises(ConfigError, match="light_change must be"):
        synth.generate(tmp_path / "bad", n_pairs=12, light_change=-1, progress=False)
    assert not (tmp_path / "bad").exists()


def test_evaluator_scores_results_against_the_pooled_references(spot, tmp_path):
    from idckit.data.detect import dataset_name
    from idckit.errors import ResultsError
    from idckit.eval import captions as C

    assert dataset_name(spot) == "spot-the-diff"
    C.write_results(tmp_path / "run", {"42.png": "nothing has changed", "1203.png": "the blue car moved"})
    scores = C.evaluate_results(tmp_path / "run", spot, tokenize=False, meteor=False)
    assert scores["total"]["Bleu_1"] == pytest.approx(1.0)          # both candidates are one of their references
    C.write_results(tmp_path / "bad", {"42.png": "x", "1203.png": "y", "0042.png": "z"})
    with pytest.raises(ResultsError, match="not pairs of the 'test' split"):
        C.evaluate_results(tmp_path / "bad", spot, tokenize=False, meteor=False)
    with pytest.raises(DatasetError, match="not a dataset root"):
        dataset_name(tmp_path)


def test_the_profiles_set_names_its_light_in_the_folder_and_the_reports(tmp_path, monkeypatch):
    """The config's light_change reaches the generator, the cache folder (only when not 1.0, so the default
    keeps its folder) and the data line every report prints."""
    from idckit.experiments import data

    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path))
    default = data.pair_dataset("spot-the-diff", "smoke", progress=False)
    assert default.root.name == "synth-spot-the-diff-n40-s0" and "light change 1" in default.description
    real = data.load_config
    monkeypatch.setattr(data, "load_config", lambda name, profile: {**real(name, profile), "light_change": 0.0})
    flat = data.pair_dataset("spot-the-diff", "smoke", progress=False)
    assert flat.root.name == "synth-spot-the-diff-n40-s0-light0" and "light change 0" in flat.description
    assert json.loads((flat.root / "synth_info.json").read_text())["light_change"] == 0.0
    assert flat.identity != default.identity         # run keys hold the identity: no run is shared across lights


@pytest.mark.parametrize("kind", ["car", "person", "bike"])
def test_a_low_sun_on_the_left_draws_every_object(kind):
    """A sun far left stretches a person's shadow past its own box: drawn (PIL refused x1 < x0: seed 7 crashed)."""
    from PIL import Image, ImageDraw

    from idckit.data.synth import spot_the_diff as sd

    img = Image.new("RGBA", (sd.SIZE * sd.SCALE,) * 2, (255, 255, 255, 255))
    scene = {"horizon": 40.0, "sun": (-1.0, 0.5)}
    obj = {"kind": kind, "x": 150.0, "y": 200.0, "vertical": False, "colour": "black", "pants": 0, "skin": 0}
    sd._draw_object(ImageDraw.Draw(img, "RGBA"), scene, obj)
    assert len(np.unique(np.asarray(img).reshape(-1, 4), axis=0)) > 2     # the object and its shadow are drawn
    assert sd._box(5, 1, 2, 4) == [2, 1, 5, 4] and sd._box(2, 1, 5, 4) == [2, 1, 5, 4]
