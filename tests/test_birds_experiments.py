"""IDC-PCL on birds at smoke size: pair records with a blank image, the FGVC stage, the stage chain, baselines."""
from __future__ import annotations

import math

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments import birds, reporting
from numeric import assert_close

PRETRAIN = {"mask_prob": 0.15, "eos_prob": 0.15, "region_prob": 0.15, "tau_mvcl": 1.0, "tau_fda": 1.0}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # at smoke size a second intra-op thread gains nothing and, on a busy 2-core box, made the FGVC stage 10x slower
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from idckit.data.synth.birds import generate

    base = tmp_path_factory.mktemp("birds")
    root = generate(base / "synth", n_pairs=30, cub_per_class=2, nabirds_per_class=3, size=64, tree=(2, 2, 2, 2),
                    workers=1, progress=False)
    return birds.setup("smoke", root, runs_dir=base / "runs", progress=False)


def test_records_load_with_a_blank_second_image_and_one_vocabulary(smoke):
    b2w, gic = birds.loaded_data(smoke, "b2w"), birds.loaded_data(smoke, "gic")
    assert b2w.vocab.words == gic.vocab.words
    train = gic.splits["train"]
    assert (train.after == gic.blank_row).all() and (train.before != gic.blank_row).all()
    assert float(gic.features[gic.blank_row].abs().sum()) == 0.0
    assert float(gic.features[train.before[0]].abs().sum()) > 0
    # every CUB image has its 10 captions as references; the swap augmentation doubles B2W's training pairs
    assert {len(r) for r in train.references.values()} == {10}
    ids = b2w.splits["train"].pair_ids
    assert sum(p.endswith("_swap") for p in ids) == len(ids) // 2
    assert not any(p.endswith("_swap") for p in b2w.splits["test"].pair_ids)
    # FDA negatives: 6 per B2W pair (Confuse on), 6 per CUB image (Retrieve + Replace)
    assert {len(v) for v in b2w.negatives.values()} == {6} and {len(v) for v in gic.negatives.values()} == {6}


def test_confuse_negatives_swap_the_animals(smoke):
    from idckit.data.birds_to_words import swap_animals

    data = birds.loaded_data(smoke, "b2w")
    train = data.splits["train"]
    swapped = sum(any(swap_animals(r) == n for r in train.references[p] for n in data.negatives[p])
                  for p in train.pair_ids)
    assert swapped >= len(train.pair_ids) // 2


def test_mvcl_never_masks_the_blank_image(smoke):
    from idckit.tasks.pcl import PretrainTask

    data = birds.loaded_data(smoke, "gic")
    task = PretrainTask(data, smoke.config["model"], batch_size=16, ratios={"mvcl": 1}, steps_per_epoch=20, **PRETRAIN)
    for batch in task.batches(0, torch.Generator().manual_seed(0)):
        assert not batch["regions"][:, 1].any() and batch["regions"][:, 0].any(1).all()
    model = task.build_model()
    loss, _ = task.train_step(model, batch, 0)
    assert math.isfinite(float(loss))


def test_fgvc_heads_shapes_and_the_stage_learns(smoke):
    from idckit.tasks.pcl import PretrainTask

    data = birds.loaded_data(smoke, "b2w")
    fg = data.fgvc
    assert 0.2 < float(fg.same.float().mean()) < 0.8 and int(fg.class1.max()) < fg.n_classes
    model_cfg = {**smoke.config["model"], "n_classes": fg.n_classes}
    task = PretrainTask(data, model_cfg, batch_size=16, ratios={"fgvc": 1}, **PRETRAIN)
    torch.manual_seed(0)
    model = task.build_model()
    f = data.features[fg.rows1[:5]].float()
    classes, match, single = model.fgvc_logits(f, f)
    assert classes.shape == (5, 2, fg.n_classes) and match.shape == (5, 2) and single.shape == (5, 2, 64)
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    first = None
    for step in range(40):
        loss, logs = task.train_step(model, batch, step)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert set(logs) == {"fgvc_class", "fgvc_match", "fgvc_contrast"}
    assert float(loss.detach()) < 0.5 * first
    with pytest.raises(ConfigError, match="FGVC image pairs"):
        PretrainTask(birds.loaded_data(smoke, "gic"), model_cfg, batch_size=16, ratios={"fgvc": 1}, **PRETRAIN)
    no_heads = PretrainTask(data, smoke.config["model"], batch_size=16, ratios={"fgvc": 1}, **PRETRAIN).build_model()
    with pytest.raises(ConfigError, match="n_classes"):
        no_heads.fgvc_logits(f, f)


