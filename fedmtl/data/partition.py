"""How the clients of a dataset split its training images: the config's ``data.partition``.

A partitioner is chosen as ``algorithm`` is, by class name (``--data.partition Dirichlet
--data.partition.alpha 0.1``, or ``{class_path: Dirichlet, init_args: {alpha: 0.1}}``), and
registered in :data:`PARTITIONERS` under that name. Its :meth:`Partitioner.split` is a pure
function of the number of images, each image's dominant class (for those that read labels)
and a numpy Generator; :func:`partition_clients` calls it once per (dataset, group) of clients
with a per-group seed, so a group's parts do not depend on which other groups exist.

- :class:`Uniform` (the default), as in the public code (``utils.get_st_config`` /
  ``get_mt_config``): a random permutation of the training indices cut into ``num_parts``
  consecutive pieces with ``np.array_split``, so the part sizes differ by at most one.
- :class:`Dirichlet`: label skew, the per-class Dirichlet split of Flower Datasets'
  ``DirichletPartitioner`` and FL-bench, over each image's dominant class.
- :class:`Quantity`: size skew, client sizes from a Dirichlet or a power law.
- :class:`Shards`: the pathological split of McMahan et al., a few classes per client.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import ClassVar, TypeVar

import numpy as np

from fedmtl.registry import Registry
from fedmtl.seeds import derive_seed

#: The dominant class of an image without any foreground pixel: a bucket of its own.
NO_FOREGROUND = -1

#: Draws of a skewed partition before a client too small for its batch is an error.
MAX_DRAWS = 10

Parts = list[np.ndarray]  # one array of image indices per client


def _check_positive(name: str, value: float, fix: str) -> None:
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0):  # NaN fails too
        raise ValueError(f"data.partition.{name} must be a finite number > 0, got {value!r}{fix}")


class Partitioner:
    """How the clients of one (dataset, group) split its training images.

    A subclass implements :meth:`split`; one that reads each image's dominant class sets
    ``uses_labels``. ``random_sizes``: its part sizes (or contents) depend on the draw, so a
    draw that leaves a client below its batch size is drawn again (up to :data:`MAX_DRAWS`).
    """

    uses_labels: ClassVar[bool] = False
    random_sizes: ClassVar[bool] = True

    def split(
        self, num_samples: int, num_parts: int, labels: np.ndarray | None, rng: np.random.Generator
    ) -> Parts:
        """``num_parts`` disjoint arrays of indices of ``range(num_samples)`` covering it.
        ``labels``: each image's dominant class (:data:`NO_FOREGROUND` for none), given when
        ``uses_labels``."""
        raise NotImplementedError

    def fix(self) -> str:
        """How a user gets larger clients with this partitioner (for the too-small error)."""
        return "use fewer clients (replicas) or lower clients[].batch_size"

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({options})"

    def __eq__(self, other: object) -> bool:
        # Two configs that name the same partition with the same options are equal configs.
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))


PARTITIONERS: Registry[type[Partitioner]] = Registry("partition")

PartitionerT = TypeVar("PartitionerT", bound=type[Partitioner])


def register_partitioner(cls: PartitionerT) -> PartitionerT:
    """Class decorator: register a :class:`Partitioner` subclass under its class name."""
    if not (isinstance(cls, type) and issubclass(cls, Partitioner)):
        raise TypeError(f"only Partitioner subclasses can be registered, got {cls!r}")
    PARTITIONERS.add(cls.__name__, cls)
    return cls


def cut(order: np.ndarray, sizes: Sequence[int]) -> Parts:
    """``order`` cut into consecutive pieces of ``sizes`` (which sum to its length)."""
    return np.split(order, np.cumsum(sizes)[:-1])


def apportion(proportions: np.ndarray, total: int) -> np.ndarray:
    """Integer sizes summing to ``total`` in the given proportions: floors, then the largest
    remainders get one more (ties to the first)."""
    exact = proportions / proportions.sum() * total
    sizes = np.floor(exact).astype(np.int64)
    remainder = exact - sizes
    sizes[np.argsort(-remainder, kind="stable")[: total - int(sizes.sum())]] += 1
    return sizes


@register_partitioner
class Uniform(Partitioner):
    """Equal random parts (the public code's split, the default): sizes differ by at most one,
    the first ``num_samples % num_parts`` parts get one more."""

    random_sizes = False

    def split(self, num_samples, num_parts, labels, rng):
        return list(np.array_split(rng.permutation(num_samples), num_parts))


@register_partitioner
class Dirichlet(Partitioner):
    """Label skew: for every dominant class, its images are shared among the clients in
    proportions drawn from Dirichlet(alpha, ..., alpha) (Flower Datasets'
    DirichletPartitioner, FL-bench). Images without foreground are one more class.

    Args:
        alpha: concentration, > 0: small (0.1) gives each client few classes and uneven sizes;
            large (100) approaches the uniform split.
    """

    uses_labels = True

    def __init__(self, alpha: float = 0.5) -> None:
        _check_positive("alpha", alpha, " (smaller: more label skew; 0.5 is common, 100 is near uniform)")
        self.alpha = float(alpha)

    def split(self, num_samples, num_parts, labels, rng):
        members: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
        for cls in np.unique(labels):
            images = rng.permutation(np.flatnonzero(labels == cls))
            shares = rng.dirichlet(np.full(num_parts, self.alpha))
            cuts = (np.cumsum(shares)[:-1] * len(images)).astype(np.int64)
            for client, piece in enumerate(np.split(images, cuts)):
                members[client].append(piece)
        return [np.concatenate(pieces) for pieces in members]

    def fix(self) -> str:
        return (
            f"raise data.partition.alpha (now {self.alpha:g}), use fewer clients (replicas) or lower "
            "clients[].batch_size"
        )


QUANTITY_DISTRIBUTIONS = ("dirichlet", "power_law")


@register_partitioner
class Quantity(Partitioner):
    """Size skew: client sizes drawn, images otherwise assigned at random.

    Args:
        distribution: dirichlet: size shares from Dirichlet(alpha, ..., alpha); power_law: the
            client of rank r (a random order) gets a share proportional to r ** -exponent.
        alpha: the Dirichlet's concentration, > 0 (smaller: more uneven sizes).
        exponent: the power law's exponent, > 0 (larger: more uneven sizes).
    """

    def __init__(self, distribution: str = "dirichlet", alpha: float = 0.5, exponent: float = 1.0) -> None:
        if distribution not in QUANTITY_DISTRIBUTIONS:
            raise ValueError(
                f"data.partition.distribution must be {' or '.join(QUANTITY_DISTRIBUTIONS)}, got "
                f"{distribution!r} (dirichlet: shares from Dirichlet(alpha); power_law: rank ** -exponent)"
            )
        _check_positive("alpha", alpha, " (the Dirichlet's concentration; smaller: more uneven sizes)")
        _check_positive("exponent", exponent, " (the power law's; larger: more uneven sizes)")
        self.distribution = distribution
        self.alpha = float(alpha)
        self.exponent = float(exponent)

    def shares(self, num_parts: int, rng: np.random.Generator) -> np.ndarray:
        if self.distribution == "dirichlet":
            return rng.dirichlet(np.full(num_parts, self.alpha))
        return rng.permutation(np.arange(1, num_parts + 1, dtype=np.float64) ** -self.exponent)

    def split(self, num_samples, num_parts, labels, rng):
        sizes = apportion(self.shares(num_parts, rng), num_samples)
        return cut(rng.permutation(num_samples), sizes)

    def fix(self) -> str:
        option = (
            "raise data.partition.alpha"
            if self.distribution == "dirichlet"
            else "lower data.partition.exponent"
        )
        return f"{option}, use fewer clients (replicas) or lower clients[].batch_size"


@register_partitioner
class Shards(Partitioner):
    """Pathological label skew (McMahan et al. 2017): the images sorted by dominant class (in a
    random order within a class) are cut into ``num_parts * shards_per_client`` equal shards,
    and each client gets ``shards_per_client`` of them at random, so it sees few classes.

    Args:
        shards_per_client: shards each client gets (at least 1; 2 in the paper).
    """

    uses_labels = True

    def __init__(self, shards_per_client: int = 2) -> None:
        if (
            isinstance(shards_per_client, bool)
            or not isinstance(shards_per_client, int)
            or shards_per_client < 1
        ):
            raise ValueError(
                f"data.partition.shards_per_client must be an integer >= 1, got {shards_per_client!r} "
                "(each client gets this many shards of one class or two; 2 in McMahan et al.)"
            )
        self.shards_per_client = shards_per_client

    def split(self, num_samples, num_parts, labels, rng):
        shuffled = rng.permutation(num_samples)
        by_class = shuffled[np.argsort(labels[shuffled], kind="stable")]
        shards = np.array_split(by_class, num_parts * self.shards_per_client)
        dealt = rng.permutation(len(shards)).reshape(num_parts, self.shards_per_client)
        return [np.concatenate([shards[s] for s in row]) for row in dealt]

    def fix(self) -> str:
        return "use fewer clients (replicas) or lower clients[].batch_size"


def partition_indices(num_samples: int, num_parts: int, seed: int | Sequence[int]) -> list[list[int]]:
    """Split ``range(num_samples)`` at random into ``num_parts`` disjoint parts covering it
    (:class:`Uniform`). Sizes are ``num_samples // num_parts`` or one more (the first
    ``num_samples % num_parts`` parts); each part is sorted. The same seed gives the same parts.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    if num_samples < num_parts:
        raise ValueError(f"cannot split {num_samples} samples into {num_parts} non-empty parts")
    parts = Uniform().split(num_samples, num_parts, None, np.random.default_rng(seed))
    return [sorted(part.tolist()) for part in parts]


