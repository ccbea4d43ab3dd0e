"""Differential privacy and secure aggregation: the pure math the engine calls (docs/privacy.md)."""

from fedmtl.privacy.accounting import (
    ACCOUNTANTS,
    epsilon,
    epsilon_of_history,
    epsilon_per_round,
    noise_multiplier_for,
    rdp_epsilon_floor,
)
from fedmtl.privacy.mechanisms import (
    adaptive_clip_update,
    clip_factor,
    clip_vector,
    default_count_stddev,
    gaussian_noise,
    noisy_unclipped_fraction,
    update_noise_multiplier,
)
from fedmtl.privacy.secagg import (
    FRACTION_BITS,
    MASK_CHUNK,
    RING_BITS,
    check_range,
    dequantise,
    masked_input,
    pair_mask,
    quantisation_bound,
    quantise,
    secure_sum,
    unmasked_sum,
)

__all__ = [
    "FRACTION_BITS",
    "MASK_CHUNK",
    "RING_BITS",
    "check_range",
    "dequantise",
    "masked_input",
    "pair_mask",
    "quantisation_bound",
    "quantise",
    "secure_sum",
    "unmasked_sum",
    "ACCOUNTANTS",
    "epsilon",
    "epsilon_of_history",
    "epsilon_per_round",
    "noise_multiplier_for",
    "rdp_epsilon_floor",
    "adaptive_clip_update",
    "clip_factor",
    "clip_vector",
    "default_count_stddev",
    "gaussian_noise",
    "noisy_unclipped_fraction",
    "update_noise_multiplier",
]
