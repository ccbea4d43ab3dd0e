"""The round loop end to end on tiny generated data: Local, FedAvg, devices, resume, the CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from fedmtl.cli import main
from fedmtl.federated import checkpoint
from tests.helpers import TINY_STEM, client_states, fit_in_processes, fit_killed_in_round, tiny_config


def _config(tmp_path: Path, data_root: Path, **changes) -> Path:
    changes.setdefault("cpu_threads", None)  # the engine's default thread budget, as before
    return tiny_config(tmp_path, data_root, **changes)


def _fit(config: Path, run_dir: Path, *extra: str) -> dict:
    from tests.helpers import fit

    return fit(config, run_dir, *extra)


def _client_states(run_dir: Path) -> list[dict]:
    return [state["model"] for state in client_states(run_dir)]


def _metric_values(results: dict) -> list[float]:
    return [v for c in results["clients"].values() for m in c["metrics"].values() for v in m.values()]


def test_local_round_loop_trains_every_client_and_writes_results(tmp_path, data_root):
    results = _fit(_config(tmp_path, data_root), tmp_path / "run")
    assert list(results["clients"]) == ["pascal_context-semseg", "pascal_context-sal", "nyud-semseg+depth"]
    assert results["algorithm"] == "Local" and results["rounds"] == 3
    assert all(math.isfinite(v) for v in _metric_values(results))
    states = _client_states(tmp_path / "run")
    key = TINY_STEM
    assert not torch.equal(states[0][key], states[1][key]), "Local must not share encoders"
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    keys = {(int(r["round"]), r["key"]) for r in rows}
    assert {(r, "train/nyud-semseg+depth/depth_loss") for r in (1, 2, 3)} <= keys
    assert (2, "val/pascal_context-sal/sal_maxF") in keys and (3, "time/aggregate") in keys
    assert (1, "val/pascal_context-sal/sal_maxF") not in keys  # evaluated every 2 rounds and at the end
    # The learning rate each client group trained at (issue #37 item 2): the tiny config's default
    # schedule (5 warm-up epochs) at rounds 1 and 3; group 1 trains 2 epochs a round, its mean.
    from fedmtl.config import OptimizerConfig
    from fedmtl.federated.training import epoch_rates

    rates = {(int(r["round"]), r["key"]): float(r["value"]) for r in rows if r["key"].startswith("lr/")}
    one, two = epoch_rates(OptimizerConfig(), 3), epoch_rates(OptimizerConfig(), 6)
    assert rates[(1, "lr/clients[0]")] == pytest.approx(one[0]) == pytest.approx(1.25e-7)
    assert rates[(3, "lr/clients[0]")] == pytest.approx(one[2])
    assert rates[(3, "lr/clients[1]")] == pytest.approx((two[4] + two[5]) / 2)
    assert len(rates) == 6, rates


def test_fedavg_shares_encoders_and_decoders_but_not_heads(tmp_path, data_root):
    _fit(_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=2), tmp_path / "run")
    a, b, mt = _client_states(tmp_path / "run")
    for key in a:
        if key.startswith("encoder.") and "running" not in key and "num_batches" not in key:
            assert torch.equal(a[key], mt[key]), key
    assert torch.equal(a["decoders.semseg.fuse.weight"], b["decoders.sal.fuse.weight"])
    assert torch.equal(a["decoders.semseg.fuse.weight"], mt["decoders.depth.fuse.weight"])
    assert not torch.equal(a["heads.semseg.classifier.weight"], mt["heads.semseg.classifier.weight"])
    # BatchNorm statistics are buffers: they stay local
    assert not torch.equal(a["decoders.semseg.norm.running_mean"], b["decoders.sal.norm.running_mean"])


@pytest.mark.parametrize("algorithm", ["FedAvg", "FedHCA2"])
def test_a_run_killed_after_a_round_resumes_to_the_same_results(tmp_path, data_root, monkeypatch, algorithm):
    """FedHCA2's hyper weights and their momentum are server state: resumed, they continue."""
    config = _config(tmp_path, data_root, algorithm={"class_path": algorithm})
    straight = _fit(config, tmp_path / "straight")

    fit_killed_in_round(config, tmp_path / "resumed", monkeypatch, 3, fit_run=_fit)
    assert checkpoint.latest(tmp_path / "resumed").name == "round_0002"
    assert not (tmp_path / "resumed" / "results.json").exists()

    resumed = _fit(config, tmp_path / "resumed", "--resume", "true")
    assert resumed == straight
    with open(tmp_path / "resumed" / "metrics.csv") as f:
        rounds = [int(r["round"]) for r in csv.DictReader(f) if r["key"] == "train/nyud-semseg+depth/loss"]
    assert rounds == [1, 2, 3]


def test_validate_evaluates_the_latest_checkpoint(tmp_path, data_root, capsys):
    results = _fit(_config(tmp_path, data_root, rounds=1), tmp_path / "run")
    assert main(["validate", "--run_dir", str(tmp_path / "run")]) == 0
    validated = json.loads((tmp_path / "run" / "validate_results.json").read_text())
    assert validated["clients"] == results["clients"]
    assert "nyud-semseg+depth" in capsys.readouterr().out


