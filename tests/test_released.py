"""The authors' released checkpoints as side rows of the tables (idckit.authors.released), offline: tiny
checkpoints in the authors' format, scored on smoke data by the kit's one evaluator, never setting a status.

IDC-PCL: the recordings' sizes (12-d features, their 18 words) cannot read the smoke data, so a kit model at the
paper switches, sized for the smoke data, is written back in the authors' key names by the inverse converter, which
is first shown to be an exact round trip of the recordings. CLIP4IDC: the recordings' tiny ViT reads any images
(56 px), so their recorded checkpoints serve as they are."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from idckit.errors import ConfigError
from idckit.authors import released
from idckit.authors.pcl import (authors_state_dict_of_kit, authors_vocab_of_kit, convert_state_dict)
from idckit.reports.status import headline_rows, report_status

RECORDINGS = Path(__file__).parent / "parity"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def recording(name: str) -> dict:
    path = RECORDINGS / f"{name}.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with python -m idckit.authors record (docs/parity.md)")
    return torch.load(path, map_location="cpu", weights_only=True)


# -- the inverse converter ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["clver_finetune", "clver_pretrain", "bird_pretrain", "bird_finetune"])
def test_the_inverse_converter_is_an_exact_round_trip_of_the_recordings(name):
    rec = recording(f"pcl_{name}")
    theirs = rec["state_dict"]
    kit, words = convert_state_dict(theirs, rec["vocab"])
    back, vocab = authors_state_dict_of_kit(kit, words, rec["vocab"])
    assert vocab == rec["vocab"] == authors_vocab_of_kit(words)      # their ids: <PAD> 0, <BOS> 1, ... <MASK> 5
    again, words_again = convert_state_dict(back, vocab)
    assert words_again == words and again.keys() == kit.keys()
    assert all(torch.equal(again[k], kit[k]) for k in kit)
    # every authors' key comes back bit for bit, except what the kit never holds: the type table's unused row 0
    # (zeros) and the pre-training ITM pooler ([3d -> 2], dropped by the converter)
    pretraining_pooler = "feat_regress.bias" in theirs
    assert set(back) == {k for k in theirs if not (pretraining_pooler and k.startswith("pooler."))}
    for k, v in back.items():
        if k == "position_encoding.type_pe.weight":
            assert torch.equal(v[1:], theirs[k][1:]) and not v[0].any()
        else:
            assert torch.equal(v, theirs[k].float()), k


def test_the_inverse_converter_refuses_a_vocabulary_of_other_words():
    rec = recording("pcl_clver_finetune")
    kit, words = convert_state_dict(rec["state_dict"], rec["vocab"])
    other = {**{w: i for w, i in rec["vocab"].items() if w != "cube"}, "ball": rec["vocab"]["cube"]}
    with pytest.raises(ConfigError, match="does not hold the kit vocabulary's words"):
        authors_state_dict_of_kit(kit, words, other)


# -- IDC-PCL on smoke data ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pcl_smoke(tmp_path_factory):
    from idckit.data.synth.clevr_change import generate
    from idckit.experiments import pcl

    base = tmp_path_factory.mktemp("released-pcl")
    generate(base / "synth", n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    return pcl.setup("smoke", base / "synth", runs_dir=base / "runs", progress=False, device="cpu")


def authors_pcl_checkpoint(s, folder: Path) -> Path:
    """A fine-tuning checkpoint as the public clver/ code saves it (a bare state_dict, their key names, their
    dict.json beside it) of a tiny model at the paper switches that reads the smoke data's features."""
    from idckit.experiments import pcl
    from idckit.experiments.config import model_config
    from idckit.models.pcl import PCL

    data = pcl.loaded_data(s)
    torch.manual_seed(3)
    cfg = model_config("pcl-paper", vocab_size=len(data.vocab), feat_dim=data.feat_dim,
                       n_regions=data.features.shape[1], d_model=32, n_heads=8, d_ff=64, n_layers=2)
    model = PCL(cfg, data.vocab)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("mvcl")}   # a fine-tuned model
    sd, vocab = authors_state_dict_of_kit(state, data.vocab.words)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.half() if k.endswith("weight") else v for k, v in sd.items()}, folder / "model.pt")
    (folder / "dict.json").write_text(json.dumps(vocab))
    return folder / "model.pt"


