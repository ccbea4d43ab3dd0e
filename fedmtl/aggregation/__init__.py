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
from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.functional import mean_rows
from fedmtl.aggregation.local import Local

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "ClientInfo",
    "FedAvg",
    "FlatLayout",
    "Local",
    "RoundInput",
    "RoundOutput",
    "create_aggregator",
    "decoder_owners_of",
    "mean_rows",
    "register_aggregator",
]
