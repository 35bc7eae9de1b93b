"""CLIP4IDC experiments at the smoke profile on the tiny_clevr fixture: one stand-in CLIP for everything, runs
cached by config (a second call trains nothing), the shapes the notebooks read, the `pretrain-clip` entry point."""
from __future__ import annotations

import itertools
import json

import pytest
import torch

from idckit.errors import ConfigError

OBJECTS = ["a small red rubber cube", "a large blue metal sphere", "a small gray rubber cylinder",
           "a large green metal cube", "a small cyan rubber sphere", "a large purple metal cylinder"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """tiny_clevr with scene descriptions, and one run cache shared by the tests of this module."""
    from conftest import write_clevr_change

    from idckit.experiments import clip4idc

    base = tmp_path_factory.mktemp("c4x")
    root = write_clevr_change(base / "clevr")
    names = [p.name for sub in ("images", "sc_images", "nsc_images") for p in sorted((root / sub).iterdir())]
    combos = list(itertools.combinations(OBJECTS, 2))
    (root / "scene_descriptions.json").write_text(json.dumps(
        {n: "there is " + " and ".join(combos[i % len(combos)]) for i, n in enumerate(names)}))
    s = clip4idc.setup("smoke", root, runs_dir=base / "runs", progress=False)
    return s, base


def _mtime(s, run):
    return (s.runs_dir / run / "metrics.json").stat().st_mtime_ns


def test_one_standin_and_cached_adaptation(env):
    from idckit.experiments import clip4idc, reporting

    s, base = env
    assert clip4idc.clip_model(s) == "idckit-standin-ViT-T-16" and s.config["clip"]["pretrained"] is None
    assert clip4idc.depth(s) == 6 and clip4idc.image_size(s) == 112 and clip4idc.default_n_intra(s) == 4
    a = clip4idc.adapt(s)
    assert a["n_intra"] == 4 and a["n_inter"] == 2
    assert clip4idc.STANDIN_LABEL in a["clip"]
    for key in ("test", "test_unadapted", "test_plain_clip", "val"):
        assert {"t2p_R@1", "p2t_R@1", "t2p_MnR"} <= set(a[key]), key
    stamp = _mtime(s, a["run"])
    again = clip4idc.adapt(s)
    assert again["run"] == a["run"] and _mtime(s, a["run"]) == stamp and again["test"] == a["test"]
    other = clip4idc.adapt(s, 6)               # another split: another run, the same stand-in
    assert other["run"] != a["run"] and len(list(s.runs_dir.glob("clip-standin-*"))) == 1
    n = clip4idc.test_pairs_retrieved(s)
    assert n == sum(p.is_change for p in s.data.dataset().pairs("test")) > 0
    rows = reporting.retrieval_rows([a], n_pairs=n)
    assert [r["variant"] for r in rows] == ["adapted (4/2)", "before adaptation (4/2, fresh e1/e2/p)",
                                            "plain CLIP (mean of the two image embeddings)",
                                            f"random ranking of {n} test pairs"]
    assert all(set(r["metrics"]) == set(reporting.RETRIEVAL_KEYS) for r in rows)
    assert rows[-1]["model"] == "chance" and rows[-1]["metrics"]["t2p_R@1"] == pytest.approx(100 / n)
    assert rows[0]["chance"] == rows[-1]["metrics"] and "chance" not in rows[1]   # the trained row knows its chance
    assert [r["variant"] for r in reporting.retrieval_rows([a], unadapted=False)] == ["adapted (4/2)"]


def test_the_adapt_recipe_is_the_cached_adaptation_and_idckit_train_prints_its_r1(env, capsys, monkeypatch):
    """Table 6's rows are the recipe clip4idc/adapt: the adaptation run the captioners start from (seed 0), its own
    run per seed, and `idckit train` reports its selection metric (val R@1; it has no CIDEr-D)."""
    from idckit import cli
    from idckit.experiments import base as protocol, clip4idc, reporting
    from idckit.experiments.runs import RESULT_KEYS

    s, base = env
    a = clip4idc.adapt(s)
    stamp = _mtime(s, a["run"])
    res = clip4idc.runs(s, ["adapt"], [0])
    assert res[0]["run"] == a["run"] and _mtime(s, a["run"]) == stamp      # the same run, nothing retrained
    assert (res[0]["recipe"], res[0]["label"], res[0]["test"]) == ("clip4idc/adapt", "CLIP4IDC adaptation", a["test"])
    assert set(RESULT_KEYS) <= set(res[0]) and res[0]["run_dir"] == str(s.runs_dir / a["run"])   # every recipe's keys
    assert (res[0]["judge_accuracy"], res[0]["test_pairs"], res[0]["train_seconds"]) == (None, None, a["train_seconds"])
    assert reporting.retrieval_rows(res, n_pairs=3)[0]["variant"] == "adapted (4/2)"
    monkeypatch.setattr(protocol, "train", lambda *a, **k: res)
    assert cli.main(["train", "clip4idc", "--variants", "adapt", "--profile", "smoke"]) == 0
    assert capsys.readouterr().out.strip() == (f"CLIP4IDC adaptation (seed 0): {a['run']}  val text->pair R@1 "
                                               f"{a['val']['t2p_R@1']:.1f} %")


def test_captioning_variants_share_runs_and_give_table_rows(env):
    from idckit.experiments import clip4idc, reporting
    from idckit.experiments.runs import RESULT_KEYS

    s, base = env
    res = clip4idc.runs(s, ["clip4idc"], [0, 1])
    assert [r["seed"] for r in res] == [0, 1] and res[0]["run"] != res[1]["run"]
    assert res[0]["adapt"]["run"] == clip4idc.adapt(s)["run"]          # both seeds start from one adaptation
    assert {"total", "semantic", "distractor"} <= set(res[0]["test"])
    assert (s.runs_dir / res[0]["run"] / "test" / "sc_results.json").is_file()
    stamp = _mtime(s, res[0]["run"])
    # table 7's frozen-encoder run at the default split IS table 1's seed-0 run at smoke (encoder frozen there too)
    t7 = clip4idc.run_variant(s, "clip4idc", 0, n_intra=4, freeze_visual=True)
    assert t7["run"] == res[0]["run"] and _mtime(s, res[0]["run"]) == stamp
    diff = clip4idc.run_variant(s, "clip4idc-diff", 0)     # the labelled variant: same adaptation, its own run
    assert diff["adapt"]["run"] == res[0]["adapt"]["run"] and diff["run"] != res[0]["run"]
    assert diff["label"] == "CLIP4IDC + difference tokens (idckit variant)"
    assert "difference_proj.weight" in torch.load(s.runs_dir / diff["run"] / "best.pt", map_location="cpu")
    ft = clip4idc.run_variant(s, "clip-ft", 0)
    assert ft["adapt"] is None and ft["n_intra"] is None and ft["run"] != res[0]["run"]
    # the result keys every run_variant shares (IDC-PCL's are checked in test_pcl_experiments)
    assert set(RESULT_KEYS) <= set(ft) and (ft["recipe"], ft["model"]) == ("clip4idc/clip-ft", "CLIP4IDC (idckit)")
    assert ft["judge_accuracy"] is None and ft["run_dir"] == str(s.runs_dir / ft["run"])
    assert ft["train_seconds"] == ft["caption_seconds"] > 0
    rows = reporting.rows(res)
    mean = rows[-1]
    assert mean["seed"] == "mean" and mean["n_seeds"] == 2
    cider = [r["metrics"]["CIDEr-D"] for r in rows[:2]]
    assert mean["metrics"]["CIDEr-D"] == pytest.approx(sum(cider) / 2)
    assert mean["sd"]["CIDEr-D"] == pytest.approx(abs(cider[0] - cider[1]) / 2 ** 0.5)
    per_type = reporting.per_type_rows(res)
    assert set(per_type[0]["metrics"]) <= set(reporting.TYPES) and "distractor" in per_type[0]["metrics"]
    from idckit.experiments.runs import test_captions

    distinct = [len(set(test_captions(s.runs_dir / r["run"]).values())) for r in res]
    assert [r["distinct_test_captions"] for r in rows[:2]] == distinct
    assert mean["distinct_test_captions"] == min(distinct)
    assert rows[0]["cider_d"]["total"] == pytest.approx(rows[0]["metrics"]["CIDEr-D"])
    assert rows[0]["cider_d"]["semantic"] == pytest.approx(100 * res[0]["test"]["semantic"]["CIDEr-D"])
    assert "judge_accuracy" not in rows[0]            # CLIP4IDC has no distractor judge
    assert per_type[-1]["seed"] == "mean" and per_type[-1]["distinct_test_captions"] == min(distinct)
    with pytest.raises(ConfigError, match="unknown clip4idc recipe 'clip-xl'"):
        clip4idc.run_variant(s, "clip-xl")


def test_layer_splits_map_the_paper_splits_by_depth_fraction(env):
    from idckit.experiments import clip4idc

    s, _ = env
    splits = clip4idc.layer_splits(s)
    assert [sp["label"] for sp in splits] == ["3/3", "4/2", "5/1", "6/0"]
    assert [sp["paper_split"] for sp in splits] == ["6/6", "8/4", "10/2", "12/0"]


def test_cpu_profile_standin_is_as_deep_as_vit_b32_so_table7_has_the_papers_seven_splits(env):
    from idckit.experiments import clip4idc

    s, base = env
    cpu = clip4idc.setup("cpu", s.data.root, runs_dir=base / "runs_cpu", progress=False)
    assert clip4idc.clip_model(cpu) == "idckit-standin-ViT-12" == cpu.config["standin"]["model"]
    assert clip4idc.depth(cpu) == 12 and clip4idc.default_n_intra(cpu) == 9 and clip4idc.image_size(cpu) == 112
    splits = clip4idc.layer_splits(cpu)
    assert [sp["label"] for sp in splits] == [f"{k}/{12 - k}" for k in range(6, 13)]
    assert [sp["paper_split"] for sp in splits] == [sp["label"] for sp in splits]
    assert not (base / "runs_cpu").exists() or not any((base / "runs_cpu").iterdir())   # nothing trained


def test_named_weights_skip_the_standin_and_are_keyed_by_content(env, tmp_path):
    from idckit.experiments import clip4idc
    from idckit.models.clip_loader import load_clip, save_clip_checkpoint

    s, base = env
    torch.manual_seed(5)
    clip, _, _ = load_clip("idckit-standin-ViT-T-16", None)
    f = save_clip_checkpoint(clip, tmp_path / "mine.pt", "idckit-standin-ViT-T-16")
    named = clip4idc.setup("smoke", s.data.root, runs_dir=s.runs_dir, clip_model="idckit-standin-ViT-T-16",
                           pretrained=str(f), progress=False)
    w = clip4idc.clip_weights(named)
    assert w["run"] is None and w["weights"] == str(f) and w["key"].startswith("file:mine.pt:")
    prov = clip4idc.provenance(named, [], [0], 1.0).to_dict()
    assert "not the stand-in" in prov["weights"] and prov["clip"].startswith("OpenAI/open_clip weights")
    with pytest.raises(ConfigError, match="unknown CLIP architecture"):
        clip4idc.setup("smoke", s.data.root, runs_dir=s.runs_dir, clip_model="ViT-Nope", progress=False)


def test_train_config_converts_epochs_to_steps():
    from idckit.experiments.clip4idc import _train_config

    cfg = _train_config({"epochs": 2, "lr": 1e-4, "warmup_fraction": 0.1, "eval_every_epochs": 1}, 3,
                        samples_per_epoch=1000, batch_size=128)
    assert (cfg.max_steps, cfg.warmup_steps, cfg.eval_every, cfg.seed) == (14, 1, 7, 3)
    cfg = _train_config({"epochs": None, "max_steps": 5, "lr": 1e-4, "warmup_fraction": None}, 0, 10, 2)
    assert cfg.max_steps == 5 and cfg.warmup_steps == 0


def test_pretrain_clip_command_prints_a_loadable_checkpoint(env, capsys, tmp_path):
    from idckit.cli import main
    from idckit.models.clip_loader import load_clip

    s, base = env
    out = tmp_path / "standin.pt"
    assert main(["pretrain-clip", "--profile", "smoke", "--data-root", str(s.data.root),
                 "--runs-dir", str(s.runs_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == str(out) and "stand-in" in printed[0]
    model, _, _ = load_clip("idckit-standin-ViT-T-16", out)
    assert model.visual.grid_size == (7, 7)
    assert len(list(s.runs_dir.glob("clip-standin-*"))) == 1          # the cached stand-in, not a new one
    assert main(["pretrain-clip", "--profile", "smoke", "--data-root", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
