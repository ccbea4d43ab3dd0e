"""From a scenario config to typed clients with their data partitions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedmtl.config import ClientGroup, RunConfig
from fedmtl.data.check import check_hint
from fedmtl.data.datasets import DATASETS, DenseDataset, build_dataset, one_line
from fedmtl.data.dominant import class_histogram, dominant_classes
from fedmtl.data.partition import MAX_DRAWS, partition_clients
from fedmtl.federated.spec import ClientSpec
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
        if synth.render_scale != 1:
            command += f" --render_scale {synth.render_scale}"
    return command


def train_split_size(cfg: RunConfig, dataset: str) -> int:
    spec = DATASETS.get(dataset)
    split_file = spec.split_file(cfg.data.resolved_root(), "train")
    if not spec.has_split(cfg.data.resolved_root(), "train"):
        raise FileNotFoundError(
            f"{dataset} training split not found: {split_file}. Point data.root (or $FEDMTL_DATA) at the "
            f"folder holding {spec.root_folder}/, or write synthetic data there: {synth_command(cfg, dataset)} "
            f"(expected layout: {one_line(spec.dataset_class.tree)}); {check_hint(cfg.data.resolved_root())}"
        )
    return len(spec.split_ids(cfg.data.resolved_root(), "train"))


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


class TrainedImages:
    """The images a client trains on, of its training indices: all of them, except where its
    dataset keeps a subset for its tasks (a human_parts-only client on PASCAL-Context keeps
    the images showing a person, as ``data.human_parts_selection`` says). Such a dataset is
    read once per (dataset, tasks); its subsets cost only what they select."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._datasets: dict[tuple[str, tuple[str, ...]], DenseDataset] = {}

    def __call__(self, dataset: str, tasks: tuple[str, ...], indices: Sequence[int]) -> list[int]:
        if not DATASETS.get(dataset).dataset_class.keeps_subset(tasks):
            return list(indices)
        key = (dataset, tasks)
        if key not in self._datasets:
            root = self.cfg.data.resolved_root()
            try:
                self._datasets[key] = build_dataset(
                    dataset, root, "train", tasks=tasks, indices=[],
                    human_parts_selection=self.cfg.data.human_parts_selection,
                )  # fmt: skip
            except FileNotFoundError as err:  # a file of the split is missing (named)
                raise FileNotFoundError(f"{err}; {check_hint(root)}") from None
        return self._datasets[key].subset(indices, seed=0).split_indices


def too_small_error(cfg: RunConfig, name: str, assigned: int, trained: int, batch_size: int) -> str:
    """The error of a client left with fewer images than its batch size."""
    partitioner = cfg.data.partition
    shown = f"{trained} training images" + (
        f" (of its {assigned}, the ones its tasks have labels for)" if trained != assigned else ""
    )
    drawn = (
        f" in each of {MAX_DRAWS} draws of data.partition {type(partitioner).__name__}"
        if partitioner.random_sizes
        else ""
    )
    return (
        f"client {name} has {shown}, fewer than its batch size {batch_size}{drawn}: it would never take a "
        f"step (training loaders drop the last incomplete batch, as the public code does); {partitioner.fix()}"
    )


def build_clients(cfg: RunConfig) -> list[ClientSpec]:
    """The federation's clients (:func:`build_scenario`, without the held-out ones)."""
    return build_scenario(cfg)[0]


def build_scenario(cfg: RunConfig) -> tuple[list[ClientSpec], list[ClientSpec]]:
    """The federation's clients and the held-out ones: one client per task of a single-task
    group, one per multi-task group, times replicas.

    The training set of a dataset is split among its clients by ``data.partition`` (single-task
    and multi-task clients of a dataset each split it, as the public code does; held-out clients
    split it among themselves, so they leave the federation's parts as they are); every client
    must keep at least one batch of images it trains on, or a ValueError names it and the fix.
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
    partitioner = cfg.data.partition
    root = cfg.data.resolved_root()
    labels = {d: dominant_classes(d, root) for d in sizes} if partitioner.uses_labels else None
    trained = TrainedImages(cfg)

    def too_small(client: int, part: list[int]) -> bool:
        _, dataset, tasks, g = entries[client]
        return len(trained(dataset, tasks, part)) < cfg.clients[g].batch_size

    parts = partition_clients(
        [e[1] for e in entries],
        sizes,
        seed=cfg.seed,
        groups=[_partition_group(cfg.clients[e[3]]) for e in entries],
        partitioner=partitioner,
        labels=labels,
        too_small=too_small,
    )
    for client, part in enumerate(parts):
        if too_small(client, part):
            _, dataset, tasks, g = entries[client]
            kept = len(trained(dataset, tasks, part))
            raise ValueError(too_small_error(cfg, names[client], len(part), kept, cfg.clients[g].batch_size))
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
            group=g,
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


def class_histograms(
    cfg: RunConfig, specs: Sequence[ClientSpec], trained: TrainedImages | None = None
) -> list[dict[str, int] | None]:
    """Each client's images per dominant class (results.json's ``class_histogram``), counting
    the images it trains on (``trained``: a caller's TrainedImages, whose datasets it reuses);
    None for a client whose dataset's semseg labels cannot be read (a dataset on disk without
    them): the run's results do not depend on it."""
    root = cfg.data.resolved_root()
    trained = trained or TrainedImages(cfg)
    out: list[dict[str, int] | None] = []
    for spec in specs:
        try:
            classes = dominant_classes(spec.dataset, root)[
                trained(spec.dataset, spec.tasks, spec.train_indices)
            ]
        except (OSError, ValueError):  # a missing or unreadable label file
            out.append(None)
            continue
        out.append(class_histogram(spec.dataset, classes))
    return out
