"""FedProx (docs/methods.md, FedProx): the proximal term by hand, its gradient, its scope, μ = 0 as FedAvg-HC
bit for bit, μ > 0 end to end, and bad hyper-parameters named by their field."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedmtl.losses import proximal_term
from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.base import Penalty
from fedmtl.methods.fedprox import FedProx
from tests.helpers import TINY, client_states, fit_each, fit_refused, read_results, tiny_config

ROUNDS = 2


class _Toy(nn.Module):
    """The three parameter groups of a client model, by module structure: an encoder, one
    decoder per task (a ModuleDict) and one head per task."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(3, 2)
        self.decoders = nn.ModuleDict({"semseg": nn.Linear(2, 2), "depth": nn.Linear(2, 2)})
        self.heads = nn.ModuleDict({"semseg": nn.Linear(2, 4), "depth": nn.Linear(2, 1)})


def _context(model: nn.Module) -> SimpleNamespace:
    """FedProx.penalty reads nothing of the context but the model it is given; a stand-in for
    ClientContext with the model on it, should that ever change."""
    return SimpleNamespace(model=model)


def _move_away(model: nn.Module) -> None:
    """Change every parameter after the penalty snapshotted it (what local steps do)."""
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.add_((-1) ** k * torch.linspace(0.5, 1.5, p.numel()).reshape(p.shape))


# ---------------------------------------------------------------------------- hand case


