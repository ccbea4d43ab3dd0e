"""FedSTA (docs/methods.md, FedSTA): phase A is FedPer (encoders averaged, decoders and heads local);
in phase B, the last R_B rounds, the encoder is frozen (out of the optimiser) and nothing is
aggregated. The phase arithmetic, the server on hand rounds, the real engine and trainer end
to end (phase A against FedPer bit for bit, phase B's constant encoders), and bad R_B."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn

from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.fedsta import FedSTA
from fedmtl.models import MultiTaskModel
from tests.helpers import (
    HAND_DECODERS_TRAINED,
    TINY_BACKBONE,
    TINY_CLIENTS,
    client_states,
    fit,
    fit_refused,
    hand_clients,
    hand_round,
    recording_training,
    run_states,
    tiny_config,
)

ROUNDS = 3
PHASE_B = 2  # rounds 2 and 3 of 3


def _set_up(method: FedSTA, rounds: int) -> FedSTA:
    method.setup(rounds, hand_clients(), seed=0)
    return method


# ---------------------------------------------------------------------------- phases


@pytest.mark.parametrize("rounds, expected", [(100, 20), (10, 2), (8, 2), (7, 1), (3, 1), (2, 0), (1, 0)])
def test_default_phase_b_is_a_fifth_of_the_run_rounded(rounds, expected):
    """R_B = round(R/5): the paper's 20 of 100 (R/5 is never a tie .5 for integer R)."""
    assert FedSTA().phase_b_length(rounds) == expected
    assert FedSTA(phase_b_rounds=7).phase_b_length(rounds) == 7


@pytest.mark.parametrize(
    "phase_b_rounds, rounds, phase_b",
    [
        (None, 100, list(range(81, 101))),
        (2, 5, [4, 5]),
        (0, 5, []),
        (5, 5, [1, 2, 3, 4, 5]),
        (None, 3, [3]),
    ],
)
def test_in_phase_b_marks_the_last_rounds(phase_b_rounds, rounds, phase_b):
    method = _set_up(FedSTA(phase_b_rounds=phase_b_rounds), rounds)
    assert [r for r in range(1, rounds + 1) if method.in_phase_b(r)] == phase_b


def test_no_round_is_in_phase_b_before_setup():
    method = FedSTA(phase_b_rounds=2)
    assert not any(method.in_phase_b(r) for r in range(1, 10))


def test_frozen_is_the_encoder_in_phase_b_only():
    model = nn.Module()
    model.encoder = nn.Linear(2, 2)
    method = _set_up(FedSTA(phase_b_rounds=2), 5)
    for round_ in (1, 2, 3):
        assert method.frozen(model, round_) == []
    for round_ in (4, 5):
        (frozen,) = method.frozen(model, round_)
        assert frozen is model.encoder


# ---------------------------------------------------------------------------- the server


def test_phase_a_server_is_fedper():
    """Phase A: encoders 1, 2, 6 → 3 everywhere; every decoder comes back bitwise as trained
    (the two semseg decoders too), the same bits as FedPer's server."""
    inputs = hand_round(1)
    out = _set_up(FedSTA(phase_b_rounds=2), 5).aggregate(inputs)
    assert torch.equal(out.encoders, torch.full((3, 1), 3.0))
    assert torch.equal(out.decoders, torch.tensor(HAND_DECODERS_TRAINED))
    fedper = create_method("FedPer").aggregate(inputs)
    assert torch.equal(out.encoders, fedper.encoders) and torch.equal(out.decoders, fedper.decoders)


@pytest.mark.parametrize("same_task_decoders", [False, True])
def test_phase_b_server_leaves_everything_as_trained(same_task_decoders):
    """Phase B: nothing is aggregated, with or without ``same_task_decoders``: encoders stay
    1, 2, 6 (had they moved; in the engine their Δ is 0) and decoders stay as trained."""
    method = _set_up(FedSTA(phase_b_rounds=2, same_task_decoders=same_task_decoders), 5)
    for round_ in (4, 5):
        out = method.aggregate(hand_round(round_))
        assert torch.equal(out.encoders, torch.tensor([[1.0], [2.0], [6.0]]))
        assert torch.equal(out.decoders, torch.tensor(HAND_DECODERS_TRAINED))


