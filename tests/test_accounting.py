"""ε from Opacus's accountants (fedmtl.privacy.accounting), against Opacus's own golden values.

The golden values are those of Opacus's test suite, pytorch/opacus
opacus/tests/accountants_test.py (AccountingTest; the file ships with opacus 1.6.0 too).
"""

import math

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from fedmtl.privacy.accounting import (
    ACCOUNTANTS,
    epsilon,
    epsilon_of_history,
    epsilon_per_round,
    noise_multiplier_for,
    rdp_epsilon_floor,
)

Z, Q, STEPS, DELTA = 1.5, 0.04, int(90 / 0.04), 1e-5  # accountants_test.py's case: 2250 steps


def test_rdp_golden_from_opacus():
    # test_rdp_accountant: assertAlmostEqual(epsilon, 7.32911117143), i.e. 7 places
    assert epsilon(Z, Q, STEPS, DELTA, "rdp") == pytest.approx(7.32911117143, abs=5e-8)


def test_prv_golden_from_opacus():
    # test_prv_accountant's 6.777395712150674 was computed with other numpy/scipy builds; the
    # PRV accountant guarantees its upper bound only to its eps_error, 0.01 by default.
    value = epsilon(Z, Q, STEPS, DELTA, "prv")
    assert value == pytest.approx(6.777395712150674, abs=0.01)
    assert value < epsilon(Z, Q, STEPS, DELTA, "rdp")  # PRV is the tighter of the two here


def test_noise_multiplier_golden_and_round_trip():
    # test_get_noise_multiplier_rdp_steps: 1.3562 to 4 places for ε = 8, q = 0.04, 2000 steps
    z = noise_multiplier_for(8.0, DELTA, Q, 2000, "rdp")
    assert z == pytest.approx(1.3562, abs=5e-5)
    # test_get_noise_multiplier_overshoot: the target is reached, not overshot
    reached = epsilon(z, Q, 2000, DELTA)
    assert reached <= 8.0
    assert reached > 8.0 - 0.01  # get_noise_multiplier's epsilon_tolerance


def test_epsilon_grows_with_steps_and_falls_with_noise():
    by_steps = [epsilon(1.0, 0.1, t, DELTA) for t in (1, 10, 100, 1000)]
    assert by_steps == sorted(by_steps) and len(set(by_steps)) == 4
    by_noise = [epsilon(z, 0.1, 100, DELTA) for z in (0.7, 1.0, 2.0, 5.0)]
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 4


@pytest.mark.parametrize("steps", [1, 40])
def test_full_participation_is_the_gaussian_mechanism(steps):
    # q = 1 is no subsampling: the Gaussian mechanism's RDP, α/(2z²) per step (Mironov 2017),
    # converted to (ε, δ) by the bound Opacus uses (Balle et al. 2020, Theorem 21).
    z = 2.0
    alphas = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    rdp = steps * alphas / (2 * z**2)
    by_hand = np.min(rdp - (math.log(DELTA) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas))
    assert epsilon(z, 1.0, steps, DELTA) == pytest.approx(float(by_hand), rel=1e-12)


def test_no_noise_is_infinite_and_no_steps_free():
    for accountant in ACCOUNTANTS:
        assert epsilon(0.0, 0.5, 10, DELTA, accountant) == math.inf
        assert epsilon(1.0, 0.5, 0, DELTA, accountant) == 0.0
    assert noise_multiplier_for(1.0, DELTA, 0.5, 0) == 0.0


def test_history_composes_and_per_round():
    whole = epsilon(1.2, 0.2, 30, DELTA)
    assert epsilon_of_history([(1.2, 0.2, 10), (1.2, 0.2, 20)], DELTA) == pytest.approx(whole, rel=1e-12)
    assert epsilon_of_history([(1.2, 0.2, 10), (0.0, 0.2, 1)], DELTA) == math.inf
    assert epsilon_of_history([], DELTA) == 0.0
    one = epsilon_per_round(1.2, 0.2, 3, DELTA)
    assert one == epsilon(1.2, 0.2, 3, DELTA)
    assert one < whole < 10 * one  # composition is sublinear


def test_unreachable_target_is_one_line():
    floor = rdp_epsilon_floor(DELTA)
    assert epsilon(1e6, 1.0, 100, DELTA) == pytest.approx(floor, rel=1e-6)  # what σ → ∞ reaches
    with pytest.raises(ValueError) as error:
        noise_multiplier_for(0.05, DELTA, 0.5, 100)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"privacy.target_epsilon 0.05 is below {floor:.4g}, the least ε the rdp accountant"
    )
    assert message.endswith("raise privacy.target_epsilon or privacy.delta, or set privacy.accountant prv")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.0, 0.0, 10, DELTA, "rdp"), "sampling rate must be in \\(0, 1\\]"),
        ((1.0, 1.5, 10, DELTA, "rdp"), "sampling rate must be in \\(0, 1\\]"),
        ((1.0, 0.5, -1, DELTA, "rdp"), "steps must be a whole number >= 0"),
        ((1.0, 0.5, 10, 0.0, "rdp"), "privacy.delta must be in \\(0, 1\\)"),
        ((1.0, 0.5, 10, DELTA, "gdp"), "privacy.accountant must be one of rdp, prv"),
        ((-1.0, 0.5, 10, DELTA, "rdp"), "privacy.noise_multiplier must be a finite number >= 0"),
    ],
)
def test_bad_arguments_refused(args, match):
    with pytest.raises(ValueError, match=match):
        epsilon(*args)
