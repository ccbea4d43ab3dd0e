"""The parameters a round exchanges, as pools of flat rows: one kind of structure for all of them.

A pool is every row of one layout the server aggregates together: the encoders (a row per
client), the decoders (a row per client and task) or one head group (a row per client with
that task on that dataset, for a method that shares heads). Each rank holds its own clients'
rows, before training and as deltas, written in place as its clients finish; ``gather`` gives
every rank all of them in the pool's order, which is the order of the server's stacks
(:class:`~fedmtl.aggregation.RoundInput`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import lightning as L
import torch
from torch import Tensor, nn

from fedmtl.aggregation import FlatLayout

Part = Callable[[nn.Module, str], nn.Module]  # (model, task) -> the module a row flattens

#: The dtype of every exchanged row (and of a streamed round's row files): what a round's
#: communication cost counts, whatever the model's precision.
WIRE_DTYPE = torch.float32


def encoder_part(model: nn.Module, task: str) -> nn.Module:
    return model.encoder


def decoder_part(model: nn.Module, task: str) -> nn.Module:
    return model.decoders[task]


def head_part(model: nn.Module, task: str) -> nn.Module:
    return model.heads[task]


@dataclass
class Pool:
    """Rows ``owners`` (client, task) of ``layout``, in the server's order; this rank holds the
    rows of the clients ``ranks`` assigns to it, in the same order."""

    layout: FlatLayout
    owners: list[tuple[int, str]]  # an encoder row's task is ""
    part: Part
    ranks: Sequence[int]  # the rank of every client
    rank: int
    device: torch.device
    prev: Tensor = field(init=False)  # [rows on this rank, numel]
    delta: Tensor = field(init=False)
    _local: dict[int, list[tuple[int, str]]] = field(init=False, repr=False)  # client -> (row, task)

    def __post_init__(self) -> None:
        mine = [(i, task) for i, task in self.owners if self.ranks[i] == self.rank]
        self._local = {}
        for k, (i, task) in enumerate(mine):
            self._local.setdefault(i, []).append((k, task))
        # A client that is not loaded this round (it does not train, and the method does not
        # read every client) gives no rows: its start reads as NaN, so a server step that used
        # it for a row it does not keep would fail loudly (RoundOutput.decoders_kept), and its
        # delta as zero.
        self.prev = torch.full(
            (len(mine), self.layout.numel), torch.nan, device=self.device, dtype=WIRE_DTYPE
        )
        self.delta = torch.zeros(len(mine), self.layout.numel, device=self.device, dtype=WIRE_DTYPE)

    def rows_of(self, client: int) -> list[tuple[int, str]]:
        """(row on this rank, task) of each of ``client``'s rows."""
        return self._local.get(client, [])

    def row(self, client: int) -> tuple[Tensor, Tensor]:
        """(prev, delta) of the client's only row (a pool of one row per client: the encoders)."""
        [(k, _)] = self.rows_of(client)
        return self.prev[k], self.delta[k]

    def start(self, client: int, model: nn.Module) -> None:
        """The client's rows before training, with zero deltas (until :meth:`finish`)."""
        for k, task in self.rows_of(client):
            self.prev[k] = self.layout.flatten(self.part(model, task))
            self.delta[k] = 0

    def finish(self, client: int, model: nn.Module) -> None:
        """The client's deltas: its trained parameters minus its rows before training."""
        for k, task in self.rows_of(client):
            self.delta[k] = self.layout.flatten(self.part(model, task))
            self.delta[k] -= self.prev[k]

    def drop(self, client: int) -> None:
        """The client's update is dropped: zero deltas."""
        for k, _ in self.rows_of(client):
            self.delta[k] = 0

    def gather(self, fabric: L.Fabric) -> tuple[Tensor, Tensor]:
        """(prev, delta) of every row of the pool, in ``owners`` order, on every rank."""
        if fabric.world_size == 1:
            return self.prev, self.delta
        return self._gather(fabric, self.prev), self._gather(fabric, self.delta)

    def _gather(self, fabric: L.Fabric, local: Tensor) -> Tensor:
        # Ranks hold different numbers of rows, so each pads to the largest share.
        per_rank = [sum(1 for i, _ in self.owners if self.ranks[i] == r) for r in range(fabric.world_size)]
        padded = torch.zeros(max(per_rank), local.shape[1], device=local.device, dtype=local.dtype)
        padded[: len(local)] = local
        with warnings.catch_warnings():  # Lightning calls a torch API that warns on every rank
            warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
            gathered = fabric.all_gather(padded)  # [world, max rows, D]
        cursor = [0] * fabric.world_size
        out = []
        for i, _ in self.owners:
            rank = self.ranks[i]
            out.append(gathered[rank, cursor[rank]])
            cursor[rank] += 1
        return torch.stack(out)


@dataclass
class RoundPools:
    """A round's pools on this rank: the encoders (None in a streamed round: they go to row
    files), the decoders, and the head groups of a method that shares heads."""

    encoders: Pool | None
    decoders: Pool
    heads: list[Pool]

    def __iter__(self) -> Iterator[Pool]:
        if self.encoders is not None:
            yield self.encoders
        yield self.decoders
        yield from self.heads
