"""Server-side aggregation: flat parameter layouts, the aggregator API, and the aggregators.

Importing this package registers every aggregator in ``AGGREGATORS`` and makes each one
importable from here, so a config's ``class_path: FedAvg`` resolves.
"""

from fedmtl.aggregation.base import (
    AGGREGATORS,
    Aggregator,
    ClientInfo,
    RoundInput,
    RoundOutput,
    create_aggregator,
    decoder_owners_of,
    register_aggregator,
)
from fedmtl.aggregation.fedavg import FedAvg
from fedmtl.aggregation.fedhca2 import FedHCA2
from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.functional import (
    conflict_averse_coefficients,
    conflict_averse_update,
    conflict_averse_weights,
    cross_attention_update,
    cross_attention_update_flat,
    gram_matrix,
    mean_rows,
)
from fedmtl.aggregation.local import Local

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "ClientInfo",
    "FedAvg",
    "FedHCA2",
    "FlatLayout",
    "Local",
    "RoundInput",
    "RoundOutput",
    "conflict_averse_coefficients",
    "conflict_averse_update",
    "conflict_averse_weights",
    "create_aggregator",
    "cross_attention_update",
    "cross_attention_update_flat",
    "decoder_owners_of",
    "gram_matrix",
    "mean_rows",
    "register_aggregator",
]