def test_the_full_chain_runs_caches_and_scores_on_rouge(smoke):
    r = birds.run_variant(smoke, "both", progress=False)
    assert r["label"] == "B2W + CUB + NABirds" and "ROUGE_L" in r["val"]
    assert set(r["test"]) >= {"total", "sameSpecies"} and r["test_pairs"] == len(birds.loaded_data(smoke).splits["test"])
    assert 0 <= r["verified_share"] <= 1 and 0 <= r["difference_recall"] <= 1
    runs_before = sorted(p.name for p in smoke.runs_dir.iterdir())
    again = birds.run_variant(smoke, "both", progress=False)
    assert again["run"] == r["run"] and sorted(p.name for p in smoke.runs_dir.iterdir()) == runs_before
    assert sum(p.name.startswith("pcl-birds-gic") for p in smoke.runs_dir.iterdir()) == 1
    rows = reporting.rows([r, {**again, "seed": 1}], labels=birds.TABLE1_LABELS, percent=birds.GRAMMAR)
    mean = [x for x in rows if x["seed"] == "mean"]
    assert mean and mean[0]["variant"] == "IDC-PCL (+extra data)" and mean[0]["sd"]["ROUGE_L"] == 0.0
    assert_close(rows[0]["metrics"]["ROUGE_L"], 100 * r["test"]["total"]["ROUGE_L"])
    assert rows[0]["metrics"]["verified_share"] == pytest.approx(100 * r["verified_share"])
    with pytest.raises(ConfigError, match="unknown pcl-birds recipe 'imagenet'"):
        birds.run_variant(smoke, "imagenet")


def test_selection_names_the_profiles_rule_for_the_reports(smoke):
    import dataclasses

    from idckit.experiments.config import load_config

    assert birds.selection(smoke) == "the checkpoint with the best val ROUGE-L (scored every 3 steps)"
    cpu = dataclasses.replace(smoke, config=load_config("pcl_birds", "cpu"))
    assert birds.selection(cpu) == "the last checkpoint (step 1,000; val CIDEr-D scored once, at the end)"
    paper = dataclasses.replace(smoke, config=load_config("pcl_birds", "paper"))
    assert "best val ROUGE-L (scored every 85 steps)" in birds.selection(paper)      # bird/config/finetune_bird.json
    assert birds.provenance(cpu, [], [0], 1.0).selection_split.startswith("val: the last checkpoint")


def test_the_cub_stage_has_its_own_caption_length(smoke, tmp_path):
    """The authors' CUB stage trains on 40-token captions, their bird stages on 80 (bird/config/pretrain_cub.json:16,
    pretrain_bird_nabirds.json:16): ``gic.max_len`` sets the CUB stage's alone; null keeps the family's, and the
    GIC run key it had."""
    import dataclasses

    from idckit.experiments.config import deep_merge, load_config

    assert load_config("pcl_birds", "paper")["gic"]["max_len"] == 40
    assert load_config("pcl_birds", "cpu")["gic"]["max_len"] is None
    short = dataclasses.replace(smoke, config=deep_merge(smoke.config, {"gic": {"max_len": 12}}))
    gic, b2w = birds.loaded_data(short, "gic"), birds.loaded_data(short, "b2w")
    assert gic.max_len == 12 and gic.splits["train"].sample_ids.shape[-1] == 12
    assert b2w.max_len == smoke.config["max_len"] == 24
    assert birds.loaded_data(smoke, "gic").max_len == 24
    here = lambda s, **c: dataclasses.replace(s, runs_dir=tmp_path, **c)  # noqa: E731  (no run dirs beside smoke's)
    same = here(smoke, config=deep_merge(smoke.config, {"gic": {"max_len": 24}}))
    assert birds._gic_run(same, 0).key == birds._gic_run(here(smoke), 0).key != birds._gic_run(here(short), 0).key
    run = birds._gic_run(here(short), 0)
    assert run.config["max_len"] == 12 and "max_len" not in run.config["gic"]


def test_paper_fine_tuning_selects_no_checkpoint_before_step_2000():
    from idckit.experiments.config import load_config, train_config

    # bird/finetune.py:190: `global_step > 2000 and score > best_score`
    paper = load_config("pcl_birds", "paper")["finetune"]["train"]
    assert train_config(paper, 0).select_after_step == 2000
    for profile in ("cpu", "smoke"):
        assert train_config(load_config("pcl_birds", profile)["finetune"]["train"], 0).select_after_step == 0


def test_baselines_are_scored_like_the_model(smoke):
    out = {b["label"]: b for b in birds.baselines(smoke)}
    mf = out["most frequent paragraph"]
    assert mf["distinct_test_captions"] == 1 and 0 < mf["test"]["total"]["ROUGE_L"] < 1
    nn = out["nearest neighbour (features of both images)"]
    train = birds.loaded_data(smoke).splits["train"]
    assert set(nn["captions"].values()) <= {c for refs in train.references.values() for c in refs}


