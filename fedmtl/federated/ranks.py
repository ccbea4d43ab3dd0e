"""What every rank does together: sums, and agreeing to go on or to stop.

Every rank runs the same rounds on its share of the clients. Where they meet (a sum of a
table, the end of a phase) they must all arrive, or the others hang: a rank that fails a
write, or receives SIGTERM / SIGINT, finishes its phase and then tells the others at the next
meeting (:meth:`Ranks.agree`), and they all stop there together.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

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

    def check_same_config(self, config: dict[str, Any], per_node: int) -> None:
        """Every rank was started with the same resolved config (``Namespace.as_dict()``), up to
        :data:`RANK_LOCAL`: a hash of each is gathered, and when they differ the configs
        themselves, so that the first process of each node refuses naming the first field that
        differs (ValueError; the CLI prints it, once per node's log) and the others stop silently (``per_node``: processes per node). Before the first round: ranks on other
        configs would train other scenarios, or wait for each other in different collectives."""
        if self.world == 1:
            return
        mine = shared_config(config)
        digest = int(hashlib.sha256(json.dumps(mine).encode()).hexdigest()[:15], 16)  # fits int64
        # The largest and (negated) smallest hash in one collective: equal when every rank agrees.
        pair = torch.tensor([digest, -digest], dtype=torch.int64, device=self.device)
        high, low = self.fabric.all_reduce(pair, reduce_op="max").tolist()
        if high == -low:
            return
        import torch.distributed as dist

        configs: list[Any] = [None] * self.world
        dist.all_gather_object(configs, mine)
        stopping.expect_children_exit()  # every rank exits 1 on purpose: the launcher says why
        if self.fabric.local_rank != 0:  # the first process of each node says why, in its log
            raise stopping.PeerFailed("the ranks' configs differ")
        raise ValueError(config_mismatch(configs, per_node))

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


#: Config fields that may differ between ranks: each node's own copy of the data and its
#: loading, its threads, and what only rank 0 uses (the loggers, the run directory's name as
#: that node mounts it).
RANK_LOCAL = ("run_dir", "data.root", "data.num_workers", "data.cache_mib", "cpu_threads", "logger")


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config as dotted fields; lists of mappings (the client groups) item by item."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        return {k: v for i, item in enumerate(tree) for k, v in _flat(item, f"{prefix}[{i}]").items()}
    return {prefix: tree}


def shared_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a resolved config every rank must agree on, flat, as JSON values."""
    flat = _flat(json.loads(json.dumps(config, default=str)))
    return {
        k: v
        for k, v in sorted(flat.items())
        if not k.startswith("__") and not any(k == f or k.startswith(f + ".") for f in RANK_LOCAL)
    }


def config_mismatch(configs: list[dict[str, Any]], per_node: int) -> str:
    """The refusal for ranks started with different :func:`shared_config`\\ s: the first rank
    that differs from rank 0 and the first field in which it does."""
    base = configs[0]

    def differing(other: dict[str, Any]) -> list[str]:
        return sorted(k for k in {*base, *other} if base.get(k, "(absent)") != other.get(k, "(absent)"))

    rank = next(r for r in range(1, len(configs)) if differing(configs[r]))
    other, fields = configs[rank], differing(configs[rank])
    field = fields[0]
    more = f" (and {len(fields) - 1} more field(s))" if len(fields) > 1 else ""

    def shown(config: dict[str, Any]) -> str:
        return repr(config[field]) if field in config else "(absent)"

    return (
        f"the processes of this run were started with different configs: {field} is {shown(base)} on rank 0 "
        f"and {shown(other)} on rank {rank} (node {rank // per_node}){more}. Start every process and node with "
        "the same config; nothing was trained (config.yaml holds rank 0's)"
    )
