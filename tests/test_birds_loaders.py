"""Birds-to-Words, CUB-200-2011 (+ Reed captions) and NABirds loaders on hand-written files in the real formats."""
from __future__ import annotations

import pytest
from PIL import Image

from idckit.data.birds_to_words import (COLUMNS, BirdsToWords, image_ext, photo_id, swap_animals, swap_pair)
from idckit.data.cub import Cub
from idckit.data.nabirds import NABirds, sample_pairs
from idckit.errors import ConfigError, DatasetError

OBS, IMG = "https://www.inaturalist.org/photos/{}", "https://static.inaturalist.org/photos/{}/medium.{}?14000000{}"


def _row(i1, i2, sel, split, n, text, ext1="jpg", ext2="jpg"):
    return "\t".join((OBS.format(i1), IMG.format(i1, ext1, n), "Passer domesticus", "base",
                      OBS.format(i2), IMG.format(i2, ext2, n), "Passer montanus", sel, split, str(n), text))


# annN out of order, a stray quote, one pair in two splits, a png image
SPOT = "animal2 has a black spot on its white cheek while animal1 does not ."
CROWN = "animal1 has a gray crown . animal2 has a brown crown and a black cheek spot ."
QUOTED = 'animal1 is larger than animal2 . animal1 " s legs appear to be longer .'
ROWS = [
    _row(1000001, 1000002, "sameGenus", "test", 2, SPOT),
    _row(1000001, 1000002, "sameGenus", "test", 1, CROWN),
    _row(1000003, 1000004, "visual", "train", 1, QUOTED),
    _row(1000003, 1000004, "visual", "train", 2, "animal1 ' s beak is longer ."),
    _row(1000005, 1000006, "sameSpecies", "train", 1, "the two look the same .", ext2="png"),
    _row(1000001, 1000002, "sameGenus", "val", 1, "animal2 has a brown crown ."),
]


@pytest.fixture
def b2w(tmp_path):
    root = tmp_path / "b2w"
    (root / "images").mkdir(parents=True)
    (root / "birds-to-words-v1.0.tsv").write_text("\t".join(COLUMNS) + "\n" + "\n".join(ROWS) + "\n")
    for pid in (1000001, 1000002, 1000003, 1000005):
        Image.new("RGB", (8, 8), (pid % 255, 0, 0)).save(root / "images" / f"{pid}.jpg")
    Image.new("RGB", (8, 8)).save(root / "images" / "1000006.png")
    # 1000004 is missing (a dead iNaturalist link)
    return root


def test_urls_give_photo_ids_and_extensions():
    assert photo_id("https://www.inaturalist.org/photos/1000001") == "1000001"
    assert photo_id("https://www.inaturalist.org/photos/1000001/") == "1000001"
    assert image_ext("https://static.inaturalist.org/photos/7/medium.JPG?1400000001") == "jpg"
    assert image_ext("https://static.inaturalist.org/photos/7/medium") == "jpg"


def test_references_are_grouped_per_pair_within_a_split_in_annotator_order(b2w):
    ds = BirdsToWords(b2w)
    test = ds.pairs("test")
    assert [p.pair_id for p in test] == ["1000001-1000002"]
    assert test[0].references == (CROWN, SPOT)
    assert test[0].annotators == (1, 2) and test[0].selection == "sameGenus"
    assert test[0].img1.species == "Passer domesticus" and test[0].img1.selection == "base"
    assert ds.references("val") == {"1000001-1000002": ["animal2 has a brown crown ."]}
    # QUOTE_NONE: the stray quote stays text and does not swallow the next row
    train = {p.pair_id: p for p in ds.pairs("train")}
    assert train["1000003-1000004"].references[0] == QUOTED
    assert len(train) == 2 and ds.counts()["train"] == {"pairs": 2, "paragraphs": 3, "sentences": 4}


def test_missing_empty_and_unreadable_images_are_flagged_and_counted_never_raised(b2w):
    (b2w / "images" / "1000005.jpg").write_bytes(b"")
    ds = BirdsToWords(b2w)
    train = {p.pair_id: p for p in ds.pairs("train")}
    assert train["1000003-1000004"].img2.status == "missing" and train["1000003-1000004"].img2.path is None
    assert train["1000005-1000006"].img1.status == "empty"
    assert train["1000005-1000006"].img2.path == b2w / "images" / "1000006.png"  # falls back to another extension
    assert ds.image_status("train") == {"pairs": 2, "pairs_with_images": 0, "images": 4, "ok": 2, "missing": 1,
                                        "empty": 1, "unreadable": 0}
    assert ds.pairs("train", only_with_images=True) == []
    assert [ph.photo_id for ph in ds.photos("train")] == ["1000003", "1000006"]
    assert [ph.photo_id for ph in ds.photos()] == ["1000003", "1000006", "1000001", "1000002"]  # train, val, test
    assert len(ds.photos("train", only_ok=False)) == 4
    (b2w / "images" / "1000001.jpg").write_bytes(b"not a jpeg")
    assert BirdsToWords(b2w).image_status("test")["ok"] == 2  # not decoded by default
    checked = BirdsToWords(b2w, verify_images=True)
    assert checked.image_status("test")["unreadable"] == 1 and not checked.pairs("test")[0].images_ok


