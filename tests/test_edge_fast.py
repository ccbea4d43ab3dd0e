"""The fast edge odsF counts (issue #13) equal the straightforward reference, exactly.

``tests/edge_reference.py`` is the code path before the speed-up: the numpy NMS, the
numpy thinning of every distinct binary map on its own, a maximum flow per map. The fast path
(``edge_image_counts``: numba NMS arithmetic, thinning reused across thresholds per connected
component, matching carried from threshold to threshold) must give the same [4, T] counts on
every image; its pieces are checked on their own too (NMS grey levels, thinning, the
incremental matching against scipy's maximum matching).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_bipartite_matching
from skimage.morphology import thin as skimage_thin

from fedmtl.data.pascal_context import seg2bmap
from fedmtl.metrics.edge import (
    _augment_from_left,
    _augment_from_right,
    _hopcroft_karp,
    edge_image_counts,
    edge_thresholds,
)
from fedmtl.metrics.edge_nms import conv_tri, edge_orientation, edges_nms, structured_edge_nms
from fedmtl.metrics.thinning import thin
from tests.edge_reference import (
    reference_conv_tri,
    reference_edge_image_counts,
    reference_edge_orientation,
    reference_edges_nms,
    reference_structured_edge_nms,
    reference_thin,
)

SHAPES = [(64, 64), (45, 83)]  # square, and non-square with odd sides


def _regions(shape: tuple[int, int], rng: np.random.Generator, scale: float = 8) -> np.ndarray:
    """Smooth random regions: argmax of 4 blurred noise channels."""
    channels = gaussian_filter(rng.standard_normal((4, *shape)), sigma=(0, scale, scale))
    return channels.argmax(axis=0)


def _grey(prob: np.ndarray) -> np.ndarray:
    """uint8(float32(p) · 255), as quantize_edge."""
    return (np.clip(prob, 0, 1).astype(np.float32) * np.float32(255)).astype(np.uint8)


def _rings(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Circles of random centres and radii, 1-3 px thick."""
    y, x = np.mgrid[: shape[0], : shape[1]]
    out = np.zeros(shape)
    for _ in range(4):
        cy, cx = rng.uniform(0, shape[0]), rng.uniform(0, shape[1])
        r, width = rng.uniform(4, min(shape) / 2), rng.uniform(0.5, 1.5)
        out = np.maximum(out, (np.abs(np.hypot(y - cy, x - cx) - r) <= width) * rng.uniform(0.3, 1))
    return out


