"""Root-mean-square error of depth: in metres (NYUD-v2) or of disparity in pixels (Cityscapes).

docs/evaluation.md, "The metrics": metres, pixels with 0 < gt < 80 (so the 255 padding and
missing depth, stored as 0, are excluded); disparity, pixels with 0 <= gt < 255 (0 is a valid
disparity; invalid pixels and the padding are 255, and a disparity can exceed 80 px, so the
metres window would cut real targets). Predictions clamped above 0; the square root of the
mean squared error pooled over all valid pixels of the validation set (not a mean of
per-image RMSEs).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from fedmtl.metrics._utils import check_floating, check_same_shape

MAX_DEPTH = 80.0
MIN_PRED = 1e-9
IGNORE = 255.0  # the ignore value of every label (fedmtl.data.transforms.IGNORE)
DEPTH_UNITS = ("metres", "disparity")


def _as_bhw(name: str, x: Tensor) -> Tensor:
    if x.ndim == 4 and x.shape[1] == 1:
        return x[:, 0]
    if x.ndim != 3:
        raise ValueError(f"{name}: expected shape [B, H, W] or [B, 1, H, W], got {tuple(x.shape)}")
    return x


def valid_targets(target: Tensor, unit: str = "metres") -> Tensor:
    """Which target pixels are scored: metres 0 < gt < 80; disparity 0 <= gt < 255. NaN fails
    every comparison: never scored."""
    if unit == "metres":
        return (target > 0) & (target < MAX_DEPTH)
    if unit == "disparity":
        return (target >= 0) & (target < IGNORE)
    raise ValueError(f"unknown depth unit {unit!r}; expected one of {', '.join(DEPTH_UNITS)}")


def squared_error_sum(pred: Tensor, target: Tensor, unit: str = "metres") -> tuple[Tensor, Tensor]:
    """(sum of squared errors in float64, number of valid pixels) for [B, H, W] tensors."""
    valid = valid_targets(target, unit)
    diff = pred[valid].clamp(min=MIN_PRED).double() - target[valid].double()
    return diff.square().sum(), valid.sum()


class DepthRMSE(Metric):
    """Depth RMSE, pooled over all valid pixels; ``unit`` ("metres" or "disparity") sets
    which targets are valid (:func:`valid_targets`).

    ``update(pred, target)``: floating [B, H, W] or [B, 1, H, W] (the two may differ in that
    respect). ``compute()`` is NaN before any valid pixel was seen.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    sum_squared_error: Tensor
    count: Tensor

    def __init__(self, unit: str = "metres", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        valid_targets(torch.zeros(()), unit)  # refuses an unknown unit now, not at the first update
        self.unit = unit
        self.add_state(
            "sum_squared_error", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_floating("pred", pred)
        check_floating("target", target)
        pred, target = _as_bhw("pred", pred), _as_bhw("target", target)
        check_same_shape(pred, target)
        sse, count = squared_error_sum(pred, target, self.unit)
        self.sum_squared_error += sse
        self.count += count

    def compute(self) -> Tensor:
        if self.count == 0:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.sum_squared_error.device)
        return (self.sum_squared_error / self.count).sqrt()
