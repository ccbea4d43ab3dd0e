"""ε of the subsampled Gaussian mechanism, from Opacus's accountants (docs/privacy.md).

Nothing here is a hand-written accountant: the RDP (Mironov et al.) and PRV (Gopi et al.)
accountants are Opacus's, fed a history of (noise multiplier, sampling rate, steps) directly,
so thousands of steps cost one evaluation rather than one per step. The sampling rate is the
Poisson rate the guarantee assumes: a client's participation probability per round for
client-level DP, a sample's per step for DP-SGD.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.analysis.rdp import get_privacy_spent
from opacus.accountants.utils import get_noise_multiplier

__all__ = [
    "ACCOUNTANTS",
    "epsilon",
    "epsilon_of_history",
    "epsilon_per_round",
    "noise_multiplier_for",
    "rdp_epsilon_floor",
]

ACCOUNTANTS = ("rdp", "prv")


def _check(sample_rate: float, steps: int, delta: float, accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    if not (0 < sample_rate <= 1):
        raise ValueError(f"the sampling rate must be in (0, 1], got {sample_rate!r}")
    if steps < 0 or int(steps) != steps:
        raise ValueError(f"the number of steps must be a whole number >= 0, got {steps!r}")
    if not (0 < delta < 1):
        raise ValueError(f"privacy.delta must be in (0, 1), got {delta!r}")


def epsilon_of_history(
    history: Sequence[tuple[float, float, int]], delta: float, accountant: str = "rdp"
) -> float:
    """ε for δ after the compositions in history, each (noise multiplier, sampling rate, steps)
    (a run whose rate or multiplier changed between rounds). Any step with multiplier 0 gives inf."""
    history = [(float(z), float(q), int(t)) for z, q, t in history if t > 0]
    for z, q, t in history:
        _check(q, t, delta, accountant)
        if not (math.isfinite(z) and z >= 0):
            raise ValueError(f"privacy.noise_multiplier must be a finite number >= 0, got {z!r}")
    if not history:
        return 0.0
    if any(z == 0 for z, _, _ in history):
        return math.inf
    counter = create_accountant(mechanism=accountant)
    counter.history = history
    # Opacus warns when the best RDP order is at the end of its grid (the bound is still valid,
    # only looser), and PRV's numpy overflows at rate 1 are handled by its truncation: neither
    # is the user's to act on.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.filterwarnings("ignore", message="Optimal order is the")
        value = float(counter.get_epsilon(delta=delta))
    return math.inf if math.isnan(value) else value


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """ε for δ after steps compositions of the Gaussian mechanism of multiplier
    noise_multiplier, each on a Poisson sample of rate sample_rate. 0 steps: 0.0; z = 0: inf."""
    _check(sample_rate, steps, delta, accountant)
    return epsilon_of_history([(noise_multiplier, sample_rate, steps)], delta, accountant)


def epsilon_per_round(
    noise_multiplier: float, sample_rate: float, steps_per_round: int, delta: float, accountant: str = "rdp"
) -> float:
    """ε of one round alone (steps_per_round compositions); the run's cumulative ε is
    epsilon(..., rounds·steps_per_round, ...), less than rounds times this one."""
    return epsilon(noise_multiplier, sample_rate, steps_per_round, delta, accountant)


def rdp_epsilon_floor(delta: float) -> float:
    """The ε the RDP accountant reports as the noise grows without bound: its conversion from
    RDP to (ε, δ) over Opacus's orders (up to 63) costs this much even at zero RDP."""
    alphas = RDPAccountant.DEFAULT_ALPHAS
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the")
        return float(get_privacy_spent(orders=alphas, rdp=np.zeros(len(alphas)), delta=delta)[0])


def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """The smallest noise multiplier (to Opacus's search tolerance of 0.01 in ε) whose ε after
    steps compositions at sample_rate stays within target_epsilon, by Opacus's
    get_noise_multiplier. 0 steps spend nothing: 0.0."""
    _check(sample_rate, steps, delta, accountant)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"privacy.target_epsilon must be a finite number > 0, got {target_epsilon!r}")
    if steps == 0:
        return 0.0
    floor = rdp_epsilon_floor(delta)
    if accountant == "rdp" and target_epsilon <= floor:
        # Refused at once: Opacus's search would spend minutes doubling σ towards 1e6 first.
        raise ValueError(
            f"privacy.target_epsilon {target_epsilon:g} is below {floor:.4g}, the least ε the rdp accountant "
            f"certifies for δ = {delta:g} at any noise: raise privacy.target_epsilon or privacy.delta, or set "
            "privacy.accountant prv"
        )
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.filterwarnings("ignore", message="Optimal order is the")
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    steps=int(steps),
                    accountant=accountant,
                )
            )
    except ValueError:  # Opacus: "The privacy budget is too low." (σ above 1e6 needed)
        raise ValueError(
            f"privacy.target_epsilon {target_epsilon:g} cannot be reached with δ = {delta:g} over {steps} steps "
            f"at sampling rate {sample_rate:g} (it would need a noise multiplier above 1e6): raise "
            "privacy.target_epsilon or privacy.delta, or run fewer rounds"
        ) from None
