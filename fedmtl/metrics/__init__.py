"""Evaluation metrics of HC-FMTL, pooled over the whole validation set (docs/evaluation.md, "The metrics").

Each metric is a torchmetrics ``Metric`` whose states are sums, so syncing across processes
gives exactly the pooled result. ``update(pred, target)`` takes post-processed predictions
(class indices, probabilities, normal vectors, depth); ``compute()`` returns a 0-d tensor in the
paper's units (% for mIoU, maxF and odsF; degrees for normals; metres for depth).
"""

from fedmtl.metrics.delta_m import delta_m
from fedmtl.metrics.depth import DepthRMSE
from fedmtl.metrics.edge import EdgeODSF
from fedmtl.metrics.normals import NormalsMeanError
from fedmtl.metrics.saliency import SaliencyMaxF
from fedmtl.metrics.segmentation import MeanIoU

__all__ = ["DepthRMSE", "EdgeODSF", "MeanIoU", "NormalsMeanError", "SaliencyMaxF", "delta_m"]
