"""FedHCA²'s aggregation math (conflict-averse encoder update, cross-attention decoder update)
against hand-computed cases and the invariants of its definition."""

import math

import numpy as np
import pytest
import torch

from fedmtl.aggregation import (
    FlatLayout,
    conflict_averse_coefficients,
    conflict_averse_update,
    conflict_averse_weights,
    cross_attention_update,
    cross_attention_update_flat,
    gram_matrix,
)
from fedmtl.models import FCNDecoder

DTYPES = [torch.float32, torch.float64]


def _close(actual, expected, dtype, **kw):
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-11}
    tol.update(kw)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=dtype), **tol)


def _conflicting_deltas(n: int, p: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """n updates sharing a common direction, each with its own part: agreements and conflicts."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(p, generator=g, dtype=torch.float64)
    scales = torch.rand(n, 1, generator=g, dtype=torch.float64) * 3
    return (0.5 * common + scales * torch.randn(n, p, generator=g, dtype=torch.float64)).to(dtype)


def _objective(gram: np.ndarray, c: float):
    """F(w) = wᵀ G 𝟙/N + c·‖ḡ‖·sqrt(wᵀ G w) and its gradient, straight from the definition."""
    n = len(gram)
    b = gram @ np.full(n, 1 / n)
    c_prime = c * math.sqrt(gram.mean())

    def f(w):
        return float(w @ b + c_prime * math.sqrt(w @ gram @ w))

    def grad(w):
        return b + c_prime * (gram @ w) / math.sqrt(w @ gram @ w)

    return f, grad


# --- gram_matrix ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, *DTYPES])
@pytest.mark.parametrize("chunk_size", [1, 7, 16, 32, 1 << 16])  # 16, 32: batched blocks and a tail
def test_gram_matrix_is_exact_float64_products_in_chunks_and_blocks(dtype, chunk_size):
    x = _conflicting_deltas(4, 50, seed=0, dtype=dtype)
    u = torch.randn(50, dtype=torch.float64).to(dtype)
    stacked = torch.cat([x, u[None]]).double()
    expected = stacked @ stacked.T  # float32/16 values are exact in float64
    result = gram_matrix([x, u[None]], chunk_size=chunk_size)
    assert result.dtype == torch.float64 and result.shape == (5, 5)
    torch.testing.assert_close(result, expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(
        gram_matrix(x, chunk_size=chunk_size), expected[:4, :4], rtol=1e-13, atol=1e-13
    )


def test_gram_matrix_takes_non_contiguous_rows():
    x = torch.randn(40, 3, dtype=torch.float64).T  # [3, 40], column-major
    torch.testing.assert_close(gram_matrix(x, chunk_size=16), x @ x.T, rtol=1e-13, atol=1e-13)


def test_gram_matrix_is_accurate_where_float32_accumulation_is_not():
    # 2**20 terms of 1 + 2**-12: a float32 running sum drifts, float64 accumulation does not.
    x = torch.full((1, 1 << 20), 1 + 2**-12, dtype=torch.float32)
    exact = (1 << 20) * (1 + 2**-12) ** 2
    assert gram_matrix(x).item() == pytest.approx(exact, rel=1e-14)


def test_gram_matrix_rejects_mismatched_blocks():
    with pytest.raises(ValueError, match="column count"):
        gram_matrix([torch.zeros(2, 3), torch.zeros(1, 4)])
    with pytest.raises(ValueError, match=r"\[m, P\]"):
        gram_matrix(torch.zeros(3))
    with pytest.raises(ValueError, match="at least one"):
        gram_matrix([])


# --- conflict-averse update: hand-computed cases --------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_orthogonal_clients_by_hand(dtype):
    """Δ_1 = (1, 0), Δ_2 = (0, s). On the segment g_w = (t, s(1 - t)) at angle φ, F is
    stationary where ⟨ḡ + c'·(cos φ, sin φ), Δ_1 − Δ_2⟩ = 0, i.e.
    cos φ − s·sin φ = (s² − 1) / (2c'), with ḡ = (1/2, s/2), c' = c·sqrt(1 + s²)/2. So
    φ = arccos((s² − 1) / (c(1 + s²))) − atan(s) and t = s / (s + tan φ)."""
    s, c = torch.tensor(1.2, dtype=dtype).item(), 0.4  # 1.2 as the deltas hold it
    phi = math.acos((s * s - 1) / (c * (1 + s * s))) - math.atan(s)  # 0.2270 rad
    t = s / (s + math.tan(phi))  # 0.83855: inside (0, 1), so the stationary point is the optimum
    c_prime = c * math.sqrt(1 + s * s) / 2
    u = [(0.5 + c_prime * math.cos(phi)) / (1 + c * c), (s / 2 + c_prime * math.sin(phi)) / (1 + c * c)]

    deltas = torch.tensor([[1.0, 0.0], [0.0, s]], dtype=dtype)
    w = conflict_averse_weights(gram_matrix(deltas), c)
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, torch.tensor([t, 1 - t], dtype=torch.float64), rtol=0, atol=1e-13)
    _close(conflict_averse_update(deltas, c), u, dtype)
    _close(conflict_averse_update(deltas, c, rescale=False), [x * (1 + c * c) for x in u], dtype)
    assert u == pytest.approx([0.69344, 0.57787], abs=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_dominated_client_gets_all_the_weight_at_a_vertex(dtype):
    """Δ_1 = (2, 0), Δ_2 = (0, 1), c = 0.4: F(t) = 0.5 + 1.5t + c'·sqrt(5t² − 2t + 1) has
    F'(0) = 1.5 − c' > 0 (c' = 0.4·sqrt(5)/2), so w* = (0, 1) and
    Ũ = ((1, 0.5) + c'·(0, 1)) / 1.16."""
    c = 0.4
    c_prime = c * math.sqrt(5) / 2
    deltas = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=dtype)
    w = conflict_averse_weights(gram_matrix(deltas), c)
    torch.testing.assert_close(w, torch.tensor([0.0, 1.0], dtype=torch.float64), rtol=0, atol=1e-9)
    _close(conflict_averse_update(deltas, c), [1 / 1.16, (0.5 + c_prime) / 1.16], dtype)


@pytest.mark.parametrize("rescale", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_c_zero_gives_the_mean(dtype, rescale):
    deltas = _conflicting_deltas(5, 40, seed=1, dtype=dtype)
    _close(conflict_averse_update(deltas, c=0.0, rescale=rescale), deltas.mean(0), dtype)


@pytest.mark.parametrize("c", [0.0, 0.4, 0.8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_identical_deltas_give_that_delta_scaled_by_one_plus_c_over_one_plus_c_squared(dtype, c):
    """ḡ = g_w = Δ and c' = c‖Δ‖, so (1 + c²)Ũ = Δ + c‖Δ‖·Δ/‖Δ‖ = (1 + c)Δ: with the default
    rescaling Ũ = (1 + c)/(1 + c²)·Δ (1.2069Δ for c = 0.4), without it (1 + c)Δ."""
    delta = torch.tensor([0.5, -1.0, 2.0], dtype=dtype)
    deltas = delta.repeat(3, 1)
    _close(conflict_averse_update(deltas, c), (1 + c) / (1 + c * c) * delta, dtype)
    _close(conflict_averse_update(deltas, c, rescale=False), (1 + c) * delta, dtype)
    # A single client is the same case.
    _close(conflict_averse_update(delta[None], c), (1 + c) / (1 + c * c) * delta, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_and_cancelling_updates_are_finite(dtype):
    _close(conflict_averse_update(torch.zeros(3, 4, dtype=dtype)), torch.zeros(4), dtype)
    w = conflict_averse_weights(torch.zeros(3, 3))
    torch.testing.assert_close(w, torch.full((3,), 1 / 3, dtype=torch.float64))
    # Opposite updates: ḡ = 0, so c' = 0 and Ũ = ḡ = 0.
    _close(conflict_averse_update(torch.tensor([[1.0, 2.0], [-1.0, -2.0]], dtype=dtype)), [0.0, 0.0], dtype)
    # 0 = (Δ_1 + Δ_2)/2 is in the hull and every point of it has ⟨p, ḡ⟩ ≥ 0: F is minimal at
    # g_w = 0, which has no direction; the term is dropped and Ũ = ḡ/(1 + c²).
    deltas = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.3]], dtype=dtype)
    _close(conflict_averse_update(deltas, 0.4), [0.0, 0.1 / 1.16], dtype)


# --- conflict-averse update: invariants -----------------------------------------------


@pytest.mark.parametrize("c", [0.2, 0.4, 0.8])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solved_weights_are_optimal_on_the_simplex(dtype, n, c):
    deltas = _conflicting_deltas(n, 64, seed=n, dtype=dtype)
    w = conflict_averse_weights(gram_matrix(deltas), c)
    assert w.shape == (n,) and w.dtype == torch.float64
    assert bool((w >= 0).all()) and w.sum().item() == pytest.approx(1.0, abs=1e-12)
    gram = deltas.double() @ deltas.double().T
    gram = (gram / gram.diagonal().mean()).numpy()  # scale-free tolerances
    f, grad = _objective(gram, c)
    w = w.numpy()
    for candidate in [np.full(n, 1 / n), *np.eye(n)]:
        assert f(w) <= f(candidate) + 1e-12
    # F is convex, so the Frank-Wolfe gap max_v ∇F(w)ᵀ(w − v) over vertices v bounds F(w) − F*.
    g = grad(w)
    assert float(g @ w - g.min()) < 1e-12


@pytest.mark.parametrize("c", [0.2, 0.4, 0.8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_update_sits_on_the_ball_around_the_mean_and_maximises_the_worst_agreement(dtype, c):
    """(1 + c²)Ũ = ḡ + c'·g_w/‖g_w‖ is on the sphere ‖d − ḡ‖ = c‖ḡ‖ (FedHCA² Eq. 6), and by
    duality it maximises min_i ⟨Δ_i, d⟩ over that ball: no point of the ball does better."""
    deltas = _conflicting_deltas(4, 32, seed=7, dtype=dtype)
    d64 = deltas.double()
    mean = d64.mean(0)
    radius = c * mean.norm().item()
    update = conflict_averse_update(deltas, c).double()
    unscaled = conflict_averse_update(deltas, c, rescale=False).double()
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    assert ((1 + c * c) * update - mean).norm().item() == pytest.approx(radius, rel=rtol)
    assert (unscaled - mean).norm().item() == pytest.approx(radius, rel=rtol)
    torch.testing.assert_close(unscaled, (1 + c * c) * update, rtol=rtol, atol=1e-7)

    worst = (d64 @ unscaled).min().item()
    g = torch.Generator().manual_seed(0)
    directions = torch.randn(2000, 32, generator=g, dtype=torch.float64)
    on_sphere = mean + radius * directions / directions.norm(dim=1, keepdim=True)
    best_sampled = (d64 @ on_sphere.T).min(0).values.max().item()
    assert best_sampled <= worst + rtol * abs(worst)
    assert worst >= (d64 @ mean).min().item()  # better than plain averaging


def test_coefficients_reproduce_the_update_and_take_given_weights():
    deltas = _conflicting_deltas(3, 16, seed=3)
    gram = gram_matrix(deltas)
    v = conflict_averse_coefficients(gram, 0.4)
    torch.testing.assert_close(v @ deltas, conflict_averse_update(deltas, 0.4))
    # With w = 𝟙/N, g_w = ḡ: v = (1 + c)/(1 + c²)·𝟙/N.
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    v = conflict_averse_coefficients(gram, 0.4, weights=uniform)
    torch.testing.assert_close(v, uniform * 1.4 / 1.16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_update_is_deterministic_scale_equivariant_and_leaves_inputs_alone(dtype):
    deltas = _conflicting_deltas(6, 100, seed=11, dtype=dtype) * 1e-3
    before = deltas.clone()
    first, second = conflict_averse_update(deltas), conflict_averse_update(deltas)
    assert torch.equal(first, second) and torch.equal(deltas, before)
    assert first.dtype == dtype and first.shape == (100,)
    assert first.untyped_storage().data_ptr() != deltas.untyped_storage().data_ptr()
    _close(conflict_averse_update(deltas * 1e4) * 1e-4, first, dtype)  # Ũ scales with the updates


def test_conflict_averse_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"\[N, P\]"):
        conflict_averse_update(torch.zeros(3))
    with pytest.raises(ValueError, match="c must be"):
        conflict_averse_update(torch.ones(2, 3), c=-0.1)
    with pytest.raises(ValueError, match="square"):
        conflict_averse_weights(torch.ones(2, 3))
    with pytest.raises(ValueError, match="not finite"):
        conflict_averse_update(torch.tensor([[1.0, float("inf")], [0.0, 1.0]]))


# --- cross-attention ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_two_by_two_by_hand(dtype):
    """V = I₂, d = 2: scores = I/√2, so each row of softmax is (e^a, 1)/(e^a + 1), a = 1/√2, and A = that matrix."""
    e = math.exp(1 / math.sqrt(2))
    p, q = e / (e + 1), 1 / (e + 1)  # 0.6698, 0.3302
    _close(cross_attention_update(torch.eye(2, dtype=dtype)), [[p, q], [q, p]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_three_by_two_by_hand(dtype):
    """V = [[1, 0], [0, 1], [1, 1]], d = 2; V Vᵀ = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]."""
    a = 1 / math.sqrt(2)
    rows = [[a, 0, a], [0, a, a], [a, a, 2 * a]]  # V Vᵀ / sqrt(d)
    values = [[1, 0], [0, 1], [1, 1]]
    expected = []
    for scores in rows:
        weights = [math.exp(s) for s in scores]
        total = sum(weights)
        expected.append([sum(w * v[j] for w, v in zip(weights, values)) / total for j in range(2)])
    # Row 0: (e^a·(1, 0) + (0, 1) + e^a·(1, 1)) / (2e^a + 1).
    e = math.exp(a)
    assert expected[0] == pytest.approx([2 * e / (2 * e + 1), (1 + e) / (2 * e + 1)])
    _close(cross_attention_update(torch.tensor(values, dtype=dtype)), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_keeps_shape_and_one_decoder_keeps_its_own_update(dtype):
    delta = torch.randn(1, 4, 3, 2, dtype=dtype)
    out = cross_attention_update(delta)
    assert out.shape == delta.shape and out.dtype == dtype
    _close(out, delta, dtype)
    deltas = torch.randn(5, 4, 3, dtype=dtype)
    out = cross_attention_update(deltas)
    assert out.shape == (5, 4, 3)
    _close(out.reshape(5, -1), cross_attention_update(deltas.reshape(5, -1)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_permuting_decoders_permutes_the_output(dtype):
    deltas = torch.randn(6, 10, dtype=dtype)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    _close(cross_attention_update(deltas[perm]), cross_attention_update(deltas)[perm], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_rows_are_convex_combinations(dtype):
    # Each A_k lies in the convex hull of the K updates: inside their per-coordinate range.
    deltas = torch.randn(4, 50, dtype=dtype) * 3
    out = cross_attention_update(deltas)
    assert bool((out <= deltas.max(0).values + 1e-6).all() and (out >= deltas.min(0).values - 1e-6).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_cross_attention_equals_the_per_tensor_function(dtype):
    decoder = FCNDecoder([3, 5, 7, 9], 4)
    layout = FlatLayout.from_module(decoder)
    assert layout.num_tensors == 12 and layout.num_layers == 6
    deltas = torch.randn(5, layout.numel, dtype=dtype) * 1e-2
    deltas[:, : layout.numels[0]] *= 100  # tensors on different scales get different attention
    before = deltas.clone()
    out = cross_attention_update_flat(deltas, layout)
    assert torch.equal(deltas, before) and out.dtype == dtype and out.shape == deltas.shape
    per_tensor = layout.unflatten(out)
    for name, part in layout.unflatten(deltas).items():
        _close(per_tensor[name], cross_attention_update(part), dtype)
    # And against the public code's per-decoder form: softmax(Δ_k Vᵀ/√d) V for each k.
    for part_out, part in zip(layout.split(out), layout.split(deltas)):
        x = part.double()
        for k in range(5):
            row = torch.softmax(x[k] @ x.T / math.sqrt(x.shape[1]), dim=0) @ x
            _close(part_out[k], row, dtype)


def test_cross_attention_rejects_bad_shapes():
    layout = FlatLayout(names=("a",), shapes=((2,),), dtypes=(torch.float32,), tensor_layers=("",))
    with pytest.raises(ValueError, match=r"\[K, Q\]"):
        cross_attention_update_flat(torch.zeros(2), layout)
    with pytest.raises(ValueError, match="the layout's numel"):
        cross_attention_update_flat(torch.zeros(2, 3), layout)
    with pytest.raises(ValueError, match="non-empty"):
        cross_attention_update(torch.zeros(0, 3))
