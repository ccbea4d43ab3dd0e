"""From a scenario config to typed clients with their data partitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedmtl.config import ClientGroup, RunConfig
from fedmtl.data.check import check_hint
from fedmtl.data.datasets import DATASETS, one_line
from fedmtl.data.layout import read_split
from fedmtl.data.partition import partition_clients
from fedmtl.federated.client import ClientSpec
from fedmtl.seeds import derive_seed
from fedmtl.tasks import check_tasks


def synth_command(cfg: RunConfig, dataset: str) -> str:
    """The command that writes the synthetic data this config would read for ``dataset``."""
    spec = DATASETS.get(dataset)
    folder = Path(cfg.data.resolved_root()) / spec.root_folder
    command = f"fedmtl data synth --dataset {dataset} --root {folder}"
    synth = (cfg.data.synth or {}).get(dataset)
    if synth is not None:
        command += f" --num_train {synth.num_train} --num_val {synth.num_val} --seed {synth.seed}"
        command += f" --size [{synth.size[0]},{synth.size[1]}]"
    return command


def train_split_size(cfg: RunConfig, dataset: str) -> int:
    spec = DATASETS.get(dataset)
    split_file = spec.split_file(cfg.data.resolved_root(), "train")
    if not split_file.is_file():
        raise FileNotFoundError(
            f"{dataset} training split not found: {split_file}. Point data.root (or $FEDMTL_DATA) at the "
            f"folder holding {spec.root_folder}/, or write synthetic data there: {synth_command(cfg, dataset)} "
            f"(expected layout: {one_line(spec.dataset_class.tree)}); {check_hint(cfg.data.resolved_root())}"
        )
    return len(read_split(split_file))


def count_clients(cfg: RunConfig) -> int:
    """How many clients the federation has (without reading any data): one per task of a
    single-task group, one per multi-task group, times replicas; held-out groups are not in it."""
    return sum((len(g.tasks) if g.single_task else 1) * g.replicas for g in cfg.clients if not g.held_out)


def drawn_tasks(tasks: tuple[str, ...], k: int, seed: int, group: int, replica: int) -> tuple[str, ...]:
    """``k`` of ``tasks`` for one client (``clients[].tasks_per_client``), in the order of
    ``tasks``: a draw from the run's seed, the group's index and the replica, so it is the same in
    every process, on resume, and whatever the other groups are."""
    chosen = np.random.default_rng(derive_seed("tasks_per_client", seed, group, replica)).choice(
        len(tasks), size=k, replace=False
    )
    return tuple(tasks[i] for i in sorted(chosen))


def build_clients(cfg: RunConfig) -> list[ClientSpec]:
    """The federation's clients (:func:`build_scenario`, without the held-out ones)."""
    return build_scenario(cfg)[0]


def build_held_out(cfg: RunConfig) -> list[ClientSpec]:
    """The held-out clients (``clients[].held_out``), which join only after the last round."""
    return build_scenario(cfg)[1]


def build_scenario(cfg: RunConfig) -> tuple[list[ClientSpec], list[ClientSpec]]:
    """The federation's clients and the held-out ones: one client per task of a single-task
    group, one per multi-task group, times replicas.

    The training set of a dataset is split at random into equal parts among its clients
    (single-task and multi-task clients of a dataset each split it, as the public code does;
    held-out clients split it among themselves, so they leave the federation's parts as they
    are).
    """
    if not cfg.clients:
        raise ValueError("clients: the scenario needs at least one client group")
    entries: list[tuple[str, str, tuple[str, ...], int]] = []  # name, dataset, tasks, group index
    for g, group in enumerate(cfg.clients):
        if group.dataset not in DATASETS:
            raise ValueError(
                f"clients[{g}].dataset: unknown dataset {group.dataset!r}; known: {DATASETS.names()}"
            )
        try:
            tasks = check_tasks(group.dataset, group.tasks)
        except (KeyError, ValueError) as err:
            raise ValueError(f"clients[{g}].tasks: {err.args[0]}") from None
        for field_name in ("replicas", "local_epochs", "batch_size"):
            if getattr(group, field_name) < 1:
                raise ValueError(
                    f"clients[{g}].{field_name} must be at least 1, got {getattr(group, field_name)}"
                )
        for task_set in [(t,) for t in tasks] if group.single_task else [tasks]:
            for replica in range(group.replicas):
                learns = task_set
                if group.tasks_per_client is not None:  # a multi-task group: task_set is all its tasks
                    learns = drawn_tasks(tasks, group.tasks_per_client, cfg.seed, g, replica)
                name = f"{group.dataset}-{'+'.join(learns)}" + (f"-{replica}" if group.replicas > 1 else "")
                name += "-held-out" if group.held_out else ""  # never renames a federated client
                entries.append((name, group.dataset, learns, g))
    names = [e[0] for e in entries]
    for i, name in enumerate(names):  # two groups may produce the same name
        if names.count(name) > 1:
            names[i] = f"{name}-g{entries[i][3]}"
    sizes = {d: train_split_size(cfg, d) for d in sorted({e[1] for e in entries})}
    parts = partition_clients(
        [e[1] for e in entries],
        sizes,
        seed=cfg.seed,
        groups=[_partition_group(cfg.clients[e[3]]) for e in entries],
    )
    specs = [
        ClientSpec(
            name=name,
            dataset=dataset,
            tasks=tasks,
            local_epochs=cfg.clients[g].local_epochs,
            batch_size=cfg.clients[g].batch_size,
            loss_shards=cfg.clients[g].loss_shards,
            train_indices=tuple(part),
            optimizer=cfg.clients[g].optimizer,
            fine_tune_epochs=_fine_tune_epochs(cfg.clients[g]),
        )
        for name, (_, dataset, tasks, g), part in zip(names, entries, parts, strict=True)
    ]
    held_out = [cfg.clients[e[3]].held_out for e in entries]
    return (
        [s for s, out in zip(specs, held_out, strict=True) if not out],
        [s for s, out in zip(specs, held_out, strict=True) if out],
    )


def _fine_tune_epochs(group: ClientGroup) -> int | None:
    """A held-out group's fine-tuning epochs (its local epochs unless set); None if it is federated."""
    if not group.held_out:
        return None
    return group.local_epochs if group.fine_tune_epochs is None else group.fine_tune_epochs


def _partition_group(group: ClientGroup) -> str:
    """Which clients of a dataset split its training set together (partition_clients' groups)."""
    kind = "st" if group.single_task else "mt"
    return f"held_out/{kind}" if group.held_out else kind
