from __future__ import annotations

import json

import pytest

from idckit.data.clevr_change import ClevrChange, DISTRACTOR, pair_id, parse_pair_id, split_counts
from idckit.data.images import load_image
from idckit.errors import DatasetError, IdckitError


def test_every_index_yields_a_semantic_and_a_distractor_pair(tiny_clevr):
    ds = ClevrChange(tiny_clevr)
    test = ds.pairs("test")
    assert [p.pair_id for p in test] == ["000002.png", "000002.png_n", "000005.png", "000005.png_n"]
    sem, dis = test[0], test[1]
    assert sem.change_type == "drop" and sem.is_change
    assert dis.change_type == DISTRACTOR and not dis.is_change
    assert sem.before == dis.before == tiny_clevr / "images" / "CLEVR_default_000002.png"
    assert sem.after == tiny_clevr / "sc_images" / "CLEVR_semantic_000002.png"
    assert dis.after == tiny_clevr / "nsc_images" / "CLEVR_nonsemantic_000002.png"
    assert sem.captions == ("the small gray rubber sphere is missing", "the tiny gray ball is gone")
    assert dis.captions == ("nothing has changed",)


def test_references_types_and_counts(tiny_clevr):
    ds = ClevrChange(tiny_clevr)
    assert ds.references("val")["000001.png_n"] == ["there is no change"]
    assert ds.types("train") == {"000000.png": "color", "000000.png_n": DISTRACTOR,
                                 "000003.png": "color", "000003.png_n": DISTRACTOR}
    counts = split_counts(ds)
    assert counts["test"]["drop"] == 1 and counts["test"]["material"] == 1 and counts["test"][DISTRACTOR] == 2
    assert sum(sum(c.values()) for c in counts.values()) == 12


def test_paths_come_from_the_index_not_a_directory_listing(tiny_clevr):
    # An extra stray file in images/ must not shift indices (RCC's sorted(listdir)[idx] would).
    (tiny_clevr / "images" / "CLEVR_default_000000_copy.png").write_bytes(b"x")
    (tiny_clevr / "images" / "AAA.png").write_bytes(b"x")
    ds = ClevrChange(tiny_clevr)
    assert ds.pairs("train")[0].before.name == "CLEVR_default_000000.png"


@pytest.mark.parametrize("pid,expected", [("000123.png", (123, False)), ("000123.png_n", (123, True))])
def test_pair_ids_round_trip(pid, expected):
    assert parse_pair_id(pid) == expected
    assert pair_id(*expected) == pid
    with pytest.raises(ValueError):
        parse_pair_id("CLEVR_default_000123.png")


def test_missing_folder_names_it_and_the_fix(tiny_clevr):
    import shutil

    shutil.rmtree(tiny_clevr / "nsc_images")
    with pytest.raises(DatasetError) as e:
        ClevrChange(tiny_clevr)
    assert "nsc_images" in str(e.value) and "idckit generate clevr-change" in str(e.value)
    assert e.value.path == tiny_clevr / "nsc_images"


def test_missing_file_and_malformed_json(tiny_clevr):
    (tiny_clevr / "splits.json").unlink()
    with pytest.raises(DatasetError, match="missing file splits.json"):
        ClevrChange(tiny_clevr).pairs("test")
    (tiny_clevr / "splits.json").write_text('{"train": [0], "val": [1], "test": [2')
    with pytest.raises(DatasetError, match="malformed JSON in splits.json"):
        ClevrChange(tiny_clevr).pairs("test")
    (tiny_clevr / "splits.json").write_text('{"train": [0], "val": [1]}')
    with pytest.raises(DatasetError, match="splits.json must be"):
        ClevrChange(tiny_clevr).pairs("test")
    (tiny_clevr / "splits.json").write_text('{"train": ["0"], "val": [1], "test": [2]}')
    with pytest.raises(DatasetError, match="non-negative integer"):
        ClevrChange(tiny_clevr).pairs("train")


def test_split_index_without_images(tiny_clevr):
    (tiny_clevr / "sc_images" / "CLEVR_semantic_000005.png").unlink()
    with pytest.raises(DatasetError) as e:
        ClevrChange(tiny_clevr).pairs("test")
    assert "split index 5" in str(e.value) and "CLEVR_semantic_000005.png" in str(e.value)
    # Metadata-only access (the evaluator) does not need the images.
    assert len(ClevrChange(tiny_clevr).references("test")) == 4


def test_index_without_captions_or_type(tiny_clevr):
    caps = json.loads((tiny_clevr / "no_change_captions.json").read_text())
    caps["CLEVR_default_000002.png"] = []
    (tiny_clevr / "no_change_captions.json").write_text(json.dumps(caps))
    with pytest.raises(DatasetError, match="index 2 .* no captions in no_change_captions.json"):
        ClevrChange(tiny_clevr).pairs("test")

    types = json.loads((tiny_clevr / "type_mapping.json").read_text())
    types["drop"] = []
    (tiny_clevr / "type_mapping.json").write_text(json.dumps(types))
    (tiny_clevr / "no_change_captions.json").write_text(json.dumps({**caps, "CLEVR_default_000002.png": ["x"]}))
    with pytest.raises(DatasetError, match="no change type"):
        ClevrChange(tiny_clevr).pairs("test")


def test_bad_type_mapping(tiny_clevr):
    (tiny_clevr / "type_mapping.json").write_text(json.dumps({"colour": ["000000.png"]}))
    with pytest.raises(DatasetError, match="unknown change type 'colour'"):
        ClevrChange(tiny_clevr).pairs("train")
    (tiny_clevr / "type_mapping.json").write_text(json.dumps({"color": ["000000.png_n"]}))
    with pytest.raises(DatasetError, match="distractor id"):
        ClevrChange(tiny_clevr).pairs("train")


def test_unreadable_image(tiny_clevr):
    bad = tiny_clevr / "images" / "CLEVR_default_000000.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(DatasetError, match="unreadable image") as e:
        load_image(bad)
    assert isinstance(e.value, IdckitError) and e.value.path == bad
    assert load_image(tiny_clevr / "images" / "CLEVR_default_000001.png").size == (8, 6)


def test_unknown_split_and_not_a_directory(tiny_clevr, tmp_path):
    with pytest.raises(DatasetError, match="unknown split 'dev'"):
        ClevrChange(tiny_clevr).pairs("dev")
    with pytest.raises(DatasetError, match="not a directory"):
        ClevrChange(tmp_path / "nope")
