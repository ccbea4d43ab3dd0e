"""Issue #26, item 6: a finite but exploding client update is handled like a NaN one.

An update that moves a part of a client's model (the encoder; a task's decoder with its head)
by more than ``update_norm_limit`` times that part's norm at the start of the round passes
the NaN check but, averaged in, poisons every client. It is dropped (or stops the run) under
the ``nonfinite`` policy, named with its client group and learning rate; a run whose every
client diverges stops naming every group; and no checkpoint is written from such a round.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from fedmtl.cli import main
from fedmtl.federated import checkpoint
from tests.helpers import TINY, client_states, fit, read_results, tiny_config

NYUD = "nyud-semseg+depth"  # client 2, the tiny scenario's clients[1]
PASCAL = ("pascal_context-semseg", "pascal_context-sal")  # clients 0 and 1, clients[0]


def _config(tmp_path: Path, data_root: Path, lrs: tuple[float, float], name: str, **changes) -> Path:
    """The tiny scenario under FedAvg with these learning rates for clients[0] and clients[1]
    (no warm-up unless ``changes`` give the clients)."""
    clients = json.loads(json.dumps(TINY["clients"]))
    for group, lr in zip(clients, lrs, strict=True):
        group["optimizer"] = {"lr": lr, "warmup_epochs": 0}
    changes = {"clients": clients, "algorithm": {"class_path": "FedAvg"}, **changes}
    return tiny_config(tmp_path, data_root, name=name, **changes)


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def _finite(state: dict) -> bool:
    return all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_an_exploding_client_is_dropped_named_with_its_group_and_counted(tmp_path, data_root, capsys):
    """NYUD at lr 1e3: finite (it passes the NaN check) but its encoder grows about 3e4 times."""
    config = _config(tmp_path, data_root, (1e-4, 1e3), "exploding.yaml", rounds=2)
    capsys.readouterr()
    results = fit(config, tmp_path / "run")
    err = capsys.readouterr().err
    for round_ in (1, 2):
        (line,) = [line for line in err.splitlines() if line.startswith(f"warning: round {round_}: dropped")]
        assert f"dropped the exploding update of {NYUD} (exploding: encoder, " in line, line
        assert "in clients[1] (nyud, lr 1000.0)" in line and "update_norm_limit = 10.0" in line
    assert not _errors(err)
    rows = [line.split(",") for line in (tmp_path / "run" / "metrics.csv").read_text().splitlines()]
    assert [float(v) for _, k, v in rows if k == "server/dropped_updates"] == [1.0, 1.0]
    states = client_states(tmp_path / "run")
    assert states[2]["epochs_done"] == 0 and _finite(states[2])  # the state it started with
    assert all(s["epochs_done"] == 2 and _finite(s) for s in states[:2])
    values = [m for c in results["clients"].values() for t in c["metrics"].values() for m in t.values()]
    assert all(v is not None and math.isfinite(v) for v in values) and "nonfinite" not in results


def test_the_others_equal_a_run_that_drops_the_client_for_nan_and_without_the_check_are_poisoned(
    tmp_path, data_root
):
    """Dropped for exploding or for NaN (lr 1e6), the NYUD client is left out of the average the
    same way: the PASCAL clients end bit for bit equal. Without the check (null) its update is
    averaged into theirs, and their models are no longer finite."""
    exploding = _config(tmp_path, data_root, (1e-4, 1e3), "exploding.yaml", rounds=1)
    nan = _config(tmp_path, data_root, (1e-4, 1e6), "nan.yaml", rounds=1)
    fit(exploding, tmp_path / "exploding")
    fit(nan, tmp_path / "nan")
    for a, b in zip(
        client_states(tmp_path / "exploding")[:2], client_states(tmp_path / "nan")[:2], strict=True
    ):
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    unchecked = fit(exploding, tmp_path / "unchecked", "--update_norm_limit", "null")
    assert set(unchecked["nonfinite"]["post-aggregation"]) >= set(PASCAL)


def test_when_every_client_diverges_the_run_stops_naming_every_group_and_its_lr(tmp_path, data_root, capsys):
    """lr 1e30 everywhere: the PASCAL clients' round-1 updates are finite (1e30 in size), the
    NYUD client's NaN. Before, the finite ones were averaged in and round 1's checkpoint held
    them; now round 1 stops, and nothing of it is written."""
    config = _config(tmp_path, data_root, (1e30, 1e30), "all.yaml", rounds=2)
    capsys.readouterr()
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "run")]) == 1
    (line,) = _errors(capsys.readouterr().err)
    assert line.startswith("error: round 1: every client's update is divergent (NaN/inf or exploding): "), (
        line
    )
    assert "clients[0] (pascal_context, lr 1e+30): pascal_context-semseg (exploding: encoder" in line
    assert f"clients[1] (nyud, lr 1e+30): {NYUD} (encoder, decoders, heads)" in line
    assert "without saving round 1; no checkpoint was written" in line
    assert "Lower the learning rate of these client groups (clients[].optimizer.lr)" in line
    assert (
        checkpoint.round_folders(tmp_path / "run") == [] and not (tmp_path / "run" / "results.json").exists()
    )


def test_a_round_that_explodes_everywhere_writes_no_checkpoint_and_keeps_the_last(
    tmp_path, data_root, capsys
):
    """With one warm-up epoch, rounds 1 and 2 train at the warm-up's 1.25e-7 (an epoch trains at
    the schedule's value for the epoch before it) and are healthy; round 3 trains at lr 1e3 and
    every update explodes, finite, so only the new check sees it: round 3 is not saved, round
    2's checkpoint stays the latest, with finite, moderate parameters."""
    clients = json.loads(json.dumps(TINY["clients"]))
    for group in clients:
        group.update(local_epochs=1, optimizer={"lr": 1e3, "warmup_epochs": 1})
    config = tiny_config(tmp_path, data_root, name="late.yaml", clients=clients, rounds=3)
    capsys.readouterr()
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "run")]) == 1
    (line,) = _errors(capsys.readouterr().err)
    assert line.startswith(
        "error: round 3: every client's update is exploding: clients[0] (pascal_context, lr 1000.0)"
    )
    assert "the last checkpoint, round_0002, is kept" in line
    assert checkpoint.latest(tmp_path / "run").name == "round_0002"
    assert "round_0003" not in [p.name for p in checkpoint.round_folders(tmp_path / "run")]
    for state in client_states(tmp_path / "run"):
        assert state["epochs_done"] == 2 and _finite(state)
        assert max(t.abs().max() for t in state["model"].values() if t.is_floating_point()) < 100


