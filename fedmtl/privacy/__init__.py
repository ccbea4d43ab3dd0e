"""Differential privacy and secure aggregation: the pure math the engine calls (docs/privacy.md)."""

from fedmtl.privacy.mechanisms import (
    adaptive_clip_update,
    clip_factor,
    clip_vector,
    default_count_stddev,
    gaussian_noise,
    noisy_unclipped_fraction,
    update_noise_multiplier,
)

__all__ = [
    "adaptive_clip_update",
    "clip_factor",
    "clip_vector",
    "default_count_stddev",
    "gaussian_noise",
    "noisy_unclipped_fraction",
    "update_noise_multiplier",
]
