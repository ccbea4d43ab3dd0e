"""Root-mean-square error of depth, in metres.

docs/evaluation.md, "The metrics": pixels with 0 < gt < 80 (so the 255 padding and missing depth, stored
as 0, are excluded); predictions clamped above 0; the square root of the mean squared error
pooled over all valid pixels of the validation set (not a mean of per-image RMSEs).
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


def _as_bhw(name: str, x: Tensor) -> Tensor:
    if x.ndim == 4 and x.shape[1] == 1:
        return x[:, 0]
    if x.ndim != 3:
        raise ValueError(f"{name}: expected shape [B, H, W] or [B, 1, H, W], got {tuple(x.shape)}")
    return x


def squared_error_sum(pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of squared errors in float64, number of valid pixels) for [B, H, W] tensors."""
    valid = (target > 0) & (target < MAX_DEPTH)  # NaN fails both comparisons: excluded too
    diff = pred[valid].clamp(min=MIN_PRED).double() - target[valid].double()
    return diff.square().sum(), valid.sum()


class DepthRMSE(Metric):
    """Depth RMSE in metres, pooled over all valid pixels.

    ``update(pred, target)``: floating [B, H, W] or [B, 1, H, W] (the two may differ in that
    respect). ``compute()`` is NaN before any valid pixel was seen.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    sum_squared_error: Tensor
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state(
            "sum_squared_error", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_floating("pred", pred)
        check_floating("target", target)
        pred, target = _as_bhw("pred", pred), _as_bhw("target", target)
        check_same_shape(pred, target)
        sse, count = squared_error_sum(pred, target)
        self.sum_squared_error += sse
        self.count += count

    def compute(self) -> Tensor:
        if self.count == 0:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.sum_squared_error.device)
        return (self.sum_squared_error / self.count).sqrt()
