"""Issue #29, item 5: the bytes each client sends and receives per round, by pool.

The tiny scenario's counts against a hand count of its models' parameters (4 bytes each, the
float32 rows the engine exchanges; BatchNorm running statistics are buffers and stay on the
client), for methods that send both pools, the encoder only, nothing, heads too, and a cloud
model down; the rules for clients that sit a round out or whose update is dropped; the pure
functions with explicit sets of senders. A resumed run's totals equal a straight run's:
tests/test_engine.py compares their whole results.json.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fedmtl.aggregation import ClientInfo, FlatLayout
from fedmtl.aggregation.communication import (
    Exchange,
    add_round,
    part_bytes,
    round_traffic,
    senders_and_receivers,
    totals_summary,
    traffic_values,
)
from fedmtl.federated.engine import progress_line
from fedmtl.methods import create_method
from fedmtl.models import MultiTaskModel
from fedmtl.tasks import get_task
from tests.helpers import TINY, TINY_BACKBONE, fit, tiny_config

ROUNDS = 2
FLOAT32 = 4  # bytes of one number on the wire
# The tiny scenario's clients: name -> (dataset, tasks)
CLIENTS = {
    "pascal_context-semseg": ("pascal_context", ("semseg",)),
    "pascal_context-sal": ("pascal_context", ("sal",)),
    "nyud-semseg+depth": ("nyud", ("semseg", "depth")),
}
NYUD = "nyud-semseg+depth"


def hand_count() -> dict[str, dict[str, int]]:
    """Each client's bytes of its encoder, decoders and heads, counted from the architecture:
    the FCN decoder (4 linear projections to e channels, a 1x1 fuse convolution of 4e to e, a
    BatchNorm's weight and bias) and the head (two stride-2 transposed 2x2 convolutions halving
    the channels, a 1x1 convolution to the task's outputs), e the encoder's first channels. The
    encoder (the tiny scenario's) is its parameters' count; its BatchNorm buffers are left out."""
    model = MultiTaskModel("nyud", ["semseg"], img_size=(32, 32), backbone=TINY_BACKBONE)
    channels = model.encoder.channels
    e = channels[0]
    encoder = sum(p.numel() for p in model.encoder.parameters())
    assert sum(b.numel() for b in model.encoder.buffers()) > 0  # running statistics, not sent
    decoder = sum(c * e + e for c in channels) + (4 * e * e + e) + 2 * e

    def head(dataset: str, task: str) -> int:
        out = get_task(task).channels(dataset)
        return (e * (e // 2) * 4 + e // 2) + ((e // 2) * (e // 4) * 4 + e // 4) + ((e // 4) * out + out)

    return {
        name: {
            "encoder": FLOAT32 * encoder,
            "decoders": FLOAT32 * decoder * len(tasks),
            "heads": FLOAT32 * sum(head(dataset, t) for t in tasks),
        }
        for name, (dataset, tasks) in CLIENTS.items()
    }


def both_ways(*parts: str):
    """A round's expected traffic of a method that sends ``parts`` up and receives them down."""
    return lambda size: {pool: (size[pool], size[pool]) for pool in parts}


# method (algorithm config) -> per client: pool -> (up, down) bytes in one round
METHODS = {
    "FedAvg": ({"class_path": "FedAvg"}, both_ways("encoder", "decoders")),
    "FedPer": ({"class_path": "FedPer"}, both_ways("encoder")),
    "Local": ({"class_path": "Local"}, lambda size: {}),
    "FedHCA2": ({"class_path": "FedHCA2"}, both_ways("encoder", "decoders")),
    "FedAMP": (
        {"class_path": "FedAMP"},
        lambda size: {
            "encoder": (size["encoder"], 0),
            "decoders": (size["decoders"], 0),
            "clouds": (0, size["encoder"] + size["decoders"]),
        },
    ),
    "unified": (
        {"class_path": "FedAvg", "init_args": {"decoder_scope": "same_task", "head_scope": "same_task"}},
        both_ways("encoder", "decoders", "heads"),
    ),
}


def metrics_by_round(run: Path) -> dict[int, dict[str, float]]:
    """metrics.csv as {round: {key: value}}."""
    out: dict[int, dict[str, float]] = {}
    with open(run / "metrics.csv") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["round"]), {})[row["key"]] = float(row["value"])
    return out


