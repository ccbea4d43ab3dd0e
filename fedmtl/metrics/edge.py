"""Optimal-dataset-scale F-measure (odsF) for boundary detection.

Per image and per threshold t = 0.01 … 0.99, binarise the prediction (after the public
pipeline's quantisation and non-maximum suppression, below),
thin it, and match predicted boundary pixels to ground-truth boundary pixels one-to-one within
``max_dist`` × image diagonal (0.0075 PASCAL-Context, 0.011 NYUD-v2); pool the counts over
images per threshold; P = matched predicted / predicted, R = matched ground truth / ground
truth, F = 2PR / (P + R); odsF = max over thresholds, in %.

Where each step comes from
--------------------------
The steps reproduce the public pipeline: FedHCA² saves every edge map as an 8-bit PNG
(``uint8(255·σ)``, truncation: :func:`quantize_edge`) and the authors' fork of SEISM scores
the PNGs after the structured-edge NMS (:func:`fedmtl.metrics.edge_nms.structured_edge_nms`),
at thresholds q/255 >= t for t = 0.01 … 0.99 (:func:`grey_level_table`), thinning each
binarised prediction and the ground-truth boundary map with ``bwmorph(·, 'thin', Inf)``
(:func:`fedmtl.metrics.thinning.thin`; ``EdgeODSF(thin_gt=False)`` matches against the unthinned
map), with ``maxDist`` 0.011 for NYUD and 0.0075 otherwise, and pooling the counts over images
per threshold before F (zero denominators give F = 0). The ground truth is the validation
target the loader gives: PASCAL-Context's ``seg2bmap`` of the LabelMap, as SEISM; NYUD's
``edge/<id>.png``. The documentation's "Evaluation and metrics" page (``docs/evaluation.md``,
"Edge odsF") gives each step with the source file and line it follows.

The matching
------------
This replaces the BSDS benchmark's MATLAB ``correspondPixels``, which the public code calls.
Like it, the matching is a bipartite assignment, not a distance transform: one ground-truth
pixel can vindicate only one predicted pixel, so two parallel predicted lines next to one true
line cannot both count. ``correspondPixels`` solves a min-cost assignment with outlier costs;
every pair within the radius is admissible and every match lowers the cost, so its matched
counts equal a maximum-cardinality matching, which is what is computed here. A pair is
admissible when its Euclidean distance is <= radius.

How the 99 thresholds are evaluated
----------------------------------
Exactly the counts of thinning and matching every binarised map on its own (the earlier code,
kept as ``reference_edge_image_counts`` in ``tests/edge_reference.py``; the tests compare
the two), computed by one compiled (numba) pass over the thresholds per image,
:func:`_threshold_counts`:

* Only distinct maps are evaluated: a threshold whose map has as many pixels as the previous
  one's has the same map (the maps are nested), and its counts are copied.
* The pixels are sorted once by level (counting sort), so the pixels leaving the map between
  two thresholds are a slice of that order.
* A connected component of the new map that no leaving pixel touches (8-neighbourhood) is a
  component of the previous map as it was, and keeps its thinned pixels: a component thins
  independently of the rest of the map, and a thinned map is a fixed point of the thinning.
  Only the touched components are found (flood fill from the leaving pixels), restored and
  thinned again.
* Thinning (:func:`fedmtl.metrics.thinning.thin_canvas`) re-examines only the neighbours of the
  pixels deleted in the last two sub-iterations.
* Matching is restricted to predicted pixels within the radius of some ground-truth pixel (the
  others can never match; they count as predicted, unmatched); the pairs are listed once per
  image. The first map is matched with Hopcroft-Karp (greedy start, dead-end pruning); each
  later one starts from the previous maximum matching minus the pixels that left, then runs
  one augmenting-path search from each ground-truth pixel they freed and from each pixel that
  joined (why that gives a maximum matching: the comment in :func:`_threshold_counts`;
  Hopcroft-Karp again when many pixels changed). The size of a maximum matching does not
  depend on how it is reached, so the counts are exact.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import torch
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
from fedmtl.metrics.thinning import DELETION_TABLES, neighbour_offsets, thin, thin_canvas

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


_UNREACHED = 1 << 62  # Hopcroft-Karp layer of a vertex no alternating path reaches


@numba.njit(cache=True, nogil=True)
def _hopcroft_karp(
    alive: np.ndarray,
    num_alive: int,
    ptr: np.ndarray,
    adj: np.ndarray,
    match_l: np.ndarray,
    match_r: np.ndarray,
    layer: np.ndarray,
    next_edge: np.ndarray,
    queue: np.ndarray,
    stack_l: np.ndarray,
    stack_r: np.ndarray,
) -> int:
    """Grow the matching (``match_l``/``match_r``, -1 = free) of the left vertices ``alive[:num_alive]``
    (edges ``adj[ptr[u]:ptr[u + 1]]``) to a maximum one; returns the number of matches added.

    Hopcroft-Karp: per phase a breadth-first layering from the free left vertices, then
    depth-first augmenting paths along the layers; a vertex from which no path was found is
    dropped from the layering (dead-end pruning), so a phase costs O(edges).
    """
    added = 0
    for a in range(num_alive):  # greedy start: fewer phases
        u = alive[a]
        if match_l[u] < 0:
            for e in range(ptr[u], ptr[u + 1]):
                if match_r[adj[e]] < 0:
                    match_l[u] = adj[e]
                    match_r[adj[e]] = u
                    added += 1
                    break
    while True:
        tail = 0
        for a in range(num_alive):
            u = alive[a]
            if match_l[u] < 0:
                layer[u] = 0
                queue[tail] = u
                tail += 1
            else:
                layer[u] = _UNREACHED
        if tail == 0:
            return added
        head = 0
        found = False
        while head < tail:
            u = queue[head]
            head += 1
            for e in range(ptr[u], ptr[u + 1]):
                v = match_r[adj[e]]
                if v < 0:
                    found = True
                elif layer[v] == _UNREACHED:
                    layer[v] = layer[u] + 1
                    queue[tail] = v
                    tail += 1
        if not found:
            return added
        for a in range(num_alive):
            u = alive[a]
            next_edge[u] = ptr[u]
        for a in range(num_alive):
            root = alive[a]
            if match_l[root] >= 0:
                continue
            top = 0
            stack_l[0] = root
            while top >= 0:
                u = stack_l[top]
                if next_edge[u] < ptr[u + 1]:
                    g = adj[next_edge[u]]
                    next_edge[u] += 1
                    v = match_r[g]
                    if v < 0:  # free ground-truth pixel: flip the path root -> … -> u -> g
                        stack_r[top] = g
                        for j in range(top + 1):
                            match_l[stack_l[j]] = stack_r[j]
                            match_r[stack_r[j]] = stack_l[j]
                        added += 1
                        break
                    if layer[v] == layer[u] + 1:
                        stack_r[top] = g
                        top += 1
                        stack_l[top] = v
                else:
                    layer[u] = _UNREACHED  # dead end for the rest of the phase
                    top -= 1


@numba.njit(cache=True, nogil=True)
def _augment_from_left(
    root: int,
    ptr: np.ndarray,
    adj: np.ndarray,
    match_l: np.ndarray,
    match_r: np.ndarray,
    seen_r: np.ndarray,
    tag: int,
    next_edge: np.ndarray,
    stack_l: np.ndarray,
    stack_r: np.ndarray,
) -> bool:
    """Depth-first search for an augmenting path from the free left vertex ``root``; flips it.

    Right vertices already stamped ``tag`` in ``seen_r`` are skipped: the caller keeps the tag
    across searches that failed (what they reached leads to no free vertex while the matching
    is unchanged) and takes a new one after a success.
    """
    top = 0
    stack_l[0] = root
    next_edge[root] = ptr[root]
    while top >= 0:
        u = stack_l[top]
        if next_edge[u] < ptr[u + 1]:
            g = adj[next_edge[u]]
            next_edge[u] += 1
            if seen_r[g] == tag:
                continue
            seen_r[g] = tag
            stack_r[top] = g
            v = match_r[g]
            if v < 0:
                for j in range(top + 1):
                    match_l[stack_l[j]] = stack_r[j]
                    match_r[stack_r[j]] = stack_l[j]
                return True
            top += 1
            stack_l[top] = v
            next_edge[v] = ptr[v]
        else:
            top -= 1
    return False


@numba.njit(cache=True, nogil=True)
def _augment_from_right(
    root: int,
    rptr: np.ndarray,
    radj: np.ndarray,
    alive_flag: np.ndarray,
    match_l: np.ndarray,
    match_r: np.ndarray,
    seen_l: np.ndarray,
    tag: int,
    next_edge: np.ndarray,
    stack_r: np.ndarray,
    stack_l: np.ndarray,
) -> bool:
    """:func:`_augment_from_left` mirrored: from the free right vertex ``root`` over the alive
    left vertices (``radj[rptr[g]:rptr[g + 1]]``: the left neighbours of g)."""
    top = 0
    stack_r[0] = root
    next_edge[root] = rptr[root]
    while top >= 0:
        g = stack_r[top]
        if next_edge[g] < rptr[g + 1]:
            u = radj[next_edge[g]]
            next_edge[g] += 1
            if not alive_flag[u] or seen_l[u] == tag:
                continue
            seen_l[u] = tag
            stack_l[top] = u
            h = match_l[u]
            if h < 0:
                for j in range(top + 1):
                    match_r[stack_r[j]] = stack_l[j]
                    match_l[stack_l[j]] = stack_r[j]
                return True
            top += 1
            stack_r[top] = h
            next_edge[h] = rptr[h]
        else:
            top -= 1
    return False


@numba.njit(cache=True, nogil=True)
def _threshold_counts(
    grey: np.ndarray,
    valid: np.ndarray,
    gt: np.ndarray,
    table: np.ndarray,
    num_thresholds: int,
    stencil_dy: np.ndarray,
    stencil_dx: np.ndarray,
    frame: int,
    neighbours: np.ndarray,
    tables: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(thinned pixels [T], matched pixels [T], ground-truth pixels) of one image.

    ``grey`` [H, W] uint8 and ``table`` (:func:`grey_level_table`) give the level of each
    ``valid`` pixel (0 elsewhere): the pixel is in the map of threshold k iff level > k;
    ``gt`` [H, W] bool; the stencil lists the offsets within the radius; ``frame`` >= max(1,
    stencil reach) pads the canvas so that no index leaves it; ``neighbours`` are the 8
    thinning offsets for the padded width (:func:`fedmtl.metrics.thinning.neighbour_offsets`).
    """
    h, w = grey.shape
    width = w + 2 * frame
    size = (h + 2 * frame) * width
    total = np.zeros(num_thresholds, dtype=np.int64)
    matched = np.zeros(num_thresholds, dtype=np.int64)
    # Levels on the padded canvas, and above[k] = number of pixels with level > k.
    lv = np.zeros(size, dtype=np.int32)
    above = np.zeros(num_thresholds + 2, dtype=np.int64)
    num_gt = 0
    for y in range(h):
        for x in range(w):
            if gt[y, x]:
                num_gt += 1
            if valid[y, x]:
                level = table[grey[y, x]]
                if level > 0:
                    lv[(y + frame) * width + x + frame] = level
                    above[level - 1] += 1
    for k in range(num_thresholds - 1, -1, -1):
        above[k] += above[k + 1]
    n_all = above[0]
    if n_all == 0:
        return total, matched, num_gt
    # Counting sort, highest level first: the map of threshold k is order[:above[k]].
    fill = above[1:].copy()  # fill[level - 1] = first slot of that level
    order = np.empty(n_all, dtype=np.int64)
    canvas = np.zeros(size, dtype=np.uint8)
    for p in range(size):
        level = lv[p]
        if level > 0:
            order[fill[level - 1]] = p
            fill[level - 1] += 1
            canvas[p] = 1
    # Ground-truth ids, and the predicted pixels within the radius of one (the left vertices)
    # with their ground-truth neighbours (CSR: adj[ptr[u]:ptr[u + 1]]).
    gt_pos = np.empty(num_gt, dtype=np.int64)
    g = 0
    for y in range(h):
        for x in range(w):
            if gt[y, x]:
                gt_pos[g] = (y + frame) * width + x + frame
                g += 1
    offsets = stencil_dy * width + stencil_dx
    left_id = np.full(size, -1, dtype=np.int32)
    left_pos = np.empty(n_all, dtype=np.int64)
    degree = np.zeros(n_all + 1, dtype=np.int64)
    rptr = np.zeros(num_gt + 1, dtype=np.int64)
    num_left = 0
    for g in range(num_gt):  # radj[rptr[g]:rptr[g + 1]]: the left neighbours of g, in this order
        for o in offsets:
            q = gt_pos[g] + o
            if canvas[q]:
                u = left_id[q]
                if u < 0:
                    u = num_left
                    left_id[q] = u
                    left_pos[u] = q
                    num_left += 1
                degree[u + 1] += 1
                rptr[g + 1] += 1
    for g in range(num_gt):
        rptr[g + 1] += rptr[g]
    ptr = degree[: num_left + 1]
    for u in range(num_left):
        ptr[u + 1] += ptr[u]
    adj = np.empty(ptr[num_left], dtype=np.int64)
    radj = np.empty(rptr[num_gt], dtype=np.int64)
    cursor = ptr[:num_left].copy()
    e = 0
    for g in range(num_gt):
        for o in offsets:
            u = left_id[gt_pos[g] + o]
            if u >= 0:
                adj[cursor[u]] = g
                cursor[u] += 1
                radj[e] = u
                e += 1

    # Thinning state: the canvas holds the thinned map of the last evaluated threshold.
    deleted = np.empty(n_all, dtype=np.int64)
    dirty = np.empty(n_all, dtype=np.int64)
    codes = np.empty(size, dtype=np.uint8)
    mark = np.full(size, -1, dtype=np.int32)  # de-duplication stamps of flood fills and thinning
    tick = 0
    # Matching state, carried from threshold to threshold.
    match_l = np.full(num_left, -1, dtype=np.int64)
    match_r = np.full(num_gt, -1, dtype=np.int64)
    alive = np.empty(num_left, dtype=np.int64)
    alive_flag = np.zeros(num_left, dtype=np.uint8)
    layer = np.empty(num_left, dtype=np.int64)
    next_edge = np.empty(num_left, dtype=np.int64)
    next_edge_r = np.empty(num_gt, dtype=np.int64)
    queue = np.empty(num_left, dtype=np.int64)
    stack_l = np.empty(num_left + 1, dtype=np.int64)
    stack_r = np.empty(max(num_left, num_gt) + 1, dtype=np.int64)
    seen_l = np.full(num_left, -1, dtype=np.int64)
    seen_r = np.full(num_gt, -1, dtype=np.int64)
    new_left = np.empty(num_left, dtype=np.int64)
    freed_right = np.empty(num_left, dtype=np.int64)
    tag = 0
    num_on, num_matched, num_live = n_all, 0, 0
    last = -1  # the last threshold evaluated
    for k in range(num_thresholds):
        if above[k] == 0:
            break  # every later map is empty as well
        if last >= 0 and above[k] == above[last]:
            total[k], matched[k] = total[last], matched[last]  # nested maps: the same map
            continue
        if last < 0:
            num_dirty = n_all
            for j in range(n_all):
                dirty[j] = order[j]
        else:
            # The pixels at levels (last, k] leave the map. A connected component of the new
            # map that none of them touches (8-neighbourhood) was a component of the previous
            # map as it is, and its thinned pixels in the canvas stay as they are (a component
            # thins independently of the rest of the map, and a thinned map is a fixed point).
            # The components they touch are restored to their unthinned pixels and thinned anew.
            lo, hi = above[k], above[last]
            for j in range(lo, hi):
                p = order[j]
                if canvas[p]:
                    canvas[p] = 0
                    num_on -= 1
            num_dirty = 0
            for j in range(lo, hi):
                r = order[j]
                for d in range(8):
                    seed = r + neighbours[d]
                    if lv[seed] > k and mark[seed] != tick:
                        mark[seed] = tick
                        head = num_dirty
                        dirty[num_dirty] = seed
                        num_dirty += 1
                        while head < num_dirty:  # breadth-first flood fill of the component
                            p = dirty[head]
                            head += 1
                            for e in range(8):
                                q = p + neighbours[e]
                                if lv[q] > k and mark[q] != tick:
                                    mark[q] = tick
                                    dirty[num_dirty] = q
                                    num_dirty += 1
            tick += 1
            for j in range(num_dirty):
                p = dirty[j]
                if not canvas[p]:
                    canvas[p] = 1
                    num_on += 1
        num_deleted, tick = thin_canvas(
            canvas, neighbours, tables, dirty[:num_dirty], deleted, codes, mark, tick
        )
        num_on -= num_deleted
        total[k] = num_on
        # Matching, from the previous threshold's maximum matching. First the pixels that left
        # the map: without them the matching lacks their partners, and every augmenting path
        # then ends at one of those freed ground-truth pixels (a path between two vertices free
        # before would have augmented the previous matching), so one search from each freed
        # pixel restores a maximum matching; an augmentation from one matches no other free
        # ground-truth pixel, and a vertex with no augmenting path never gets one through later
        # augmentations (the lemma behind Kuhn's algorithm). Then the pixels that joined the
        # map, all free: every augmenting path now starts at one of them, and the same argument
        # holds with the sides swapped. The first map, or many changes: Hopcroft-Karp.
        # Only the pixels that left the map and those of the components thinned anew can have
        # changed (the two sets are disjoint).
        lo, hi = (above[k], above[last]) if last >= 0 else (0, 0)
        num_new, num_freed = 0, 0
        for j in range(num_dirty + hi - lo):
            p = dirty[j] if j < num_dirty else order[lo + j - num_dirty]
            u = left_id[p]
            if u < 0:
                continue
            if canvas[p]:
                if not alive_flag[u]:
                    new_left[num_new] = u
                    num_new += 1
            elif alive_flag[u]:
                alive_flag[u] = 0
                num_live -= 1
                if match_l[u] >= 0:
                    freed_right[num_freed] = match_l[u]
                    num_freed += 1
                    match_r[match_l[u]] = -1
                    match_l[u] = -1
                    num_matched -= 1
        num_live += num_new
        if last < 0 or 4 * (num_new + num_freed) > num_live:
            for j in range(num_new):
                alive_flag[new_left[j]] = 1
            num_alive = 0
            for u in range(num_left):
                if alive_flag[u]:
                    alive[num_alive] = u
                    num_alive += 1
            num_matched += _hopcroft_karp(
                alive, num_alive, ptr, adj, match_l, match_r, layer, next_edge, queue, stack_l, stack_r
            )
        else:
            tag += 1
            for j in range(num_freed):  # the joining pixels are not in the graph yet
                if _augment_from_right(
                    freed_right[j],
                    rptr,
                    radj,
                    alive_flag,
                    match_l,
                    match_r,
                    seen_l,
                    tag,
                    next_edge_r,
                    stack_r,
                    stack_l,
                ):
                    num_matched += 1
                    tag += 1
            tag += 1
            for j in range(num_new):
                alive_flag[new_left[j]] = 1
            for j in range(num_new):
                if _augment_from_left(
                    new_left[j], ptr, adj, match_l, match_r, seen_r, tag, next_edge, stack_l, stack_r
                ):
                    num_matched += 1
                    tag += 1
        matched[k] = num_matched
        last = k
    return total, matched, num_gt


