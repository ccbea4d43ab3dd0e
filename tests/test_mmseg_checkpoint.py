"""mmsegmentation Swin checkpoints (the public FedHCA² code's starting point) load into swin_t.

The files are written here from a randomly initialised fedmtl swin_t encoder through the inverse
map (``to_mmseg_swin``), laid out as mmseg's UperNet checkpoints are: ``{"meta", "state_dict"}``
with ``backbone.*`` (including the ``relative_position_index`` buffers), ``decode_head.*`` and
``auxiliary_head.*``. 64×64 images keep the encoders small and fast.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedmtl.models import create_encoder
from fedmtl.models.mmseg_swin import from_mmseg_swin, is_mmseg_swin, to_mmseg_swin

SIZE = (64, 64)
BACKBONE = "swin_tiny_patch4_window7_224"


def _mmseg_relative_position_index(window: int = 7) -> torch.Tensor:
    """mmseg's ``WindowMSA`` buffer, by its own formula (``double_step_seq``, then flip)."""
    step = 2 * window - 1
    coords = (torch.arange(0, step * window, step)[:, None] + torch.arange(window)[None, :]).reshape(1, -1)
    return (coords + coords.T).flip(1)


@pytest.fixture(scope="module")
def source():
    """A swin_t encoder whose every LayerNorm (patch merging ones included) has random affine
    parameters, so a wrong reorder of a norm or a lost stage norm cannot go unnoticed."""
    torch.manual_seed(0)
    encoder = create_encoder("swin_t", img_size=SIZE)
    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_()
                module.bias.normal_()
    return encoder


def _mmseg_checkpoint(encoder) -> dict[str, torch.Tensor]:
    state = to_mmseg_swin(encoder.state_dict())
    for key in [k for k in state if k.endswith("attn.w_msa.qkv.weight")]:
        state[key.replace("qkv.weight", "relative_position_index")] = _mmseg_relative_position_index()
    state["decode_head.conv_seg.weight"] = torch.randn(150, 512, 1, 1)
    state["decode_head.lateral_convs.0.conv.weight"] = torch.randn(512, 96, 1, 1)
    state["auxiliary_head.conv_seg.weight"] = torch.randn(150, 256, 1, 1)
    return state


def _save(tmp_path, state, name="upernet_swin_tiny_ade20k.pth"):
    path = tmp_path / name
    torch.save({"meta": {"iter": 160000, "mmseg_version": "0.x"}, "state_dict": state}, path)
    return path


def test_the_inverse_map_writes_mmsegs_key_names(source):
    state = _mmseg_checkpoint(source)
    for key in [
        "backbone.patch_embed.projection.weight",
        "backbone.patch_embed.norm.weight",
        "backbone.stages.0.blocks.0.norm1.weight",
        "backbone.stages.0.blocks.0.attn.w_msa.relative_position_bias_table",
        "backbone.stages.0.blocks.0.attn.w_msa.relative_position_index",
        "backbone.stages.0.blocks.0.attn.w_msa.qkv.weight",
        "backbone.stages.0.blocks.0.attn.w_msa.proj.weight",
        "backbone.stages.0.blocks.0.ffn.layers.0.0.weight",
        "backbone.stages.0.blocks.0.ffn.layers.1.weight",
        "backbone.stages.0.downsample.norm.weight",
        "backbone.stages.0.downsample.reduction.weight",
        "backbone.stages.2.downsample.reduction.weight",
        *(f"backbone.norm{i}.{p}" for i in range(4) for p in ("weight", "bias")),
    ]:
        assert key in state, key
    assert state["backbone.stages.0.downsample.reduction.weight"].shape == (192, 384)  # 4·96 -> 2·96
    assert not any(k.startswith("backbone.stages.3.downsample") for k in state)  # mmseg: none after stage 3
    assert not any(".layers_" in k or "mlp." in k or k.startswith("backbone.body") for k in state)
    assert is_mmseg_swin(state) and not is_mmseg_swin(source.state_dict())


def test_the_conversion_is_pure_and_the_inverse_inverts_it(source):
    own = source.state_dict()
    state = to_mmseg_swin(own)
    before = {k: v.clone() for k, v in state.items()}
    back = from_mmseg_swin(state)
    assert all(torch.equal(state[k], before[k]) for k in before)
    assert list(back) == list(own)
    assert all(torch.equal(back[k], own[k]) for k in own)
    # the reorder is not the identity: the merged-channel tensors really move
    key = "body.layers_1.downsample.reduction.weight"
    assert not torch.equal(state["backbone.stages.0.downsample.reduction.weight"], own[key])


def test_an_mmseg_checkpoint_loads_every_tensor_of_the_encoder(source, tmp_path, capsys):
    """Heads and relative_position_index buffers are ignored; a strict load says nothing."""
    path = _save(tmp_path, _mmseg_checkpoint(source))
    loaded = create_encoder("swin_t", img_size=SIZE, pretrained_file=path)
    assert capsys.readouterr() == ("", "")
    expected = source.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    x = torch.randn(1, 3, *SIZE)
    with torch.no_grad():
        # eval: timm's Swin drops paths at random in training mode (drop_path_rate 0.1)
        for a, b in zip(loaded.eval()(x), source.eval()(x), strict=True):
            assert torch.equal(a, b)


