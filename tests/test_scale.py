"""Many clients (issue #27) through the engine: the streamed server step against the stacked one,
on one and two processes; sampled evaluations and the per-task summary; a memory store that
cannot fit refused before anything is written; disk-store checkpoints that share the store's
files yet keep their round's bytes; one dataset read for every client of it."""

from __future__ import annotations

import csv

import pytest
import torch

from fedmtl.federated import checkpoint, integrity
from tests.helpers import TINY_CLIENTS, client_states, fit, fit_in_processes, fit_refused, tiny_config


def _states_close(a: list[dict], b: list[dict], rel: float) -> None:
    for sa, sb in zip(a, b, strict=True):
        for key, ta in sa["model"].items():
            tb = sb["model"][key]
            if ta.is_floating_point() and ta.norm() > 0:
                assert float((ta - tb).norm() / ta.norm()) <= rel, key
            else:
                assert torch.equal(ta, tb), key


@pytest.mark.parametrize(
    "algorithm",
    [
        {"class_path": "FedHCA2"},
        {"class_path": "FedAvg", "init_args": {"encoder_scope": "same_task", "participation": 0.67}},
        {"class_path": "FedAMP", "init_args": {"participation": 0.67, "sigma": 1e4, "alpha_k": 1e3}},
        {"class_path": "FedDEA", "init_args": {"host": "FedOpt"}},
    ],
    ids=["FedHCA2", "FedAvg", "FedAMP", "FedDEA"],
)
def test_a_streamed_round_gives_the_stacked_rounds_parameters(tmp_path, data_root, algorithm):
    config = tiny_config(tmp_path, data_root, algorithm=algorithm, rounds=1)
    stacked = fit(config, tmp_path / "stacked", "--aggregation", "stacked")
    streamed = fit(config, tmp_path / "streamed", "--aggregation", "streamed")
    _states_close(client_states(tmp_path / "stacked"), client_states(tmp_path / "streamed"), rel=1e-6)
    assert streamed.keys() == stacked.keys()
    assert not (tmp_path / "streamed" / "store" / "rows").exists()  # scratch, gone with the store


def test_a_streamed_run_on_two_processes_equals_one(tmp_path, data_root):
    """Every rank reads every client's row file in client order: the same bytes as one process."""
    config = tiny_config(
        tmp_path, data_root, algorithm={"class_path": "FedHCA2"}, rounds=2, aggregation="streamed"
    )
    one = fit(config, tmp_path / "one")
    two = fit_in_processes(config, tmp_path / "two")
    assert two == one
    for a, b in zip(client_states(tmp_path / "one"), client_states(tmp_path / "two"), strict=True):
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_evaluations_before_the_last_cover_a_seeded_sample_of_clients(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, rounds=3, evaluation={"every": 1, "clients": 1})
    results = fit(config, tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    evaluated = {
        r: {
            row["key"].split("/")[1]
            for row in rows
            if int(row["round"]) == r and row["key"].startswith("val/")
        }
        for r in (1, 2, 3)
    }
    assert len(evaluated[1]) == 1 and evaluated[1] == evaluated[2]  # the same client each time
    assert len(evaluated[3]) == TINY_CLIENTS  # the last evaluation covers every client
    keys = {row["key"] for row in rows}
    assert "val_mean/nyud/depth_RMSE" in keys and "val_std/nyud/depth_RMSE" in keys
    semseg = [
        c["metrics"]["semseg"]["mIoU"]
        for c in results["clients"].values()
        if c["dataset"] == "pascal_context" and "semseg" in c["tasks"]
    ]
    summary = results["tasks"]["pascal_context/semseg"]
    assert summary["clients"] == len(semseg) and summary["mean"] == pytest.approx(sum(semseg) / len(semseg))
    assert results["tasks"]["nyud/depth"]["std"] == 0  # one NYUD-v2 client


def test_a_memory_store_that_cannot_fit_is_refused_before_anything_is_written(
    tmp_path, data_root, capsys, monkeypatch
):
    from fedmtl.federated import preflight

    monkeypatch.setattr(preflight, "available_memory", lambda: 2**20)
    lines = fit_refused(tiny_config(tmp_path, data_root), tmp_path / "run", capsys)
    assert lines[0].startswith(f"error: store memory: the {TINY_CLIENTS} clients' states")
    assert "this machine has 0.0 GiB available: use --store disk" in lines[0]
    assert not (tmp_path / "run").exists()
    fit(tiny_config(tmp_path, data_root, rounds=1), tmp_path / "disk", "--store", "disk")  # disk: not refused


def test_disk_store_checkpoints_share_its_files_and_keep_their_rounds_bytes(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, rounds=2, checkpoint_every=1, store="disk")
    fit(config, tmp_path / "run")
    folders = sorted((tmp_path / "run" / "checkpoints").glob("round_*"))
    assert [f.name for f in folders] == ["round_0001", "round_0002"]
    for folder in folders:  # round 2's store writes replaced the files; round 1's links kept the bytes
        assert integrity.verify(folder) is None
    one = [checkpoint.load_client(folders[0], i)["model"] for i in range(TINY_CLIENTS)]
    two = [checkpoint.load_client(folders[1], i)["model"] for i in range(TINY_CLIENTS)]
    assert any(not torch.equal(a[k], b[k]) for a, b in zip(one, two, strict=True) for k in a)


def test_each_dataset_and_task_set_is_read_once_for_all_its_clients(tmp_path, data_root, monkeypatch):
    from fedmtl.federated import clients as clients_module

    built = []

    def recording(*args, **kwargs):
        built.append((args[0], tuple(kwargs["tasks"]), args[2]))
        return build(*args, **kwargs)

    build = clients_module.build_dataset
    monkeypatch.setattr(clients_module, "build_dataset", recording)
    groups = [
        {
            "dataset": "pascal_context",
            "tasks": ["semseg", "sal"],
            "single_task": True,
            "replicas": 2,
            "batch_size": 2,
        },
        {"dataset": "nyud", "tasks": ["semseg", "depth"], "replicas": 2, "batch_size": 2},
    ]
    fit(tiny_config(tmp_path, data_root, clients=groups, rounds=1), tmp_path / "run")
    # 6 clients, 3 architectures: one training and one validation dataset each
    assert sorted(built) == sorted(
        (d, t, s) for d, t in {(b[0], b[1]) for b in built} for s in ("train", "val")
    )
    assert len(built) == 6


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_a_subset_is_the_dataset_built_with_those_indices(data_root):
    from fedmtl.data.datasets import build_dataset

    options = dict(tasks=("semseg", "human_parts"), train_size=(32, 32), human_parts_selection="public")
    whole = build_dataset("pascal_context", data_root, "train", indices=[], **options)
    indices = [5, 1, 3]
    part = whole.subset(indices, seed=7)
    built = build_dataset("pascal_context", data_root, "train", indices=indices, seed=7, **options)
    assert part.ids == built.ids and part.split_indices == built.split_indices and part.seed == 7
    for k in range(len(part)):
        assert _same(part[k], built[k])
    with pytest.raises(IndexError, match="out of range"):
        whole.subset([10**6], seed=0)
