"""SynthBirds: the real loaders read it, it is deterministic whatever the workers, and every generated statement is
read back by the parser and is true of its pair."""
from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pytest

from idckit.cli import main
from idckit.data.birds_to_words import BirdsToWords, swap_animals
from idckit.data.cub import Cub
from idckit.data.nabirds import NABirds
from idckit.data.synth import bird_text as bt
from idckit.data.synth.bird_render import render_bird
from idckit.data.synth.bird_species import SPECIES_ATTRS, attribute_distance, sample_individual, sample_taxonomy
from idckit.data.synth.birds import generate, pair_animals, sample_figure
from idckit.errors import DatasetError

ARGS = dict(n_pairs=48, cub_per_class=2, nabirds_per_class=3, size=64, seed=5, tree=(2, 2, 2, 3))


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("b") / "ds", workers=2, progress=False, **ARGS)


@pytest.fixture(scope="module")
def truth(synth):
    return json.loads((synth / "synth_birds.json").read_text())


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_all_three_datasets_load_with_the_real_loaders(synth, truth):
    info = json.loads((synth / "synth_info.json").read_text())
    assert info["synthetic"] is True and info["generator"].startswith("synthbirds")
    b2w = BirdsToWords(synth / "birds_to_words")
    counts = b2w.counts()
    assert sum(c["pairs"] for c in counts.values()) == 48
    assert {s: {k: counts[s][k] for k in ("pairs", "paragraphs")} for s in counts} == \
           {s: info["counts"][s] for s in ("train", "val", "test")}
    assert min(counts[s]["pairs"] for s in counts) >= 3
    assert b2w.image_status() == {"pairs": 48, "pairs_with_images": 48, "images": info["counts"]["b2w_images"],
                                  "ok": info["counts"]["b2w_images"], "missing": 0, "empty": 0, "unreadable": 0}
    species = truth["taxonomy"]["species"]
    for p in b2w.pairs("train"):
        assert 4 <= len(p.references) <= 5 and p.annotators == tuple(range(1, len(p.references) + 1))
        assert p.img1.species == species[truth["birds_to_words"][p.img1.photo_id]["species_id"]]["name"]
    cub = Cub(synth)
    assert len(cub.images()) == 48 and len(cub.classes) == 24 and len(cub.images("train")) == 24
    for im in cub.images()[:6]:
        assert len(cub.captions(im)) == 10 and im.bbox[2] > 5
    assert len(cub.class_list("trainvalclasses")) == 18 and len(cub.class_list("testclasses")) == 6
    nab = NABirds(synth)
    assert len(nab.leaf_classes) == 24 and len(nab.classes) == 1 + 2 + 4 + 8 + 24
    assert {im.class_id for im in nab.images()} == set(nab.leaf_classes)
    names = {nab.classes[c] for c in nab.leaf_classes}
    assert names == {s["common"] for s in species}
    assert len(nab.ancestors(nab.leaf_classes[0])) == 4  # genus, family, order, root
    from PIL import Image
    with Image.open(nab.images()[0].path) as im:
        assert im.size == (64, 64) and im.format == "JPEG"


def test_byte_identical_whatever_the_workers(synth, tmp_path):
    one = generate(tmp_path / "one", workers=1, progress=False, **ARGS)
    assert _digest(one) == _digest(synth)


def test_idempotent_and_refuses_what_it_did_not_write(synth, tmp_path):
    mtime = (synth / "synth_info.json").stat().st_mtime_ns
    assert generate(synth, progress=False, **ARGS) == synth
    assert (synth / "synth_info.json").stat().st_mtime_ns == mtime
    with pytest.raises(DatasetError, match="other arguments"):
        generate(synth, progress=False, **{**ARGS, "seed": 6})
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="no synth_info.json"):
        generate(foreign, overwrite=True, progress=False, **ARGS)
    assert main(["generate", "birds", "--out", str(foreign), "--pairs", "48", "--overwrite"]) == 2
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(DatasetError, match="is a file"):
        generate(foreign / "notes.txt", progress=False, **ARGS)
    with pytest.raises(DatasetError, match="too small"):
        generate(tmp_path / "x", progress=False, **{**ARGS, "n_pairs": 3})
    assert not (tmp_path / "x").exists()