def _lines(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """1-px straight lines in random directions, of random strength, some touching."""
    out = np.zeros(shape)
    for _ in range(6):
        y0, x0, y1, x1 = rng.uniform(0, 1, 4) * [shape[0] - 1, shape[1] - 1, shape[0] - 1, shape[1] - 1]
        t = np.linspace(0, 1, 2 * sum(shape))
        out[np.round(y0 + t * (y1 - y0)).astype(int), np.round(x0 + t * (x1 - x0)).astype(int)] = rng.uniform(
            0.2, 1
        )
    return out


def _case(name: str, shape: tuple[int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(pred uint8 grey levels, target 0/1 uint8) of one named test image."""
    rng = np.random.default_rng(seed)
    gt = seg2bmap(_regions(shape, rng)).astype(np.uint8)
    if name == "blurry gaussians":  # every pixel > 0.01: the maps at low thresholds are blobs
        y, x = np.mgrid[: shape[0], : shape[1]]
        blobs = sum(
            rng.uniform(0.3, 1)
            * np.exp(
                -((y - rng.uniform(0, shape[0])) ** 2 + (x - rng.uniform(0, shape[1])) ** 2)
                / (2 * rng.uniform(3, 12) ** 2)
            )
            for _ in range(6)
        )
        prob = 0.012 + 0.976 * blobs / blobs.max()
    elif (
        name == "blurred boundaries"
    ):  # a barely trained model: the true boundaries, blurred, plus smooth noise
        logit = (
            4 * gaussian_filter(gt.astype(float), 1.5) + gaussian_filter(rng.standard_normal(shape), 4) * 3
        )
        prob = 1 / (1 + np.exp(-logit))
    elif name == "random noise":
        prob = rng.random(shape)
    elif name == "thin lines":
        prob = _lines(shape, rng)
    elif name == "circles":
        gt = (_rings(shape, np.random.default_rng(seed)) > 0).astype(np.uint8)
        prob = _rings(shape, np.random.default_rng(seed)) + 0.05 * rng.random(shape)
        prob[1::7, :] = np.roll(prob, 1, axis=0)[1::7, :]  # the prediction a pixel off in places
    elif name == "sharp":
        prob = 0.9 * gt + 0.05 * rng.random(shape)
    elif name == "empty prediction":
        prob = np.zeros(shape)
    elif name == "empty ground truth":
        prob, gt = gaussian_filter(rng.random(shape), 2), np.zeros(shape, dtype=np.uint8)
    else:
        raise ValueError(name)
    return _grey(prob), gt


CASES = [
    "blurry gaussians",
    "blurred boundaries",
    "random noise",
    "thin lines",
    "circles",
    "sharp",
    "empty prediction",
    "empty ground truth",
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("nms", [True, False], ids=["nms", "no-nms"])
@pytest.mark.parametrize("case", CASES)
def test_counts_equal_the_reference(case: str, nms: bool, shape: tuple[int, int]) -> None:
    pred, gt = _case(case, shape, seed=CASES.index(case))
    thresholds = edge_thresholds()
    # Radius ~1.05 px (the 4-neighbours: the demo's 96x96 at 0.0075) and ~5.5 px (PASCAL's 512x512).
    for max_dist in (0.0115, 0.06):
        fast = edge_image_counts(pred, gt, thresholds, max_dist, nms=nms)
        expected = reference_edge_image_counts(pred, gt, thresholds, max_dist, nms=nms)
        np.testing.assert_array_equal(fast, expected)
    # The ground truth as given (EdgeODSF(thin_gt=False)): the fast path still equals the reference.
    np.testing.assert_array_equal(
        edge_image_counts(pred, gt, thresholds, 0.0115, nms=nms, thin_gt=False),
        reference_edge_image_counts(pred, gt, thresholds, 0.0115, nms=nms, thin_gt=False),
    )
    if case == "empty prediction":
        assert fast[:3].sum() == 0 and fast[3, 0] == thin(gt).sum()
    if case == "empty ground truth":
        assert fast[3].sum() == 0 and fast[0].sum() == 0 and fast[1, 0] > 0


@pytest.mark.parametrize(
    ("max_dist", "num_thresholds"),
    [(0.03, 99), (0.1, 99), (0.0, 99), (0.011, 9), (0.011, 255), (0.011, 1000)],
    # radius 2.0 and 6.6 px (larger stencils, longer augmenting paths); 0: the same pixel only;
    # other threshold counts: several thresholds per grey level, or levels skipped.
)
def test_counts_equal_the_reference_for_other_radii_and_thresholds(
    max_dist: float, num_thresholds: int
) -> None:
    thresholds = edge_thresholds(num_thresholds)
    for seed, case in enumerate(["blurred boundaries", "sharp", "circles"]):
        pred, gt = _case(case, (53, 40), seed=seed + 10)
        for nms in (True, False):
            np.testing.assert_array_equal(
                edge_image_counts(pred, gt, thresholds, max_dist, nms=nms),
                reference_edge_image_counts(pred, gt, thresholds, max_dist, nms=nms),
            )


def test_counts_equal_the_reference_with_padding() -> None:
    # ignore_index padding around and inside the valid region's bounding box.
    pred, gt = _case("blurred boundaries", (60, 70), seed=3)
    target = gt.copy()
    target[:7] = 255
    target[:, -5:] = 255
    target[40:, :12] = 255
    for nms in (True, False):
        np.testing.assert_array_equal(
            edge_image_counts(pred, target, edge_thresholds(), 0.0075, nms=nms),
            reference_edge_image_counts(pred, target, edge_thresholds(), 0.0075, nms=nms),
        )
    assert not edge_image_counts(pred, np.full_like(target, 255), edge_thresholds(), 0.0075).any()


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (3, 8), (4, 4), (7, 12), (40, 33)])
def test_nms_pieces_equal_the_reference(shape: tuple[int, int]) -> None:
    # Tiny maps take convTri.m's MATLAB path and the gradients' one-sided ends.
    rng = np.random.default_rng(sum(shape))
    for trial in range(6):
        grey = [
            rng.integers(0, 256, shape),
            _grey(gaussian_filter(rng.random(shape), 2)),
            np.where(rng.random(shape) < 0.1, 230, 0),
            np.full(shape, rng.integers(0, 256)),
        ][trial % 4].astype(np.uint8)
        assert np.array_equal(structured_edge_nms(grey), reference_structured_edge_nms(grey))
        edges = conv_tri(grey.astype(np.float32) / 255, 1)
        for r in (1, 0.5, 2, 4):
            assert np.array_equal(conv_tri(edges, r), reference_conv_tri(edges, r))
        orientation = edge_orientation(edges)
        expected = reference_edge_orientation(edges)
        assert np.array_equal(orientation, expected)
        assert np.array_equal(np.signbit(orientation), np.signbit(expected))
        assert np.array_equal(edges_nms(edges, orientation), reference_edges_nms(edges, orientation))


def test_thin_equals_the_reference_and_skimage() -> None:
    rng = np.random.default_rng(5)
    for trial in range(40):
        shape = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        image = rng.random(shape) < rng.uniform(0.1, 0.95)
        if trial % 2:
            image = gaussian_filter(image.astype(float), 1.5) > 0.4  # blobs
        out = thin(image)
        assert np.array_equal(out, reference_thin(image))
        assert np.array_equal(out, skimage_thin(image))


def _maximum_matching_size(adjacency: np.ndarray) -> int:
    if not adjacency.any():
        return 0
    return int(
        (maximum_bipartite_matching(csr_array(adjacency.astype(np.int8)), perm_type="column") >= 0).sum()
    )


def test_incremental_matching_stays_maximum() -> None:
    # The matching of _threshold_counts on random bipartite graphs whose left vertices come and
    # go: Hopcroft-Karp for the first set, then (from the kept matching) searches from the
    # freed right vertices with the joining ones absent, then from the joining ones.
    rng = np.random.default_rng(7)
    for _ in range(1500):
        num_left, num_right = int(rng.integers(2, 14)), int(rng.integers(1, 10))
        adjacency = rng.random((num_left, num_right)) < rng.uniform(0.1, 0.5)
        ptr = np.concatenate([[0], adjacency.sum(1).cumsum()]).astype(np.int64)
        adj = np.nonzero(adjacency)[1].astype(np.int64)
        rptr = np.concatenate([[0], adjacency.sum(0).cumsum()]).astype(np.int64)
        radj = np.nonzero(adjacency.T)[1].astype(np.int64)
        match_l, match_r = np.full(num_left, -1, np.int64), np.full(num_right, -1, np.int64)
        alive_flag = np.zeros(num_left, np.uint8)
        scratch = {
            n: np.empty(num_left + num_right + 1, np.int64)
            for n in ("layer", "next", "next_r", "queue", "sl", "sr")
        }
        seen_l, seen_r = np.full(num_left, -1, np.int64), np.full(num_right, -1, np.int64)
        tag, size = 0, 0
        for step in range(6):
            on = (rng.random(num_left) < rng.uniform(0.2, 0.9)).astype(np.uint8)
            joining = [u for u in range(num_left) if on[u] and not alive_flag[u]]
            freed = []
            for u in np.flatnonzero((alive_flag == 1) & (on == 0)):
                alive_flag[u] = 0
                if match_l[u] >= 0:
                    freed.append(match_l[u])
                    match_r[match_l[u]], match_l[u] = -1, -1
                    size -= 1
            if step == 0:
                alive_flag[joining] = 1
                alive = np.flatnonzero(alive_flag).astype(np.int64)
                size += _hopcroft_karp(
                    alive, alive.size, ptr, adj, match_l, match_r,
                    scratch["layer"], scratch["next"], scratch["queue"], scratch["sl"], scratch["sr"],
                )  # fmt: skip
            else:
                tag += 1
                for g in freed:
                    if _augment_from_right(
                        g, rptr, radj, alive_flag, match_l, match_r, seen_l, tag, scratch["next_r"], scratch["sr"], scratch["sl"]
                    ):  # fmt: skip
                        size, tag = size + 1, tag + 1
                tag += 1
                alive_flag[joining] = 1
                for u in joining:
                    if _augment_from_left(
                        u,
                        ptr,
                        adj,
                        match_l,
                        match_r,
                        seen_r,
                        tag,
                        scratch["next"],
                        scratch["sl"],
                        scratch["sr"],
                    ):
                        size, tag = size + 1, tag + 1
            assert size == _maximum_matching_size(adjacency & on[:, None].astype(bool))
            matched = np.flatnonzero(match_l >= 0)
            assert np.all(alive_flag[matched]) and np.all(adjacency[matched, match_l[matched]])
            assert np.array_equal(match_r[match_l[matched]], matched)


def test_radius_stencil_reaches_exactly_the_radius() -> None:
    # A predicted pixel at exactly the radius matches, one just beyond does not (the reference's
    # disk and the fast stencil are the same pixels).
    gt = np.zeros((40, 40), dtype=np.uint8)
    gt[20, 20] = 1
    radius = 0.11 * math.hypot(40, 40)  # 6.22 px
    for dy, dx, hit in [(6, 0, True), (6, 1, True), (5, 3, True), (4, 4, True), (6, 2, False), (5, 4, False)]:
        pred = np.zeros((40, 40), dtype=np.uint8)
        pred[20 + dy, 20 + dx] = 255
        counts = edge_image_counts(pred, gt, edge_thresholds(), 0.11, nms=False)
        assert counts[0, 50] == int(hit) == int(dy * dy + dx * dx <= radius * radius)  # r² = 38.7
        assert np.array_equal(
            counts, reference_edge_image_counts(pred, gt, edge_thresholds(), 0.11, nms=False)
        )
