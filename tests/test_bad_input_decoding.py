"""Decoding never returns an empty caption: the end token and the other specials are barred until a word has been
written (idckit.models.decoding.MIN_WORDS), at every beam width and for every family; lengths and widths that
leave no room for a word, and models that can score no word, are refused with a clear error."""
from __future__ import annotations


import pytest
import torch

from idckit.errors import ConfigError
from idckit.models.decoding import beam_search, greedy_decode, naive_greedy_decode
from idckit.text.vocab import Vocab


class Fixed(torch.nn.Module):
    """A captioner whose next-token log-scores are ``first`` at the first step and ``then`` after it, whatever the
    image: enough to pin down what greedy and beam search choose."""
    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, first, then=None):
        super().__init__()
        self.first = torch.as_tensor(first, dtype=torch.float32)
        self.then = self.first if then is None else torch.as_tensor(then, dtype=torch.float32)

    def _scores(self, b, t):
        return (self.first if t == 1 else self.then).expand(b, -1).clone()

    def start_decoding(self, visual):
        return {"t": 0}

    def decode_step(self, state, tokens):
        state["t"] += 1
        return self._scores(tokens.shape[0], state["t"])

    def reorder_state(self, state, index):
        return dict(state)

    def full_logits(self, visual, tokens):
        return torch.stack([self._scores(tokens.shape[0], t + 1) for t in range(tokens.shape[1])], 1)


VISUAL = torch.zeros(2, 4)


def words_of(row, model) -> list[int]:
    """The ids before the first end token that are not special: what a vocabulary decodes to words."""
    out = []
    for i in row.tolist():
        if i == model.eos_id:
            break
        if i not in (model.pad_id, model.bos_id):
            out.append(i)
    return out


@pytest.mark.parametrize("beam", [1, 3, 10])
def test_an_end_token_that_dominates_the_first_step_still_gives_a_word(beam):
    model = Fixed([0.0, 0.0, 20.0, 1.0, 3.0, 2.0])          # EOS far likeliest at once; id 4 the best word
    tokens = beam_search(model, VISUAL, 8, beam)
    for row in tokens:
        assert words_of(row, model)[:1] == [4]               # the best word, then the end token
        assert row.tolist()[:2] == [4, 2]


def test_beam_no_longer_prefers_ending_at_once_where_greedy_writes_a_word():
    # `caption --beam 10`: at step 0 a word is likeliest (greedy writes it), but the end token alone pays one
    # log-probability and any sentence at least two, so beam search without a minimum length returned "".
    model = Fixed([-9.0, -9.0, 0.0, 0.1] + [-1.0] * 9, then=[-9.0, -9.0, 0.0] + [0.0] * 10)
    assert words_of(greedy_decode(model, VISUAL, 6)[0], model)
    for beam in (2, 5, 10):
        assert words_of(beam_search(model, VISUAL, 6, beam)[0], model), beam
    assert beam_search(model, VISUAL, 6, 10, min_len=0)[0, 0] == model.eos_id     # what it did before


def test_cached_decoding_equals_naive_decoding_under_the_minimum_length():
    model = Fixed([0.0, 5.0, 9.0, 1.0, 2.0], then=[0.0, 0.0, 1.0, 3.0, 0.5])
    cached, naive = greedy_decode(model, VISUAL, 5), naive_greedy_decode(model, VISUAL, 5)
    assert torch.equal(cached, naive)
    assert cached[0].tolist()[0] == 4                     # neither the end token (9) nor BOS (5) first


def test_a_decode_whose_first_token_is_a_word_is_unchanged():
    from test_decoding import Toy

    model = Toy(seed=3)
    visual = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
    free, kept = greedy_decode(model, visual, 12, min_len=0), greedy_decode(model, visual, 12)
    width = max(free.shape[1], kept.shape[1])
    free, kept = (torch.nn.functional.pad(t, (0, width - t.shape[1]), value=Toy.pad_id) for t in (free, kept))
    word_first = (free[:, 0] != Toy.eos_id) & (free[:, 0] != Toy.pad_id) & (free[:, 0] != Toy.bos_id)
    assert word_first.any() and not word_first.all()
    assert torch.equal(kept[word_first], free[word_first])
    assert not (kept[:, 0] == Toy.eos_id).any()


@pytest.mark.parametrize("max_len", [0, -1])
def test_no_room_for_a_word_is_refused(max_len):
    model = Fixed([0.0, 0.0, 1.0, 2.0])
    for decode in (lambda: greedy_decode(model, VISUAL, max_len), lambda: naive_greedy_decode(model, VISUAL, max_len),
                   lambda: beam_search(model, VISUAL, max_len, 3)):
        with pytest.raises(ConfigError, match="max_len"):
            decode()


@pytest.mark.parametrize("beam", [1, 4])
def test_max_len_one_is_one_word(beam):
    model = Fixed([0.0, 0.0, 9.0, 1.0, 2.0])
    tokens = beam_search(model, VISUAL, 1, beam)
    assert tokens.tolist() == [[4], [4]]