def test_pivot_branch_selection_matches_the_taxonomy(synth, truth):
    species = truth["taxonomy"]["species"]
    photos = truth["birds_to_words"]
    split_of_pivot: dict[str, set] = {}
    for split in ("train", "val", "test"):
        for p in BirdsToWords(synth / "birds_to_words").pairs(split):
            a, b = (species[photos[x.photo_id]["species_id"]] for x in (p.img1, p.img2))
            split_of_pivot.setdefault(p.img1.photo_id, set()).add(split)
            sel = p.selection
            assert p.img1.selection == "base"
            same = {r: a[r] == b[r] for r in ("genus", "family", "order")}
            expect = {"sameSpecies": a["species_id"] == b["species_id"],
                      "sameGenus": same["genus"] and a["species_id"] != b["species_id"],
                      "sameFamily": same["family"] and not same["genus"],
                      "sameOrder": same["order"] and not same["family"],
                      "sameClass": not same["order"]}
            if sel == "visual":
                d = attribute_distance(a["attrs"], b["attrs"])
                assert a["species_id"] != b["species_id"]
                assert d == min(attribute_distance(a["attrs"], o["attrs"]) for o in species if o is not a)
            else:
                assert expect[sel], (sel, a["name"], b["name"])
    assert all(len(s) == 1 for s in split_of_pivot.values())  # a pivot's pairs never straddle splits


def test_every_generated_paragraph_parses_back_and_every_statement_is_true(synth):
    ds = BirdsToWords(synth / "birds_to_words")
    n_statements = n_cmp = 0
    for split in ("train", "val", "test"):
        animals = pair_animals(synth, split)
        for p in ds.pairs(split):
            a1, a2 = animals[p.pair_id]
            for text in p.references:
                assert text == text.lower() and text.endswith(" .") and "\t" not in text and "  " not in text
                assert "'s" not in text and re.fullmatch(r"[a-z0-9' ,.;]+", text)
                check = bt.check_paragraph(text, a1, a2)
                assert check.unread == () and check.statements, text
                assert all(v is True for v in check.verdicts), (text, check)
                n_statements += len(check.statements)
                n_cmp += sum(s.op in ("<", ">") for s in check.statements)
            # the mirrored pair's swapped text is just as true
            swapped = bt.check_paragraph(swap_animals(p.references[0]), *animals[p.pair_id + "_swap"])
            assert swapped.verdicts and all(v is True for v in swapped.verdicts)
        refs = {pid: r[0] for pid, r in ds.references(split).items()}
        assert bt.verified_share(refs, animals) == 1.0
    assert n_statements > 400 and n_cmp > 20  # comparatives are used, not only colour statements


def test_parser_catches_false_and_unreadable_claims():
    tax = sample_taxonomy(0)
    a = {**tax.species[0].attrs, "species": "x", "facing": "left", "background": "sky"}
    b = {**a, "size": "small", "crown_color": "red", "species": "y", "facing": "right"}
    a = {**a, "size": "large", "crown_color": "blue"}
    good = "animal1 is larger than animal2 . animal2 has a red crown . animal1 is facing left ."
    assert bt.check_paragraph(good, a, b).verdicts == (True, True, True)
    bad = "animal2 is larger than animal1 . animal1 has a red crown while animal2 has a blue crown . " \
          "animal1 flaps about happily ."
    c = bt.check_paragraph(bad, a, b)
    assert c.verdicts == (False, False, False) and c.unread == ("animal1 flaps about happily",)
    assert (c.n_true, c.n_claims) == (0, 4)
    # 3 true of 3 claims, then 0 of 4: 3 / 7 overall
    share = bt.verified_share({"p": good, "q": bad}, {"p": (a, b), "q": (a, b)})
    assert share == pytest.approx(3 / 7)
    assert bt.parse_sentence("animal1 is larger than animal1") is None  # one bird cannot be compared with itself
    # a and b differ in size and crown colour: "good" names both differences truly, "bad" neither
    assert bt.difference_recall({"p": good}, {"p": (a, b)}) == 1.0
    assert bt.difference_recall({"q": bad}, {"q": (a, b)}) == 0.0
    assert bt.difference_recall({"r": "animal1 is larger ."}, {"r": (a, b)}) == 0.5
    joined = bt.parse_sentence("animal1 is larger ; animal2 has a red crown , and animal1 has no wing bars")
    assert joined == [bt.Statement("animal1", "size", ">"), bt.Statement("animal2", "crown_color", "=", "red"),
                      bt.Statement("animal1", "wing_bars", "=", False)]
    assert bt.parse_sentence("animal1 is larger ; animal2 sings better") is None  # one unread clause: unread
    st = bt.parse_sentence("animal2 has a longer , thinner bill than animal1")
    assert st == [bt.Statement("animal2", "beak_length", ">"), bt.Statement("animal2", "beak_width", "<")]
    # facing is the photo's, unknown when only species attributes are given: neither true nor false
    facing = bt.check_paragraph("animal1 is facing left .", tax.species[0].attrs, tax.species[1].attrs)
    assert facing.verdicts == (None,) and facing.n_true == 0


def test_cub_captions_name_only_true_colours(synth, truth):
    cub = Cub(synth)
    species = truth["taxonomy"]["species"]
    colours = "|".join(["black", "white", "gray", "brown", "buff", "red", "orange", "yellow", "olive", "blue"])
    part_attr = {"crown": "crown_color", "nape": "nape_color", "breast": "breast_color", "belly": "belly_color",
                 "wings": "wing_color"}
    n = 0
    for im in cub.images():
        attrs = species[im.class_id - 1]["attrs"]
        caps = cub.captions(im)
        assert len(set(caps)) == 10
        for cap in caps:
            assert cap == cap.lower()
            for col, part in re.findall(rf"\b({colours}) (crown|nape|breast|belly|wings)\b", cap):
                assert attrs[part_attr[part]] == col, cap
                n += 1
    assert n > 200


