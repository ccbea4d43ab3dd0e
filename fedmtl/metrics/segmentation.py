"""Mean intersection-over-union for semantic segmentation and human parts.

docs/evaluation.md, "The metrics": per-class TP / (TP + FP + FN) over all valid pixels of the whole
validation set, mean over ALL C classes; a class absent from both the prediction and the
ground truth counts as 0. torchmetrics' macro average skips such a class instead, which gives
a higher number than the paper's tables.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from fedmtl.metrics._utils import check_integer, check_ndim, check_same_shape, safe_divide


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = 255) -> Tensor:
    """[C, C] int64 pixel counts, rows = ground-truth class, columns = predicted class.

    Pixels whose target is ``ignore_index`` are dropped. Any other target or prediction outside
    [0, C) is an error rather than being silently dropped or wrapped into another cell.
    """
    valid = target != ignore_index
    gt, pr = target[valid].long(), pred[valid].long()
    for name, values in (("target", gt), ("pred", pr)):
        if values.numel() and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(
                f"{name}: class indices must lie in [0, {num_classes}) (or equal ignore_index="
                f"{ignore_index} in target), found values in [{values.min().item()}, {values.max().item()}]"
            )
    cells = torch.bincount(gt * num_classes + pr, minlength=num_classes * num_classes)
    return cells.reshape(num_classes, num_classes)


def iou_per_class(confmat: Tensor) -> Tensor:
    """TP / (TP + FP + FN) per class from a confusion matrix; 0 for a class never seen at all."""
    tp = confmat.diag()
    fp = confmat.sum(0) - tp  # predicted as the class, labelled otherwise
    fn = confmat.sum(1) - tp  # labelled as the class, predicted otherwise
    return safe_divide(tp, tp + fp + fn)


class MeanIoU(Metric):
    """Mean IoU in %, pooled over all pixels of all images (docs/evaluation.md, "The metrics").

    ``update(pred, target)``: ``pred`` holds class indices [B, H, W] (integer dtype, i.e. after
    argmax), ``target`` [B, H, W] class indices with ``ignore_index`` for unlabelled pixels.
    The state is the confusion matrix, summed across processes.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    confmat: Tensor

    def __init__(self, num_classes: int, ignore_index: int = 255, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.add_state(
            "confmat", default=torch.zeros(num_classes, num_classes, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_integer("pred", pred, hint=" (class indices: take the argmax over the class dimension first)")
        check_integer("target", target)
        check_ndim("pred", pred, 3, "[B, H, W]")
        check_same_shape(pred, target)
        self.confmat += confusion_matrix(pred, target, self.num_classes, self.ignore_index)

    def compute(self) -> Tensor:
        return iou_per_class(self.confmat).mean() * 100
