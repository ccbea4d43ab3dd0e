"""FedOpt server optimisers (Reddi et al., ICLR 2021, Algorithm 2): one- and two-step hand cases
of FedAdam, FedYogi and FedAdagrad, the exact reductions (server SGD with η = 1, β1 = 0 is
FedAvg bit for bit; FedAdam with β1 = β2 = 0 is a sign-like step, never FedAvg), purity, the
checkpointable state, and one-line errors naming the config field.

The hand cases use the paper's β1 = 0.9, β2 = 0.99, τ = 1e-3, the default η = 1e-2 and
v_{−1} = τ² = 1e-6, with deltas chosen so that the first step's square roots are exact.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedmtl.aggregation.fedopt import (
    DEFAULT_BETA1,
    DEFAULT_BETA2,
    DEFAULT_SERVER_LR,
    DEFAULT_TAU,
    ServerOptimizer,
    fedopt_init_state,
    fedopt_step,
)
from fedmtl.aggregation.functional import group_means_to, mean_rows

F64 = torch.float64
X0 = [1.0, -2.0, 0.5]


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, _t(expected), rtol=1e-12, atol=1e-15)


def _random(p: int, seed: int, dtype=F64, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(p, generator=g, dtype=F64)).to(dtype)


def test_defaults_are_the_papers_betas_and_tau_and_the_documented_server_lr():
    """β1 0.9, β2 0.99, τ 1e-3 as in Reddi et al.; η 1e-2 is this project's documented choice."""
    opt = ServerOptimizer()
    assert (opt.kind, opt.lr, opt.beta1, opt.beta2, opt.tau) == ("adam", 1e-2, 0.9, 0.99, 1e-3)
    assert (DEFAULT_SERVER_LR, DEFAULT_BETA1, DEFAULT_BETA2, DEFAULT_TAU) == (1e-2, 0.9, 0.99, 1e-3)


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad", "sgd"])
def test_initial_state_is_zero_momentum_and_v_tau_squared(kind):
    """m_{−1} = 0 and v_{−1} = τ² (the smallest value Algorithm 2 allows); server SGD has no v.
    Passing state=None is the same as passing this state."""
    x, delta = _t(X0), _t([0.3, -0.1, 0.0])
    state = fedopt_init_state(kind, x, tau=0.5)
    assert torch.equal(state["m"], torch.zeros(3, dtype=F64))
    if kind == "sgd":
        assert set(state) == {"m"}
    else:
        assert set(state) == {"m", "v"} and torch.equal(state["v"], torch.full((3,), 0.25, dtype=F64))
    a = fedopt_step(kind, x, delta, None, lr=0.1, tau=0.5)
    b = fedopt_step(kind, x, delta, state, lr=0.1, tau=0.5)
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


# ------------------------------------------------------------------------------ hand cases


def test_fedadam_one_and_two_steps_by_hand():
    """FedAdam: v_t = β2·v + (1−β2)·Δ², x += η·m/(√v + τ)."""
    x = _t(X0)
    # Step 1, Δ0 = (1e-3, −1.5e-2, 4.9e-2):
    # m0 = 0.1·Δ0                        = (1e-4, −1.5e-3, 4.9e-3)
    # v0 = 0.99·1e-6 + 0.01·Δ0²          = (0.99e-6 + 0.01e-6, 0.99e-6 + 2.25e-6, 0.99e-6 + 24.01e-6)
    #                                    = (1e-6, 3.24e-6, 25e-6);  √v0 = (1e-3, 1.8e-3, 5e-3)
    # η·m0/(√v0 + τ) = 1e-2·(1e-4/2e-3, −1.5e-3/2.8e-3, 4.9e-3/6e-3) = (5e-4, −3/560, 0.049/6)
    x1, s1 = fedopt_step("adam", x, _t([1e-3, -1.5e-2, 4.9e-2]))
    _close(s1["m"], [1e-4, -1.5e-3, 4.9e-3])
    _close(s1["v"], [1e-6, 3.24e-6, 25e-6])
    _close(x1, [1.0005, -2.0 - 3 / 560, 0.5 + 0.049 / 6])
    # Step 2, Δ1 = (1e-3, 0, −4.9e-2):
    # m1 = 0.9·m0 + 0.1·Δ1 = (0.9e-4 + 1e-4, −1.35e-3 + 0, 4.41e-3 − 4.9e-3) = (1.9e-4, −1.35e-3, −4.9e-4)
    # v1 = 0.99·v0 + 0.01·Δ1² = (0.99e-6 + 0.01e-6, 0.99·3.24e-6, 0.99·25e-6 + 24.01e-6)
    #    = (1e-6, 3.2076e-6, 48.76e-6)
    x2, s2 = fedopt_step("adam", x1, _t([1e-3, 0.0, -4.9e-2]), s1)
    _close(s2["m"], [1.9e-4, -1.35e-3, -4.9e-4])
    _close(s2["v"], [1e-6, 3.2076e-6, 48.76e-6])
    # x2 = x1 + 1e-2·m1/(√v1 + 1e-3); coordinate 0: 1e-2·1.9e-4/2e-3 = 9.5e-4.
    _close(
        x2,
        [
            1.0005 + 9.5e-4,
            -2.0 - 3 / 560 - 1e-2 * 1.35e-3 / (math.sqrt(3.2076e-6) + 1e-3),
            0.5 + 0.049 / 6 - 1e-2 * 4.9e-4 / (math.sqrt(48.76e-6) + 1e-3),
        ],
    )