def test_renderer_shows_the_attributes_and_is_a_pure_function():
    tax = sample_taxonomy(0)
    ind = sample_individual(np.random.default_rng(3))
    attrs = tax.species[0].attrs
    img, bbox = render_bird(attrs, ind, 96)
    assert img.shape == (96, 96, 3) and img.dtype == np.uint8
    assert np.array_equal(img, render_bird(attrs, ind, 96)[0])
    x, y, w, h = bbox
    assert 0 <= x and x + w <= 96 and 25 < w < 96 and 10 < h < 96
    for attr in SPECIES_ATTRS:  # every attribute the text talks about changes pixels
        from idckit.data.synth.bird_species import CATEGORICAL, ORDINAL
        values = ORDINAL.get(attr) or CATEGORICAL[attr]
        other = next(v for v in values if v != attrs[attr])
        changed = render_bird({**attrs, attr: other}, {**ind, "noise": 0.0}, 96)[0]
        assert not np.array_equal(changed, render_bird(attrs, {**ind, "noise": 0.0}, 96)[0]), attr
    flipped = render_bird(attrs, {**ind, "facing": "left" if ind["facing"] == "right" else "right"}, 96)[0]
    assert not np.array_equal(flipped, img)


def test_sample_figure_is_small(synth, tmp_path):
    path = sample_figure(synth, tmp_path / "fig.png", n=3)
    from PIL import Image
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 400
    assert path.stat().st_size < 300_000


def test_missing_images_are_counted_on_generated_data(synth, tmp_path):
    copy = tmp_path / "b2w"
    shutil.copytree(synth / "birds_to_words", copy)
    p = BirdsToWords(copy).pairs("test")[0]
    p.img2.path.unlink()
    ds = BirdsToWords(copy)
    status = ds.image_status("test")
    assert status["missing"] == 1 and status["pairs_with_images"] == status["pairs"] - 1
    assert len(ds.training_examples("train")) == sum(len(q.references) for q in ds.pairs("train"))


def test_grammar_every_template_is_used_and_read_back_true():
    """Over random pairs of the full 200-species taxonomy (a third of them one species), every template of the
    grammar is written at least once, and every written paragraph is read back entirely and true."""
    tax = sample_taxonomy(1)
    rng = np.random.default_rng(0)
    used: set[int] = set()
    n_joined = 0
    for k in range(300):
        a = tax.species[int(rng.integers(len(tax.species)))]
        b = a if k % 3 == 0 else tax.species[int(rng.integers(len(tax.species)))]
        i1, i2 = sample_individual(rng), sample_individual(rng)
        A = {**a.attrs, "species": a.name, "facing": i1["facing"], "background": i1["background"]}
        B = {**b.attrs, "species": b.name, "facing": i2["facing"], "background": i2["background"]}
        for _ in range(5):
            text = bt.describe_pair(A, B, rng)
            check = bt.check_paragraph(text, A, B)
            assert check.unread == () and all(v is True for v in check.verdicts), (text, check)
            for s in bt.split_sentences(text.removesuffix(" .")):
                n_joined += len(bt.clauses(s)) > 1
                for c in bt.clauses(s):
                    used.add(next(i for i, t in enumerate(bt.TEMPLATES) if t.regex.fullmatch(c)))
    assert used == set(range(len(bt.TEMPLATES)))
    assert n_joined > 100  # clauses run together (" , and ", " ; ") are read too


def test_a_failed_generation_leaves_no_directory_behind(tmp_path, monkeypatch):
    import idckit.data.synth.birds as birds

    def boom(job):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(birds, "_render_job", boom)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        generate(tmp_path / "ds", workers=1, progress=False, **ARGS)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary build directory


def test_cli_passes_every_option_through(monkeypatch, tmp_path):
    import idckit.data.synth.birds as birds

    seen = {}
    monkeypatch.setattr(birds, "generate", lambda out, **kw: seen.update(out=out, **kw))
    assert main(["generate", "birds", "--out", str(tmp_path / "o"), "--pairs", "90", "--cub-per-class", "3",
                 "--nabirds-per-class", "4", "--size", "96", "--seed", "7", "--workers", "1", "--overwrite",
                 "--tree", "2", "2", "2", "3", "--profile", "smoke"]) == 0
    assert seen == {"out": tmp_path / "o", "n_pairs": 90, "cub_per_class": 3, "nabirds_per_class": 4, "size": 96,
                    "seed": 7, "workers": 1, "overwrite": True, "tree": [2, 2, 2, 3], "profile": "smoke",
                    "force": False}