def test_nonfinite_stop_stops_at_an_exploding_update(tmp_path, data_root, capsys):
    config = _config(tmp_path, data_root, (1e-4, 1e3), "exploding.yaml", rounds=2)
    capsys.readouterr()
    assert (
        main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "run"), "--nonfinite", "stop"]) == 1
    )
    (line,) = _errors(capsys.readouterr().err)
    assert line.startswith(
        f"error: round 1: a client's update is exploding: clients[1] (nyud, lr 1000.0): {NYUD}"
    )
    assert "(nonfinite: stop)" in line and "set nonfinite: drop to skip such updates" in line
    assert checkpoint.round_folders(tmp_path / "run") == []


def test_two_processes_drop_the_exploding_client_as_one(tmp_path, data_root):
    """The growth travels between ranks with the masks: the warning is printed once and the
    results equal a one-process run's."""
    config = _config(tmp_path, data_root, (1e-4, 1e3), "exploding.yaml", rounds=1)
    one = fit(config, tmp_path / "one")
    command = [
        sys.executable,
        "-m",
        "fedmtl",
        "fit",
        "--config",
        str(config),
        "--run_dir",
        str(tmp_path / "two"),
    ]
    done = subprocess.run([*command, "--devices", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(f"dropped the exploding update of {NYUD}") == 1
    assert read_results(tmp_path / "two") == one


def test_the_check_changes_nothing_in_a_healthy_run(tmp_path, data_root):
    """The default limit never fires on a healthy run, and checking costs no change: the
    results equal a run without the check, bit for bit."""
    config = tiny_config(tmp_path, data_root, rounds=2, algorithm={"class_path": "FedAvg"})
    checked = fit(config, tmp_path / "checked")
    assert checked == fit(config, tmp_path / "unchecked", "--update_norm_limit", "null")
    rows = [line.split(",") for line in (tmp_path / "checked" / "metrics.csv").read_text().splitlines()]
    assert [float(v) for _, k, v in rows if k == "server/dropped_updates"] == [0.0, 0.0]