@pytest.fixture(scope="module")
def sizes() -> dict[str, dict[str, int]]:
    return hand_count()


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    out = {}
    for name, (algorithm, _) in METHODS.items():
        config = tiny_config(module_dir, data_root, name=f"{name}.yaml", algorithm=algorithm, rounds=ROUNDS)
        out[name] = module_dir / name
        fit(config, out[name])
    return out


@pytest.mark.parametrize("method", list(METHODS))
def test_bytes_equal_a_hand_count_per_round_and_in_all(runs, sizes, method):
    expected = {client: METHODS[method][1](size) for client, size in sizes.items()}
    results = json.loads((runs[method] / "results.json").read_text())["communication"]
    assert results["rounds"] == ROUNDS
    counted = {
        client: {pool: (sent["up_bytes"], sent["down_bytes"]) for pool, sent in pools.items()}
        for client, pools in results["clients"].items()
    }
    assert counted == {
        c: {p: (ROUNDS * u, ROUNDS * d) for p, (u, d) in pools.items()} for c, pools in expected.items()
    }
    up = sum(u for pools in expected.values() for u, _ in pools.values())
    down = sum(d for pools in expected.values() for _, d in pools.values())
    assert (results["up_bytes"], results["down_bytes"]) == (ROUNDS * up, ROUNDS * down)
    for round_, values in metrics_by_round(runs[method]).items():
        assert (values["comm/up_bytes"], values["comm/down_bytes"]) == (up, down), round_
        for client, pools in expected.items():
            assert values[f"comm/{client}/up_bytes"] == sum(u for u, _ in pools.values())
            assert values[f"comm/{client}/down_bytes"] == sum(d for _, d in pools.values())
        for pool in {p for pools in expected.values() for p in pools}:
            assert values[f"comm/{pool}/up_bytes"] == sum(pools[pool][0] for pools in expected.values())
            assert values[f"comm/{pool}/down_bytes"] == sum(pools[pool][1] for pools in expected.values())


def test_a_client_that_sits_a_round_out_uploads_nothing_and_still_downloads(tmp_path, data_root, sizes):
    algorithm = {"class_path": "FedAvg", "init_args": {"participation": 0.5}}  # 2 of the 3 clients a round
    fit(tiny_config(tmp_path, data_root, algorithm=algorithm, rounds=ROUNDS), tmp_path / "run")
    per_round = {c: size["encoder"] + size["decoders"] for c, size in sizes.items()}
    for round_, values in metrics_by_round(tmp_path / "run").items():
        trained = {c for c in CLIENTS if f"train/{c}/loss" in values}
        assert len(trained) == 2, round_
        for client in CLIENTS:
            assert values[f"comm/{client}/up_bytes"] == (per_round[client] if client in trained else 0)
            assert values[f"comm/{client}/down_bytes"] == per_round[client]


def test_a_dropped_update_was_uploaded_but_nothing_comes_down(tmp_path, data_root, sizes):
    clients = json.loads(json.dumps(TINY["clients"]))
    for group, lr in zip(clients, (1e-4, 1e3), strict=True):  # NYUD's update explodes: dropped
        group["optimizer"] = {"lr": lr, "warmup_epochs": 0}
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, clients=clients, rounds=1)
    results = fit(config, tmp_path / "run")
    (values,) = metrics_by_round(tmp_path / "run").values()
    assert values["server/dropped_updates"] == 1
    for client, size in sizes.items():
        sent = size["encoder"] + size["decoders"]
        assert values[f"comm/{client}/up_bytes"] == sent
        assert values[f"comm/{client}/down_bytes"] == (0 if client == NYUD else sent)
    assert results["communication"]["clients"][NYUD]["encoder"] == {
        "up_bytes": sizes[NYUD]["encoder"],
        "down_bytes": 0,
    }


# ---------------------------------------------------------------------------- the pure functions


def test_senders_follow_who_trained_and_who_was_dropped():
    assert senders_and_receivers(4, None, []) == ({0, 1, 2, 3}, {0, 1, 2, 3})
    # 1 and 3 trained, 3's update was dropped: it uploaded, it downloads nothing; 0 and 2 sat out
    assert senders_and_receivers(4, [1, 3], [3]) == ({1, 3}, {0, 1, 2})


