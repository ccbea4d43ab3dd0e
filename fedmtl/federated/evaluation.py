"""Which clients an evaluation covers, and what it logs: per client, and per task across clients.

The engine evaluates (``Simulation.evaluate``); these are the pure parts around it, so that a
thousand clients stay readable: a seeded sample of clients at the evaluations before the last
(``evaluation.clients``), and the mean and standard deviation of each dataset's task over the
clients beside their own values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from fedmtl.seeds import derive_seed
from fedmtl.tasks import get_task

Table = Mapping[str, Mapping[str, float]]  # {client: {task: value}}


def sampled_clients(count: int | None, num_clients: int, seed: int, last: bool) -> list[int] | None:
    """The clients an evaluation covers: ``count`` of them, drawn once from ``seed`` (the same
    ones at every evaluation, so curves follow them), except at the ``last`` one; None: every
    client."""
    if count is None or count >= num_clients or last:
        return None
    return sorted(random.Random(derive_seed(seed, "evaluation", "clients")).sample(range(num_clients), count))


def task_summary(table: Table, datasets: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Per ``dataset/task``: the mean and (population) standard deviation of the metric over
    the clients in ``table`` whose value is a number, and how many they are (``datasets``:
    each client's dataset)."""
    values: dict[str, list[float]] = {}
    for client, metrics in table.items():
        for task, value in metrics.items():
            if not math.isnan(value):
                values.setdefault(f"{datasets[client]}/{task}", []).append(value)
    out = {}
    for key, numbers in values.items():
        mean = sum(numbers) / len(numbers)
        std = math.sqrt(sum((v - mean) ** 2 for v in numbers) / len(numbers))
        out[key] = {"mean": mean, "std": std, "clients": len(numbers)}
    return out


def logged_values(
    results: Mapping[str, Table], labels: Sequence[str], datasets: Mapping[str, str]
) -> dict[str, float]:
    """An evaluation's scalars: ``val/<client>/<task>_<metric>`` for the method's reported model
    (``val_<label>/...`` for its others), and ``val_mean/`` / ``val_std/<dataset>/<task>_<metric>``
    across clients."""
    values: dict[str, float] = {}
    for label, table in results.items():
        prefix = "val" if label == labels[0] else f"val_{label}"
        for name, metrics in table.items():
            for task, value in metrics.items():
                values[f"{prefix}/{name}/{task}_{get_task(task).metric_name}"] = value
        for key, stats in task_summary(table, datasets).items():
            metric = f"{key}_{get_task(key.split('/')[1]).metric_name}"
            values[f"{prefix}_mean/{metric}"] = stats["mean"]
            values[f"{prefix}_std/{metric}"] = stats["std"]
    return values
