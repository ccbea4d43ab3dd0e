"""The slow reference of the edge odsF counts: the code path before issue #13 made it fast.

:func:`reference_edge_image_counts` is :func:`fedmtl.metrics.edge.edge_image_counts` as it was:
per distinct binary map it thins with the vectorised numpy thinning (:func:`reference_thin`),
matches with a unit-capacity maximum flow (Dinic, ``scipy.sparse.csgraph.maximum_flow``) of
the pairs within the radius (:class:`BoundaryMatcher`), after the numpy port of the public NMS
(:func:`reference_structured_edge_nms`). The code below is that code, only renamed: the tests
check that the fast path gives exactly its counts, and ``benchmarks/edge_eval.py`` times both.
Not used by the metric itself, so it lives with the tests, outside the package. (Why a maximum
flow there: scipy's ``maximum_bipartite_matching`` gives the same counts but its depth-first
search does not prune dead ends, scipy issue #26147, and took seconds on the layered graphs
that parallel predicted lines produce.)
"""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import binary_dilation
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

from fedmtl.metrics.edge import MATCHED_GT, MATCHED_PRED, TOTAL_GT, TOTAL_PRED, disk, grey_level_table
from fedmtl.metrics.edge_nms import (
    _F32,
    NMS_BORDER,
    NMS_MULTIPLIER,
    NMS_RADIUS,
    gradient2,
    matlab_uint8,
)
from fedmtl.metrics.thinning import _DELETE_1, _DELETE_2, _NEIGHBOURS

_BIT_WEIGHTS = (1 << np.arange(8)).astype(np.int32)


def reference_thin(image: np.ndarray) -> np.ndarray:
    """Thin a 2-D binary map until it no longer changes; returns a bool array of the same shape.

    Pixels outside the image count as background (as in skimage and MATLAB).
    """
    if image.ndim != 2:
        raise ValueError(f"thin expects a 2-D map, got shape {image.shape}")
    h, w = image.shape
    width = w + 2
    skel = np.zeros((h + 2, width), dtype=np.uint8)  # 1-pixel background frame: no bounds checks
    skel[1:-1, 1:-1] = image != 0
    flat = skel.ravel()
    offsets = np.array([dr * width + dc for dr, dc in _NEIGHBOURS])
    stamp = np.empty(flat.size, dtype=np.int64)  # scratch for an O(n) de-duplication

    def foreground_unique(idx: np.ndarray) -> np.ndarray:
        idx = idx[flat[idx] == 1]
        order = np.arange(idx.size)
        stamp[idx] = order  # the last write wins: keep exactly one copy of each index
        return idx[stamp[idx] == order]

    candidates = np.flatnonzero(flat)
    touched_prev = np.empty(0, dtype=np.int64)
    step, idle_steps = 0, 0
    while idle_steps < 2:  # two sub-iterations in a row without deletion: nothing can change any more
        table = _DELETE_1 if step % 2 == 0 else _DELETE_2
        codes = flat[candidates[:, None] + offsets].astype(np.int32) @ _BIT_WEIGHTS
        deleted = candidates[table[codes]]
        flat[deleted] = 0  # all deletions of a sub-iteration are decided first, then applied
        idle_steps = 0 if deleted.size else idle_steps + 1
        touched = (deleted[:, None] + offsets).ravel()
        if step == 0:
            # No pixel has been judged by the second table yet: it must see all survivors.
            next_candidates = candidates[flat[candidates] == 1]
        else:
            next_candidates = foreground_unique(np.concatenate([touched, touched_prev]))
        candidates, touched_prev = next_candidates, touched
        step += 1
    return skel[1:-1, 1:-1].astype(bool)


def reference_conv_tri1_mex(image: np.ndarray, p: np.float32) -> np.ndarray:
    """convConst.cpp ``convTri1`` with s = 1, float32, in the C code's operation order."""
    nrm = _F32(1) / ((p + _F32(2)) * (p + _F32(2)))
    left = np.concatenate([image[:, :1], image[:, :-1]], axis=1)  # Il: x-1, or x itself at x = 0
    right = np.concatenate([image[:, 1:], image[:, -1:]], axis=1)  # Ir: x+1, or x at x = w-1
    t = nrm * ((left + p * image) + right)
    out = np.empty_like(t)
    out[1:-1] = (t[:-2] + p * t[1:-1]) + t[2:]
    out[0] = (_F32(1) + p) * t[0] + t[1]
    out[-1] = t[-2] + (_F32(1) + p) * t[-1]
    return out


def reference_conv_tri(image: np.ndarray, r: float) -> np.ndarray:
    """Piotr's ``convTri(I, r)`` of a 2-D float32 map (symmetric padding); float32 out."""
    image = np.asarray(image, dtype=_F32)
    if r == 0:
        return image.copy()
    if r < 0 or (r > 1 and r != int(r)):
        raise ValueError(f"convTri radius must be in (0, 1] or an integer, got {r}")
    h, w = image.shape
    if 0 < r <= 1 and 2 * r + 1 < min(h, w):  # convTri.m: the mex only when 2r+1 < min(h, w)
        return reference_conv_tri1_mex(image, _F32(12 / r / (r + 2) - 2))
    if r <= 1:
        p = 12 / r / (r + 2) - 2
        taps, r = np.array([1.0, p, 1.0]) / (2 + p), 1
    else:
        r = int(r)
        taps = np.concatenate([np.arange(1, r + 2), np.arange(r, 0, -1)]) / (r + 1) ** 2
    padded = np.pad(image.astype(np.float64), r, mode="symmetric")  # = padarray(…, 'symmetric')
    rows = sum(t * padded[:, k : k + w] for k, t in enumerate(taps))
    return sum(t * rows[k : k + h] for k, t in enumerate(taps)).astype(_F32)