def test_hand_case_term_and_gradient_through_proximal_term():
    """Hand case: w=(1,2), θ̂=(0,1), μ=0.01 → 0.01/2·‖(1,1)‖² = 0.010000, gradient μ(w−θ̂)
    = (0.01, 0.01), taken by autograd."""
    w = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    anchor = torch.tensor([0.0, 1.0], dtype=torch.float64)
    term = proximal_term([w], [anchor], 0.01)
    term.backward()
    assert term.item() == pytest.approx(0.010000, abs=5e-7)
    torch.testing.assert_close(w.grad, torch.tensor([0.01, 0.01], dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_case_through_penalty_and_not_the_non_squared_norm():
    """The same case through ``Penalty`` (what the trainer adds to the loss). The public
    R-PFL's logged form 0.5·μ·‖w−θ̂‖₂ would give 0.007071: ours must not be that."""
    w = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    anchor = torch.tensor([0.0, 1.0], dtype=torch.float64)
    term = Penalty(0.01, [(w, anchor)])()
    term.backward()
    assert term.item() == pytest.approx(0.010000, abs=5e-7)
    torch.testing.assert_close(w.grad, torch.tensor([0.01, 0.01], dtype=torch.float64), rtol=0, atol=1e-12)
    non_squared = 0.5 * 0.01 * torch.linalg.vector_norm(w.detach() - anchor).item()
    assert non_squared == pytest.approx(0.007071, abs=5e-7)
    assert abs(term.item() - non_squared) > 1e-3


# ---------------------------------------------------------------------------- gradient (b), scope


def test_penalty_alone_gives_grad_mu_times_distance_to_snapshot():
    """With the task loss off, p.grad = μ(p − p̂) and is non-zero. The public
    FMTL-Benchmark builds the term from ``.data`` and would give no gradient at all."""
    mu = 0.3
    model = _Toy()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    penalty = FedProx(mu=mu).penalty(_context(model), model)
    assert penalty is not None and penalty.coefficient == mu
    assert penalty().item() == 0.0  # at the snapshot
    _move_away(model)
    penalty().backward()
    for name, p in model.named_parameters():
        expected = mu * (p.detach() - start[name])
        assert p.grad is not None, name
        assert p.grad.abs().min() > 0, name
        # Autograd computes (μ/2)·2(p − p̂): scalings by powers of two, so exactly μ(p − p̂).
        assert torch.equal(p.grad, expected), name


def test_snapshot_is_a_copy_not_a_view_of_the_live_parameters():
    """The anchor must stay at the round start while the parameters move (a view would make
    the term identically zero)."""
    model = _Toy()
    penalty = FedProx(mu=1.0).penalty(_context(model), model)
    _move_away(model)
    for p, anchor in penalty.pairs:
        assert not anchor.requires_grad
        assert anchor.data_ptr() != p.data_ptr()
        assert not torch.equal(p.detach(), anchor)


def test_scope_all_covers_every_trainable_parameter_including_heads():
    model = _Toy()
    penalty = FedProx(mu=0.01).penalty(_context(model), model)
    assert {id(p) for p, _ in penalty.pairs} == {id(p) for p in model.parameters()}


def test_shared_only_scope_leaves_heads_out():
    """``prox_scope="shared_only"``: encoder and decoders are pulled to θ̂, heads train freely
    (no pair, no gradient from the term)."""
    model = _Toy()
    penalty = FedProx(mu=0.5, prox_scope="shared_only").penalty(_context(model), model)
    shared = [*model.encoder.parameters(), *model.decoders.parameters()]
    assert {id(p) for p, _ in penalty.pairs} == {id(p) for p in shared}
    _move_away(model)
    penalty().backward()
    assert all(p.grad is not None and p.grad.abs().min() > 0 for p in shared)
    assert all(p.grad is None for p in model.heads.parameters())


def test_frozen_parameters_are_not_in_the_term():
    """A parameter frozen for the round (requires_grad=False) has no business in the loss."""
    model = _Toy()
    model.encoder.weight.requires_grad_(False)
    penalty = FedProx(mu=0.5).penalty(_context(model), model)
    assert id(model.encoder.weight) not in {id(p) for p, _ in penalty.pairs}
    assert id(model.encoder.bias) in {id(p) for p, _ in penalty.pairs}


def test_mu_zero_builds_no_penalty():
    model = _Toy()
    assert FedProx(mu=0).penalty(_context(model), model) is None


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    """The tiny scenario under FedAvg, FedProx μ=0 and FedProx μ=1 (same seed and config)."""
    tmp = module_dir
    algorithms = {
        "fedavg": {"class_path": "FedAvg"},
        "mu0": {"class_path": "FedProx", "init_args": {"mu": 0}},
        "mu1": {"class_path": "FedProx", "init_args": {"mu": 1.0}},
    }
    # PASCAL clients at batch 2 take 3 steps an epoch (at 4, one step: the penalty of a
    # round's first step is 0, since training loaders drop the incomplete batch).
    clients = [dict(TINY["clients"][0], batch_size=2), TINY["clients"][1]]
    return fit_each(tmp, data_root, algorithms, rounds=ROUNDS, clients=clients)


def _metric_keys(run_dir: Path) -> set[tuple[int, str]]:
    with open(run_dir / "metrics.csv") as f:
        return {(int(r["round"]), r["key"]) for r in csv.DictReader(f)}


def test_mu_zero_is_fedavg_bit_for_bit(runs):
    """μ = 0 skips the term, so FedProx is FedAvg-HC: the same metrics and
    the same bits in every client's final model."""
    fedavg, prox = read_results(runs["fedavg"]), read_results(runs["mu0"])
    assert prox["algorithm"] == "FedProx"
    assert prox["clients"] == fedavg["clients"]
    for a, b in zip(client_states(runs["fedavg"]), client_states(runs["mu0"]), strict=True):
        assert a["model"].keys() == b["model"].keys()
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
    assert not any(key.endswith("/penalty") for _, key in _metric_keys(runs["mu0"]))


def test_positive_mu_changes_training_and_logs_the_penalty(runs):
    """μ = 1 pulls every step towards θ̂: the models differ from FedAvg's, and each client
    logs its mean penalty (non-zero, finite) in every round."""
    fedavg, prox = client_states(runs["fedavg"]), client_states(runs["mu1"])
    for a, b in zip(fedavg, prox, strict=True):
        assert any(not torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    with open(runs["mu1"] / "metrics.csv") as f:
        penalties = {(int(r["round"]), r["key"]): float(r["value"]) for r in csv.DictReader(f)}
    names = list(read_results(runs["mu1"])["clients"])
    for round_ in range(1, ROUNDS + 1):
        for name in names:
            value = penalties[(round_, f"train/{name}/penalty")]
            assert math.isfinite(value) and value > 0, (round_, name)
    assert not any(key.endswith("/penalty") for _, key in _metric_keys(runs["fedavg"]))


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("mu", [-0.01, -1, float("nan")])
def test_a_bad_mu_names_the_field(mu):
    with pytest.raises(ValueError, match=r"algorithm\.mu"):
        FedProx(mu=mu)


def test_an_unknown_prox_scope_names_the_field():
    with pytest.raises(ValueError, match=r"algorithm\.prox_scope"):
        FedProx(prox_scope="heads")
    with pytest.raises(ValueError, match=r"algorithm\.prox_scope"):
        create_method("FedProx", prox_scope="encoder")


def test_fedprox_is_a_fedavg_server():
    """The server step is FedAvg-HC's: FedProx only adds the client term."""
    assert isinstance(FedProx(), FedAvg)
    assert FedProx.aggregate is FedAvg.aggregate


def test_cli_rejects_a_negative_mu_before_writing_anything(tmp_path, data_root, capsys):
    """Through ``fedmtl fit``: a non-zero exit, one ``error:`` line naming algorithm.mu, and
    no run directory left behind (the method is built before anything is written)."""
    config = tiny_config(tmp_path, data_root, rounds=1)
    err_lines = fit_refused(
        config, tmp_path / "run", capsys, "--algorithm", "FedProx", "--algorithm.mu", "-1"
    )
    assert len(err_lines) == 1 and "algorithm.mu" in err_lines[0], err_lines
