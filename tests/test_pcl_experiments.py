"""IDC-PCL tasks and experiments at smoke size: the task pool, learning, shared cached runs."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from idckit.errors import ConfigError
from idckit.experiments import pcl, reporting
from idckit.experiments.runs import RESULT_KEYS
from numeric import assert_close


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from idckit.data.synth.clevr_change import generate

    base = tmp_path_factory.mktemp("pcl")
    root = base / "synth"
    generate(root, n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    return pcl.setup("smoke", root, runs_dir=base / "runs", progress=False)


def test_device_comes_from_the_config_and_stays_out_of_run_keys(smoke, tmp_path):
    assert smoke.device == "auto" and "device" not in smoke.config
    other = pcl.setup("smoke", smoke.data.root, runs_dir=smoke.runs_dir, progress=False, device="cpu")
    assert other.device == "cpu" and other.config == smoke.config and other.identity == smoke.identity


def test_pretrain_pool_follows_the_ratios(smoke):
    from idckit.tasks.pcl import PretrainTask

    data = pcl.loaded_data(smoke)
    task = PretrainTask(data, smoke.config["model"], batch_size=8, ratios={"mlm": 8, "mvcl": 1, "fda": 2},
                        steps_per_epoch=1100, **PRETRAIN)
    counts = Counter(b["task"] for b in task.batches(0, torch.Generator().manual_seed(0)))
    assert abs(counts["mlm"] / 1100 - 8 / 11) < 0.04 and abs(counts["fda"] / 1100 - 2 / 11) < 0.03
    fda = next(b for b in task.batches(0, torch.Generator().manual_seed(0)) if b["task"] == "fda")
    assert fda["text"].shape[0] == fda["pairs"].shape[0] == (8 // 7) * 7   # 1 positive + 6 negatives per pair
    with pytest.raises(ConfigError, match="ratios"):
        PretrainTask(data, smoke.config["model"], batch_size=8, ratios={"itm": 1}, **PRETRAIN)


FINETUNE = {"mask_prob": 0.15, "eos_prob": 0.15, "distractor_weight": 1.0, "eval_batch_size": 64, "targets": "masked",
            "selection_metric": "CIDEr-D", "tokenize": True, "loss_reduction": "mean"}
PRETRAIN = {"mask_prob": 0.15, "eos_prob": 0.15, "region_prob": 0.15, "tau_mvcl": 1.0, "tau_fda": 1.0}


@pytest.mark.parametrize("kind", ["mlm", "mvcl", "fda", "finetune", "finetune_grouped"])
def test_every_objective_learns_on_a_fixed_batch(smoke, kind):
    from idckit.tasks.pcl import FinetuneTask, PretrainTask

    data = pcl.loaded_data(smoke)
    if kind.startswith("finetune"):
        grouped = kind == "finetune_grouped"
        task = FinetuneTask(data, smoke.config["model"], batch_size=16, group_by_pair=grouped,
                            captions_per_pair=4 if grouped else 1, **FINETUNE)
    else:
        task = PretrainTask(data, smoke.config["model"], batch_size=16, ratios={kind: 1}, **PRETRAIN)
    torch.manual_seed(0)
    model = task.build_model()
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    first = None
    for step in range(60):
        loss, logs = task.train_step(model, batch, step)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    # MVCL's InfoNCE at tau=1 over ~1,500 in-batch negatives cannot go below ln(1 + N e^-2) ~ 5.3: ask less of it
    # FDA at tau=1 (7 candidates, cosines in [-1, 1]) starts at ln 7 and moves slowly: ask for a clear drop only
    want = first - 0.25 if kind in ("mvcl", "fda") else 0.8 * first
    assert float(loss) < want, (kind, first, float(loss))


def test_runs_are_shared_and_cached(smoke):
    full = pcl.run_variant(smoke, "full", progress=False)
    no_judge = pcl.run_variant(smoke, "no_judge", progress=False)
    runs = smoke.runs_dir
    cfg = lambda r: json.loads((runs / r / "config.json").read_text())
    assert cfg(full["run"])["init"] == cfg(no_judge["run"])["init"] is not None   # one pre-training for both
    assert len(list(runs.glob("pcl-pretrain-*/metrics.json"))) == 1
    assert no_judge["judge_accuracy"] is None and 0 <= full["judge_accuracy"] <= 1
    # the result keys every run_variant shares (clip4idc's are checked in test_clip4idc_experiments)
    assert set(RESULT_KEYS) <= set(full) and (full["recipe"], full["model"]) == ("pcl/full", "IDC-PCL (idckit)")
    assert full["run_dir"] == str(runs / full["run"]) and full["train_seconds"] == full["finetune_seconds"] > 0
    assert set(full["test"]) >= {"total", "semantic", "distractor"}
    # val curves carry each half too: the total alone hides a run that says "no change" to everything
    assert full["history"] and all({"CIDEr-D_semantic", "CIDEr-D_distractor"} <= set(h) for h in full["history"])
    assert (runs / full["run"] / "test" / "sc_results.json").is_file()
    mtime = (runs / full["run"] / "metrics.json").stat().st_mtime
    again = pcl.run_variant(smoke, "full", progress=False)           # cached: no training
    assert again["test"] == full["test"] and (runs / full["run"] / "metrics.json").stat().st_mtime == mtime
    with pytest.raises(ConfigError, match="unknown pcl recipe 'ful' \\(did you mean full\\?\\)"):
        pcl.run_variant(smoke, "ful")


def test_report_rows_record_diversity_judge_and_cider_subsets(smoke):
    from idckit.experiments.runs import test_captions

    full = pcl.run_variant(smoke, "full", progress=False)
    no_judge = pcl.run_variant(smoke, "no_judge", progress=False)
    captions = test_captions(smoke.runs_dir / full["run"])
    row, nj = reporting.rows([full, no_judge])
    assert row["distinct_test_captions"] == len(set(captions.values())) >= 1
    assert row["test_pairs"] == len(captions) == len(smoke.data.dataset().pairs("test"))
    assert row["judge_accuracy"] == full["judge_accuracy"] and "judge_accuracy" not in nj   # no judge, no field
    assert row["cider_d"] == pytest.approx({sub: 100 * full["test"][sub]["CIDEr-D"]
                                            for sub in ("total", "semantic", "distractor")})
    assert row["cider_d"]["total"] == pytest.approx(row["metrics"]["CIDEr-D"])
    typed = reporting.per_type_rows([full])[0]
    assert typed["distinct_test_captions"] == row["distinct_test_captions"] and typed["cider_d"] == row["cider_d"]
    # two seeds of one variant: the mean row keeps the fewest distinct captions and the mean judge and CIDEr-D
    other = {**full, "seed": 1, "judge_accuracy": 0.25, "distinct_test_captions": 1}
    mean = reporting.rows([full, other])[-1]
    assert mean["seed"] == "mean" and mean["n_seeds"] == 2 and mean["distinct_test_captions"] == 1
    assert mean["judge_accuracy"] == pytest.approx((full["judge_accuracy"] + 0.25) / 2)


def test_train_command_fills_the_run_cache_the_notebooks_read(smoke, capsys):
    from idckit.cli import main

    assert main(["train", "pcl", "--profile", "smoke", "--clevr-root", str(smoke.data.root), "--variants", "full",
                 "--runs-dir", str(smoke.runs_dir), "--device", "cpu"]) == 0
    full = pcl.run_variant(smoke, "full", progress=False)           # what a notebook asks for: cached
    assert full["run"] in capsys.readouterr().out
    assert main(["train", "pcl", "--variants", "bogus", "--runs-dir", str(smoke.runs_dir)]) == 2


def test_caption_cli_uses_the_best_run(smoke, capsys):
    from idckit.cli.caption import caption_pair, finished_runs
    from idckit.cli import main
    from idckit.errors import DatasetError

    full = pcl.run_variant(smoke, "full", progress=False)
    pair = smoke.data.dataset().pairs("test")[0]
    res = caption_pair(pair.before, pair.after, runs_dir=smoke.runs_dir)
    assert res.run == finished_runs(smoke.runs_dir)[0][1] and isinstance(res.caption, str)
    judged = caption_pair(pair.before, pair.after, runs_dir=smoke.runs_dir, model=full["run"])
    assert judged.run.name == full["run"]
    assert judged.changed in (True, False) and 0 <= judged.p_changed <= 1
    assert main(["caption", str(pair.before), str(pair.after), "--runs-dir", str(smoke.runs_dir),
                 "--model", full["run"]]) == 0
    assert "judgment:" in capsys.readouterr().out
    assert main(["caption", str(pair.before), "/nonexistent.png", "--runs-dir", str(smoke.runs_dir)]) == 2
    err = capsys.readouterr().err
    assert "the AFTER image does not exist" in err and "/nonexistent.png" in err and "fix:" in err
    with pytest.raises(DatasetError):
        caption_pair(pair.before, smoke.runs_dir / "config.json", runs_dir=smoke.runs_dir)


def test_caption_cli_decodes_with_the_runs_own_minimum_length(smoke, monkeypatch):
    """`idckit caption` decodes as the run's fine-tuning did: finetune.decode_min_words from its config.json (1 at
    smoke, 0 at paper as the authors), not the library's MIN_WORDS."""
    from idckit.cli import caption as cli

    full = pcl.run_variant(smoke, "full", progress=False)
    pair = smoke.data.dataset().pairs("test")[0]
    cfg = cli._run_config(smoke.runs_dir / full["run"])
    assert cfg["finetune"]["decode_min_words"] == 1
    seen, real = [], cli.greedy_decode
    monkeypatch.setattr(cli, "greedy_decode", lambda m, v, n, least: seen.append(least) or real(m, v, n, least))
    monkeypatch.setattr(cli, "_run_config",
                        lambda run: {**cfg, "finetune": {**cfg["finetune"], "decode_min_words": 0}})
    cli.caption_pair(pair.before, pair.after, runs_dir=smoke.runs_dir, model=full["run"])
    assert seen == [0]


