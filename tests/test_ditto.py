"""Ditto (docs/methods.md, Ditto): the personal pull by hand, the global track as a FedAvg-HC run bit
for bit, λ = 0 as Local, what is evaluated and logged, the two optimisers, and bad input."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.base import Penalty, new_track
from fedmtl.methods.ditto import Ditto
from tests.helpers import client_states, fit_each, read_results

ROUNDS = 3


# ---------------------------------------------------------------------------- hand case


def test_hand_case_term_gradient_and_one_sgd_step():
    """Hand case: v=(1,−1), w̄=(0,0), λ=0.1 → λ/2·‖v‖² = 0.1, gradient λ(v − w̄) = (0.1, −0.1);
    one SGD step at lr 0.5 with no task loss: v′ = v − 0.5·0.1·v = (0.95, −0.95)."""
    v = nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float64))
    anchor = torch.zeros(2, dtype=torch.float64)
    penalty = Penalty(0.1, [(v, anchor)])
    optimizer = torch.optim.SGD([v], lr=0.5)
    term = penalty()
    term.backward()
    assert term.item() == pytest.approx(0.1, abs=1e-12)
    torch.testing.assert_close(v.grad, torch.tensor([0.1, -0.1], dtype=torch.float64), rtol=0, atol=1e-12)
    optimizer.step()
    torch.testing.assert_close(
        v.detach(), torch.tensor([0.95, -0.95], dtype=torch.float64), rtol=0, atol=1e-12
    )


# ---------------------------------------------------------------------------- local_update, by hand


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(2, 2)
        self.heads = nn.ModuleDict({"semseg": nn.Linear(2, 3)})


class _RecordingContext(SimpleNamespace):
    """A stand-in for ClientContext whose ``train`` records its calls and, like LocalTrainer,
    replaces the track's model with a new state dict (here: every tensor + 1)."""

    def __init__(self, state: dict) -> None:
        super().__init__(state=state, calls=[])

    @property
    def personal(self) -> dict:
        return self.state["personal"]

    def train(self, track, **kwargs):
        self.calls.append((track, kwargs))
        track["model"] = {k: v + 1 for k, v in track["model"].items()}
        return torch.zeros(3)


def test_local_update_trains_the_global_track_plainly_and_pulls_the_personal_one_to_w_bar():
    """The global track trains on the task loss alone (no penalty); the personal track gets
    E_p epochs and a pull to w̄, the *round-start* global model (not what the global track
    trained to), with a real gradient λ(v − w̄)."""
    torch.manual_seed(0)
    global_model, personal_model = _Toy(), _Toy()
    w_bar = {k: v.clone() for k, v in global_model.state_dict().items()}
    state = {**new_track(global_model), "personal": {"track": new_track(personal_model)}}
    ctx = _RecordingContext(state)
    Ditto(lam=0.1, personal_epochs=2).local_update(ctx)

    (global_track, global_kw), (personal_track, personal_kw) = ctx.calls
    assert global_track is state and global_kw.get("penalty") is None
    assert personal_track is state["personal"]["track"] and personal_kw["epochs"] == 2
    for k in w_bar:  # the global track did train (the stand-in added 1)
        assert torch.equal(state["model"][k], w_bar[k] + 1)

    personal_model.load_state_dict(personal_track["model"])
    penalty = personal_kw["penalty"](personal_model)
    assert penalty.coefficient == 0.1
    assert {id(p) for p, _ in penalty.pairs} == {id(p) for p in personal_model.parameters()}
    penalty().backward()
    for name, p in personal_model.named_parameters():
        expected = 0.1 * (p.detach() - w_bar[name])
        assert p.grad.abs().min() > 0, name
        torch.testing.assert_close(p.grad, expected, rtol=0, atol=1e-7, msg=name)


def test_lambda_zero_gives_the_personal_track_no_penalty():
    torch.manual_seed(0)
    state = {**new_track(_Toy()), "personal": {"track": new_track(_Toy())}}
    ctx = _RecordingContext(state)
    Ditto(lam=0).local_update(ctx)
    (_, personal_kw) = ctx.calls[1]
    assert personal_kw["epochs"] is None  # E_p = the client's local epochs
    assert personal_kw["penalty"](_Toy()) is None


def test_personal_model_starts_from_the_initial_model():
    """v_i starts from the same initial weights as the global model, as a copy."""
    model = _Toy()
    personal = Ditto().init_client(model, None, seed=0)
    for name, value in model.state_dict().items():
        assert torch.equal(personal["track"]["model"][name], value)
        assert personal["track"]["model"][name].data_ptr() != value.data_ptr()
    assert personal["track"]["optimizer"] is None and personal["track"]["epochs_done"] == 0


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    """The tiny scenario (3 rounds) under FedAvg, Local, Ditto λ=0.1 and Ditto λ=0."""
    tmp = module_dir
    algorithms = {
        "fedavg": {"class_path": "FedAvg"},
        "local": {"class_path": "Local"},
        "ditto": {"class_path": "Ditto", "init_args": {"lam": 0.1}},
        "ditto0": {"class_path": "Ditto", "init_args": {"lam": 0}},
    }
    return fit_each(tmp, data_root, algorithms, rounds=ROUNDS)


