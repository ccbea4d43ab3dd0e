"""Communication cost: the bytes each client sends to the server and receives from it in a round.

A method declares what goes over the wire (:class:`Exchange`, from ``Method.exchange``): named
messages, each carrying whole *parts* of the client's model (``encoder``, its ``decoders``, its
``heads``: :class:`fedmtl.models.MultiTaskModel`'s module attributes, never parameter-name
patterns). A part's size is that of its flat parameters (:class:`~fedmtl.aggregation.FlatLayout`,
parameters only: BatchNorm running statistics are buffers and never leave a client) in the
dtype the engine exchanges them in. Who sends and who receives in a round is given as explicit
sets of clients (:func:`senders_and_receivers`), so a new kind of client (unavailable, held out) is a
new rule there, not a change here.

Everything here is pure: numbers in, numbers out; the engine logs and sums them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedmtl.aggregation.base import ClientInfo
from fedmtl.aggregation.flat import FlatLayout

#: The parts of a client's model a message can carry: its encoder, its decoders (one per task)
#: and its heads (one per task).
PARTS = ("encoder", "decoders", "heads")

UP, DOWN = "up_bytes", "down_bytes"

Messages = Mapping[str, tuple[str, ...]]  # message (its pool in the logs) -> the parts it carries
Traffic = dict[str, tuple[int, int]]  # pool -> (bytes up, bytes down) of one client in one round


@dataclass(frozen=True)
class Exchange:
    """What every client sends to the server (``up``) and receives from it (``down``) in one
    round: messages by name (the pool they are counted under), each the parts of the client's
    model whose parameters it carries, e.g. FedAMP's ``down={"clouds": ("encoder", "decoders")}``."""

    up: Messages = field(default_factory=dict)
    down: Messages = field(default_factory=dict)

    def __post_init__(self) -> None:
        for direction in ("up", "down"):
            messages = {str(name): tuple(parts) for name, parts in getattr(self, direction).items()}
            for name, parts in messages.items():
                unknown = [part for part in parts if part not in PARTS]
                if not parts or unknown:
                    raise ValueError(
                        f"message {name!r} ({direction}) must carry one or more of {list(PARTS)}, got {list(parts)}"
                    )
            object.__setattr__(self, direction, messages)

    @classmethod
    def both_ways(cls, *parts: str) -> Exchange:
        """Each part sent up and received down as its own pool: what an aggregated pool costs."""
        messages = {part: (part,) for part in parts}
        return cls(up=messages, down=messages)

    @property
    def pools(self) -> list[str]:
        """The message names, up first, each once."""
        return list(dict.fromkeys([*self.up, *self.down]))


def part_bytes(
    clients: Sequence[ClientInfo],
    encoder: FlatLayout,
    decoder: FlatLayout,
    heads: Mapping[tuple[str, str], FlatLayout],
    dtype: torch.dtype,
) -> list[dict[str, int]]:
    """Each client's bytes of every part of its model, as flat ``dtype`` vectors: its encoder,
    its decoders (one ``decoder`` layout per task) and, where ``heads`` has the layout of each
    of its (dataset, task) heads, its heads (a head's shape depends on both)."""
    out = []
    for client in clients:
        sizes = {"encoder": encoder.nbytes(dtype), "decoders": len(client.tasks) * decoder.nbytes(dtype)}
        keys = [(client.dataset, task) for task in client.tasks]
        if all(key in heads for key in keys):
            sizes["heads"] = sum(heads[key].nbytes(dtype) for key in keys)
        out.append(sizes)
    return out


def senders_and_receivers(
    num_clients: int, trained: Collection[int] | None, receive_nothing: Collection[int]
) -> tuple[set[int], set[int]]:
    """(uploading, downloading) clients of a round: a client that trained (``trained`` None:
    every client) uploads, its update dropped or not; every other client downloads what the
    server gives it (its receipt), a non-participant included, except those that
    ``receive_nothing`` (a dropped update or an unavailable client keeps its state)."""
    everyone = set(range(num_clients))
    uploading = everyone if trained is None else set(trained)
    return uploading, everyone - set(receive_nothing)


