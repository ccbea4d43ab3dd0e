"""The trivial predictors a benchmark task must beat (fedmtl.trivial), on the tiny generated data."""

from __future__ import annotations

import csv

import torch

from fedmtl.data.datasets import build_dataset
from fedmtl.trivial import learnt_table, trivial_metrics, trivial_predictions

SIZE = (32, 32)


def _datasets(data_root, tasks):
    root = data_root / "NYUDv2"
    return [build_dataset("nyud", root, split, tasks, SIZE, augment=False) for split in ("train", "val")]


def test_semseg_predicts_the_training_majority_class_everywhere(data_root):
    train, val = _datasets(data_root, ["semseg"])
    labels = torch.cat([train[i]["semseg"].flatten() for i in range(len(train))])
    majority = int(torch.bincount(labels[labels != 255]).argmax())
    pred = trivial_predictions("semseg", train, val)
    assert pred.shape == (len(val), *SIZE)
    assert (pred == majority).all()


def test_depth_predicts_the_mean_of_the_valid_training_depth(data_root):
    train, val = _datasets(data_root, ["depth"])
    depth = torch.cat([train[i]["depth"].flatten() for i in range(len(train))])
    valid = depth[(depth > 0) & (depth < 80)]  # 255: padding and Kinect holes, not depth
    pred = trivial_predictions("depth", train, val)
    assert torch.allclose(pred, torch.full_like(pred, float(valid.mean())))


def test_normals_are_one_unit_vector_and_edges_a_per_image_scaled_gradient(data_root):
    train, val = _datasets(data_root, ["normals", "edge"])
    normals = trivial_predictions("normals", train, val)
    assert torch.allclose(normals.norm(dim=1), torch.ones(len(val), *SIZE))
    assert (normals == normals[:1, :, :1, :1]).all()
    edges = trivial_predictions("edge", train, val)
    assert edges.min() >= 0 and torch.allclose(edges.amax(dim=(1, 2)), torch.ones(len(val)))


def test_every_task_gets_a_finite_value_from_its_own_metric(data_root):
    values = trivial_metrics("nyud", data_root / "NYUDv2", ["semseg", "normals", "edge", "depth"], SIZE)
    assert set(values) == {"semseg", "normals", "edge", "depth"}
    assert all(torch.isfinite(torch.tensor(v)) for v in values.values())


def test_the_learnt_table_marks_what_beats_the_trivial_predictor(tmp_path):
    report = tmp_path / "report.csv"
    with report.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "delta_m", "a-sal/sal_maxF", "a-sal/sal_maxF_std", "b-depth/depth_RMSE"])
        writer.writerow(["Local", "0", "50", "1", "1.2"])
        writer.writerow(["FedAvg", "3", "40", "1", "0.9"])
    trivial = {"a/sal": {"maxF": 45.0}, "b/depth": {"RMSE": 1.0}}
    lines = learnt_table(report, trivial, {"RMSE"}).splitlines()
    assert lines[0] == "| task | trivial | Local | FedAvg |"
    assert lines[2] == "| a-sal/sal_maxF | 45 | 50 ✓ | 40 |"  # higher is better
    assert lines[3] == "| b-depth/depth_RMSE | 1 | 1.2 | 0.9 ✓ |"  # lower is better


def test_a_hair_above_the_trivial_predictor_is_not_learnt(tmp_path):
    report = tmp_path / "report.csv"
    with report.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "delta_m", "a-semseg/semseg_mIoU", "b-depth/depth_RMSE"])
        writer.writerow(["Local", "0", "4.036", "0.96"])  # +0.05 %, 4 % better
        writer.writerow(["FedAvg", "3", "4.3", "0.94"])  # +6.6 %, 6 % better
    trivial = {"a/semseg": {"mIoU": 4.034}, "b/depth": {"RMSE": 1.0}}
    lines = learnt_table(report, trivial, {"RMSE"}).splitlines()
    assert lines[2] == "| a-semseg/semseg_mIoU | 4.034 | 4.036 | 4.3 ✓ |"
    assert lines[3] == "| b-depth/depth_RMSE | 1 | 0.96 | 0.94 ✓ |"
    assert learnt_table(report, trivial, {"RMSE"}, margin=0.0).splitlines()[2].endswith("4.036 ✓ | 4.3 ✓ |")


def test_the_edge_floor_is_scored_against_the_ground_truth_the_run_scores_against(data_root):
    """``evaluation.edge_thin_gt`` reaches the trivial predictor's metric: the Sobel floor and the
    clients' odsF are always scored against the same ground truth."""
    from fedmtl.config import EvaluationConfig

    root, tasks = data_root / "PASCALContext", ["edge"]
    thinned = trivial_metrics("pascal_context", root, tasks, SIZE)["edge"]
    assert thinned == trivial_metrics("pascal_context", root, tasks, SIZE, EvaluationConfig())["edge"]
    unthinned = trivial_metrics("pascal_context", root, tasks, SIZE, EvaluationConfig(edge_thin_gt=False))
    assert unthinned["edge"] != thinned
