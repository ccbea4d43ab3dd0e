"""The Gaussian mechanism and adaptive clipping of fedmtl.privacy.mechanisms, checked by hand."""

import math

import pytest
import torch

from fedmtl.privacy.mechanisms import (
    adaptive_clip_update,
    clip_factor,
    clip_vector,
    default_count_stddev,
    gaussian_noise,
    noisy_unclipped_fraction,
    update_noise_multiplier,
)


def test_clip_factor_by_hand():
    assert clip_factor(4.0, 2.0) == 0.5
    assert clip_factor(1.0, 2.0) == 1.0
    assert clip_factor(2.0, 2.0) == 1.0
    assert clip_factor(0.0, 2.0) == 1.0
    assert clip_factor(1e30, math.inf) == 1.0


@pytest.mark.parametrize("scale", [1e-3, 0.5, 3.0, 1e4])
def test_clipped_norm_within_clip(scale):
    clip = 1.0
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * scale
    clipped, norm = clip_vector(x, clip)
    assert norm == pytest.approx(float(x.double().norm()))
    clipped_norm = float(clipped.double().norm())
    if norm <= clip:
        assert clipped is x  # unchanged below C, bit for bit
    else:
        assert clipped_norm <= clip * (1 + 1e-6)
        assert clipped_norm == pytest.approx(clip, rel=1e-6)
        # direction kept
        assert torch.allclose(clipped / clipped_norm, x / norm, atol=1e-6)


def test_infinite_clip_is_identity():
    x = torch.randn(100) * 1e6
    clipped, _ = clip_vector(x, math.inf)
    assert clipped is x


def test_noise_std_of_the_mean():
    # DP-FedAvg: noise z·C on the sum of m clipped updates, so z·C/m on their mean.
    z, clip, m = 1.1, 0.7, 8
    std = z * clip / m
    draws = torch.stack([gaussian_noise(2_000, std, seed) for seed in range(50)])
    assert draws.dtype == torch.float32
    assert float(draws.double().std()) == pytest.approx(std, rel=0.03)
    assert abs(float(draws.double().mean())) < 3 * std / math.sqrt(draws.numel())


def test_zero_noise_is_zeros_without_a_draw():
    state = torch.random.get_rng_state()
    noise = gaussian_noise(17, 0.0, 5)
    assert noise.dtype == torch.float32 and torch.equal(noise, torch.zeros(17))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_noise_is_deterministic_and_independent_of_global_rng():
    torch.manual_seed(123)
    a = gaussian_noise(1000, 0.3, 42)
    torch.manual_seed(999)
    b = gaussian_noise(1000, 0.3, 42)
    assert torch.equal(a, b)
    assert not torch.equal(a, gaussian_noise(1000, 0.3, 43))


def test_negative_noise_std_refused():
    with pytest.raises(ValueError, match="standard deviation must be a finite number >= 0"):
        gaussian_noise(3, -1.0, 0)


def test_adaptive_clip_update_by_hand():
    # γ = 0.5, η = 0.2, b̄ = 0.8: C·exp(−0.2·0.3) = C·exp(−0.06)
    assert adaptive_clip_update(2.0, 0.8, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.06), rel=1e-15)
    # fewer unclipped than the target: C grows
    assert adaptive_clip_update(2.0, 0.1, 0.5, 0.2) == pytest.approx(2.0 * math.exp(0.08), rel=1e-15)
    assert adaptive_clip_update(2.0, 0.5, 0.5, 0.2) == 2.0


def test_noisy_unclipped_fraction_mean_and_std():
    unclipped, clients, sigma = 6, 10, 0.5
    values = torch.tensor([noisy_unclipped_fraction(unclipped, clients, sigma, s) for s in range(4000)])
    assert float(values.mean()) == pytest.approx(0.6, abs=3 * sigma / clients / math.sqrt(4000))
    assert float(values.std()) == pytest.approx(sigma / clients, rel=0.05)
    assert noisy_unclipped_fraction(6, 10, sigma, 7) == noisy_unclipped_fraction(6, 10, sigma, 7)
    assert noisy_unclipped_fraction(6, 10, sigma, 7) != noisy_unclipped_fraction(6, 10, sigma, 8)
    assert noisy_unclipped_fraction(6, 10, 0.0, 7) == 0.6


def test_noisy_unclipped_fraction_needs_clients():
    with pytest.raises(ValueError, match="at least one client"):
        noisy_unclipped_fraction(0, 0, 1.0, 0)


def test_update_noise_multiplier_by_hand():
    # z = 1, σ_b = 1: (1 − 1/4)^(-1/2) = 2/√3
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(2 / math.sqrt(3), rel=1e-15)
    # z = 0.5, σ_b = 0.5: (4 − 1)^(-1/2) = 1/√3
    assert update_noise_multiplier(0.5, 0.5) == pytest.approx(1 / math.sqrt(3), rel=1e-15)
    assert update_noise_multiplier(0.0, 0.0) == 0.0
    # the count's noise always costs some of the update's: z_Δ > z
    assert update_noise_multiplier(1.0, 100.0) > 1.0


def test_update_noise_multiplier_refuses_too_little_count_noise():
    with pytest.raises(ValueError) as error:
        update_noise_multiplier(1.0, 0.5)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "privacy.adaptive_clip.count_stddev is 0.5 but must exceed noise_multiplier/2 = 0.5"
    )
    assert message.endswith("raise it")


def test_default_count_stddev():
    assert default_count_stddev(100) == 5.0
    assert default_count_stddev(10) == 0.5