def test_a_vocabulary_of_specials_only_is_refused():
    model = Fixed([0.0, 0.0, 5.0])                          # pad, bos, eos: no word at all
    with pytest.raises(ConfigError, match="no word can start a caption"):
        greedy_decode(model, VISUAL, 5)
    with pytest.raises(ConfigError, match="no word can start a caption"):
        beam_search(model, VISUAL, 5, 3)


def test_non_finite_scores_are_refused_not_decoded_as_an_empty_caption():
    model = Fixed([float("nan")] * 6)                          # what a model with NaN weights scores
    with pytest.raises(ConfigError, match="NaN"):
        greedy_decode(model, VISUAL, 5)


def test_a_beam_wider_than_the_vocabulary_still_returns_the_best_caption():
    model = Fixed([0.0, 0.0, 3.0, 2.0, 1.0], then=[0.0, 0.0, 3.0, 0.5, 0.1])
    wide, narrow = beam_search(model, VISUAL, 4, 50), beam_search(model, VISUAL, 4, 2)
    assert wide.tolist()[0][:2] == narrow.tolist()[0][:2] == [3, 2]     # best word, then end


@pytest.mark.parametrize("beam", [0, -2, True, 2.0, "3"])
def test_a_beam_width_that_is_not_a_positive_integer_is_refused(beam):
    with pytest.raises(ConfigError, match="beam width"):
        beam_search(Fixed([0.0, 0.0, 1.0, 2.0]), VISUAL, 4, beam)


def _specials_dominate(model, specials, vocab_size):
    """Wrap ``model`` so that every special id outscores every word by far at every step."""
    bias = torch.zeros(vocab_size)
    bias[list(specials)] = 50.0
    step, full = model.decode_step, model.full_logits
    model.decode_step = lambda state, tokens: step(state, tokens) + bias
    model.full_logits = lambda visual, tokens: full(visual, tokens) + bias
    return model


@pytest.mark.parametrize("beam", [1, 3, 10])
def test_idc_pcl_writes_a_word_when_its_specials_dominate(beam):
    from idckit.experiments.config import model_config
    from idckit.models.pcl import PCL

    vocab = Vocab.build(["the red cube changed to blue", "no change was made"])
    torch.manual_seed(0)
    model = PCL(model_config("pcl-paper", vocab_size=len(vocab), feat_dim=12, n_regions=5, d_model=32, n_heads=4,
                             d_ff=64, n_layers=1, dropout=0.0, max_text_len=12), vocab).eval()
    _specials_dominate(model, range(Vocab.n_special), len(vocab))    # [UNK] and [MASK] too: they decode to ""
    f1, f2 = torch.randn(2, 5, 12), torch.randn(2, 5, 12)
    tokens = beam_search(model, (f1, f2), 8, beam)
    assert all(vocab.decode(row) for row in tokens.tolist())
    assert torch.equal(greedy_decode(model, (f1, f2), 8), naive_greedy_decode(model, (f1, f2), 8))


@pytest.mark.parametrize("beam", [1, 10])
def test_duda_writes_a_word_when_its_specials_dominate(beam):
    from idckit.models.duda import DUDA, DUDAConfig

    vocab = Vocab.build(["the red cube changed to blue", "no change was made"])
    torch.manual_seed(0)
    model = DUDA(DUDAConfig(vocab_size=len(vocab), feat_dim=5, n_regions=9, att_dim=8, att_groups=4,
                            att_dropout=0.0, attention="sigmoid", embed_dim=12, word_dim=6, rnn_dim=10,
                            dropout=0.0), vocab).eval()
    _specials_dominate(model, range(Vocab.n_special), len(vocab))
    visual = (torch.randn(2, 9, 5), torch.randn(2, 9, 5))
    tokens = beam_search(model, visual, 8, beam)
    assert all(vocab.decode(row) for row in tokens.tolist())


def test_clip4idc_writes_a_word_when_its_specials_dominate(tmp_path):
    import json

    import open_clip

    from idckit.experiments.config import model_config
    from idckit.models.clip4idc import CLIP4IDCCaptioner
    from idckit.tasks.clip4idc import decode_ids

    # a tiny ad-hoc open_clip model (CLIP's BPE vocabulary, everything else minimal), never the network
    (tmp_path / "idckit-bad-input-tiny.json").write_text(json.dumps(
        {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
         "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 1, "layers": 1}}))
    open_clip.add_model_config(tmp_path)
    torch.manual_seed(0)
    clip = open_clip.create_model("idckit-bad-input-tiny", pretrained=None).eval()
    cap = CLIP4IDCCaptioner(clip, model_config("clip4idc-paper", hidden=16, heads=2, ffn=32, enc_layers=1,
                                               dec_layers=1, dropout=0.0, max_len=8),
                            output_ids=list(range(300, 340))).eval()
    # pad is id 0, "!", at which a caption is cut as at the end token
    _specials_dominate(cap, (cap.pad_id, cap.bos_id, cap.eos_id), clip.token_embedding.num_embeddings)
    pair = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32)
    for beam in (1, 3):
        assert all(decode_ids(beam_search(cap, pair, 4, beam).tolist())), beam
