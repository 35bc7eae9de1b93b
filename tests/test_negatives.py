"""FDA hard negatives (Retrieve / Replace / Confuse) on the caption shapes of the real CLEVR-Change and
Birds-to-Words releases."""
from __future__ import annotations

import json
import math
import random
from collections import Counter

import numpy as np
import pytest

from idckit.data.clevr_change import CHANGE_TYPES
from idckit.data.synth.vocab import COLORS, NO_CHANGE_SENTENCES
from idckit.errors import ConfigError, DatasetError
from idckit.text import negatives as N
from idckit.text.negatives import Confuse, NegativeSet, Replace, Retrieve, TfIdf, build_negatives, normalize
from idckit.text.pos import LexiconTagger
from numeric import assert_close


# ---------------------------------------------------------------------------------------------------------------
# Small realistic corpora
# ---------------------------------------------------------------------------------------------------------------
SHAPES = {"cube": ["cube", "block"], "sphere": ["sphere", "ball"], "cylinder": ["cylinder"]}
SIZES = {"large": ["large", "big"], "small": ["small", "tiny"]}
MATERIALS = {"metal": ["metallic", "metal", "shiny"], "rubber": ["rubber", "matte"]}
RELATIONS = ["left of", "to the left of", "on the left side of", "right of", "to the right of", "behind",
             "in front of"]
PREDICATES = {
    "add": ["has been added", "has been newly placed", "has appeared"],
    "drop": ["is missing", "is gone", "has disappeared", "is no longer there"],
    "move": ["changed its location", "is in a different location"],
}


def _object(rng):
    return {"size": rng.choice(list(SIZES)), "color": rng.choice(list(COLORS)),
            "material": rng.choice(list(MATERIALS)), "shape": rng.choice(list(SHAPES))}


def _np(rng, o, keep=0.7):
    words = ["the"]
    words += [rng.choice(SIZES[o["size"]])] if rng.random() < keep else []
    words += [o["color"]] if rng.random() < keep else []
    words += [rng.choice(MATERIALS[o["material"]])] if rng.random() < keep else []
    return " ".join(words + [rng.choice(SHAPES[o["shape"]])])