def test_same_task_decoders_averages_decoders_of_one_task_in_phase_a():
    """A:semseg (1,1) and C:semseg (0,0) → (0.5, 0.5) both; B:depth and C:normals have no
    same-task peer and stay; encoders are still averaged over all clients."""
    out = _set_up(FedSTA(phase_b_rounds=2, same_task_decoders=True), 5).aggregate(hand_round(3))
    assert torch.equal(out.encoders, torch.full((3, 1), 3.0))
    assert torch.equal(out.decoders, torch.tensor([[0.5, 0.5], [3.0, 3.0], [0.5, 0.5], [4.0, 0.0]]))
    assert isinstance(FedSTA(), FedAvg)


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, dict]:
    """The tiny scenario (3 rounds, same seed) under FedPer, FedSTA with R_B = 0 and FedSTA
    with R_B = 2; every round's checkpoint kept and every local training recorded."""
    tmp = module_dir
    algorithms = {
        "fedper": {"class_path": "FedPer"},
        "sta0": {"class_path": "FedSTA", "init_args": {"phase_b_rounds": 0}},
        "sta2": {"class_path": "FedSTA", "init_args": {"phase_b_rounds": PHASE_B}},
    }
    out = {}
    for name, algorithm in algorithms.items():
        config = tiny_config(tmp, data_root, name=f"{name}.yaml", algorithm=algorithm, rounds=ROUNDS)
        calls: list[dict] = []
        with recording_training(calls, keep_rounds=ROUNDS):
            results = fit(config, tmp / name)
        out[name] = {"dir": tmp / name, "calls": calls, "results": results}
    return out


def _round_states(run_dir: Path, round_: int) -> list[dict]:
    """The clients as round ``round_``'s checkpoint leaves them (their receipts applied)."""
    return run_states(run_dir, run_dir / "checkpoints" / f"round_{round_:04d}")[:TINY_CLIENTS]


