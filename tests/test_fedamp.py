"""FedAMP (docs/methods.md, FedAMP): the message-passing weights and cloud models by hand (exponential
kernel and HeurFedAMP), the proximal pull to the cloud model, where the cloud goes on the
client, FedAMP against Local and FedAvg end to end, and bad hyper-parameters named by their field."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput
from fedmtl.aggregation.functional import fedamp_weights, gram_matrix, heuristic_fedamp_weights
from fedmtl.methods import ClientContext, create_method
from fedmtl.methods.base import Penalty
from fedmtl.methods.fedamp import FedAMP
from tests.helpers import TINY_BACKBONE, TINY_STEM, client_states, fit_each, read_results, round_from_trained

ROUNDS = 2
ATOL = 5e-7  # the hand values below are given to 6 decimals


def _splits(w: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prev, deltas) pairs with prev + deltas = w: FedAMP.clouds gets the trained weights only
    as a round's start plus its update and must build their Gram matrix without forming w."""
    offset = torch.linspace(-1.5, 2.5, w.numel(), dtype=w.dtype).reshape(w.shape)
    return [
        (w.clone(), torch.zeros_like(w)),
        (torch.zeros_like(w), w.clone()),
        (w / 2, w / 2),
        (w - offset, offset),
    ]


def _w(rows: list[list[float]], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


# ---------------------------------------------------------------------------- hand cases (a)-(d)


def test_hand_case_two_models_one_apart():
    """w1=(0,0), w2=(1,0): d=1, ξ_12 = e^{−1}; ξ = [[0.632121, 0.367879],
    [0.367879, 0.632121]], u1=(0.367879, 0), u2=(0.632121, 0)."""
    w = _w([[0, 0], [1, 0]])
    expected_xi = torch.tensor([[0.632121, 0.367879], [0.367879, 0.632121]], dtype=torch.float64)
    expected_u = torch.tensor([[0.367879, 0.0], [0.632121, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(fedamp_weights(gram_matrix(w)), expected_xi, rtol=0, atol=ATOL)
    for prev, deltas in _splits(w):
        xi, u = FedAMP().clouds(prev, deltas)
        torch.testing.assert_close(xi, expected_xi, rtol=0, atol=ATOL)
        torch.testing.assert_close(u, expected_u, rtol=0, atol=ATOL)


def test_hand_case_three_models():
    """w=(0,0), (1,0), (0,2): d_12=1, d_13=4, so row 1 = (1−e^{−1}−e^{−4}, e^{−1}, e^{−4})
    = (0.613805, 0.367879, 0.018316) and u1 = (0.367879, 2·0.018316) = (0.367879, 0.036631)."""
    w = _w([[0, 0], [1, 0], [0, 2]])
    row = torch.tensor([0.613805, 0.367879, 0.018316], dtype=torch.float64)
    torch.testing.assert_close(fedamp_weights(gram_matrix(w))[0], row, rtol=0, atol=ATOL)
    for prev, deltas in _splits(w):
        xi, u = FedAMP().clouds(prev, deltas)
        torch.testing.assert_close(xi[0], row, rtol=0, atol=ATOL)
        torch.testing.assert_close(
            u[0], torch.tensor([0.367879, 0.036631], dtype=torch.float64), rtol=0, atol=ATOL
        )


def test_hand_case_nearly_equal_models_extrapolate_and_are_not_clipped():
    """w=(0,0), (0.1,0), (0,0.1): ξ_12 = ξ_13 = e^{−0.01} ≈ 0.990050, so
    ξ_11 = 1 − 2·0.990050 = −0.980100 — negative, reproduced as it is (clipping to [0, 1]
    would give ξ_11 = 0 or renormalised rows) — and u1 = (0.099005, 0.099005), outside the
    convex hull of the three models (there x + y ≤ 0.1), as pitfall (c) expects."""
    w = _w([[0, 0], [0.1, 0], [0, 0.1]])
    for prev, deltas in _splits(w):
        xi, u = FedAMP().clouds(prev, deltas)
        assert xi[0, 0].item() == pytest.approx(-0.980100, abs=ATOL)
        assert xi[0, 0].item() < 0
        assert xi[0, 1].item() == pytest.approx(0.990050, abs=ATOL)
        torch.testing.assert_close(
            u[0], torch.tensor([0.099005, 0.099005], dtype=torch.float64), rtol=0, atol=ATOL
        )
        torch.testing.assert_close(xi.sum(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_case_far_models_keep_their_own_weights_in_fp32():
    """d=36 gives ξ_12 = e^{−36} = 2.32e-16 (the collapse of the weights of distant models, in
    small): in float32, 1 − 2.32e-16 is 1 and 7·2.32e-16 vanishes next to 1, so u equals w
    bit for bit."""
    w = _w([[1, 2], [7, 2]], torch.float32)  # ‖w1 − w2‖² = 36
    assert fedamp_weights(gram_matrix(w))[0, 1].item() == pytest.approx(2.32e-16, abs=5e-19)
    for prev, deltas in [(w.clone(), torch.zeros_like(w)), (w / 2, w / 2)]:
        xi, u = FedAMP().clouds(prev, deltas)
        assert xi[0, 1].item() == pytest.approx(2.32e-16, abs=5e-19)
        assert xi[0, 1].item() > 0  # computed, not rounded to zero in float64
        assert u.dtype == torch.float32
        assert torch.equal(u, w)


def test_alpha_k_and_sigma_enter_the_kernel_as_alpha_over_sigma_times_exp_minus_d_over_sigma():
    """Case (a) with α_k=0.5, σ=2: ξ_12 = 0.5·e^{−1/2}/2 = 0.151633, ξ_11 = 0.848367."""
    w = _w([[0, 0], [1, 0]])
    xi, u = FedAMP(alpha_k=0.5, sigma=2.0).clouds(w, torch.zeros_like(w))
    expected = torch.tensor([[0.848367, 0.151633], [0.151633, 0.848367]], dtype=torch.float64)
    torch.testing.assert_close(xi, expected, rtol=0, atol=ATOL)
    torch.testing.assert_close(u[0], torch.tensor([0.151633, 0.0], dtype=torch.float64), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "rows",
    [
        [[0, 0], [1, 0]],
        [[0, 0], [1, 0], [0, 2]],
        [[0, 0], [0.1, 0], [0, 0.1]],
        [[1, 2], [7, 2], [3, -1], [0.5, 0.5]],
    ],
)
@pytest.mark.parametrize("kernel", ["exp", "heuristic"])
def test_weights_are_float64_and_rows_sum_to_one_whatever_the_input_dtype(rows, kernel):
    """ξ is computed in float64 from float32 models too, and its rows sum to 1 (ξ_ii is
    defined as the rest); the float32 cloud matches the float64 one."""
    method = FedAMP(kernel=kernel)
    w64 = _w(rows)
    xi64, u64 = method.clouds(w64, torch.zeros_like(w64))
    xi32, u32 = method.clouds(w64.float(), torch.zeros_like(w64.float()))
    for xi in (xi64, xi32):
        assert xi.dtype == torch.float64
        torch.testing.assert_close(
            xi.sum(dim=1), torch.ones(len(rows), dtype=torch.float64), rtol=0, atol=1e-12
        )
    torch.testing.assert_close(xi32, xi64, rtol=0, atol=1e-6)
    assert u32.dtype == torch.float32
    torch.testing.assert_close(u32, u64.float(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- HeurFedAMP (f)


def test_hand_case_heuristic_fedamp():
    """σ=1, ξ_ii=0.5, w=(1,0), (1,1), (0,1). cos(w1,w2)=1/√2, cos(w1,w3)=0, so
    row 1 = (0.5, 0.5·e^{0.7071}/(e^{0.7071}+1), 0.5/(e^{0.7071}+1)) = (0.5, 0.334881, 0.165119)
    and u1 = (0.5 + 0.334881, 0.334881 + 0.165119) = (0.834881, 0.5). Row 2: w2 is equally
    close to both, (0.25, 0.5, 0.25), u2 = (0.75, 0.75)."""
    w = _w([[1, 0], [1, 1], [0, 1]])
    torch.testing.assert_close(
        heuristic_fedamp_weights(gram_matrix(w), sigma=1.0, self_weight=0.5)[0],
        torch.tensor([0.5, 0.334881, 0.165119], dtype=torch.float64),
        rtol=0,
        atol=ATOL,
    )
    method = FedAMP(kernel="heuristic", sigma=1.0, self_weight=0.5)
    for prev, deltas in _splits(w):
        xi, u = method.clouds(prev, deltas)
        torch.testing.assert_close(
            xi[0], torch.tensor([0.5, 0.334881, 0.165119], dtype=torch.float64), rtol=0, atol=ATOL
        )
        torch.testing.assert_close(
            xi[1], torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64), rtol=0, atol=ATOL
        )
        torch.testing.assert_close(
            u[0], torch.tensor([0.834881, 0.5], dtype=torch.float64), rtol=0, atol=ATOL
        )
        torch.testing.assert_close(u[1], torch.tensor([0.75, 0.75], dtype=torch.float64), rtol=0, atol=ATOL)


# ---------------------------------------------------------------------------- aggregate()

# A:semseg, B:depth, C:semseg+normals: N=3 encoder slots, K=4 decoder slots across three tasks.
CLIENTS = [
    ClientInfo("A", "pascal_context", ("semseg",), 1000),
    ClientInfo("B", "nyud", ("depth",), 1000),
    ClientInfo("C", "nyud", ("semseg", "normals"), 795),
]
LAYOUT = FlatLayout(names=("w",), shapes=((2,),), dtypes=(torch.float32,), tensor_layers=("",))
ENCODERS = [[0, 0], [1, 0], [0, 2]]  # the three-model hand case
# Decoders A:semseg, B:depth, C:semseg, C:normals: the first three are the three-model case again; the
# last is far from all (d ≥ 52, ξ < 3e-23), so it keeps itself and adds nothing to the others.
DECODERS = [[0, 0], [1, 0], [0, 2], [6, 6]]


def _round(participants: tuple[int, ...] | None = None) -> RoundInput:
    encoders, decoders = _w(ENCODERS), _w(DECODERS)
    enc_offset, dec_offset = torch.full_like(encoders, 0.25), torch.full_like(decoders, -0.5)
    return round_from_trained(CLIENTS, LAYOUT, encoders, enc_offset, decoders, dec_offset, participants)


def test_aggregate_gives_every_encoder_and_every_decoder_its_own_cloud():
    """One cloud per encoder slot (the three-model case over the three encoders) and one per decoder slot,
    pooled across tasks: A's semseg decoder takes 0.367879 of B's *depth* decoder."""
    inputs = _round()
    out = FedAMP().aggregate(inputs)
    out.check_against(inputs)
    torch.testing.assert_close(
        out.encoders[0], torch.tensor([0.367879, 0.036631], dtype=torch.float64), rtol=0, atol=ATOL
    )
    torch.testing.assert_close(
        out.decoders[0], torch.tensor([0.367879, 0.036631], dtype=torch.float64), rtol=0, atol=ATOL
    )
    torch.testing.assert_close(
        out.decoders[3], torch.tensor([6.0, 6.0], dtype=torch.float64), rtol=0, atol=1e-12
    )
    # The encoders' rows are float32 (the one server step reads them so): 1e-6 relative.
    for pool, rows, tol in [(out.encoders, ENCODERS, 1e-6), (out.decoders, DECODERS, 1e-12)]:
        w = _w(rows)
        expected = fedamp_weights(gram_matrix(w)) @ w
        torch.testing.assert_close(pool, expected, rtol=tol, atol=tol)
        assert len({tuple(r) for r in pool.tolist()}) == len(rows)  # a cloud per slot, all different


def test_aggregate_does_not_modify_its_input():
    inputs = _round()
    before = [
        t.clone()
        for t in (inputs.encoders_prev, inputs.encoder_deltas, inputs.decoders_prev, inputs.decoder_deltas)
    ]
    FedAMP().aggregate(inputs)
    after = (inputs.encoders_prev, inputs.encoder_deltas, inputs.decoders_prev, inputs.decoder_deltas)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_xi_self_of_every_encoder_slot_is_logged_by_client_name():
    """log_values() reports ξ_ii of the encoder pool: the three-model case's rows 1-3 are
    1−e^{−1}−e^{−4} = 0.613805, 1−e^{−1}−e^{−5} = 0.625383, 1−e^{−4}−e^{−5} = 0.974946."""
    method = FedAMP()
    assert method.log_values() == {}
    method.aggregate(_round())
    values = method.log_values()
    assert set(values) == {"xi_self/A", "xi_self/B", "xi_self/C"}
    assert values["xi_self/A"] == pytest.approx(0.613805, abs=ATOL)
    assert values["xi_self/B"] == pytest.approx(0.625383, abs=ATOL)
    assert values["xi_self/C"] == pytest.approx(0.974946, abs=ATOL)


# ---------------------------------------------------------------------------- the client


class _Vec(nn.Module):
    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(values))


class _Toy(nn.Module):
    """A client model by module structure: an encoder, one decoder per task (same layout),
    one head per task."""

    def __init__(self, tasks: tuple[str, ...] = ("semseg", "depth")) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(3, 2)
        self.decoders = nn.ModuleDict({t: nn.Linear(2, 2) for t in tasks})
        self.heads = nn.ModuleDict({t: nn.Linear(2, 3) for t in tasks})


def _proximal_case_model() -> nn.Module:
    """The proximal pull's hand case: encoder (1, 2), semseg decoder (0.5, −1) and a head (9)."""
    model = nn.Module()
    model.encoder = _Vec([1.0, 2.0])
    model.decoders = nn.ModuleDict({"semseg": _Vec([0.5, -1.0])})
    model.heads = nn.ModuleDict({"semseg": _Vec([9.0])})
    return model


def _context(model: nn.Module, personal: dict | None = None) -> ClientContext:
    tasks = tuple(model.decoders)
    return ClientContext(
        index=0,
        client=ClientInfo("A", "nyud", tasks, 10),
        round=1,
        rounds=ROUNDS,
        local_epochs=1,
        optimizer=None,
        state={"model": model.state_dict(), "personal": {} if personal is None else personal},
        model=model,
        encoder_layout=FlatLayout.from_module(model.encoder),
        decoder_layout=FlatLayout.from_module(next(iter(model.decoders.values()))),
        seed=0,
    )


def _rows(ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A server output for the client, different from its model everywhere."""
    encoder = torch.linspace(-2, 2, ctx.encoder_layout.numel)
    decoders = {
        t: torch.linspace(3, 4, ctx.decoder_layout.numel) * (k + 1) for k, t in enumerate(ctx.model.decoders)
    }
    return encoder, decoders


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _move_away(model: nn.Module) -> None:
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.add_((-1) ** k * torch.linspace(0.5, 1.5, p.numel()).reshape(p.shape))


def test_receive_stores_the_cloud_as_personal_state_and_leaves_the_model_alone():
    """The client keeps training its own w_i: the cloud model u_i only becomes the anchor of
    the proximal term (the public codes' ``set_parameters`` writes only ``client_u`` as well).
    The stored rows are CPU copies, not views of the server's output."""
    model = _Toy()
    before = _values(model)
    ctx = _context(model)
    encoder, decoders = _rows(ctx)
    FedAMP().receive(ctx, encoder, decoders)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    cloud = ctx.personal["cloud"]
    assert torch.equal(cloud["encoder"], encoder)
    assert set(cloud["decoders"]) == {"semseg", "depth"}
    for task, row in decoders.items():
        assert torch.equal(cloud["decoders"][task], row)
        assert cloud["decoders"][task].data_ptr() != row.data_ptr()
    assert cloud["encoder"].data_ptr() != encoder.data_ptr()
    encoder.add_(1)  # the server's buffer may be reused
    assert not torch.equal(cloud["encoder"], encoder)


def test_init_from_cloud_loads_the_cloud_into_encoder_and_decoders_but_not_heads():
    model = _Toy()
    before = _values(model)
    ctx = _context(model)
    encoder, decoders = _rows(ctx)
    FedAMP(init_from_cloud=True).receive(ctx, encoder, decoders)
    assert torch.equal(ctx.encoder_layout.flatten(model.encoder), encoder)
    for task, row in decoders.items():
        assert torch.equal(ctx.decoder_layout.flatten(model.decoders[task]), row)
    for key, value in model.heads.state_dict().items():
        assert torch.equal(value, before[f"heads.{key}"]), key
    assert torch.equal(ctx.personal["cloud"]["encoder"], encoder)  # still the anchor


def test_round_one_penalty_anchors_to_the_models_own_start_without_heads():
    """No cloud yet (round 1): u_i = θ_i^(0), the model the client starts the round from.
    The term covers encoder and decoders only, with coefficient λ/α_k = 3/2, and its
    gradient is λ/α_k·(θ − θ^(0)), non-zero once the model moves."""
    model = _Toy()
    start = _values(model)
    penalty = FedAMP(lam=3.0, alpha_k=2.0).penalty(_context(model), model)
    assert penalty.coefficient == 1.5
    slots = [*model.encoder.parameters(), *model.decoders.parameters()]
    assert [id(p) for p, _ in penalty.pairs] == [id(p) for p in slots]
    assert penalty().item() == 0.0
    _move_away(model)
    penalty().backward()
    for name, p in model.named_parameters():
        if name.startswith("heads."):
            assert p.grad is None, name
            continue
        assert p.grad.abs().min() > 0, name
        torch.testing.assert_close(p.grad, 1.5 * (p.detach() - start[name]), rtol=0, atol=1e-6, msg=name)


def test_penalty_after_receive_pulls_encoder_and_decoders_to_the_cloud_without_heads():
    """From round 2 the anchors are the received cloud rows, laid out per parameter; the
    gradient is λ/α_k·(θ − u) and heads get none."""
    model = _Toy()
    ctx = _context(model)
    encoder, decoders = _rows(ctx)
    method = FedAMP(lam=1.0, alpha_k=4.0)
    method.receive(ctx, encoder, decoders)
    penalty = method.penalty(ctx, model)
    assert penalty.coefficient == 0.25
    anchors = {f"encoder.{k}": v for k, v in ctx.encoder_layout.unflatten(encoder).items()}
    for task, row in decoders.items():
        anchors |= {f"decoders.{task}.{k}": v for k, v in ctx.decoder_layout.unflatten(row).items()}
    flat_distance = (ctx.encoder_layout.flatten(model.encoder) - encoder).square().sum()
    for task, row in decoders.items():
        flat_distance += (ctx.decoder_layout.flatten(model.decoders[task]) - row).square().sum()
    term = penalty()
    assert term.item() == pytest.approx(0.125 * flat_distance.item(), rel=1e-6)
    term.backward()
    for name, p in model.named_parameters():
        if name.startswith("heads."):
            assert p.grad is None, name
        else:
            assert p.grad.abs().min() > 0, name
            torch.testing.assert_close(
                p.grad, 0.25 * (p.detach() - anchors[name]), rtol=0, atol=1e-6, msg=name
            )


def test_frozen_parameters_are_not_in_the_penalty():
    """A parameter frozen for the round (requires_grad=False) is in neither the round-1 term
    nor the term anchored at the cloud."""
    model = _Toy()
    model.encoder.weight.requires_grad_(False)
    ctx = _context(model)
    method = FedAMP()
    round_one = {id(p) for p, _ in method.penalty(ctx, model).pairs}
    method.receive(ctx, *_rows(ctx))
    with_cloud = {id(p) for p, _ in method.penalty(ctx, model).pairs}
    for ids in (round_one, with_cloud):
        assert id(model.encoder.weight) not in ids
        assert id(model.encoder.bias) in ids


def test_hand_case_proximal_term_and_its_gradient():
    """w=(1,2), u=0, λ=α_k=1: λ/(2α_k)·‖w‖² = 2.5, gradient (λ/α_k)·w = (1, 2) by
    autograd (the public codes' ``p.data`` form has none). Through ``Penalty`` and through
    ``FedAMP.penalty`` with the cloud encoder at 0 and the cloud decoder at the decoder itself
    (so the decoder adds 0 and gets a zero gradient)."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    term = Penalty(1.0, [(w, torch.zeros(2))])()
    term.backward()
    assert term.item() == 2.5
    assert torch.equal(w.grad, torch.tensor([1.0, 2.0]))

    model = _proximal_case_model()
    ctx = _context(model)
    method = FedAMP(lam=1.0, alpha_k=1.0)
    method.receive(ctx, torch.zeros(2), {"semseg": torch.tensor([0.5, -1.0])})
    term = method.penalty(ctx, model)()
    term.backward()
    assert term.item() == 2.5
    assert torch.equal(model.encoder.w.grad, torch.tensor([1.0, 2.0]))
    assert torch.equal(model.decoders["semseg"].w.grad, torch.zeros(2))
    assert model.heads["semseg"].w.grad is None


def test_penalty_coefficient_is_lambda_over_alpha_k():
    """λ=3, α_k=2 on the proximal pull's hand case: 1.5/2·5 = 3.75, gradient 1.5·(1, 2) = (1.5, 3)."""
    model = _proximal_case_model()
    ctx = _context(model)
    method = FedAMP(lam=3.0, alpha_k=2.0)
    method.receive(ctx, torch.zeros(2), {"semseg": torch.tensor([0.5, -1.0])})
    term = method.penalty(ctx, model)()
    term.backward()
    assert term.item() == 3.75
    assert torch.equal(model.encoder.w.grad, torch.tensor([1.5, 3.0]))


def test_the_personal_model_is_evaluated():
    state = {
        "model": {"x": torch.zeros(1)},
        "personal": {"cloud": {"encoder": torch.ones(1), "decoders": {}}},
    }
    assert FedAMP.evaluated == "personal"
    assert FedAMP().evaluated_models(state) == {"personal": state["model"]}


# ---------------------------------------------------------------------------- end to end (g)


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    """The tiny scenario under Local, FedAvg and FedAMP (defaults λ = α_k = σ = 1), same seed."""
    tmp = module_dir
    return fit_each(
        tmp, data_root, {name: {"class_path": name} for name in ["Local", "FedAvg", "FedAMP"]}, rounds=ROUNDS
    )


def _slot_rows(
    states: list[dict], prefix: str, layout: FlatLayout
) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """The stored models' flat encoders (prefix "encoder") or decoders (prefix "decoders", in
    decoder-owner order: by client, then the client's task order)."""
    rows, owners = [], []
    for i, state in enumerate(states):
        model = state["model"]
        if prefix == "encoder":
            units = {"": "encoder."}
        else:
            tasks = dict.fromkeys(k.split(".")[1] for k in model if k.startswith("decoders."))
            units = {t: f"decoders.{t}." for t in tasks}
        for task, start in units.items():
            rows.append(layout.flatten({k[len(start) :]: v for k, v in model.items() if k.startswith(start)}))
            owners.append((i, task))
    return torch.stack(rows), owners


def test_fedamp_trains_differently_from_local_and_from_fedavg(runs):
    """With the same seed, the pull towards u changes every client's model against
    Local (where the public codes' gradient-free term would leave it equal), and the clients
    keep different encoders (FedAvg's would be bitwise equal)."""
    fedamp = client_states(runs["FedAMP"])
    for other in ["Local", "FedAvg"]:
        for i, (a, b) in enumerate(zip(fedamp, client_states(runs[other]), strict=True)):
            assert a["model"].keys() == b["model"].keys()
            assert any(not torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), (other, i)
    key = TINY_STEM
    assert key in fedamp[0]["model"]
    assert not torch.equal(fedamp[0]["model"][key], fedamp[1]["model"][key])
    assert not torch.equal(fedamp[0]["model"][key], fedamp[2]["model"][key])


def test_the_personal_model_is_reported_and_xi_self_is_logged_every_round(runs):
    results = read_results(runs["FedAMP"])
    assert results["algorithm"] == "FedAMP"
    assert results["evaluated"] == "personal"
    names = list(results["clients"])
    with open(runs["FedAMP"] / "metrics.csv") as f:
        logged = {(int(r["round"]), r["key"]): float(r["value"]) for r in csv.DictReader(f)}
    for round_ in range(1, ROUNDS + 1):
        for name in names:
            xi_self = logged[(round_, f"aggregation/xi_self/{name}")]
            # ξ_ii = 1 − Σ_{j≠i} ξ_ij with 0 < ξ_ij ≤ α_k/σ = 1 and N = 3 encoders.
            assert math.isfinite(xi_self) and -1 <= xi_self <= 1, (round_, name)
    assert set(results["server"]) == {f"xi_self/{name}" for name in names}


def test_stored_clouds_are_the_message_passing_mix_of_the_clients_own_trained_models(runs):
    """After the last round each client's stored model is its own trained w_i (the cloud was
    not loaded), and its stored cloud is u_i = Σ_j ξ_ij w_j over those same models: for the
    encoders over the three clients, for the decoders over all four decoders, across tasks.
    The logged ξ_ii of the last round matches. (Tolerances: the server sums prev + Δ in fp32.)"""
    from fedmtl.models import MultiTaskModel

    states = client_states(runs["FedAMP"])
    model = MultiTaskModel("pascal_context", ("semseg",), img_size=(32, 32), backbone=TINY_BACKBONE)
    encoder_layout = FlatLayout.from_module(model.encoder)
    decoder_layout = FlatLayout.from_module(model.decoders["semseg"])

    encoders, _ = _slot_rows(states, "encoder", encoder_layout)
    xi = fedamp_weights(gram_matrix(encoders))
    clouds = torch.stack([s["personal"]["cloud"]["encoder"] for s in states])
    assert not torch.equal(clouds, encoders)
    torch.testing.assert_close(clouds, (xi.float() @ encoders), rtol=0, atol=1e-5)

    decoders, owners = _slot_rows(states, "decoders", decoder_layout)
    assert [task for _, task in owners] == ["semseg", "sal", "semseg", "depth"]
    decoder_clouds = torch.stack([states[i]["personal"]["cloud"]["decoders"][t] for i, t in owners])
    torch.testing.assert_close(
        decoder_clouds, fedamp_weights(gram_matrix(decoders)).float() @ decoders, rtol=0, atol=1e-5
    )

    server = read_results(runs["FedAMP"])["server"]
    for name, value in zip(read_results(runs["FedAMP"])["clients"], xi.diagonal().tolist(), strict=True):
        assert server[f"xi_self/{name}"] == pytest.approx(value, abs=1e-6)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("field", ["lam", "alpha_k", "sigma"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_non_positive_or_nan_scale_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"algorithm\.{field}"):
        FedAMP(**{field: value})
    with pytest.raises(ValueError, match=rf"algorithm\.{field}"):
        create_method("FedAMP", **{field: value})


def test_an_unknown_kernel_names_the_field():
    with pytest.raises(ValueError, match=r"algorithm\.kernel"):
        FedAMP(kernel="gaussian")


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_self_weight_outside_zero_one_names_the_field(value):
    with pytest.raises(ValueError, match=r"algorithm\.self_weight"):
        FedAMP(kernel="heuristic", self_weight=value)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_self_weight_at_the_ends_of_zero_one_is_accepted(value):
    """ξ_ii = 1 keeps every model to itself; ξ_ii = 0 takes only the others."""
    w = _w([[1, 0], [1, 1], [0, 1]])
    xi, _ = FedAMP(kernel="heuristic", self_weight=value).clouds(w, torch.zeros_like(w))
    assert torch.equal(xi.diagonal(), torch.full((3,), value, dtype=torch.float64))


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["sampled", "dropped", "unavailable"])
@pytest.mark.parametrize("kernel", ["exp", "heuristic"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(kernel, case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients: they take part with their
    round-start weights; every slot gets u_i = Σ_j ξ_ij w_j, ξ from the pool's Gram matrix."""
    from tests.helpers import MATH_CASES, assert_relative, math_round

    inputs = math_round(MATH_CASES[case])
    method = FedAMP(sigma=20.0, alpha_k=2.0, kernel=kernel, participation=0.6 if case == "sampled" else 1.0)
    out = method.aggregate(inputs)
    out.check_against(inputs)
    for got, prev, deltas in [
        (out.encoders, inputs.encoders_prev, inputs.encoder_deltas),
        (out.decoders, inputs.decoders_prev, inputs.decoder_deltas),
    ]:
        w = (prev + deltas).double()
        if kernel == "exp":
            xi = fedamp_weights(gram_matrix(w), alpha_k=2.0, sigma=20.0)
        else:
            xi = heuristic_fedamp_weights(gram_matrix(w), sigma=20.0, self_weight=0.5)
        assert not torch.allclose(xi, torch.eye(len(w), dtype=xi.dtype), atol=1e-3)  # the clients mix
        assert_relative(got, xi @ w)