def test_caption_without_any_run_says_how_to_get_one(tmp_path, capsys):
    from idckit.cli import main

    img = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (50, 30)).save(img)
    assert main(["caption", str(img), str(img), "--runs-dir", str(tmp_path)]) == 2
    assert "no trained IDC-PCL run" in capsys.readouterr().err


def test_train_fraction_keeps_whole_before_images_nested_and_balanced(smoke):
    from idckit.text.pcl_inputs import subsample_by_before

    pairs = smoke.data.dataset().pairs("train", check_images=False)
    befores = {str(p.before) for p in pairs}
    half, quarter = subsample_by_before(pairs, 0.5, seed=0), subsample_by_before(pairs, 0.25, seed=0)
    kept_half, kept_quarter = {str(p.before) for p in half}, {str(p.before) for p in quarter}
    assert len(kept_half) == round(0.5 * len(befores)) and len(kept_quarter) == round(0.25 * len(befores))
    assert kept_quarter <= kept_half                                       # nested: more data adds, never redraws
    assert sum(p.is_change for p in half) * 2 == len(half)                 # each before keeps both of its pairs
    assert [p.pair_id for p in half] == [p.pair_id for p in pairs if str(p.before) in kept_half]   # original order
    assert [p.pair_id for p in subsample_by_before(pairs, 0.5, seed=0)] == [p.pair_id for p in half]
    assert {str(p.before) for p in subsample_by_before(pairs, 0.5, seed=1)} != kept_half
    assert subsample_by_before(pairs, 1.0) == list(pairs)
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="train_fraction must be in"):
            subsample_by_before(pairs, bad)