def test_a_backbone_only_mmseg_file_loads_too(source, tmp_path):
    """swin2mmseg's output and mmseg backbone exports carry no ``backbone.`` prefix."""
    path = tmp_path / "swin_tiny_mmseg.pth"
    torch.save(to_mmseg_swin(source.state_dict(), prefix=""), path)
    loaded = create_encoder("swin_t", img_size=SIZE, pretrained_file=path).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items())


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_the_patch_merging_reorder_matches_mmsegs_unfold_math(source, stage):
    """mmseg's PatchMerging by hand (nn.Unfold k=2 s=2 on NCHW, then LayerNorm, then Linear)
    with the file's weights equals timm's PatchMerging with the converted weights."""
    merge = source.body.get_submodule(f"layers_{stage + 1}.downsample")
    mm = to_mmseg_swin(source.state_dict())
    prefix = f"backbone.stages.{stage}.downsample."
    c = source.channels[stage]
    x = torch.randn(2, 8, 6, c)  # NHWC, as between Swin stages

    def mmseg_merge(reduction, norm_weight, norm_bias):
        cols = nn.Unfold(kernel_size=2, stride=2)(x.permute(0, 3, 1, 2)).transpose(1, 2)  # B, L, 4C
        out = F.linear(F.layer_norm(cols, (4 * c,), norm_weight, norm_bias), reduction)
        return out.reshape(2, 4, 3, 2 * c)

    with torch.no_grad():
        expected = merge(x)
        got = mmseg_merge(
            mm[prefix + "reduction.weight"], mm[prefix + "norm.weight"], mm[prefix + "norm.bias"]
        )
        unconverted = mmseg_merge(merge.reduction.weight, merge.norm.weight, merge.norm.bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unconverted, expected, atol=1e-2)


def test_mmsegs_relative_position_index_is_timms_so_the_buffer_can_be_dropped(source):
    timm_index = source.body.layers_0.blocks[0].attn.relative_position_index
    assert torch.equal(timm_index, _mmseg_relative_position_index())


def test_a_missing_tensor_is_refused_by_its_mmseg_name_and_counted_when_not_strict(source, tmp_path, capsys):
    state = _mmseg_checkpoint(source)
    gone = "backbone.stages.1.blocks.0.attn.w_msa.qkv.weight"
    del state[gone]
    del state["backbone.norm2.bias"]
    path = _save(tmp_path, state)
    total = len(source.state_dict())
    with pytest.raises(ValueError) as err:
        create_encoder("swin_t", img_size=SIZE, pretrained_file=path)
    message = str(err.value)
    assert "\n" not in message
    assert f"{path} (mmsegmentation Swin layout) does not fit backbone '{BACKBONE}'" in message
    assert f"{total - 2} of {total} tensors match (2 missing, 0 unexpected, 0 shape mismatches" in message
    assert f"missing: {gone}, backbone.norm2.bias)" in message
    assert "pretrained_strict: false" in message

    loaded = create_encoder("swin_t", img_size=SIZE, pretrained_file=path, pretrained_strict=False)
    out, err_text = capsys.readouterr()
    assert out == ""
    assert err_text.splitlines() == [
        f"pretrained weights: loaded {total - 2} of {total} tensors of {BACKBONE} from {path} "
        f"(mmsegmentation Swin layout) (2 missing, 0 unexpected, 0 shape mismatches)"
    ]
    got, expected = loaded.state_dict(), source.state_dict()
    not_loaded = {"body.layers_1.blocks.0.attn.qkv.weight", "norms.2.bias"}
    for key, value in expected.items():
        assert torch.equal(got[key], value) != (key in not_loaded), key
    assert torch.equal(got["norms.2.bias"], torch.zeros(384))  # its init


def test_a_foreign_backbone_tensor_and_a_wrong_shape_are_named_as_in_the_file(source, tmp_path):
    state = _mmseg_checkpoint(source)
    state["backbone.absolute_pos_embed"] = torch.zeros(1, 3136, 96)
    state["backbone.stages.0.downsample.reduction.weight"] = torch.zeros(192, 96)
    path = _save(tmp_path, state)
    with pytest.raises(ValueError) as err:
        create_encoder("swin_t", img_size=SIZE, pretrained_file=path)
    message = str(err.value)
    assert "(0 missing, 1 unexpected, 1 shape mismatches" in message
    assert (
        "shape mismatches: backbone.stages.0.downsample.reduction.weight (192, 96) vs (192, 384)" in message
    )
    assert "unexpected: backbone.absolute_pos_embed" in message


def test_a_timm_swin_file_leaves_the_stage_norms_at_their_init(tmp_path, capsys):
    """A timm (ImageNet classifier) file has no stage norms: they are neither missing nor
    loaded, as mmseg leaves its norm0..3 when it starts from an ImageNet checkpoint."""
    import timm

    torch.manual_seed(1)
    path = tmp_path / "swin_t_timm.pth"
    torch.save(timm.create_model(BACKBONE).state_dict(), path)
    encoder = create_encoder("swin_t", img_size=(224, 224), pretrained_file=path)
    assert capsys.readouterr() == ("", "")
    for norm in encoder.norms:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
        assert torch.equal(norm.bias, torch.zeros_like(norm.bias))
