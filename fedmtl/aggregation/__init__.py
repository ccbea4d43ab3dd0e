"""Server-side aggregation math: flat parameter layouts, the round's inputs and outputs, the
aggregator contract, and pure functions over stacked flat parameters.

Methods (``fedmtl.methods``) are aggregators with client-side behaviour; this package knows
nothing of models or clients beyond their flat parameters.
"""

from fedmtl.aggregation.base import (
    Aggregator,
    ClientInfo,
    HeadGroup,
    RoundInput,
    RoundOutput,
    decoder_owners_of,
    head_groups_of,
)
from fedmtl.aggregation.feddea import feddea_k, feddea_mask
from fedmtl.aggregation.fedopt import ServerOptimizer, fedopt_init_state, fedopt_step
from fedmtl.aggregation.flat import FlatLayout, parameter_layers
from fedmtl.aggregation.functional import (
    conflict_averse_coefficients,
    conflict_averse_update,
    conflict_averse_weights,
    cosine_clusters,
    cross_attention_update,
    cross_attention_update_flat,
    fedamp_weights,
    gram_matrix,
    group_means,
    group_means_to,
    heuristic_fedamp_weights,
    mean_rows,
    mix_rows,
    squared_distances,
)

__all__ = [
    "Aggregator",
    "ClientInfo",
    "FlatLayout",
    "HeadGroup",
    "RoundInput",
    "RoundOutput",
    "ServerOptimizer",
    "conflict_averse_coefficients",
    "conflict_averse_update",
    "conflict_averse_weights",
    "cosine_clusters",
    "cross_attention_update",
    "cross_attention_update_flat",
    "decoder_owners_of",
    "fedamp_weights",
    "feddea_k",
    "feddea_mask",
    "fedopt_init_state",
    "fedopt_step",
    "gram_matrix",
    "group_means",
    "group_means_to",
    "head_groups_of",
    "heuristic_fedamp_weights",
    "mean_rows",
    "mix_rows",
    "parameter_layers",
    "squared_distances",
]