def test_train_fraction_enters_the_run_identity(smoke):
    assert smoke.identity["train_fraction"] == 1.0
    half = pcl.setup("smoke", smoke.data.root, runs_dir=smoke.runs_dir, overrides={"train_fraction": 0.5},
                     progress=False)
    assert half.identity["train_fraction"] == 0.5
    full_data, half_data = pcl.loaded_data(smoke), pcl.loaded_data(half)
    assert len(half_data.splits["train"]) < len(full_data.splits["train"])
    assert half_data.splits["test"].pair_ids == full_data.splits["test"].pair_ids
    assert half_data.splits["val"].pair_ids == full_data.splits["val"].pair_ids


def test_grouped_batches_are_balanced_whole_before_images_with_distinct_references(smoke):
    from idckit.tasks.pcl import FinetuneTask

    data = pcl.loaded_data(smoke)
    train = data.splits["train"]
    task = FinetuneTask(data, smoke.config["model"], batch_size=24, group_by_pair=True, captions_per_pair=3,
                        **FINETUNE)
    batches = list(task.batches(0, torch.Generator().manual_seed(1)))
    assert len(batches) == len(task.before_groups) // 4          # 24 captions / 3 per pair = 8 pairs = 4 scenes
    seen = set()
    for b in batches:
        pairs = b["pairs"]
        assert b["text"].shape[:2] == (8, 3) and b["labels"].shape == b["text"].shape
        assert int(train.is_change[pairs].sum()) == 4               # each scene brings its change and its distractor
        assert len(set(train.before[pairs].tolist())) == 4
        seen |= set(pairs.tolist())
        for j, p in enumerate(pairs.tolist()):
            own = {tuple(r) for r in train.sample_ids[train.sample_pair == p].tolist()}
            unmasked = b["text"][j].clone()
            keep = b["labels"][j] != -100
            unmasked[keep] = b["labels"][j][keep]                    # undo the masking to read the references back
            rows = [tuple(r) for r in unmasked.tolist()]
            assert set(rows) <= own and len(set(rows)) == min(3, len(own))
    assert len(seen) == 8 * len(batches)                             # no pair twice in an epoch
    again = list(task.batches(0, torch.Generator().manual_seed(1)))
    assert all(torch.equal(a["text"], b["text"]) for a, b in zip(batches, again))


