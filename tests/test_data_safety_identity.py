"""Data identity by content (issue 50, item 5): a run key and a feature store key hold what a dataset holds (its
caption, split and type files, and its image list), for every dataset kind the kit reads, so editing a dataset's
files retrains and re-extracts instead of returning another dataset's cached run.

The keys are compared directly (no training): the run key is :func:`idckit.experiments.runs.run_key` of a config
holding the data's identity and version (what every family's run config holds, see ``Setup.identity``), and the
feature key is the folder its features are cached under (``runs_dir/features/<tag>/``, ``base.features``).

Each dataset is a kit-generated synthetic set (the generators at their smallest), so its ``synth_info.json`` is
there: until content identity, such a set was keyed by that file alone.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from idckit.experiments import data as data_mod
from idckit.experiments.runs import TRAINING_CODE_VERSION, run_key

KINDS = ("clevr-change", "spot-the-diff", "editing-request", "birds")


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """One small synthetic set of every kind (about 3 s in all), copied by each test before it edits."""
    from idckit.data.synth import birds, clevr_change, editing_request, spot_the_diff

    base = tmp_path_factory.mktemp("identity")
    return {
        "clevr-change": clevr_change.generate(base / "clevr", n_pairs=20, seed=0, size=(32, 32), workers=1,
                                              progress=False),
        "spot-the-diff": spot_the_diff.generate(base / "std", n_pairs=12, seed=0, workers=1, progress=False),
        "editing-request": editing_request.generate(base / "ier", n_pairs=12, seed=0, workers=1, progress=False),
        "birds": birds.generate(base / "birds", profile="smoke", size=48, workers=1, progress=False),
    }


def keys(kind: str, root: Path) -> tuple[str, str]:
    """(run key, feature key) of the data at ``root``, as the experiments compute them."""
    if kind == "birds":
        choice = data_mod.birds("smoke", root, progress=False)
        feature_key = choice.cache_name
    else:
        choice = data_mod.pair_dataset(kind, "smoke", root, progress=False)
        feature_key = choice.tag
    config = {"kind": "k", "data": choice.identity, "data_version": choice.version,
              "training_code": TRAINING_CODE_VERSION}
    return run_key(config), feature_key


def copy(generated, kind, tmp_path, name="copy") -> Path:
    return Path(shutil.copytree(generated[kind], tmp_path / name))


def assert_new_keys(kind: str, original: Path, edited: Path) -> None:
    (run_a, feat_a), (run_b, feat_b) = keys(kind, original), keys(kind, edited)
    assert run_b != run_a, "the run key did not change: the original's cached runs would be returned"
    assert feat_b != feat_a, "the feature key did not change: the original's feature store would be read"


# -- the dataset's files, per kind -----------------------------------------------------------------------------
def _edit_json(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def replace_captions(kind: str, root: Path) -> None:
    """Every caption of every split replaced (the layout, ids and splits kept)."""
    if kind == "clevr-change":
        _edit_json(root / "change_captions.json", lambda d: {k: ["something else changed"] * len(v)
                                                             for k, v in d.items()})
    elif kind == "spot-the-diff":
        for split in ("train", "val", "test"):
            _edit_json(root / "annotations" / f"{split}.json",
                       lambda d: [{**e, "sentences": ["the car is gone"] * len(e["sentences"])} for e in d])
    elif kind == "editing-request":
        for name in ("train.json", "valid.json", "test.json"):
            _edit_json(root / name, lambda d: [{**e, "sents": ["make it brighter"] * len(e["sents"])} for e in d])
    else:
        tsv = root / "birds_to_words" / "birds-to-words-v1.0.tsv"
        head, *rows = tsv.read_text(encoding="utf-8").splitlines()
        rows = ["\t".join(r.split("\t")[:-1] + ["animal1 is smaller than animal2 ."]) for r in rows]
        tsv.write_text("\n".join([head, *rows]) + "\n", encoding="utf-8")


def swap_val_and_test(kind: str, root: Path) -> None:
    if kind == "clevr-change":
        _edit_json(root / "splits.json", lambda d: {**d, "val": d["test"], "test": d["val"]})
        return
    if kind in ("spot-the-diff", "editing-request"):
        a, b = ((root / "annotations" / "val.json", root / "annotations" / "test.json") if kind == "spot-the-diff"
                else (root / "valid.json", root / "test.json"))
        text_a = a.read_text()
        a.write_text(b.read_text())
        b.write_text(text_a)
        return
    tsv = root / "birds_to_words" / "birds-to-words-v1.0.tsv"
    head, *rows = tsv.read_text(encoding="utf-8").splitlines()
    col = head.split("\t").index("split")
    swap = {"val": "test", "test": "val"}
    rows = ["\t".join(swap.get(c, c) if i == col else c for i, c in enumerate(r.split("\t"))) for r in rows]
    tsv.write_text("\n".join([head, *rows]) + "\n", encoding="utf-8")


IMAGE_DIRS = {"clevr-change": "images", "spot-the-diff": "resized_images", "editing-request": "images",
              "birds": "birds_to_words/images"}


def an_image(kind: str, root: Path) -> Path:
    return sorted(p for p in (root / IMAGE_DIRS[kind]).iterdir() if p.is_file())[0]


# -- the tests ---------------------------------------------------------------------------------------------------
def test_the_issue_case_a_copy_with_new_captions_and_swapped_splits_is_other_data(generated, tmp_path):
    """The issue's case: copy a dataset, replace every caption, swap val and test. Its synth_info.json is the
    original's, and the kit once returned the original's cached run in 5 s."""
    edited = copy(generated, "clevr-change", tmp_path)
    replace_captions("clevr-change", edited)
    _edit_json(edited / "no_change_captions.json", lambda d: {k: ["it is all the same"] * len(v)
                                                              for k, v in d.items()})
    swap_val_and_test("clevr-change", edited)
    assert (edited / "synth_info.json").read_bytes() == (generated["clevr-change"] / "synth_info.json").read_bytes()
    assert_new_keys("clevr-change", generated["clevr-change"], edited)


@pytest.mark.parametrize("edit", [replace_captions, swap_val_and_test], ids=["captions", "swapped-splits"])
@pytest.mark.parametrize("kind", KINDS)
def test_edited_captions_or_splits_are_new_keys(generated, tmp_path, kind, edit):
    edited = copy(generated, kind, tmp_path)
    edit(kind, edited)
    assert_new_keys(kind, generated[kind], edited)


def test_replaced_no_change_captions_are_new_keys(generated, tmp_path):
    edited = copy(generated, "clevr-change", tmp_path)
    _edit_json(edited / "no_change_captions.json", lambda d: {k: ["nothing moved at all"] * len(v)
                                                              for k, v in d.items()})
    assert_new_keys("clevr-change", generated["clevr-change"], edited)


def test_an_edited_type_mapping_is_new_keys(generated, tmp_path):
    edited = copy(generated, "clevr-change", tmp_path)

    def relabel(types):     # every colour change called a material change
        return {**types, "material": types["material"] + types["color"], "color": []}

    _edit_json(edited / "type_mapping.json", relabel)
    assert_new_keys("clevr-change", generated["clevr-change"], edited)


def test_edited_cub_captions_are_new_keys(generated, tmp_path):
    """CUB's Reed captions are one file per image (the GIC stage's text): once not hashed at all."""
    edited = copy(generated, "birds", tmp_path)
    for txt in (edited / "cvpr2016_cub" / "text_c10").rglob("*.txt"):
        txt.write_text("a bird with a red crown\n" * 10, encoding="utf-8")
    assert_new_keys("birds", generated["birds"], edited)


@pytest.mark.parametrize("kind", KINDS)
def test_an_added_image_is_new_keys(generated, tmp_path, kind):
    edited = copy(generated, kind, tmp_path)
    image = an_image(kind, edited)
    shutil.copyfile(image, image.with_name("zz_extra" + image.suffix))
    assert_new_keys(kind, generated[kind], edited)


@pytest.mark.parametrize("kind", KINDS)
def test_a_removed_image_is_new_keys(generated, tmp_path, kind):
    edited = copy(generated, kind, tmp_path)
    an_image(kind, edited).unlink()
    assert_new_keys(kind, generated[kind], edited)


@pytest.mark.parametrize("kind", ("clevr-change", "birds"))
def test_a_renamed_image_is_new_keys(generated, tmp_path, kind):
    edited = copy(generated, kind, tmp_path)
    image = an_image(kind, edited)
    image.rename(image.with_name("renamed_" + image.name))
    assert_new_keys(kind, generated[kind], edited)


def test_an_image_replaced_by_one_of_another_size_is_new_keys(generated, tmp_path):
    edited = copy(generated, "clevr-change", tmp_path)
    before, after = an_image("clevr-change", edited), edited / "sc_images" / "CLEVR_semantic_000000.png"
    before.write_bytes(after.read_bytes() + b"\0")   # other bytes, other length
    assert_new_keys("clevr-change", generated["clevr-change"], edited)


@pytest.mark.parametrize("kind", ("clevr-change", "birds"))
def test_an_untouched_copy_elsewhere_keeps_both_keys(generated, tmp_path, kind):
    """Path independence, as before: a copy at another path (new modification times: plain ``cp -r``) is the
    same data, its cached runs and features reused. So are the files the kit itself writes into a data root (the
    CLI's default feature store DATA_ROOT/features/, its lock and owner files)."""
    moved = Path(shutil.copytree(generated[kind], tmp_path / "else" / "where", copy_function=shutil.copyfile))
    (moved / "features" / "efficientnet_lite0").mkdir(parents=True)
    (moved / "features" / "efficientnet_lite0" / "meta.json").write_text("{}")
    (moved / ".idckit-lock-features-efficientnet_lite0").write_text("")
    assert keys(kind, moved) == keys(kind, generated[kind])


def test_images_behind_a_link_are_the_data_and_a_link_loop_ends(generated, tmp_path):
    """A root arranged with links (how the real bird downloads are meant to be put together) is keyed on what the
    links reach; a link back up the tree is entered once."""
    edited = copy(generated, "clevr-change", tmp_path)
    elsewhere = tmp_path / "download" / "images"
    shutil.move(str(edited / "images"), str(elsewhere))
    (edited / "images").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(elsewhere.parent, target_is_directory=True)
    linked = keys("clevr-change", edited)
    shutil.copyfile(elsewhere / "CLEVR_default_000000.png", elsewhere / "CLEVR_default_000999.png")
    assert keys("clevr-change", edited)[0] != linked[0]


def test_an_unreadable_annotation_file_is_a_clear_error(generated, tmp_path, monkeypatch):
    from idckit.errors import DatasetError

    edited = copy(generated, "spot-the-diff", tmp_path)
    (edited / "synth_info.json").unlink()          # a real release's layout: its annotations were read before too
    locked = edited / "changes.json"
    read_bytes = Path.read_bytes

    def refuse(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(DatasetError, match="cannot read this dataset file") as err:
        data_mod.content_identity(edited)
    assert err.value.path == locked and "chmod" in err.value.fix
