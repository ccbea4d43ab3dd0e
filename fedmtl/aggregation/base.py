"""The server's aggregation API: what it receives in a round, what it returns, and the base class.

An aggregator is a function of flat parameters (plus its own server state, e.g. FedHCA²'s
hyper weights). It returns the new parameters of every client encoder and every decoder and
never touches a model: the engine flattens the models into a :class:`RoundInput` and writes
the :class:`RoundOutput` back with :meth:`FlatLayout.assign`. Decoders and heads come stacked;
a method's one server step (``Method.server_step``) reads the encoders as rows, a block of
columns at a time (:mod:`fedmtl.aggregation.stream`), and ``Method.aggregate`` runs it on
encoder stacks. Heads stay local
(the HC-FMTL setting: docs/index.md, "The setting"), except in the unified-model setting of FedDEA, where a method
that asks for them (``Method.shares_heads``) also gets each (dataset, task)'s heads as a
:class:`HeadGroup`.

Every federated method (``fedmtl.methods``) is an aggregator plus its client behaviour; this
module only knows the server side.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.stream import EncoderMix


@dataclass(frozen=True)
class ClientInfo:
    """What the server knows about a client: who it is, its domain and tasks, how much data.

    Clients with equal ``dataset`` and the same set of ``tasks`` form a homogeneous group.
    """

    name: str
    dataset: str
    tasks: tuple[str, ...]  # in the client's model order; its decoders follow this order
    num_samples: int  # training samples; FedAvg(weighted=True) weighs by it

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if not self.tasks:
            raise ValueError(f"client {self.name!r} has no tasks")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"client {self.name!r} lists a task twice: {list(self.tasks)}")
        if (
            isinstance(self.num_samples, bool)
            or not isinstance(self.num_samples, int)
            or self.num_samples < 0
        ):
            raise ValueError(
                f"client {self.name!r}: num_samples must be an int >= 0, got {self.num_samples!r}"
            )


def decoder_owners_of(clients: Sequence[ClientInfo]) -> list[tuple[int, str]]:
    """The fixed decoder order: (client index, task), by client, then the client's task order."""
    return [(i, task) for i, client in enumerate(clients) for task in client.tasks]


@dataclass
class HeadGroup:
    """The heads of one task on one dataset, across the clients that have it: they share a
    layout (a head's output channels depend on both), so they can be stacked and averaged.

    Only exchanged for methods that aggregate heads (the unified-model setting); rows follow
    ``owners``, the owning clients in ascending order.
    """

    dataset: str
    task: str
    layout: FlatLayout
    owners: list[int]  # client indices, ascending
    prev: Tensor  # [len(owners), H]
    deltas: Tensor  # [len(owners), H]

    def __post_init__(self) -> None:
        self.owners = [int(i) for i in self.owners]
        if not self.owners or self.owners != sorted(set(self.owners)):
            raise ValueError(
                f"head group {self.key}: owners must be sorted, unique and non-empty, got {self.owners}"
            )
        try:
            _check_pair("heads", self.prev, self.deltas, len(self.owners), "owners", self.layout)
        except (TypeError, ValueError) as err:
            raise type(err)(f"head group {self.key}: {err}") from None

    @property
    def key(self) -> str:
        """``dataset/task``: the group's name in logs and in server state."""
        return f"{self.dataset}/{self.task}"