def test_fedyogi_one_and_two_steps_by_hand():
    """FedYogi: v_t = v − (1−β2)·Δ²·sign(v − Δ²). v grows additively where Δ² > v, shrinks
    where Δ² < v (unlike Adam's decay), and stays put at a tie (sign 0)."""
    x = _t(X0)
    # Step 1, Δ0 = (1e-3, −7.5e-3, 2.4e-2); v_{−1} = 1e-6; Δ0² = (1e-6, 56.25e-6, 576e-6)
    # sign(v − Δ0²) = (0, −1, −1): coordinate 0 is a tie (1e-3·1e-3 == τ² in float64).
    # v0 = (1e-6 − 0, 1e-6 + 0.5625e-6, 1e-6 + 5.76e-6) = (1e-6, 1.5625e-6, 6.76e-6)
    # √v0 = (1e-3, 1.25e-3, 2.6e-3);  m0 = 0.1·Δ0 = (1e-4, −7.5e-4, 2.4e-3)
    # η·m0/(√v0 + τ) = 1e-2·(1e-4/2e-3, −7.5e-4/2.25e-3, 2.4e-3/3.6e-3) = (5e-4, −1/300, 1/150)
    x1, s1 = fedopt_step("yogi", x, _t([1e-3, -7.5e-3, 2.4e-2]))
    _close(s1["m"], [1e-4, -7.5e-4, 2.4e-3])
    _close(s1["v"], [1e-6, 1.5625e-6, 6.76e-6])
    assert s1["v"][0] == 1e-6  # the tie keeps v exactly
    _close(x1, [1.0005, -2.0 - 1 / 300, 0.5 + 1 / 150])
    # Step 2, Δ1 = (0, 1e-3, 2.4e-2); Δ1² = (0, 1e-6, 576e-6); sign(v0 − Δ1²) = (+1, +1, −1)
    # v1 = (1e-6 − 0, 1.5625e-6 − 0.01e-6, 6.76e-6 + 5.76e-6) = (1e-6, 1.5525e-6, 12.52e-6)
    #      (Adam would give 0.99·1.5625e-6 + 0.01e-6 = 1.556875e-6 in coordinate 1)
    # m1 = 0.9·m0 + 0.1·Δ1 = (0.9e-4, −6.75e-4 + 1e-4, 2.16e-3 + 2.4e-3) = (0.9e-4, −5.75e-4, 4.56e-3)
    x2, s2 = fedopt_step("yogi", x1, _t([0.0, 1e-3, 2.4e-2]), s1)
    _close(s2["m"], [0.9e-4, -5.75e-4, 4.56e-3])
    _close(s2["v"], [1e-6, 1.5525e-6, 12.52e-6])
    # x2 = x1 + 1e-2·m1/(√v1 + 1e-3); coordinate 0: 1e-2·0.9e-4/2e-3 = 4.5e-4.
    _close(
        x2,
        [
            1.0005 + 4.5e-4,
            -2.0 - 1 / 300 - 1e-2 * 5.75e-4 / (math.sqrt(1.5525e-6) + 1e-3),
            0.5 + 1 / 150 + 1e-2 * 4.56e-3 / (math.sqrt(12.52e-6) + 1e-3),
        ],
    )


