"""Every registered method through the real engine, and what all methods share: the registry,
config fragments, client sampling, resume of personal state, and refusals of bad input.

Each method's own behaviour and hand cases are in tests/test_<method>.py.
"""

from __future__ import annotations

import ast
import csv
import json
import math
from pathlib import Path

import pytest
import torch

from fedmtl.cli import main
from fedmtl.federated import checkpoint
from fedmtl.methods import METHODS, FedAvg, Method, create_method
from tests.helpers import (
    TINY_STEM,
    client_states,
    fit,
    fit_killed_in_round,
    fit_refused,
    read_results,
    tiny_config,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PERSONAL_STATE = ["Ditto", "FedAMP", "FedBABU"]  # methods whose clients keep state the server never sees


def _metrics(results: dict) -> list[float]:
    return [v for c in results["clients"].values() for m in c["metrics"].values() for v in m.values()]


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_end_to_end_and_reports_its_evaluated_model(method_run, name):
    results = read_results(method_run(name)[1])
    method = METHODS.get(name)
    assert results["algorithm"] == name
    assert results["evaluated"] == method.evaluated
    assert all(math.isfinite(v) for v in _metrics(results))
    assert sorted(results.get("also_evaluated", {})) == sorted(getattr(method, "also_evaluated", ()))
    for table in results.get("also_evaluated", {}).values():
        assert set(table) == set(results["clients"])


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_has_a_config_fragment_that_combines_with_the_demo(name, capsys):
    fragment = CONFIGS / "methods" / f"{name.lower()}.yaml"
    assert fragment.is_file(), f"configs/methods/{name.lower()}.yaml is missing"
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(fragment), "--print_config"])
    assert done.value.code == 0
    assert f"class_path: fedmtl.methods.{name}" in capsys.readouterr().out


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_is_an_attribute_of_the_package_and_builds_by_name(name):
    import fedmtl.methods

    assert getattr(fedmtl.methods, name) is METHODS.get(name)
    assert isinstance(create_method(name), Method)


@pytest.mark.parametrize("name", PERSONAL_STATE)
def test_personal_state_survives_a_kill_and_resume_bit_for_bit(tmp_path, data_root, monkeypatch, name):
    """The personal model (Ditto), cloud models (FedAMP) and frozen heads / fine-tuned copy
    (FedBABU) live in the client store and the checkpoints: a resumed run ends identical."""
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": name})
    straight = fit(config, tmp_path / "straight")

    fit_killed_in_round(config, tmp_path / "resumed", monkeypatch, 3)
    assert checkpoint.latest(tmp_path / "resumed").name == "round_0002"

    assert fit(config, tmp_path / "resumed", "--resume", "true") == straight
    for a, b in zip(client_states(tmp_path / "straight"), client_states(tmp_path / "resumed"), strict=True):
        assert repr(a["personal"].keys()) == repr(b["personal"].keys())
        _assert_equal_nested(a["personal"], b["personal"])


