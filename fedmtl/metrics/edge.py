"""Optimal-dataset-scale F-measure (odsF) for boundary detection.

REFERENCE.md, "Metrics": per image and per threshold t = 0.01 … 0.99, binarise the prediction
(p >= t), thin it, and match predicted boundary pixels to ground-truth boundary pixels
one-to-one within ``max_dist`` × image diagonal (0.0075 PASCAL-Context, 0.011 NYUD-v2); pool
the counts over images per threshold; P = matched predicted / predicted, R = matched ground
truth / ground truth, F = 2PR / (P + R); odsF = max over thresholds, in %.

This replaces the BSDS benchmark's MATLAB ``correspondPixels``, which the public code calls.
Like it, the matching is a bipartite assignment, not a distance transform: one ground-truth
pixel can vindicate only one predicted pixel, so two parallel predicted lines next to one true
line cannot both count. ``correspondPixels`` solves a min-cost assignment with outlier costs;
every pair within the radius is admissible and every match lowers the cost, so its matched
counts equal a maximum-cardinality matching, which is what is computed here. A pair is
admissible when its Euclidean distance is <= radius.

The matching is solved as a unit-capacity maximum flow with Dinic's algorithm
(``scipy.sparse.csgraph.maximum_flow``), which is Hopcroft-Karp in another guise. scipy's own
``maximum_bipartite_matching`` gives the same counts but its depth-first search does not prune
dead ends (scipy issue #26147) and takes seconds on the layered graphs that parallel predicted
lines produce; Dinic's stays at a few milliseconds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy.ndimage import binary_dilation
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow
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
from fedmtl.metrics.thinning import thin

# Rows of the per-image count array returned by edge_image_counts.
MATCHED_PRED, TOTAL_PRED, MATCHED_GT, TOTAL_GT = range(4)


def edge_thresholds(num: int = 99) -> np.ndarray:
    """k / (num + 1) for k = 1 … num: 0.01 … 0.99 for the default 99, as the BSDS code uses."""
    return np.arange(1, num + 1, dtype=np.float64) / (num + 1)


def disk(radius: float) -> np.ndarray:
    """[2r+1, 2r+1] bool, r = floor(radius): True at (dy, dx) with dy² + dx² <= radius²."""
    r = math.floor(radius)
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    return dy**2 + dx**2 <= radius**2


class BoundaryMatcher:
    """Maximum one-to-one matching of predicted to ground-truth boundary pixels of one image.

    Built once per image and reused for every threshold: it keeps the ground-truth pixels in an
    index map (padded by the radius), so the pairs within the radius of a predicted pixel are a
    fixed stencil of offsets — an exact radius query on the pixel grid, vectorised over all
    predicted pixels at once — and a map of where a ground-truth pixel is in reach at all, so
    that predicted pixels far from every true boundary are skipped before the stencil lookup.
    """

    def __init__(self, gt: np.ndarray, radius: float) -> None:
        pad = math.floor(radius)
        h, w = gt.shape
        self._pad, self._width = pad, w + 2 * pad
        ids = np.full((h + 2 * pad, w + 2 * pad), -1, dtype=np.int64)
        gy, gx = np.nonzero(gt)
        ids[gy + pad, gx + pad] = np.arange(gy.size)
        self._ids = ids.ravel()
        self.num_gt = int(gy.size)
        stencil = disk(radius)
        dy, dx = np.nonzero(stencil)
        self._offsets = (dy - pad) * self._width + (dx - pad)
        # in_reach[y, x]: some ground-truth pixel lies within the radius of (y, x).
        self._in_reach = binary_dilation(gt, structure=stencil)

    def count_matches(self, pred: np.ndarray) -> int:
        """Size of a maximum matching between the True pixels of ``pred`` and the ground truth."""
        py, px = np.nonzero(pred & self._in_reach)
        if py.size == 0:
            return 0
        centres = (py + self._pad) * self._width + (px + self._pad)
        neighbours = self._ids[centres[:, None] + self._offsets]  # [n_pred, n_offsets], -1 = none
        rows, cols = np.nonzero(neighbours >= 0)
        return max_bipartite_matching_size(rows, neighbours[rows, cols], py.size, self.num_gt)


def max_bipartite_matching_size(left: np.ndarray, right: np.ndarray, num_left: int, num_right: int) -> int:
    """Size of a maximum matching of the bipartite graph with edges (left[e], right[e]).

    Solved as a maximum flow source -> left -> right -> sink with unit capacities.
    """
    if left.size == 0:
        return 0
    source, sink = 0, num_left + num_right + 1
    left_nodes = 1 + np.arange(num_left)
    right_nodes = 1 + num_left + np.arange(num_right)
    tails = np.concatenate([np.full(num_left, source), left_nodes[left], right_nodes])
    heads = np.concatenate([left_nodes, right_nodes[right], np.full(num_right, sink)])
    capacity = csr_array((np.ones(tails.size, dtype=np.int32), (tails, heads)), shape=(sink + 1, sink + 1))
    return int(maximum_flow(capacity, source, sink, method="dinic").flow_value)


def edge_image_counts(
    pred: np.ndarray, target: np.ndarray, thresholds: np.ndarray, max_dist: float, ignore_index: int = 255
) -> np.ndarray:
    """[4, T] int64 counts for one image: matched pred, total pred, matched gt, total gt per threshold.

    ``pred`` [H, W] edge probability, ``target`` [H, W] in {0, 1, ignore_index}. Padding
    (``ignore_index``) is removed from both maps. The public code crops the padding off before
    evaluating, so the matching radius is ``max_dist`` × the diagonal of the valid region's
    bounding box, not of the padded array.
    """
    counts = np.zeros((4, thresholds.size), dtype=np.int64)
    valid = target != ignore_index
    rows, cols = np.flatnonzero(valid.any(axis=1)), np.flatnonzero(valid.any(axis=0))
    if rows.size == 0:
        return counts  # a fully padded image carries no label
    box = slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)
    pred, target, valid = pred[box], target[box], valid[box]
    gt = (target == 1) & valid
    matcher = BoundaryMatcher(gt, max_dist * math.hypot(*gt.shape))
    counts[TOTAL_GT] = matcher.num_gt

    # level = number of thresholds t <= p, so (p >= thresholds[k]) <=> (level > k). The maps are
    # nested (shrinking as t grows), so equal pixel counts mean equal maps.
    level = np.searchsorted(thresholds.astype(pred.dtype), pred, side="right")
    level[~valid] = 0
    num_above = np.bincount(level.ravel(), minlength=thresholds.size + 1)[::-1].cumsum()[::-1][1:]
    for k in range(thresholds.size):
        if num_above[k] == 0:
            break  # every later map is empty as well
        if k > 0 and num_above[k] == num_above[k - 1]:
            counts[:3, k] = counts[:3, k - 1]  # same binary map as the previous threshold
            continue
        boundary = thin(level > k)
        matched = matcher.count_matches(boundary)
        counts[MATCHED_PRED, k] = counts[MATCHED_GT, k] = matched  # one-to-one: the same number
        counts[TOTAL_PRED, k] = np.count_nonzero(boundary)
    return counts


def ods_f_per_threshold(
    matched_pred: Tensor, total_pred: Tensor, matched_gt: Tensor, total_gt: Tensor
) -> Tensor:
    """F = 2PR / (P + R) per threshold from pooled counts; 0/0 counts as 0."""
    precision = safe_divide(matched_pred, total_pred)
    recall = safe_divide(matched_gt, total_gt)
    return safe_divide(2 * precision * recall, precision + recall)


class EdgeODSF(Metric):
    """Boundary odsF in %, counts pooled over images per threshold (see the module docstring).

    ``update(pred, target)``: ``pred`` edge probability [B, H, W] in [0, 1] (floating),
    ``target`` [B, H, W] binary boundary map, ``ignore_index`` marking padding. The matching runs
    per image on the CPU in numpy; the state is four [T] count tensors summed across processes.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    matched_pred: Tensor
    total_pred: Tensor
    matched_gt: Tensor
    total_gt: Tensor

    def __init__(
        self, max_dist: float = 0.0075, thresholds: int = 99, ignore_index: int = 255, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if not 0 <= max_dist < 1:
            raise ValueError(f"max_dist is a fraction of the image diagonal in [0, 1), got {max_dist}")
        if thresholds < 1:
            raise ValueError(f"thresholds must be a positive number of thresholds, got {thresholds}")
        self.max_dist = max_dist
        self.ignore_index = ignore_index
        self.threshold_values = edge_thresholds(thresholds)
        for name in ("matched_pred", "total_pred", "matched_gt", "total_gt"):
            self.add_state(name, default=torch.zeros(thresholds, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        check_floating("pred", pred)
        check_ndim("pred", pred, 3, "[B, H, W]")
        check_same_shape(pred, target)
        check_probabilities("pred", pred)
        check_binary_target(target, self.ignore_index)
        if pred.dtype == torch.bfloat16:  # numpy has no bfloat16; widening to float32 is exact
            pred = pred.float()
        pred_np = pred.detach().cpu().numpy()
        target_np = target.detach().cpu().numpy()
        counts = np.zeros((4, self.threshold_values.size), dtype=np.int64)
        for p, t in zip(pred_np, target_np):
            counts += edge_image_counts(p, t, self.threshold_values, self.max_dist, self.ignore_index)
        counts = torch.from_numpy(counts).to(self.matched_pred.device)
        self.matched_pred += counts[MATCHED_PRED]
        self.total_pred += counts[TOTAL_PRED]
        self.matched_gt += counts[MATCHED_GT]
        self.total_gt += counts[TOTAL_GT]

    def compute(self) -> Tensor:
        f = ods_f_per_threshold(self.matched_pred, self.total_pred, self.matched_gt, self.total_gt)
        return f.max() * 100