def _group_seed(seed: int, key: str, draw: int) -> int | list[int]:
    # A stable per-group stream: a group's parts do not depend on which other groups exist.
    # The first draw keeps the seed of fedmtl's first (uniform) partitions, bit for bit.
    return [seed, zlib.crc32(key.encode())] if draw == 0 else derive_seed("partition", seed, key, draw)


def partition_clients(
    client_datasets: Sequence[str],
    sizes: Mapping[str, int],
    seed: int,
    groups: Sequence[Hashable] | None = None,
    partitioner: Partitioner | None = None,
    labels: Mapping[str, np.ndarray] | None = None,
    too_small: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """Training indices of every client (each sorted): the clients of a dataset split its
    training set with ``partitioner`` (default :class:`Uniform`).

    client_datasets: the dataset of each client, in client order.
    sizes: number of training images of each dataset.
    groups: optional group of each client; clients split a dataset per (dataset, group), so
        every group sees the whole training set. The public code partitions the single-task
        and the multi-task clients of a dataset separately: ``groups=["st", "st", "mt"]``.
        By default all clients of a dataset form one group (the paper's scenarios never put
        ST and MT clients on the same dataset, where both readings agree).
    labels: dataset -> each training image's dominant class, for a partitioner that
        ``uses_labels``.
    too_small: ``(client, indices) -> bool``, whether a client would train on too few images;
        a partitioner with ``random_sizes`` draws the group again (up to :data:`MAX_DRAWS`
        draws, with seeds derived from the run's) until no client of it is. The last draw is
        returned either way: the caller names the client that is still too small.
    """
    partitioner = partitioner or Uniform()
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
        if sizes[dataset] < len(clients):
            raise ValueError(
                f"{dataset} has {sizes[dataset]} training images for {len(clients)} clients: every client "
                "needs at least one; use fewer clients (replicas) or more training images"
            )
        dataset_labels = None
        if partitioner.uses_labels:
            dataset_labels = np.asarray(labels[dataset])  # type: ignore[index]
            if len(dataset_labels) != sizes[dataset]:
                raise ValueError(f"{len(dataset_labels)} labels for the {sizes[dataset]} images of {dataset}")
        key = dataset if group is None else f"{dataset}/{group}"
        draws = MAX_DRAWS if partitioner.random_sizes and too_small is not None else 1
        for draw in range(draws):
            rng = np.random.default_rng(_group_seed(seed, key, draw))
            parts = [
                sorted(p.tolist())
                for p in partitioner.split(sizes[dataset], len(clients), dataset_labels, rng)
            ]
            if too_small is None or not any(too_small(c, p) for c, p in zip(clients, parts)):
                break
        for client, part in zip(clients, parts):
            result[client] = part
    return result