def _assert_equal_nested(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_equal_nested(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_equal_nested(x, y)
    else:
        assert a == b


def test_no_method_module_imports_the_federated_engine():
    """The dependency runs one way, fedmtl.federated -> fedmtl.methods: what both need lives in
    neutral modules (fedmtl.tensors, fedmtl.seeds)."""
    package = Path(__file__).resolve().parents[1] / "fedmtl" / "methods"
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from fedmtl import federated` too
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            found += [
                f"{path.name}: {name}" for name in names if name.split(".")[:2] == ["fedmtl", "federated"]
            ]
    assert found == []


# --- client sampling ----------------------------------------------------------------------


def test_participation_is_seeded_and_draws_a_fraction_of_the_clients():
    method = FedAvg(participation=0.5)
    clients = [object()] * 6
    method.setup(rounds=4, clients=clients, seed=0)
    draws = [method.participants(r) for r in range(1, 5)]
    assert all(len(d) == 3 and d == sorted(d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1, "every round draws anew"
    again = FedAvg(participation=0.5)
    again.setup(rounds=4, clients=clients, seed=0)
    assert [again.participants(r) for r in range(1, 5)] == draws
    full = FedAvg()
    full.setup(rounds=4, clients=clients, seed=0)
    assert full.participants(1) is None  # everyone


def test_clients_that_sit_a_round_out_do_not_train_but_receive_the_average(tmp_path, data_root):
    run = tmp_path / "run"
    fit(
        tiny_config(
            tmp_path,
            data_root,
            algorithm={"class_path": "FedAvg", "init_args": {"participation": 0.5}},
            rounds=1,
        ),
        run,
    )
    with open(run / "metrics.csv") as f:
        rows = {r["key"]: float(r["value"]) for r in csv.DictReader(f)}
    trained = [k for k in rows if k.startswith("train/") and k.endswith("/loss")]
    assert rows["server/participants"] == 2 and len(trained) == 2  # round(0.5 × 3)
    states = client_states(run)
    sitting_out = [i for i, s in enumerate(states) if s["epochs_done"] == 0]
    assert len(sitting_out) == 1, "one client did not train"
    key = TINY_STEM
    assert all(torch.equal(states[0]["model"][key], s["model"][key]) for s in states), (
        "FedAvg gives every client, trained or not, the participants' average"
    )


def test_fedhca2_refuses_client_sampling_with_a_clear_error(tmp_path, data_root, capsys):
    config = tiny_config(
        tmp_path, data_root, algorithm={"class_path": "FedHCA2", "init_args": {"participation": 0.5}}
    )
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: algorithm.participation") and "FedHCA2 needs every client" in err
    assert not (tmp_path / "r").exists()


# --- bad input: one line naming the field, non-zero exit, nothing written -------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "FedProxx"], "known methods: CAGrad, Ditto, FedAMP, FedAvg"),
        (["--algorithm", "FedProx", "--algorithm.mu", "-0.5"], "algorithm.mu must be >= 0"),
        (["--algorithm", "Ditto", "--algorithm.lam", "-1"], "algorithm.lam must be >= 0"),
        (["--algorithm", "FedAMP", "--algorithm.sigma", "0"], "algorithm.sigma must be > 0"),
        (
            ["--algorithm", "FedAvg", "--algorithm.participation", "0"],
            "algorithm.participation must be in (0, 1]",
        ),
        (
            ["--algorithm", "FedPer", "--algorithm.participation", "1.5"],
            "algorithm.participation must be in (0, 1]",
        ),
        (
            ["--algorithm", "MaTFL", "--algorithm.num_clusters", "4"],
            "set --algorithm.num_clusters to at most 3",
        ),
        (
            ["--algorithm", "FedSTA", "--algorithm.phase_b_rounds", "4"],
            "set --algorithm.phase_b_rounds to at most 3",
        ),
        (
            ["--algorithm", "FedBABU", "--algorithm.ft_epochs", "-1"],
            "algorithm.ft_epochs must be an integer >= 0",
        ),
        (["--algorithm", "FedAvg", "--algorithm.decoder_scope", "tasks"], "decoder_scope"),
    ],
)
def test_bad_method_input_is_one_error_naming_the_field_and_writes_nothing(
    tmp_path, data_root, capsys, args, message
):
    run_dir = tmp_path / "run"
    err_lines = fit_refused(tiny_config(tmp_path, data_root), run_dir, capsys, *args)
    assert message in "\n".join(err_lines)
    assert not run_dir.exists()


def test_results_json_names_the_evaluated_model(tmp_path, data_root):
    results = fit(
        tiny_config(tmp_path, data_root, rounds=1, algorithm={"class_path": "FedAvg"}), tmp_path / "r"
    )
    assert results["evaluated"] == "post-aggregation" and "also_evaluated" not in results
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved["evaluated"] == "post-aggregation"


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["sampled", "dropped", "unavailable"])
def test_local_aggregate_is_every_client_as_trained(case):
    """Local's server step, (a) sampled, (b) a dropped update, (c) unavailable clients: every
    encoder and decoder is prev + Δ (Δ = 0 for a client that did not train)."""
    from fedmtl.methods import Local
    from tests.helpers import MATH_CASES, assert_relative, math_round

    inputs = math_round(MATH_CASES[case])
    out = Local(participation=0.6 if case == "sampled" else 1.0).aggregate(inputs)
    out.check_against(inputs)
    assert_relative(out.encoders, inputs.encoders_prev + inputs.encoder_deltas)
    assert_relative(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