def reference_edge_orientation(edges: np.ndarray) -> np.ndarray:
    """nms_process.m: ``O = mod(atan(Oyy.*sign(-Oxy)./(Oxx+1e-5)), pi)`` of ``convTri(E, 4)``."""
    ox, oy = gradient2(reference_conv_tri(edges, 4))
    oxx, _ = gradient2(ox)
    oxy, oyy = gradient2(oy)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (oyy * np.sign(-oxy)) / (oxx + _F32(1e-5))
    angle = np.arctan(ratio.astype(np.float64)).astype(_F32)
    angle = np.where(angle < 0, angle + _F32(math.pi), angle)
    return np.nan_to_num(angle, nan=0.0).astype(_F32)


def _interp(flat: np.ndarray, h: int, w: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """edgesNmsMex.cpp ``interp``: bilinear value of the [h, w] map ``flat`` (raveled) at (x, y)."""
    x = np.where(x < 0, _F32(0), np.where(x.astype(np.float64) > w - 1.001, _F32(w - 1.001), x))
    y = np.where(y < 0, _F32(0), np.where(y.astype(np.float64) > h - 1.001, _F32(h - 1.001), y))
    x0, y0 = x.astype(np.int64), y.astype(np.int64)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)  # only h or w = 1 needs this
    dx0, dy0 = x - x0.astype(_F32), y - y0.astype(_F32)
    dx1, dy1 = _F32(1) - dx0, _F32(1) - dy0
    return (
        flat[y0 * w + x0] * dx1 * dy1
        + flat[y0 * w + x1] * dx0 * dy1
        + flat[y1 * w + x0] * dx1 * dy0
        + flat[y1 * w + x1] * dx0 * dy0
    )


def reference_edges_nms(
    edges: np.ndarray,
    orientation: np.ndarray,
    r: int = NMS_RADIUS,
    s: int = NMS_BORDER,
    m: float = NMS_MULTIPLIER,
) -> np.ndarray:
    """pdollar/edges ``edgesNmsMex(E, O, r, s, m)`` of an [H, W] map; float32 out."""
    e0 = np.asarray(edges, dtype=_F32)
    h, w = e0.shape
    out = e0.copy()
    ys, xs = np.nonzero(e0)
    if ys.size:
        flat = e0.ravel()
        e = flat[ys * w + xs] * _F32(m)
        theta = orientation[ys, xs].astype(np.float64)
        cos_o, sin_o = np.cos(theta).astype(_F32), np.sin(theta).astype(_F32)
        xf, yf = xs.astype(_F32), ys.astype(_F32)
        suppressed = np.zeros(ys.size, dtype=bool)
        for d in range(-r, r + 1):
            if d:
                neighbour = _interp(flat, h, w, xf + _F32(d) * cos_o, yf + _F32(d) * sin_o)
                suppressed |= e < neighbour
        out[ys[suppressed], xs[suppressed]] = 0
    # "suppress noisy edge estimates near boundaries"
    s = min(s, w // 2, h // 2)
    if s > 0:
        fade = np.arange(s, dtype=_F32) / _F32(s)
        cols, rows = np.ones(w, dtype=_F32), np.ones(h, dtype=_F32)
        cols[:s], cols[w - s :] = fade, fade[::-1]
        rows[:s], rows[h - s :] = fade, fade[::-1]
        out *= cols[None, :]
        out *= rows[:, None]
    return out


def reference_structured_edge_nms(levels: np.ndarray) -> np.ndarray:
    """[H, W] uint8 grey levels -> [H, W] uint8 grey levels after innovator-zero/seism ``nms_process.m``."""
    if levels.dtype != np.uint8 or levels.ndim != 2:
        raise TypeError(f"expected a 2-D uint8 grey-level map, got {levels.dtype} of shape {levels.shape}")
    edges = reference_conv_tri((levels.astype(np.float64) / 255.0).astype(_F32), 1)
    edges = reference_edges_nms(edges, reference_edge_orientation(edges))
    return matlab_uint8(edges * _F32(255))


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


def reference_edge_image_counts(
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
    ``target`` [H, W] in {0, 1, ignore_index}. Padding
    (``ignore_index``) is removed from both maps. The public code crops the padding off before
    evaluating, so the matching radius is ``max_dist`` × the diagonal of the valid region's
    bounding box, not of the padded array. With ``nms`` (default) the cropped grey levels first
    go through the public ``nms_process.m`` (:func:`fedmtl.metrics.edge_nms.structured_edge_nms`,
    which returns grey levels again); without it they are thresholded as they are. With
    ``thin_gt`` the ground-truth boundary is thinned (:func:`reference_thin`) before matching.
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
        pred = reference_structured_edge_nms(np.ascontiguousarray(pred))
    gt = (target == 1) & valid
    if thin_gt:
        gt = reference_thin(gt)
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
        boundary = reference_thin(level > k)
        matched = matcher.count_matches(boundary)
        counts[MATCHED_PRED, k] = counts[MATCHED_GT, k] = matched  # one-to-one: the same number
        counts[TOTAL_PRED, k] = np.count_nonzero(boundary)
    return counts