def test_fedadagrad_one_and_two_steps_by_hand():
    """FedAdagrad: v_t = v + Δ² (no decay, β2 ignored), the β1 momentum as in Algorithm 2."""
    x = _t(X0)
    # Step 1, Δ0 = (0, −7.5e-4, 2.4e-3): v0 = 1e-6 + Δ0² = (1e-6, 1.5625e-6, 6.76e-6)
    # √v0 = (1e-3, 1.25e-3, 2.6e-3);  m0 = 0.1·Δ0 = (0, −7.5e-5, 2.4e-4)
    # η·m0/(√v0 + τ) = 1e-2·(0, −7.5e-5/2.25e-3, 2.4e-4/3.6e-3) = (0, −1/3000, 1/1500)
    x1, s1 = fedopt_step("adagrad", x, _t([0.0, -7.5e-4, 2.4e-3]))
    _close(s1["m"], [0.0, -7.5e-5, 2.4e-4])
    _close(s1["v"], [1e-6, 1.5625e-6, 6.76e-6])
    _close(x1, [1.0, -2.0 - 1 / 3000, 0.5 + 1 / 1500])
    # Step 2, Δ1 = (1e-3, −7.5e-4, −2.4e-3): v1 = v0 + Δ1² = (2e-6, 2.125e-6, 12.52e-6)
    # m1 = 0.9·m0 + 0.1·Δ1 = (1e-4, −6.75e-5 − 7.5e-5, 2.16e-4 − 2.4e-4) = (1e-4, −1.425e-4, −0.24e-4)
    x2, s2 = fedopt_step("adagrad", x1, _t([1e-3, -7.5e-4, -2.4e-3]), s1)
    _close(s2["m"], [1e-4, -1.425e-4, -0.24e-4])
    _close(s2["v"], [2e-6, 2.125e-6, 12.52e-6])
    _close(
        x2,
        [
            1.0 + 1e-2 * 1e-4 / (math.sqrt(2e-6) + 1e-3),
            -2.0 - 1 / 3000 - 1e-2 * 1.425e-4 / (math.sqrt(2.125e-6) + 1e-3),
            0.5 + 1 / 1500 - 1e-2 * 0.24e-4 / (math.sqrt(12.52e-6) + 1e-3),
        ],
    )


def test_fedadagrad_ignores_beta2():
    """β2 is Adam's and Yogi's decay; FedAdagrad's v is a plain sum, whatever β2 is."""
    x, delta = _random(50, 0), _random(50, 1)
    a = fedopt_step("adagrad", x, delta, beta2=0.0)
    b = fedopt_step("adagrad", x, delta, beta2=0.999)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["v"], b[1]["v"])


def test_server_sgd_one_and_two_steps_by_hand():
    """Server SGD (momentum as an average): m_t = β1·m + (1−β1)·Δ, x += η·m. With η = 0.5,
    β1 = 0.5 (all dyadic, so exact): m0 = 0.5·Δ0, x1 = x + 0.25·Δ0; m1 = 0.5·m0 + 0.5·Δ1."""
    x = _t(X0)
    x1, s1 = fedopt_step("sgd", x, _t([1.0, -2.0, 0.0]), lr=0.5, beta1=0.5)
    assert torch.equal(s1["m"], _t([0.5, -1.0, 0.0]))
    assert torch.equal(x1, _t([1.25, -2.5, 0.5]))
    # m1 = 0.5·(0.5, −1, 0) + 0.5·(1, 0, 4) = (0.75, −0.5, 2); x2 = x1 + 0.5·m1 = (1.625, −2.75, 1.5)
    x2, s2 = fedopt_step("sgd", x1, _t([1.0, 0.0, 4.0]), s1, lr=0.5, beta1=0.5)
    assert torch.equal(s2["m"], _t([0.75, -0.5, 2.0]))
    assert torch.equal(x2, _t([1.625, -2.75, 1.5]))