def test_swap_augmentation_mirrors_images_and_tokens_for_training_only(b2w):
    text = "animal1 ' s beak is longer than animal2 ' s ."
    assert swap_animals(text) == "animal2 ' s beak is longer than animal1 ' s ."
    ds = BirdsToWords(b2w)
    p = ds.pairs("test")[0]
    s = swap_pair(p)
    assert (s.img1, s.img2, s.swapped, s.pair_id) == (p.img2, p.img1, True, "1000001-1000002_swap")
    assert s.references[0] == "animal2 has a gray crown . animal1 has a brown crown and a black cheek spot ."
    ex = ds.training_examples("train", swap=True, only_with_images=False)
    assert len(ex) == 2 * len(ds.training_examples("train", only_with_images=False)) == 6
    assert ("animal2 ' s beak is longer .") in [t for _, t in ex]
    with pytest.raises(ConfigError, match="training split only"):
        ds.training_examples("test", swap=True)


def test_wrong_layouts_raise_dataset_errors_naming_path_and_fix(tmp_path, b2w):
    with pytest.raises(DatasetError, match="no birds-to-words-v1.0.tsv") as e:
        BirdsToWords(tmp_path / "nowhere")
    assert "idckit generate birds" in str(e.value)
    tsv = b2w / "birds-to-words-v1.0.tsv"
    lines = tsv.read_text().splitlines()
    tsv.write_text(",".join(COLUMNS) + "\n" + "\n".join(lines[1:]))
    with pytest.raises(DatasetError, match="wrong header") as e:
        BirdsToWords(b2w)
    assert e.value.path == tsv and "11 columns" in str(e.value)
    tsv.write_text("\n".join(lines[:2] + [lines[2] + "\textra"]) + "\n")
    with pytest.raises(DatasetError, match="line 3 has 12 tab-separated fields"):
        BirdsToWords(b2w)
    tsv.write_text("\n".join(lines[:2] + [lines[2].replace("\ttest\t", "\tdev\t")]) + "\n")
    with pytest.raises(DatasetError, match="split 'dev'"):
        BirdsToWords(b2w)


# -- CUB -------------------------------------------------------------------------------------------------
@pytest.fixture
def cub(tmp_path):
    root = tmp_path / "CUB_200_2011"
    files = {1: "001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg",
             2: "001.Black_footed_Albatross/Black_Footed_Albatross_0009_34.jpg",
             3: "002.Laysan_Albatross/Laysan_Albatross_0002_1027.jpg"}
    for rel in files.values():
        (root / "images" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(root / "images" / rel)
    (root / "images.txt").write_text("".join(f"{i} {r}\n" for i, r in files.items()))
    (root / "classes.txt").write_text("1 001.Black_footed_Albatross\n2 002.Laysan_Albatross\n")
    (root / "image_class_labels.txt").write_text("1 1\n2 1\n3 2\n")
    (root / "train_test_split.txt").write_text("1 1\n2 0\n3 1\n")
    (root / "bounding_boxes.txt").write_text("1 60.0 27.0 325.0 304.0\n2 1.0 2.0 3.0 4.0\n3 5.0 6.0 7.0 8.0\n")
    text = tmp_path / "cvpr2016_cub"
    for rel in files.values():
        p = text / "text_c10" / rel.replace(".jpg", ".txt")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(f"this bird has a white belly and a short pointy bill {k}\n" for k in range(10)))
    (text / "trainvalclasses.txt").write_text("001.Black_footed_Albatross\n")
    return root


def test_cub_images_splits_boxes_and_captions(cub):
    ds = Cub(cub.parent)  # the folder holding CUB_200_2011/ works too
    assert [im.image_id for im in ds.images("train")] == [1, 3] and [im.image_id for im in ds.images("test")] == [2]
    im = ds.images()[0]
    assert (im.class_id, im.class_dir, im.bbox) == (1, "001.Black_footed_Albatross", (60.0, 27.0, 325.0, 304.0))
    assert im.path == cub / "images" / "001.Black_footed_Albatross" / "Black_Footed_Albatross_0046_18.jpg"
    caps = ds.captions(im)
    assert len(caps) == 10 and caps[3] == "this bird has a white belly and a short pointy bill 3"
    assert len(ds.caption_pairs("train")) == 20 and ds.class_list("trainvalclasses") == ["001.Black_footed_Albatross"]