def _assert_same_track(a: dict, b: dict, where: object) -> None:
    """Model (parameters and buffers) and AdamW state bitwise equal."""
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), (where, key)
    assert a["epochs_done"] == b["epochs_done"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for name, moments in a["optimizer"]["state"].items():
        for slot, value in moments.items():
            assert torch.equal(value, b["optimizer"]["state"][name][slot]), (where, name, slot)


@functools.cache
def _encoder_parameter_keys() -> tuple[str, ...]:
    """The encoder's parameters by module structure (its BatchNorm buffers are not among them)."""
    model = MultiTaskModel("pascal_context", ("semseg",), img_size=(32, 32), backbone=TINY_BACKBONE)
    return tuple(f"encoder.{name}" for name, _ in model.encoder.named_parameters())


def test_phase_b_rounds_zero_is_fedper_bit_for_bit(runs):
    """With R_B = 0 every round is phase A, so after 3 rounds every client's
    model and optimiser state are FedPer's, bit for bit, and so are the metrics."""
    for i, (fedper, sta) in enumerate(
        zip(client_states(runs["fedper"]["dir"]), client_states(runs["sta0"]["dir"]), strict=True)
    ):
        _assert_same_track(fedper, sta, i)
    assert runs["sta0"]["results"]["clients"] == runs["fedper"]["results"]["clients"]
    assert runs["sta0"]["results"]["algorithm"] == "FedSTA"


def test_phase_a_of_a_two_phase_run_is_fedper_bit_for_bit(runs):
    """Within a run with R_B = 2, round 1 (phase A) ends exactly where FedPer's
    round 1 ends; from round 2 the runs part (FedPer keeps training and averaging encoders)."""
    fedper, sta = runs["fedper"]["dir"], runs["sta2"]["dir"]
    for i, (a, b) in enumerate(zip(_round_states(fedper, 1), _round_states(sta, 1), strict=True)):
        _assert_same_track(a, b, i)
    key = _encoder_parameter_keys()[0]
    for a, b in zip(_round_states(fedper, 2), _round_states(sta, 2), strict=True):
        assert not torch.equal(a["model"][key], b["model"][key])


def test_encoders_are_bitwise_constant_through_phase_b(runs):
    """The encoder parameters every client holds after round 1 (the last phase-A
    average, the same for all clients) are bitwise the ones after rounds 2 and 3, while
    decoders and heads keep training. (The encoder's BatchNorm running statistics are
    buffers, local to the client, and are not part of this.)"""
    run_dir = runs["sta2"]["dir"]
    encoder = _encoder_parameter_keys()
    after = {r: _round_states(run_dir, r) for r in range(1, ROUNDS + 1)}
    for key in encoder:
        for state in after[1][1:]:
            assert torch.equal(state["model"][key], after[1][0]["model"][key]), key
    for round_ in range(ROUNDS - PHASE_B + 1, ROUNDS + 1):
        for i, (before, state) in enumerate(zip(after[round_ - 1], after[round_], strict=True)):
            for key in encoder:
                assert torch.equal(state["model"][key], before["model"][key]), (round_, i, key)
            for part in ("decoders.", "heads."):
                assert any(
                    not torch.equal(state["model"][k], before["model"][k])
                    for k in state["model"]
                    if k.startswith(part) and "running_" not in k and "num_batches" not in k
                ), (round_, i, part)


def test_the_trainer_freezes_the_encoder_in_phase_b_and_keeps_its_adamw_state(runs):
    """Through the real LocalTrainer: in phase A the optimiser holds every parameter; in
    phase B it holds exactly the decoders and heads, and the encoder has requires_grad=False
    during the steps. The encoder's AdamW moments, stored by name, come out of phase B as
    they went in (round 1's), while the decoders' moved on."""
    encoder = set(_encoder_parameter_keys())
    calls = runs["sta2"]["calls"]
    assert sorted((c["round"], c["client"]) for c in calls) == [
        (r, i) for r in range(1, ROUNDS + 1) for i in range(TINY_CLIENTS)
    ]
    for call in calls:
        everything = set(call["names"].values())
        if call["round"] <= ROUNDS - PHASE_B:
            assert call["optimised"] == everything and call["no_grad"] == set(), call["client"]
        else:
            assert call["optimised"] == everything - encoder, (call["round"], call["client"])
            assert call["no_grad"] == encoder, (call["round"], call["client"])
    for call in runs["sta0"]["calls"]:
        assert call["optimised"] == set(call["names"].values()) and call["no_grad"] == set()

    first, last = _round_states(runs["sta2"]["dir"], 1), _round_states(runs["sta2"]["dir"], ROUNDS)
    for i, (a, b) in enumerate(zip(first, last, strict=True)):
        for name in encoder:
            for slot, value in a["optimizer"]["state"][name].items():
                assert torch.equal(value, b["optimizer"]["state"][name][slot]), (i, name, slot)
        decoder_moments = [
            (a["optimizer"]["state"][n]["exp_avg"], b["optimizer"]["state"][n]["exp_avg"])
            for n in a["optimizer"]["state"]
            if n.startswith("decoders.")
        ]
        assert decoder_moments and all(not torch.equal(x, y) for x, y in decoder_moments), i


def test_the_evaluated_model_is_the_end_of_phase_b(runs):
    results = runs["sta2"]["results"]
    assert results["evaluated"] == "post-aggregation" and "also_evaluated" not in results
    assert results["clients"] != runs["fedper"]["results"]["clients"]


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("phase_b_rounds", [-1, 1.5, True, "2"])
def test_a_bad_phase_b_rounds_names_the_field(phase_b_rounds):
    with pytest.raises(ValueError, match=r"algorithm\.phase_b_rounds"):
        FedSTA(phase_b_rounds=phase_b_rounds)
    with pytest.raises(ValueError, match=r"algorithm\.phase_b_rounds"):
        create_method("FedSTA", phase_b_rounds=phase_b_rounds)


def test_phase_b_longer_than_the_run_names_the_field_and_the_fix():
    """R_B may be the whole run (every round frozen) but not more; ``setup`` checks too."""
    FedSTA(phase_b_rounds=3).check_run(rounds=3, num_clients=3)
    FedSTA().check_run(rounds=1, num_clients=3)
    with pytest.raises(ValueError, match=r"algorithm\.phase_b_rounds.*at most 3"):
        FedSTA(phase_b_rounds=4).check_run(rounds=3, num_clients=3)
    with pytest.raises(ValueError, match=r"algorithm\.phase_b_rounds"):
        FedSTA(phase_b_rounds=4).setup(3, hand_clients(), seed=0)


@pytest.mark.parametrize("phase_b_rounds", ["-1", "4"])
def test_cli_rejects_a_bad_phase_b_rounds_before_writing_anything(
    tmp_path, data_root, capsys, phase_b_rounds
):
    """Through ``fedmtl fit`` (3 rounds): R_B = −1 (constructor) and R_B = 4 (check against
    the run) each give a non-zero exit, one ``error:`` line naming algorithm.phase_b_rounds,
    and no run directory."""
    config = tiny_config(tmp_path, data_root)
    argv = ["--algorithm", "FedSTA", "--algorithm.phase_b_rounds", phase_b_rounds]
    err_lines = fit_refused(config, tmp_path / "run", capsys, *argv)
    assert len(err_lines) == 1 and "algorithm.phase_b_rounds" in err_lines[0], err_lines


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["sampled", "dropped", "unavailable"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients. Phase A: the participants'
    mean encoder to every client, decoders as trained; phase B: everything as trained."""
    from fedmtl.aggregation.functional import group_means_to
    from tests.helpers import MATH_CASES, assert_relative, math_clients, math_round

    participants = list(MATH_CASES[case])
    method = FedSTA(phase_b_rounds=1, participation=0.6 if case == "sampled" else 1.0)
    method.setup(2, math_clients(), seed=0)
    phase_a, phase_b = math_round(participants, round_=1), math_round(participants, round_=2)
    out = method.aggregate(phase_a)
    out.check_against(phase_a)
    everyone = [(participants, list(range(phase_a.num_clients)))]
    assert_relative(out.encoders, group_means_to(phase_a.encoders_prev, phase_a.encoder_deltas, everyone))
    assert_relative(out.decoders, phase_a.decoders_prev + phase_a.decoder_deltas)
    out = method.aggregate(phase_b)
    assert_relative(out.encoders, phase_b.encoders_prev + phase_b.encoder_deltas)
    assert_relative(out.decoders, phase_b.decoders_prev + phase_b.decoder_deltas)