def test_nearest_feature_pair_copies_the_nearest_pairs_typical_reference():
    import numpy as np

    from idckit.eval.baselines import NearestFeaturePair, most_frequent

    f = np.zeros((2, 3, 4), dtype=np.float32)
    f[0, :, 0], f[1, :, 1] = 1, 1
    nn = NearestFeaturePair().fit(f, f[::-1], [["x a b", "a b", "a c"], ["q"]])
    got = nn.predict(f[[1, 0]] * 3, f[[0, 1]], ["p", "r"])
    assert got == {"p": "q", "r": "a b"}
    assert most_frequent({"p": ["b", "a"], "r": ["a", "b", "c"]}) == "a"


def test_run_keys_and_feature_cache_hold_the_birds_content_not_their_path(smoke, tmp_path):
    import shutil

    from idckit.experiments.data import birds_identity

    moved = tmp_path / "elsewhere"
    shutil.copytree(smoke.data.root, moved)
    again = birds.setup("smoke", moved, runs_dir=smoke.runs_dir, progress=False)
    assert again.identity == smoke.identity and str(smoke.data.root) not in str(smoke.identity)
    assert again.store.directory == smoke.store.directory                  # the features are not extracted again
    assert smoke.identity["data"].startswith("synth:")
    # without the generator's marker a root is its index files: a changed TSV is other data
    (moved / "synth_info.json").unlink()
    before = birds_identity(moved)
    assert before.startswith("index:") and birds_identity(moved) == before
    tsv = next((moved / "birds_to_words").glob("*.tsv"))
    tsv.write_text(tsv.read_text() + "\n", encoding="utf-8")
    assert birds_identity(moved) != before


def test_the_default_synthbirds_has_the_same_key_as_its_folder_passed_by_path(tmp_path, monkeypatch):
    # the default once recorded SynthCLEVR-Change's generator version, so its runs keyed apart from the same data
    # passed as data_root (and its reports named the wrong generator)
    from idckit import paths
    from idckit.data.synth.birds import GENERATOR_VERSION
    from idckit.experiments.data import birds as bird_data

    monkeypatch.setattr(paths, "data_dir", lambda: tmp_path)
    default = bird_data("smoke", progress=False)
    by_path = bird_data("smoke", default.root, progress=False)
    assert default.version == by_path.version == GENERATOR_VERSION
    assert default.identity == by_path.identity and default.synthetic and by_path.synthetic


def test_feature_size_makes_its_own_store_grid_and_run_identity(smoke):
    """Another feature size is another store, another grid and another run key; the default 224 px keeps every
    existing key (as for CLEVR, idckit.experiments.pcl)."""
    assert smoke.config["feature_size"] == smoke.identity["feature_size"] == 224
    assert smoke.store.directory.name == "efficientnet_lite0" and smoke.store.n_regions == 49
    small = birds.setup("smoke", smoke.data.root, runs_dir=smoke.runs_dir, overrides={"feature_size": 128},
                        progress=False)
    assert small.store.directory.name == "efficientnet_lite0-128px" and small.store.directory.parent == \
        smoke.store.directory.parent
    assert small.store.n_regions == 16 and small.store.meta["image_size"] == 128   # 4x4 at stride 32
    assert small.identity["feature_size"] == 128
    drop = lambda ident: {k: v for k, v in ident.items() if k != "feature_size"}  # noqa: E731
    assert drop(small.identity) == drop(smoke.identity)
    assert birds.loaded_data(small).features.shape[1:] == (16, 1280)


def test_attribute_probe_reads_a_separable_label_and_covers_every_attribute(smoke, monkeypatch):
    import functools

    from idckit.eval import probe as probe_module
    from idckit.eval.probe import fit_type_probe
    from lab.scripts import birds_attribute_probe as probe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 8, generator=g)
    y = (x[:, 3] > 0).long()                        # one coordinate decides the class, with a margin
    x[:, 3] += 2.0 * (2 * y - 1)
    names = [str(int(v)) for v in y]
    assert fit_type_probe(x[:100], names[:100], x[100:], names[100:], hidden=0)["test_accuracy"] == 1.0
    shuffled = [names[int(i)] for i in torch.randperm(200, generator=g)]   # and no coordinate decides this one
    assert fit_type_probe(x[:100], shuffled[:100], x[100:], shuffled[100:], hidden=0)["test_accuracy"] < 0.75
    # the script's run asserts coverage and ranges, not accuracy (checked above at the full 600 steps): its 2 fits
    # per attribute need not train long
    monkeypatch.setattr(probe_module, "fit_type_probe", functools.partial(fit_type_probe, steps=30))
    out = probe.probe(smoke.data.root, smoke.store.directory)
    from idckit.data.synth.birds import load_truth

    species = load_truth(smoke.data.root)["taxonomy"]["species"]
    assert set(out["attributes"]) == set(species[0]["attrs"]) and out["grid"] == 49
    for row in out["attributes"].values():
        assert 0.0 <= row["seen"] <= 1.0 and 0.0 < row["majority_seen"] <= 1.0