def test_cub_wrong_layouts(cub, tmp_path):
    (cub / "image_class_labels.txt").write_text("1 1\n2 1\n3 9\n")
    with pytest.raises(DatasetError, match="class 9, which classes.txt does not list") as e:
        Cub(cub).images()
    assert e.value.path == cub / "classes.txt" and e.value.fix
    (cub / "train_test_split.txt").write_text("1 1\n2 yes\n3 1\n")
    with pytest.raises(DatasetError, match="is_training must be 0 or 1"):
        Cub(cub).images()
    (cub / "classes.txt").unlink()
    with pytest.raises(DatasetError, match="missing file classes.txt"):
        Cub(cub)
    (cub / "classes.txt").write_text("1 001.Black_footed_Albatross\n2 002.Laysan_Albatross\n")
    (cub / "train_test_split.txt").write_text("1 1\n2 0\n3 1\n")
    (cub / "image_class_labels.txt").write_text("1 1\n2 1\n3 2\n")
    with pytest.raises(DatasetError, match="no text_c10/ folder"):
        Cub(cub, text_root=tmp_path / "elsewhere").captions(Cub(cub).images()[0])


# -- NABirds ----------------------------------------------------------------------------------------------
U1, U2, U3 = "0000139e-21dc-4d0c-bfe1-4cae3c85c829", "0000d9fc-4e02-4c06-a0af-a55cfb16b12b", \
    "00019306-9d83-4334-b255-a447742edce3"


@pytest.fixture
def nab(tmp_path):
    root = tmp_path / "nabirds"
    rows = {U1: (817, "0817"), U2: (37, "0037"), U3: (817, "0817")}
    for u, (_, d) in rows.items():
        (root / "images" / d).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(root / "images" / d / f"{u.replace('-', '')}.jpg")
    (root / "images.txt").write_text("".join(f"{u} {d}/{u.replace('-', '')}.jpg\n" for u, (_, d) in rows.items()))
    (root / "classes.txt").write_text(
        "0 Birds\n1 Owls\n2 Perching Birds\n37 Barn Owl\n817 Red-winged Blackbird (Male)\n")
    (root / "hierarchy.txt").write_text("1 0\n2 0\n37 1\n817 2\n")
    (root / "image_class_labels.txt").write_text("".join(f"{u} {c}\n" for u, (c, _) in rows.items()))
    (root / "train_test_split.txt").write_text(f"{U1} 1\n{U2} 1\n{U3} 0\n")
    return root


def test_nabirds_uuids_taxonomy_and_leaf_classes(nab):
    ds = NABirds(nab)
    assert ds.classes[37] == "Barn Owl" and ds.classes[817] == "Red-winged Blackbird (Male)"
    assert ds.leaf_classes == [37, 817] and ds.label_index == {37: 0, 817: 1}
    assert ds.ancestors(817) == [2, 0]
    assert [im.uuid for im in ds.images("train")] == [U1, U2]
    assert ds.images()[0].path == nab / "images" / "0817" / "0000139e21dc4d0cbfe14cae3c85c829.jpg"
    pairs = sample_pairs(ds.images(), 40, seed=1)
    assert pairs == sample_pairs(ds.images(), 40, seed=1)
    assert all(p["label"] == int(p["class_id1"] == p["class_id2"]) for p in pairs)
    assert 10 < sum(p["label"] for p in pairs) < 30  # about half same-class


def test_nabirds_wrong_layouts(nab):
    (nab / "image_class_labels.txt").write_text(f"{U1} 2\n{U2} 37\n{U3} 817\n")
    with pytest.raises(DatasetError, match="not a leaf class"):
        NABirds(nab).images()
    (nab / "image_class_labels.txt").write_text(f"17 817\n{U2} 37\n{U3} 817\n")
    with pytest.raises(DatasetError, match="'17' is not a UUID") as e:
        NABirds(nab).images()
    assert e.value.path == nab / "image_class_labels.txt"
    (nab / "hierarchy.txt").write_text("1 0\n2 0\n37 1\n817 99\n")
    with pytest.raises(DatasetError, match="class 99, which classes.txt does not list"):
        NABirds(nab).leaf_classes
    (nab / "hierarchy.txt").unlink()
    with pytest.raises(DatasetError, match="missing file hierarchy.txt"):
        NABirds(nab)


def test_a_byte_order_mark_and_windows_line_ends_are_tolerated(b2w):
    tsv = b2w / "birds-to-words-v1.0.tsv"
    tsv.write_bytes(b"\xef\xbb\xbf" + tsv.read_text().replace("\n", "\r\n").encode())
    ds = BirdsToWords(tsv)  # the TSV itself works as the root too
    assert ds.references("test")["1000001-1000002"] == [CROWN, SPOT] and ds.image_root == b2w / "images"