def clevr_corpus(n_images=60, seed=0):
    """CLEVR-Change-shaped references: per image one change pair (5 captions with the synonym variety and the
    relational templates) and one no-change pair (3 of the 9 no-change sentences)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n_images):
        ctype = rng.choice(list(CHANGE_TYPES))
        o, other = _object(rng), _object(rng)
        new_color = rng.choice([c for c in COLORS if c != o["color"]])
        caps = []
        for _ in range(5):
            r = rng.random()
            if r < 0.5:
                subject = _np(rng, o, 0.9)
            elif r < 0.85:
                subject = f"{_np(rng, o)} {'that is ' if rng.random() < 0.5 else ''}{rng.choice(RELATIONS)} " \
                          f"{_np(rng, other)}"
            else:
                subject = f"the other {_np(rng, o)[4:]} that is the same {rng.choice(['size', 'color', 'shape'])}" \
                          f" as {_np(rng, other)}"
            if ctype == "color":
                pred = f"{rng.choice(['changed to', 'turned', 'became'])} {new_color}"
            elif ctype == "material":
                mat = "rubber" if o["material"] == "metal" else "metal"
                pred = f"{rng.choice(['changed to', 'turned', 'became'])} {rng.choice(MATERIALS[mat])}"
            else:
                pred = rng.choice(PREDICATES[ctype])
            caps.append(f"{subject} {pred}")
        out[f"{i:06d}_sc"] = caps
        out[f"{i:06d}_nsc"] = rng.sample(NO_CHANGE_SENTENCES, 3)
    return out


PARTS = ["beak", "bill", "crown", "breast", "belly", "tail", "head", "throat", "back", "neck", "cheek", "wings",
         "legs", "feathers"]
BIRD_COLORS = ["white", "black", "brown", "gray", "yellow", "red", "orange", "olive"]
COMPARATIVES = ["longer", "shorter", "thicker", "thinner", "darker", "lighter"]


def birds_corpus(n_pairs=50, seed=0):
    """Birds-to-Words-shaped descriptions: lower-cased, tokenised, multi-sentence, animal1/animal2."""
    rng = random.Random(seed)

    def sentence():
        a, b = rng.sample(["animal1", "animal2"], 2)
        part, part2 = rng.sample(PARTS, 2)
        c1, c2 = rng.sample(BIRD_COLORS, 2)
        verb = "have" if part.endswith("s") else "has"
        return rng.choice([
            f"{a} has a {rng.choice(COMPARATIVES)} {part} than {b} .",
            f"{a} has a {c1} {part} while {b} has a {c2} {part} .",
            f"{a} ' s {part} is {c1} .",
            f"the {part} of {a} is {rng.choice(COMPARATIVES)} .",
            f"{a} is {rng.choice(['larger', 'smaller', 'bigger'])} than {b} .",
            f"{a} has {c1} streaks on its {part2} .",
            f"{a} ' s {part} {'are' if verb == 'have' else 'is'} {c1} and {b} ' s {part2} is {c2} .",
        ])

    return {f"bird{i:04d}": [" ".join(sentence() for _ in range(rng.randint(2, 4))) for _ in range(4)]
            for i in range(n_pairs)}


@pytest.fixture(scope="module")
def clevr():
    return clevr_corpus()


@pytest.fixture(scope="module")
def clevr_negs(clevr):
    return build_negatives(clevr, tagger="lexicon", seed=0, progress=False)


@pytest.fixture(scope="module")
def birds():
    return birds_corpus()


@pytest.fixture(scope="module")
def birds_negs(birds):
    return build_negatives(birds, tagger="lexicon", seed=0, progress=False)


def _assert_valid(captions, ns, total=6):
    for pid, refs in captions.items():
        negs = ns.negatives[pid]
        assert len(negs) == total, pid
        assert len({n.lower() for n in negs}) == total, negs            # distinct
        ref_keys = {normalize(r).lower() for r in refs}
        assert not ref_keys & {normalize(n).lower() for n in negs}, (pid, negs)
        assert all(n == normalize(n) and n for n in negs)
        assert len(ns.sources[pid]) == total


# ---------------------------------------------------------------------------------------------------------------
# The whole builder
# ---------------------------------------------------------------------------------------------------------------
def test_six_negatives_per_pair_never_a_reference(clevr, clevr_negs, birds, birds_negs):
    _assert_valid(clevr, clevr_negs)
    _assert_valid(birds, birds_negs)
    stats = clevr_negs.stats
    assert stats["pairs"] == len(clevr)
    assert sum(stats["per_strategy"].values()) == 6 * len(clevr)
    # Every missing slot was filled by someone: fallbacks and fills balance.
    assert sum(stats["fallbacks"].values()) == sum(stats["filled_by"].values())
    # Birds-to-Words descriptions always mention a referent, so Confuse never needs a fallback there.
    assert birds_negs.stats["fallbacks"]["confuse"] == 0
    assert birds_negs.stats["confuse_rules"] == {"referent_swap": 2 * len(birds)}


def test_no_change_pairs_never_get_a_no_change_sentence(clevr, clevr_negs):
    pool = {s.lower() for s in NO_CHANGE_SENTENCES}
    nsc = [pid for pid in clevr if pid.endswith("_nsc")]
    assert nsc
    for pid in nsc:
        assert not pool & {n.lower() for n in clevr_negs.negatives[pid]}, clevr_negs.negatives[pid]
    # No subject to exchange in a no-change sentence: its confuse quota is filled and counted.
    assert clevr_negs.stats["fallbacks"]["confuse"] >= 2 * len(nsc)


def test_paraphrase_class_covers_no_change_pairs_that_share_no_sentence():
    """The conftest fixture's shape: every no-change pair has its own sentences, so only the paraphrase class
    (not the one-hop rule) can know they are interchangeable."""
    caps = {"a_sc": ["the small yellow rubber cylinder changed to brown", "the tiny yellow cylinder turned brown"],
            "b_sc": ["the large red metal cube has been added", "the big red thing has been newly placed"],
            "c_sc": ["the small gray rubber sphere is missing", "the tiny gray ball is gone"],
            "a_nsc": ["no change was made", "the two scenes seem identical"],
            "b_nsc": ["there is no change"],
            "c_nsc": ["nothing has changed"],
            "d_nsc": ["there is no difference", "nothing was modified"]}
    pool = {s.lower() for s in NO_CHANGE_SENTENCES}
    ns = build_negatives(caps, tagger="lexicon", ratio=(6, 0, 0), min_df=1, progress=False)
    for pid in ("a_nsc", "b_nsc", "c_nsc", "d_nsc"):
        assert not pool & set(ns.negatives[pid])
    # Without the class, Retrieve offers another no-change sentence: the rule is what prevents it.
    unsafe = build_negatives(caps, tagger="lexicon", ratio=(6, 0, 0), min_df=1, paraphrase_classes=(),
                             progress=False)
    assert any(pool & set(unsafe.negatives[pid]) for pid in ("a_nsc", "b_nsc", "c_nsc", "d_nsc"))


def test_one_hop_rule_forbids_references_of_pairs_sharing_a_reference():
    caps = {"p": ["the red cube turned blue", "the red block became blue"],
            "q": ["the red block became blue", "the red cube changed to blue"],
            "r": ["the red sphere turned blue"], "s": ["the small green cylinder is gone"],
            "t": ["the large cyan ball has appeared"], "u": ["the red cube is missing"],
            "v": ["the tiny red cube has been added"]}
    ns = build_negatives(caps, tagger="lexicon", ratio=(5, 0, 0), min_df=1, progress=False)
    # q shares "the red block became blue" with p, so q's other reference is a paraphrase for p.
    assert "the red cube changed to blue" not in ns.negatives["p"]
    assert "the red cube turned blue" not in ns.negatives["q"]
    assert ns.negatives["p"][0] == "the red sphere turned blue"


def test_cub_ratio_without_confuse(clevr):
    ns = build_negatives(clevr, tagger="lexicon", ratio=(3, 3, 0), progress=False)
    _assert_valid(clevr, ns)
    assert ns.stats["per_strategy"]["confuse"] == 0
    assert all(s in ("retrieve", "replace") for src in ns.sources.values() for s in src)


def test_bad_arguments_fail_before_any_work():
    with pytest.raises(ConfigError):
        build_negatives({"a": ["x"]}, ratio=(0, 0, 0))
    with pytest.raises(ConfigError):
        build_negatives({"a": ["x"]}, ratio=(2, 2))
    with pytest.raises(ConfigError):
        build_negatives({"a": ["x"]}, negatives_for=["zzz"], tagger="lexicon")
    with pytest.raises(DatasetError):
        build_negatives({"a": "a caption, not a list"}, tagger="lexicon")


# ---------------------------------------------------------------------------------------------------------------
# Retrieve
# ---------------------------------------------------------------------------------------------------------------
def test_tfidf_matches_hand_computation():
    docs = ["the red cube", "the blue cube", "the red ball ."]
    tf = TfIdf(docs)
    assert tf.words == ["ball", "blue", "cube", "red", "the"]  # punctuation is not a term
    assert tf.weight("the") == pytest.approx(math.log(4 / 4) + 1)
    assert tf.weight("red") == pytest.approx(math.log(4 / 3) + 1)
    assert tf.weight("ball") == pytest.approx(math.log(4 / 2) + 1)
    assert tf.weight("unseen") == pytest.approx(math.log(4) + 1)
    idx, val = tf.sparse("the red red cube")
    raw = np.array([math.log(4 / 3) + 1, 2 * (math.log(4 / 3) + 1), 1.0])  # cube, red x2, the
    assert_close(val, raw / np.linalg.norm(raw), rtol=1e-6, check_dtype=False)   # float32 scores, float64 sum
    assert list(idx) == [2, 3, 4]


def test_retrieve_returns_the_most_similar_caption_of_another_pair():
    caps = {"a": ["the small red cube turned blue"],
            "b": ["the small red cube turned green"],           # shares 5 of 6 words with a
            "c": ["the large gray sphere has appeared"],
            "d": ["there is no change"],
            "e": ["the small red cube turned blue"],            # a's own reference: must be skipped
            "f": ["the small cyan cylinder is gone"],
            "g": ["the tiny red block turned blue"]}            # a's reference up to CLEVR synonyms
    tf = TfIdf([c for v in caps.values() for c in v])
    pool = sorted({c for v in caps.values() for c in v})
    r = Retrieve(tf, pool)
    ranking = r.rank([caps["a"]], [[]], None)[0]
    assert pool[ranking[0]] == "the small red cube turned blue"     # itself first when not forbidden
    assert pool[ranking[1]] == "the small red cube turned green"
    # The cosine agrees with a direct numpy computation.
    scores = r.scores(r.query(caps["a"])[None])[0].numpy()
    qa, qb = np.zeros(len(tf.words)), np.zeros(len(tf.words))
    for vec, text in ((qa, caps["a"][0]), (qb, caps["b"][0])):
        idx, val = tf.sparse(text)
        vec[idx] = val
    assert_close(scores[pool.index(caps["b"][0])], float(qa @ qb), rtol=1e-5)
    ns = build_negatives(caps, tagger="lexicon", ratio=(2, 0, 0), min_df=1, progress=False)
    assert ns.negatives["a"][0] == "the small red cube turned green"
    assert "the small red cube turned blue" not in ns.negatives["a"] + ns.negatives["e"]
    # Synonym folding: a synonym variant of a reference is a true caption, never a negative.
    assert "the tiny red block turned blue" not in ns.negatives["a"]
    assert "the small red cube turned blue" not in ns.negatives["g"]
    assert ns.negatives["g"][0] == "the small red cube turned green"


# ---------------------------------------------------------------------------------------------------------------
# Replace
# ---------------------------------------------------------------------------------------------------------------
def test_replace_changes_only_top_half_nouns_adjectives_to_same_tag_frequent_words(clevr):
    train = [c for v in clevr.values() for c in v]
    tagger = LexiconTagger(train)
    tf = TfIdf(train)
    rep = Replace(tf, lambda c: tagger.tag(c.split()), train, min_df=10,
                  synonyms=N.DEFAULT_SYNONYMS, exclude=N.DEFAULT_GENERIC_WORDS)
    assert set(rep.vocabularies) <= N.REPLACE_TAGS
    for tag, words in rep.vocabularies.items():
        assert all(tf.df[w] >= 10 for w in words), tag
    canon = {w: g[0] for g in N.DEFAULT_SYNONYMS for w in g}
    rng = np.random.default_rng(0)
    checked = 0
    for caption in sorted(set(train))[:200]:
        tokens, tags = caption.split(), tagger.tag(caption.split())
        cands = [i for i, (w, t) in enumerate(zip(tokens, tags))
                 if t in N.REPLACE_TAGS and w not in N.DEFAULT_GENERIC_WORDS]
        out = rep.replace(caption, rng)
        if not cands:
            assert out is None
            continue
        # top 50 % (rounded down, at least one) by count x idf, computed here independently
        counts = Counter(tokens)
        score = {i: counts[tokens[i]] * tf.weight(tokens[i]) for i in cands}
        k = max(1, len(cands) // 2)
        expected = sorted(sorted(cands, key=lambda i: (-score[i], i))[:k])
        new = out[0].split()
        assert len(new) == len(tokens)
        changed = [i for i, (a, b) in enumerate(zip(tokens, new)) if a != b]
        assert set(changed) <= set(expected) and out[1] == len(expected) == len(changed)
        for i in changed:
            assert tags[i] in N.REPLACE_TAGS
            assert new[i] in rep.vocabularies[tags[i]]              # same tag, df >= 10
            assert canon.get(new[i], new[i]) != canon.get(tokens[i], tokens[i])  # not a synonym
        checked += 1
    assert checked > 100


def test_replace_statistics_are_the_measured_replacements(clevr, clevr_negs):
    """stats['replace'] (the Table 7 analogue) equals what the emitted replace negatives actually changed."""
    changed, lengths = [], []
    for pid, negs in clevr_negs.negatives.items():
        for neg, src in zip(negs, clevr_negs.sources[pid]):
            if src != "replace":
                continue
            # the source reference is the one of equal length that differs in the fewest tokens
            cands = [r for r in clevr[pid] if len(r.split()) == len(neg.split())]
            diffs = [sum(a != b for a, b in zip(r.split(), neg.split())) for r in cands]
            changed.append(min(diffs))
            lengths.append(len(cands[diffs.index(min(diffs))].split()))
    st = clevr_negs.stats["replace"]
    assert st["negatives"] == len(changed)
    # a random replacement can coincide with the original word's neighbour; allow that slack in the matching
    assert st["avg_replaced_words"] == pytest.approx(np.mean(changed), abs=0.05)
    assert st["avg_length"] == pytest.approx(np.mean(lengths), abs=0.05)
    print("Table 7 analogue on the test CLEVR corpus:", st)


# ---------------------------------------------------------------------------------------------------------------
# Confuse
# ---------------------------------------------------------------------------------------------------------------
def _confuse():
    tagger = LexiconTagger()
    return Confuse(lambda c: tagger.tag(c.split()), referents=N.DEFAULT_REFERENTS, synonyms=N.DEFAULT_SYNONYMS)


def test_confuse_swaps_subject_and_object():
    c = _confuse()
    assert c.in_sentence("animal1 has a longer beak than animal2") == \
        ("animal2 has a longer beak than animal1", "referent_swap")
    assert c.in_sentence("animal1 is larger than animal2 . animal1 ' s legs appear to be longer .")[0] == \
        "animal2 is larger than animal1 . animal2 ' s legs appear to be longer ."
    assert c.in_sentence("the small red cube that is left of the big ball turned blue") == \
        ("the big ball that is left of the small red cube turned blue", "np_swap")
    assert c.in_sentence("the tiny yellow rubber cylinder that is behind the rubber block became brown")[0] == \
        "the rubber block that is behind the tiny yellow rubber cylinder became brown"
    assert c.in_sentence("the other large cylinder that is the same color as the large matte cylinder turned "
                         "rubber")[0] == \
        "the large matte cylinder that is the same color as the other large cylinder turned rubber"
    # No relational referent, no referent token: nothing to swap in the sentence.
    assert c.in_sentence("the small red cube has been added") is None
    assert c.in_sentence("there is no change") is None


def test_confuse_subject_exchange_between_captions():
    c = _confuse()
    assert c.exchange("the small red cube has been added", "the small red ball changed to blue") == \
        "the small red ball has been added"
    # A vaguer or a more specific subject could name the same object: refused.
    assert c.exchange("the small red cube has been added", "the red cube is gone") is None
    assert c.exchange("the small red cube has been added", "the tiny red block that is left of the ball "
                                                           "is gone") is None
    assert c.exchange("the small red cube has been added", "the tiny red block is gone") is None  # synonyms
    assert c.exchange("the small red cube has been added", "the large cyan sphere is gone") is None  # no overlap
    assert c.exchange("there is no change", "the small red ball is gone") is None


# ---------------------------------------------------------------------------------------------------------------
# Determinism, cache, file format
# ---------------------------------------------------------------------------------------------------------------
def test_deterministic_regardless_of_dict_order(clevr, clevr_negs):
    shuffled = dict(reversed(list(clevr.items())))
    shuffled = {pid: list(reversed(refs)) for pid, refs in shuffled.items()}
    again = build_negatives(shuffled, tagger="lexicon", seed=0, progress=False)
    assert again.negatives == clevr_negs.negatives
    other_seed = build_negatives(clevr, tagger="lexicon", seed=1, progress=False)
    assert other_seed.negatives != clevr_negs.negatives


def test_cache_hit_does_not_recompute(tmp_path, birds, monkeypatch):
    calls = []
    build = N._Builder.build
    monkeypatch.setattr(N._Builder, "build", lambda self: calls.append(1) or build(self))
    before = 0
    first = build_negatives(birds, tagger="lexicon", cache_dir=tmp_path, progress=False)
    assert len(calls) == before + 1 and first.stats["cache"] == "miss"
    (cache_file,) = tmp_path.glob("fda_negatives_*.json")
    mtime = cache_file.stat().st_mtime_ns
    second = build_negatives(birds, tagger="lexicon", cache_dir=tmp_path, progress=False)
    assert len(calls) == before + 1 and second.stats["cache"] == "hit"
    assert cache_file.stat().st_mtime_ns == mtime
    assert second.negatives == first.negatives and second.tagger == "lexicon"
    assert second.references == first.references
    # Any input that matters makes a new entry.
    build_negatives(birds, tagger="lexicon", cache_dir=tmp_path, seed=1, progress=False)
    build_negatives(birds, tagger="lexicon", cache_dir=tmp_path, ratio=(3, 3, 0), progress=False)
    assert len(calls) == before + 3 and len(list(tmp_path.glob("fda_negatives_*.json"))) == 3


def test_tagger_name_is_recorded(tmp_path, monkeypatch, birds):
    monkeypatch.setenv("STANZA_RESOURCES_DIR", str(tmp_path / "no_models"))
    ns = build_negatives(birds, tagger="auto", progress=False)
    assert ns.tagger == "lexicon" and ns.stats["tagger"] == "lexicon"


def test_jsonl_roundtrip_in_the_public_format(tmp_path, clevr, clevr_negs):
    info = {pid: {"img1": f"CLEVR_default_{pid[:6]}.png",
                  "img2": f"CLEVR_{'nonsemantic' if pid.endswith('nsc') else 'semantic'}_{pid[:6]}.png"}
            for pid in clevr}
    path = clevr_negs.to_jsonl(tmp_path / "train_neg_tfidf6.json", info)
    lines = path.read_text().splitlines()
    assert len(lines) == len(clevr)
    rec = json.loads(lines[0])
    assert set(rec) == {"img1", "img2", "sentences", "neg_samples"} and len(rec["neg_samples"]) == 6
    back = NegativeSet.from_jsonl(path)
    for pid in clevr:
        key = f"{info[pid]['img1']}|{info[pid]['img2']}"
        assert back.negatives[key] == clevr_negs.negatives[pid]
        assert back.references[key] == clevr[pid]
    with pytest.raises(DatasetError):
        clevr_negs.to_jsonl(tmp_path / "x.json", {})
    assert not (tmp_path / "x.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"img1": "a", "img2": "b", "sentences": [], "neg_samples": ["x", "y"]}\n'
                   '{"img1": "c", "img2": "d", "sentences": [], "neg_samples": ["x"]}\n')
    with pytest.raises(DatasetError, match="line 2"):
        NegativeSet.from_jsonl(bad)


def test_negatives_for_uses_the_training_vocabulary(clevr):
    """Building val negatives: the pool is the val captions, the vocabularies come from training."""
    train = {k: v for k, v in clevr.items() if int(k[:6]) < 40}
    val = {k: v for k, v in clevr.items() if int(k[:6]) >= 40}
    ns = build_negatives(val, vocab_captions=train, tagger="lexicon", progress=False,
                         negatives_for=sorted(val)[:6])
    assert sorted(ns.negatives) == sorted(val)[:6]
    _assert_valid({k: val[k] for k in sorted(val)[:6]}, ns)
    retrieved = {n for pid in ns.negatives for n, s in zip(ns.negatives[pid], ns.sources[pid]) if s == "retrieve"}
    val_captions = {c for v in val.values() for c in v}
    assert retrieved <= val_captions
