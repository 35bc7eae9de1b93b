"""lab/scripts/pcl_difference_tokens.py: the diagnostic's patch appends one after - before token per region, keeps every
position the heads read, and exists only inside ``patched()``: importing the module changes nothing and leaving the
block (even on an error) restores the kit's PCL."""
from __future__ import annotations

import pytest
import torch

from idckit.models import pcl as model
from idckit.text.vocab import SPECIALS, Vocab
from lab.scripts import pcl_difference_tokens as diagnostic
from numeric import assert_close, assert_differ


def _config(**kw):
    base = dict(vocab_size=len(SPECIALS) + 20, feat_dim=16, n_regions=4, max_text_len=8, d_model=32, n_heads=2,
                d_ff=64, n_layers=2, single_layers=1, pair_layers=1, dropout=0.0, difference_encoder=True,
                distractor_head=True, n_classes=0, visual_activation="none", norm="torch", input_norm=False,
                final_norm=True, scale_words=False, mvcl_head="untied", special_tokens="distinct", pos_table="vaswani",
                attend_padding=False, init="kit", mvcl_negatives="paper",
                single_image="blank", special_words="drop")
    return model.PCLConfig(**{**base, **kw})


def test_patch_appends_difference_tokens_and_keeps_the_read_positions():
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(20)])
    init, encode = model.PCL.__init__, model.PCL.encode_images
    assert "diff_project.weight" not in model.PCL(_config(), vocab).state_dict()     # the import patched nothing
    with diagnostic.patched() as PCL:
        assert PCL is model.PCL
        torch.manual_seed(0)
        patched = model.PCL(_config(), vocab).eval()
        assert {"diff_project.weight", "diff_project.bias", "diff_type"} <= set(patched.state_dict())
        f1, f2 = torch.randn(3, 4, 16), torch.randn(3, 4, 16)
        single, pair = patched.encode_images(f1, f2)
        assert pair.shape == (3, 2 + 3 * 4, 32)
        # the first 2 + 2n tokens (the [IMG] outputs the judge reads, the regions MVCL reads) are the unpatched
        # encoder's, computed with the same weights
        _, plain = encode(patched, f1, f2)
        assert torch.equal(pair[:, :10], plain)
        # the new tokens see only after - before: two pairs with the same difference get the same tokens
        _, shifted = patched.encode_images(f1 + 1.0, f2 + 1.0)
        assert_close(shifted[:, 10:], pair[:, 10:])
        assert_differ(shifted[:, :10], pair[:, :10])
        # decoding reads all 2 + 3n visual keys
        assert patched.start_decoding((f1, f2)).n_keys == 14
    assert (model.PCL.__init__, model.PCL.encode_images) == (init, encode)
    assert "diff_project.weight" not in model.PCL(_config(), vocab).state_dict()


def test_patch_is_undone_when_the_run_fails():
    init, encode = model.PCL.__init__, model.PCL.encode_images
    with pytest.raises(RuntimeError, match="boom"):
        with diagnostic.patched():
            assert model.PCL.encode_images is not encode
            raise RuntimeError("boom")
    assert (model.PCL.__init__, model.PCL.encode_images) == (init, encode)


def test_main_refuses_the_shared_runs_dir():
    init, encode = model.PCL.__init__, model.PCL.encode_images
    with pytest.raises(SystemExit, match="--runs-dir of its own"):
        diagnostic.main(["--data-root", "data/x", "--steps", "2"])
    assert (model.PCL.__init__, model.PCL.encode_images) == (init, encode)
