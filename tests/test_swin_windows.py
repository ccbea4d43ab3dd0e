"""Swin's shifted windows in mmsegmentation's order (fedmtl/models/swin_windows.py).

The expected values are written from mmseg's recipe (``ShiftWindowMSA.forward`` in
mmseg/models/backbones/swin.py), not from the implementation: pad the map at the bottom and
right to multiples of 7, roll it by -3, label it per axis with the slices (0, -7), (-7, -3),
(-3, None) (region id 3 * row_region + col_region), mask pairs of different regions with -100
and nothing else (padding included), attend per window, reverse, roll back by +3, crop.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from timm.models.swin_transformer import SwinTransformerBlock

from fedmtl.models.backbone import create_encoder
from fedmtl.models.swin_windows import (
    MASKED,
    MmsegWindowBlock,
    padded_size,
    shifted_window_mask,
    use_mmseg_windows,
    window_regions,
)

WINDOW, SHIFT = 7, 3
# A tiny Swin-T: same stages and windows, 8 channels (timm kwargs through create_encoder).
TINY_SWIN = {"embed_dim": 8, "depths": (2, 2, 2, 2), "num_heads": (1, 1, 2, 2)}

# The 14×14 region ids of a 9×9 map padded to 14×14 and rolled by 3, from mmseg's slices:
# rows / columns [0, 7) -> 0, [7, 11) -> 1, [11, 14) -> 2; id = 3 * row_region + col_region.
REGIONS_14 = ["00000001111222"] * 7 + ["33333334444555"] * 4 + ["66666667777888"] * 3


def _block(shift: int = SHIFT, size: tuple[int, int] = (9, 9), seed: int = 0) -> SwinTransformerBlock:
    """A timm block, dim 8, 2 heads, 7×7 windows, kept whole on any map; random weights with a
    relative-position table large enough to matter."""
    torch.manual_seed(seed)
    block = SwinTransformerBlock(
        dim=8, input_resolution=size, num_heads=2, window_size=WINDOW, shift_size=shift, always_partition=True
    )
    with torch.no_grad():
        block.attn.relative_position_bias_table.normal_(0, 1)
        for norm in (block.norm1, block.norm2):
            norm.weight.normal_(1, 0.2)
            norm.bias.normal_(0, 0.2)
    return block.eval()


def _mmseg(block: SwinTransformerBlock) -> MmsegWindowBlock:
    converted = copy.deepcopy(block)
    assert use_mmseg_windows(converted) == 1
    return converted


def _reference_attention(
    block: SwinTransformerBlock, x: torch.Tensor, mask_padding: bool = False
) -> torch.Tensor:
    """mmseg's window attention written out token by token, with ``block``'s qkv, relative
    position bias and proj: explicit pad -> roll -> attention per window with the region mask
    -> unroll -> crop. ``mask_padding``: also mask padded keys (mmseg does not; for contrast)."""
    batch, height, width, channels = x.shape
    shift = block.shift_size[0]
    padded_h = -(-height // WINDOW) * WINDOW
    padded_w = -(-width // WINDOW) * WINDOW
    padded = torch.zeros(batch, padded_h, padded_w, channels)
    padded[:, :height, :width] = x
    is_pad = torch.ones(padded_h, padded_w, dtype=torch.bool)
    is_pad[:height, :width] = False
    if shift:
        padded = torch.roll(padded, shifts=(-shift, -shift), dims=(1, 2))
        is_pad = torch.roll(is_pad, shifts=(-shift, -shift), dims=(0, 1))

    def region(i: int, n: int) -> int:  # mmseg's slices (0, -7), (-7, -shift), (-shift, None)
        if not shift or i < n - WINDOW:
            return 0
        return 1 if i < n - shift else 2

    heads = block.attn.num_heads
    head_dim = channels // heads
    table = block.attn.relative_position_bias_table  # [(2*7-1)**2, heads]
    local = [(a, b) for a in range(WINDOW) for b in range(WINDOW)]
    bias = torch.stack(
        [
            torch.stack(
                [
                    table[(ya - yb + WINDOW - 1) * (2 * WINDOW - 1) + (xa - xb + WINDOW - 1)]
                    for yb, xb in local
                ]
            )
            for ya, xa in local
        ]
    ).permute(2, 0, 1)  # [heads, 49, 49]
    out = torch.zeros_like(padded)
    for top in range(0, padded_h, WINDOW):
        for left in range(0, padded_w, WINDOW):
            coords = [(top + a, left + b) for a, b in local]
            tokens = torch.stack([padded[:, y, x] for y, x in coords], dim=1)  # [B, 49, C]
            labels = torch.tensor([3 * region(y, padded_h) + region(x, padded_w) for y, x in coords])
            mask = torch.where(labels[:, None] == labels[None, :], 0.0, -100.0)
            if mask_padding:
                pad_keys = torch.tensor([bool(is_pad[y, x]) for y, x in coords])
                mask = mask.masked_fill(pad_keys[None, :], float("-inf"))
            q, k, v = block.attn.qkv(tokens).view(batch, WINDOW**2, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            logits = (q * head_dim**-0.5) @ k.transpose(-2, -1) + bias + mask
            attended = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, WINDOW**2, channels)
            attended = block.attn.proj(attended)
            for n, (y, x) in enumerate(coords):
                out[:, y, x] = attended[:, n]
    if shift:
        out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
    return out[:, :height, :width]


def _reference_block(block: SwinTransformerBlock, x: torch.Tensor) -> torch.Tensor:
    """mmseg's SwinBlock: x + attn(norm1(x)), then + ffn(norm2(.)), with ``block``'s weights."""
    x = x + _reference_attention(block, block.norm1(x))
    return x + block.mlp(block.norm2(x))


# ---------------------------------------------------------------- the mask, by hand


def test_a_9x9_map_is_padded_to_14x14_and_a_1x1_map_to_7x7():
    assert padded_size(9, 9, (7, 7)) == (14, 14)
    assert padded_size(1, 1, (7, 7)) == (7, 7)
    assert padded_size(14, 18, (7, 7)) == (14, 21)  # the paper's 448×576 last stage
    assert padded_size(16, 16, (7, 7)) == (21, 21)  # the paper's 512×512 last stage


def test_region_ids_of_the_padded_and_shifted_9x9_map():
    expected = torch.tensor([[int(c) for c in row] for row in REGIONS_14])
    assert torch.equal(window_regions(14, 14, (7, 7), (3, 3)), expected)


def test_region_ids_of_a_1x1_map_padded_to_one_window_still_shifted_by_3():
    # slices of 7: (0, -7) is empty, (-7, -3) = [0, 4), (-3, None) = [4, 7)
    expected = torch.tensor([[int(c) for c in row] for row in ["4444555"] * 4 + ["7777888"] * 3])
    assert torch.equal(window_regions(7, 7, (7, 7), (3, 3)), expected)


def test_which_pairs_each_window_of_the_9x9_map_masks():
    """Windows of 7×7 over the 14×14 map, row-major: (0, 0) is all region 0; (0, 1) splits its
    columns 4 | 3 (regions 1, 2); (1, 0) its rows 4 | 3 (regions 3, 6); (1, 1) both (4, 5, 7, 8)."""
    mask = shifted_window_mask(14, 14, (7, 7), (3, 3))
    assert mask.shape == (4, 49, 49) and mask.dtype == torch.float32
    assert set(mask.unique().tolist()) == {0.0, MASKED}
    rows_group = [0] * 4 + [1] * 3  # within a lower window: local rows 0-3 | 4-6
    group_of = {
        0: lambda a, b: 0,
        1: lambda a, b: rows_group[b],
        2: lambda a, b: rows_group[a],
        3: lambda a, b: 2 * rows_group[a] + rows_group[b],
    }
    for w, group in group_of.items():
        groups = torch.tensor([group(a, b) for a in range(7) for b in range(7)])
        expected = torch.where(groups[:, None] == groups[None, :], 0.0, MASKED)
        assert torch.equal(mask[w], expected), w
    # masked pairs per window: none; 2*28*21; 2*28*21; 49**2 - (16**2 + 12**2 + 12**2 + 9**2)
    assert [(m == MASKED).sum().item() for m in mask] == [0, 1176, 1176, 1776]


def test_padded_tokens_are_not_masked():
    """Shifted position p of an axis holds padded-map index (p + 3) mod 14; 9..13 is padding.
    Window (0, 0): token (0, 0) is the real (3, 3), token (6, 0) the padded (9, 3): same
    region, attended. Window (0, 1): token (0, 11) is the real (3, 0), token (6, 11) the padded
    (9, 0). Every pair of one region is unmasked, padding or not."""
    mask = shifted_window_mask(14, 14, (7, 7), (3, 3))
    assert mask[0, 0, 6 * 7 + 0] == 0 and mask[0, 6 * 7 + 0, 0] == 0
    assert mask[1, 0 * 7 + 4, 6 * 7 + 4] == 0  # window (0, 1), local column 4 = shifted column 11
    regions = window_regions(14, 14, (7, 7), (3, 3))
    original = (torch.arange(14) + 3) % 14
    is_pad = (original[:, None] >= 9) | (original[None, :] >= 9)
    windows = [(slice(r, r + 7), slice(c, c + 7)) for r in (0, 7) for c in (0, 7)]
    real_pad_pairs = 0
    for w, (rows, cols) in enumerate(windows):
        ids, pad = regions[rows, cols].flatten(), is_pad[rows, cols].flatten()
        same = ids[:, None] == ids[None, :]
        assert torch.all(mask[w][same] == 0)
        real_pad_pairs += (same & ~pad[:, None] & pad[None, :]).sum().item()
    assert real_pad_pairs > 0


def test_the_mask_is_built_on_the_asked_device_and_dtype():
    mask = shifted_window_mask(7, 14, (7, 7), (3, 3), device=torch.device("cpu"), dtype=torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and mask.shape == (2, 49, 49)
    assert set(mask.unique().tolist()) == {0.0, MASKED}  # -100 is exact in bfloat16


# ---------------------------------------------------------------- one block


@pytest.mark.parametrize("size", [(9, 9), (1, 1), (4, 11), (14, 14), (8, 16)])
@pytest.mark.parametrize("shift", [SHIFT, 0])
def test_the_block_computes_mmsegs_recipe(size, shift):
    block = _block(shift, size)
    converted = _mmseg(block)
    x = torch.randn(2, *size, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            converted._attn(block.norm1(x)), _reference_attention(block, block.norm1(x))
        )
        torch.testing.assert_close(converted(x), _reference_block(block, x))


def test_padding_takes_part_in_attention_as_in_mmseg():
    """Masking the padded keys too would give another function: mmseg does not mask them."""
    block = _mmseg(_block())
    x = torch.randn(1, 9, 9, 8)
    with torch.no_grad():
        masked = _reference_attention(block, block.norm1(x), mask_padding=True)
        assert (block._attn(block.norm1(x)) - masked).abs().max() > 1e-3


def test_timms_order_differs_on_a_9x9_map_with_the_same_weights():
    block = _block()
    x = torch.randn(2, 9, 9, 8)
    with torch.no_grad():
        timm_out, mmseg_out = block(x), _mmseg(block)(x)
    assert (timm_out - mmseg_out).abs().max() > 1e-2
    # also without always_partition (timm's default; a 9×9 map keeps its window and shift)
    torch.manual_seed(1)
    plain = SwinTransformerBlock(
        dim=8, input_resolution=(9, 9), num_heads=2, window_size=7, shift_size=3
    ).eval()
    plain.load_state_dict(block.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(plain(x), timm_out)


def test_timms_order_equals_mmsegs_without_padding():
    block = _block(size=(14, 14))
    x = torch.randn(2, 14, 14, 8)
    with torch.no_grad():
        torch.testing.assert_close(_mmseg(block)(x), block(x))


def test_conversion_keeps_parameters_and_keys_and_survives_copy_and_pickle():
    block = _block()
    converted = _mmseg(block)
    assert type(converted) is MmsegWindowBlock and isinstance(converted, SwinTransformerBlock)
    assert converted.attn_mask is None  # timm's precomputed mask (its order, one size) is dropped
    state, source = converted.state_dict(), block.state_dict()
    assert list(state) == list(source) and all(torch.equal(state[k], source[k]) for k in state)
    x = torch.randn(1, 9, 9, 8)
    with torch.no_grad():
        expected = converted(x)
        for clone in (copy.deepcopy(converted), pickle.loads(pickle.dumps(converted))):
            assert type(clone) is MmsegWindowBlock
            torch.testing.assert_close(clone(x), expected, rtol=0, atol=0)


def test_blocks_with_clipped_windows_are_refused():
    clipped = SwinTransformerBlock(dim=8, input_resolution=(4, 4), num_heads=2, window_size=7, shift_size=3)
    assert clipped.window_size == (4, 4) and clipped.shift_size == (0, 0)  # timm's clipping
    with pytest.raises(ValueError, match="always_partition=True"):
        use_mmseg_windows(clipped)


# ---------------------------------------------------------------- the encoder


def _blocks(encoder) -> list[SwinTransformerBlock]:
    return [m for m in encoder.modules() if isinstance(m, SwinTransformerBlock)]


def test_timm_option_is_timms_features_body_exactly():
    import timm

    encoder = create_encoder("swin_t", img_size=(64, 64), swin_windows="timm", **TINY_SWIN).eval()
    assert {type(b) for b in _blocks(encoder)} == {SwinTransformerBlock}
    body = timm.create_model(
        "swin_tiny_patch4_window7_224",
        features_only=True,
        out_indices=(-4, -3, -2, -1),
        img_size=(64, 64),
        **TINY_SWIN,
    ).eval()
    body.load_state_dict(encoder.body.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for ours, theirs in zip(encoder.body(x), body(x), strict=True):
            assert torch.equal(ours, theirs)


def test_mmseg_option_keeps_the_state_dict_keys_and_mmsegs_table_shapes():
    """Same keys as timm's order at any size; the same shapes from 224 a side up. Below, timm
    shrinks the windows of small maps (and their tables); mmseg's order keeps 13×13 tables, the
    shape of mmseg checkpoints, at every size."""
    for size in [(224, 224), (64, 64)]:
        mmseg = create_encoder("swin_t", img_size=size, **TINY_SWIN).state_dict()  # the default
        timm_order = create_encoder("swin_t", img_size=size, swin_windows="timm", **TINY_SWIN).state_dict()
        assert list(mmseg) == list(timm_order)
        tables = [k for k in mmseg if k.endswith("relative_position_bias_table")]
        assert len(tables) == 8 and all(mmseg[k].shape[0] == 13 * 13 for k in tables)
        same_shapes = all(mmseg[k].shape == timm_order[k].shape for k in mmseg)
        assert same_shapes == (size == (224, 224))


def test_encoder_orders_agree_only_where_no_stage_pads_or_loses_its_shift():
    """224×224: stage maps 56, 28, 14, 7, multiples of 7. The first three stages agree; on the
    7×7 map timm drops the shift (mmseg keeps it), unless built with always_partition.
    64×64 (maps 16, 8, 4, 2): every stage pads, every stage differs."""
    torch.manual_seed(0)
    mmseg = create_encoder("swin_t", img_size=(224, 224), **TINY_SWIN).eval()
    timm_order = create_encoder("swin_t", img_size=(224, 224), swin_windows="timm", **TINY_SWIN).eval()
    unclipped = create_encoder(
        "swin_t", img_size=(224, 224), swin_windows="timm", always_partition=True, **TINY_SWIN
    ).eval()
    for other in (timm_order, unclipped):
        other.load_state_dict(mmseg.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ours, theirs, whole = mmseg(x), timm_order(x), unclipped(x)
    for stage in range(3):
        torch.testing.assert_close(ours[stage], theirs[stage])
    assert (ours[3] - theirs[3]).abs().max() > 1e-3
    for a, b in zip(ours, whole, strict=True):
        torch.testing.assert_close(a, b)

    small = create_encoder("swin_t", img_size=(64, 64), **TINY_SWIN).eval()
    small_timm = create_encoder("swin_t", img_size=(64, 64), swin_windows="timm", **TINY_SWIN).eval()
    shared = small_timm.state_dict()
    small.load_state_dict(
        {k: v for k, v in shared.items() if v.shape == small.state_dict()[k].shape}, strict=False
    )
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert all((a - b).abs().max() > 1e-4 for a, b in zip(small(x), small_timm(x), strict=True))


def test_mmseg_order_runs_on_small_non_square_channels_last_and_autocast_inputs():
    """32×48 images: stage maps 8×12, 4×6, 2×3, 1×2, each padded to 7-multiples and shifted."""
    torch.manual_seed(0)
    encoder = create_encoder("swin_t", img_size=(32, 48), **TINY_SWIN).eval()  # eval: no drop path
    assert all(b.window_size == (7, 7) for b in _blocks(encoder))
    assert [b.shift_size for b in _blocks(encoder)] == [(0, 0), (3, 3)] * 4
    x = torch.randn(2, 3, 32, 48)
    features = encoder(x.contiguous(memory_format=torch.channels_last))
    assert [tuple(f.shape) for f in features] == [(2, 8, 8, 12), (2, 16, 4, 6), (2, 32, 2, 3), (2, 64, 1, 2)]
    with torch.no_grad():
        for a, b in zip(features, encoder(x), strict=True):
            torch.testing.assert_close(a, b)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = encoder(x)
    for a, b in zip(low, features, strict=True):  # bfloat16 keeps 8 bits of mantissa
        assert a.dtype == torch.bfloat16 and torch.isfinite(a).all()
        assert ((a.float() - b.detach()).norm() / b.norm()).item() < 0.05
    sum(f.square().mean() for f in features).backward()
    assert all(b.attn.relative_position_bias_table.grad.abs().sum() > 0 for b in _blocks(encoder))


def test_a_cnn_backbone_ignores_the_option():
    torch.manual_seed(0)
    mmseg = create_encoder(swin_windows="mmseg").eval()
    timm_order = create_encoder(swin_windows="timm").eval()
    timm_order.load_state_dict(mmseg.state_dict())
    assert not _blocks(mmseg)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        for a, b in zip(mmseg(x), timm_order(x), strict=True):
            assert torch.equal(a, b)


def test_create_encoder_refuses_an_unknown_order():
    with pytest.raises(
        ValueError, match=r"swin_windows must be one of \['mmseg', 'timm'\], got 'mmsegmentation'"
    ):
        create_encoder("swin_t", swin_windows="mmseg" + "mentation")


# ---------------------------------------------------------------- config and plumbing


def test_model_config_defaults_to_mmseg_and_refuses_other_values():
    from fedmtl.config import ModelConfig

    assert ModelConfig().swin_windows == "mmseg"
    with pytest.raises(ValueError, match=r"^model.swin_windows must be mmseg or timm, got 'timm2' \(mmseg: "):
        ModelConfig(swin_windows="timm2")


def test_a_bad_swin_windows_value_is_one_error_line(tmp_path, data_root, capsys):
    from tests.helpers import fit_refused, tiny_config

    config = tiny_config(tmp_path, data_root)
    lines = fit_refused(config, tmp_path / "run", capsys, "--model.swin_windows", "mmsegmentation")
    assert len(lines) == 1, lines
    assert lines[0].startswith('error: Parser key "model.swin_windows": Expected a typing.Literal')
    assert "'mmseg', 'timm'" in lines[0] and "mmsegmentation" in lines[0]


def test_the_client_model_gets_the_configs_order():
    from fedmtl.config import ModelConfig
    from fedmtl.federated.client import ClientModule, ClientSpec

    spec = ClientSpec("c", "nyud", ("semseg",), local_epochs=1, batch_size=1, train_indices=(0,))
    module = ClientModule(spec, ModelConfig(backbone="swin_t", swin_windows="timm"), 1, img_size=(32, 32))
    blocks = _blocks(module.model.encoder)
    assert blocks and {type(b) for b in blocks} == {SwinTransformerBlock}


def test_only_timms_order_lets_the_first_row_see_the_last_on_a_9x9_map():
    """Rolled by -3, rows 0..2 wrap around. mmseg (pad, then roll): they sit in shifted rows
    11..13, region 2, apart from everything else of their window (padding rows 10..13 in region
    1). timm (roll, then pad): row 0 sits in shifted row 6, region 0, in one window with rows
    3..8, so the last row is one of its keys, unmasked."""
    block = _block()
    x = torch.randn(1, 9, 9, 8)
    changed = x.clone()
    changed[:, 8] = torch.randn(1, 9, 8)  # the last row only
    with torch.no_grad():
        for order, expect_change in ((block, True), (_mmseg(block), False)):
            first_row = order._attn(block.norm1(x))[:, 0], order._attn(block.norm1(changed))[:, 0]
            assert bool((first_row[0] - first_row[1]).abs().max() > 1e-4) == expect_change
