"""Optimal-dataset-scale F-measure (odsF) for boundary detection.

REFERENCE.md, "Metrics": per image and per threshold t = 0.01 … 0.99, binarise the prediction
(after the public pipeline's quantisation and non-maximum suppression, points 1 and 3 below),
thin it, and match predicted boundary pixels to ground-truth boundary pixels one-to-one within
``max_dist`` × image diagonal (0.0075 PASCAL-Context, 0.011 NYUD-v2); pool the counts over
images per threshold; P = matched predicted / predicted, R = matched ground truth / ground
truth, F = 2PR / (P + R); odsF = max over thresholds, in %.

The public pipeline, point by point
-----------------------------------
FedHCA² evaluates edges offline: its test script saves every edge map as an 8-bit PNG, and the
author's fork of SEISM (MATLAB, Piotr Dollár's edge code and the BSDS ``correspondPixels``)
scores the PNGs. Sources are GitHub repositories; "FedHCA²" is innovator-zero/FedHCA2.

1. Quantisation (implemented). FedHCA² ``utils.py`` ``get_output``: edge = ``torch.sigmoid(x) *
   255`` (float32); ``evaluation/evaluate_utils.py`` ``predict`` crops the padding and calls
   ``save_img``, which writes ``Image.fromarray(np.uint8(pred), mode='L')`` — a cast, so the
   grey level is ``floor(255·σ)`` (truncation, not rounding: σ = 0.5 → 127, only σ = 1 → 255).
   FedHCA²'s ``evaluation/save_img.py`` was found only as a file of a repository the index did not name, with
   exactly the signature FedHCA² calls, ``save_img(dataname, file_names, preds, task,
   save_dir, idx)``, saving to the ``{idx}_edge/img`` folders FedHCA²'s ``create_pred_dir``
   makes; the same cast is in youngfish42/FMTL-Benchmark ``evaluation/save_img.py`` and
   innovator-zero/SAK ``evaluation/save_img.py``.
   Here: :func:`quantize_edge`, ``uint8(float32(p) · 255)``, applied inside
   :meth:`EdgeODSF.update` (which also takes uint8 grey levels as they are).
2. Thresholds (implemented). innovator-zero/seism ``parameters.txt``: 99 values 0.01 … 0.99
   (also SimonVandenhende/Multi-Task-Learning-PyTorch ``evaluation/eval_edge.py``:
   ``np.arange(0.01, 1.00, 0.01)`` written with ``%.2f``). innovator-zero/seism
   ``src/io/read_one_png.m``: positive iff ``double(imread(png)) / 255.0 >= str2double(t)``,
   i.e. the grey level over 255 against t, both in double precision. Here: the same comparison
   through a 256-entry table (:func:`grey_level_table`); k / 100 in float64 is the same double
   as ``str2double('0.kk')``. Seism's ``edgesEvalImg`` then thresholds the binary map once more
   at 0.5 (``thrs`` default changed to 1 "because binary images"), which changes nothing.
3. Non-maximum suppression (implemented, applied by default). The README of
   innovator-zero/MTDP_Lib (same author, same seism fork) and ``evaluation/edge_evaluation.py``
   there and in youngfish42/FMTL-Benchmark run ``nms_process`` (``--nms``) and point seism at
   ``edge/nms/``, not ``edge/img/``. innovator-zero/seism ``nms_process.m``: ``x = png / 255``;
   ``E = convTri(single(x), 1)``; orientation ``O`` from second derivatives of
   ``convTri(E, 4)`` (``gradient2``); ``E = edgesNmsMex(E, O, 4, 5, 1.01, 4)`` (suppression
   radius 4, boundary fade 5 px, multiplier 1.01); ``imwrite(uint8(E * 255))`` — MATLAB's
   uint8 rounds, so the grey levels that are finally thresholded are round(255·NMS(…)).
   FedHCA²'s own ``edge_evaluation.py`` is not in the index: assumed to be the same script.
   Here: :func:`fedmtl.metrics.edge_nms.structured_edge_nms`, a port of these lines and of
   Piotr Dollár's ``convTri``, ``gradient2`` and ``edgesNmsMex`` (pdollar/toolbox,
   pdollar/edges; sources and the remaining float32 approximations in that module's
   docstring), run per image on the cropped grey levels inside :func:`edge_image_counts`.
   ``EdgeODSF(nms=False)`` thresholds the quantised probabilities directly, as fedmtl did
   before.
4. Thinning (implemented). seism ``src/piotr_edges/edgesEvalImg.m`` (jponttuset/seism; the
   fork's copy is not in the index, assumed unchanged): ``bwmorph(E1, 'thin', inf)`` of each
   binarised prediction, ground truth not thinned; no other morphology. Here:
   :func:`fedmtl.metrics.thinning.thin` (the same algorithm).
5. Ground truth (PASCAL-Context reproduced; NYUD documented). innovator-zero/seism ``src/gt_wrappers/db_gt.m``:
   PASCAL-Context ``LabelMap`` from ``pascal-context/trainval/<id>.mat``, relabelled, and
   ``edgesEvalImg`` turns it into boundaries with BSDS ``seg2bmap`` (a pixel is a boundary if
   its label differs from its east, south or south-east neighbour; last row/column compare one
   neighbour; 1 px wide, offset half a pixel towards the origin; not thinned further). NYUD:
   ``groundTruth{1}.Boundaries`` from ``NYUDv2/edge_mat/<id>.mat`` (a directory the dataset
   layout of REFERENCE.md does not have), also passed through ``seg2bmap``. fedmtl scores
   against the target the data loader gives for the validation split: PASCAL-Context
   ``seg2bmap`` of the LabelMap (:func:`fedmtl.data.pascal_context.seg2bmap`, as SEISM; the
   training split keeps the public training label, the 4-neighbour Laplacian of the LabelMap
   != 0, thinned: FedHCA² ``datasets/pascal_context.py`` ``_load_edge``); NYUD
   ``edge/<id>.png`` / 255 (FedHCA² ``datasets/nyud.py``), not SEISM's ``edge_mat``. Whether
   the NYUD png equals the .mat boundaries: not found.
6. Ignored pixels. Public: none; ``predict`` crops the padding so every pixel of the original
   image counts, and the radius is ``maxDist`` × the original image's diagonal. Here: the
   ``ignore_index`` padding is removed by cropping to the valid region's bounding box (below),
   which is the same as long as only padding carries ``ignore_index``.
7. Matching radius: innovator-zero/seism ``src/scripts/eval_method.m``: ``maxDist`` 0.011 for
   NYUD, 0.0075 otherwise (PASCAL-Context); MTDP_Lib README says the same.
8. Pooling: innovator-zero/seism ``src/scripts/gather_measure.m`` sums cntR, sumR, cntP, sumP
   over images per threshold, then F per threshold; ``general_ods`` takes the maximum. Zero
   denominators give F = 0 there and here.

The matching
------------
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
    check_ndim,
    check_probabilities,
    check_same_shape,
    safe_divide,
)
from fedmtl.metrics.edge_nms import structured_edge_nms
from fedmtl.metrics.thinning import thin

# Rows of the per-image count array returned by edge_image_counts.
MATCHED_PRED, TOTAL_PRED, MATCHED_GT, TOTAL_GT = range(4)


def edge_thresholds(num: int = 99) -> np.ndarray:
    """k / (num + 1) for k = 1 … num in float64: 0.01 … 0.99 for the default 99, the same doubles
    as seism's ``str2double`` of its parameter strings '0.01' … '0.99'."""
    return np.arange(1, num + 1, dtype=np.float64) / (num + 1)


