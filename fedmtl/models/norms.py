"""The ``model.norm: group`` option: every BatchNorm of a client model replaced by GroupNorm.

Per-sample gradients (DP-SGD, fedmtl.privacy.dpsgd) need each sample's loss to depend on that
sample alone; BatchNorm normalises by statistics of the whole batch, so Opacus refuses it.
GroupNorm normalises each sample on its own. Modules are found by type (any ``_BatchNorm``:
BatchNorm1d/2d/3d, SyncBatchNorm, timm's BatchNormAct2d), never by parameter name.
"""

from __future__ import annotations

import math
from typing import Literal

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

Norm = Literal["batch", "group"]
NORMS: tuple[Norm, ...] = ("batch", "group")
MAX_GROUPS = 32  # GroupNorm's usual count (Wu & He 2018)


def group_count(channels: int) -> int:
    """The number of groups a GroupNorm over ``channels`` gets: gcd(channels, 32), so that it
    divides the channels: 32 for multiples of 32, 8 for 24 or 56, 16 for 368."""
    return math.gcd(channels, MAX_GROUPS)


def _group_norm(bn: _BatchNorm) -> nn.Module:
    norm = nn.GroupNorm(group_count(bn.num_features), bn.num_features, eps=bn.eps, affine=bn.affine)
    norm.to(device=bn.weight.device if bn.affine else None)
    # timm's BatchNormAct2d also applies a dropout and an activation after normalising: kept, as
    # separate modules, so the GroupNorm is a plain nn.GroupNorm that Opacus knows.
    extra = [m for m in (getattr(bn, "drop", None), getattr(bn, "act", None)) if m is not None]
    return nn.Sequential(norm, *extra) if extra else norm


def replace_batch_norm(module: nn.Module) -> int:
    """Replace, in place, every BatchNorm inside ``module`` by a GroupNorm over the same
    channels (:func:`group_count` groups, the same eps, a fresh identity affine); return how many
    were replaced. ``module`` itself must not be a BatchNorm (it cannot replace itself)."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, _BatchNorm):
            setattr(module, name, _group_norm(child))
            replaced += 1
        else:
            replaced += replace_batch_norm(child)
    return replaced


def out_of_place(module: nn.Module) -> int:
    """Make every activation in ``module`` that can run in place (a boolean ``inplace``
    attribute: ReLU, LeakyReLU, timm's layers) run out of place; return how many changed. The
    values are the same; Opacus's backward hooks forbid editing a hooked layer's output in place."""
    changed = 0
    for layer in module.modules():
        if getattr(layer, "inplace", None) is True:
            layer.inplace = False
            changed += 1
    return changed