# ------------------------------------------------------------------------------ reductions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_server_sgd_with_lr_one_and_beta1_zero_is_fedavg_bit_for_bit(dtype):
    """η = 1, β1 = 0: m = 0·m + 1·Δ = Δ and x + 1·m = x + Δ exactly, every round (momentum
    left over from earlier rounds is multiplied by 0). Given FedAvg's own base mean(prev) and
    the mean delta, the result is FedAvg's mean(prev) + mean(Δ) (group_means_to, all rows,
    sample weights) bit for bit, on 3 clients whose float32 means are not exact."""
    p, n, weights = 1000, 3, [1000.0, 1000.0, 795.0]
    global_x = _random(p, 0, dtype)
    prev = global_x.expand(n, p).clone()
    state = {"m": _random(p, 9, dtype)}  # leftover momentum must not matter with β1 = 0
    for r in range(2):
        deltas = torch.stack([_random(p, 10 * r + i, dtype, scale=1e-2) for i in range(1, n + 1)])
        fedavg = group_means_to(prev, deltas, [(range(n), range(n))], weights)[0]
        x, state = fedopt_step("sgd", mean_rows(prev, weights), mean_rows(deltas, weights), state, 1.0, 0.0)
        assert torch.equal(x, fedavg)
        assert torch.equal(state["m"], mean_rows(deltas, weights))
        prev = x.expand(n, p).clone()


def test_fedadam_with_zero_betas_is_a_sign_like_step_not_fedavg():
    """No adaptive kind reduces to FedAvg: with β1 = β2 = 0, v = Δ² and √(Δ²) = |Δ| exactly,
    so FedAdam's step is exactly η·Δ/(|Δ| + τ): about η·sign(Δ) where |Δ| ≫ τ, whatever η is."""
    x, delta = _random(200, 0), _random(200, 1)
    for lr in (1.0, 0.3):
        new, state = fedopt_step("adam", x, delta, None, lr=lr, beta1=0.0, beta2=0.0, tau=1e-3)
        assert torch.equal(state["v"], delta * delta)
        assert torch.equal(new, x + (lr * delta) / (delta.abs() + 1e-3))
        assert not torch.equal(new, x + delta)
    big = _t([5.0, -3.0])  # |Δ| ≫ τ: the step is ≈ ±η, not Δ
    new, _ = fedopt_step("adam", torch.zeros(2, dtype=F64), big, None, lr=1.0, beta1=0.0, beta2=0.0)
    _close(new, [5.0 / 5.001, -3.0 / 3.001])


