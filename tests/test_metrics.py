"""Tests of fedmtl.metrics on small hand-computed cases (docs/evaluation.md, "The metrics").

Expected numbers are worked out by hand in the comment next to them; the remaining tests check
against an independent implementation (skimage's thinning, scipy's Hopcroft-Karp, torchmetrics'
macro IoU) or that merged states equal pooled ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_bipartite_matching
from skimage.morphology import thin as skimage_thin
from torchmetrics.classification import MulticlassJaccardIndex

from fedmtl.metrics import DepthRMSE, EdgeODSF, MeanIoU, NormalsMeanError, SaliencyMaxF, delta_m
from fedmtl.metrics.edge import edge_thresholds, grey_level_table, quantize_edge
from fedmtl.metrics.saliency import threshold_counts
from fedmtl.metrics.thinning import thin
from tests.edge_reference import BoundaryMatcher, max_bipartite_matching_size

# ---------------------------------------------------------------------------------------------
# MeanIoU
# ---------------------------------------------------------------------------------------------

# Two 2x2 images, classes {0, 1, 2}. Pixel pairs (gt -> pred):
#   image 1: 0->0, 0->1, 1->1, 1->1        image 2: 2->2, 2->0, 0->0, 1->1
SEG_TARGET = torch.tensor([[[0, 0], [1, 1]], [[2, 2], [0, 1]]])
SEG_PRED = torch.tensor([[[0, 1], [1, 1]], [[2, 0], [0, 1]]])
# Pooled: class 0 TP 2, FP 1 (2->0), FN 1 (0->1) -> 2/4; class 1 TP 3, FP 1, FN 0 -> 3/4;
# class 2 TP 1, FP 0, FN 1 -> 1/2. Mean over 3 classes: (1/2 + 3/4 + 1/2) / 3 = 7/12.
SEG_POOLED_MIOU = 100 * 7 / 12


def test_mean_iou_hand_case_two_images() -> None:
    metric = MeanIoU(num_classes=3)
    metric.update(SEG_PRED[:1], SEG_TARGET[:1])
    metric.update(SEG_PRED[1:], SEG_TARGET[1:])
    assert metric.compute().item() == pytest.approx(SEG_POOLED_MIOU)
    expected_confmat = torch.tensor([[2, 1, 0], [0, 3, 0], [1, 0, 1]])  # rows gt, columns pred
    assert torch.equal(metric.confmat, expected_confmat)


def test_mean_iou_pools_pixels_instead_of_averaging_images() -> None:
    # Per image: image 1 -> (1/2 + 2/3 + 0) / 3 (class 2 absent: 0); image 2 -> (1/2 + 1 + 1/2) / 3.
    per_image = []
    for i in range(2):
        metric = MeanIoU(num_classes=3)
        metric.update(SEG_PRED[i : i + 1], SEG_TARGET[i : i + 1])
        per_image.append(metric.compute().item())
    assert per_image == pytest.approx([100 * (1 / 2 + 2 / 3) / 3, 100 * 2 / 3])
    assert np.mean(per_image) != pytest.approx(SEG_POOLED_MIOU)


def test_mean_iou_absent_class_counts_zero_unlike_torchmetrics_macro() -> None:
    # Class 3 appears in neither map: it contributes IoU 0 to a mean over 4 classes.
    ours = MeanIoU(num_classes=4)
    ours.update(SEG_PRED, SEG_TARGET)
    assert ours.compute().item() == pytest.approx(100 * (1 / 2 + 3 / 4 + 1 / 2 + 0) / 4)  # 43.75
    macro = MulticlassJaccardIndex(num_classes=4, average="macro", ignore_index=255)
    macro.update(SEG_PRED, SEG_TARGET)
    assert 100 * macro.compute().item() == pytest.approx(SEG_POOLED_MIOU, abs=1e-4)  # skips class 3


def test_mean_iou_ignores_ignore_index_pixels() -> None:
    # Append a column of ignored pixels with arbitrary (even out-of-range) predictions.
    target = torch.cat([SEG_TARGET, torch.full((2, 2, 1), 255)], dim=2)
    pred = torch.cat([SEG_PRED, torch.tensor([[[2], [7]], [[0], [1]]])], dim=2)
    metric = MeanIoU(num_classes=3)
    metric.update(pred, target)
    assert metric.compute().item() == pytest.approx(SEG_POOLED_MIOU)
    assert metric.confmat.sum().item() == 8


# ---------------------------------------------------------------------------------------------
# SaliencyMaxF
# ---------------------------------------------------------------------------------------------

# Six pixels, the last one ignored. Foreground: the first three.
SAL_PRED = torch.tensor([[[0.9, 0.6, 0.2], [0.7, 0.1, 0.99]]], dtype=torch.float32)
SAL_TARGET = torch.tensor([[[1, 1, 1], [0, 0, 255]]])


def test_saliency_counts_use_p_greater_or_equal_t() -> None:
    tp, fp, fn = threshold_counts(SAL_PRED, SAL_TARGET)
    # t = 0.05, 0.10: all five valid pixels positive (0.1 >= 0.1); t = 0.15, 0.20: 0.2 still
    # positive, 0.1 not; t = 0.25 … 0.60: 0.9, 0.6, 0.7; t = 0.65, 0.70: 0.9, 0.7;
    # t = 0.75 … 0.90: 0.9; t = 0.95: nothing (0.99 is ignored).
    assert tp.tolist() == [3, 3, 3, 3] + [2] * 8 + [1, 1] + [1] * 4 + [0]
    assert fp.tolist() == [2, 2, 1, 1] + [1] * 8 + [1, 1] + [0] * 4 + [0]
    assert torch.equal(fn, 3 - tp)


def test_saliency_max_f_hand_case() -> None:
    # F_0.3 = 1.3 P R / (0.3 P + R). Candidates: (P, R) = (3/5, 1) -> 0.661; (3/4, 1) -> 0.796;
    # (2/3, 2/3) -> 0.667; (1/2, 1/3) -> 0.448; (1, 1/3) -> 0.684. Max at P = 3/4, R = 1.
    metric = SaliencyMaxF()
    metric.update(SAL_PRED, SAL_TARGET)
    assert metric.compute().item() == pytest.approx(100 * 1.3 * 0.75 / (0.3 * 0.75 + 1))


def test_saliency_max_f_pools_counts_over_images() -> None:
    # Image 2 alone: a missed foreground pixel (p = 0). Pooled with image 1, recall at the best
    # thresholds (0.15, 0.20) becomes 3/4 and precision stays 3/4, so F = 0.75 — not the mean
    # of the per-image maxF values (0.796 and 0).
    pred2 = torch.zeros(1, 2, 3)
    target2 = torch.tensor([[[1, 0, 0], [0, 0, 0]]])
    metric = SaliencyMaxF()
    metric.update(SAL_PRED, SAL_TARGET)
    metric.update(pred2, target2)
    assert metric.compute().item() == pytest.approx(75.0)


def test_saliency_no_positive_anywhere_is_zero_not_nan() -> None:
    metric = SaliencyMaxF()
    metric.update(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))
    assert metric.compute().item() == 0.0


# ---------------------------------------------------------------------------------------------
# NormalsMeanError
# ---------------------------------------------------------------------------------------------


def _normals(*vectors: tuple[float, float, float]) -> torch.Tensor:
    """[1, 3, 1, N] float32 normal map from N vectors."""
    return torch.tensor(vectors, dtype=torch.float32).T.reshape(1, 3, 1, len(vectors))


@pytest.mark.parametrize(
    ("pred", "target", "degrees"),
    [
        ((0.0, 0.0, 1.0), (0.0, 0.0, 1.0), 0.0),
        ((2.0, 0.0, 0.0), (0.5, 0.0, 0.0), 0.0),  # lengths do not matter: both are normalised
        ((0.0, 0.0, 1.0), (0.0, 0.0, -1.0), 180.0),
        ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), 90.0),
        ((1.0, 0.0, 0.0), (math.cos(math.pi / 6), math.sin(math.pi / 6), 0.0), 30.0),
    ],
)
def test_normals_angle(pred: tuple, target: tuple, degrees: float) -> None:
    metric = NormalsMeanError()
    metric.update(_normals(pred), _normals(target))
    assert metric.compute().item() == pytest.approx(degrees, abs=1e-4)


def test_normals_excludes_ignored_and_zero_target_pixels() -> None:
    # Valid pixel: 90° error. An ignored pixel (one channel 255) and a zero-vector target pixel
    # would each add an error (0° and 90°) if they were counted.
    pred = _normals((1, 0, 0), (1, 0, 0), (1, 0, 0))
    target = _normals((0, 1, 0), (1, 0, 255), (0, 0, 0))
    metric = NormalsMeanError()
    metric.update(pred, target)
    assert metric.count.item() == 1
    assert metric.compute().item() == pytest.approx(90.0)


def test_normals_pools_pixels_instead_of_averaging_images() -> None:
    # Image 1: one pixel at 90°. Image 2: three pixels at 0°. Pooled 90 / 4 = 22.5, not 45.
    metric = NormalsMeanError()
    metric.update(_normals((1, 0, 0)), _normals((0, 1, 0)))
    metric.update(_normals((0, 0, 1), (0, 0, 1), (0, 1, 0)), _normals((0, 0, 1), (0, 0, 1), (0, 1, 0)))
    assert metric.compute().item() == pytest.approx(22.5)


def test_normals_without_valid_pixels_is_nan() -> None:
    metric = NormalsMeanError()
    metric.update(_normals((1, 0, 0)), _normals((255, 255, 255)))
    assert math.isnan(metric.compute().item())


# ---------------------------------------------------------------------------------------------
# DepthRMSE
# ---------------------------------------------------------------------------------------------


def test_depth_rmse_hand_case_with_invalid_pixels() -> None:
    # Valid gt: 1, 2, 3 (0, 80 and 255 are outside 0 < gt < 80). Errors: 0.5, 0, and 3 for the
    # prediction -1, which is clamped to ~0 first. RMSE = sqrt((0.25 + 0 + 9) / 3).
    target = torch.tensor([[[1.0, 2.0, 0.0], [80.0, 255.0, 3.0]]])
    pred = torch.tensor([[[1.5, 2.0, 5.0], [1.0, 1.0, -1.0]]])
    metric = DepthRMSE()
    metric.update(pred, target)
    assert metric.count.item() == 3
    assert metric.compute().item() == pytest.approx(math.sqrt(9.25 / 3))


def test_depth_rmse_pools_pixels_and_accepts_channel_dim() -> None:
    # Image 1 as above (sum of squares 9.25 over 3 pixels), image 2: one pixel off by 1, given
    # as [B, 1, H, W]. Pooled sqrt(10.25 / 4); the mean of per-image RMSEs would differ.
    metric = DepthRMSE()
    metric.update(
        torch.tensor([[[1.5, 2.0, 5.0], [1.0, 1.0, -1.0]]]),
        torch.tensor([[[1.0, 2.0, 0.0], [80.0, 255.0, 3.0]]]),
    )
    metric.update(torch.tensor([[[[4.0]]]]), torch.tensor([[[5.0]]]))
    pooled = math.sqrt(10.25 / 4)
    assert metric.compute().item() == pytest.approx(pooled)
    assert (math.sqrt(9.25 / 3) + 1.0) / 2 != pytest.approx(pooled)


# ---------------------------------------------------------------------------------------------
# EdgeODSF (96x96 images: radius 0.0075 x 135.8 = 1.02 px, so 1 px off matches, 2 px does not)
# ---------------------------------------------------------------------------------------------

SIZE = 96

# These tests check the quantisation, thresholding, thinning and matching on the grey levels
# themselves, so they switch the public structured-edge NMS off (nms=False): the counts are those
# of the code before the NMS existed. The NMS (default on) is tested in tests/test_edge_nms.py;
# test_edge_perfect_prediction_is_100 also gives the value with it.


def _edge_lines(shift: int = 0) -> torch.Tensor:
    """A horizontal (70 px), a vertical (60 px) and a diagonal (20 px) line, none touching, so all
    survive thinning. ``shift`` moves each line sideways: rows for the horizontal one, columns
    for the other two (for the diagonal, 1 column is 1 px away, 2 columns are sqrt(2) px away).
    """
    lines = torch.zeros(SIZE, SIZE)
    lines[20 + shift, 10:80] = 1
    lines[30:90, 60 + shift] = 1
    idx = torch.arange(30, 50)
    lines[idx + 10, idx - 20 + shift] = 1
    return lines


def _odsf(pred: torch.Tensor, target: torch.Tensor, nms: bool = False, **kwargs) -> EdgeODSF:
    metric = EdgeODSF(nms=nms, **kwargs)
    metric.update(pred[None].float(), target[None])
    return metric


def test_edge_perfect_prediction_is_100() -> None:
    gt = _edge_lines()
    metric = _odsf(0.8 * gt, gt)
    assert metric.compute().item() == pytest.approx(100.0)
    # Above 0.8 nothing is predicted: zero matches, but every gt pixel is still counted.
    assert metric.total_pred[85].item() == 0
    assert metric.total_gt[85].item() == int(gt.sum())
    # With the public NMS (the default): convTri(E, 1) halves the 1-px lines (0.8 -> 0.4, grey
    # 102) and the NMS suppresses the two end pixels of the horizontal line, (20, 10) and
    # (20, 79): there the orientation points along the line, where the neighbour is stronger
    # (0.3 < 0.4). Best thresholds 0.11 ... 0.25: 148 predicted pixels, all matched, of 150 true
    # ones, P = 1, R = 148/150 -> F = 2·148 / (148 + 150) = 99.33 %. Below 0.11 the fringe past
    # the line ends (grey 13 and 26) adds unmatched pixels; the diagonal's two end pixels are grey
    # 64 (0.251), its other pixels and the vertical line's end pixels grey 77 (0.302), so 146
    # pixels remain from 0.26, 126 (those at grey 102 = 0.4) from 0.31 and none above 0.40.
    with_nms = _odsf(0.8 * gt, gt, nms=True)
    assert with_nms.compute().item() == pytest.approx(100 * 2 * 148 / (148 + 150))
    assert with_nms.matched_pred[10].item() == with_nms.total_pred[10].item() == 148
    assert with_nms.total_pred[24].item() == 148 and with_nms.total_pred[25].item() == 146
    assert with_nms.total_pred[29].item() == 146 and with_nms.total_pred[30].item() == 126
    assert with_nms.total_pred[39].item() == 126 and with_nms.total_pred[40].item() == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_edge_accepts_other_float_dtypes(dtype: torch.dtype) -> None:
    gt = _edge_lines()
    metric = EdgeODSF(nms=False)
    metric.update((0.8 * gt)[None].to(dtype), gt[None])
    assert metric.compute().item() == pytest.approx(100.0)


def test_edge_two_parallel_lines_do_not_both_match_one_true_line() -> None:
    # True line on row 48 (76 px); predicted lines on rows 47 and 49, both within 1 px of it.
    # One-to-one matching: 76 of 152 predicted pixels match, P = 1/2, R = 1, F = 2/3.
    # (A distance transform would accept all 152: P = 1.)
    gt = torch.zeros(SIZE, SIZE)
    gt[48, 10:86] = 1
    pred = torch.zeros(SIZE, SIZE)
    pred[47, 10:86] = 1
    pred[49, 10:86] = 1
    metric = _odsf(pred, gt)
    assert metric.total_pred[50].item() == 152
    assert metric.matched_pred[50].item() == 76
    assert metric.compute().item() == pytest.approx(100 * 2 / 3)


def test_edge_ground_truth_is_thinned_as_seism_does_unless_asked_not_to() -> None:
    # Label map 10x10, label 1 strictly above the diagonal (x > y). seg2bmap marks a pixel whose
    # east, south or south-east neighbour has another label: (y, y) (east differs) and (y, y + 1)
    # (south differs) for y = 0 ... 8, a staircase 2 px wide of 18 pixels. SEISM's
    # bwmorph(·, 'thin', Inf) leaves one pixel per row: the diagonal (y, y), y = 0 ... 8, and the
    # end point (8, 9), 10 pixels. The prediction is the whole staircase (its thinning is the same
    # 10 pixels), matched only on the same pixel (max_dist 0).
    from fedmtl.data.pascal_context import seg2bmap

    y, x = np.mgrid[:10, :10]
    boundary = seg2bmap(x > y)
    staircase = np.zeros((10, 10), dtype=bool)
    staircase[np.arange(9), np.arange(9)] = staircase[np.arange(9), np.arange(1, 10)] = True
    assert np.array_equal(boundary, staircase)
    thinned = np.zeros((10, 10), dtype=bool)
    thinned[np.arange(9), np.arange(9)] = thinned[8, 9] = True
    assert np.array_equal(thin(boundary), thinned)

    pred, target = torch.from_numpy(0.8 * boundary)[None], torch.from_numpy(boundary.astype(np.uint8))[None]
    metric = EdgeODSF(max_dist=0.0, nms=False)  # thin_gt=True by default
    metric.update(pred, target)
    assert metric.total_gt[0].item() == 10 and metric.matched_gt[0].item() == 10
    assert metric.compute().item() == pytest.approx(100.0)
    unthinned = EdgeODSF(max_dist=0.0, nms=False, thin_gt=False)
    unthinned.update(pred, target)
    # P = 10/10, R = 10/18: F = 2·(10/18) / (1 + 10/18) = 20/28.
    assert unthinned.total_gt[0].item() == 18 and unthinned.matched_gt[0].item() == 10
    assert unthinned.compute().item() == pytest.approx(100 * 20 / 28)


@pytest.mark.parametrize(("shift", "expected"), [(1, 100.0), (2, 0.0)])
def test_edge_offset_within_and_beyond_tolerance(shift: int, expected: float) -> None:
    assert _odsf(_edge_lines(shift), _edge_lines()).compute().item() == pytest.approx(expected)


def test_edge_padding_is_excluded_and_diagonal_is_the_valid_region() -> None:
    # Valid 96x96 region inside a 192x192 array padded with 255. The prediction is junk (1.0)
    # everywhere in the padding. Ground truth: isolated dots; prediction: the dots moved by
    # (1, 1), i.e. sqrt(2) px away. Radius over the valid region: 1.02 px -> no match; over the
    # padded array it would be 2.04 px and every dot would match.
    target = torch.full((2 * SIZE, 2 * SIZE), 255.0)
    pred = torch.ones(2 * SIZE, 2 * SIZE)
    inner = (slice(48, 48 + SIZE), slice(48, 48 + SIZE))
    gt, shifted = torch.zeros(SIZE, SIZE), torch.zeros(SIZE, SIZE)
    gt[10:90:8, 10:90:8] = 1
    shifted[11:91:8, 11:91:8] = 1
    gt[91:, :50] = 255  # padding inside the valid region's bounding box too ...
    shifted[91:, :50] = 1  # ... where the prediction is junk as well
    target[inner] = gt
    pred[inner] = shifted
    metric = _odsf(pred, target)
    assert metric.total_pred[50].item() == 100  # the 10x10 dots only, none of the padding
    assert metric.total_gt[50].item() == 100
    assert metric.compute().item() == 0.0
    # A straight line moved by 1 px inside the same padding does match.
    line_target, line_pred = target.clone(), pred.clone()
    line_target[inner], line_pred[inner] = _edge_lines(), _edge_lines(shift=1)
    assert _odsf(line_pred, line_target).compute().item() == pytest.approx(100.0)


def test_edge_counts_pool_over_images() -> None:
    # Image 1: perfect, 150 gt px. Image 2: only the horizontal line (70 px), predicted 2 px off.
    # Pooled P = R = 150 / 220 -> F = 68.18, not the mean of the per-image odsF (100 and 0).
    gt2 = torch.zeros(SIZE, SIZE)
    gt2[20, 10:80] = 1
    pred2 = torch.zeros(SIZE, SIZE)
    pred2[22, 10:80] = 1
    metric = EdgeODSF(nms=False)
    metric.update(torch.stack([_edge_lines(), pred2]), torch.stack([_edge_lines(), gt2]))
    assert metric.matched_gt[50].item() == 150
    assert metric.total_gt[50].item() == 220
    assert metric.total_pred[50].item() == 220
    assert metric.compute().item() == pytest.approx(100 * 150 / 220)


# Quantisation: the public code saves np.uint8(sigmoid(x) * 255) (float32, truncated) as a PNG and
# seism compares double(png) / 255 >= t. p = 0.8 in the tests above is grey 204 = 0.8 exactly, so
# their expected numbers are unchanged by the quantisation.


def test_quantize_edge_truncates_like_the_public_png() -> None:
    probs = torch.tensor([0.0, 0.5, 0.502, 0.2, 0.2035, 0.199, 254.9 / 255, 1.0])
    expected = [0, 127, 128, 51, 51, 50, 254, 255]  # floor(255 p): 0.5 -> 127.5 -> 127, not 128
    assert quantize_edge(probs).tolist() == expected
    assert quantize_edge(torch.sigmoid(torch.tensor([0.0]))).item() == 127  # logit 0
    # The same numbers as the public expression, computed independently in numpy.
    rng = np.random.default_rng(2)
    p = np.concatenate([rng.random(10_000), np.arange(256) / 255]).astype(np.float32)
    public = np.uint8(p * np.float32(255))
    assert np.array_equal(quantize_edge(torch.from_numpy(p)).numpy(), public)
    assert np.array_equal(quantize_edge(torch.from_numpy(p.astype(np.float64))).numpy(), public)


def test_grey_level_table_is_seism_double_comparison() -> None:
    t = edge_thresholds()
    # Independently: MATLAB's double(q) / 255.0 >= str2double('0.kk'), counted over the 99 strings.
    strings = [float(f"{k / 100:.2f}") for k in range(1, 100)]
    expected = [sum(q / 255.0 >= v for v in strings) for q in range(256)]
    assert grey_level_table(t).tolist() == expected
    table = grey_level_table(t)
    # 51 / 255 is exactly 0.2: positive at t = 0.20 (index 19), not at 0.21. 50 / 255 = 0.196.
    assert table[51] == 20 and table[50] == 19
    assert table[2] == 0 and table[3] == 1  # 2 / 255 = 0.0078 < 0.01 <= 3 / 255
    assert table[255] == 99 and table[127] == 49 and table[128] == 50


def test_edge_probability_half_is_below_threshold_half() -> None:
    # p = 0.5 becomes grey 127 = 0.498: positive at t = 0.49, not at t = 0.50 (without the
    # quantisation it would be). p = 0.502 becomes 128 = 0.502: positive at 0.50.
    gt = _edge_lines()
    half = _odsf(0.5 * gt, gt)
    assert half.total_pred[48].item() == int(gt.sum())  # t = 0.49
    assert half.total_pred[49].item() == 0  # t = 0.50
    above = _odsf(0.502 * gt, gt)
    assert above.total_pred[49].item() == int(gt.sum())
    assert above.total_pred[50].item() == 0  # t = 0.51


def test_edge_differences_below_one_grey_level_give_identical_counts() -> None:
    # Two predictions that differ everywhere, but only inside the same 1/255 grey bin, and the
    # grey levels themselves (uint8), all give the same counts at every threshold.
    rng = torch.Generator().manual_seed(3)
    levels = torch.randint(0, 256, (2, 40, 40), generator=rng, dtype=torch.uint8)
    levels[:, 10:30, 20] = 250  # a confident line among the noise
    target = torch.zeros(2, 40, 40)
    target[:, 10:30, 20] = 1
    low = ((levels.double() + 0.1) / 255).clamp(max=1.0)
    high = ((levels.double() + 0.9) / 255).clamp(max=1.0)  # grey 255: p = 1 in both
    assert torch.equal(quantize_edge(low), levels) and torch.equal(quantize_edge(high), levels)
    metrics = [EdgeODSF(), EdgeODSF(), EdgeODSF()]
    for metric, pred in zip(metrics, [low, high, levels]):
        metric.update(pred, target)
    for state in ("matched_pred", "total_pred", "matched_gt", "total_gt"):
        assert torch.equal(getattr(metrics[0], state), getattr(metrics[1], state))
        assert torch.equal(getattr(metrics[0], state), getattr(metrics[2], state))
    assert metrics[0].total_pred.sum().item() > 0 and metrics[0].matched_pred.sum().item() > 0


def test_thin_matches_skimage_on_random_maps() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        image = rng.random((23, 31)) < rng.uniform(0.2, 0.95)
        assert np.array_equal(thin(image), skimage_thin(image))


def test_boundary_matcher_is_a_maximum_matching() -> None:
    # The reference matcher (tests/test_edge_fast.py compares the fast counts with it) against
    # scipy's Hopcroft-Karp on small random maps (there it is fast and exact).
    rng = np.random.default_rng(1)
    for _ in range(20):
        gt, pred = rng.random((2, 20, 20)) < 0.15
        radius = 2.5
        matcher = BoundaryMatcher(gt, radius)
        gy, gx = np.nonzero(gt)
        py, px = np.nonzero(pred)
        within = (py[:, None] - gy) ** 2 + (px[:, None] - gx) ** 2 <= radius**2
        expected = (
            maximum_bipartite_matching(csr_array(within.astype(np.int8)), perm_type="column") >= 0
        ).sum()
        assert matcher.count_matches(pred) == expected
    # Two left vertices sharing their only neighbour: one match.
    assert max_bipartite_matching_size(np.array([0, 1]), np.array([0, 0]), 2, 1) == 1


# ---------------------------------------------------------------------------------------------
# States are sums: two halves merged equal the pooled metric (what DDP sync does)
# ---------------------------------------------------------------------------------------------


def _batches(rng: torch.Generator) -> dict[str, tuple]:
    """Per metric: (factory, pred, target) with 4 random images."""
    return {
        "miou": (
            lambda: MeanIoU(num_classes=3),
            torch.randint(0, 3, (4, 8, 8), generator=rng),
            torch.randint(0, 3, (4, 8, 8), generator=rng),
        ),
        "sal": (
            SaliencyMaxF,
            torch.rand(4, 8, 8, generator=rng),
            torch.randint(0, 2, (4, 8, 8), generator=rng),
        ),
        "normals": (
            NormalsMeanError,
            torch.randn(4, 3, 8, 8, generator=rng),
            torch.randn(4, 3, 8, 8, generator=rng),
        ),
        "depth": (
            DepthRMSE,
            10 * torch.rand(4, 8, 8, generator=rng),
            10 * torch.rand(4, 8, 8, generator=rng),
        ),
        "edge": (
            EdgeODSF,
            torch.rand(4, 32, 32, generator=rng),
            (torch.rand(4, 32, 32, generator=rng) < 0.1).float(),
        ),
    }


@pytest.mark.parametrize("name", ["miou", "sal", "normals", "depth", "edge"])
def test_merged_halves_equal_pooled(name: str) -> None:
    make, pred, target = _batches(torch.Generator().manual_seed(0))[name]
    pooled, first, second = make(), make(), make()
    pooled.update(pred, target)
    first.update(pred[:2], target[:2])
    second.update(pred[2:], target[2:])
    first.merge_state(second)  # applies each state's dist_reduce_fx, as a distributed sync does
    assert first.compute().item() == pytest.approx(pooled.compute().item(), rel=1e-12)
    for state in pooled._defaults:
        torch.testing.assert_close(getattr(first, state), getattr(pooled, state), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "pred", "target", "error", "match"),
    [
        (MeanIoU(3), torch.rand(1, 3, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long), TypeError, "argmax"),
        (
            MeanIoU(3),
            torch.zeros(1, 4, 4, dtype=torch.long),
            torch.zeros(1, 4, 5, dtype=torch.long),
            ValueError,
            "same shape",
        ),
        (
            MeanIoU(3),
            torch.zeros(4, 4, dtype=torch.long),
            torch.zeros(4, 4, dtype=torch.long),
            ValueError,
            r"\[B, H, W\]",
        ),
        (
            MeanIoU(3),
            torch.full((1, 2, 2), 3),
            torch.zeros(1, 2, 2, dtype=torch.long),
            ValueError,
            r"\[0, 3\)",
        ),
        (SaliencyMaxF(), torch.randn(1, 4, 4) * 5, torch.zeros(1, 4, 4), ValueError, r"\[0, 1\]"),
        (SaliencyMaxF(), torch.rand(1, 4, 4), torch.full((1, 4, 4), 2), ValueError, "0, 1, 255"),
        (SaliencyMaxF(), torch.ones(1, 4, 4, dtype=torch.long), torch.zeros(1, 4, 4), TypeError, "floating"),
        (NormalsMeanError(), torch.rand(1, 2, 4, 4), torch.rand(1, 2, 4, 4), ValueError, "3 channels"),
        (NormalsMeanError(), torch.rand(1, 3, 4), torch.rand(1, 3, 4), ValueError, r"\[B, 3, H, W\]"),
        (DepthRMSE(), torch.ones(1, 4, 4, dtype=torch.long), torch.ones(1, 4, 4), TypeError, "floating"),
        (DepthRMSE(), torch.rand(1, 2, 4, 4), torch.rand(1, 2, 4, 4), ValueError, r"\[B, 1, H, W\]"),
        (EdgeODSF(), torch.rand(4, 4), torch.zeros(4, 4), ValueError, r"\[B, H, W\]"),
        (EdgeODSF(), torch.rand(1, 4, 4), torch.zeros(1, 4, 5), ValueError, "same shape"),
        (EdgeODSF(), torch.ones(1, 4, 4, dtype=torch.long), torch.zeros(1, 4, 4), TypeError, "uint8 grey"),
        (EdgeODSF(), torch.rand(1, 4, 4) + 1, torch.zeros(1, 4, 4), ValueError, r"\[0, 1\]"),
    ],
)
def test_clear_errors_on_wrong_inputs(metric, pred, target, error, match) -> None:
    with pytest.raises(error, match=match):
        metric.update(pred, target)


# ---------------------------------------------------------------------------------------------
# delta_m: the paper's Tables 1 and 2
# ---------------------------------------------------------------------------------------------

TABLE1_METRICS = [
    "pascal/semseg", "pascal/human_parts", "pascal/sal", "pascal/normals", "pascal/edge",
    "nyud/semseg", "nyud/depth", "nyud/normals", "nyud/edge",
]  # fmt: skip
TABLE1_LOWER = {"pascal/normals", "nyud/depth", "nyud/normals"}
TABLE1 = {
    "Local": ([51.69, 49.94, 80.91, 15.76, 71.95, 41.86, 0.6487, 20.59, 76.46], 0.00),
    "FedAvg": ([39.98, 37.33, 77.56, 18.27, 69.17, 38.94, 0.7858, 21.62, 75.77], -11.76),
    "FedProx": ([44.42, 38.10, 77.26, 18.03, 69.39, 39.19, 0.8068, 21.52, 76.03], -10.68),
    "FedPer": ([54.51, 46.56, 78.85, 16.95, 71.00, 44.02, 0.6467, 21.19, 76.61], -1.11),
    "Ditto": ([46.23, 39.69, 77.99, 17.52, 69.77, 41.49, 0.6508, 20.60, 76.45], -5.57),
    "FedAMP": ([55.98, 52.05, 80.79, 15.74, 72.02, 41.67, 0.6428, 20.54, 76.40], 1.47),
    "MaT-FL": ([57.45, 48.63, 79.26, 17.26, 71.23, 40.99, 0.6352, 20.65, 76.59], -0.46),
    "FedHCA2": ([57.55, 52.30, 80.71, 15.60, 72.08, 41.47, 0.6281, 20.53, 76.50], 2.18),
}
TABLE2_METRICS = [
    "nyud/semseg", "nyud/depth", "nyud/normals", "nyud/edge",
    "pascal/semseg", "pascal/human_parts", "pascal/sal", "pascal/normals", "pascal/edge",
]  # fmt: skip
TABLE2_LOWER = {"nyud/depth", "nyud/normals", "pascal/normals"}
TABLE2 = {
    "Local": ([33.59, 0.7129, 23.22, 75.02, 65.80, 55.01, 83.23, 14.21, 71.89], 0.00),
    "FedAvg": ([25.80, 0.8295, 24.85, 75.31, 64.63, 52.88, 81.08, 15.56, 68.95], -7.56),
    "FedHCA2": ([34.95, 0.7018, 23.19, 75.03, 65.81, 55.01, 83.18, 14.08, 71.97], 0.75),
}


@pytest.mark.parametrize(
    ("names", "lower", "table", "method"),
    [(TABLE1_METRICS, TABLE1_LOWER, TABLE1, m) for m in TABLE1]
    + [(TABLE2_METRICS, TABLE2_LOWER, TABLE2, m) for m in TABLE2],
)
def test_delta_m_reproduces_paper_tables(names, lower, table, method) -> None:
    values, expected = table[method]
    results = dict(zip(names, values))
    baseline = dict(zip(names, table["Local"][0]))
    assert round(delta_m(results, baseline, lower), 2) == expected


def test_delta_m_hand_case_and_tensor_values() -> None:
    # Higher-better 50 -> 55: +10 %; lower-better 2.0 -> 2.5: -25 %. Mean: -7.5 %.
    results = {"a": torch.tensor(55.0), "b": 2.5}
    assert delta_m(results, {"a": 50.0, "b": 2.0}, {"b"}) == pytest.approx(-7.5)


def test_delta_m_names_missing_and_extra_metrics() -> None:
    with pytest.raises(ValueError, match=r"missing from results \['b'\], not in baseline \['c'\]"):
        delta_m({"a": 1.0, "c": 1.0}, {"a": 1.0, "b": 1.0}, [])
    with pytest.raises(ValueError, match="not in the results: \\['depht'\\]"):
        delta_m({"a": 1.0}, {"a": 1.0}, ["depht"])
    with pytest.raises(TypeError, match="not a single string"):
        delta_m({"a": 1.0}, {"a": 1.0}, "a")