def test_every_position_targets_label_each_query_with_the_next_word_and_train(smoke):
    """finetune.targets "every": clean captions in, query i labelled with the word (or [EOS]) at position i, [PAD]
    ignored; the loss is the mean cross-entropy over those labels (checked by hand), and it needs grouped batches."""
    import torch.nn.functional as F

    from idckit.tasks.pcl import FinetuneTask

    data = pcl.loaded_data(smoke)
    kw = {**FINETUNE, "targets": "every", "distractor_weight": 0.0}
    task = FinetuneTask(data, smoke.config["model"], batch_size=16, group_by_pair=True, captions_per_pair=2, **kw)
    b = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    train = data.splits["train"]
    ids = b["text"].flatten(0, 1)
    assert not (ids == data.vocab.mask_id).any()                  # nothing masked in the input
    assert set(ids[:, 0].tolist()) == {data.vocab.bos_id}
    assert all((train.sample_ids == row).all(1).any() for row in ids)   # each row is a reference, untouched
    labels = b["labels"].flatten(0, 1)
    assert labels.shape == (ids.shape[0], ids.shape[1] - 1)
    assert torch.equal(labels[labels != -100], ids[:, 1:][ids[:, 1:] != data.vocab.pad_id])
    assert ((labels == data.vocab.eos_id).sum(1) == 1).all()      # every caption learns where it ends
    torch.manual_seed(0)
    model = task.build_model().eval()
    loss, logs = task.train_step(model, b, 0)
    f1, f2 = data.pair_features("train", b["pairs"])
    out = model.forward_grouped(f1, f2, b["text"], queries=True)
    keep = labels != -100
    assert_close(loss, F.cross_entropy(model.mlm_logits(out.text[keep]), labels[keep]))
    assert "judge" not in logs
    with pytest.raises(ConfigError, match='targets "every" needs finetune.group_by_pair'):
        FinetuneTask(data, smoke.config["model"], batch_size=16, group_by_pair=False, captions_per_pair=1, **kw)
    with pytest.raises(ConfigError, match="finetune.targets must be one of masked, every, got 'all'"):
        FinetuneTask(data, smoke.config["model"], batch_size=16, group_by_pair=True, captions_per_pair=2,
                     **{**kw, "targets": "all"})


def test_grouped_forward_equals_the_per_caption_forward(smoke):
    from idckit.tasks.pcl import FinetuneTask

    data = pcl.loaded_data(smoke)
    task = FinetuneTask(data, smoke.config["model"], batch_size=16, group_by_pair=True, captions_per_pair=2,
                        **FINETUNE)
    torch.manual_seed(0)
    model = task.build_model().eval()
    b = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    f1, f2 = data.pair_features("train", b["pairs"])
    grouped = model.forward_grouped(f1, f2, b["text"])
    flat = model(f1.repeat_interleave(2, 0), f2.repeat_interleave(2, 0), b["text"].flatten(0, 1), mode="finetune")
    assert_close(grouped.text, flat.text)
    assert_close(model.judge_logits(grouped), model.judge_logits(flat)[::2])
    with pytest.raises(ConfigError, match="captions_per_pair"):
        FinetuneTask(data, smoke.config["model"], batch_size=4, group_by_pair=True, captions_per_pair=4, **FINETUNE)


def test_feature_size_makes_its_own_store_grid_and_run_identity(smoke):
    """A lever of the learnability study: another feature size is another store, another grid and another run key;
    the default 224 px keeps every existing key."""
    assert smoke.config["feature_size"] == smoke.identity["feature_size"] == 224
    assert smoke.store.directory.name == "efficientnet_lite0" and smoke.store.n_regions == 49
    small = pcl.setup("smoke", smoke.data.root, runs_dir=smoke.runs_dir, overrides={"feature_size": 160},
                      progress=False)
    assert small.store.directory.name == "efficientnet_lite0-160px"
    assert small.store.n_regions == 25 and small.store.meta["image_size"] == 160   # 5x5 at stride 32
    assert small.identity["feature_size"] == 160
    drop = lambda ident: {k: v for k, v in ident.items() if k != "feature_size"}  # noqa: E731
    assert drop(small.identity) == drop(smoke.identity)
    assert pcl.loaded_data(small).features.shape[1:] == (25, 1280)