def finite(row) -> bool:
    return all(math.isfinite(v) for v in row["metrics"].values())


def test_a_released_idc_pcl_checkpoint_is_a_scored_side_row(pcl_smoke, tmp_path):
    s = pcl_smoke
    ckpt = authors_pcl_checkpoint(s, tmp_path / "released")
    assert released.pcl_rows(s, None) == []
    rows = released.pcl_rows(s, ckpt)
    (row,) = rows
    assert row["model"] == released.MODEL and row["variant"] == released.LABEL and row["seed"] is None
    assert finite(row) and {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D"} <= set(row["metrics"])
    split = s.data.dataset().pairs("test", check_images=False)
    assert row["test_pairs"] == len(split) and 1 <= row["distinct_test_captions"] <= len(split)
    assert 0.0 <= row["judge_accuracy"] <= 1.0 and math.isfinite(row["cider_d"]["total"])
    # the captions were decoded and written like a run's, in the checkpoint's words, and scored from that file
    run = s.runs_dir / row["run"]
    captions = json.loads((run / "test" / "total_results.json").read_text())
    words = set(json.loads((tmp_path / "released" / "dict.json").read_text()))
    assert {c["image_id"] for c in captions} == {p.pair_id for p in split}
    assert all(w in words for c in captions for w in c["caption"].split())
    # the authors' file was imported once into the run cache; tables 2-4 reuse its scoring
    imported = [p.name for p in s.runs_dir.iterdir() if p.name.startswith("imported-idc-pcl-")]
    assert len(imported) == 1
    stamp = (run / "metrics.json").stat().st_mtime_ns
    (types,) = released.pcl_rows(s, s.runs_dir / imported[0], per_type=True)
    assert (run / "metrics.json").stat().st_mtime_ns == stamp and types["run"] == row["run"]
    assert set(types["metrics"]) <= {"color", "material", "add", "drop", "move", "distractor"} and finite(types)


def test_the_released_row_never_sets_a_report_status(pcl_smoke, tmp_path):
    ckpt = authors_pcl_checkpoint(pcl_smoke, tmp_path / "released")
    side = released.pcl_rows(pcl_smoke, ckpt)
    side[0]["distinct_test_captions"] = 1                 # even a collapsed released row is not the report's
    kit = {"model": "IDC-PCL (idckit)", "variant": "full", "split": "test", "seed": 0, "metrics": {"CIDEr-D": 50.0},
           "distinct_test_captions": 40, "test_pairs": 40, "judge_accuracy": 0.9}
    doc = {"rows": [kit], "headline": {"runs": {"variants": ["full"]}}}
    with_side = {**doc, "rows": [*side, kit]}
    assert report_status(with_side) == report_status(doc) and report_status(doc).verdict == "not checked"
    assert headline_rows(with_side) == [kit]
    assert report_status({"rows": side}).verdict == "no training"
    unnamed = {"rows": [*side, kit]}                      # a report whose headline names no run: the first run's
    assert headline_rows(unnamed) == [kit]


def test_released_checkpoint_errors_name_the_fix(pcl_smoke, tmp_path):
    s = pcl_smoke
    with pytest.raises(ConfigError, match="does not exist"):
        released.pcl_rows(s, tmp_path / "missing.pt")
    ckpt = authors_pcl_checkpoint(s, tmp_path / "novocab")
    (tmp_path / "novocab" / "dict.json").unlink()
    with pytest.raises(ConfigError, match="needs the vocabulary") as e:
        released.pcl_rows(s, ckpt)
    assert "import-checkpoint --from idc-pcl" in e.value.fix
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no import.json"):
        released.pcl_rows(s, tmp_path / "empty")
    # the recordings' 12-d checkpoint cannot read the smoke features: said before anything is decoded
    rec = recording("pcl_clver_finetune")
    torch.save(rec["state_dict"], tmp_path / "tiny.pt")
    (tmp_path / "dict.json").write_text(json.dumps(rec["vocab"]))
    from idckit.authors.convert import import_checkpoint

    import_checkpoint("idc-pcl", tmp_path / "tiny.pt", tmp_path / "tiny", vocab=tmp_path / "dict.json",
                      n_heads=rec["sizes"]["heads"], max_len=rec["max_len"])
    with pytest.raises(ConfigError, match=r"(?s)reads 12-d region features .*PROFILE=paper"):
        released.pcl_rows(s, tmp_path / "tiny")
    import_checkpoint("clip4idc-adapt", _clip_file(tmp_path, "adapt"), tmp_path / "clip")
    with pytest.raises(ConfigError, match="imported --from clip4idc-adapt, this table needs --from idc-pcl"):
        released.pcl_rows(s, tmp_path / "clip")


# -- CLIP4IDC on smoke data --------------------------------------------------------------------------------------
OBJECTS = ["a small red rubber cube", "a large blue metal sphere", "a small gray rubber cylinder",
           "a large green metal cube", "a small cyan rubber sphere", "a large purple metal cylinder"]


def _clip_file(folder: Path, stage: str) -> Path:
    from idckit.authors import clip4idc as parity

    rec = recording(f"clip4idc_{stage}")
    path = folder / f"pytorch_model.bin.{stage}"
    torch.save(parity.authors_state(rec["spec"], rec["meta"]["seed"]), path)
    return path


@pytest.fixture(scope="module")
def clip_smoke(tmp_path_factory):
    from conftest import write_clevr_change

    from idckit.experiments import clip4idc

    base = tmp_path_factory.mktemp("released-clip4idc")
    root = write_clevr_change(base / "clevr")
    names = [p.name for sub in ("images", "sc_images", "nsc_images") for p in sorted((root / sub).iterdir())]
    combos = list(itertools.combinations(OBJECTS, 2))
    (root / "scene_descriptions.json").write_text(json.dumps(
        {n: "there is " + " and ".join(combos[i % len(combos)]) for i, n in enumerate(names)}))
    return clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False, device="cpu"), base


