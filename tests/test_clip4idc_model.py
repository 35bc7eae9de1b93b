"""CLIP4IDC's pair encoder, retrieval model and captioner on a tiny ad-hoc open_clip ViT (never the network)."""
from __future__ import annotations

import dataclasses
import json

import open_clip
import pytest
import torch
import torch.nn.functional as F

from open_clip.transformer import VisionTransformer

from idckit.experiments.config import model_config
from idckit.losses import mlm_loss
from idckit.models import clip_loader  # registers the stand-in configs
from idckit.models.clip4idc import (CLIP4IDCCaptioner, CLIP4IDCRetrieval, PairEncoder,
                                    clip_text_features, tokenize_captions)
from numeric import assert_close, assert_differ

TINY = "idckit-test-tiny-vit"
# ViT: width 64, 4 blocks of 2 heads, patch 16 at 64 px (4x4 patches -> 17 tokens per image), output dim 48;
# text: width 64, context 40 (> the captions' 32, so the sliced text path is exercised).
TINY_CFG = {"embed_dim": 48,
            "vision_cfg": {"image_size": 64, "layers": 4, "width": 64, "head_width": 32, "patch_size": 16},
            "text_cfg": {"context_length": 40, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}
DEPTH, N1 = 4, 17
TINY_CAPTIONER = model_config("clip4idc-paper", hidden=64, heads=2, ffn=128, max_len=12)


@pytest.fixture(scope="module", autouse=True)
def _tiny_config(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("clip_cfg") / f"{TINY}.json"
    path.write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(path)


def tiny_clip(seed=0, image_size=None):
    torch.manual_seed(seed)
    return open_clip.create_model(TINY, pretrained=None, force_image_size=image_size).eval()


def images(batch=2, size=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g), torch.randn(batch, 3, size, size, generator=g)


def manual_pair_forward(pe: PairEncoder, before, after):
    """Reference built from open_clip's own VisionTransformer pieces (its private _embeds, its blocks called
    directly), with the after-CLS index computed from the image size, not taken from the module."""
    v = pe.visual
    n1 = (before.shape[-1] // 16) ** 2 + 1
    x = v._embeds(torch.cat([before, after]))
    for blk in v.transformer.resblocks[:pe.n_intra]:
        x = blk(x)
    b = before.shape[0]
    x = torch.cat([x[:b] + pe.bef_embedding, x[b:] + pe.aft_embedding], dim=1)
    x = pe.ln_mid(x + pe.joint_positional_embedding)
    for blk in v.transformer.resblocks[pe.n_intra:]:
        x = blk(x)
    cls = v.ln_post(torch.stack([x[:, 0], x[:, n1]], 1)) @ v.proj
    return cls.mean(1)


# --- pair encoder --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_intra", [0, 1, 3, DEPTH])
def test_pair_encoder_shapes_for_every_kind_of_split(n_intra):
    pe = PairEncoder(tiny_clip().visual, n_intra=n_intra)
    assert (pe.n_intra, pe.n_inter) == (n_intra, DEPTH - n_intra)
    tokens, pair = pe(*images(batch=3))
    assert tokens.shape == (3, 2 * N1, 48) and pair.shape == (3, 48)
    assert pe.cls_indices == (0, N1)
    assert pe.joint_positional_embedding.shape == (2 * N1, 64)


def test_new_parameters_are_initialised_like_the_public_code():
    torch.manual_seed(0)
    # ViT-B/32's width and grid (2 blocks suffice: the new parameters do not depend on the depth)
    visual = VisionTransformer(image_size=224, patch_size=32, width=768, layers=2, heads=12, mlp_ratio=4.0)
    pe = PairEncoder(visual, n_intra=1)
    assert pe.joint_positional_embedding.shape == (100, 768)            # 2 (n+1) for ViT-B/32 at 224 px
    n_new = sum(p.numel() for p in pe.new_parameters())
    assert n_new == 79_872                       # e1, e2 (768 each), p (100 x 768), ln_mid (2 x 768)
    # a sample std of 76,800 draws: ~0.3% sampling error, so 3% tells the init's std from any other
    assert_close(pe.joint_positional_embedding.std().item(), 768 ** -0.5, rtol=0.03)
    assert torch.equal(pe.ln_mid.weight, torch.ones(768)) and torch.equal(pe.ln_mid.bias, torch.zeros(768))


def test_invalid_splits_are_refused():
    visual = tiny_clip().visual
    with pytest.raises(ValueError, match="n_intra"):
        PairEncoder(visual, n_intra=DEPTH + 1)
    with pytest.raises(ValueError, match="joint=False"):
        PairEncoder(visual, n_intra=2, joint=False)


def test_images_do_not_interact_without_inter_layers_and_do_with_them():
    before, after = images()
    after2 = after + torch.randn_like(after)
    with torch.no_grad():
        for n_intra, interacts in ((DEPTH, False), (DEPTH - 1, True), (0, True)):
            pe = PairEncoder(tiny_clip().visual, n_intra=n_intra).eval()
            t1, _ = pe(before, after)
            t2, _ = pe(before, after2)
            check = assert_differ if interacts else assert_close
            check(t1[:, :N1], t2[:, :N1], **({"rtol": 1e-3} if interacts else {}),  # the before image's tokens
                  what=f"n_intra={n_intra}")
            assert_differ(t1[:, N1:], t2[:, N1:], rtol=1e-3)                 # the after tokens always change


@pytest.mark.parametrize("size", [160, 128])
def test_pair_vector_is_the_mean_of_the_two_cls_outputs(size):
    pe = PairEncoder(tiny_clip(image_size=size).visual, n_intra=2).eval()
    n1 = (size // 16) ** 2 + 1                                          # 101 and 65, not the public code's 50
    assert pe.cls_indices == (0, n1)
    before, after = images(size=size)
    with torch.no_grad():
        tokens, pair = pe(before, after)
        assert tokens.shape[1] == 2 * n1
        assert_close(pair, (tokens[:, 0] + tokens[:, n1]) / 2)
        assert_close(pair, manual_pair_forward(pe, before, after))


def test_intra_blocks_equal_open_clip_intermediate_output():
    clip = tiny_clip()
    pe = PairEncoder(clip.visual, n_intra=2)
    imgs = torch.cat(images())
    with torch.no_grad():
        mine = pe.run_blocks(pe.embed(imgs), 0, 2)
        ref = clip.visual.forward_intermediates(imgs, indices=[1], output_fmt="NLC", output_extra_tokens=True)
    expected = torch.cat([ref["image_intermediates_prefix"][0], ref["image_intermediates"][0]], dim=1)
    assert torch.equal(mine, expected)


def test_all_intra_plain_clip_reproduces_open_clip_encode_image():
    """Also on the kit's stand-in architecture: validates its JSON config and the wrapping together."""
    for name, size in ((TINY, 64), (clip_loader.STANDIN_CLIP, 112)):
        torch.manual_seed(0)
        clip = open_clip.create_model(name, pretrained=None).eval()
        pe = PairEncoder(clip.visual, n_intra=len(clip.visual.transformer.resblocks), joint=False)
        assert pe.new_parameters() == []
        before, after = images(size=size)
        with torch.no_grad():
            tokens, pair = pe(before, after)
            ref = clip.encode_image(torch.cat([before, after]))
        i_bef, i_aft = pe.cls_indices
        # Same ops; proj is applied to all tokens in one matmul here, so allow float re-association only.
        assert_close(tokens[:, i_bef], ref[:2])
        assert_close(tokens[:, i_aft], ref[2:])
        assert_close(pair, (ref[:2] + ref[2:]) / 2)


def test_sequence_first_attention_layout_gives_the_same_result():
    before, after = images()
    with torch.no_grad():
        pe = PairEncoder(tiny_clip().visual, n_intra=2).eval()
        expected, _ = pe(before, after)
        pe.visual.transformer.batch_first = False                     # open_clip's LND layout
        for block in pe.visual.transformer.resblocks:
            block.attn.batch_first = False
        got, _ = pe(before, after)
    assert_close(got, expected)


# --- retrieval model -----------------------------------------------------------------------------------------

def _check_partition(model, groups, sizes):
    """The groups cover every trainable parameter exactly once; sizes[i] (None: any) tensors in group i."""
    ids = [[id(p) for p in g["params"]] for g in groups]
    flat = [i for g in ids for i in g]
    assert len(flat) == len(set(flat)), "a parameter is in two groups"
    assert set(flat) == {id(p) for p in model.parameters() if p.requires_grad}
    for group, size in zip(ids, sizes):
        assert size is None or len(group) == size


def test_adaptation_param_groups_partition_clip_and_new_weights():
    from types import SimpleNamespace

    from idckit.tasks.clip4idc import AdaptTask

    model = CLIP4IDCRetrieval(tiny_clip(), n_intra=3)
    settings = SimpleNamespace(clip_lr_scale=1e-3, weight_decay=0.2, decay_rule="kit")   # all param_groups reads
    groups = AdaptTask.param_groups(settings, model)
    assert [(g["lr_scale"], g["weight_decay"]) for g in groups] == [(1e-3, 0.2), (1e-3, 0.0), (1.0, 0.0)]
    _check_partition(model, groups, [None, None, 5])                    # e1, e2, p, ln_mid weight and bias
    assert all(p.ndim >= 2 for p in groups[0]["params"])                # decay on CLIP's matrices only
    assert any(p is model.logit_scale for p in groups[1]["params"])
    assert model.clip.visual is None and not any(k.startswith("clip.visual") for k in model.state_dict())
    model.freeze_like_public_code()
    frozen = {id(model.clip.token_embedding.weight), id(model.pair_encoder.visual.conv1.weight)}
    assert not frozen & {id(p) for g in AdaptTask.param_groups(settings, model) for p in g["params"]}


def test_text_features_on_32_tokens_equal_open_clip_encode_text_on_the_full_context():
    clip = tiny_clip()
    ids = tokenize_captions(["the small red cube has been moved", "there is no change"], max_len=32)
    with torch.no_grad():
        ours = clip_text_features(clip, ids)
        ref = clip.encode_text(F.pad(ids, (0, 40 - 32)))
    assert_close(ours, ref)


def test_retrieval_logits_are_scaled_cosines():
    model = CLIP4IDCRetrieval(tiny_clip(), n_intra=3).eval()
    before, after = images(batch=3)
    ids = tokenize_captions(["a", "b c", "d e f"], max_len=32)
    with torch.no_grad():
        logits = model(before, after, ids)
        v, g = model.encode_pair(before, after), model.encode_text(ids)
    expected = model.logit_scale.exp() * F.cosine_similarity(g[:, None], v[None], dim=-1)
    assert logits.shape == (3, 3)
    assert_close(logits, expected)


# --- captioner -----------------------------------------------------------------------------------------------

def captioner(seed=0, **overrides):
    cfg = dataclasses.replace(TINY_CAPTIONER, **overrides)
    model = CLIP4IDCCaptioner(tiny_clip(seed), cfg).eval()
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # a non-trivial, non-zero head bias so logits are not tied across positions
        model.head_bias.normal_(std=0.1)
    return model


def test_teacher_forcing_shapes_loss_and_padding():
    model = captioner()
    before, after = images()
    ids = tokenize_captions(["the red cube moved", "a small sphere has been added to the scene"], max_len=12)
    assert ids[0, 0] == model.bos_id and model.eos_id in ids[0] and ids[0, -1] == model.pad_id
    with torch.no_grad():
        logits = model(before, after, ids[:, :-1])
        assert logits.shape == (2, 11, 49408)
        loss = mlm_loss(*model.teacher_forcing(model.encode(before, after), ids))
        targets = ids[:, 1:]
        logp = logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        mask = targets != 0
        assert_close(loss, -(logp * mask).sum() / mask.sum())
        # causal: changing what follows position t (the padding) leaves positions <= t alone
        changed = ids[:, :-1].clone()
        changed[0, 6:] = 1234
        assert_close(model(before, after, changed)[0, :6], logits[0, :6])


def test_visual_width_is_projected_and_embeddings_are_tied_to_clip():
    clip = tiny_clip()
    model = CLIP4IDCCaptioner(clip, TINY_CAPTIONER)
    assert isinstance(model.visual_proj, torch.nn.Linear) and model.visual_proj.in_features == 48
    assert torch.equal(model.word_embedding.weight, clip.token_embedding.weight)
    assert torch.equal(model.position_embedding.weight, clip.positional_embedding[:12])
    with pytest.raises(ValueError, match="tie_clip_embeddings"):
        CLIP4IDCCaptioner(tiny_clip(), model_config("clip4idc-paper", hidden=32, heads=2, ffn=64, max_len=12))
    untied = CLIP4IDCCaptioner(tiny_clip(), model_config("clip4idc-paper", hidden=32, heads=2, ffn=64,
                                                         max_len=12, tie_clip_embeddings=False,
                                                         freeze_clip_embeddings=False))
    assert untied.word_embedding.weight.shape == (49408, 32)


def test_captioner_param_groups_and_frozen_visual():
    model = captioner()
    groups = model.param_groups(lr_visual=1e-7, lr_caption=1e-4)
    _check_partition(model, groups, [len(list(model.pair_encoder.parameters())), None])
    assert {id(p) for p in model.pair_encoder.new_parameters()} <= {id(p) for p in groups[0]["params"]}
    frozen = captioner(freeze_visual=True)
    groups = frozen.param_groups(1e-7, 1e-4)
    assert groups[0]["params"] == [] and groups[1]["params"]
    _check_partition(frozen, groups, [0, None])


def sharpen_cross_attention(model):
    """At N(0, 0.02) init cross-attention is nearly uniform, which hides any order information; sharpen it."""
    for layer in model.decoder:
        layer.cross_attn.query.weight.normal_(std=0.5)
        layer.cross_attn.key.weight.normal_(std=0.5)


def test_difference_tokens_append_a_projection_of_after_minus_before_per_position():
    before, after = images()
    with torch.no_grad():
        plain, diff = captioner(), captioner(difference_tokens=True)
        assert plain.difference_proj is None
        tokens = diff.pair_encoder(before, after)[0]                      # [B, 2(n+1), D]
        n1 = tokens.shape[1] // 2
        diff.difference_proj.bias.normal_(std=0.1)
        # the memory is the caption encoder run over [projected pair tokens; W (after - before) + b]
        enc_in = torch.cat([diff.visual_proj(tokens), diff.difference_proj(tokens[:, n1:] - tokens[:, :n1])], 1)
        x = enc_in
        for layer in diff.encoder:
            x = layer(x)
        memories = diff.encode(before, after)
        assert memories[-1].shape == (tokens.shape[0], 3 * n1, diff.cfg.hidden)
        assert_close(memories[-1], x)
        # the plain captioner's parameters are the variant's minus the one new linear map
        extra = sum(p.numel() for p in diff.difference_proj.parameters())
        assert sum(p.numel() for p in diff.parameters()) - sum(p.numel() for p in plain.parameters()) == extra


def test_clip_ft_is_symmetric_in_the_two_images_unless_segments_are_embedded():
    before, after = images()
    ids = tokenize_captions(["the cube is gone"], max_len=12).expand(2, -1)[:, :-1]
    with torch.no_grad():
        literal = captioner(variant="clip-ft", segment_embedding=False)
        assert literal.pair_encoder.n_inter == 0 and not literal.pair_encoder.joint and literal.segment is None
        sharpen_cross_attention(literal)
        assert_close(literal(before, after, ids), literal(after, before, ids))
        kit = captioner(variant="clip-ft")
        sharpen_cross_attention(kit)
        kit.segment.weight.normal_(std=1.0)
        assert_differ(kit(before, after, ids), kit(after, before, ids), rtol=1e-3)   # vs close above


@pytest.mark.parametrize("overrides", [{}, {"cross_attention": "last"}, {"variant": "clip-ft"},
                                       {"n_intra": 0}])
def test_decode_step_equals_full_logits_at_every_position(overrides):
    model = captioner(**overrides)
    visual = images(batch=3)
    ids = tokenize_captions(["the red cube moved", "no change", "a big metal cylinder was added"],
                            max_len=12)[:, :-1]
    with torch.inference_mode():
        full = model.full_logits(visual, ids)
        state = model.start_decoding(visual)
        for t in range(ids.shape[1]):
            assert_close(model.decode_step(state, ids[:, t]), full[:, t], rtol=1e-4)
        assert state.position == 11 and state.self_kv[0][0].shape == (3, 2, 11, 32)
        model.decode_step(state, ids[:, 0])                             # position 11 is the last of max_len 12
        with pytest.raises(ValueError, match="max_len"):
            model.decode_step(state, ids[:, 0])


def test_reorder_state_selects_batch_rows():
    model = captioner()
    visual = images(batch=3)
    ids = tokenize_captions(["a b c", "d e", "f"], max_len=12)
    index = torch.tensor([2, 0, 0])
    with torch.inference_mode():
        state = model.start_decoding(visual)
        for t in range(3):
            model.decode_step(state, ids[:, t])
        picked = model.reorder_state(state, index)
        got = model.decode_step(picked, ids[index, 3])
        ref = model.full_logits(tuple(v[index] for v in visual), ids[index, :4])[:, 3]
    assert_close(got, ref, rtol=1e-4)


def test_cached_greedy_decoding_equals_naive_greedy_decoding():
    from idckit.models import decoding
    model = captioner(seed=3)
    visual = images(batch=4, seed=5)
    with torch.inference_mode():
        cached = decoding.greedy_decode(model, visual, max_len=11)
        naive = decoding.naive_greedy_decode(model, visual, max_len=11)
    assert cached.shape[0] == 4 and cached.shape[1] <= 11
    assert torch.equal(cached, naive)


def test_paper_sized_captioner_matches_table5_parameter_counts():
    """Table 5: 135.57M (CLIP-FT) and 135.65M (CLIP4IDC), counted with the public code's 77 decoder position
    rows; the kit keeps max_len = 32 rows, i.e. 45 x 512 = 23,040 fewer."""
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-B-32", pretrained=None)
    for variant, paper in (("clip-ft", 135.57e6), ("clip4idc", 135.65e6)):
        cfg = dataclasses.replace(model_config("clip4idc-paper"), variant=variant, segment_embedding=False)
        n = sum(p.numel() for p in CLIP4IDCCaptioner(clip, cfg).parameters()) + 45 * 512
        assert abs(n - paper) < 0.01e6, (variant, n)
