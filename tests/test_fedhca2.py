"""FedHCA2, the aggregator: hand-computed rounds, the hyper weights' learning, options, state."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser
from torch import nn

from fedmtl.aggregation import (
    ClientInfo,
    FlatLayout,
    RoundInput,
    conflict_averse_update,
    cross_attention_update_flat,
    decoder_owners_of,
)
from fedmtl.aggregation.base import homogeneous_groups
from fedmtl.methods import (
    METHODS,
    FedAvg,
    FedHCA2,
    Local,
    Method,
    create_method,
)
from fedmtl.models import FCNDecoder
from tests.helpers import refused_keeping, tiny_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

DTYPES = [torch.float32, torch.float64]
LR, MOMENTUM, WD = 0.01, 0.9, 1e-4  # the defaults, suppl. C

# Client 0: single-task (semseg) on PASCAL; client 1: multi-task (semseg, depth) on NYUD.
CLIENTS = [
    ClientInfo("st", "pascal_context", ("semseg",), 10),
    ClientInfo("mt", "nyud", ("semseg", "depth"), 20),
]
ENCODER_LAYOUT = FlatLayout(names=("w",), shapes=((3,),), dtypes=(torch.float32,), tensor_layers=("",))
# A real module: Linear(2 -> 1) then BatchNorm1d(1): tensors 0.weight [1, 2], 0.bias, 1.weight,
# 1.bias (Q = 5), in two layers "0" and "1".
DECODER_LAYOUT = FlatLayout.from_module(nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1)))
SEGMENTS = [(0, 2, 0), (2, 3, 0), (3, 4, 1), (4, 5, 1)]  # (start, end, layer) of each tensor

ENCODERS_PREV = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
DECODERS_PREV = [[0.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 1.0, 0.0, -1.0]]
# Local deltas of rounds 1, 2 and 3.
ENCODER_DELTAS = [
    [[0.3, -0.1, 0.2], [0.1, 0.2, -0.2]],
    [[0.2, 0.0, 0.1], [-0.1, -0.2, 0.1]],
    [[0.1, 0.1, 0.0], [0.2, -0.1, 0.0]],
]
DECODER_DELTAS = [
    [[0.5, -0.5, 0.2, 0.1, 0.0], [0.4, 0.3, -0.2, 0.0, 0.3], [-0.6, 0.1, 0.5, 0.2, -0.1]],
    [[0.3, -0.2, 0.1, 0.0, 0.1], [-0.4, 0.1, -0.3, 0.2, 0.2], [-0.2, 0.2, 0.3, 0.1, -0.2]],
    [[0.1, 0.0, -0.1, 0.2, 0.0], [0.2, 0.2, 0.0, -0.1, 0.1], [0.0, -0.3, 0.1, 0.0, 0.2]],
]


def _inputs(
    round_,
    encoders_prev,
    encoder_deltas,
    decoders_prev,
    decoder_deltas,
    dtype=torch.float32,
    clients=CLIENTS,
    encoder_layout=ENCODER_LAYOUT,
    decoder_layout=DECODER_LAYOUT,
):
    def tensor(x):
        return torch.as_tensor(x, dtype=dtype).clone()

    return RoundInput(
        round=round_,
        clients=clients,
        encoder_layout=encoder_layout,
        encoders_prev=tensor(encoders_prev),
        encoder_deltas=tensor(encoder_deltas),
        decoder_layout=decoder_layout,
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=tensor(decoders_prev),
        decoder_deltas=tensor(decoder_deltas),
    )


# --- the formulas, in plain Python ----------------------------------------------------


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def _axpy(*terms):
    """Σ coefficient · vector over (coefficient, vector) pairs."""
    return [sum(a * v[j] for a, v in terms) for j in range(len(terms[0][1]))]


def _conflict_averse_two_clients(d0, d1, c):
    """Ũ for N = 2: w = (t, 1 − t) minimises F(t) = ⟨g_w, ḡ⟩ + c‖ḡ‖·‖g_w‖, convex in t, where
    F'(t) = ⟨u, ḡ⟩ + c‖ḡ‖·⟨g_w, u⟩/‖g_w‖ with u = Δ_0 − Δ_1 changes sign (bisection; an end
    point if it does not); then Ũ = (ḡ + c‖ḡ‖/‖g_w‖ · g_w)/(1 + c²)."""
    mean = _axpy((0.5, d0), (0.5, d1))
    c_prime = c * math.sqrt(_dot(mean, mean))
    u = _axpy((1, d0), (-1, d1))

    def point(t):
        return _axpy((t, d0), (1 - t, d1))

    def slope(t):
        p = point(t)
        return _dot(u, mean) + c_prime * _dot(p, u) / math.sqrt(_dot(p, p))

    if slope(0.0) >= 0:
        t = 0.0
    elif slope(1.0) <= 0:
        t = 1.0
    else:
        lo, hi = 0.0, 1.0
        for _ in range(100):
            lo, hi = ((lo + hi) / 2, hi) if slope((lo + hi) / 2) < 0 else (lo, (lo + hi) / 2)
        t = (lo + hi) / 2
    g_w = point(t)
    return _axpy((1 / (1 + c * c), mean), (c_prime / math.sqrt(_dot(g_w, g_w)) / (1 + c * c), g_w))


def _cross_attention(deltas):
    """A_k per tensor: softmax_j(⟨Δ_k, Δ_j⟩/sqrt(d)) mixes the Δ_j, for every tensor segment."""
    out = [[0.0] * len(deltas[0]) for _ in deltas]
    for start, end, _ in SEGMENTS:
        d = end - start
        for k, own in enumerate(deltas):
            scores = [math.exp(_dot(own[start:end], other[start:end]) / math.sqrt(d)) for other in deltas]
            total = sum(scores)
            for j in range(start, end):
                out[k][j] = sum(s * other[j] for s, other in zip(scores, deltas)) / total
    return out


def _layer_dots(a, b):
    """Σ over each layer's tensors of ⟨a_k, b_k⟩: [K][L]."""
    return [
        [
            sum(ra[j] * rb[j] for s, e, layer in SEGMENTS if layer == lid for j in range(s, e))
            for lid in (0, 1)
        ]
        for ra, rb in zip(a, b)
    ]