def test_a_released_clip4idc_caption_checkpoint_is_a_scored_side_row(clip_smoke):
    from idckit.authors.convert import import_checkpoint

    s, base = clip_smoke
    heads = recording("clip4idc_caption")["meta"]["decoder_config"]["num_attention_heads"]
    run = base / "imported-caption"
    import_checkpoint("clip4idc-caption", _clip_file(base, "caption"), run, n_heads=heads, max_len=32)
    (row,) = released.clip4idc_caption_rows(s, run)
    assert row["model"] == released.MODEL and row["seed"] is None and finite(row)
    assert row["test_pairs"] == len(s.data.dataset().pairs("test", check_images=False))
    (types,) = released.clip4idc_caption_rows(s, run, per_type=True)
    assert types["run"] == row["run"] and finite(types)
    assert released.clip4idc_caption_rows(s, None) == []
    with pytest.raises(ConfigError, match="needs --from clip4idc-caption"):
        released.clip4idc_caption_rows(s, base / "imported-adapt-for-caption"
                                       if (base / "imported-adapt-for-caption").is_dir() else _adapt_run(base))


def _adapt_run(base: Path) -> Path:
    from idckit.authors.convert import import_checkpoint

    out = base / "imported-adapt-for-caption"
    import_checkpoint("clip4idc-adapt", _clip_file(base, "adapt"), out)
    return out


def test_a_released_adaptation_checkpoint_goes_before_the_chance_row_of_table_6(clip_smoke):
    from idckit.experiments import clip4idc, reporting
    from idckit.experiments.retrieval_table import RetrievalTable

    s, base = clip_smoke
    n_pairs = clip4idc.test_pairs_retrieved(s)
    keys = clip4idc.retrieval_keys(s)
    table = RetrievalTable("clevr-change", s, [], [reporting.chance_row(n_pairs, keys)], n_pairs)
    assert released.add_retrieval_rows(table, None) == [] and len(table.rows) == 1
    (row,) = released.add_retrieval_rows(table, _clip_file(base, "adapt"))     # the authors' file, imported here
    assert table.rows == [row, reporting.chance_row(n_pairs, keys)]
    assert row["variant"] == f"{released.LABEL} (3/1)" and set(row["metrics"]) == set(keys) and finite(row)
    assert 0 <= row["metrics"]["t2p_R@1"] <= 100 and 1 <= row["metrics"]["t2p_MdR"] <= n_pairs
    doc = {"rows": table.rows, "headline": {"runs": {"variants": ["adapted (3/1)"]}}}
    assert headline_rows(doc) == [] and report_status(doc).verdict == "no training"


