"""``idckit verify-data``: planted faults (a missing image, a truncated image, a short split, a malformed caption
file) in copies of the kit's synthetic sets are each found, named, and turn the exit code to 1; clean copies pass."""
from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from idckit import registry
from idckit.cli import verify_data
from idckit.errors import IdckitError
from idckit.cli import main as cli

DATASETS = tuple(registry.DATASETS)


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    """The four synthetic sets at smoke sizes, generated once for the module."""
    from idckit.data.synth import birds, clevr_change, editing_request, spot_the_diff

    base = tmp_path_factory.mktemp("verify")
    clevr_change.generate(base / "clevr-change", n_pairs=20, size=(48, 32), workers=1, progress=False)
    spot_the_diff.generate(base / "spot-the-diff", n_pairs=20, workers=1, progress=False)
    editing_request.generate(base / "editing-request", n_pairs=20, workers=1, progress=False)
    birds.generate(base / "birds", n_pairs=30, cub_per_class=2, nabirds_per_class=2, size=48, workers=1,
                   tree=(2, 2, 2, 2), progress=False)
    return {name: base / name for name in DATASETS}


@pytest.fixture
def copy(sets, tmp_path):
    def make(name: str) -> Path:
        return Path(shutil.copytree(sets[name], tmp_path / name))
    return make


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def kinds(res) -> dict[str, list[str]]:
    return {k: [f.where for f in v] for k, v in res.by_kind().items() if v}


@pytest.mark.parametrize("name", DATASETS)
def test_clean_copies_pass(sets, name, capsys):
    assert cli(["verify-data", str(sets[name]), "--dataset", name]) == 0
    out = capsys.readouterr().out
    assert "no problems" in out and "counts: declared" in out
    res = verify_data.verify(sets[name], name, progress=False)
    assert res.ok and res.decoded == res.images > 0


def test_clevr_change_missing_truncated_short_split(copy, capsys):
    root = copy("clevr-change")
    (root / "sc_images" / "CLEVR_semantic_000003.png").unlink()
    truncate(root / "images" / "CLEVR_default_000005.png")
    splits = json.loads((root / "splits.json").read_text())
    dropped = splits["test"].pop()
    (root / "splits.json").write_text(json.dumps(splits))

    fast = verify_data.verify(root, "clevr-change", decode=False)
    found = kinds(fast)
    assert found["missing"] == ["sc_images/CLEVR_semantic_000003.png"]
    assert "corrupt" not in found          # the fast part opens no image: the truncated file looks fine
    assert sorted(found["extra"]) == sorted(f"{d}/CLEVR_{k}_{dropped:06d}.png" for d, k in
                                            (("images", "default"), ("sc_images", "semantic"),
                                             ("nsc_images", "nonsemantic")))
    count = [f.detail for f in fast.findings if f.kind == "count"]
    n = len(splits["test"])
    assert count == [f"test indices: {n:,} found, {n + 1:,} expected (declared in synth_info.json)"]

    assert cli(["verify-data", str(root), "--dataset", "clevr-change"]) == 1
    out = capsys.readouterr().out
    assert "images/CLEVR_default_000005.png: cannot be decoded" in out
    assert "sc_images/CLEVR_semantic_000003.png: image not found" in out


def test_clevr_change_schema_and_other_files_still_checked(copy):
    root = copy("clevr-change")
    (root / "change_captions.json").write_text('{"CLEVR_default_000000.png": "not a list"}')
    (root / "nsc_images" / "CLEVR_nonsemantic_000001.png").unlink()
    res = verify_data.verify(root, "clevr-change", decode=False)
    found = kinds(res)
    assert found["schema"] == ["change_captions.json"]
    assert found["missing"] == ["nsc_images/CLEVR_nonsemantic_000001.png"]


