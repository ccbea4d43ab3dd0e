"""FedOpt server optimisers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2) as pure functions over one flat parameter vector.

One server step, with Δ_t the (weighted) mean of the round's client deltas (trained − received):

    m_t = β1·m_{t−1} + (1 − β1)·Δ_t
    v_t = v_{t−1} + Δ_t²                                   FedAdagrad
    v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²)     FedYogi
    v_t = β2·v_{t−1} + (1 − β2)·Δ_t²                       FedAdam
    x_{t+1} = x_t + η·m_t / (√v_t + τ)

computed in exactly that order, elementwise, in the dtype and on the device of ``params``.

Choices where the paper leaves room (each documented here, none hidden):

* **Initial moments.** m_{−1} = 0 and v_{−1} = τ². Algorithm 2 requires only v_{−1} ≥ τ²
  (its analysis needs √v ≥ τ); τ² is the smallest value it allows, so the first steps are as
  large as the paper permits. (Flower starts from v = 0, outside the paper's condition.)
* **No bias correction**, as in Algorithm 2 (unlike the Adam paper and ``torch.optim.Adam``).
* **β1 applies to all three** optimisers, as Algorithm 2 writes it; FedAdagrad ignores β2
  (it is still validated, so a typo in a config is not silently accepted).
* **Yogi at a tie**: sign(0) = 0, so a coordinate with v_{t−1} = Δ_t² keeps its v.
* **Default server lr η = 1e-2.** The paper tunes η per task and reports no single value;
  η is the hyper-parameter to tune. 1e-2 is chosen for this project's clients (AdamW, lr
  1e-4, a few local epochs), whose per-coordinate round deltas are of order 1e-3–1e-2. With
  β1 = 0.9, β2 = 0.99, τ = 1e-3 and v_{−1} = τ², the first FedAdam step moves a coordinate by
  η·0.1|Δ| / (√(0.99τ² + 0.01Δ²) + τ): 0.5·|Δ| for |Δ| = 1e-3 and 0.41·|Δ| for |Δ| = 1e-2,
  the same order as FedAvg's step and always below η; momentum then builds it up.
* **``kind="sgd"``** (not one of the paper's three; its FedAvgM baseline with the momentum
  written as an average): x_{t+1} = x_t + η·m_t. With η = 1 and β1 = 0 it is x_t + Δ_t
  exactly (0·m + 1·Δ = Δ and 1·m = m in IEEE arithmetic), i.e. FedAvg. The adaptive kinds
  never reduce to FedAvg bit for bit: with β1 = β2 = 0 FedAdam's step is η·Δ/(|Δ| + τ), a
  sign-like step, and no η, τ > 0 make that Δ for every Δ.

To be bit-identical to this project's FedAvg, which computes mean(prev) + mean(deltas)
(:func:`~fedmtl.aggregation.functional.group_means_to`), a caller passes ``params =
mean_rows(prev)`` and ``pseudo_gradient = mean_rows(deltas)`` (same weights): in float32 the
mean of N equal rows is not always that row (e.g. N = 3).

State is a dict of tensors only (``"m"``, and ``"v"`` for the adaptive kinds), in the dtype of
``params``, so a checkpoint holding it loads with ``torch.load(weights_only=True)``. Nothing
here modifies its inputs. A non-finite pseudo-gradient is the caller's to refuse (non-finite
client updates are dropped before aggregation); it would propagate into the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ServerOptimizerKind = Literal["adam", "yogi", "adagrad", "sgd"]
KINDS: tuple[str, ...] = ("adam", "yogi", "adagrad", "sgd")
ADAPTIVE_KINDS: tuple[str, ...] = ("adam", "yogi", "adagrad")

DEFAULT_SERVER_LR = 1e-2  # η: the one to tune; see the module docstring for why 1e-2
DEFAULT_BETA1 = 0.9  # Reddi et al. §5
DEFAULT_BETA2 = 0.99  # Reddi et al. §5
DEFAULT_TAU = 1e-3  # Reddi et al. §5 (the adaptivity τ)


def _real(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a finite real number (bools excluded)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def validate_options(kind: str, lr: float, beta1: float, beta2: float, tau: float) -> None:
    """Raise a one-line ValueError naming the config field of the first bad option."""
    if kind not in KINDS:
        raise ValueError(f"algorithm.server_optimizer must be one of {list(KINDS)}, got {kind!r}")
    x = _real(lr)
    if x is None or x <= 0:
        raise ValueError(
            f"algorithm.server_lr must be a number > 0 (FedOpt's server learning rate η), got {lr!r}; "
            f"the default is {DEFAULT_SERVER_LR}"
        )
    x = _real(beta1)
    if x is None or not 0 <= x < 1:
        raise ValueError(
            f"algorithm.beta1 must be in [0, 1) (the server momentum), got {beta1!r}; "
            f"the paper uses {DEFAULT_BETA1}"
        )
    x = _real(beta2)
    if x is None or not 0 <= x < 1:
        raise ValueError(
            f"algorithm.beta2 must be in [0, 1) (the second-moment decay; FedAdagrad ignores it), "
            f"got {beta2!r}; the paper uses {DEFAULT_BETA2}"
        )
    x = _real(tau)
    if x is None or x <= 0:
        raise ValueError(
            f"algorithm.tau must be a number > 0 (the adaptivity τ in √v + τ), got {tau!r}; "
            f"the paper uses {DEFAULT_TAU}"
        )


def _check_vector(name: str, t: object, like: Tensor | None = None) -> None:
    if not isinstance(t, Tensor) or t.ndim != 1 or not t.is_floating_point():
        desc = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a floating-point vector [P], got {desc}")
    if like is not None and (t.shape != like.shape or t.dtype != like.dtype or t.device != like.device):
        raise ValueError(
            f"{name} must match params ({like.dtype} {tuple(like.shape)} on {like.device}), "
            f"got {t.dtype} {tuple(t.shape)} on {t.device}"
        )


def fedopt_init_state(
    kind: ServerOptimizerKind, params: Tensor, tau: float = DEFAULT_TAU
) -> dict[str, Tensor]:
    """The state before the first step: m = 0 and, for the adaptive kinds, v = τ² (the smallest
    v_{−1} Algorithm 2 allows), as new tensors like ``params``."""
    validate_options(kind, DEFAULT_SERVER_LR, DEFAULT_BETA1, DEFAULT_BETA2, tau)
    _check_vector("params", params)
    state = {"m": torch.zeros_like(params)}
    if kind in ADAPTIVE_KINDS:
        state["v"] = torch.full_like(params, float(tau) ** 2)
    return state


def fedopt_step(
    kind: ServerOptimizerKind,
    params: Tensor,
    pseudo_gradient: Tensor,
    state: dict[str, Tensor] | None = None,
    lr: float = DEFAULT_SERVER_LR,
    beta1: float = DEFAULT_BETA1,
    beta2: float = DEFAULT_BETA2,
    tau: float = DEFAULT_TAU,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One FedOpt server step: ``(x_{t+1}, {"m": m_t, "v": v_t})`` from x_t = ``params`` [P] and
    Δ_t = ``pseudo_gradient`` [P] (the mean client delta, trained − received, so it is added).

    ``state`` None means the first round (:func:`fedopt_init_state`). State tensors on another
    device (e.g. a checkpoint loaded to the CPU) are moved to ``params``'s device; their dtype
    must match. Returns new tensors; the inputs and ``state`` are left unchanged.
    """
    validate_options(kind, lr, beta1, beta2, tau)
    _check_vector("params", params)
    _check_vector("pseudo_gradient", pseudo_gradient, like=params)
    if state is None:
        state = fedopt_init_state(kind, params, tau)
    keys = ("m", "v") if kind in ADAPTIVE_KINDS else ("m",)
    if not isinstance(state, dict) or set(state) != set(keys):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"the state of server optimizer {kind!r} must hold {list(keys)}, got {got}")
    prev = {}
    for key in keys:
        t = state[key].to(device=params.device) if isinstance(state[key], Tensor) else state[key]
        _check_vector(f"state[{key!r}]", t, like=params)
        prev[key] = t
    lr, beta1, beta2, tau = float(lr), float(beta1), float(beta2), float(tau)
    delta = pseudo_gradient

    # m_t = β1·m_{t−1} + (1 − β1)·Δ_t: with β1 = 0 this is 0 + 1·Δ = Δ exactly.
    m = prev["m"] * beta1
    m += (1.0 - beta1) * delta
    if kind == "sgd":
        return params + lr * m, {"m": m}

    delta_sq = delta * delta
    v_prev = prev["v"]
    if kind == "adam":
        v = v_prev * beta2
        v += (1.0 - beta2) * delta_sq
    elif kind == "yogi":
        v = v_prev - (1.0 - beta2) * delta_sq * torch.sign(v_prev - delta_sq)
    else:  # adagrad
        v = v_prev + delta_sq
    denom = torch.sqrt(v)
    denom += tau
    return params + (lr * m) / denom, {"m": m, "v": v}


@dataclass(frozen=True)
class ServerOptimizer:
    """FedOpt's server optimiser options, validated on construction; :meth:`step` applies
    :func:`fedopt_step`. Holds no tensors: the state is passed in and returned."""

    kind: ServerOptimizerKind = "adam"
    lr: float = DEFAULT_SERVER_LR  # η, the server learning rate: the one to tune
    beta1: float = DEFAULT_BETA1  # momentum of the pseudo-gradient (all kinds)
    beta2: float = DEFAULT_BETA2  # second-moment decay (adam, yogi; adagrad ignores it)
    tau: float = DEFAULT_TAU  # adaptivity: bounds 1/(√v + τ) by 1/τ

    def __post_init__(self) -> None:
        validate_options(self.kind, self.lr, self.beta1, self.beta2, self.tau)

    def init_state(self, params: Tensor) -> dict[str, Tensor]:
        return fedopt_init_state(self.kind, params, self.tau)

    def step(
        self, params: Tensor, pseudo_gradient: Tensor, state: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return fedopt_step(
            self.kind, params, pseudo_gradient, state, self.lr, self.beta1, self.beta2, self.tau
        )
