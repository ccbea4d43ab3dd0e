"""PCGrad on the server (fedmtl/aggregation/pcgrad.py, fedmtl/methods/pcgrad.py): the math on
hand cases, the method's step on a round, its range checks, and one set of runs through the
engine (1 device, 2 processes, killed and resumed) and the report."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from fedmtl.aggregation.pcgrad import pcgrad_coefficients, pcgrad_orders, pcgrad_update
from fedmtl.cli import main
from fedmtl.federated import checkpoint
from fedmtl.methods import create_method
from fedmtl.seeds import derive_seed
from tests.helpers import (
    fit,
    fit_in_processes,
    fit_killed_in_round,
    fit_refused,
    read_results,
    tiny_config,
)
from tests.test_stream import CLIENTS, _round, _streamed


def _both(deltas: list[list[float]], orders: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(w from the Gram matrix, U from the vectors) for the deltas and orders."""
    d = torch.tensor(deltas, dtype=torch.float64)
    return pcgrad_coefficients(d @ d.T, orders), pcgrad_update(d, orders)


# ---------------------------------------------------------------------------- hand cases


def test_two_orthogonal_deltas_are_normalised_and_averaged():
    # ĝ1 = (1, 0), ĝ2 = (0, 1); ⟨ĝ1, ĝ2⟩ = 0 is no conflict: U = ((1, 0) + (0, 1))/2 = (0.5, 0.5),
    # and w_k = 0.5/‖Δ_k‖: (0.5/3, 0.5/4) = (1/6, 1/8).
    w, u = _both([[3.0, 0.0], [0.0, 4.0]], [[1], [0]])
    torch.testing.assert_close(u, torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([1 / 6, 1 / 8], dtype=torch.float64))


def test_two_opposed_deltas_cancel():
    # ĝ1 = (1, 0), ĝ2 = (-1, 0): ⟨ĝ1, ĝ2⟩ = -1 < 0, so PC_1 = ĝ1 - (-1)/1·ĝ2 = (0, 0), and
    # PC_2 = ĝ2 - (-1)·ĝ1 = (0, 0): U = 0, whatever the sizes (2 and 1). As coefficients,
    # PC_1 = PC_2 = ĝ1 + ĝ2, so w = (1/‖Δ1‖, 1/‖Δ2‖) = (1/2, 1): 0.5·(2, 0) + 1·(-1, 0) = 0.
    w, u = _both([[2.0, 0.0], [-1.0, 0.0]], [[1], [0]])
    assert u.tolist() == [0.0, 0.0]
    assert w.tolist() == [0.5, 1.0]


# Δ1 = (2, 0), Δ2 = (-3, 4), Δ3 = (-3, -4): ĝ1 = (1, 0), ĝ2 = (-0.6, 0.8), ĝ3 = (-0.6, -0.8);
# ⟨ĝ1, ĝ2⟩ = ⟨ĝ1, ĝ3⟩ = -0.6, ⟨ĝ2, ĝ3⟩ = 0.36 - 0.64 = -0.28: every pair conflicts.
MIXED = [[2.0, 0.0], [-3.0, 4.0], [-3.0, -4.0]]


def test_three_mixed_deltas_depend_on_the_order():
    # Orders A: client 1 projects on 2 then 3, client 2 on 1 then 3, client 3 on 1 then 2.
    #   PC_1: (1, 0) + 0.6·ĝ2 = (0.64, 0.48); ⟨·, ĝ3⟩ = -0.384 - 0.384 = -0.768;
    #         + 0.768·ĝ3 = (0.64 - 0.4608, 0.48 - 0.6144) = (0.1792, -0.1344)
    #   PC_2: ĝ2 + 0.6·ĝ1 = (0, 0.8); ⟨·, ĝ3⟩ = -0.64; + 0.64·ĝ3 = (-0.384, 0.288)
    #   PC_3: the mirror image of PC_2: (-0.384, -0.288)
    #   U = (0.1792 - 0.768, -0.1344)/3 = (-0.5888/3, -0.0448)
    w, u = _both(MIXED, [[1, 2], [0, 2], [0, 1]])
    torch.testing.assert_close(u, torch.tensor([-0.5888 / 3, -0.0448], dtype=torch.float64))
    # Orders B, each reversed:
    #   PC_1: (1, 0) + 0.6·ĝ3 = (0.64, -0.48); ⟨·, ĝ2⟩ = -0.768; + 0.768·ĝ2 = (0.1792, 0.1344)
    #   PC_2: ĝ2 + 0.28·ĝ3 = (-0.768, 0.576); ⟨·, ĝ1⟩ = -0.768; + 0.768·ĝ1 = (0, 0.576)
    #   PC_3: the mirror image: (0, -0.576)
    #   U = (0.1792, 0.1344)/3 = (0.1792/3, 0.0448)
    w_b, u_b = _both(MIXED, [[2, 1], [2, 0], [1, 0]])
    torch.testing.assert_close(u_b, torch.tensor([0.1792 / 3, 0.0448], dtype=torch.float64))
    d = torch.tensor(MIXED, dtype=torch.float64)
    torch.testing.assert_close(w @ d, u)  # the Gram matrix alone gives the same update
    torch.testing.assert_close(w_b @ d, u_b)