def test_spot_the_diff_missing_truncated_short_split(copy):
    root = copy("spot-the-diff")
    val = json.loads((root / "annotations" / "val.json").read_text())
    gone = val.pop()
    (root / "annotations" / "val.json").write_text(json.dumps(val))
    test = json.loads((root / "annotations" / "test.json").read_text())
    before = next(root.glob(f"resized_images/{test[0]['img_id']}.*"))
    after = next(root.glob(f"resized_images/{test[-1]['img_id']}_2.*"))
    before.unlink()
    truncate(after)
    res = verify_data.verify(root, "spot-the-diff", progress=False)
    found = kinds(res)
    assert found["missing"] == [f"resized_images/{before.name}"]
    assert found["corrupt"] == [f"resized_images/{after.name}"]
    details = [f.detail for f in res.findings if f.kind == "count"]
    assert any(d.startswith("entries:") for d in details) and all(f"val" in f.where for f in res.findings
                                                                  if f.kind == "count")
    if not any(e["img_id"] == gone["img_id"] for e in val):   # the dropped entry was its pair's only annotator
        assert any(d.startswith("pairs:") for d in details)
    assert verify_data.main(root, "spot-the-diff") == 1


def test_ier_missing_truncated_short_split(copy):
    root = copy("editing-request")
    test = json.loads((root / "test.json").read_text())
    (root / "test.json").write_text(json.dumps(test[:-1]))
    train = json.loads((root / "train.json").read_text())
    (root / "images" / train[0]["img0"]).unlink()
    truncate(root / "images" / train[1]["img1"])
    res = verify_data.verify(root, "editing-request", progress=False)
    found = kinds(res)
    assert found["missing"] == [f"images/{train[0]['img0']}"]
    assert found["corrupt"] == [f"images/{train[1]['img1']}"]
    assert sorted(f.detail.split(":")[0] for f in res.findings if f.kind == "count") == ["pairs", "sentences"]
    assert {f.where for f in res.findings if f.kind == "count"} == {"test split"}
    with pytest.raises(IdckitError, match="inside"):     # an input is never an output target
        verify_data.main(root, "editing-request", json_out=root / "findings.json")
    assert not (root / "findings.json").exists()
    findings = root.parent / f"{root.name}-findings.json"
    assert verify_data.main(root, "editing-request", json_out=findings) == 1
    assert verify_data.main(root, "editing-request", json_out=findings) == 1     # its own earlier report is replaced
    saved = json.loads(findings.read_text())
    assert saved["ok"] is False and saved["decoded"] == saved["images"] - 1
    assert sorted(f["kind"] for f in saved["findings"]) == ["corrupt", "count", "count", "missing"]


