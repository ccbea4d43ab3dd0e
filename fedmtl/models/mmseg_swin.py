"""mmsegmentation's Swin layout <-> fedmtl's Swin encoder: a key map and one weight reorder.

Why: the public FedHCA² code starts its Swin-T from the backbone of mmsegmentation's UperNet
Swin-T checkpoint (ADE20K, 512×512, 160k iterations). That file stores mmseg's own Swin
(``mmseg/models/backbones/swin.py``), not timm's, so ``model.pretrained_file`` converts it
with :func:`from_mmseg_swin` before matching names (``fedmtl.models.backbone.load_pretrained``).

Key map (mmseg name, without its ``backbone.`` prefix -> fedmtl ``Encoder`` state-dict name):

| mmseg name | fedmtl name |
|---|---|
| ``patch_embed.projection.*`` | ``body.patch_embed.proj.*`` |
| ``patch_embed.norm.*`` | ``body.patch_embed.norm.*`` |
| ``stages.i.blocks.j.norm1.*`` / ``norm2.*`` | ``body.layers_i.blocks.j.norm1.*`` / ``norm2.*`` |
| ``stages.i.blocks.j.attn.w_msa.X`` (X below) | ``body.layers_i.blocks.j.attn.X`` |
| ``stages.i.blocks.j.ffn.layers.0.0.*`` | ``body.layers_i.blocks.j.mlp.fc1.*`` |
| ``stages.i.blocks.j.ffn.layers.1.*`` | ``body.layers_i.blocks.j.mlp.fc2.*`` |
| ``stages.i.downsample.norm.*`` | ``body.layers_{i+1}.downsample.norm.*`` (reordered) |
| ``stages.i.downsample.reduction.weight`` | ``body.layers_{i+1}.downsample.reduction.weight`` (reordered) |
| ``norm{i}.*`` (i = 0..3) | ``norms.{i}.*`` (``Encoder.norms``) |

X is ``qkv.*``, ``proj.*`` or ``relative_position_bias_table``. Reordered: the downsample norm's
channels and the reduction weight's input columns.

Dropped: ``*.relative_position_index`` (a persistent buffer in mmseg; timm recomputes the same
index as a non-persistent buffer: tests/test_mmseg_checkpoint.py checks the two formulas agree
for 7×7 windows) and, in a full segmentor checkpoint (keys prefixed ``backbone.``), every key
outside ``backbone.`` (``decode_head.*``, ``auxiliary_head.*``, ``neck.*``): they are the
segmentor's, not the encoder's. mmseg computes its shifted-window masks in ``forward`` (timm's
``attn_mask`` buffers are non-persistent), so there are none to drop. Any other key is passed
through unchanged, so the loader reports it as unexpected instead of hiding it.

Stage boundary: mmseg's ``PatchMerging`` is the *last* module of stage i (as in the original
Swin code: ``layers.i.downsample``); timm (>= 0.9) makes it the *first* module of stage i+1
(``layers.{i+1}.downsample``; timm's own ``checkpoint_filter_fn`` shifts original checkpoints
the same way: ``layers.(i).downsample -> layers.(i+1).downsample``).

Patch-merging reorder: both concatenate the 2×2 neighbours of each output position into 4C
channels and apply LayerNorm(4C) then Linear(4C -> 2C), but in different orders.

* timm (and the original Swin): ``x.reshape(B, H/2, 2, W/2, 2, C).permute(0, 1, 3, 4, 2, 5)``,
  i.e. channel ``k*C + c`` with neighbour ``k = 2*dw + dh``: x0 = (dh, dw) = (0, 0),
  x1 = (1, 0), x2 = (0, 1), x3 = (1, 1) (the original's ``cat([x0, x1, x2, x3], -1)``).
* mmseg: ``nn.Unfold(kernel_size=2, stride=2)`` on the NCHW map, i.e. channel ``c*4 + p``
  (channel-major) with kernel position ``p = 2*dh + dw``.

So neighbour k of timm is kernel position ``[0, 2, 1, 3][k]`` of mmseg (the permutation is its
own inverse). mmsegmentation's ``tools/model_converters/swin2mmseg.py``
(``correct_unfold_reduction_order`` / ``correct_unfold_norm_order``) applies exactly this to
original checkpoints: ``w.reshape(out, 4, C)[:, [0, 2, 1, 3], :].transpose(1, 2)`` for the
reduction weight and ``v.reshape(4, C)[[0, 2, 1, 3], :].transpose(0, 1)`` for the norm weight
and bias; :func:`to_mmseg_swin` is that, :func:`from_mmseg_swin` its inverse. The functional
test builds mmseg's Unfold + norm + linear by hand and compares it with timm's module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

MMSEG_PREFIX = "backbone."
# Neighbour k of timm's (original Swin's) concatenation is kernel position _UNFOLD_ORDER[k] of
# mmseg's nn.Unfold; the permutation is an involution, so the same list maps back.
_UNFOLD_ORDER = [0, 2, 1, 3]

_STAGE_MM = re.compile(r"^stages\.(\d+)\.(.*)$")
_STAGE_FED = re.compile(r"^body\.layers[._](\d+)\.(.*)$")
# Within a block: (mmseg suffix, fedmtl suffix); longest mmseg spellings first.
_BLOCK_MAP = (
    ("attn.w_msa.", "attn."),
    ("ffn.layers.0.0.", "mlp.fc1."),
    ("ffn.layers.1.", "mlp.fc2."),
)
_DROPPED_BUFFERS = ("relative_position_index",)


def is_mmseg_swin(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """A state dict in mmseg's Swin layout: it has ``[backbone.]stages.<i>.blocks.`` keys
    (timm and the original Swin say ``layers``)."""
    return any(re.match(r"^(backbone\.)?stages\.\d+\.blocks\.", k) for k in state_dict)


def mmseg_key_to_fedmtl(key: str) -> str | None:
    """The fedmtl ``Encoder`` name of mmseg backbone key ``key`` (no ``backbone.`` prefix), or
    None for a buffer timm recomputes. Unknown keys come back unchanged."""
    if key.endswith(_DROPPED_BUFFERS):
        return None
    if key.startswith("patch_embed."):
        return "body." + key.replace("patch_embed.projection.", "patch_embed.proj.", 1)
    norm = re.match(r"^norm(\d+)\.(.*)$", key)
    if norm:
        return f"norms.{norm[1]}.{norm[2]}"
    stage = _STAGE_MM.match(key)
    if not stage:
        return key
    i, rest = int(stage[1]), stage[2]
    if rest.startswith("downsample."):
        return f"body.layers_{i + 1}.{rest}"
    block = re.match(r"^(blocks\.\d+\.)(.*)$", rest)
    if block:
        head, tail = block[1], block[2]
        for mm, fed in _BLOCK_MAP:
            if tail.startswith(mm):
                tail = fed + tail[len(mm) :]
                break
        return f"body.layers_{i}.{head}{tail}"
    return key


def fedmtl_key_to_mmseg(key: str) -> str:
    """Inverse of :func:`mmseg_key_to_fedmtl` (without the ``backbone.`` prefix)."""
    if key.startswith("body.patch_embed."):
        return key.removeprefix("body.").replace("patch_embed.proj.", "patch_embed.projection.", 1)
    norm = re.match(r"^norms\.(\d+)\.(.*)$", key)
    if norm:
        return f"norm{norm[1]}.{norm[2]}"
    stage = _STAGE_FED.match(key)
    if not stage:
        return key
    i, rest = int(stage[1]), stage[2]
    if rest.startswith("downsample."):
        return f"stages.{i - 1}.{rest}"
    block = re.match(r"^(blocks\.\d+\.)(.*)$", rest)
    if block:
        head, tail = block[1], block[2]
        for mm, fed in _BLOCK_MAP:
            if tail.startswith(fed):
                tail = mm + tail[len(fed) :]
                break
        return f"stages.{i}.{head}{tail}"
    return key


def _merge_from_unfold(key: str, value: torch.Tensor) -> torch.Tensor:
    """mmseg (Unfold, channel-major ``c*4 + p``) -> timm (neighbour-major ``k*C + c``)."""
    if ".downsample.reduction." in key and value.dim() == 2:
        out, four_c = value.shape
        return value.reshape(out, four_c // 4, 4)[:, :, _UNFOLD_ORDER].transpose(1, 2).reshape(out, four_c)
    if ".downsample.norm." in key and value.dim() == 1:
        return value.reshape(-1, 4)[:, _UNFOLD_ORDER].transpose(0, 1).reshape(-1)
    return value


def _merge_to_unfold(key: str, value: torch.Tensor) -> torch.Tensor:
    """timm -> mmseg, as swin2mmseg's ``correct_unfold_*_order``."""
    if ".downsample.reduction." in key and value.dim() == 2:
        out, four_c = value.shape
        return value.reshape(out, 4, four_c // 4)[:, _UNFOLD_ORDER, :].transpose(1, 2).reshape(out, four_c)
    if ".downsample.norm." in key and value.dim() == 1:
        return value.reshape(4, -1)[_UNFOLD_ORDER, :].transpose(0, 1).reshape(-1)
    return value


def mmseg_key_map(state_dict: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """For each key of mmseg state dict ``state_dict`` that :func:`from_mmseg_swin` keeps, its
    fedmtl ``Encoder`` name (so errors can name the file's own keys)."""
    prefixed = any(k.startswith(MMSEG_PREFIX + "stages.") for k in state_dict)
    names = {}
    for key in state_dict:
        if prefixed and not key.startswith(MMSEG_PREFIX):
            continue  # decode_head.*, auxiliary_head.*: the segmentor's heads
        new = mmseg_key_to_fedmtl(key.removeprefix(MMSEG_PREFIX) if prefixed else key)
        if new is not None:
            names[key] = new
    return names


def from_mmseg_swin(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Convert an mmseg Swin state dict to fedmtl ``Encoder`` names and layout (pure: the input
    is not modified; reordered tensors are new, the others are the same tensor objects).

    Accepts a full segmentor state dict (``backbone.*`` plus heads, which are dropped) or a
    backbone-only one (swin2mmseg's output: no prefix). See the module docstring for the map.
    """
    return {new: _merge_from_unfold(new, state_dict[old]) for old, new in mmseg_key_map(state_dict).items()}


def to_mmseg_swin(
    state_dict: Mapping[str, torch.Tensor], prefix: str = MMSEG_PREFIX
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`from_mmseg_swin`: fedmtl ``Encoder`` state dict -> mmseg backbone keys
    under ``prefix`` (no heads, no ``relative_position_index`` buffers)."""
    return {prefix + fedmtl_key_to_mmseg(k): _merge_to_unfold(k, v) for k, v in state_dict.items()}