def _sgd(weight, grad, buffer):
    """torch.optim.SGD's step for one number: d = g + wd·w; buf = d (first) or m·buf + d."""
    d = grad + WD * weight
    buffer = d if buffer is None else MOMENTUM * buffer + d
    return weight - LR * buffer, buffer


def _inside(w):
    return 1.0 if 0 < w < 1 else 0.0


# --- a hand-computed run --------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_three_rounds_computed_by_hand(dtype):
    """Two clients (ST, MT), three decoders, two decoder layers; rounds 1-3 with the hyper
    weights learning from round 2 on (one SGD step per round, with momentum)."""
    c = 0.4
    alpha, beta = [0.1, 0.1], [[0.1, 0.1] for _ in range(3)]
    alpha_buf, beta_buf = [None, None], [[None, None] for _ in range(3)]
    enc_prev, dec_prev = ENCODERS_PREV, DECODERS_PREV
    last_update = last_attention = None
    agg = FedHCA2()
    for r, (enc_d, dec_d) in enumerate(zip(ENCODER_DELTAS, DECODER_DELTAS), start=1):
        if r > 1:  # the update at the start of round r: gradients −⟨Ũ^(r-1), Δ^(r)⟩·1[0<α<1]
            for i in range(2):
                grad = -_dot(last_update, enc_d[i]) * _inside(alpha[i])
                alpha[i], alpha_buf[i] = _sgd(alpha[i], grad, alpha_buf[i])
            dots = _layer_dots(last_attention, dec_d)
            for k in range(3):
                for lid in range(2):
                    grad = -dots[k][lid] * _inside(beta[k][lid])
                    beta[k][lid], beta_buf[k][lid] = _sgd(beta[k][lid], grad, beta_buf[k][lid])
        update = _conflict_averse_two_clients(enc_d[0], enc_d[1], c)
        attention = _cross_attention(dec_d)
        # The two clients differ in dataset and tasks: each is its own homogeneous group.
        enc_new = [_axpy((1, enc_prev[i]), (1, enc_d[i]), (alpha[i], update)) for i in range(2)]
        dec_new = [
            [
                dec_prev[k][j] + dec_d[k][j] + beta[k][layer] * attention[k][j]
                for s, e, layer in SEGMENTS
                for j in range(s, e)
            ]
            for k in range(3)
        ]

        out = agg.aggregate(_inputs(r, enc_prev, enc_d, dec_prev, dec_d, dtype))
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
        # The encoders' rows are float32 (the one server step reads them so), whatever the dtype.
        enc_tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(out.encoders, torch.tensor(enc_new, dtype=dtype), **enc_tol)
        torch.testing.assert_close(out.decoders, torch.tensor(dec_new, dtype=dtype), **tol)
        logged = agg.log_values()
        assert logged == pytest.approx(
            {
                "alpha/st": alpha[0],
                "alpha/mt": alpha[1],
                **{
                    f"beta/{CLIENTS[i].name}/{task}/{layer}": beta[k][lid]
                    for k, (i, task) in enumerate(decoder_owners_of(CLIENTS))
                    for lid, layer in enumerate(["0", "1"])
                },
            },
            rel=0,
            abs=1e-8
            if dtype == torch.float32
            else 1e-9,  # float32 updates: float32 dot products; α learns from the float32 encoder rows
        )
        enc_prev, dec_prev = enc_new, dec_new  # θ^(r) is where round r+1 starts
        last_update, last_attention = update, attention
    # The weights did move, each its own way.
    assert len(set(alpha)) == 2 and all(a != 0.1 for a in alpha)
    assert len({b for row in beta for b in row}) == 6


# --- the hyper weights' learning ------------------------------------------------------

