"""Tests of fedmtl.metrics.edge_nms, the port of innovator-zero/seism ``nms_process.m``.

convTri and gradient2 are checked against direct computations (a hand-written convolution with
symmetric padding, numpy.gradient); the NMS on maps whose answer is known by construction.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmtl.metrics import EdgeODSF
from fedmtl.metrics.edge_nms import (
    conv_tri,
    edge_orientation,
    edges_nms,
    gradient2,
    matlab_uint8,
    structured_edge_nms,
)


def _hand_conv_tri(image: np.ndarray, r: float) -> np.ndarray:
    """convTri.m's reference: padarray(I, [r r], 'symmetric') then the 2-D filter f'·f, 'valid'."""
    if r <= 1:
        p = 12 / r / (r + 2) - 2
        f, r = np.array([1, p, 1]) / (2 + p), 1
    else:
        f = np.array([*range(1, r + 2), *range(r, 0, -1)]) / (r + 1) ** 2
    kernel = np.outer(f, f)
    padded = np.pad(image.astype(np.float64), r, mode="symmetric")
    h, w = image.shape
    out = np.zeros((h, w))
    for y in range(h):
        for x in range(w):
            out[y, x] = (padded[y : y + 2 * r + 1, x : x + 2 * r + 1] * kernel).sum()
    return out


@pytest.mark.parametrize(
    ("shape", "r"),
    [((7, 9), 1), ((3, 6), 1), ((8, 8), 0.5), ((12, 15), 4), ((6, 8), 4)],
    # (7, 9): the mex convTri1 path; (3, 6): 2r+1 >= min(h, w), convTri.m's MATLAB path;
    # (6, 8) with r = 4: the padding is almost as wide as the map.
)
def test_conv_tri_is_the_symmetric_padded_triangle_convolution(shape: tuple[int, int], r: float) -> None:
    image = np.random.default_rng(0).random(shape).astype(np.float32)
    out = conv_tri(image, r)
    assert out.dtype == np.float32 and out.shape == shape
    np.testing.assert_allclose(out, _hand_conv_tri(image, r), rtol=1e-6, atol=1e-7)


def test_conv_tri1_border_is_symmetric_padding() -> None:
    # [1 2 1]/4 with I[-1] = I[0]: on a 1-D ramp along x, the first value is (3·0 + 1)/4.
    ramp = np.tile(np.arange(6, dtype=np.float32), (5, 1))
    out = conv_tri(ramp, 1)
    assert out[2].tolist() == [0.25, 1.0, 2.0, 3.0, 4.0, 4.75]


@pytest.mark.parametrize("shape", [(5, 7), (2, 3), (9, 4)])
def test_gradient2_equals_numpy_gradient(shape: tuple[int, int]) -> None:
    image = np.random.default_rng(1).random(shape).astype(np.float32)
    gx, gy = gradient2(image)
    assert np.array_equal(gx, np.gradient(image, axis=1))
    assert np.array_equal(gy, np.gradient(image, axis=0))


def _profile(distance: np.ndarray) -> np.ndarray:
    return np.exp(-(distance**2) / 2).astype(np.float32)


def test_nms_thins_a_blurred_vertical_line_to_its_maximum() -> None:
    h, w, c = 30, 32, 15
    edges = np.tile(_profile(np.arange(w) - c), (h, 1))
    out = edges_nms(edges, edge_orientation(edges))
    inner = slice(5, h - 5)  # rows untouched by the 5-px boundary fade
    assert np.array_equal(np.flatnonzero(out[inner].any(axis=0)), [c])
    assert np.array_equal(out[inner, c], edges[inner, c])  # the maximum is kept, unscaled


def test_nms_thins_a_blurred_diagonal_line_to_its_maximum() -> None:
    n = 40
    y, x = np.mgrid[:n, :n]
    edges = _profile((x - y) / np.sqrt(2))  # distance to the diagonal x = y
    orientation = edge_orientation(edges)
    # On the ridge Oxx = Oyy = -Oxy < 0: O = mod(atan(-1), pi) = 3π/4, across the line.
    assert orientation[20, 20] == pytest.approx(3 * np.pi / 4, abs=1e-3)  # 1e-5 added to Oxx
    out = edges_nms(edges, orientation)
    inner = (slice(6, n - 6), slice(6, n - 6))
    assert np.array_equal(out[inner] != 0, np.eye(n, dtype=bool)[inner])
    assert np.array_equal(np.diag(out)[6:-6], np.diag(edges)[6:-6])


def test_nms_keeps_a_symmetric_horizontal_line_as_matlab_does() -> None:
    # sign(-Oxy) = sign(0) = 0 along a perfectly horizontal line, so O = 0 and the comparison
    # runs along the line, where the map is constant: nothing is suppressed (MATLAB's
    # nms_process.m does the same; bwmorph thinning later thins each thresholded map).
    h, w = 30, 32
    edges = np.tile(_profile(np.arange(h) - 15.0)[:, None], (1, w))
    orientation = edge_orientation(edges)
    assert np.all(orientation[5:-5, 8:-8] == 0)
    out = edges_nms(edges, orientation)
    assert np.array_equal(out[5:-5, 5:-5], edges[5:-5, 5:-5])


@pytest.mark.parametrize(("h", "w", "s"), [(20, 16, 5), (6, 9, 3)])
def test_nms_boundary_fade_on_a_constant_map(h: int, w: int, s: int) -> None:
    # Constant map: every pixel survives the NMS (e·1.01 > e), then column x and row y are
    # scaled by min(x, w-1-x, s)/s and min(y, h-1-y, s)/s; s = min(5, w/2, h/2) (6x9: 3).
    out = edges_nms(np.ones((h, w), dtype=np.float32), np.zeros((h, w), dtype=np.float32))
    col = np.array([min(x, w - 1 - x, s) for x in range(w)], dtype=np.float32) / np.float32(s)
    row = np.array([min(y, h - 1 - y, s) for y in range(h)], dtype=np.float32) / np.float32(s)
    assert np.array_equal(out, row[:, None] * col[None, :])
    assert out[0].max() == 0 and out[:, -1].max() == 0  # the outermost rows and columns
    assert out[1, 1] == np.float32(1 / s) * np.float32(1 / s)  # corners get both factors
    assert out[h // 2, w // 2] == (1 if min(h, w) > 2 * s + 1 else np.float32(2 / 3))


def test_matlab_uint8_rounds_half_away_from_zero_and_saturates() -> None:
    values = np.array([0.0, 0.49, 0.5, 1.5, 2.5, 101.5, 254.49, 254.5, 255.4, 300.0, -0.5, -3.0, np.nan])
    expected = [0, 0, 1, 2, 3, 102, 254, 255, 255, 255, 0, 0, 0]  # numpy's round would give 2.5 -> 2
    assert matlab_uint8(values).tolist() == expected
    assert matlab_uint8(values.astype(np.float32)).tolist() == expected


def test_structured_edge_nms_on_grey_levels() -> None:
    levels = np.zeros((24, 24), dtype=np.uint8)
    assert np.array_equal(structured_edge_nms(levels), levels)
    levels[:, 11:14] = [100, 200, 100]  # a 3-px vertical line
    out = structured_edge_nms(levels)
    assert out.dtype == np.uint8
    assert np.array_equal(np.flatnonzero(out[5:-5].any(axis=0)), [12])
    # convTri(·, 1) across x: (100 + 2·200 + 100) / 4 / 255 -> 150 (no smoothing along the line).
    assert np.all(out[5:-5, 12] == 150)
    with pytest.raises(TypeError, match="uint8"):
        structured_edge_nms(levels.astype(np.float32))


def test_edge_odsf_nms_is_the_default_and_equals_thresholding_the_nms_output() -> None:
    rng = torch.Generator().manual_seed(4)
    levels = torch.randint(0, 256, (2, 40, 48), generator=rng, dtype=torch.uint8)
    levels[:, 10:30, 20] = 250
    target = torch.zeros(2, 40, 48)
    target[:, 10:30, 20] = 1
    default, explicit = EdgeODSF(), EdgeODSF(nms=False)
    default.update(levels, target)
    after_nms = torch.from_numpy(np.stack([structured_edge_nms(im) for im in levels.numpy()]))
    explicit.update(after_nms, target)
    for state in ("matched_pred", "total_pred", "matched_gt", "total_gt"):
        assert torch.equal(getattr(default, state), getattr(explicit, state))
    plain = EdgeODSF(nms=False)
    plain.update(levels, target)
    assert not torch.equal(plain.total_pred, default.total_pred)
