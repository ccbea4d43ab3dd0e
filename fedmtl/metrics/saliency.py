"""Maximal F-measure for saliency detection.

docs/evaluation.md, "The metrics": thresholds 0.05, 0.10, …, 0.95 (p >= t is positive); precision and
recall from TP/FP/FN counts pooled over the whole validation set; F = 1.3·P·R / (0.3·P + R)
(beta² = 0.3, which weighs precision more than recall); maxF = max over thresholds, in %.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from fedmtl.metrics._utils import (
    check_binary_target,
    check_floating,
    check_ndim,
    check_probabilities,
    check_same_shape,
    safe_divide,
)

NUM_THRESHOLDS = 19  # 0.05, 0.10, …, 0.95
BETA_SQUARED = 0.3


def saliency_thresholds(dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> Tensor:
    """k / 20 for k = 1 … 19, rounded once to ``dtype``.

    Rounding to the prediction's own dtype makes ``p >= t`` behave as written for a value that
    is "exactly" a threshold: float32(0.35) < float64(0.35), but float32(0.35) >= float32(0.35).
    """
    return (torch.arange(1, NUM_THRESHOLDS + 1, dtype=torch.float64, device=device) / 20).to(dtype)


def threshold_counts(pred: Tensor, target: Tensor, ignore_index: int = 255) -> tuple[Tensor, Tensor, Tensor]:
    """TP, FP, FN per threshold ([19] int64 each) over the valid pixels of a batch."""
    valid = target != ignore_index
    p, fg = pred[valid], target[valid] == 1
    thresholds = saliency_thresholds(p.dtype, p.device)
    # passed[i] = number of thresholds t <= p_i, so p_i >= thresholds[k] <=> passed[i] > k. One
    # histogram and a reversed cumulative sum count every threshold in a single pass.
    passed = torch.searchsorted(thresholds, p, right=True)
    total = NUM_THRESHOLDS + 1

    def count_above(levels: Tensor) -> Tensor:
        hist = torch.bincount(levels, minlength=total)
        return hist.flip(0).cumsum(0).flip(0)[1:]  # entry k: #pixels with level > k

    tp = count_above(passed[fg])
    predicted = count_above(passed)
    return tp, predicted - tp, fg.sum() - tp


def f_measure(tp: Tensor, fp: Tensor, fn: Tensor, beta_squared: float = BETA_SQUARED) -> Tensor:
    """F_beta per threshold; 0/0 (no prediction, no foreground) counts as 0."""
    precision = safe_divide(tp, tp + fp)
    recall = safe_divide(tp, tp + fn)
    return safe_divide((1 + beta_squared) * precision * recall, beta_squared * precision + recall)


class SaliencyMaxF(Metric):
    """Saliency maxF in %, from TP/FP/FN counts pooled over the validation set.

    ``update(pred, target)``: ``pred`` foreground probability [B, H, W] in [0, 1] (floating),
    ``target`` [B, H, W] with 0 = background, 1 = salient, ``ignore_index`` = not evaluated.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    tp: Tensor
    fp: Tensor
    fn: Tensor

    def __init__(self, ignore_index: int = 255, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        for name in ("tp", "fp", "fn"):
            self.add_state(name, default=torch.zeros(NUM_THRESHOLDS, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_floating("pred", pred)
        check_ndim("pred", pred, 3, "[B, H, W]")
        check_same_shape(pred, target)
        check_probabilities("pred", pred)
        check_binary_target(target, self.ignore_index)
        tp, fp, fn = threshold_counts(pred, target, self.ignore_index)
        self.tp += tp
        self.fp += fp
        self.fn += fn

    def compute(self) -> Tensor:
        return f_measure(self.tp, self.fp, self.fn).max() * 100