def _assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _differs(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize("ditto", ["ditto", "ditto0"])
def test_global_track_is_a_fedavg_run_bit_for_bit(runs, ditto):
    """Training the personal model in between (with or without its pull)
    changes nothing of the global track: after 3 rounds its models are FedAvg-HC's, bit for
    bit, and so are its metrics (reported as ``also_evaluated.global``)."""
    for fedavg, state in zip(client_states(runs["fedavg"]), client_states(runs[ditto]), strict=True):
        _assert_states_equal(state["model"], fedavg["model"])
    assert read_results(runs[ditto])["also_evaluated"]["global"] == read_results(runs["fedavg"])["clients"]


def test_lambda_zero_personal_track_is_a_local_run_bit_for_bit(runs):
    """With λ = 0 the personal track trains exactly like a Local client (same
    start, batches, optimiser and schedule): after 3 rounds the same bits, moments included."""
    for local, state in zip(client_states(runs["local"]), client_states(runs["ditto0"]), strict=True):
        track = state["personal"]["track"]
        _assert_states_equal(track["model"], local["model"])
        assert track["epochs_done"] == local["epochs_done"]
        for name, moments in local["optimizer"]["state"].items():
            _assert_states_equal(track["optimizer"]["state"][name], moments)


def test_results_report_the_personal_model_and_log_both(runs):
    """The paper's numbers are the personal model's: results.json's ``clients`` table is
    the personal track's (with λ = 0, the Local run's), the global one is ``also_evaluated``,
    and metrics.csv has ``val/`` (personal) and ``val_global/`` rows for every client."""
    results = read_results(runs["ditto"])
    assert results["evaluated"] == "personal" and results["algorithm"] == "Ditto"
    assert list(results["also_evaluated"]) == ["global"]
    assert results["clients"] != results["also_evaluated"]["global"]
    local, ditto0 = read_results(runs["local"]), read_results(runs["ditto0"])
    for name, client in ditto0["clients"].items():
        for task, metrics in client["metrics"].items():
            for metric, value in metrics.items():
                assert value == pytest.approx(local["clients"][name]["metrics"][task][metric], abs=1e-3)
    with open(runs["ditto"] / "metrics.csv") as f:
        keys = {(int(r["round"]), r["key"]) for r in csv.DictReader(f)}
    for name in results["clients"]:
        for round_ in (2, 3):  # evaluated every 2 rounds and at the end
            assert any(k.startswith(f"val/{name}/") for r, k in keys if r == round_), (round_, name)
            assert any(k.startswith(f"val_global/{name}/") for r, k in keys if r == round_), (round_, name)


def test_positive_lambda_personal_model_is_its_own(runs):
    """λ = 0.1: the personal model is neither the global track (it never receives the
    average) nor a Local model (the pull changes its training)."""
    local = client_states(runs["local"])
    for i, state in enumerate(client_states(runs["ditto"])):
        personal = state["personal"]["track"]["model"]
        assert _differs(personal, state["model"]), i
        assert _differs(personal, local[i]["model"]), i
        assert max((personal[k] - local[i]["model"][k]).abs().max().item() for k in personal) > 1e-5, i


def test_personal_track_has_its_own_optimizer_and_schedule(runs):
    """One persistent optimiser per trained model (Ditto: two). The personal AdamW
    state exists, is stored apart from the global track's, and holds different moments."""
    for state in client_states(runs["ditto"]):
        track = state["personal"]["track"]
        assert track["optimizer"] is not None and track["scheduler"] is not None
        assert track["optimizer"]["state"].keys() == state["optimizer"]["state"].keys()
        assert track["epochs_done"] == state["epochs_done"] > 0
        assert any(
            not torch.equal(track["optimizer"]["state"][name]["exp_avg"], moments["exp_avg"])
            for name, moments in state["optimizer"]["state"].items()
        )


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("lam", [-0.1, float("nan")])
def test_a_bad_lambda_names_the_field(lam):
    with pytest.raises(ValueError, match=r"algorithm\.lam"):
        Ditto(lam=lam)


@pytest.mark.parametrize("personal_epochs", [0, -1, True])
def test_bad_personal_epochs_name_the_field(personal_epochs):
    with pytest.raises(ValueError, match=r"algorithm\.personal_epochs"):
        create_method("Ditto", personal_epochs=personal_epochs)


def test_ditto_server_is_fedavg():
    assert isinstance(Ditto(), FedAvg)
    assert Ditto.aggregate is FedAvg.aggregate
