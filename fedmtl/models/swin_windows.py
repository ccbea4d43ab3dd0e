"""Swin's shifted windows in mmsegmentation's order: pad first, then shift.

Why: the public FedHCA² encoder is mmsegmentation's Swin: innovator-zero/FedHCA2
``models/swin.py`` is a copy of mmseg's ``mmseg/models/backbones/swin.py`` (its docstring names
the mmseg commit), whose ``ShiftWindowMSA.forward`` pads, then rolls, as described below (read
in both files); fedmtl builds timm's (``SwinTransformerBlock._attn``). Both
attend inside 7×7 windows, every other block on windows shifted by 3, and both pad a map whose
sides are not multiples of 7 at the bottom and right with zeros. They do it in a different order:

* mmseg pads the (H, W) map to (Hp, Wp), multiples of the window, *then* rolls it by -shift,
  labels the rolled padded map with the slices ``(0, -window), (-window, -shift), (-shift,
  None)`` per axis (region id ``3 * row_region + col_region``), masks with -100 every pair of a
  window whose regions differ, attends, reverses the windows, rolls back by +shift and crops.
  It never clips the window nor drops the shift for a small map (a 1×1 map is padded to 7×7
  and still rolled by 3). The padded (zero) tokens are not masked: they are keys (and values)
  like any other token of their region.
* timm (1.0.x) rolls the (H, W) map first and pads after, with a mask built with the same
  slices over the padded map; and unless ``always_partition=True`` it shrinks the window to
  the map and drops the shift on an axis no longer than the window.

Where H and W are multiples of the window (no padding) and timm keeps the window and shift,
the two orders are the same function. Elsewhere (every stage at the paper's 512×512 and
448×576, whose maps are 128…16 and 112×144…14×18: at least one side is not a multiple of 7)
they differ with the same weights. In timm's order the mask's regions no longer match what
was rolled (the rows that wrapped around sit above the padding, not in the last ``shift``
rows), so e.g. on a 9×9 map a token of the first row attends, unmasked, to the last row.

:class:`MmsegWindowBlock` is timm's block with mmseg's order: same parameters, same names,
same state-dict keys (checkpoints, the mmseg converter and aggregation are unaffected).
:func:`use_mmseg_windows` switches the blocks of a built timm Swin to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformerBlock, window_partition, window_reverse
from torch import nn

MASKED = -100.0  # mmseg's (and timm's) additive mask for a pair of different regions


def padded_size(height: int, width: int, window: tuple[int, int]) -> tuple[int, int]:
    """(height, width) padded at the bottom and right to multiples of ``window``, as mmseg pads
    before it shifts (a 9×9 map and 7×7 windows: 14×14; a 1×1 map: 7×7)."""
    return height + (-height) % window[0], width + (-width) % window[1]


def _axis_regions(size: int, window: int, shift: int, device: torch.device | None) -> torch.Tensor:
    """Region (0, 1, 2) of each index of a padded, rolled axis of ``size``: the slices
    ``[0, size - window)``, ``[size - window, size - shift)``, ``[size - shift, size)``."""
    index = torch.arange(size, device=device)
    if shift == 0:  # no shift along this axis: one region
        return torch.zeros_like(index)
    return (index >= size - window).long() + (index >= size - shift).long()


def window_regions(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device | None = None,
) -> torch.Tensor:
    """The [height, width] map of region ids, ``3 * row_region + col_region``, of a padded
    (``height``, ``width`` multiples of ``window``) and rolled map, as mmseg numbers them."""
    rows = _axis_regions(height, window[0], shift[0], device)
    cols = _axis_regions(width, window[1], shift[1], device)
    return 3 * rows[:, None] + cols[None, :]


def shifted_window_mask(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Additive attention mask [num_windows, window area, window area] of the padded and
    rolled (``height``, ``width``) map: ``MASKED`` where the two tokens of a window lie in
    different regions, 0 elsewhere (padding included). Windows in row-major order."""
    wh, ww = window
    regions = window_regions(height, width, window, shift, device)
    regions = regions.view(height // wh, wh, width // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
    differ = regions[:, None, :] != regions[:, :, None]
    return torch.zeros(differ.shape, device=device, dtype=dtype).masked_fill(differ, MASKED)


def mmseg_window_attention(block: SwinTransformerBlock, x: torch.Tensor) -> torch.Tensor:
    """The window-attention step of ``block`` (timm's ``_attn``: [B, H, W, C] -> [B, H, W, C])
    in mmseg's order: pad, roll by -shift, mask, attend per window, reverse, roll back, crop.

    ``block.attn`` (qkv, relative position bias, proj) does the attention; the mask is built
    for the input's size, on its device and in its dtype."""
    _, height, width, channels = x.shape
    (wh, ww), (sh, sw) = block.window_size, block.shift_size
    padded_h, padded_w = padded_size(height, width, (wh, ww))
    x = F.pad(x, (0, 0, 0, padded_w - width, 0, padded_h - height))
    mask = None
    if sh or sw:
        x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
        mask = shifted_window_mask(padded_h, padded_w, (wh, ww), (sh, sw), device=x.device, dtype=x.dtype)
    windows = window_partition(x, (wh, ww)).view(-1, wh * ww, channels)
    windows = block.attn(windows, mask=mask)
    x = window_reverse(windows.view(-1, wh, ww, channels), (wh, ww), padded_h, padded_w)
    if sh or sw:
        x = torch.roll(x, shifts=(sh, sw), dims=(1, 2))
    return x[:, :height, :width, :].contiguous()


class MmsegWindowBlock(SwinTransformerBlock):
    """timm's ``SwinTransformerBlock`` whose window attention runs in mmseg's order
    (:func:`mmseg_window_attention`); every parameter and state-dict key is timm's.

    Made from a built block by :func:`use_mmseg_windows`, not constructed. The mask is built
    in ``forward`` for the input's size, so timm's precomputed ``attn_mask`` buffer (built for
    timm's order at one size) is dropped."""

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        return mmseg_window_attention(self, x)

    def _init_buffers(self) -> None:  # timm calls it from reset_parameters / set_input_size
        self.register_buffer("attn_mask", None, persistent=False)


def use_mmseg_windows(model: nn.Module) -> int:
    """Switch every timm ``SwinTransformerBlock`` of ``model`` to mmseg's window order, in
    place; returns how many. The blocks must keep their full windows and shifts (built with
    ``always_partition=True``, as ``fedmtl.models.backbone.create_encoder`` does): mmseg never
    clips them, and a clipped window would also have a smaller relative-position table."""
    blocks = [m for m in model.modules() if isinstance(m, SwinTransformerBlock)]
    clipped = [b for b in blocks if not b.always_partition]
    if clipped:
        raise ValueError(
            f"{len(clipped)} Swin blocks were built without always_partition=True (timm clips their "
            f"windows and shifts to small maps, mmseg does not); build the model with "
            f"always_partition=True to use mmseg's window order"
        )
    for block in blocks:
        block.__class__ = MmsegWindowBlock
        block._init_buffers()
    return len(blocks)
