"""What every rank does together: sums, and agreeing to go on or to stop.

Every rank runs the same rounds on its share of the clients. Where they meet (a sum of a
table, the end of a phase) they must all arrive, or the others hang: a rank that fails a
write, or receives SIGTERM / SIGINT, finishes its phase and then tells the others at the next
meeting (:meth:`Ranks.agree`), and they all stop there together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import lightning as L
import torch

from fedmtl.federated import stopping


class Ranks:
    """The Fabric processes of a run, as the engine uses them."""

    def __init__(self, fabric: L.Fabric) -> None:
        self.fabric = fabric
        self.rank = fabric.global_rank
        self.world = fabric.world_size
        self.device = fabric.device

    @property
    def is_zero(self) -> bool:
        """Whether this is the rank that prints and writes the run's shared files."""
        return self.rank == 0

    def sum(self, table: torch.Tensor) -> torch.Tensor:
        """``table`` summed over the ranks (each rank fills the rows of its own clients)."""
        return self.fabric.all_reduce(table, reduce_op="sum") if self.world > 1 else table

    def agree(
        self,
        failure: OSError | None = None,
        stop: bool = True,
        finished: bool = False,
        round_: int | None = None,
    ) -> None:
        """Every rank meets here. A write that failed on some rank (``failure``: this rank's)
        ends every rank's run: the lowest failing rank re-raises its error (the CLI prints it),
        the others stop silently. With ``stop``, a SIGTERM / SIGINT received by any rank stops
        them all (:class:`~fedmtl.federated.stopping.Stopped`; ``finished``: round ``round_``
        is done)."""
        signum = stopping.requested() if stop else 0
        failed = self.rank if failure is not None else self.world  # world: none
        if self.world > 1:  # one collective: a rank that stopped alone would hang the others
            flags = torch.tensor([signum, self.world - failed], device=self.device)
            flags = self.fabric.all_reduce(flags, reduce_op="max").tolist()
            signum, failed = int(flags[0]), self.world - int(flags[1])
        if (signum or failed < self.world) and self.is_zero:
            stopping.expect_children_exit()
        if failed < self.world:
            if failed == self.rank:
                raise failure  # type: ignore[misc]
            raise stopping.PeerFailed(f"rank {failed} failed")
        if signum:
            raise stopping.Stopped(signum, round_, finished)

    @contextlib.contextmanager
    def phase(
        self, stop: bool = True, undo: Callable[[], None] | None = None, round_: int | None = None
    ) -> Iterator[None]:
        """A part of a round that may end early (a stop request, a write that fails): every
        rank leaves it before the next collective, then they agree (:meth:`agree`); if they
        stop, rank 0 runs ``undo`` (removes what the part wrote)."""
        failure = None
        try:
            yield
        except stopping.Abandoned:
            stop = True
        except OSError as err:  # a full disk, or any file error one rank alone would stop on
            failure = err
        try:
            self.agree(failure, stop, round_=round_)
        except BaseException:
            if undo is not None and self.is_zero:
                undo()
            raise
