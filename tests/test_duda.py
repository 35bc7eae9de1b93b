"""DUDA: the dual attention, the dynamic speaker, its loss, decoding, training through the loop, the cached run."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from idckit.errors import ConfigError, DatasetError
from idckit.models.decoding import beam_search, greedy_decode, naive_greedy_decode
from idckit.models.duda import DUDA, DUDAConfig, coordinates
from idckit.tasks.duda import DUDATask, caption_judge_accuracy, no_change_sentences, targets, triplets
from idckit.text.pcl_inputs import PCLData, SplitData
from idckit.text.vocab import Vocab
from numeric import assert_close, assert_differ

CAPTIONS = {"change": ["the red cube moved", "the small red cube changed its location", "a red cube is gone"],
            "none": ["no change", "nothing has changed", "the scene is the same"]}
SMALL = dict(att_dim=8, att_groups=4, att_dropout=0.0, attention="sigmoid", embed_dim=12, word_dim=6, rnn_dim=10,
             dropout=0.0)


def _data(n_before=6, n_regions=9, dim=5, max_len=10, seed=0) -> PCLData:
    """Before-image i has rows 3i (before), 3i+1 (changed), 3i+2 (distractor view); pairs are semantic, then
    distractor, as ClevrChange lists them. Features: the changed view differs in one region, per image."""
    vocab = Vocab.build(CAPTIONS["change"] + CAPTIONS["none"])
    g = torch.Generator().manual_seed(seed)
    feats = []
    for i in range(n_before):
        base = torch.randn(n_regions, dim, generator=g)
        changed = base.clone()
        changed[i % n_regions] += 3.0
        feats += [base, changed, base + 0.05 * torch.randn(n_regions, dim, generator=g)]
    features = torch.stack(feats).half()

    def split(indices):
        pair_ids, types, before, after, refs, sample_pair, texts = [], [], [], [], {}, [], []
        for i in indices:
            for change in (True, False):
                p = len(pair_ids)
                pid = f"{i:06d}.png" + ("" if change else "_n")
                caps = CAPTIONS["change"][: 1 + i % 3] if change else CAPTIONS["none"][: 1 + (i + 1) % 3]
                pair_ids.append(pid)
                types.append("move" if change else "distractor")
                before.append(3 * i)
                after.append(3 * i + (1 if change else 2))
                refs[pid] = list(caps)
                sample_pair += [p] * len(caps)
                texts += caps
        return SplitData(pair_ids=pair_ids, types=types, before=torch.tensor(before), after=torch.tensor(after),
                         is_change=torch.tensor([t != "distractor" for t in types]), references=refs,
                         sample_pair=torch.tensor(sample_pair), sample_ids=vocab.encode_batch(texts, max_len))

    half = n_before // 2
    return PCLData(vocab=vocab, features=features, max_len=max_len,
                   splits={"train": split(range(half)), "val": split(range(half, n_before))})


def _model(data: PCLData, **kw) -> DUDA:
    torch.manual_seed(0)
    cfg = DUDAConfig(vocab_size=len(data.vocab), feat_dim=data.feat_dim, n_regions=data.features.shape[1],
                     **{**SMALL, **kw})
    return DUDA(cfg, data.vocab).eval()


def test_coordinates_match_rcc_spatial_info():
    xy = coordinates(4)
    assert torch.equal(xy, torch.tensor([[-1.0, -1.0], [0.0, -1.0], [-1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ConfigError, match="square"):
        DUDAConfig(vocab_size=10, feat_dim=4, n_regions=8, **SMALL)
    with pytest.raises(ConfigError, match="att_groups"):
        DUDAConfig(vocab_size=10, feat_dim=4, n_regions=9, **{**SMALL, "att_dim": 10, "att_groups": 4})


@pytest.mark.parametrize("attention", ["sigmoid", "softmax"])
def test_shapes_attention_maps_and_dynamic_weights(attention):
    data = _data()
    model = _model(data, attention=attention)
    f1, f2 = data.pair_features("train", torch.arange(4))
    tokens = data.splits["train"].sample_ids[:4, :7]
    out = model(f1, f2, tokens)
    assert out.logits.shape == (4, 7, len(data.vocab)) and out.weights.shape == (4, 7, 3)
    a = out.attended
    assert a.att_before.shape == a.att_after.shape == (4, 9)
    assert a.before.shape == a.after.shape == a.diff.shape == (4, data.feat_dim + 2)
    assert_close(a.diff, a.after - a.before)
    # the attended feature is the attention-weighted sum of the regions (with their coordinates)
    with_xy = torch.cat([f1, coordinates(9).expand(4, -1, -1)], -1)
    assert_close(a.before, (a.att_before[..., None] * with_xy).sum(1))
    assert_close(out.weights.sum(-1), torch.ones(4, 7))
    if attention == "softmax":
        assert_close(a.att_before.sum(1), torch.ones(4))
        assert_close(a.att_after.sum(1), torch.ones(4))
    else:  # the paper's gate: each region in (0, 1), the map unnormalised
        assert bool(((a.att_before > 0) & (a.att_before < 1)).all())
        assert_differ(a.att_before.sum(1), torch.ones(4))


def test_speaker_step_equals_the_two_lstm_cells_applied_plainly():
    """The speaker applies its LSTMCells by hand (fixed inputs projected once); the plain modules are the reference."""
    data = _data()
    model = _model(data)
    sp = model.speaker
    f1, f2 = data.pair_features("train", torch.arange(3))
    a = model.attention(f1, f2)
    state = sp.start(a)
    feats = torch.stack([a.before, a.diff, a.after], 1)
    embedded = F.relu(sp.embed(feats.flatten(1)))
    h = [torch.zeros(3, 10), torch.zeros(3, 10)]
    c = [torch.zeros(3, 10), torch.zeros(3, 10)]
    with torch.no_grad():
        for tokens in (torch.tensor([1, 1, 1]), torch.tensor([9, 12, 2])):
            h[0], c[0] = sp.att_lstm(torch.cat([embedded, h[1]], -1), (h[0], c[0]))
            w = sp.weight(h[0]).softmax(-1)
            read = (w[..., None] * feats).sum(1)
            h[1], c[1] = sp.lang_lstm(torch.cat([F.relu(sp.word(tokens)), read], -1), (h[1], c[1]))
            assert_close(sp.step(state, tokens), sp.out(h[1]))
            assert_close(state.weights[-1], w)


def test_speaker_is_causal_so_padding_inputs_never_reach_earlier_words():
    data = _data()
    model = _model(data)
    f1, f2 = data.pair_features("train", torch.arange(2))
    tokens = torch.tensor([[1, 9, 10, 11, 2, 0, 0], [1, 12, 13, 2, 0, 0, 0]])
    other = tokens.clone()
    other[:, 5:] = 14
    a, b = model(f1, f2, tokens).logits, model(f1, f2, other).logits
    assert torch.equal(a[:, :5], b[:, :5])
    assert_differ(a[:, 5:], b[:, 5:])


def test_targets_trim_and_mask_padding():
    ids = torch.tensor([[1, 8, 9, 2, 0, 0, 0], [1, 8, 2, 0, 0, 0, 0]])
    inputs, labels = targets(ids, pad_id=0)
    assert torch.equal(inputs, torch.tensor([[1, 8, 9], [1, 8, 2]]))
    assert torch.equal(labels, torch.tensor([[8, 9, 2], [8, 2, -100]]))


def test_loss_equals_hand_computed_cross_entropy():
    data = _data()
    task = DUDATask(data, SMALL, batch_size=2, attention_l1=0.1, swap_before=0.0, eval_batch_size=200)
    model = _model(data)
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    loss, logs = task.train_step(model, batch, 0)

    # by hand: per half, the mean over real target tokens of -log p(target); plus 0.1 * mean attention mass
    f1 = data.features[batch["before"]].float()
    f2 = data.features[batch["after"]].float()
    ids = batch["ids"]
    with torch.no_grad():
        out = model(f1, f2, ids[:, :-1])
    logp = F.log_softmax(out.logits, -1)
    nll, count = [0.0, 0.0], [0, 0]
    for r in range(4):
        for t in range(ids.shape[1] - 1):
            target = int(ids[r, t + 1])
            if target == data.vocab.pad_id:
                break
            nll[r // 2] -= float(logp[r, t, target])
            count[r // 2] += 1
    a = out.attended
    mass = sum(float(a.att_before[r].sum() + a.att_after[r].sum()) / 2 for r in range(2)) / 2
    want = 0.5 * nll[0] / count[0] + 0.5 * nll[1] / count[1] + 0.1 * mass
    assert_close(float(loss.detach()), want, rtol=1e-5)                 # float32 loss, float64 sum by hand
    assert_close(logs["ce_change"], nll[0] / count[0], rtol=1e-5)
    assert_close(logs["attention_mass"], mass, rtol=1e-5)
    # the first half are change pairs with change references, the second their distractors
    train = data.splits["train"]
    words = lambda row: data.vocab.decode(row[1:].tolist())
    assert all(words(ids[r]) in CAPTIONS["change"] for r in range(2))
    assert all(words(ids[r]) in CAPTIONS["none"] for r in range(2, 4))
    assert torch.equal(batch["before"][:2], batch["before"][2:])
    assert set(batch["after"][:2].tolist()) <= set(train.after[train.is_change].tolist())


def test_swap_puts_the_distractor_view_before_both_pairs():
    data = _data()
    train = data.splits["train"]
    task = DUDATask(data, SMALL, batch_size=3, attention_l1=2.5e-3, swap_before=1.0, eval_batch_size=200)
    batch = next(iter(task.batches(0, torch.Generator().manual_seed(0))))
    views = set(train.after[~train.is_change].tolist())
    defaults = set(train.before.tolist())
    assert set(batch["before"].tolist()) <= views and set(batch["after"][3:].tolist()) <= defaults


def test_triplets_need_one_change_and_one_distractor_per_before_image():
    data = _data()
    change, distractor = triplets(data.splits["train"])
    assert torch.equal(change, torch.tensor([0, 2, 4])) and torch.equal(distractor, torch.tensor([1, 3, 5]))
    broken = data.splits["train"]
    broken.is_change = torch.tensor([True, True, True, False, True, False])
    with pytest.raises(DatasetError, match="two change pairs"):
        triplets(broken)


def test_captions_read_as_judgments():
    data = _data()
    no_change = no_change_sentences(data)
    assert no_change == {"no change", "nothing has changed", "the scene is the same"}
    val = data.splits["val"]   # pairs: change, distractor, change, distractor, change, distractor
    said = ["no change", "nothing has changed", "the red cube moved", "the red cube moved", "a red cube is gone",
            "the scene is the same"]
    # right: pair 1 (distractor called no change), 2 and 4 (changes described), 5; wrong: 0 and 3
    assert caption_judge_accuracy(dict(zip(val.pair_ids, said)), val, no_change) == pytest.approx(4 / 6)


def test_greedy_stops_at_eos_and_matches_the_uncached_decoder():
    data = _data()
    model = _model(data)
    visual = data.pair_features("val", torch.arange(6))
    with torch.no_grad():
        model.speaker.out.weight.zero_()
        model.speaker.out.bias.zero_()
        model.speaker.out.bias[data.vocab.eos_id] = 5.0
    tokens = greedy_decode(model, visual, 9, min_len=0)      # min_len 0: ending at once is allowed
    assert tokens.shape == (6, 1) and bool((tokens == data.vocab.eos_id).all())

    model = _model(data)
    cached, naive = greedy_decode(model, visual, 9), naive_greedy_decode(model, visual, 9)
    assert torch.equal(cached, naive)


def test_beam_search_scores_at_least_greedy():
    data = _data()
    model = _model(data)
    visual = data.pair_features("val", torch.arange(6))

    def logprob(seqs):
        bos = torch.full((len(seqs), 1), data.vocab.bos_id)
        logp = F.log_softmax(model.full_logits(visual, torch.cat([bos, seqs[:, :-1]], 1)), -1)
        real = torch.cumsum((seqs == data.vocab.eos_id).long(), 1) - (seqs == data.vocab.eos_id).long() == 0
        return (logp.gather(2, seqs[..., None]).squeeze(-1) * real).sum(1)

    greedy, beam = greedy_decode(model, visual, 6), beam_search(model, visual, 6, 4)
    length = max(greedy.shape[1], beam.shape[1])
    pad = lambda s: F.pad(s, (0, length - s.shape[1]), value=data.vocab.pad_id)
    with torch.no_grad():
        assert bool((logprob(pad(beam)) >= logprob(pad(greedy)) - 1e-5).all())


class _QuickTask(DUDATask):
    """Val selection on the teacher-forced val loss, so loop tests need no Java scorer."""

    def __init__(self, *a, crash_at: int | None = None, **kw):
        super().__init__(*a, **{"attention_l1": 2.5e-3, "swap_before": 0.5, "eval_batch_size": 200, **kw})
        self.crash_at = crash_at

    def train_step(self, model, batch, step):
        if step == self.crash_at:
            raise KeyboardInterrupt
        return super().train_step(model, batch, step)

    @torch.no_grad()
    def evaluate(self, model, split="val"):
        model.eval()
        s = self.data.splits[split]
        c, d = triplets(s)
        before = s.before[torch.cat([c, d])]
        ids = s.sample_ids[torch.cat([torch.searchsorted(s.sample_pair, c), torch.searchsorted(s.sample_pair, d)])]
        loss, _ = self.loss(model, before, s.after[torch.cat([c, d])], ids)
        return {"CIDEr-D": -float(loss)}


def test_training_through_the_loop_lowers_the_loss_and_resumes_bit_identically(tmp_path):
    from idckit.experiments.config import train_config
    from idckit.train.loop import fit

    data = _data()
    model_kw = {**SMALL, "dropout": 0.3}
    cfg = train_config(dict(max_steps=60, lr=1e-2, eval_every=10, checkpoint_every=5, log_every=10, seed=2))
    whole = fit(_QuickTask(data, model_kw, batch_size=2), cfg, tmp_path / "whole", progress=False)
    logs = [json.loads(line) for line in (tmp_path / "whole" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert losses[-1] < 0.75 * losses[0], losses   # references are drawn at random: some entropy stays

    with pytest.raises(KeyboardInterrupt):
        fit(_QuickTask(data, model_kw, batch_size=2, crash_at=33), cfg, tmp_path / "killed", progress=False)
    resumed = fit(_QuickTask(data, model_kw, batch_size=2), cfg, tmp_path / "killed", progress=False)
    assert resumed.best_step == whole.best_step and resumed.history == [
        {**h, "minutes": r["minutes"]} for h, r in zip(whole.history, resumed.history)]
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_settings_speak_the_one_train_dialect_and_refuse_typos():
    from idckit.experiments.config import load_config, train_config

    c = load_config("duda", "smoke")
    assert (c["batch_size"], c["train"]["max_steps"]) == (8, 6)        # the loop's settings are "train", as elsewhere
    assert train_config(c["train"], 3).seed == 3
    with pytest.raises(ConfigError, match="unknown settings in overrides for 'duda': batchsize"):
        load_config("duda", "smoke", {"batchsize": 8})


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from idckit.data.synth.clevr_change import generate
    from idckit.experiments import duda

    base = tmp_path_factory.mktemp("duda")
    root = base / "synth"
    generate(root, n_pairs=24, seed=1, size=(96, 64), workers=1, progress=False)
    return duda.setup("smoke", root, runs_dir=base / "runs", progress=False)


def test_run_is_cached_and_reports_the_table_keys(smoke):
    from idckit.experiments import duda

    from idckit.experiments.reporting import rows
    from idckit.experiments.runs import RESULT_KEYS

    first = duda.run_variant(smoke, progress=False)
    assert {*RESULT_KEYS, "caption_judge_accuracy"} <= set(first) and first["judge_accuracy"] is None
    assert first["test_pairs"] == len(smoke.data.dataset().pairs("test"))
    assert 0 <= first["caption_judge_accuracy"] <= 1 and "caption_judge_accuracy" in first["val"]
    assert {"total", "semantic", "distractor"} <= set(first["test"])
    assert first["best_step"] in {h["step"] for h in first["history"]}
    assert {"CIDEr-D_semantic", "CIDEr-D_distractor"} <= set(first["val"])
    again = duda.run_variant(smoke, "duda/duda", progress=False)           # the recipe's full name works too
    assert again["run"] == first["run"] and again["wall_seconds"] == first["wall_seconds"]
    assert len(list(smoke.runs_dir.glob("duda-*/metrics.json"))) == 1
    # the run's settings as duda.json has them (no reshaping for older keys)
    recorded = json.loads((smoke.runs_dir / first["run"] / "config.json").read_text())
    assert {k: recorded[k] for k in ("batch_size", "attention_l1", "swap_before", "eval_batch_size")} == {
        "batch_size": 8, "attention_l1": 0.0025, "swap_before": 0.5, "eval_batch_size": 64}
    assert recorded["train"] == smoke.config["train"] and recorded["model"] == smoke.config["model"]
    (row,) = rows([first])
    assert row["model"] == "DUDA (idckit)" and row["variant"] == "DUDA"
    assert row["metrics"]["CIDEr-D"] == pytest.approx(100 * first["test"]["total"]["CIDEr-D"])
    with pytest.raises(ConfigError, match="unknown duda recipe 'full'"):
        duda.run_variant(smoke, "full", progress=False)
    with pytest.raises(ConfigError, match="unknown duda recipe 'pcl/full'"):      # another family's recipe
        duda.run_variant(smoke, "pcl/full", progress=False)
