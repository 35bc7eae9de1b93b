"""Caption evaluator: equality with pycocoevalcap called directly, RCC per-subset protocol, RCC files, CLI.

Two METEOR JVMs for the whole file (ours, reused, and an independent pycocoevalcap ``Meteor()`` as the
reference), both started at module set-up so they load their paraphrase tables in parallel.
"""
from __future__ import annotations

import faulthandler
import json
import math

import pytest

from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR
from idckit.errors import MissingDependencyError, ResultsError
from idckit.eval import captions as C
from numeric import assert_close, assert_differ

# References: CLEVR-Change's file schemas (RCC's change_captions.json / no_change_captions.json; ids 0-2) plus
# more ids so most subsets have >= 3 pairs with differing n-grams; "material" and "move" keep ONE pair each to
# check the singleton CIDEr-D rule. Two references carry case and punctuation so that tokenising the references
# matters too.
REFS = {
    "000000.png": ["the small yellow rubber cylinder changed to brown", "The tiny yellow cylinder turned brown."],
    "000001.png": ["the large red metal cube has been added", "the big red thing has been newly placed"],
    "000002.png": ["the small gray rubber sphere is missing", "the tiny gray ball is gone"],
    "000003.png": ["the large blue metal cube became green", "the big blue block turned green"],
    "000004.png": ["the small cyan ball changed its location", "the tiny cyan sphere is in a different location"],
    "000005.png": ["the large purple rubber cylinder turned metallic", "the big purple cylinder became shiny"],
    "000006.png": ["the big green rubber sphere turned red", "the large green ball changed to red"],
    "000007.png": ["the small brown metal cylinder has appeared", "the tiny brown cylinder has been added"],
    "000008.png": ["The large cyan rubber cube is gone!", "the big cyan block has disappeared"],
    "000009.png": ["the tiny purple ball has been newly placed", "the small purple sphere has appeared"],
    "000010.png": ["the big yellow metal cylinder is no longer there", "the large yellow cylinder is missing"],
    "000000.png_n": ["no change was made", "the two scenes seem identical"],
    "000001.png_n": ["there is no change"],
    "000002.png_n": ["nothing has changed"],
    "000003.png_n": ["there is no difference", "nothing was modified"],
    "000004.png_n": ["the scene remains the same"],
}
TYPES = {"000000.png": "color", "000003.png": "color", "000006.png": "color", "000005.png": "material",
         "000001.png": "add", "000007.png": "add", "000009.png": "add", "000002.png": "drop",
         "000008.png": "drop", "000010.png": "drop", "000004.png": "move",
         **{k: "distractor" for k in REFS if k.endswith("_n")}}
# Case and punctuation on purpose (the PTB tokenizer lower-cases and drops them; tokenize=False does not).
CANDS = {
    "000000.png": "The small yellow cylinder turned brown.",
    "000001.png": "the large red cube has been added",
    "000002.png": "the gray ball is gone",
    "000003.png": "the big blue cube changed to green",
    "000004.png": "the small cyan sphere changed its location",
    "000005.png": "the purple cylinder turned shiny",
    "000006.png": "the green sphere became red",
    "000007.png": "a tiny brown cylinder has appeared.",
    "000008.png": "the large cyan block is missing",
    "000009.png": "the small purple ball has been added",
    "000010.png": "The yellow cylinder is gone!",
    "000000.png_n": "no change was made",
    "000001.png_n": "There is no change.",
    "000002.png_n": "nothing has changed",
    "000003.png_n": "the scene is the same as before",
    "000004.png_n": "there is no difference",
}
SUBSETS = {"total": sorted(CANDS), "semantic": sorted(k for k in CANDS if not k.endswith("_n")),
           **{t: sorted(k for k in CANDS if TYPES[k] == t)
              for t in (*CHANGE_TYPES, DISTRACTOR)}}


@pytest.fixture(autouse=True)
def _never_hang():
    # A desynchronised METEOR pipe blocks forever in readline; fail loudly instead.
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def java_pair():
    """(our reused CaptionScorer, an independent pycocoevalcap Meteor) started together."""
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = C.CaptionScorer()
    ref = Meteor()
    yield scorer, ref
    scorer.close()
    ref.__del__()


