"""Vocabulary: fixed specials, encoding rules, round trip, clear errors on bad files."""
from __future__ import annotations

import pytest

from idckit.errors import ConfigError
from idckit.text.vocab import SPECIALS, Vocab, tokenize


def test_tokenize_and_build_order():
    assert tokenize("The red Cube moved.") == ["the", "red", "cube", "moved", "."]
    v = Vocab.build(["the red cube", "the blue cube", "the sphere"], min_count=2)
    assert v.words[:8] == list(SPECIALS) and v.words[8:] == ["the", "cube"]
    assert (v.pad_id, v.bos_id, v.eos_id, v.mask_id) == (0, 1, 2, 4)


def test_encode_truncates_keeps_eos_and_decodes():
    v = Vocab.build(["a b c d e"])
    assert v.encode("a b zzz", 10) == [v.bos_id, v.ids["a"], v.ids["b"], v.unk_id, v.eos_id]
    assert v.encode("a b c d e", 5) == [v.bos_id, v.ids["a"], v.ids["b"], v.ids["c"], v.eos_id]
    batch = v.encode_batch(["a", "a b c"], 6)
    assert batch.tolist() == [[1, v.ids["a"], 2, 0, 0, 0], [1, v.ids["a"], v.ids["b"], v.ids["c"], 2, 0]]
    assert v.decode(batch[1].tolist()) == "a b c"
    assert v.decode([1, v.ids["a"], 2, v.ids["b"]]) == "a"


def test_save_load_round_trip_and_errors(tmp_path):
    v = Vocab.build(["the red cube changed to blue"])
    v.save(tmp_path / "vocab.json")
    assert Vocab.load(tmp_path / "vocab.json").words == v.words
    with pytest.raises(ConfigError, match="not found"):
        Vocab.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match="not a vocabulary file"):
        Vocab.load(tmp_path / "bad.json")
    (tmp_path / "nospecials.json").write_text('{"a": 0, "b": 1}')
    with pytest.raises(ConfigError, match="specials"):
        Vocab.load(tmp_path / "nospecials.json")