def test_traffic_counts_only_the_given_senders_and_receivers():
    exchange = Exchange(up={"encoder": ("encoder",)}, down={"clouds": ("encoder", "decoders")})
    sizes = [{"encoder": 10, "decoders": 3}, {"encoder": 10, "decoders": 6}, {"encoder": 10, "decoders": 3}]
    # Client 2 is unavailable: in neither set, it neither sends nor receives.
    traffic = round_traffic(exchange, sizes, uploading={0, 1}, downloading={1})
    assert traffic == [
        {"encoder": (10, 0), "clouds": (0, 0)},
        {"encoder": (10, 0), "clouds": (0, 16)},
        {"encoder": (0, 0), "clouds": (0, 0)},
    ]
    values = traffic_values(["a", "b", "c"], traffic)
    assert values["comm/b/down_bytes"] == 16 and values["comm/encoder/up_bytes"] == 20
    assert (values["comm/up_bytes"], values["comm/down_bytes"]) == (20, 16)
    totals: dict = {}
    add_round(totals, ["a", "b", "c"], traffic)
    add_round(totals, ["a", "b", "c"], traffic)
    summary = totals_summary(totals, 2)
    assert summary["clients"]["b"]["clouds"] == {"up_bytes": 0, "down_bytes": 32}
    assert summary["pools"]["encoder"] == {"up_bytes": 40, "down_bytes": 0}
    assert (summary["up_bytes"], summary["down_bytes"], summary["rounds"]) == (40, 32, 2)


def test_a_round_without_exchange_logs_zeros():
    values = traffic_values(["a"], round_traffic(Exchange(), [{"encoder": 5}], {0}, {0}))
    assert values == {"comm/a/up_bytes": 0, "comm/a/down_bytes": 0, "comm/up_bytes": 0, "comm/down_bytes": 0}


def test_a_message_must_carry_parts_of_the_model():
    with pytest.raises(ValueError, match=r"message 'clouds' \(down\) must carry one or more of"):
        Exchange(down={"clouds": ("encoder", "optimizer")})
    with pytest.raises(ValueError, match="whose size is not known"):
        round_traffic(Exchange.both_ways("heads"), [{"encoder": 1, "decoders": 1}], {0}, {0})


def test_part_sizes_come_from_the_flat_layouts_parameters_only():
    encoder = FlatLayout.from_module(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)))  # 8 + 4 numbers
    decoder = FlatLayout.from_module(nn.Linear(2, 1))  # 3 numbers
    head = FlatLayout.from_module(nn.Linear(1, 5))  # 10 numbers
    clients = [ClientInfo("a", "d", ("x", "y"), 1), ClientInfo("b", "d", ("x",), 1)]
    assert part_bytes(clients, encoder, decoder, {("d", "x"): head}, torch.float32) == [
        {"encoder": 48, "decoders": 24},  # y's head has no layout: heads unknown
        {"encoder": 48, "decoders": 12, "heads": 40},
    ]
    assert encoder.nbytes(torch.float64) == 96 and encoder.nbytes() == 48


def test_each_method_declares_its_exchange():
    assert create_method("Local").exchange(1) == Exchange()
    assert create_method("MaTFL").exchange(1) == Exchange.both_ways("encoder")
    assert create_method("FedBABU").exchange(1) == Exchange.both_ways("encoder")
    assert create_method("Ditto").exchange(1) == Exchange.both_ways("encoder", "decoders")
    hca = create_method("FedHCA2", encoder="none")
    assert hca.exchange(1) == Exchange.both_ways("decoders")
    sta = create_method("FedSTA", phase_b_rounds=1, same_task_decoders=True)
    sta.setup(3, [ClientInfo("a", "d", ("x",), 1)], seed=0)
    assert sta.exchange(2) == Exchange.both_ways("encoder", "decoders") and sta.exchange(3) == Exchange()
    host = create_method("FedProx", decoder_scope="none")
    assert create_method("FedDEA", host=host).exchange(1) == Exchange.both_ways("encoder")


def test_the_progress_line_shows_megabytes_up_and_down():
    line = progress_line(1, 2, {"comm/up_bytes": 2.5e6, "comm/down_bytes": 5e6, "time/train": 1.0})
    assert "comm: 2.5 MB up, 5 MB down" in line
