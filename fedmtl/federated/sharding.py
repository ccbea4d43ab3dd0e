"""Which device trains which client: balance the expected work, not the client count."""

from __future__ import annotations

from collections.abc import Sequence


def assign_clients(costs: Sequence[float], world_size: int) -> list[int]:
    """The rank of every client, balancing the summed cost per rank.

    Longest-processing-time-first: clients in decreasing cost each go to the least loaded
    rank (ties to the lower rank, so the result is deterministic). Within 4/3 of the optimal
    makespan, and exact for the paper's scenarios (one heavy MT client, several light ST ones).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    load = [0.0] * world_size
    ranks = [0] * len(costs)
    for client in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        ranks[client] = rank
        load[rank] += costs[client]
    return ranks