def round_traffic(
    exchange: Exchange,
    sizes: Sequence[Mapping[str, int]],
    uploading: Collection[int],
    downloading: Collection[int],
) -> list[Traffic]:
    """Each client's (up, down) bytes per pool in one round: the parts ``exchange`` sends, at the
    client's ``sizes`` (:func:`part_bytes`), counted up for the ``uploading`` clients and down
    for the ``downloading`` ones. Every pool of the exchange is listed for every client (0 for a
    client that sent or received nothing)."""
    return [
        {
            pool: (
                _carried(exchange.up, pool, own, i) if i in uploading else 0,
                _carried(exchange.down, pool, own, i) if i in downloading else 0,
            )
            for pool in exchange.pools
        }
        for i, own in enumerate(sizes)
    ]


def _carried(messages: Messages, pool: str, sizes: Mapping[str, int], client: int) -> int:
    """The bytes of message ``pool`` (0 if ``messages`` has none) at one client's part ``sizes``."""
    parts = messages.get(pool, ())
    missing = [part for part in parts if part not in sizes]
    if missing:
        raise ValueError(
            f"message {pool!r} carries the {missing} of client {client}, whose size is not known"
        )
    return sum(sizes[part] for part in parts)


def traffic_values(names: Sequence[str], traffic: Sequence[Traffic]) -> dict[str, float]:
    """One round's scalars for metrics.csv and wandb: ``comm/<client>/{up,down}_bytes`` (over
    pools), ``comm/<pool>/{up,down}_bytes`` (over clients) and ``comm/{up,down}_bytes`` (all)."""
    values: dict[str, float] = {}
    for name, pools in zip(names, traffic, strict=True):
        _add(values, f"comm/{name}/", _total(pools.values()))
    for pools in traffic:
        for pool, sent in pools.items():
            _add(values, f"comm/{pool}/", sent)
    _add(values, "comm/", _total(sent for pools in traffic for sent in pools.values()))
    return values


def _total(sent: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(Σ up, Σ down) of (up, down) pairs."""
    up = down = 0
    for u, d in sent:
        up, down = up + u, down + d
    return up, down


def _add(values: dict[str, float], prefix: str, sent: tuple[int, int]) -> None:
    """Add (up, down) bytes to ``<prefix>up_bytes`` and ``<prefix>down_bytes``."""
    for key, amount in zip((UP, DOWN), sent, strict=True):
        values[prefix + key] = values.get(prefix + key, 0.0) + float(amount)


Totals = dict[str, dict[str, list[int]]]  # client -> pool -> [bytes up, bytes down], over rounds


def add_round(totals: Totals, names: Sequence[str], traffic: Sequence[Traffic]) -> None:
    """Add one round's traffic into the run's totals (in place)."""
    for name, pools in zip(names, traffic, strict=True):
        client = totals.setdefault(name, {})
        for pool, (up, down) in pools.items():
            counted = client.setdefault(pool, [0, 0])
            counted[0] += int(up)
            counted[1] += int(down)


def totals_summary(totals: Totals, rounds: int) -> dict[str, object]:
    """results.json's ``communication``: the bytes of the ``rounds`` rounds counted, per client
    by pool, per pool over clients, and in all (``up_bytes``, ``down_bytes``)."""
    clients = {
        name: {pool: {UP: up, DOWN: down} for pool, (up, down) in pools.items()}
        for name, pools in totals.items()
    }
    by_pool: dict[str, dict[str, int]] = {}
    for pools in clients.values():
        for pool, sent in pools.items():
            total = by_pool.setdefault(pool, {UP: 0, DOWN: 0})
            for key in (UP, DOWN):
                total[key] += sent[key]
    return {
        "rounds": rounds,
        UP: sum(p[UP] for p in by_pool.values()),
        DOWN: sum(p[DOWN] for p in by_pool.values()),
        "pools": by_pool,
        "clients": clients,
    }