def test_validate_rescores_edges_against_the_ground_truth_it_is_asked_for(tmp_path, data_root):
    """A finished run scores edges against the thinned ground truth (SEISM's); ``validate
    --evaluation.edge_thin_gt false`` rescores the same checkpoint against the unthinned one
    (the generated NYUD boundaries are 2 px wide, so the two differ) and leaves the other tasks."""
    clients = [{"dataset": "nyud", "tasks": ["semseg", "edge"], "batch_size": 4}]
    results = _fit(_config(tmp_path, data_root, rounds=1, clients=clients), tmp_path / "run")
    assert main(["validate", "--run_dir", str(tmp_path / "run")]) == 0
    thinned = json.loads((tmp_path / "run" / "validate_results.json").read_text())["clients"]
    assert thinned == results["clients"]
    assert main(["validate", "--run_dir", str(tmp_path / "run"), "--evaluation.edge_thin_gt", "false"]) == 0
    unthinned = json.loads((tmp_path / "run" / "validate_results.json").read_text())["clients"]
    (name,) = unthinned
    assert unthinned[name]["metrics"]["semseg"] == thinned[name]["metrics"]["semseg"]
    assert unthinned[name]["metrics"]["edge"] != thinned[name]["metrics"]["edge"]


def test_validate_refuses_an_edge_switch_that_is_not_true_or_false(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["validate", "--run_dir", str(tmp_path), "--evaluation.edge_thin_gt", "maybe"])
    assert done.value.code != 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "edge_thin_gt" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rounds": "many"}, 'key "rounds"'),
        ({"clients": [{"dataset": "nyud", "tasks": ["semseg"], "local_epochs": "four"}]}, "local_epochs"),
        ({"algorithm": {"class_path": "NoSuchAggregator"}}, "NoSuchAggregator"),
    ],
)
def test_a_bad_config_names_the_field(tmp_path, data_root, capsys, changes, message):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                str(_config(tmp_path, data_root, **changes)),
                "--run_dir",
                str(tmp_path / "r"),
            ]
        )
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err


def test_a_task_the_dataset_lacks_is_a_one_line_error(tmp_path, data_root, capsys):
    config = _config(tmp_path, data_root, clients=[{"dataset": "nyud", "tasks": ["semseg", "human_parts"]}])
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: clients[0].tasks:") and "human_parts" in err


def test_a_missing_dataset_names_its_folder_and_the_command_that_writes_it(tmp_path, capsys):
    config = _config(tmp_path, tmp_path / "empty", data={"root": str(tmp_path / "empty")})
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "r")]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: nyud training split not found")
    assert f"fedmtl data synth --dataset nyud --root {tmp_path / 'empty' / 'NYUDv2'}" in first
    assert f"check it with: fedmtl data check --root {tmp_path / 'empty'}" in first
    assert "the archives linked from the public FedHCA² README (innovator-zero/FedHCA2)" in first
    assert f"fedmtl data prepare ARCHIVE... --root {tmp_path / 'empty'}" in first
    assert "make demo" not in first
    assert not (tmp_path / "r").exists()


def test_two_cpu_processes_give_the_results_of_one(tmp_path, data_root):
    """Fabric launches 2 processes (gloo); clients are sharded; results equal 1 process's.

    With the same torch thread count per process the runs are bit-identical: nothing a client
    computes depends on the rank it trains on."""
    config = _config(tmp_path, data_root, algorithm={"class_path": "FedHCA2"}, rounds=2, cpu_threads=1)
    one = _fit(config, tmp_path / "one")
    two = fit_in_processes(config, tmp_path / "two")
    assert two == one


def test_a_disk_store_gives_the_results_of_a_memory_store_and_cleans_up(tmp_path, data_root):
    config = _config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=2)
    memory = _fit(config, tmp_path / "memory")
    disk = _fit(config, tmp_path / "disk", "--store", "disk")
    assert disk == memory
    assert not list((tmp_path / "disk" / "store").rglob("*.pt"))  # the checkpoint keeps the states
    assert checkpoint.latest(tmp_path / "disk").name == "round_0002"


def test_data_scale_range_reaches_every_training_set(tmp_path, data_root, monkeypatch):
    from fedmtl.federated import clients as clients_module

    seen = []

    def recording(*args, **kwargs):
        seen.append((args[2], kwargs.get("scale_range")))
        return build(*args, **kwargs)

    build = clients_module.build_dataset
    monkeypatch.setattr(clients_module, "build_dataset", recording)
    _fit(_config(tmp_path, data_root, rounds=1), tmp_path / "run", "--data.scale_range", "[1.0, 1.25]")
    assert {split for split, _ in seen} == {"train", "val"}
    assert {tuple(scale) for _, scale in seen} == {(1.0, 1.25)}


def test_a_channels_last_run_trains_and_aggregates_the_same_model(tmp_path, data_root):
    """model.channels_last through the whole round (training, the store, FedHCA²'s aggregation
    and write-back, the checkpoint): the states differ from a contiguous run's by float
    rounding only, and the trained convolution weights keep the layout."""
    config = _config(tmp_path, data_root, algorithm={"class_path": "FedHCA2"}, rounds=1)
    _fit(config, tmp_path / "plain")
    _fit(config, tmp_path / "fast", "--model.channels_last", "true")
    for plain, fast in zip(client_states(tmp_path / "plain"), client_states(tmp_path / "fast"), strict=True):
        assert plain["model"].keys() == fast["model"].keys()
        for name, value in plain["model"].items():
            if value.is_floating_point():
                torch.testing.assert_close(fast["model"][name], value, atol=1e-3, rtol=1e-3, msg=name)
        convs = [v for v in fast["model"].values() if v.ndim == 4]
        assert convs and all(v.is_contiguous(memory_format=torch.channels_last) for v in convs)
