"""Mean angular error of surface normals.

docs/evaluation.md, "The metrics": both vectors L2-normalised; angle = 2·atan2(‖p − g‖, ‖p + g‖) in
degrees (accurate near 0° and 180°, where acos of a dot product loses precision); mean over
the valid pixels of the whole validation set.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from fedmtl.metrics._utils import check_floating, check_ndim, check_same_shape


def valid_normals_mask(target: Tensor, ignore_index: int = 255) -> Tensor:
    """[B, H, W] bool: all 3 target channels differ from ``ignore_index`` and the vector is not 0.

    The zero vector has no direction: the public PASCAL-Context loader writes all-zero normals
    for the classes that carry no normals label, so those pixels must not be scored.
    """
    return (target != ignore_index).all(dim=1) & (target != 0).any(dim=1)


def angular_error_deg(pred: Tensor, target: Tensor) -> Tensor:
    """Angle in degrees between [N, 3] vectors, each normalised to unit length first.

    A zero-length prediction stays the zero vector and so scores 90° against any target.
    """
    p = F.normalize(pred, dim=-1)
    g = F.normalize(target, dim=-1)
    return torch.rad2deg(2 * torch.atan2((p - g).norm(dim=-1), (p + g).norm(dim=-1)))


class NormalsMeanError(Metric):
    """Normals mErr in degrees: sum of per-pixel angles over all valid pixels / their count.

    ``update(pred, target)``: both [B, 3, H, W] floating. Valid pixels: target's three channels
    all != ``ignore_index`` and target != (0, 0, 0) (see :func:`valid_normals_mask`).
    ``compute()`` is NaN before any valid pixel was seen (an error of 0 would read as perfect).
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    sum_error: Tensor
    count: Tensor

    def __init__(self, ignore_index: int = 255, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        # float64: a sum over ~10⁹ pixels in float32 would drift in the 4th significant digit.
        self.add_state("sum_error", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_floating("pred", pred)
        check_floating("target", target)
        check_ndim("pred", pred, 4, "[B, 3, H, W]")
        check_same_shape(pred, target)
        if pred.shape[1] != 3:
            raise ValueError(f"pred: expected 3 channels (x, y, z) in dim 1, got shape {tuple(pred.shape)}")
        valid = valid_normals_mask(target, self.ignore_index)
        # [B, 3, H, W] -> [N_valid, 3]
        angles = angular_error_deg(pred.movedim(1, -1)[valid], target.movedim(1, -1)[valid])
        self.sum_error += angles.sum(dtype=torch.float64)
        self.count += angles.numel()

    def compute(self) -> Tensor:
        if self.count == 0:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.sum_error.device)
        return self.sum_error / self.count
