"""Vocabulary: tokenisation, fixed specials, deterministic order, encoding rules, round trip, clear file errors."""
from __future__ import annotations

import json

import pytest

from idckit.errors import ConfigError
from idckit.text.vocab import SPECIALS, Vocab, tokenize


def test_tokenize_lowercases_and_splits_punctuation():
    assert tokenize("The red Cube moved.") == ["the", "red", "cube", "moved", "."]
    assert tokenize("no change was made") == ["no", "change", "was", "made"]
    assert tokenize("the small red metal cube changed to blue ") == \
        ["the", "small", "red", "metal", "cube", "changed", "to", "blue"]
    assert tokenize("cube,sphere;  ball!") == ["cube", ",", "sphere", ";", "ball", "!"]


def test_specials_have_fixed_ids():
    v = Vocab.build([])
    assert v.words == list(SPECIALS) and len(v) == v.n_special == 8
    assert (v.pad_id, v.bos_id, v.eos_id, v.unk_id, v.mask_id, v.img1_id, v.img2_id, v.cls_id) == tuple(range(8))
    assert [v.words[i] for i in (v.pad_id, v.mask_id, v.cls_id)] == ["[PAD]", "[MASK]", "[CLS]"]


def test_build_orders_by_count_then_word_and_applies_min_count():
    caps = ["the red cube", "the blue cube", "the sphere", "a blue ball"]
    v = Vocab.build(caps)
    assert v.words[8:] == ["the", "blue", "cube", "a", "ball", "red", "sphere"]
    assert Vocab.build(reversed(caps)).words == v.words            # input order does not matter
    assert Vocab.build(caps, min_count=2).words[8:] == ["the", "blue", "cube"]
    with pytest.raises(ConfigError, match="duplicate"):
        Vocab(list(SPECIALS) + ["a", "a"])


def test_encode_truncates_keeps_eos_and_maps_unknown_words():
    v = Vocab.build(["a b c d e"])
    a, b, c = v.ids["a"], v.ids["b"], v.ids["c"]
    assert v.encode("A b zzz.", 10) == [v.bos_id, a, b, v.unk_id, v.unk_id, v.eos_id]     # "." is unknown here
    assert v.encode("a b c d e", 5) == [v.bos_id, a, b, c, v.eos_id]
    assert v.encode("a b c d e", 7) == [v.bos_id, a, b, c, v.ids["d"], v.ids["e"], v.eos_id]
    with pytest.raises(ConfigError, match="max_len"):
        v.encode("a", 2)
    batch = v.encode_batch(["a", "a b c"], 6)
    assert batch.dtype.is_floating_point is False and batch.shape == (2, 6)
    assert batch.tolist() == [[1, a, 2, 0, 0, 0], [1, a, b, c, 2, 0]]


def test_decode_stops_at_eos_and_skips_specials():
    v = Vocab.build(["a b c"])
    a, b, c = v.ids["a"], v.ids["b"], v.ids["c"]
    assert v.decode([v.bos_id, a, v.mask_id, b, v.eos_id, c]) == "a b"
    assert v.decode([a, v.pad_id, v.unk_id, c]) == "a c"
    assert v.decode(v.encode_batch(["c b a"], 8)[0]) == "c b a"       # tensors of ids work too


def test_decode_keeps_specials_as_words_the_authors_way():
    """The authors' ``transform`` (yaolinli/IDC clver/finetune.py:437-445, bird/finetune.py:410-418): skip <BOS>,
    stop at <EOS>, every other id is a word, <UNK>, <PAD> and <MASK> in mid-caption included."""
    v = Vocab.build(["a b c"])
    a, b, c = v.ids["a"], v.ids["b"], v.ids["c"]
    ids = [v.bos_id, a, v.unk_id, b, v.pad_id, v.mask_id, v.bos_id, c, v.cls_id, v.eos_id, a]
    assert v.decode(ids, "keep") == "a [UNK] b [PAD] [MASK] c [CLS]"
    assert len(v.decode(ids, "keep").split()) == 7                     # what a whitespace-split scorer counts
    assert v.decode(ids, "drop") == v.decode(ids) == "a b c"          # the kit's, unchanged
    with pytest.raises(ConfigError, match="special_words"):
        v.decode(ids, "strip")


def test_save_load_round_trip(tmp_path):
    v = Vocab.build(["the red cube changed to blue", "no change was made ."])
    v.save(tmp_path / "vocab.json")
    mapping = json.loads((tmp_path / "vocab.json").read_text())
    assert mapping["[PAD]"] == 0 and mapping["[CLS]"] == 7 and len(mapping) == len(v)   # dict.json's shape
    back = Vocab.load(tmp_path / "vocab.json")
    assert back.words == v.words and back.encode("the red cube .", 8) == v.encode("the red cube .", 8)


@pytest.mark.parametrize("content, message", [
    ("[1, 2", "not a vocabulary file"),                                  # bad JSON
    ("[1, 2]", "word -> integer id"),                                    # not an object
    ('{"[PAD]": "0"}', "word -> integer id"),                            # string ids
    ('{"[PAD]": 0, "x": 2}', "0..N-1"),                                  # a gap
    ('{"a": 0, "b": 1}', "specials"),                                    # not the kit's specials
])
def test_load_errors_name_the_path_and_the_fix(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as err:
        Vocab.load(path)
    assert err.value.path == path and "vocab.json" in str(err.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found") as err:
        Vocab.load(tmp_path / "missing.json")
    assert err.value.path == tmp_path / "missing.json" and err.value.fix
