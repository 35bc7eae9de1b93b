"""The change-description yardstick on hand-made captions, and the baselines' fixed behaviour."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from idckit.eval.baselines import JudgeOracle, NearestDifference
from idckit.data.clevr_change import Pair
from idckit.eval.describes import ChangeRecord, read, record_from_references, record_from_scene, score


def test_read_names_the_type_and_the_referent_not_the_anchor():
    r = read("the small red metal cube to the left of the blue sphere changed to green")
    assert r.change_type == "color" and r.value == "green"
    assert r.attributes == {"size": "small", "color": "red", "material": "metal", "shape": "cube"}
    assert read("the big matte ball has been added").attributes == {"size": "large", "material": "rubber",
                                                                   "shape": "sphere"}
    assert read("the cyan cylinder is missing").change_type == "drop"
    assert read("the brown block changed its location").change_type == "move"
    assert read("the shiny thing turned rubber").change_type == "material"
    assert read("the scene is the same as before").change_type == "none"
    assert read("there is no change").change_type == "none"
    assert read("purple purple purple").change_type == "unknown"


def test_score_counts_type_and_object_against_the_record_with_chance():
    recs = {"1.png": ChangeRecord("color", {"size": "small", "color": "red", "material": "metal", "shape": "cube"}),
            "2.png": ChangeRecord("add", {"size": "large", "color": "blue", "material": "rubber", "shape": "sphere"}),
            "3.png": ChangeRecord("drop", {"size": "large", "color": "gray", "material": "metal",
                                           "shape": "cylinder"}),
            "4.png": ChangeRecord("move", {"size": "small", "color": "red", "material": "rubber", "shape": "cube"})}
    caps = {"1.png": "the red cube changed to blue",          # type and object right
            "2.png": "the blue sphere is missing",            # object right, type wrong
            "3.png": "the red cube is missing",               # type right, object wrong
            "4.png": "the scene is the same as before"}       # neither
    refs = {"1.png": ["the small cube changed to blue"], "2.png": ["the big blue ball has been added"],
            "3.png": ["the gray cylinder is missing"], "4.png": ["the small red cube moved"]}
    s = score(caps, recs, refs)
    assert s["type_named"] == 50.0 and s["attributes_named"] == 50.0 and s["changed_pairs"] == 4
    assert s["type_chance"] == 25.0
    # chance: pair k read with the next pair's reference: 1<-"big blue ball" no, 2<-"gray cylinder" no,
    # 3<-"small red cube" no, 4<-"small cube" yes
    assert s["attributes_chance"] == 25.0


def test_records_from_the_scene_and_from_the_references_agree():
    default = {"objects": [{"size": "small", "color": "red", "material": "metal", "shape": "cube"}]}
    semantic = {"objects": [{"size": "small", "color": "blue", "material": "metal", "shape": "cube"}],
                "change": {"type": "color", "before_index": 0, "after_index": 0, "attribute": "blue"}}
    assert record_from_scene(semantic, default).obj["color"] == "red"    # referred to by the old colour
    pair = Pair("1.png", 1, Path("b"), Path("a"), ("the red cube changed to blue", "the small red block became blue"),
                "color")
    rec = record_from_references(pair)
    assert rec.change_type == "color" and rec.obj == {"color": "red", "shape": "cube", "size": "small"}


def _pair(tmp_path, name, before, after, caps, ctype):
    b, a = tmp_path / f"{name}_b.png", tmp_path / f"{name}_a.png"
    Image.fromarray(before).save(b)
    Image.fromarray(after).save(a)
    return Pair(f"{name}.png", int(name), b, a, tuple(caps), ctype)


def test_nearest_difference_gives_the_no_change_caption_for_a_zero_difference(tmp_path):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)
    moved = img.copy()
    moved[5:15, 5:15] = 0
    moved2 = img.copy()
    moved2[20:30, 30:40] = 255
    train = [_pair(tmp_path, "0", img, moved, ["the red cube is missing"], "drop"),   # training pair 0 changes
             _pair(tmp_path, "1", img, moved2, ["the blue ball has been added"], "add"),
             _pair(tmp_path, "2", img, img.copy(), ["there is no change", "there is no change",
                                                    "nothing has changed"], "distractor")]
    test = [_pair(tmp_path, "10", moved, moved.copy(), ["x"], "distractor"),
            _pair(tmp_path, "11", img, moved, ["x"], "drop")]
    preds = NearestDifference().fit(train).predict(test)
    assert preds["10.png"] == "there is no change"        # not training pair 0's caption (argmax of all zeros)
    assert preds["11.png"] == "the red cube is missing"
    oracle = JudgeOracle().fit(train).predict(test)
    assert oracle == {"10.png": "there is no change", "11.png": "the blue ball has been added"}  # ties: a-z
    with pytest.raises(ValueError, match="both kinds"):
        JudgeOracle().fit(train[:2])