# -- how a released checkpoint reaches its notebooks -------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _parameters_cell(name: str) -> dict:
    import ast

    doc = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    cell = next(c for c in doc["cells"] if "parameters" in c["metadata"].get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def test_each_table_takes_exactly_the_released_parameters_the_manifest_names():
    from idckit import registry as manifest
    from idckit.authors.convert import CONVERTERS

    for name in manifest.NOTEBOOKS:
        params = _parameters_cell(name)
        takes = {p for p, r in manifest.RELEASED.items() if name in r.notebooks}
        assert {p for p in params if p.startswith("released")} == takes, name
        assert all(params[p] is None for p in takes), name                     # default: no released row
    assert {r.kind for r in manifest.RELEASED.values()} <= set(CONVERTERS)


def test_reproduce_passes_a_released_checkpoint_only_to_the_tables_that_take_it(tmp_path):
    from idckit.cli import build_parser
    from idckit.registry import RELEASED
    from idckit.reproduce.runner import check_released, parameters

    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"x")
    given = {"released_checkpoint": str(ckpt), "released_caption_checkpoint": None}
    common = dict(profile="paper", roots=None, report_dir=tmp_path, runs_dir=tmp_path, released=given)
    assert parameters("table3_change_types", **common)["released_checkpoint"] == str(ckpt)
    assert "released_checkpoint" not in parameters("table1_birds_to_words", **common)
    assert "released_caption_checkpoint" not in parameters("clip4idc_table1_clevr_change", **common)
    check_released(["table2_clevr_change"], given)
    with pytest.raises(ConfigError, match="none of the notebooks to run takes --released-checkpoint") as e:
        check_released(["table1_birds_to_words"], given)
    assert "table2_clevr_change" in e.value.fix
    with pytest.raises(ConfigError, match="does not exist"):
        check_released(["table2_clevr_change"], {"released_checkpoint": str(tmp_path / "missing.pt")})
    with pytest.raises(ConfigError, match="unknown released-checkpoint parameters"):
        check_released(["table2_clevr_change"], {"pcl_ckpt": str(ckpt)})
    args = build_parser().parse_args(["reproduce", "table6", "--released-adapt-checkpoint", "a.bin",
                                      "--released-checkpoint", "b.pt"])
    assert (args.released_adapt_checkpoint, args.released_checkpoint, args.released_caption_checkpoint) == \
        ("a.bin", "b.pt", None)
    make = (ROOT / "Makefile").read_text()
    for r in RELEASED.values():
        assert f'$(if $({r.variable}),{r.option} "$${r.variable}")' in make     # the value: quoted, from the env


@pytest.mark.slow
@pytest.mark.java
def test_table2_at_smoke_shows_the_released_row_and_keeps_its_status(tmp_path, monkeypatch):
    """papermill, as `idckit reproduce --released-checkpoint` runs it: the report holds the released row beside
    the kit's runs, and its status is its own run's."""
    from idckit.experiments import pcl
    from idckit.reports.status import report_status
    from idckit.reproduce.runner import run_one

    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path / "data"))          # inherited by the papermill kernel
    monkeypatch.setenv("OMP_NUM_THREADS", "1")     # the kernel's torch threads, as in this process (_one_thread)
    s = pcl.setup("smoke", None, runs_dir=tmp_path / "runs", progress=False, device="cpu")
    ckpt = authors_pcl_checkpoint(s, tmp_path / "released")
    reports = tmp_path / "reports"
    reports.mkdir()
    out = run_one(ROOT / "notebooks" / "table2_clevr_change.ipynb", profile="smoke", report_dir=reports,
                  runs_dir=tmp_path / "runs", extra_parameters={"device": "cpu"},
                  released={"released_checkpoint": str(ckpt)})
    assert out.ok, out.error
    doc = json.loads((reports / "table2_clevr_change.json").read_text())
    (row,) = [r for r in doc["rows"] if r["model"] == released.MODEL]
    assert row["variant"] == released.LABEL and row["seed"] is None and finite(row)
    assert {"Bleu_4", "ROUGE_L", "CIDEr-D"} <= set(row["metrics"])
    kit = [r for r in doc["rows"] if r["model"] == "IDC-PCL (idckit)" and r.get("seed") == 0]
    assert kit and report_status(doc) == report_status({**doc, "rows": [r for r in doc["rows"] if r is not row]})
    assert released.LABEL in (reports / "table2_clevr_change.html").read_text().replace("&#x27;", "'")