# ------------------------------------------------------------------ purity, dtype, state


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad", "sgd"])
def test_inputs_and_state_are_not_modified_and_outputs_are_new_tensors(kind):
    """The function is pure: params, the pseudo-gradient and the previous state keep their
    bits, and nothing returned aliases them (a caller may keep the old state for a retry)."""
    x, delta = _random(64, 0), _random(64, 1, scale=1e-2)
    _, state = fedopt_step(kind, x, _random(64, 2, scale=1e-2))
    saved = (x.clone(), delta.clone(), {k: v.clone() for k, v in state.items()})
    new_x, new_state = fedopt_step(kind, x, delta, state, lr=0.1, beta1=0.0, beta2=0.0)
    assert torch.equal(x, saved[0]) and torch.equal(delta, saved[1])
    assert all(torch.equal(state[k], saved[2][k]) for k in state)
    inputs = {t.data_ptr() for t in (x, delta, *state.values())}
    assert not inputs & {t.data_ptr() for t in (new_x, *new_state.values())}


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_float32_follows_float64_and_state_keeps_the_params_dtype(kind):
    """The step runs in params' dtype (state too, so a checkpoint is as large as the pool, not
    twice): float32 stays within float32 rounding of the float64 result over three rounds."""
    x64, s64, x32, s32 = _random(500, 0), None, _random(500, 0, torch.float32), None
    for r in range(3):
        d64 = _random(500, r + 1, scale=1e-2)
        x64, s64 = fedopt_step(kind, x64, d64, s64)
        x32, s32 = fedopt_step(kind, x32, d64.float(), s32)
    assert x32.dtype == s32["m"].dtype == s32["v"].dtype == torch.float32
    torch.testing.assert_close(x32.double(), x64, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad", "sgd"])
def test_state_round_trips_through_a_weights_only_checkpoint_and_resume_is_bit_identical(kind, tmp_path):
    """The state is tensors only, so torch.load(weights_only=True) reads it; continuing from
    the loaded state gives the same bits as never stopping."""
    deltas = [_random(100, r, torch.float32, scale=1e-2) for r in range(4)]
    x, state = _random(100, 99, torch.float32), None
    for d in deltas[:2]:
        x, state = fedopt_step(kind, x, d, state)
    torch.save({"params": x, "server_state": state}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert set(loaded["server_state"]) == set(state)
    xa, sa, xb, sb = x, state, loaded["params"], loaded["server_state"]
    for d in deltas[2:]:
        xa, sa = fedopt_step(kind, xa, d, sa)
        xb, sb = fedopt_step(kind, xb, d, sb)
    assert torch.equal(xa, xb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_server_optimizer_step_is_fedopt_step_with_its_options():
    opt = ServerOptimizer("yogi", lr=0.05, beta1=0.5, beta2=0.9, tau=1e-2)
    x, d = _random(20, 0), _random(20, 1)
    a = opt.step(x, d, opt.init_state(x))
    b = fedopt_step("yogi", x, d, None, 0.05, 0.5, 0.9, 1e-2)
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[1][k], b[1][k]) for k in b[1])


# ------------------------------------------------------------------------------ bad input

BAD_OPTIONS = [
    ("algorithm.server_lr", {"lr": 0.0}),
    ("algorithm.server_lr", {"lr": -1e-2}),
    ("algorithm.server_lr", {"lr": float("nan")}),
    ("algorithm.server_lr", {"lr": True}),
    ("algorithm.server_lr", {"lr": "fast"}),
    ("algorithm.beta1", {"beta1": 1.0}),
    ("algorithm.beta1", {"beta1": -0.1}),
    ("algorithm.beta2", {"beta2": 1.0}),
    ("algorithm.beta2", {"beta2": float("inf")}),
    ("algorithm.tau", {"tau": 0.0}),
    ("algorithm.tau", {"tau": -1e-3}),
    ("algorithm.server_optimizer", {"kind": "adamw"}),
]


@pytest.mark.parametrize(("field", "options"), BAD_OPTIONS, ids=[f"{f}={o}" for f, o in BAD_OPTIONS])
def test_a_bad_option_raises_one_line_naming_the_field(field, options):
    """Both entry points refuse a bad option with one line that starts with the config field
    and says the valid range (a user typo, so no traceback-worthy error)."""
    kind = options.get("kind", "adam")
    numbers = {k: v for k, v in options.items() if k != "kind"}
    for call in (
        lambda: ServerOptimizer(kind, **numbers),
        lambda: fedopt_step(kind, torch.zeros(3), torch.zeros(3), **numbers),
    ):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{field} must be") and "\n" not in message
        assert repr(next(iter(options.values()))) in message  # the bad value is shown


def test_adagrad_still_refuses_a_bad_beta2():
    """β2 is ignored by FedAdagrad but validated anyway: a typo in the config is not accepted
    silently (and the same config stays valid if the kind is switched to adam)."""
    with pytest.raises(ValueError, match=r"^algorithm\.beta2 must be in \[0, 1\)"):
        ServerOptimizer("adagrad", beta2=1.5)


def test_mismatched_tensors_and_state_are_refused():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="pseudo_gradient must match params"):
        fedopt_step("adam", x, torch.zeros(4))
    with pytest.raises(ValueError, match="pseudo_gradient must match params"):
        fedopt_step("adam", x, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="params must be a floating-point vector"):
        fedopt_step("adam", torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"must hold \['m', 'v'\], got \['m'\]"):
        fedopt_step("adam", x, x, {"m": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"state\['v'\] must match params"):
        fedopt_step("yogi", x, x, {"m": torch.zeros(3), "v": torch.zeros(5)})


# ---------------------------------------------------------------------------- the FedOpt method


def _method_round(round_: int = 1, participants=None):
    """Three clients (two semseg, one depth) with shared heads, random float32 rows."""
    from tests.test_feddea import _random_round

    return _random_round(round_, participants, heads=True)


@pytest.mark.parametrize(
    "scopes",
    [
        {},
        {"decoder_scope": "same_task", "head_scope": "same_task", "weighted": True},
        {"encoder_scope": "same_task", "decoder_scope": "none"},
    ],
)
def test_fedopt_method_with_server_sgd_at_lr_one_and_no_momentum_is_fedavg(scopes):
    from fedmtl.methods import FedAvg
    from fedmtl.methods.fedopt import FedOpt

    fedopt = FedOpt(server_optimizer="sgd", server_lr=1.0, beta1=0.0, **scopes)
    fedavg = FedAvg(**scopes)
    for round_, participants in [(1, None), (2, (1, 2)), (3, (0,))]:
        inputs = _method_round(round_, participants)
        a, b = fedopt.aggregate(inputs), fedavg.aggregate(inputs)
        # Encoders: x + Δ from the prev and delta rows against FedAvg's mean trained row, equal
        # up to float rounding (the one server step); decoders and heads bit for bit.
        torch.testing.assert_close(a.encoders, b.encoders, rtol=1e-6, atol=1e-6)
        assert torch.equal(a.decoders, b.decoders)
        assert (a.heads is None) == (b.heads is None)
        assert a.heads is None or all(torch.equal(x, y) for x, y in zip(a.heads, b.heads, strict=True))


def test_fedopt_method_steps_each_group_with_its_own_moments():
    """FedAdam by hand on the encoder pool (one group: x the start, Δ the mean delta), and one
    moment pair per group: encoders/all, decoders/semseg and decoders/depth, heads per task.
    A group with no member training keeps its rows and its moments."""
    from fedmtl.methods.fedopt import FedOpt

    method = FedOpt(decoder_scope="same_task", head_scope="same_task")
    inputs = _method_round()
    out = method.aggregate(inputs)
    x = inputs.encoders_prev.double().mean(0)
    delta = inputs.encoder_deltas.double().mean(0)
    m = (1 - DEFAULT_BETA1) * delta
    v = DEFAULT_BETA2 * DEFAULT_TAU**2 + (1 - DEFAULT_BETA2) * delta**2
    expected = x + DEFAULT_SERVER_LR * m / (v.sqrt() + DEFAULT_TAU)
    torch.testing.assert_close(out.encoders.double(), expected.expand(3, -1), rtol=1e-5, atol=1e-6)
    assert sorted(method.moments) == [
        "decoders/depth",
        "decoders/semseg",
        "encoders/all",
        "heads/nyud/depth",
        "heads/nyud/semseg",
    ]
    assert torch.equal(out.decoders[0], out.decoders[1]) and not torch.equal(out.decoders[0], out.decoders[2])
    depth = {k: t.clone() for k, t in method.moments["decoders/depth"].items()}
    second = _method_round(2, participants=(0, 1))  # the depth client sits out
    out = method.aggregate(second)
    assert torch.equal(out.decoders[2], second.decoders_prev[2])
    assert all(torch.equal(method.moments["decoders/depth"][k], t) for k, t in depth.items())


def test_fedopt_method_state_resumes_bit_for_bit(tmp_path):
    from fedmtl.methods.fedopt import FedOpt

    straight, resumed = FedOpt(server_optimizer="yogi"), FedOpt(server_optimizer="yogi")
    for round_ in (1, 2):
        straight.aggregate(_method_round(round_))
    torch.save(straight.state_dict(), tmp_path / "server.pt")
    resumed.load_state_dict(torch.load(tmp_path / "server.pt", weights_only=True))
    a, b = straight.aggregate(_method_round(3)), resumed.aggregate(_method_round(3))
    assert torch.equal(a.encoders, b.encoders) and torch.equal(a.decoders, b.decoders)
    assert repr(straight.state_dict()) == repr(resumed.state_dict())
    with pytest.raises(ValueError, match="moments"):
        resumed.load_state_dict({"alpha": torch.zeros(1)})


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["sampled", "dropped", "unavailable"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients: one FedAdam step from the
    participants' mean start x and mean delta Δ, the result given to every row of the pool."""
    from fedmtl.methods.fedopt import FedOpt
    from tests.helpers import MATH_CASES, assert_relative, math_round

    participants = list(MATH_CASES[case])
    inputs = math_round(participants)
    out = FedOpt(participation=0.6 if case == "sampled" else 1.0).aggregate(inputs)
    out.check_against(inputs)
    dec_sources = [k for k, (i, _) in enumerate(inputs.decoder_owners) if i in participants]
    for got, prev, deltas, sources in [
        (out.encoders, inputs.encoders_prev, inputs.encoder_deltas, participants),
        (out.decoders, inputs.decoders_prev, inputs.decoder_deltas, dec_sources),
    ]:
        x = mean_rows(prev[sources])
        new, _ = fedopt_step("adam", x, mean_rows(deltas[sources]), fedopt_init_state("adam", x))
        assert_relative(got, new.expand_as(prev))
