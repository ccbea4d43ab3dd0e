"""What an evaluation covers and logs (fedmtl/federated/evaluation.py), and which methods make
the engine pass over every client after the last round."""

from __future__ import annotations

import math

import pytest

from fedmtl.federated import evaluation
from fedmtl.methods import create_method


def test_the_sample_is_the_same_at_every_evaluation_and_the_last_covers_everyone():
    first = evaluation.sampled_clients(3, 10, seed=0, last=False)
    assert first == evaluation.sampled_clients(3, 10, seed=0, last=False)
    assert len(first) == 3 and first == sorted(set(first)) and all(0 <= i < 10 for i in first)
    assert evaluation.sampled_clients(3, 10, seed=0, last=True) is None
    assert evaluation.sampled_clients(None, 10, seed=0, last=False) is None
    assert evaluation.sampled_clients(10, 10, seed=0, last=False) is None  # all of them anyway
    assert any(evaluation.sampled_clients(3, 10, seed=s, last=False) != first for s in range(1, 5))


def test_the_task_summary_is_per_dataset_and_skips_values_that_are_not_numbers():
    table = {
        "a": {"semseg": 1.0},
        "b": {"semseg": 3.0},
        "c": {"semseg": 10.0, "depth": 2.0},
        "d": {"depth": math.nan},
    }
    datasets = {"a": "pascal_context", "b": "pascal_context", "c": "nyud", "d": "nyud"}
    summary = evaluation.task_summary(table, datasets)
    assert summary == {
        "pascal_context/semseg": {"mean": 2.0, "std": 1.0, "clients": 2},
        "nyud/semseg": {"mean": 10.0, "std": 0.0, "clients": 1},
        "nyud/depth": {"mean": 2.0, "std": 0.0, "clients": 1},
    }


def test_logged_values_name_each_client_and_each_task_across_clients():
    results = {"personal": {"a": {"depth": 2.0}, "b": {"depth": 4.0}}, "global": {"a": {"depth": 1.0}}}
    values = evaluation.logged_values(results, ["personal", "global"], {"a": "nyud", "b": "nyud"})
    assert values == {
        "val/a/depth_RMSE": 2.0,
        "val/b/depth_RMSE": 4.0,
        "val_mean/nyud/depth_RMSE": 3.0,
        "val_std/nyud/depth_RMSE": 1.0,
        "val_global/a/depth_RMSE": 1.0,
        "val_global_mean/nyud/depth_RMSE": 1.0,
        "val_global_std/nyud/depth_RMSE": 0.0,
    }


@pytest.mark.parametrize(
    ("name", "finishes"), [("FedAvg", False), ("FedHCA2", False), ("FedBABU", True), ("FedDEA", False)]
)
def test_only_a_method_with_finishing_work_gets_the_pass_after_the_last_round(name, finishes):
    assert create_method(name).finishes is finishes