def test_birds_missing_truncated_short_split(copy):
    root = copy("birds")
    tsv = root / "birds_to_words" / "birds-to-words-v1.0.tsv"
    rows = list(csv.reader(tsv.open(encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
    test_rows = [r for r in rows[1:] if r[8] == "test"]
    first_pair = (test_rows[0][0], test_rows[0][4])
    kept = [rows[0]] + [r for r in rows[1:] if not (r[8] == "test" and (r[0], r[4]) == first_pair)]
    with tsv.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n").writerows(kept)
    cub_line = (root / "CUB_200_2011" / "images.txt").read_text().splitlines()[0].split()[1]
    (root / "CUB_200_2011" / "images" / cub_line).unlink()
    nab_line = (root / "nabirds" / "images.txt").read_text().splitlines()[0].split()[1]
    truncate(root / "nabirds" / "images" / nab_line)
    res = verify_data.verify(root, "birds", progress=False)
    found = kinds(res)
    assert found["missing"] == [f"CUB_200_2011/images/{cub_line}"]
    assert found["corrupt"] == [f"nabirds/images/{nab_line}"]
    assert [f.where for f in res.findings if f.kind == "count"] == ["birds_to_words test"] * 2
    assert verify_data.main(root, "birds", fast=True) == 1


def test_birds_dead_photo_and_missing_caption(copy):
    root = copy("birds")
    photo = sorted((root / "birds_to_words" / "images").iterdir())[0]
    photo.unlink()
    caption = next((root / "cvpr2016_cub" / "text_c10").rglob("*.txt"))
    caption.unlink()
    found = kinds(verify_data.verify(root, "birds", decode=False))
    assert sorted(found["missing"]) == sorted([f"birds_to_words/images/{photo.stem}.*",
                                               caption.relative_to(root).as_posix()])


def test_release_counts(sets, monkeypatch):
    """``--counts release`` compares with the registry's release counts: the synthetic set fails against the real
    counts, and passes against facts equal to its own counts (so the comparison, not the numbers, is tested here)."""
    root = sets["editing-request"]
    res = verify_data.verify(root, "editing-request", counts="release", decode=False)
    assert {f.kind for f in res.findings} == {"count"} and "3,061 expected (published)" in res.findings[0].detail
    own = {s: dict(c) for s, c in json.loads((root / "synth_info.json").read_text())["counts"].items()}
    monkeypatch.setitem(registry.DATASETS, "editing-request",
                        dataclasses.replace(registry.DATASETS["editing-request"], release={"splits": own}))
    assert verify_data.verify(root, "editing-request", counts="release", decode=False).ok
    own["val"]["pairs"] += 1
    res = verify_data.verify(root, "editing-request", counts="release", decode=False)
    assert [(f.where, f.detail.split(":")[0]) for f in res.findings] == [("val split", "pairs")]
    assert verify_data.verify(root, "editing-request", counts="none", decode=False).ok


def test_release_image_size(copy, monkeypatch):
    root = copy("clevr-change")
    (root / "synth_info.json").unlink()
    facts = json.loads(json.dumps(registry.DATASETS["clevr-change"].release))
    splits = json.loads((root / "splits.json").read_text())
    facts["splits"] = {s: len(v) for s, v in splits.items()}
    facts["images_per_folder"] = sum(facts["splits"].values())
    monkeypatch.setitem(registry.DATASETS, "clevr-change",
                        dataclasses.replace(registry.DATASETS["clevr-change"], release=facts))
    res = verify_data.verify(root, "clevr-change", progress=False)
    assert res.counts_mode == "release"
    assert [f.detail.split(" (")[0] for f in res.findings] == [f"{res.images:,} decoded images are not 480x320"]


def test_sample_decodes_a_subset(sets):
    res = verify_data.verify(sets["clevr-change"], "clevr-change", sample=7, progress=False)
    assert res.decoded == 7 and res.images == 60 and res.ok


def test_threads_find_the_same(copy):
    root = copy("editing-request")
    for image in sorted((root / "images").iterdir())[:3]:
        truncate(image)
    one, four = (verify_data.verify(root, "editing-request", progress=False, workers=w) for w in (1, 4))
    assert [f.where for f in one.findings] == [f.where for f in four.findings] == sorted(
        f"images/{p.name}" for p in sorted((root / "images").iterdir())[:3])
    assert one.facts == four.facts


def test_bad_arguments(sets, tmp_path, capsys):
    assert cli(["verify-data", str(tmp_path / "nowhere"), "--dataset", "editing-request"]) == 2
    assert "editing-request root is not a directory" in capsys.readouterr().err
    assert cli(["verify-data", str(sets["editing-request"]), "--dataset", "editing-request", "--sample", "0"]) == 2
    with pytest.raises(SystemExit):
        cli(["verify-data", str(sets["editing-request"]), "--dataset", "coco"])
    # the wrong dataset for a root: a schema finding naming the expected layout, not a crash
    res = verify_data.verify(sets["editing-request"], "clevr-change", decode=False)
    assert [f.kind for f in res.findings] == ["schema"] and "missing folder" in res.findings[0].detail


def test_doctor_fast_lines(sets, copy):
    ok = verify_data.fast_lines(sets["spot-the-diff"], "spot-the-diff")
    assert ok[0][0] and "no problems" in ok[0][1] and "no image decoded" in ok[0][1]
    root = copy("clevr-change")
    (root / "images" / "CLEVR_default_000002.png").unlink()
    lines = verify_data.fast_lines(root, "clevr-change")
    assert not lines[0][0] and "1 missing" in lines[0][1]
    assert any("images/CLEVR_default_000002.png" in text for _, text in lines)
    assert "idckit verify-data" in lines[-1][1]