def ground_truth_boundary(target: np.ndarray, valid: np.ndarray, thin_gt: bool) -> np.ndarray:
    """The boundary pixels matched against: ``target == 1`` where valid, thinned if ``thin_gt``."""
    gt = (target == 1) & valid
    return thin(gt) if thin_gt else gt


def edge_image_counts(
    pred: np.ndarray,
    target: np.ndarray,
    thresholds: np.ndarray,
    max_dist: float,
    ignore_index: int = 255,
    nms: bool = True,
    thin_gt: bool = True,
) -> np.ndarray:
    """[4, T] int64 counts for one image: matched pred, total pred, matched gt, total gt per threshold.

    ``pred`` [H, W] uint8 grey levels (:func:`quantize_edge`), compared as ``pred / 255 >= t``;
    ``target`` [H, W] in {0, 1, ignore_index}; with ``thin_gt`` (default) its boundary pixels
    are thinned after cropping, as SEISM does (docs/evaluation.md, "4. Thinning"). Padding
    (``ignore_index``) is removed from both maps. The public code crops the padding off before
    evaluating, so the matching radius is ``max_dist`` × the diagonal of the valid region's
    bounding box, not of the padded array. With ``nms`` (default) the cropped grey levels first
    go through the public ``nms_process.m`` (:func:`fedmtl.metrics.edge_nms.structured_edge_nms`,
    which returns grey levels again); without it they are thresholded as they are. Per
    threshold the binary map is thinned and matched (module docstring, last section).
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
    gt = ground_truth_boundary(target, valid, thin_gt)
    radius = max_dist * math.hypot(*gt.shape)
    stencil_dy, stencil_dx = np.nonzero(disk(radius))
    reach = math.floor(radius)
    frame = max(1, reach)
    # level = number of thresholds t <= pred / 255 (the table), so pred / 255 >= thresholds[k]
    # iff level > k.
    total, matched, num_gt = _threshold_counts(
        pred,
        valid,
        gt,
        grey_level_table(thresholds),
        thresholds.size,
        stencil_dy - reach,
        stencil_dx - reach,
        frame,
        neighbour_offsets(gt.shape[1] + 2 * frame),
        DELETION_TABLES,
    )
    counts[TOTAL_PRED] = total
    counts[MATCHED_PRED] = counts[MATCHED_GT] = matched  # one-to-one: the same number
    counts[TOTAL_GT] = num_gt
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
    suppression to each image's grey levels before thresholding (docs/evaluation.md, "3.
    Non-maximum suppression"); False thresholds the grey levels directly. ``thin_gt`` (default
    True): thin the ground-truth boundary map before matching, as the authors' SEISM fork does
    (docs/evaluation.md, "4. Thinning"); False matches against the map as given. The quantisation runs on the input's device;
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
        thin_gt: bool = True,
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
        self.thin_gt = thin_gt
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
                p,
                t,
                self.threshold_values,
                self.max_dist,
                self.ignore_index,
                nms=self.nms,
                thin_gt=self.thin_gt,
            )
        counts = torch.from_numpy(counts).to(self.matched_pred.device)
        self.matched_pred += counts[MATCHED_PRED]
        self.total_pred += counts[TOTAL_PRED]
        self.matched_gt += counts[MATCHED_GT]
        self.total_gt += counts[TOTAL_GT]

    def compute(self) -> Tensor:
        f = ods_f_per_threshold(self.matched_pred, self.total_pred, self.matched_gt, self.total_gt)
        return f.max() * 100
