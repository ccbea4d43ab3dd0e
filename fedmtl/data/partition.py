"""Random partition of a dataset's training images among its clients.

As in the public code (``utils.get_st_config`` / ``get_mt_config``): a random permutation of
the training indices cut into ``num_parts`` consecutive pieces with ``np.array_split``, so the
part sizes differ by at most one and no image is dropped.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def partition_indices(num_samples: int, num_parts: int, seed: int | Sequence[int]) -> list[list[int]]:
    """Split ``range(num_samples)`` at random into ``num_parts`` disjoint parts covering it.

    Sizes are ``num_samples // num_parts`` or one more (the first ``num_samples % num_parts``
    parts); each part is sorted. The same seed gives the same parts.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    if num_samples < num_parts:
        raise ValueError(f"cannot split {num_samples} samples into {num_parts} non-empty parts")
    permutation = np.random.default_rng(seed).permutation(num_samples)
    return [sorted(part.tolist()) for part in np.array_split(permutation, num_parts)]


def _group_seed(seed: int, key: str) -> list[int]:
    # A stable per-group stream: a group's parts do not depend on which other groups exist.
    return [seed, zlib.crc32(key.encode())]


def partition_clients(
    client_datasets: Sequence[str],
    sizes: Mapping[str, int],
    seed: int,
    groups: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Training indices of every client: the clients of a dataset split its training set.

    client_datasets: the dataset of each client, in client order.
    sizes: number of training images of each dataset.
    groups: optional group of each client; clients split a dataset per (dataset, group), so
        every group sees the whole training set. The public code partitions the single-task
        and the multi-task clients of a dataset separately: ``groups=["st", "st", "mt"]``.
        By default all clients of a dataset form one group (the paper's scenarios never put
        ST and MT clients on the same dataset, where both readings agree).
    """
    if groups is None:
        groups = [None] * len(client_datasets)
    if len(groups) != len(client_datasets):
        raise ValueError(f"{len(groups)} groups for {len(client_datasets)} clients")
    members: dict[tuple[str, Hashable], list[int]] = {}
    for client, key in enumerate(zip(client_datasets, groups)):
        members.setdefault(key, []).append(client)
    result: list[list[int]] = [[] for _ in client_datasets]
    for (dataset, group), clients in members.items():
        if dataset not in sizes:
            raise KeyError(f"no training size for dataset {dataset!r}; known: {', '.join(sorted(sizes))}")
        key = dataset if group is None else f"{dataset}/{group}"
        if sizes[dataset] < len(clients):
            raise ValueError(
                f"{dataset} has {sizes[dataset]} training images for {len(clients)} clients: every client "
                "needs at least one; use fewer clients (replicas) or more training images"
            )
        parts = partition_indices(sizes[dataset], len(clients), _group_seed(seed, key))
        for client, part in zip(clients, parts):
            result[client] = part
    return result
