"""Held-out clients (``clients[].held_out``): they never train in the federation and nothing
of them is stored before the end; after the last round each starts from the federated model
(the shared parts' mean over the federated clients' evaluated models, its own draw for the
rest), fine-tunes on its own data and is evaluated, reported apart in results.json."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fedmtl.config import ClientGroup, DataConfig, RunConfig
from fedmtl.federated import checkpoint
from fedmtl.federated.held_out import (
    DECODERS,
    ENCODER,
    HEADS,
    Part,
    PartSums,
    flat_state,
    load_flat_state,
    parts_of,
)
from fedmtl.federated.scenario import build_clients, build_scenario, count_clients
from fedmtl.methods import FedAvg, FedHCA2, FedPer, Local
from tests.helpers import TINY, TINY_CLIENTS, fit, fit_in_processes, tiny_config

PASCAL, NYUD = TINY["clients"]
HELD_OUT = {
    "dataset": "nyud",
    "tasks": ["semseg", "depth"],
    "batch_size": 4,
    "held_out": True,
    "fine_tune_epochs": 1,
}


def _config(data_root, *groups: ClientGroup) -> RunConfig:
    return RunConfig(clients=list(groups), data=DataConfig(root=str(data_root)))


def test_held_out_groups_leave_the_federation_and_its_partition_as_they_are(data_root):
    federation = ClientGroup(dataset="nyud", tasks=["semseg", "depth"], replicas=3, batch_size=2)
    new = ClientGroup(dataset="nyud", tasks=["semseg", "depth"], replicas=2, batch_size=2, held_out=True)
    alone = build_clients(_config(data_root, federation))
    clients, held = build_scenario(_config(data_root, federation, new))
    assert [(c.name, c.train_indices) for c in clients] == [(c.name, c.train_indices) for c in alone]
    assert count_clients(_config(data_root, federation, new)) == len(clients) == 3
    assert len(held) == 2 and {c.name for c in held}.isdisjoint(c.name for c in clients)
    # The held-out clients split the training set among themselves, every image once.
    assert sorted(i for c in held for i in c.train_indices) == list(range(12))
    assert [c.fine_tune_epochs for c in held] == [1, 1]  # their local epochs when not set
    assert all(c.fine_tune_epochs is None for c in clients)


@pytest.mark.parametrize(
    ("method", "shared"),
    [
        (Local(), set()),
        (FedAvg(), {ENCODER, DECODERS}),
        (FedPer(), {ENCODER}),
        (FedAvg(decoder_scope="same_task", head_scope="same_task"), {ENCODER, DECODERS, HEADS}),
        (FedHCA2(), {ENCODER, DECODERS}),
        (FedHCA2(encoder="none"), {DECODERS}),
    ],
)
def test_a_new_client_receives_what_its_method_shares(method, shared):
    assert method.shared_parts == shared
    parts = parts_of("nyud", ["semseg", "depth"], frozenset(shared))
    assert (Part(ENCODER) in parts) == (ENCODER in shared)
    assert (Part(DECODERS, ("depth",)) in parts) == (DECODERS in shared)
    assert (Part(HEADS, ("nyud", "depth")) in parts) == (HEADS in shared)


class _Model(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.decoders = nn.ModuleDict({"depth": nn.Linear(2, 1), "semseg": nn.Linear(2, 1)})
        self.heads = nn.ModuleDict({"depth": nn.Linear(1, 1), "semseg": nn.Linear(1, 1)})
        for tensor in self.state_dict().values():
            if tensor.is_floating_point():
                tensor.fill_(value)


def test_each_part_is_the_mean_over_the_clients_that_hold_it():
    shared = frozenset({ENCODER, DECODERS})
    wanted = parts_of("nyud", ["depth", "semseg"], shared)
    size = {part: flat_state(part.module(_Model(0))).numel() for part in wanted}
    sums = PartSums(wanted, size)
    sums.add(_Model(1.0), parts_of("nyud", ["depth"], shared))
    sums.add(_Model(3.0), parts_of("pascal_context", ["depth", "semseg"], shared))
    means = sums.means()
    encoder = _Model(0.0)
    load_flat_state(Part(ENCODER).module(encoder), means[Part(ENCODER)])
    assert torch.equal(encoder.encoder[1].running_var, torch.full((2,), 2.0))  # statistics too
    assert torch.equal(encoder.encoder[1].num_batches_tracked, torch.tensor(0))  # not averaged
    assert torch.all(means[Part(DECODERS, ("depth",))] == 2.0)
    assert torch.all(means[Part(DECODERS, ("semseg",))] == 3.0)  # only the second client has it


@pytest.fixture(scope="module")
def runs(module_dir, data_root):
    """The tiny scenario under FedAvg, alone and with a held-out group; and again on 2 devices."""
    tmp = module_dir
    algorithm = {"class_path": "FedAvg"}
    alone = tiny_config(tmp, data_root, name="alone.yaml", rounds=2, algorithm=algorithm)
    with_new = tiny_config(
        tmp, data_root, name="new.yaml", rounds=2, algorithm=algorithm, clients=[PASCAL, NYUD, HELD_OUT]
    )
    local = tiny_config(tmp, data_root, name="local.yaml", rounds=2, clients=[PASCAL, NYUD, HELD_OUT])
    out = {
        "alone": fit(alone, tmp / "alone"),
        "new": fit(with_new, tmp / "new"),
        "local": fit(local, tmp / "local"),
    }
    out["two devices"] = fit_in_processes(with_new, tmp / "new2")
    out["dir"], out["local dir"], out["alone dir"] = tmp / "new", tmp / "local", tmp / "alone"
    out["config"] = with_new
    return out


def test_held_out_clients_never_touch_the_federation(runs):
    assert runs["new"]["clients"] == runs["alone"]["clients"]  # the federation trained as without them
    folder = checkpoint.latest(runs["dir"])
    stored = checkpoint.load_server(folder)
    assert len(list(folder.glob("client_*"))) == TINY_CLIENTS, sorted(p.name for p in folder.iterdir())
    assert json.loads(stored["history"])[-1]["metrics"]["held_out"]  # recorded with the last round


def test_held_out_clients_are_reported_apart(runs):
    held_out = runs["new"]["held_out"]
    (name,) = held_out["clients"]
    client = held_out["clients"][name]
    assert client["fine_tune_epochs"] == 1 and client["tasks"] == ["semseg", "depth"]
    assert client["train_images"] == sum(client["class_histogram"].values()) == 12  # the whole split
    for metrics in client["metrics"].values():
        (value,) = metrics.values()
        assert isinstance(value, float)
    assert set(held_out["tasks"]) == {"nyud/semseg", "nyud/depth"}
    assert name not in runs["new"]["clients"]


def test_held_out_results_do_not_depend_on_the_devices(runs):
    assert runs["two devices"]["held_out"] == runs["new"]["held_out"]
    assert runs["two devices"]["clients"] == runs["new"]["clients"]


def test_a_finished_run_reprints_its_held_out_clients(runs, tmp_path):
    again = fit(runs["config"], runs["dir"], "--resume", "true")
    assert again["held_out"] == runs["new"]["held_out"]
    assert json.loads((runs["dir"] / "results.json").read_text())["held_out"] == runs["new"]["held_out"]


def test_the_report_gives_the_held_out_clients_apart(runs, capsys):
    from fedmtl import report
    from fedmtl.cli import main

    (name,) = runs["new"]["held_out"]["clients"]
    assert main(["report", str(runs["dir"]), str(runs["local dir"]), "--held_out", "true"]) == 0
    table = capsys.readouterr().out
    # the held-out client's only column: a NYUD depth one
    assert "| NYUD depth RMSE ↓ |" in table and "PASCAL-Context" not in table
    federation = report.build_report([runs["dir"], runs["local dir"]]).columns  # without --held_out
    assert name not in {c.client for c in federation} and len(federation) == 4


def test_the_report_refuses_held_out_clients_a_run_lacks(runs, tmp_path, capsys):
    from tests.helpers import refused_keeping

    lines = refused_keeping(["report", str(runs["alone dir"]), "--held_out", "true"], tmp_path, capsys)
    assert "has no held-out clients" in lines[-1] and "without --held_out" in lines[-1]
    lines = refused_keeping(
        ["report", str(runs["dir"]), "--held_out", "true", "--curves", str(tmp_path / "c.png")],
        tmp_path,
        capsys,
    )
    assert "leave out --curves" in lines[-1]