def test_a_zero_delta_adds_nothing_but_counts_in_the_mean():
    # ĝ = (1, 0), 0, (0, 1): U = ((1, 0) + 0 + (0, 1))/3 = (1/3, 1/3) (the public code's 0/(0 + 1e-8)
    # = 0 gives the same); w = (1/3/3, 0, 1/3/2).
    w, u = _both([[3.0, 0.0], [0.0, 0.0], [0.0, 2.0]], [[1, 2], [2, 0], [0, 1]])
    torch.testing.assert_close(u, torch.tensor([1 / 3, 1 / 3], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([1 / 9, 0.0, 1 / 6], dtype=torch.float64))
    # A lone client's update is its delta normalised: ‖U‖ = 1, not ‖Δ‖.
    w, u = _both([[0.0, -5.0]], [[]])
    assert u.tolist() == [0.0, -1.0] and w.tolist() == [0.2]


def test_the_coefficients_equal_the_direct_computation_on_random_deltas():
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(6, 40, generator=g, dtype=torch.float64)
    deltas[:, :20] -= 2 * deltas[0, :20]  # conflicts with client 0
    deltas[3] = 0
    orders = pcgrad_orders([7, 1, 4, 1, 5, 9])
    w = pcgrad_coefficients(deltas @ deltas.T, orders)
    torch.testing.assert_close(w @ deltas, pcgrad_update(deltas, orders), rtol=1e-12, atol=1e-12)


def test_orders_are_permutations_of_the_others_drawn_from_their_seeds():
    orders = pcgrad_orders([11, 12, 13, 14])
    assert [sorted(o) for o in orders] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert pcgrad_orders([11, 12, 13, 14]) == orders
    drawn = set()
    for seed in (0, 1):
        method = create_method("PCGrad")
        method.setup(3, CLIENTS, seed=seed)
        for pool in ("encoder", "decoders/semseg"):
            for round_ in (1, 2):
                drawn.add(repr(method.orders(pool, round_, range(7))))
        assert method.orders("encoder", 1, [0, 1, 2]) == pcgrad_orders(
            [derive_seed(seed, "pcgrad", "encoder", 1, i) for i in (0, 1, 2)]
        )
    assert len(drawn) == 8


@pytest.mark.parametrize(
    ("gram", "orders", "message"),
    [
        (torch.zeros(2, 3), [[1], [0]], r"square Gram matrix \[M, M\]"),
        (torch.eye(2), [[1]], r"one order per member \(2\)"),
        (torch.eye(3), [[1, 2], [0, 0], [0, 1]], r"member 1's order must list every other member 0..2 once"),
        (torch.tensor([[1.0, math.nan], [math.nan, 1.0]]), [[1], [0]], "must be finite"),
    ],
)
def test_bad_inputs_are_refused(gram, orders, message):
    with pytest.raises(ValueError, match=message):
        pcgrad_coefficients(gram, orders)


# ---------------------------------------------------------------------------- the method


@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_every_client_gets_its_previous_parameters_plus_the_one_update(participation):
    method = create_method("PCGrad", participation=participation)
    method.setup(2, CLIENTS, seed=3)
    participants = tuple(method.participants(2) or ()) or None
    inputs, _ = _round(2, participants)
    out = method.aggregate(inputs)
    trained = inputs.participating_clients
    deltas = inputs.encoder_deltas[trained]
    update = pcgrad_update(deltas, method.orders("encoder", 2, trained)).float()
    for i in range(len(CLIENTS)):  # a client that sat the round out receives U too
        torch.testing.assert_close(out.encoders[i], inputs.encoders_prev[i] + update)
    for task in ("semseg", "normals", "depth"):
        rows = [k for k, (_, t) in enumerate(inputs.decoder_owners) if t == task]
        sources = [k for k in rows if inputs.decoder_owners[k][0] in trained]
        if not sources:  # nobody trained this task's decoder: kept as it is
            assert torch.equal(out.decoders[rows], inputs.decoders_prev[rows] + inputs.decoder_deltas[rows])
            continue
        owners = [inputs.decoder_owners[k][0] for k in sources]
        update = pcgrad_update(inputs.decoder_deltas[sources], method.orders(f"decoders/{task}", 2, owners))
        for k in rows:
            torch.testing.assert_close(out.decoders[k], inputs.decoders_prev[k] + update.float())
    if participants is not None:
        assert len(trained) < len(CLIENTS)


def test_decoders_stay_as_trained_with_decoder_scope_none():
    method = create_method("PCGrad", decoder_scope="none")
    method.setup(1, CLIENTS, seed=0)
    inputs, _ = _round(1)
    out = method.server_step(copy.copy(inputs), {"delta": _delta_rows(inputs)})
    assert torch.equal(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
    assert bool(out.decoders_kept.all())
    assert method.shared_parts == frozenset({"encoder"})
    assert create_method("PCGrad").shared_parts == frozenset({"encoder", "decoders"})


def _delta_rows(inputs):
    from fedmtl.aggregation.stream import StackedRows

    return StackedRows("delta", inputs.encoder_deltas)


@pytest.mark.parametrize("options", [{}, {"participation": 0.5}, {"decoder_scope": "none"}], ids=repr)
def test_the_streamed_step_equals_the_stacked_one(options):
    stacked = create_method("PCGrad", **options)
    stacked.setup(4, CLIENTS, seed=0)
    streamed = copy.deepcopy(stacked)
    for round_ in range(1, 5):
        participants = tuple(stacked.participants(round_) or ()) or None
        inputs, trained = _round(round_, participants)
        expected = stacked.aggregate(inputs)
        encoders, output = _streamed(streamed, inputs, trained)
        error = (encoders - expected.encoders).norm(dim=1) / expected.encoders.norm(dim=1)
        assert float(error.max()) <= 1e-6, (round_, error.tolist())
        assert torch.equal(output.decoders, expected.decoders)


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            {"decoder_scope": "all"},
            "algorithm.decoder_scope must be one of ['same_task', 'none'], got 'all'",
        ),
        (
            {"participation": 0.0},
            "algorithm.participation must be in (0, 1] (a fraction of the clients), got 0.0",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(options, line):
    with pytest.raises(ValueError) as refused:
        create_method("PCGrad", **options)
    assert str(refused.value) == line


def test_the_command_line_refuses_a_bad_decoder_scope_before_writing(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "PCGrad"})
    lines = fit_refused(config, tmp_path / "run", capsys, "--algorithm.decoder_scope", "cluster")
    # The option is typed (a Literal), so the parser refuses it first, in its words, on one line.
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "decoder_scope" in lines[0] and "'same_task', 'none'" in lines[0] and "cluster" in lines[0]


# ---------------------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def runs(module_dir: Path, data_root: Path) -> dict[str, Path]:
    """The tiny scenario under PCGrad for 2 rounds: on one device, on 2 CPU processes, and
    killed as round 2 starts then resumed."""
    config = tiny_config(module_dir, data_root, algorithm={"class_path": "PCGrad"}, rounds=2)
    out = {name: module_dir / name for name in ("one", "two", "resumed")}
    fit(config, out["one"])
    fit_in_processes(config, out["two"])
    with pytest.MonkeyPatch.context() as patch:
        fit_killed_in_round(config, out["resumed"], patch, 2)
    assert checkpoint.latest(out["resumed"]).name == "round_0001"
    fit(config, out["resumed"], "--resume", "true")
    return out


def test_one_device_two_processes_and_a_resume_give_the_same_results(runs):
    one = read_results(runs["one"])
    assert one["algorithm"] == "PCGrad"
    assert read_results(runs["two"]) == one
    assert read_results(runs["resumed"]) == one


def test_the_report_lists_a_pcgrad_row(runs, tmp_path, capsys):
    # The tiny run's semseg mIoU can be 0, where Δm against it is undefined: the baseline is a
    # Local results.json written by hand, its metrics all 1, for the same clients and seed.
    local = read_results(runs["one"])
    local.update(algorithm="Local", evaluated="local")
    for client in local["clients"].values():
        client["metrics"] = {task: dict.fromkeys(values, 1.0) for task, values in client["metrics"].items()}
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "results.json").write_text(json.dumps(local))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "local"), str(runs["one"])]) == 0
    rows = [
        line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
    ]
    assert rows == ["method", "---", "Local", "PCGrad"], rows  # the baseline first