GREY_LEVELS = 256  # the edge map is scored as an 8-bit image, as the public code saves it


def quantize_edge(prob: Tensor) -> Tensor:
    """uint8 grey level of an edge probability, as the public code writes the edge PNG.

    ``np.uint8(torch.sigmoid(x) * 255)`` there: the product in float32, then a cast, which
    truncates — ``floor(255·p)``, so p = 0.5 -> 127 and only p = 1 -> 255. Computed here on the
    tensor's device in float32 (wider inputs are narrowed first, as the public model's float32
    output is). ``prob`` must lie in [0, 1].
    """
    return (prob.float() * 255).to(torch.uint8)


def grey_level_table(thresholds: np.ndarray) -> np.ndarray:
    """[256] int64: for grey level q, the number of thresholds t with q / 255 >= t.

    So grey level q is positive at threshold k (0-based) iff ``table[q] > k``. The comparison is
    seism's ``read_one_png``: ``double(q) / 255.0 >= t``, both sides in double precision.
    """
    levels = np.arange(GREY_LEVELS, dtype=np.float64) / 255.0
    return np.searchsorted(np.asarray(thresholds, dtype=np.float64), levels, side="right")


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
    pred: np.ndarray,
    target: np.ndarray,
    thresholds: np.ndarray,
    max_dist: float,
    ignore_index: int = 255,
    nms: bool = True,
) -> np.ndarray:
    """[4, T] int64 counts for one image: matched pred, total pred, matched gt, total gt per threshold.

    ``pred`` [H, W] uint8 grey levels (:func:`quantize_edge`), compared as ``pred / 255 >= t``;
    ``target`` [H, W] in {0, 1, ignore_index}. Padding
    (``ignore_index``) is removed from both maps. The public code crops the padding off before
    evaluating, so the matching radius is ``max_dist`` × the diagonal of the valid region's
    bounding box, not of the padded array. With ``nms`` (default) the cropped grey levels first
    go through the public ``nms_process.m`` (:func:`fedmtl.metrics.edge_nms.structured_edge_nms`,
    which returns grey levels again); without it they are thresholded as they are.
    """
    if pred.dtype != np.uint8:
        raise TypeError(f"pred: expected uint8 grey levels (see quantize_edge), got dtype {pred.dtype}")
    counts = np.zeros((4, thresholds.size), dtype=np.int64)
    valid = target != ignore_index
    rows, cols = np.flatnonzero(valid.any(axis=1)), np.flatnonzero(valid.any(axis=0))
    if rows.size == 0:
        return counts  # a fully padded image carries no label
    box = slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)
    pred, target, valid = pred[box], target[box], valid[box]
    if nms:
        pred = structured_edge_nms(np.ascontiguousarray(pred))
    gt = (target == 1) & valid
    matcher = BoundaryMatcher(gt, max_dist * math.hypot(*gt.shape))
    counts[TOTAL_GT] = matcher.num_gt

    # level = number of thresholds t <= pred / 255, so (pred / 255 >= thresholds[k]) <=> (level > k).
    # The maps are nested (shrinking as t grows), so equal pixel counts mean equal maps.
    level = grey_level_table(thresholds)[pred]
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

    ``update(pred, target)``: ``pred`` [B, H, W] edge probability in [0, 1] (floating), which is
    first quantised to the uint8 grey level the public code saves (:func:`quantize_edge`), or
    those uint8 grey levels themselves (e.g. read from saved PNGs, i.e. FedHCA²'s ``edge/img``,
    not the ``edge/nms`` output); ``target`` [B, H, W] binary boundary map, ``ignore_index``
    marking padding. ``nms`` (default True): apply the public structured-edge non-maximum
    suppression to each image's grey levels before thresholding (module docstring, point 3);
    False thresholds the grey levels directly. The quantisation runs on the input's device;
    the NMS and the matching run per image on the CPU in numpy; the state is four [T] count
    tensors summed across processes.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    matched_pred: Tensor
    total_pred: Tensor
    matched_gt: Tensor
    total_gt: Tensor

    def __init__(
        self,
        max_dist: float = 0.0075,
        thresholds: int = 99,
        ignore_index: int = 255,
        nms: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not 0 <= max_dist < 1:
            raise ValueError(f"max_dist is a fraction of the image diagonal in [0, 1), got {max_dist}")
        if thresholds < 1:
            raise ValueError(f"thresholds must be a positive number of thresholds, got {thresholds}")
        self.max_dist = max_dist
        self.ignore_index = ignore_index
        self.nms = nms
        self.threshold_values = edge_thresholds(thresholds)
        for name in ("matched_pred", "total_pred", "matched_gt", "total_gt"):
            self.add_state(name, default=torch.zeros(thresholds, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        if pred.dtype != torch.uint8 and not torch.is_floating_point(pred):
            raise TypeError(
                f"pred: expected edge probabilities (floating) or uint8 grey levels, got dtype {pred.dtype}"
            )
        check_ndim("pred", pred, 3, "[B, H, W]")
        check_same_shape(pred, target)
        if pred.dtype != torch.uint8:
            check_probabilities("pred", pred)
            pred = quantize_edge(pred.detach())
        check_binary_target(target, self.ignore_index)
        pred_np = pred.detach().cpu().numpy()
        target_np = target.detach().cpu().numpy()
        counts = np.zeros((4, self.threshold_values.size), dtype=np.int64)
        for p, t in zip(pred_np, target_np):
            counts += edge_image_counts(
                p, t, self.threshold_values, self.max_dist, self.ignore_index, nms=self.nms
            )
        counts = torch.from_numpy(counts).to(self.matched_pred.device)
        self.matched_pred += counts[MATCHED_PRED]
        self.total_pred += counts[TOTAL_PRED]
        self.matched_gt += counts[MATCHED_GT]
        self.total_gt += counts[TOTAL_GT]

    def compute(self) -> Tensor:
        f = ods_f_per_threshold(self.matched_pred, self.total_pred, self.matched_gt, self.total_gt)
        return f.max() * 100
