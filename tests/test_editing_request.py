"""Image-Editing-Request: the real layout (four keys, valid.json, raw text, errors, missing images), the edits
and the synthetic set written in that layout (round trip, counts, mixed extensions, determinism)."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from PIL import Image

from idckit.cli import main as cli_main
from idckit.data.editing_request import EditingRequest, split_counts
from idckit.data.synth import editing_request as synth
from idckit.errors import DatasetError

# Image-Editing-Request's released schema and names (airsplay/VisualRelationships), plus one pair per other split
VALID = [{"img0": "Reddit.com_4wfxf2_4wfxf2.jpg", "img1": "Reddit.com_4wfxf2_d66nm3m_2.jpg",
          "sents": ["take the people out of the back in the photo", "Remove the two people behind the couple",
                    "remove people behind the couple in the centre"], "uid": "Reddit_1052"}]
TRAIN = [{"img0": "Zhopped.com_a1_a1.png", "img1": "Zhopped.com_a1_b2.JPG", "sents": ["Make it brighter!"],
          "uid": "Zhopped_3"},
         {"img0": "Reddit.com_c3_c3.jpeg", "img1": "Reddit.com_c3_d4.gif", "sents": ["crop out the dog."],
          "uid": "Reddit_7"}]
TEST = [{"img0": "Reddit.com_e5_e5.jpg", "img1": "Reddit.com_e5_f6.png",
         "sents": ["Add a frame.", "put a border around it", "Frame it, please"], "uid": "Reddit_9"}]


def write_ier(root):
    (root / "images").mkdir(parents=True)
    for name, rows in (("train.json", TRAIN), ("valid.json", VALID), ("test.json", TEST)):
        (root / name).write_text(json.dumps(rows, indent=4))
        for r in rows:
            for key in ("img0", "img1"):
                fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "gif": "GIF"}[r[key].rsplit(".", 1)[1].lower()]
                Image.new("RGB", (12, 9), (200, 10, 10)).save(root / "images" / r[key], format=fmt)
    return root


@pytest.fixture
def ier(tmp_path):
    return write_ier(tmp_path / "adobe")


def test_one_pair_per_entry_with_raw_requests_and_uid_ids(ier):
    ds = EditingRequest(ier)
    (pair,) = ds.pairs("val")
    assert pair.pair_id == "Reddit_1052" and pair.change_type == "edit" and pair.is_change
    assert pair.before == ier / "images" / "Reddit.com_4wfxf2_4wfxf2.jpg"
    assert pair.after == ier / "images" / "Reddit.com_4wfxf2_d66nm3m_2.jpg"
    assert pair.captions[1] == "Remove the two people behind the couple"          # raw: case kept
    assert ds.pairs("valid") == ds.pairs("val")
    assert ds.references("train") == {"Zhopped_3": ["Make it brighter!"], "Reddit_7": ["crop out the dog."]}
    assert [p.after.suffix for p in ds.pairs("train")] == [".JPG", ".gif"]          # mixed extensions
    assert split_counts(ds) == {"train": {"pairs": 2, "sentences": 2, "missing_images": 0},
                                "val": {"pairs": 1, "sentences": 3, "missing_images": 0},
                                "test": {"pairs": 1, "sentences": 3, "missing_images": 0}}


def test_images_beside_the_json_when_there_is_no_images_folder(ier):
    for p in (ier / "images").iterdir():
        p.rename(ier / p.name)
    (ier / "images").rmdir()
    assert EditingRequest(ier).pairs("test")[0].before == ier / "Reddit.com_e5_e5.jpg"


def test_missing_images_are_flagged_and_counted_not_fatal(ier):
    (ier / "images" / "Reddit.com_c3_d4.gif").unlink()
    ds = EditingRequest(ier)
    with pytest.warns(UserWarning, match="1 of 2 pairs have a missing image"):
        assert [p.pair_id for p in ds.pairs("train")] == ["Zhopped_3"]
    assert ds.missing["train"] == {"Reddit_7": [ier / "images" / "Reddit.com_c3_d4.gif"]}
    assert len(ds.references("train")) == 2 and split_counts(ds)["train"]["missing_images"] == 1


@pytest.mark.parametrize("case, message", [
    ("extra_key", "expected exactly img0, img1, sents, uid"),
    ("missing_key", "expected exactly img0, img1, sents, uid"),
    ("empty_sents", "sents must be a non-empty list"),
    ("int_uid", "must be non-empty strings"),
    ("duplicate_uid", "occurs twice"),
    ("not_a_list", "must be a JSON list"),
    ("bad_json", "malformed JSON"),
    ("no_valid", "missing file valid.json"),
    ("no_json", "no train.json, valid.json or test.json"),
    ("repo_root", "pass "),
])
def test_wrong_layouts_name_the_path_and_the_fix(tmp_path, case, message):
    root = write_ier(tmp_path / "dataset" / "adobe")
    f = root / "valid.json"
    entry = dict(VALID[0])
    if case == "extra_key":
        f.write_text(json.dumps([{**entry, "imgdiff": "x.jpg"}]))
    elif case == "missing_key":
        entry.pop("uid"); f.write_text(json.dumps([entry]))
    elif case == "empty_sents":
        f.write_text(json.dumps([{**entry, "sents": []}]))
    elif case == "int_uid":
        f.write_text(json.dumps([{**entry, "uid": 1052}]))
    elif case == "duplicate_uid":
        f.write_text(json.dumps([entry, entry]))
    elif case == "not_a_list":
        f.write_text(json.dumps(entry))
    elif case == "bad_json":
        f.write_text("[")
    elif case == "no_valid":
        f.unlink()
    elif case == "no_json":
        root = tmp_path / "empty"
        root.mkdir()
    elif case == "repo_root":
        root = tmp_path
    with pytest.raises(DatasetError, match=re.escape(message)) as err:
        EditingRequest(root).pairs("val")
    assert "path:" in str(err.value)


# -- edits --------------------------------------------------------------------------------------------------
def test_inpainting_fills_a_hole_from_its_surroundings():
    rng = np.random.default_rng(0)
    img = np.zeros((40, 60, 3), np.uint8)
    img[:20] = (100, 150, 200)                     # two horizontal bands, like sky over ground
    img[20:] = (60, 120, 40)
    obj = img.copy()
    obj[10:30, 25:35] = (250, 0, 0)                # an object across the band edge
    mask = np.zeros((40, 60), bool)
    mask[10:30, 25:35] = True
    out = synth.inpaint(obj, mask, rng).astype(int)
    assert np.abs(out[11:16, 26:34] - (100, 150, 200)).max() < 15
    assert np.abs(out[24:29, 26:34] - (60, 120, 40)).max() < 15
    far = np.ones((40, 60), bool)
    far[7:33, 22:38] = False                       # outside the mask and its 2-px rim: untouched
    assert (out[far] == obj[far]).all()


def test_edits_do_what_their_requests_say():
    rng = np.random.default_rng(1)
    base = Image.fromarray(np.random.default_rng(2).integers(40, 200, (30, 40, 3), dtype=np.uint8))
    arr = np.asarray(base, float)
    for _ in range(20):
        img, e = synth.apply_edit(base, "brightness", rng)
        assert (np.asarray(img, float).mean() > arr.mean()) == (e["direction"] == "up")
        img, e = synth.apply_edit(base, "crop", rng)
        assert (img.size[0] < 40) == (e["side"] in ("left", "right", "centre"))
        img, e = synth.apply_edit(base, "rotate", rng)
        if e["kind"] == "mirror":
            assert (np.asarray(img) == np.asarray(base)[:, ::-1]).all()
        elif e["kind"] in ("left", "right"):
            assert img.size == (30, 40)
    img, e = synth.apply_edit(base, "frame", rng)
    assert img.size == base.size and tuple(np.asarray(img)[0, 0]) == synth.COLOURS[e["colour"]]
    img, e = synth.apply_edit(base, "saturation", np.random.default_rng(0))
    if e["direction"] == "grey":
        a = np.asarray(img, int)
        assert np.abs(a[..., 0] - a[..., 1]).max() <= 1


def test_requests_are_raw_and_varied():
    rng = np.random.default_rng(3)
    edits = [{"op": "brightness", "direction": "up", "factor": 1.5}]
    texts = {synth.request(edits, rng) for _ in range(200)}
    assert len(texts) > 20
    assert any(t[0].isupper() for t in texts) and any(t[0].islower() for t in texts)
    assert any(t.endswith((".", "!", "?")) for t in texts) and any(t[-1].isalpha() for t in texts)
    both = synth.request(edits + [{"op": "frame", "colour": "red", "width": 4}], rng)
    assert " and " in both and "red" in both


# -- the synthetic set ------------------------------------------------------------------------------------------
N = 24


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    return synth.generate(tmp_path_factory.mktemp("ier") / "ier", n_pairs=N, seed=2, workers=2, progress=False)


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_set_round_trips_through_the_real_loader(synth_root):
    ds = EditingRequest(synth_root)
    counts = split_counts(ds)
    assert sum(c["pairs"] for c in counts.values()) == N and all(c["missing_images"] == 0 for c in counts.values())
    assert counts["train"]["sentences"] == counts["train"]["pairs"]                      # 1 request per train pair
    assert counts["val"]["sentences"] == 3 * counts["val"]["pairs"] >= 3                 # 3 per valid/test pair
    assert counts["test"]["sentences"] == 3 * counts["test"]["pairs"] >= 3
    raw = json.loads((synth_root / "valid.json").read_text())
    assert all(list(r) == ["img0", "img1", "sents", "uid"] for r in raw)
    assert (synth_root / "valid.json").read_text().startswith('[\n    {\n        "img0"')   # indent 4
    pairs = [p for s in ("train", "val", "test") for p in ds.pairs(s)]
    assert len({p.pair_id for p in pairs}) == N
    for p in pairs:
        Image.open(p.before).convert("RGB")
        Image.open(p.after).convert("RGB")
    exts = {p.suffix for p in (synth_root / "images").iterdir()}
    assert len(exts) >= 3 and ".jpg" in exts
    desc = json.loads((synth_root / "scene_descriptions.json").read_text())
    assert set(desc) == {p.name for p in (synth_root / "images").iterdir()}
    edits = json.loads((synth_root / "edits.json").read_text())
    assert set(edits) == {p.pair_id for p in pairs}
    assert all(e["op"] in synth.OPS for v in edits.values() for e in v)
    assert all(1 <= len(v) <= 2 for v in edits.values())


def test_synthetic_bytes_do_not_depend_on_workers(synth_root, tmp_path):
    one = synth.generate(tmp_path / "one", n_pairs=N, seed=2, workers=1, progress=False)
    assert _digest(one) == _digest(synth_root)


def test_reuse_refusal_and_cli(synth_root, tmp_path):
    assert synth.generate(synth_root, n_pairs=N, seed=2, progress=False) == synth_root
    with pytest.raises(DatasetError, match="another synthetic dataset"):
        synth.generate(synth_root, n_pairs=N + 1, seed=2, progress=False)
    foreign = tmp_path / "real"
    foreign.mkdir()
    (foreign / "train.json").write_text("[]")
    with pytest.raises(DatasetError, match="no synth_info.json"):
        synth.generate(foreign, n_pairs=N, overwrite=True, progress=False)
    assert (foreign / "train.json").read_text() == "[]"
    assert cli_main(["generate", "editing-request", "--out", str(tmp_path / "c"), "--pairs", "12", "--workers",
                     "1"]) == 0
    assert len(EditingRequest(tmp_path / "c").pairs("train")) >= 8


def test_every_edit_kind_is_drawn():
    ops = set()
    for i in range(60):
        ops.update(e["op"] for e in synth.make_pair((0, i, 1))["edits"])
    assert ops == set(synth.OPS)


def test_evaluator_reads_uids_and_raw_references(ier, tmp_path, tiny_clevr):
    from idckit.data.detect import dataset_name
    from idckit.eval import captions as C

    assert dataset_name(ier) == "editing-request" and dataset_name(tiny_clevr) == "clevr-change"
    C.write_results(tmp_path / "run", {"Zhopped_3": "make it brighter", "Reddit_7": "crop out the dog"})
    scores = C.evaluate_results(tmp_path / "run", ier, split="train", tokenize=True, meteor=False)
    assert scores["total"]["Bleu_1"] == pytest.approx(1.0)   # PTB lower-cases and drops "!" / "." of the raw text
