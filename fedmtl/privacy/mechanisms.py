"""The Gaussian mechanism of client-level DP and Andrew et al.'s adaptive clipping, as pure
functions (docs/privacy.md).

DP-FedAvg (McMahan et al. 2018) clips each client's update to an L2 norm C, adds Gaussian
noise of standard deviation z·C to the sum and divides by the number of sampled clients m, so
the mean carries noise of standard deviation z·C/m. Adaptive clipping (Andrew et al., NeurIPS
2021) moves C toward a quantile γ of the update norms, from a noisy count of the clients whose
update was not clipped; the noise on that count spends privacy too, so the update's noise
multiplier shrinks to keep the pair's spend equal to z alone.

Noise comes from a CPU torch.Generator seeded by the caller, so it is the same bits on every
machine and device count, and after a resume.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "adaptive_clip_update",
    "clip_factor",
    "clip_vector",
    "default_count_stddev",
    "gaussian_noise",
    "noisy_unclipped_fraction",
    "update_noise_multiplier",
]


def clip_factor(norm: float, clip: float) -> float:
    """The factor min(1, clip/norm) that brings an update of L2 norm `norm` within `clip`.

    A zero update and clip = inf give exactly 1.0, so clipping is then the identity, bit for bit.
    """
    if math.isinf(clip) or norm <= clip:
        return 1.0
    return clip / norm


def clip_vector(x: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """x scaled to L2 norm at most clip, and x's norm (float64, so a long vector's sum of
    squares does not lose precision). x is returned as is (the same tensor) when within clip."""
    norm = float(torch.linalg.vector_norm(x.detach().to(torch.float64)))
    factor = clip_factor(norm, clip)
    return (x if factor == 1.0 else x * factor), norm


def gaussian_noise(numel: int, std: float, seed: int) -> torch.Tensor:
    """float32 [numel] of N(0, std²) drawn from a CPU Generator seeded with seed.

    std 0 returns zeros without a draw, so adding it changes nothing, bit for bit.
    """
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"the noise's standard deviation must be a finite number >= 0, got {std!r}")
    if std == 0:
        return torch.zeros(numel, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator, dtype=torch.float32).mul_(std)


def adaptive_clip_update(
    clip: float, unclipped_fraction: float, target_quantile: float, clip_lr: float
) -> float:
    """Andrew et al.'s geometric update C·exp(−η(b̄ − γ)): C shrinks when more than the
    target quantile γ of the updates fit under it (b̄ > γ) and grows when fewer do."""
    return clip * math.exp(-clip_lr * (unclipped_fraction - target_quantile))


def noisy_unclipped_fraction(unclipped: int, clients: int, count_stddev: float, seed: int) -> float:
    """b̄ = (unclipped + N(0, σ_b²)) / clients: the privatised fraction of the round's clients
    whose update was not clipped (float64 noise from a Generator seeded with seed)."""
    if clients <= 0:
        raise ValueError(f"the fraction of unclipped updates needs at least one client, got {clients}")
    if count_stddev == 0:
        return unclipped / clients
    generator = torch.Generator().manual_seed(seed)
    noise = float(torch.randn(1, generator=generator, dtype=torch.float64)) * count_stddev
    return (unclipped + noise) / clients


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2), the noise multiplier of the updates' sum when the count
    of unclipped updates is released with noise σ_b (Andrew et al. 2021, Theorem 1): the two
    releases together spend what one Gaussian mechanism of multiplier z spends. z = 0 gives 0."""
    if noise_multiplier == 0:
        return 0.0
    if not 2 * count_stddev > noise_multiplier:
        raise ValueError(
            f"privacy.adaptive_clip.count_stddev is {count_stddev:g} but must exceed noise_multiplier/2 = "
            f"{noise_multiplier / 2:g} (the count's noise spends privacy too, leaving none for the update's): raise it"
        )
    return (noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5


def default_count_stddev(expected_clients: float) -> float:
    """σ_b = the expected number of clients per round / 20, Andrew et al.'s choice."""
    return expected_clients / 20