def head_groups_of(clients: Sequence[ClientInfo]) -> list[tuple[str, str, list[int]]]:
    """The fixed head-group order: (dataset, task, owning clients), by first owner, then the
    owner's task order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, client in enumerate(clients):
        for task in client.tasks:
            groups.setdefault((client.dataset, task), []).append(i)
    return [(dataset, task, owners) for (dataset, task), owners in groups.items()]


@dataclass
class RoundInput:
    """What the server receives in one round, as stacked flat vectors (the encoders only for
    ``Method.aggregate``: the server step itself reads them as rows).

    N clients, P encoder parameters, K = Σ|T_i| decoders, Q decoder parameters (every
    decoder has the same layout). ``*_prev`` are θ^(r-1), the parameters the clients started
    the round from; ``*_deltas`` are Δθ^(r) = θ' − θ^(r-1) after local training.
    """

    round: int  # 1-based
    clients: list[ClientInfo]  # N
    encoder_layout: FlatLayout
    encoders_prev: Tensor | None  # [N, P]; None for the server step (it reads rows)
    encoder_deltas: Tensor | None  # [N, P]; None for the server step (it reads rows)
    decoder_layout: FlatLayout
    decoder_owners: list[tuple[int, str]]  # K (client index, task); see decoder_owners_of
    decoders_prev: Tensor  # [K, Q]
    decoder_deltas: Tensor  # [K, Q]
    # Clients that trained this round (sorted); None: all. The others' rows hold their current
    # parameters and zero deltas (client sampling, ``Method.participation``).
    participants: tuple[int, ...] | None = None
    # Heads by (dataset, task), in head_groups_of order; empty unless the method shares heads.
    heads: list[HeadGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 1:
            raise ValueError(f"round is 1-based, got {self.round!r}")
        self.clients = list(self.clients)
        if not self.clients:
            raise ValueError("a round needs at least one client")
        for client in self.clients:
            if not isinstance(client, ClientInfo):
                raise TypeError(f"clients must be ClientInfo, got {type(client).__name__}")
        names = [c.name for c in self.clients]
        if len(set(names)) != len(names):
            raise ValueError(f"client names must be unique, got {names}")
        self.decoder_owners = [(int(i), str(t)) for i, t in self.decoder_owners]
        self._check_owners()
        if self.participants is not None:
            self.participants = tuple(int(i) for i in self.participants)
            if not self.participants or list(self.participants) != sorted(set(self.participants)):
                raise ValueError(
                    f"participants must be sorted, unique and non-empty, got {list(self.participants)}"
                )
            if not 0 <= self.participants[0] <= self.participants[-1] < self.num_clients:
                raise ValueError(
                    f"participants {list(self.participants)} name a client outside 0..{self.num_clients - 1}"
                )
        if (self.encoders_prev is None) != (self.encoder_deltas is None):
            raise ValueError("encoders_prev and encoder_deltas are both stacks, or both None (streamed)")
        if self.encoders_prev is not None:
            _check_pair(
                "encoders",
                self.encoders_prev,
                self.encoder_deltas,
                self.num_clients,
                "N clients",
                self.encoder_layout,
            )
        _check_pair(
            "decoders",
            self.decoders_prev,
            self.decoder_deltas,
            self.num_decoders,
            "K decoders",
            self.decoder_layout,
        )
        self.heads = list(self.heads)
        if self.heads:
            expected_heads = head_groups_of(self.clients)
            got = [(g.dataset, g.task, g.owners) for g in self.heads]
            if got != expected_heads:
                raise ValueError(
                    f"heads must list every (dataset, task) group once, in head_groups_of(clients) order; "
                    f"expected {expected_heads}, got {got}"
                )

    def _check_owners(self) -> None:
        n = self.num_clients
        for i, task in self.decoder_owners:
            if not 0 <= i < n:
                raise ValueError(f"decoder owner ({i}, {task!r}) names client {i}, but there are {n} clients")
            client = self.clients[i]
            if task not in client.tasks:
                raise ValueError(
                    f"decoder owner ({i}, {task!r}): client {i} ({client.name!r}) has no task {task!r}; "
                    f"its tasks are {list(client.tasks)}"
                )
        expected = decoder_owners_of(self.clients)
        if self.decoder_owners != expected:
            raise ValueError(
                "decoder_owners must list every (client, task) once, by client, then the client's task "
                f"order (decoder_owners_of(clients)); expected {expected}, got {self.decoder_owners}"
            )

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_decoders(self) -> int:
        return len(self.decoder_owners)

    @property
    def participating_clients(self) -> list[int]:
        """Indices of the clients that trained this round (all of them unless sampled)."""
        return list(range(self.num_clients)) if self.participants is None else list(self.participants)

    @property
    def participating_decoders(self) -> list[int]:
        """Rows of the decoders whose owner trained this round."""
        taking_part = set(self.participating_clients)
        return [k for k, (i, _) in enumerate(self.decoder_owners) if i in taking_part]

    @property
    def client_num_samples(self) -> list[int]:
        """[N] each client's sample count."""
        return [c.num_samples for c in self.clients]

    @property
    def decoder_num_samples(self) -> list[int]:
        """[K] each decoder's owner's sample count."""
        return [self.clients[i].num_samples for i, _ in self.decoder_owners]

    def homogeneous_groups(self, rule: str = "same_tasks") -> list[list[int]]:
        """The clients' homogeneous groups (FedHCA², Sec. 3.3): :func:`homogeneous_groups`."""
        return homogeneous_groups(self.clients, rule)

    def decoders_plus_one_update_per_task(
        self, update: Callable[[str, list[int]], Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Decoders [K, Q] where every decoder of a task gets θ_k^(r-1) + ``update(task,
        rows that trained)`` (one update [Q] per task, CAGrad's and PCGrad's), and the rows
        kept as their clients hold them [K] (bool): the tasks none of whose decoders trained."""
        prev, deltas = self.decoders_prev, self.decoder_deltas
        out = prev + deltas
        kept = torch.ones(self.num_decoders, dtype=torch.bool)
        trained = set(self.participating_decoders)
        tasks: dict[str, list[int]] = {}
        for row, (_, task) in enumerate(self.decoder_owners):
            tasks.setdefault(task, []).append(row)
        for task, rows in tasks.items():
            sources = [r for r in rows if r in trained]
            if sources:
                out[rows] = (prev[rows].double() + update(task, sources).double()).to(out.dtype)
                kept[rows] = False
        return out, kept


#: The rules :func:`homogeneous_groups` knows, the default first.
HOMOGENEOUS_RULES = ("same_tasks", "adjacent")


def homogeneous_groups(clients: Sequence[ClientInfo], rule: str = "same_tasks") -> list[list[int]]:
    """Client indices in homogeneous groups, groups in first-member order; every client is in
    exactly one group (possibly of one). Pure.

    - ``"same_tasks"``: any clients with the same dataset and the same set of tasks, wherever
      they stand in the list.
    - ``"adjacent"``: the public FedHCA² code's rule: runs of consecutive clients with the
      same dataset and the same task list, in the same order.

    The two agree wherever twins stand next to each other with their tasks in one order, as
    in every scenario fedmtl builds from a config (the replicas of a group are consecutive).
    """
    if rule not in HOMOGENEOUS_RULES:
        raise ValueError(f"homogeneous group rule {rule!r}: use one of {list(HOMOGENEOUS_RULES)}")
    if rule == "adjacent":
        runs: list[list[int]] = []
        for i, client in enumerate(clients):
            before = clients[i - 1] if i else None
            if before is not None and (client.dataset, tuple(client.tasks)) == (
                before.dataset,
                tuple(before.tasks),
            ):
                runs[-1].append(i)
            else:
                runs.append([i])
        return runs
    groups: dict[tuple[str, frozenset[str]], list[int]] = {}
    for i, client in enumerate(clients):
        groups.setdefault((client.dataset, frozenset(client.tasks)), []).append(i)
    return list(groups.values())


@dataclass
class RoundOutput:
    """The new parameters θ^(r) of every client encoder [N, P] and every decoder [K, Q].

    Rows follow the :class:`RoundInput`'s clients and decoder owners. ``heads``: one stack
    per input head group, or None (heads stay as the clients trained them). The server step
    returns the encoders as an :class:`~fedmtl.aggregation.stream.EncoderMix`; ``aggregate``
    as a Tensor.

    ``decoders_kept`` ([K] bool) and ``heads_kept`` (per head group, [owners] bool) mark the
    rows the step leaves as the client holds them (None: none). The engine gives a client that
    did not train this round no rows (its ``prev`` reads as NaN, its delta as zero) unless the
    method reads every client (``Method.reads_every_client`` / ``needs_every_client``); a row
    of such a client that the step keeps stays the client's own, and any other row of the
    output must not depend on it.
    """

    encoders: Tensor | EncoderMix  # [N, P]
    decoders: Tensor  # [K, Q]
    heads: list[Tensor] | None = None
    decoders_kept: Tensor | None = None
    heads_kept: list[Tensor] | None = None

    def check_against(self, inputs: RoundInput) -> None:
        """Raise ValueError unless shapes, dtypes and devices match ``inputs``."""
        pairs = [("decoders", self.decoders, inputs.decoders_prev)]
        if inputs.encoders_prev is None:  # what the server step receives
            mix = self.encoders
            if not (
                isinstance(mix, EncoderMix)
                and mix.num_rows == inputs.num_clients
                and mix.vectors.shape[1] == inputs.encoder_layout.numel
            ):
                raise ValueError(
                    "the server step's output encoders must be an EncoderMix of one row per client "
                    f"({inputs.num_clients}) and {inputs.encoder_layout.numel} columns"
                )
        else:
            pairs.insert(0, ("encoders", self.encoders, inputs.encoders_prev))
        if self.heads is not None:
            if len(self.heads) != len(inputs.heads):
                raise ValueError(
                    f"output has {len(self.heads)} head stacks; the input has {len(inputs.heads)} groups"
                )
            pairs += [
                (f"heads {g.key}", out, g.prev) for out, g in zip(self.heads, inputs.heads, strict=True)
            ]
        for what, out, ref in pairs:
            if out.shape != ref.shape or out.dtype != ref.dtype or out.device != ref.device:
                raise ValueError(
                    f"output {what} is {tuple(out.shape)} {out.dtype} on {out.device}; "
                    f"the input is {tuple(ref.shape)} {ref.dtype} on {ref.device}"
                )


class Aggregator(abc.ABC):
    """Server-side aggregation of encoders and decoders (heads stay local, except for a
    method that shares them: ``RoundInput.heads``).

    A subclass implements :meth:`aggregate`, a function of the round's flat parameters and
    of the aggregator's own state (a method implements ``Method.server_step`` instead, which
    its ``aggregate`` runs). Server state (FedHCA²'s hyper weights α and β) is
    checkpointed through :meth:`state_dict` / :meth:`load_state_dict`; scalars worth
    logging each round come from :meth:`log_values`. A method (``fedmtl.methods.Method``)
    is an aggregator with client-side hooks.
    """

    @abc.abstractmethod
    def aggregate(self, inputs: RoundInput) -> RoundOutput:
        """The new parameters of all encoders and decoders; must not modify ``inputs``."""

    def state_dict(self) -> dict[str, Any]:
        """Server state: tensors, numbers, strings and lists/dicts of those only, so that
        ``torch.load(..., weights_only=True)`` reads it back. Empty for stateless aggregators."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no server state; got keys {sorted(state)}")

    def log_values(self) -> dict[str, float]:
        """Scalars to log after a round (e.g. FedHCA²'s α and β); empty by default."""
        return {}

    def log_matrices(self) -> dict[str, tuple[list[str], list[str], Tensor]]:
        """Matrices to draw as heatmaps after a round: name -> (row labels, column labels,
        values [rows, columns]), e.g. FedHCA²'s β per decoder and layer; empty by default."""
        return {}


def _check_pair(
    what: str, prev: Tensor, deltas: Tensor, rows: int, rows_name: str, layout: FlatLayout
) -> None:
    for name, t in [(f"{what}_prev", prev), (f"{what[:-1]}_deltas", deltas)]:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    expected = (rows, layout.numel)
    if tuple(prev.shape) != expected:
        raise ValueError(
            f"{what}_prev has shape {tuple(prev.shape)}; expected [{rows} ({rows_name}), "
            f"{layout.numel} (the layout's numel)]"
        )
    name = f"{what[:-1]}_deltas"
    if deltas.shape != prev.shape:
        raise ValueError(f"{name} has shape {tuple(deltas.shape)}; {what}_prev has {tuple(prev.shape)}")
    if deltas.dtype != prev.dtype or deltas.device != prev.device:
        raise ValueError(
            f"{name} is {deltas.dtype} on {deltas.device}; {what}_prev is {prev.dtype} on {prev.device}"
        )