N_CLIENTS = 3
DIRECTION_CLIENTS = [ClientInfo(f"c{i}", f"data{i}", ("semseg",), 5) for i in range(N_CLIENTS)]
DIRECTION_DECODER = FlatLayout.from_module(FCNDecoder([2, 3, 4, 5], 2))  # six layers


def _random_round(round_, prev_enc, prev_dec, seed, dtype=torch.float64, enc_deltas=None, dec_deltas=None):
    g = torch.Generator().manual_seed(seed)
    q = DIRECTION_DECODER.numel
    if enc_deltas is None:
        enc_deltas = 0.1 * torch.randn(N_CLIENTS, 8, generator=g, dtype=torch.float64)
    if dec_deltas is None:
        dec_deltas = 0.1 * torch.randn(N_CLIENTS, q, generator=g, dtype=torch.float64)
    return _inputs(
        round_,
        prev_enc,
        enc_deltas,
        prev_dec,
        dec_deltas,
        dtype,
        clients=DIRECTION_CLIENTS,
        encoder_layout=FlatLayout(names=("w",), shapes=((8,),), dtypes=(dtype,), tensor_layers=("",)),
        decoder_layout=DIRECTION_DECODER,
    )


def _alpha(agg):
    return agg.state_dict()["alpha"]


def _beta(agg):
    return agg.state_dict()["beta"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_grow_when_the_next_update_agrees_and_shrink_when_it_opposes(dtype):
    agg = FedHCA2()
    prev_enc, prev_dec = torch.zeros(N_CLIENTS, 8), torch.zeros(N_CLIENTS, DIRECTION_DECODER.numel)
    out = agg.aggregate(_random_round(1, prev_enc, prev_dec, seed=0, dtype=dtype))
    update, attention = agg.state_dict()["encoder_update"], agg.state_dict()["decoder_update"]
    # Next round: client 0 moves along Ũ, client 1 against it, client 2 orthogonally (zero).
    signs = torch.tensor([1.0, -1.0, 0.0], dtype=dtype)[:, None]
    enc_next = signs * update
    dec_next = signs * attention  # decoder k along / against its own A_k
    agg.aggregate(
        _random_round(2, out.encoders, out.decoders, 1, dtype, enc_deltas=enc_next, dec_deltas=dec_next)
    )
    alpha, beta = _alpha(agg), _beta(agg)
    assert alpha[0] > 0.1 > alpha[1]
    # Orthogonal: only weight decay acts, 0.1·(1 − lr·wd).
    assert alpha[2].item() == pytest.approx(0.1 * (1 - LR * WD), rel=1e-12)
    assert bool((beta[0] > 0.1).all()) and bool((beta[1] < 0.1).all())
    # Exactly one SGD step with gradient −⟨Ũ, Δ⟩: α = 0.1 − lr·(−‖Ũ‖² + wd·0.1) for client 0.
    norm_sq = update.double().pow(2).sum().item()
    assert alpha[0].item() == pytest.approx(0.1 - LR * (-norm_sq + WD * 0.1), rel=1e-6)
    assert alpha[1].item() == pytest.approx(0.1 - LR * (norm_sq + WD * 0.1), rel=1e-6)
    per_layer = DIRECTION_DECODER.layer_sum(attention.double().pow(2))
    torch.testing.assert_close(beta[0], 0.1 - LR * (-per_layer[0] + WD * 0.1), rtol=1e-6, atol=0)


def test_no_update_in_round_one_and_the_first_update_in_round_two():
    agg = FedHCA2(alpha_init=0.3, beta_init=0.2)
    prev_enc, prev_dec = torch.zeros(N_CLIENTS, 8), torch.zeros(N_CLIENTS, DIRECTION_DECODER.numel)
    out = agg.aggregate(_random_round(1, prev_enc, prev_dec, seed=0))
    assert torch.equal(_alpha(agg), torch.full((3,), 0.3, dtype=torch.float64))
    assert torch.equal(_beta(agg), torch.full((3, 6), 0.2, dtype=torch.float64))
    assert agg.state_dict()["optimizer"]["state"] == {}
    agg.aggregate(_random_round(2, out.encoders, out.decoders, seed=1))
    assert not torch.equal(_alpha(agg), torch.full((3,), 0.3, dtype=torch.float64))
    assert set(agg.state_dict()["optimizer"]["state"]) == {0, 1}  # momentum of α and β


def _round_two_along_against_orthogonal(agg, dtype=torch.float64):
    """Round 1, then round 2 where client (decoder) 0 moves along last round's Ũ (A), client 1
    against it and client 2 orthogonally (zero). Returns ‖Ũ‖², A's per-layer ‖A_k‖² [K, L]
    and round 2's output."""
    prev_enc, prev_dec = torch.zeros(N_CLIENTS, 8), torch.zeros(N_CLIENTS, DIRECTION_DECODER.numel)
    out = agg.aggregate(_random_round(1, prev_enc, prev_dec, seed=0, dtype=dtype))
    update, attention = agg.state_dict()["encoder_update"], agg.state_dict()["decoder_update"]
    signs = torch.tensor([1.0, -1.0, 0.0], dtype=dtype)[:, None]
    inputs = _random_round(
        2, out.encoders, out.decoders, 1, dtype, enc_deltas=signs * update, dec_deltas=signs * attention
    )
    out = agg.aggregate(inputs)
    norm_sq = update.double().pow(2).sum().item()
    per_layer = DIRECTION_DECODER.layer_sum(attention.double().pow(2))
    return norm_sq, per_layer, out


def test_a_weight_initialised_at_zero_learns_from_round_two():
    """At 0 the gradient passes (closed interval, as the public code's clamp under PyTorch
    2.1.2): α_0 = 0 − lr·(−‖Ũ‖² + wd·0) = lr·‖Ũ‖²; α_1 goes below 0 (applied as 0); the
    orthogonal α_2 has gradient 0 and no decay to act on: it stays 0."""
    agg = FedHCA2(alpha_init=0.0, beta_init=0.0)
    norm_sq, per_layer, _ = _round_two_along_against_orthogonal(agg)
    alpha, beta = _alpha(agg), _beta(agg)
    assert norm_sq > 0
    assert alpha[0].item() == pytest.approx(LR * norm_sq, rel=1e-6)
    assert alpha[1].item() == pytest.approx(-LR * norm_sq, rel=1e-6)
    assert alpha[2].item() == 0.0
    torch.testing.assert_close(beta[0], LR * per_layer[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(beta[1], -LR * per_layer[1], rtol=1e-6, atol=0)
    applied = agg.log_values()
    assert applied["alpha/c0"] == pytest.approx(LR * norm_sq, rel=1e-6)
    assert applied["alpha/c1"] == 0.0  # below 0: applied as 0


def test_a_weight_initialised_at_one_learns_from_round_two():
    """At 1 the gradient passes too: α_0 = 1 − lr·(−‖Ũ‖² + wd) goes above 1 (applied as 1),
    α_1 = 1 − lr·(‖Ũ‖² + wd) comes down; with the gradient passed strictly inside (0, 1) both
    would have been 1 − lr·wd (a round late)."""
    agg = FedHCA2(alpha_init=1.0, beta_init=1.0)
    norm_sq, per_layer, _ = _round_two_along_against_orthogonal(agg)
    alpha, beta = _alpha(agg), _beta(agg)
    assert alpha[0].item() == pytest.approx(1 - LR * (-norm_sq + WD), rel=1e-9)
    assert alpha[1].item() == pytest.approx(1 - LR * (norm_sq + WD), rel=1e-9)
    assert alpha[2].item() == pytest.approx(1 - LR * WD, rel=1e-12)
    assert alpha[0] > 1 > alpha[1]
    torch.testing.assert_close(beta[1], 1 - LR * (per_layer[1] + WD), rtol=1e-9, atol=0)
    assert agg.log_values()["alpha/c0"] == 1.0


def test_the_gradient_mask_is_the_closed_interval():
    """The mask, computed by hand (not through the installed torch's clamp): bounds pass."""
    agg = FedHCA2()
    weight = torch.tensor([-0.5, 0.0, 0.5, 1.0, 1.5], dtype=torch.float64, requires_grad=True)
    agg._optimizer = torch.optim.SGD([weight], lr=1.0)
    agg._step(weight, torch.full((5,), -1.0, dtype=torch.float64))
    torch.testing.assert_close(weight.detach(), torch.tensor([-0.5, 1.0, 1.5, 2.0, 1.5], dtype=torch.float64))


def test_a_weight_above_one_gets_no_gradient_and_only_decays():
    # A weight can end above 1 (a momentum step past it; alpha_init itself must be in [0, 1]).
    agg = FedHCA2(alpha_init=1.0, beta_init=1.0)
    prev_enc, prev_dec = torch.zeros(N_CLIENTS, 8), torch.zeros(N_CLIENTS, DIRECTION_DECODER.numel)
    out = agg.aggregate(_random_round(1, prev_enc, prev_dec, seed=0))  # no step in round 1
    state = agg.state_dict()
    state["alpha"] = torch.full((N_CLIENTS,), 1.5, dtype=torch.float64)
    agg.load_state_dict(state)
    update, attention = agg.state_dict()["encoder_update"], agg.state_dict()["decoder_update"]
    # Strongly against Ũ and A: on [0, 1] this pulls a weight down by lr·100·‖Ũ‖².
    inputs = _random_round(
        2, out.encoders, out.decoders, 2, enc_deltas=-100 * update.repeat(3, 1), dec_deltas=-100 * attention
    )
    out = agg.aggregate(inputs)
    # No gradient at 1.5: weight decay only. β at exactly 1 takes its gradient.
    torch.testing.assert_close(_alpha(agg), torch.full((3,), 1.5 * (1 - LR * WD), dtype=torch.float64))
    per_layer = DIRECTION_DECODER.layer_sum(attention.double().pow(2))
    torch.testing.assert_close(_beta(agg), 1 - LR * (100 * per_layer + WD), rtol=1e-6, atol=0)
    assert {k: v for k, v in agg.log_values().items() if k.startswith("alpha")} == {
        "alpha/c0": 1.0,
        "alpha/c1": 1.0,
        "alpha/c2": 1.0,
    }
    new_update = agg.state_dict()["encoder_update"]
    torch.testing.assert_close(out.encoders, inputs.encoders_prev + inputs.encoder_deltas + new_update)


# --- homogeneous groups and the options -----------------------------------------------

GROUP_CLIENTS = [
    ClientInfo("p0", "pascal_context", ("semseg",), 5),
    ClientInfo("n0", "nyud", ("semseg", "depth"), 5),
    ClientInfo("p1", "pascal_context", ("semseg",), 7),  # same group as p0
    ClientInfo("p2", "pascal_context", ("semseg", "normals"), 5),  # same dataset, other tasks
]


def _group_round(dtype=torch.float64, round_=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = len(decoder_owners_of(GROUP_CLIENTS))

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return _inputs(
        round_,
        rand(4, 8),
        0.1 * rand(4, 8),
        rand(k, DECODER_LAYOUT.numel),
        0.1 * rand(k, DECODER_LAYOUT.numel),
        dtype,
        clients=GROUP_CLIENTS,
        encoder_layout=FlatLayout(names=("w",), shapes=((8,),), dtypes=(dtype,), tensor_layers=("",)),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_homogeneous_groups_share_their_mean_delta_and_decoders_keep_their_own(dtype):
    inputs = _group_round(dtype)
    assert inputs.homogeneous_groups() == [[0, 2], [1], [3]]
    out = FedHCA2().aggregate(inputs)
    d = inputs.encoder_deltas
    update = conflict_averse_update(d, 0.4)  # from the raw deltas
    group_mean = (d[0] + d[2]) / 2
    expected = inputs.encoders_prev + torch.stack([group_mean, d[1], group_mean, d[3]]) + 0.1 * update
    torch.testing.assert_close(out.encoders, expected)
    attention = cross_attention_update_flat(inputs.decoder_deltas, DECODER_LAYOUT)
    torch.testing.assert_close(out.decoders, inputs.decoders_prev + inputs.decoder_deltas + 0.1 * attention)


# Where the two rules differ: a non-adjacent twin (0 and 2) and the same task set in another
# order (3 and 4); 4 and 5 are adjacent twins with one ordered task list.
RULE_CLIENTS = [
    ClientInfo("p-semseg-0", "pascal_context", ("semseg",), 5),
    ClientInfo("n-semseg", "nyud", ("semseg",), 5),
    ClientInfo("p-semseg-1", "pascal_context", ("semseg",), 5),
    ClientInfo("p-semseg+sal", "pascal_context", ("semseg", "sal"), 5),
    ClientInfo("p-sal+semseg-0", "pascal_context", ("sal", "semseg"), 5),
    ClientInfo("p-sal+semseg-1", "pascal_context", ("sal", "semseg"), 5),
]


def test_the_two_homogeneous_rules_by_hand():
    assert homogeneous_groups(RULE_CLIENTS) == [[0, 2], [1], [3, 4, 5]]
    assert homogeneous_groups(RULE_CLIENTS, "same_tasks") == [[0, 2], [1], [3, 4, 5]]
    assert homogeneous_groups(RULE_CLIENTS, "adjacent") == [[0], [1], [2], [3], [4, 5]]


def test_the_public_rule_keeps_a_non_adjacent_twin_on_its_own_delta():
    """GROUP_CLIENTS: p0 and p1 share dataset and tasks but stand apart (n0 between them):
    under ``adjacent`` every client keeps its own delta, + 0.1·Ũ."""
    inputs = _group_round()
    assert inputs.homogeneous_groups("adjacent") == [[0], [1], [2], [3]]
    out = FedHCA2(homogeneous_groups="adjacent").aggregate(inputs)
    d = inputs.encoder_deltas
    expected = inputs.encoders_prev + d + 0.1 * conflict_averse_update(d, 0.4)
    torch.testing.assert_close(out.encoders, expected)


def test_an_unknown_homogeneous_rule_is_refused():
    with pytest.raises(
        ValueError, match=r"^algorithm.homogeneous_groups must be one of \['same_tasks', 'adjacent'\]"
    ):
        FedHCA2(homogeneous_groups="ordered")


def test_an_unknown_homogeneous_rule_is_one_error_line(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root)
    command = ["fit", "--config", str(config), "--run_dir", str(tmp_path / "run"), "--algorithm", "FedHCA2"]
    lines = refused_keeping([*command, "--algorithm.homogeneous_groups", "ordered"], tmp_path, capsys)
    (line,) = [line for line in lines if line.startswith("error:")]
    assert line.startswith("error: algorithm.homogeneous_groups must be one of ['same_tasks', 'adjacent']")
    assert "adjacent only consecutive ones" in line
    assert not (tmp_path / "run").exists()


SCENARIO_CONFIGS = [
    CONFIGS / "scenario1.yaml",
    CONFIGS / "scenario2.yaml",
    *sorted((CONFIGS / "variants").glob("*.yaml")),
    CONFIGS / "benchmark" / "scenario1.yaml",
    CONFIGS / "benchmark" / "scenario2.yaml",
]


@pytest.mark.parametrize("path", SCENARIO_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_two_rules_agree_on_every_bundled_scenario(monkeypatch, path):
    """The paper's scenarios (1C, 2C, 4C and the ST/MT-only variants) and the benchmark's, as
    their configs build the clients (a group's replicas consecutive): equal groups."""
    from fedmtl.cli import _run_parser
    from fedmtl.config import RunConfig
    from fedmtl.federated import scenario

    # The clients without the data: a split size and every image trained on suffice here.
    monkeypatch.setattr(scenario, "train_split_size", lambda cfg, dataset: 4000)
    monkeypatch.setattr(
        scenario.TrainedImages, "__call__", lambda self, dataset, tasks, indices: list(indices)
    )
    parser = _run_parser()
    cfg = RunConfig.from_namespace(parser.instantiate(parser.parse_path(str(path))))
    clients = [ClientInfo(c.name, c.dataset, tuple(c.tasks), 1) for c in scenario.build_clients(cfg)]
    same = homogeneous_groups(clients, "same_tasks")
    assert homogeneous_groups(clients, "adjacent") == same
    if "_2c" in path.name or "_4c" in path.name:  # the replicas do share a group
        assert max(len(group) for group in same) == int(path.stem[-2])


def _expected(inputs, encoder, decoder):
    n, k = inputs.num_clients, inputs.num_decoders
    trained_enc = inputs.encoders_prev + inputs.encoder_deltas
    trained_dec = inputs.decoders_prev + inputs.decoder_deltas
    d = inputs.encoder_deltas
    group_mean = torch.stack([(d[0] + d[2]) / 2, d[1], (d[0] + d[2]) / 2, d[3]])
    encoders = {
        "none": trained_enc,
        "fedavg": trained_enc.mean(0).expand(n, -1),
        "conflict_averse": inputs.encoders_prev + group_mean + 0.1 * conflict_averse_update(d),
    }[encoder]
    decoders = {
        "none": trained_dec,
        "fedavg": trained_dec.mean(0).expand(k, -1),
        "cross_attention": trained_dec
        + 0.1 * cross_attention_update_flat(inputs.decoder_deltas, DECODER_LAYOUT),
    }[decoder]
    return encoders, decoders


@pytest.mark.parametrize("decoder", ["none", "fedavg", "cross_attention"])
@pytest.mark.parametrize("encoder", ["none", "fedavg", "conflict_averse"])
def test_every_encoder_and_decoder_option_and_their_combinations(encoder, decoder):
    agg = FedHCA2(encoder=encoder, decoder=decoder)
    inputs = _group_round()
    out = agg.aggregate(inputs)
    expected_encoders, expected_decoders = _expected(inputs, encoder, decoder)
    torch.testing.assert_close(out.encoders, expected_encoders)
    torch.testing.assert_close(out.decoders, expected_decoders)
    keys = agg.log_values()
    assert any(k.startswith("alpha/") for k in keys) == (encoder == "conflict_averse")
    assert any(k.startswith("beta/") for k in keys) == (decoder == "cross_attention")
    # A second round runs (and learns only what exists).
    second = _group_round(round_=2, seed=1)
    out2 = agg.aggregate(dataclasses.replace(second, encoders_prev=out.encoders, decoders_prev=out.decoders))
    out2.check_against(second)
    state = agg.state_dict()
    assert (state["alpha"] is not None) == (encoder == "conflict_averse")
    assert (state["beta"] is not None) == (decoder == "cross_attention")


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_encoders_give_the_same_result(dtype):
    """P spans several chunks of the Gram pass plus a tail: the result equals
    prev + Δ̃ + α·Ũ written out directly."""
    clients = GROUP_CLIENTS[:3]  # p0 and p1 form a group
    p = 3 * (1 << 16) + 7
    g = torch.Generator().manual_seed(0)
    k = len(decoder_owners_of(clients))
    inputs = _inputs(
        1,
        torch.randn(3, p, generator=g, dtype=torch.float64),
        1e-3 * torch.randn(3, p, generator=g, dtype=torch.float64),
        torch.randn(k, DECODER_LAYOUT.numel, generator=g, dtype=torch.float64),
        1e-3 * torch.randn(k, DECODER_LAYOUT.numel, generator=g, dtype=torch.float64),
        dtype,
        clients=clients,
        encoder_layout=FlatLayout(names=("w",), shapes=((p,),), dtypes=(dtype,), tensor_layers=("",)),
    )
    agg = FedHCA2(alpha_init=0.7)
    out = agg.aggregate(inputs)
    d = inputs.encoder_deltas
    update = conflict_averse_update(d)
    group = (d[0] + d[2]) / 2
    expected = inputs.encoders_prev + torch.stack([group, d[1], group]) + 0.7 * update
    for got, want in [(out.encoders, expected), (agg.state_dict()["encoder_update"], update)]:
        if dtype == torch.float32:
            torch.testing.assert_close(got, want)
        else:  # the rows are read as float32: within 1e-6 relative (in norm) of the float64 math
            assert float((got.to(dtype) - want).norm() / want.norm()) <= 1e-6


def test_fedavg_fedavg_is_fedavg_and_none_none_is_local():
    inputs = _group_round()
    for options, baseline in [(("fedavg", "fedavg"), FedAvg()), (("none", "none"), Local())]:
        out = FedHCA2(encoder=options[0], decoder=options[1]).aggregate(inputs)
        reference = baseline.aggregate(inputs)
        torch.testing.assert_close(out.encoders, reference.encoders)
        torch.testing.assert_close(out.decoders, reference.decoders)


@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_are_new_tensors_on_the_input_dtype_and_inputs_are_untouched(dtype):
    agg = FedHCA2()
    inputs = _group_round(dtype)
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in tensors.items()}
    out = agg.aggregate(inputs)
    out2 = agg.aggregate(
        dataclasses.replace(
            _group_round(dtype, 2, seed=1), encoders_prev=out.encoders, decoders_prev=out.decoders
        )
    )
    out2.check_against(inputs)
    for name, tensor in tensors.items():
        assert torch.equal(tensor, before[name]), f"{name} was modified"
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    for t in (out.encoders, out.decoders):
        assert t.untyped_storage().data_ptr() not in storages
    state = agg.state_dict()
    assert state["decoder_update"].dtype == dtype
    assert state["encoder_update"].dtype == torch.float32  # a vector of the float32 encoder rows
    assert state["alpha"].dtype == state["beta"].dtype == torch.float64


def test_real_fcn_decoders_get_one_beta_per_layer_and_named_log_values():
    clients = [ClientInfo("pascal_semseg", "pascal_context", ("semseg",), 10), CLIENTS[1]]
    layout = FlatLayout.from_module(FCNDecoder([4, 8, 12, 16], 4))
    k = 3
    inputs = RoundInput(
        round=1,
        clients=clients,
        encoder_layout=ENCODER_LAYOUT,
        encoders_prev=torch.zeros(2, 3),
        encoder_deltas=torch.randn(2, 3),
        decoder_layout=layout,
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=torch.zeros(k, layout.numel),
        decoder_deltas=torch.randn(k, layout.numel),
    )
    agg = FedHCA2()
    agg.aggregate(inputs)
    assert agg.state_dict()["beta"].shape == (3, 6)
    values = agg.log_values()
    assert len(values) == 2 + 3 * 6
    assert values["alpha/pascal_semseg"] == pytest.approx(0.1)
    assert values["beta/mt/depth/projections.3"] == pytest.approx(0.1)
    assert values["beta/pascal_semseg/semseg/norm"] == pytest.approx(0.1)
    assert all(isinstance(v, float) for v in values.values())


# --- state ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_round_trip_resumes_exactly(dtype, tmp_path):
    uninterrupted = FedHCA2()
    out = uninterrupted.aggregate(_group_round(dtype, 1, seed=0))
    out = uninterrupted.aggregate(
        dataclasses.replace(
            _group_round(dtype, 2, seed=1), encoders_prev=out.encoders, decoders_prev=out.decoders
        )
    )
    torch.save(uninterrupted.state_dict(), tmp_path / "server.pt")
    resumed = FedHCA2()
    resumed.load_state_dict(torch.load(tmp_path / "server.pt", weights_only=True))
    assert repr(resumed.state_dict()) == repr(uninterrupted.state_dict())
    assert resumed.log_values() == uninterrupted.log_values()

    third = dataclasses.replace(
        _group_round(dtype, 3, seed=2), encoders_prev=out.encoders, decoders_prev=out.decoders
    )
    a, b = uninterrupted.aggregate(third), resumed.aggregate(third)
    assert torch.equal(a.encoders, b.encoders) and torch.equal(a.decoders, b.decoders)
    sa, sb = uninterrupted.state_dict(), resumed.state_dict()
    assert torch.equal(sa["alpha"], sb["alpha"]) and torch.equal(sa["beta"], sb["beta"])
    for p in (0, 1):  # momentum buffers continue too
        assert torch.equal(
            sa["optimizer"]["state"][p]["momentum_buffer"], sb["optimizer"]["state"][p]["momentum_buffer"]
        )
    assert sa["round"] == sb["round"] == 3


def test_state_dict_is_a_copy_and_a_fresh_state_round_trips():
    agg = FedHCA2()
    assert agg.state_dict()["round"] == 0 and agg.log_values() == {}
    fresh = FedHCA2()
    fresh.load_state_dict(agg.state_dict())
    assert repr(fresh.state_dict()) == repr(agg.state_dict())
    out = agg.aggregate(_group_round(seed=0))
    state = agg.state_dict()
    agg.aggregate(
        dataclasses.replace(
            _group_round(round_=2, seed=1), encoders_prev=out.encoders, decoders_prev=out.decoders
        )
    )
    assert torch.equal(state["alpha"], torch.full((4,), 0.1, dtype=torch.float64))  # not moved with α


def test_state_from_other_options_or_garbage_is_rejected():
    agg = FedHCA2()
    agg.aggregate(_group_round())
    with pytest.raises(ValueError, match="encoder='conflict_averse'"):
        FedHCA2(encoder="fedavg").load_state_dict(agg.state_dict())
    with pytest.raises(ValueError, match="not a FedHCA2 state"):
        FedHCA2().load_state_dict({"alpha": torch.zeros(3)})


def test_rounds_must_be_consecutive_and_clients_stay_the_same():
    agg = FedHCA2()
    with pytest.raises(ValueError, match="start at round 1"):
        agg.aggregate(_group_round(round_=2))
    agg.aggregate(_group_round())
    with pytest.raises(ValueError, match="aggregated round 1 last; got round 3"):
        agg.aggregate(_group_round(round_=3))
    other = _random_round(2, torch.zeros(3, 8), torch.zeros(3, DIRECTION_DECODER.numel), seed=0)
    with pytest.raises(ValueError, match=r"belong to the clients \['p0', 'n0', 'p1', 'p2'\]"):
        agg.aggregate(other)


# --- construction and configs ---------------------------------------------------------


def test_registered_and_built_from_a_config_with_init_args():
    assert METHODS.get("FedHCA2") is FedHCA2
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--algorithm", type=Method)
    config = parser.parse_args(
        [
            "--algorithm",
            '{"class_path": "FedHCA2", "init_args": {"c": 0.2, "rescale": false, "hyper_lr": 0.05, '
            '"encoder": "fedavg", "decoder": "cross_attention", "beta_init": 0.3}}',
        ]
    )
    algorithm = parser.instantiate_classes(config).algorithm
    assert isinstance(algorithm, FedHCA2)
    assert (algorithm.c, algorithm.rescale, algorithm.hyper_lr, algorithm.beta_init) == (
        0.2,
        False,
        0.05,
        0.3,
    )
    assert (algorithm.encoder, algorithm.decoder) == ("fedavg", "cross_attention")
    assert algorithm.alpha_init == 0.1 and algorithm.hyper_momentum == 0.9  # defaults stay
    with pytest.raises(Exception, match="conflict_averse"):
        parser.parse_args(["--algorithm", '{"class_path": "FedHCA2", "init_args": {"encoder": "cagrad"}}'])
    assert isinstance(create_method("FedHCA2", c=0.6), FedHCA2)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="encoder must be one of"):
        FedHCA2(encoder="cagrad")
    with pytest.raises(ValueError, match="decoder must be one of"):
        FedHCA2(decoder="attention")
    with pytest.raises(ValueError, match=r"c must be in \[0, 1\)"):
        FedHCA2(c=1.0)
    with pytest.raises(ValueError, match="hyper_lr"):
        FedHCA2(hyper_lr=-0.1)


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["dropped", "unavailable"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(case):
    """(b) a dropped update, (c) unavailable clients (FedHCA² samples no clients, so (a) is not
    a case): they enter with zero deltas. Round 1: client i gets prev_i + its homogeneous
    group's mean delta + 0.1·Ũ; decoder k gets prev_k + Δ_k + 0.1·A_k."""
    from tests.helpers import MATH_CASES, assert_relative, math_round

    inputs = math_round(MATH_CASES[case])
    out = FedHCA2().aggregate(inputs)
    out.check_against(inputs)
    d = inputs.encoder_deltas
    group_mean = torch.stack([d[g].mean(0) for g in ([0, 1], [0, 1], [2], [3, 4], [3, 4])])
    encoders = inputs.encoders_prev + group_mean + 0.1 * conflict_averse_update(d, c=0.4, rescale=True)
    attention = cross_attention_update_flat(inputs.decoder_deltas, inputs.decoder_layout)
    decoders = inputs.decoders_prev + inputs.decoder_deltas + 0.1 * attention
    assert_relative(out.encoders, encoders)
    assert_relative(out.decoders, decoders)


@pytest.mark.parametrize("case", ["dropped", "unavailable"])
def test_fedavg_encoders_take_the_clients_that_did_not_train_at_their_start(case):
    """``encoder="fedavg"``: the mean of all N trained encoders, a client that did not train
    with its round-start encoder (its row is read: ``reads_every_client``)."""
    from tests.helpers import MATH_CASES, assert_relative, math_round

    inputs = math_round(MATH_CASES[case])
    method = FedHCA2(encoder="fedavg", decoder="fedavg")
    assert method.reads_every_client
    out = method.aggregate(inputs)
    mean = (inputs.encoders_prev + inputs.encoder_deltas).mean(0)
    assert_relative(out.encoders, mean.expand_as(inputs.encoders_prev))
    assert_relative(out.decoders, (inputs.decoders_prev + inputs.decoder_deltas).mean(0).expand(7, -1))