def direct(refs, cands, ids, *, tokenize=True, meteor=None) -> dict[str, float]:
    """pycocoevalcap's scorers called by hand, COCOEvalCap-style, on ``ids`` alone."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    gts = {k: [{"caption": r} for r in refs[k]] for k in ids}
    res = {k: [{"caption": cands[k]}] for k in ids}
    if tokenize:
        gts, res = PTBTokenizer().tokenize(gts), PTBTokenizer().tokenize(res)
    else:
        gts = {k: [d["caption"] for d in v] for k, v in gts.items()}
        res = {k: [d["caption"] for d in v] for k, v in res.items()}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    out = {f"Bleu_{i + 1}": b for i, b in enumerate(bleu)}
    if meteor is not None:
        out["METEOR"] = meteor.compute_score(gts, res)[0]
    out["ROUGE_L"] = Rouge().compute_score(gts, res)[0]
    out["CIDEr-D"] = Cider().compute_score(gts, res)[0]
    return out


def assert_same(got: dict, want: dict):
    assert list(got) == [m for m in C.METRICS if m in want]
    for m, v in want.items():
        # scores are shares (CIDEr-D up to 10), so 1 is their scale; METEOR's Java prints 6 digits or so
        assert_close(got[m], v, rtol=1e-6 if m == "METEOR" else 1e-9, scale=1.0, what=m)


# -- equality with pycocoevalcap ---------------------------------------------------------------------------
@pytest.mark.java
def test_score_equals_pycocoevalcap_tokenized(java_pair):
    scorer, ref_meteor = java_pair
    got = C.score(REFS, CANDS, scorer=scorer)
    assert_same(got, direct(REFS, CANDS, sorted(CANDS), meteor=ref_meteor))
    assert list(got) == list(C.METRICS)
    assert 0 < got["Bleu_4"] < got["Bleu_1"] < 1 and got["CIDEr-D"] > 1  # a real, non-degenerate corpus


@pytest.mark.java
def test_untokenized_equals_pycocoevalcap_and_differs_from_tokenized(java_pair):
    scorer, ref_meteor = java_pair
    raw = scorer.score(REFS, CANDS, tokenize=False)
    assert_same(raw, direct(REFS, CANDS, sorted(CANDS), tokenize=False, meteor=ref_meteor))
    tok = scorer.score(REFS, CANDS, tokenize=True)
    # "Brown." / "The" / "!" are different tokens untokenised: fewer n-gram matches.
    for m in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr-D"):
        assert raw[m] < tok[m] - 1e-3, m


@pytest.mark.java
def test_breakdown_scores_each_subset_as_its_own_corpus(java_pair):
    scorer, ref_meteor = java_pair
    pid = scorer._meteor.meteor_p.pid
    got = C.evaluate_pairs(REFS, CANDS, TYPES, scorer=scorer)
    assert list(got) == ["total", "semantic", "color", "material", "add", "drop", "move", "distractor"]
    for name, ids in SUBSETS.items():
        assert_same(got[name], direct(REFS, CANDS, ids, meteor=ref_meteor))
    # one-pair subsets: CIDEr-D is 0 by definition (IDF log(1) - log(1) = 0), the others are not
    assert got["material"]["CIDEr-D"] == 0.0 and got["move"]["CIDEr-D"] == 0.0
    assert all(got[s]["CIDEr-D"] > 0.5 for s in ("total", "semantic", "color", "add", "drop", "distractor"))
    # the IDF really is recomputed: the semantic subset is not the mean of its total-corpus per-image scores
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    gts = PTBTokenizer().tokenize({k: [{"caption": r} for r in REFS[k]] for k in CANDS})
    res = PTBTokenizer().tokenize({k: [{"caption": CANDS[k]}] for k in CANDS})
    _, per_image = Cider().compute_score(gts, res)
    in_total = dict(zip(gts.keys(), per_image))
    assert_differ(got["semantic"]["CIDEr-D"], sum(in_total[k] for k in SUBSETS["semantic"]) / 11, rtol=1e-3,
                  scale=1.0)
    # one METEOR process served every call
    assert scorer._meteor.meteor_p.pid == pid and scorer._meteor.meteor_p.poll() is None


@pytest.mark.java
def test_empty_and_unicode_candidates(java_pair):
    scorer, ref_meteor = java_pair
    refs = {"a": ["the caf\u00e9 is gone", "the na\u00efve cube is missing"], "b": ["no change was made"],
            "c": ["the small cube turned red"], "d": ["the big ball turned blue"]}
    cands = {"a": "the caf\u00e9 \U0001F600 is gone", "b": "", "c": "the small cube turned red", "d": "!!"}
    assert scorer.tokenize({"x": ["Caf\u00e9 \U0001F600 IS gone."]}) == {"x": ["caf\u00e9 is gone"]}
    # a lone surrogate (a JSON "\\ud800" escape) would crash pycocoevalcap's UTF-8 encode; here it becomes "?"
    assert scorer.tokenize({"x": ["a \ud800 b"]}) == {"x": ["a b"]}
    got = scorer.score(refs, cands)
    assert all(math.isfinite(v) for v in got.values())
    assert_same(got, direct(refs, cands, sorted(cands), meteor=ref_meteor))
    # the empty candidate alone scores zero everywhere instead of crashing
    zero = scorer.score(refs, {"b": ""})
    assert zero["METEOR"] == 0.0 and zero["ROUGE_L"] == 0.0
    assert_close(zero["Bleu_1"], 0.0, rtol=1e-6, scale=1.0)       # ~0: BLEU's smoothing leaves a trace
    raw = scorer.score(refs, cands, tokenize=False)
    assert_same(raw, direct(refs, cands, sorted(cands), tokenize=False, meteor=ref_meteor))


@pytest.mark.java
def test_line_breaks_inside_captions_do_not_shift_ids_or_hang(java_pair):
    scorer, _ = java_pair
    # the Java tokenizer ends a line at \r and U+2028, which pycocoevalcap does not replace
    weird = {"a": "the small\rcube turned red", "b": "the big\u2028ball turned blue", "c": "no\nchange"}
    clean = {"a": "the small cube turned red", "b": "the big ball turned blue", "c": "no change"}
    refs = {"a": ["the small cube turned red"], "b": ["the big ball turned blue|||x"], "c": ["no change\u0085was made"]}
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    unpatched = PTBTokenizer().tokenize({k: [{"caption": v}] for k, v in weird.items()})
    assert unpatched["b"] == ["cube turned red"]  # the shift this module prevents
    assert scorer.tokenize({k: [v] for k, v in weird.items()}) == {k: [v] for k, v in clean.items()}
    assert scorer.score(refs, weird) == scorer.score(refs, clean)
    assert scorer.score(refs, weird, tokenize=False) == scorer.score(refs, clean, tokenize=False)
    # "|||" (METEOR's field separator) is dropped from references as pycocoevalcap drops it from hypotheses
    joined = {**refs, "b": ["the big ball turned bluex"], "c": ["no change was made"]}
    assert scorer.score(refs, clean, tokenize=False)["METEOR"] == scorer.score(joined, clean, tokenize=False)["METEOR"]


@pytest.mark.java
def test_scorer_close_stops_meteor_and_is_idempotent():
    with C.CaptionScorer(meteor=True) as s:
        proc = s._meteor.meteor_p
        assert proc.poll() is None
    assert proc.poll() is not None and not s.has_meteor
    s.close()
    with pytest.raises(ValueError, match="meteor=False"):
        s.score(REFS, CANDS, tokenize=False, meteor=True)


# -- no Java ---------------------------------------------------------------------------------------------
def test_without_java(monkeypatch):
    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    for kwargs in ({"tokenize": True, "meteor": False}, {"tokenize": False, "meteor": True}):
        with pytest.raises(MissingDependencyError, match="apt-get install -y default-jre-headless"):
            C.score(REFS, CANDS, **kwargs)
    with pytest.raises(MissingDependencyError, match="java"):
        C.CaptionScorer()
    got = C.score(REFS, CANDS, tokenize=False, meteor=False)
    assert "METEOR" not in got
    assert_same(got, direct(REFS, CANDS, sorted(CANDS), tokenize=False))
    by_subset = C.evaluate_pairs(REFS, CANDS, TYPES, tokenize=False, meteor=False)
    assert_same(by_subset["drop"], direct(REFS, CANDS, SUBSETS["drop"], tokenize=False))


# -- input errors ----------------------------------------------------------------------------------------
def test_score_input_errors_name_the_id():
    with pytest.raises(ResultsError, match="'999999.png'.*no reference"):
        C.score(REFS, {**CANDS, "999999.png": "a cube"}, tokenize=False, meteor=False)
    with pytest.raises(ResultsError, match="'000000.png' is list"):
        C.score(REFS, {"000000.png": ["two", "captions"]}, tokenize=False, meteor=False)
    with pytest.raises(ResultsError, match="no candidate"):
        C.score(REFS, {}, tokenize=False, meteor=False)
    with pytest.raises(ResultsError, match=r"no change type, e.g. \['000000\.png'\]"):
        C.evaluate_pairs(REFS, {"000000.png": "x"}, {}, tokenize=False, meteor=False)


# -- RCC result files ------------------------------------------------------------------------------------
def test_results_round_trip(tmp_path):
    C.write_results(tmp_path / "run", CANDS)
    sc = json.loads((tmp_path / "run" / "sc_results.json").read_text())
    nsc = json.loads((tmp_path / "run" / "nsc_results.json").read_text())
    total = json.loads((tmp_path / "run" / "total_results.json").read_text())
    assert [r["image_id"] for r in sc] == sorted(k for k in CANDS if not k.endswith("_n"))
    assert [r["image_id"] for r in nsc] == sorted(k for k in CANDS if k.endswith("_n"))
    assert [r["image_id"] for r in total] == sorted(CANDS)
    assert set(sc[0]) == {"image_id", "caption"}
    assert C.load_results(tmp_path / "run") == CANDS
    assert C.load_results(tmp_path / "run" / "total_results.json") == CANDS
    unicode = {"000000.png": "caf\u00e9 \U0001F600", "000000.png_n": ""}
    C.write_results(tmp_path / "u", unicode)
    assert C.load_results(tmp_path / "u") == unicode
    assert sorted(p.name for p in (tmp_path / "u").iterdir()) == ["nsc_results.json", "sc_results.json",
                                                                   "total_results.json"]  # no temp files left


@pytest.mark.parametrize("content, match", [
    ("not json", "not valid JSON"),
    ('{"image_id": "000000.png"}', "must hold a JSON list"),
    ('[{"image_id": "000000.png"}]', "entry 0 must be an object with keys image_id and caption"),
    ('[{"caption": "x"}]', "entry 0 must be an object"),
    ('[{"image_id": 0, "caption": "x"}]', "image_id must be a string"),
    ('[{"image_id": "000000.png", "caption": null}]', "'000000.png'.*caption must be a string"),
    ('[{"image_id": "000000.png", "caption": "a"}, {"image_id": "000000.png", "caption": "b"}]',
     "duplicate image_id '000000.png'"),
])
def test_bad_result_files(tmp_path, content, match):
    path = tmp_path / "res.json"
    path.write_text(content)
    with pytest.raises(ResultsError, match=match) as e:
        C.load_results(path)
    assert str(path) in str(e.value) and "fix:" in str(e.value)


def test_bad_result_directories(tmp_path):
    with pytest.raises(ResultsError, match="does not exist") as e:
        C.load_results(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)
    d = tmp_path / "run"
    d.mkdir()
    (d / "sc_results.json").write_text('[{"image_id": "000000.png", "caption": "a"}]')
    with pytest.raises(ResultsError, match="not found") as e:
        C.load_results(d)
    assert str(d / "nsc_results.json") in str(e.value)
    (d / "nsc_results.json").write_text('[{"image_id": "000000.png", "caption": "b"}]')
    with pytest.raises(ResultsError, match="wrong file") as e:
        C.load_results(d)
    assert str(d / "nsc_results.json") in str(e.value)
    (d / "nsc_results.json").write_text('[{"image_id": "000000.png_n", "caption": "b"}]')
    assert C.load_results(d) == {"000000.png": "a", "000000.png_n": "b"}
    with pytest.raises(ResultsError, match="must be strings"):
        C.write_results(tmp_path / "w", {"000000.png": 3})
    assert not (tmp_path / "w").exists()


# -- dataset + CLI ---------------------------------------------------------------------------------------
def _tiny_predictions():
    # conftest's tiny CLEVR-Change: test split = indices 2 (drop) and 5 (material) -> 4 pairs
    return {"000002.png": "the tiny gray ball is missing", "000002.png_n": "there is no change",
            "000005.png": "the purple cylinder turned metallic", "000005.png_n": "no change was made"}


def test_evaluate_results_coverage_errors(tmp_path, tiny_clevr):
    root = tiny_clevr
    preds = _tiny_predictions()
    C.write_results(tmp_path / "extra", {**preds, "000000.png": "x"})
    with pytest.raises(ResultsError, match=r"not pairs of the 'test' split.*000000\.png") as e:
        C.evaluate_results(tmp_path / "extra", root, tokenize=False, meteor=False)
    assert str(tmp_path / "extra") in str(e.value)
    partial = dict(preds)
    del partial["000005.png_n"]
    C.write_results(tmp_path / "partial", partial)
    with pytest.raises(ResultsError, match=r"1 of the 4 pairs .* no result, e\.g\. \['000005\.png_n'\]") as e:
        C.evaluate_results(tmp_path / "partial", root, tokenize=False, meteor=False)
    assert str(tmp_path / "partial") in str(e.value)


@pytest.mark.java
def test_cli_evaluate_prints_table_and_writes_json(tmp_path, tiny_clevr, capsys, java_pair):
    from idckit.cli import main
    from idckit.data.clevr_change import ClevrChange

    scorer, ref_meteor = java_pair
    root = tiny_clevr
    C.write_results(tmp_path / "run", _tiny_predictions())
    out = tmp_path / "metrics" / "test.json"
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(root), "--json", str(out), "--no-meteor"]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    ds = ClevrChange(root)
    refs, types = ds.references("test"), ds.types("test")
    preds = _tiny_predictions()
    assert list(saved) == ["total", "semantic", "material", "drop", "distractor"]
    for name in saved:
        ids = sorted(k for k in preds if name == "total" or types[k] == name
                     or (name == "semantic" and types[k] != "distractor"))
        assert_same(saved[name], direct(refs, preds, ids))
    # the printed table: x100, one row per subset with its pair count
    lines = printed.splitlines()
    assert "x100" in lines[0] and "wrote" in lines[-1]
    assert "material, drop hold one pair; CIDEr-D of a one-pair corpus is 0" in printed
    header = lines[1].split()
    assert header == ["n", "Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr-D"]
    total_row = next(line.split() for line in lines if line.startswith("total"))
    assert total_row[1] == "4"
    assert total_row[2] == f"{100 * saved['total']['Bleu_1']:.2f}"
    assert total_row[-1] == f"{100 * saved['total']['CIDEr-D']:.2f}"
    # same data with METEOR through the library call (reusing the module's JVM)
    full = C.evaluate_results(tmp_path / "run", root, scorer=scorer)
    assert_same(full["total"], direct(refs, preds, sorted(preds), meteor=ref_meteor))
    # a failing run: exit code 2, the reason on stderr, no JSON written
    bad_json = tmp_path / "bad.json"
    assert main(["evaluate", str(tmp_path / "nope"), "--data", str(root), "--json", str(bad_json),
                 "--no-meteor", "--no-tokenize"]) == 2
    assert "results path does not exist" in capsys.readouterr().err and not bad_json.exists()


def test_format_table_scale():
    table = C.format_table({"total": {"Bleu_4": 0.5, "CIDEr-D": 1.234567}, "semantic": {"Bleu_4": 0.25,
                                                                                      "CIDEr-D": 0.0}})
    lines = table.splitlines()
    assert lines[0].split() == ["Bleu_4", "CIDEr-D"]
    assert lines[2].split() == ["total", "50.00", "123.46"]
    assert lines[3].split() == ["semantic", "25.00", "0.00"]
