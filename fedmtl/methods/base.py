"""A federated method: its server step and its client behaviour, in one class.

A :class:`Method` *is* an :class:`~fedmtl.aggregation.Aggregator` (the server step,
``server_step``: flat parameters in, new parameters out, never touching a model) with
client-side hooks that the round loop calls around local training. Every hook has a default
that gives plain FedAvg-style behaviour, so a method overrides only what makes it different:

| hook                 | what it decides                                            | e.g.             |
|----------------------|------------------------------------------------------------|------------------|
| ``server_step``      | the server step: the round's rows in, new parameters out   | every method     |
| ``encoder_rows``     | which rows of each client's encoder the step reads         | FedOpt, FedHCA2  |
| ``setup``            | checks the method against the run (rounds, clients)        | FedSTA, MaT-FL   |
| ``participants``     | which clients train this round (``participation``)         | all methods      |
| ``init_client``      | the client's personal state; may re-initialise the model   | Ditto, FedBABU   |
| ``frozen``           | modules left out of the optimiser this round               | FedBABU, FedSTA  |
| ``penalty``          | a proximal term added to the loss, anchored at a snapshot  | FedProx, FedAMP  |
| ``local_update``     | the whole local step (default: one track, E epochs)        | Ditto            |
| ``receive``          | where the server's output goes (default: into the model)   | FedAMP           |
| ``receive_heads``    | the same for heads, when the method shares them            | FedAvg (unified) |
| ``finish``           | work after the last round (never fed back to the server)   | FedBABU          |
| ``evaluated_models`` | which model(s) are evaluated, the paper's first            | Ditto, FedBABU   |
| ``shared_parts``     | the parts it shares: sent each round, given to new clients | FedPer, Local    |
| ``exchange``         | what a client sends and receives in a round (its cost)     | FedAMP, FedSTA   |
| ``individual_updates`` | what of the step reads an update alone (None: sums only) | FedHCA2, FedAMP |

The server step is written once, as :meth:`Method.server_step`: it takes the encoder rows
the method names (``encoder_rows``, made by ``encoder_row``) as
:class:`~fedmtl.aggregation.stream.EncoderRows`, read a block of columns at a time, and
returns the encoders as an :class:`~fedmtl.aggregation.stream.EncoderMix` (each client's new
encoder as a combination of its own rows and a few shared vectors), so no process needs to hold
[N, P]. Decoders and heads stay stacked in the :class:`~fedmtl.aggregation.RoundInput`.
:meth:`Method.aggregate`, which no method overrides, runs that one step on encoder stacks
([N, P] before and after training) and forms the [N, P] encoders it gives: the engine's
stacked rounds, tests and small studies use it; its streamed rounds read the rows from files
(the engine's ``aggregation`` setting). A new method writes one server step.

A client's stored state (``ClientContext.state``) is its federated *track* — ``"model"``
(state dict), ``"optimizer"``, ``"scheduler"``, ``"epochs_done"`` — plus ``"personal"``: a
dict the method owns (tensors, numbers, strings, nested dicts/lists), kept in the client store
and in checkpoints, so a resumed run continues it bit for bit. Ditto's personal model is a
second track inside it.

Methods are registered in ``METHODS`` under their class name, the name a config gives as
``class_path`` (``--algorithm FedProx --algorithm.mu 0``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from fedmtl.aggregation.base import Aggregator, ClientInfo, RoundInput, RoundOutput
from fedmtl.aggregation.communication import PARTS, Exchange
from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.stream import EncoderMix, EncoderRows, StackedRows
from fedmtl.losses import proximal_term
from fedmtl.methods.checks import within
from fedmtl.privacy.server import ServerPrivacy
from fedmtl.registry import Registry
from fedmtl.seeds import derive_seed
from fedmtl.tensors import host_state

Track = dict[str, Any]  # "model", "optimizer", "scheduler", "epochs_done"


def new_track(model: nn.Module, epochs_done: int = 0) -> Track:
    """A track starting from (a copy of) ``model``'s current state, with a fresh optimiser and
    schedule (``None`` until it first trains)."""
    return {
        "model": host_state(model),
        "optimizer": None,
        "scheduler": None,
        "epochs_done": epochs_done,
    }


@dataclass
class Penalty:
    """coefficient/2 · Σ ‖p − a‖² over (live parameter p, detached anchor a) pairs: a term of
    the loss (never of ``.grad``), so autocast, gradient scaling and AdamW treat it like the
    task loss. Built by :meth:`Method.penalty` once the round's model is loaded."""

    coefficient: float
    pairs: list[tuple[Tensor, Tensor]]

    def __call__(self) -> Tensor:
        params, anchors = zip(*self.pairs, strict=True) if self.pairs else ((), ())
        return proximal_term(params, anchors, self.coefficient)


def snapshot(params: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Pairs of each parameter with a detached copy of its current value (a round-start anchor)."""
    return [(p, p.detach().clone()) for p in params]


@dataclass
class ClientContext:
    """What a client-side hook sees of one client in one round.

    ``train(track, *, frozen=(), penalty=None, epochs=None, order="order", fine_tune=None)``
    loads ``track`` into ``model``, trains it for ``epochs`` (default the client's local
    epochs) and writes the result back into ``track``; it returns the mean losses.
    ``fine_tune`` (an OptimizerConfig) trains with a fresh AdamW at a constant rate whose
    state is not kept (FedBABU's fine-tuning). In a round where the client straggles
    (``availability.stragglers``) ``train`` is bound to its part of the work, so every track a
    method trains (Ditto's two) stops early alike; in :meth:`Method.finish` it is never cut
    short. See :meth:`fedmtl.federated.training.LocalTrainer.train`.
    """

    index: int
    client: ClientInfo
    round: int  # 1-based; the round being trained (or just aggregated, in ``receive``)
    rounds: int  # of the whole run
    local_epochs: int
    optimizer: Any  # the client's OptimizerConfig (lr, weight decay, schedule)
    state: dict[str, Any]  # the stored client state: its federated track + "personal"
    model: nn.Module  # the device model (fedmtl.models.MultiTaskModel) tracks are loaded into
    encoder_layout: FlatLayout
    decoder_layout: FlatLayout
    seed: int  # the run's seed
    train: Callable[..., Tensor] = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def personal(self) -> dict[str, Any]:
        return self.state["personal"]


class Method(Aggregator):
    """A federated method: the server step :meth:`server_step` and the client hooks below.

    Args:
        participation: fraction of the clients that train in each round, drawn with the
            run's seed (at least one client). 1: every client, every round (the paper).
    """

    #: The model the results' ``clients`` table reports, as results.json names it.
    evaluated: str = "post-aggregation"

    @property
    def shares_heads(self) -> bool:
        """Whether the server aggregates heads too (the unified-model setting): the engine then
        exchanges them (``RoundInput.heads``). Default: heads stay local, as in HC-FMTL."""
        return False

    @property
    def shared_parts(self) -> frozenset[str]:
        """The parts of a client model the server shares among clients, by module: ``encoder``,
        ``decoders``, ``heads``: what a round sends both ways by default (:meth:`exchange`) and
        what a new (held-out) client receives of the federated model. Default: the encoder and
        the decoders, and the heads when the method shares them."""
        return frozenset({"encoder", "decoders", *(("heads",) if self.shares_heads else ())})

    def __init__(self, participation: float = 1.0) -> None:
        within("participation", participation, "(0, 1]", " (a fraction of the clients)")
        self.participation = float(participation)
        self.rounds = 0
        self.seed = 0
        self.num_clients = 0

    # ------------------------------------------------------------------ the run

    def check_run(self, rounds: int, num_clients: int) -> None:
        """Raise ValueError (naming the field and the fix) if the method cannot run this scenario.
        Called before anything is written."""

    def setup(self, rounds: int, clients: Sequence[ClientInfo], seed: int) -> None:
        """Bind the method to a run: called once before the first round (also on resume)."""
        self.check_run(rounds, len(clients))
        self.rounds, self.seed, self.num_clients = rounds, seed, len(clients)

    def clients_per_round(self, num_clients: int) -> int:
        """How many of ``num_clients`` train in a round: ``participation`` of them, at least one."""
        return max(1, round(self.participation * num_clients))

    def participants(self, round_: int) -> list[int] | None:
        """The clients (sorted indices) that train in round ``round_``; None: all of them."""
        if self.participation >= 1:
            return None
        count = self.clients_per_round(self.num_clients)
        chosen = random.Random(derive_seed(self.seed, "participation", round_)).sample(
            range(self.num_clients), count
        )
        return sorted(chosen)

    def exchange(self, round_: int) -> Exchange:
        """What each client sends up and receives down in round ``round_``, by pool, for the
        run's communication cost (:mod:`fedmtl.aggregation.communication`). Default: the
        :attr:`shared_parts`, each both ways (a client's update up, its new parameters down).
        A method overrides it where a round sends something else (FedAMP's cloud models) or
        nothing (FedSTA's local phase)."""
        return Exchange.both_ways(*(part for part in PARTS if part in self.shared_parts))

    # ------------------------------------------------------------------ the server step

    #: Whether the server step reads the rows of clients that did not train this round (their
    #: current parameters, zero delta): FedAMP mixes every client's last weights. Otherwise
    #: only the clients that trained have rows (the others read as zeros).
    reads_every_client: bool = False

    #: What in the server step reads a client's update on its own, as a phrase completing "it
    #: ...", or None: the step needs nothing but the (weighted) sum of each group's updates, so
    #: central DP (noise on the sums) and secure aggregation (the server sees only the sums)
    #: apply to it (docs/privacy.md). Every method states it; the default assumes the worst.
    individual_updates: str | None = "has a server step not declared to need only sums of updates"

    #: The central DP and secure aggregation of this round's server step (set by the engine
    #: before each step, :meth:`set_server_privacy`); None: plain sums.
    server_privacy: ServerPrivacy | None = None

    def set_server_privacy(self, privacy: ServerPrivacy | None) -> None:
        """Use ``privacy`` in the next server step: a sum-only step takes each group's mean
        through it and adds its noise (FedAvg). FedDEA passes it on to its host, scaled."""
        self.server_privacy = privacy

    @property
    def needs_every_client(self) -> bool:
        """Whether the server step mixes every client's rows in every round (FedHCA², FedAMP):
        a client that does not train (unavailable, ``availability.dropout``, or its update
        dropped) still enters it with its round-start parameters and a zero update. Default:
        :attr:`reads_every_client`."""
        return self.reads_every_client

    def skip_round(self, round_: int) -> None:
        """Round ``round_`` has no server step: every client that would have trained was
        unavailable (``availability.dropout``). Called on every rank instead of the server
        step; a method whose server state counts rounds moves on. Default: nothing."""

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        """The rows of each client's encoder the server step of round ``round_`` reads, by
        name: ``"trained"``, ``"delta"``, ``"prev"``, as :meth:`encoder_row` makes them.
        Default: none (every client keeps the encoder it trained)."""
        return ()

    def encoder_row(self, name: str, prev: Tensor, trained: Tensor, layout: FlatLayout) -> Tensor:
        """Client row ``name`` from its encoder before (``prev``) and after (``trained``) the
        round's training, flat [P]."""
        if name == "trained":
            return trained
        if name == "delta":
            return trained - prev
        if name == "prev":
            return prev
        raise ValueError(f"{type(self).__name__} asks for encoder row {name!r} but does not make it")

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        """The server step, the one a method writes: ``inputs`` holds the decoders (and heads)
        stacked but no encoder stacks; ``encoders`` maps each name :meth:`encoder_rows` gave to
        its :class:`~fedmtl.aggregation.stream.EncoderRows`. The output's ``encoders`` is an
        :class:`~fedmtl.aggregation.stream.EncoderMix`; ``decoders`` and ``heads`` are stacks.
        Must not modify ``inputs``."""
        raise NotImplementedError(f"{type(self).__name__} has no server step: write server_step")

    def aggregate(self, inputs: RoundInput) -> RoundOutput:
        """:meth:`server_step` on encoder stacks, with the encoders formed [N, P] (in the dtype
        and on the device of ``inputs.encoders_prev``): the engine's stacked rounds, tests and
        small studies. No method overrides it.

        Row ``name`` of client i is ``encoder_row(name, prev_i, prev_i + Δ_i, layout)``, as the
        engine writes it; a client that did not train (not in ``inputs.participants``: sampled
        out, unavailable, or its update dropped) has an all-zero row, unless the method
        :attr:`reads_every_client` (then ``encoder_row(name, prev_i, prev_i, layout)``).
        Client i's own ``"trained"`` row in the :class:`EncoderMix` is prev_i + Δ_i, the
        encoder it trained (for FedDEA, unmasked)."""
        if inputs.encoders_prev is None or inputs.encoder_deltas is None:
            raise ValueError(
                f"{type(self).__name__}.aggregate needs the encoder stacks (RoundInput.encoders_prev and "
                "encoder_deltas, [N, P]); this RoundInput has none: call server_step(inputs, encoders) "
                "with the encoder rows instead"
            )
        prev, deltas, layout = inputs.encoders_prev, inputs.encoder_deltas, inputs.encoder_layout
        trained = prev + deltas
        taking_part = set(inputs.participating_clients)
        rows: dict[str, StackedRows] = {}
        for name in self.encoder_rows(inputs.round):
            stack = torch.zeros_like(prev)
            for i in range(inputs.num_clients):
                if i in taking_part:
                    stack[i] = self.encoder_row(name, prev[i], trained[i], layout)
                elif self.reads_every_client:
                    stack[i] = self.encoder_row(name, prev[i], prev[i], layout)
            rows[name] = StackedRows(name, stack)
        output = self.server_step(dataclasses.replace(inputs, encoders_prev=None, encoder_deltas=None), rows)
        mix = output.encoders
        if not isinstance(mix, EncoderMix):
            raise TypeError(
                f"{type(self).__name__}.server_step must return its encoders as an EncoderMix, "
                f"got {type(mix).__name__}"
            )
        own = {name: r.stack for name, r in rows.items()}
        for r in rows.values():
            own |= r.made
        own["trained"] = trained
        encoders = mix.rows(own).to(device=prev.device, dtype=prev.dtype)
        return RoundOutput(encoders=encoders, decoders=output.decoders, heads=output.heads)

    # ------------------------------------------------------------------ the client

    def init_client(self, model: nn.Module, client: ClientInfo, seed: int) -> dict[str, Any]:
        """The client's initial personal state (default: none). May change ``model``, which is
        then the client's initial model (FedBABU re-initialises heads here)."""
        return {}

    def frozen(self, model: nn.Module, round_: int) -> list[nn.Module]:
        """Modules whose parameters do not train in round ``round_``: ``requires_grad=False``
        and left out of the optimiser (never zeroed gradients). Default: none."""
        return []

    def penalty(self, ctx: ClientContext, model: nn.Module) -> Penalty | None:
        """The proximal term of the client objective, built once ``model`` holds the round's
        starting point (default: none)."""
        return None

    def local_update(self, ctx: ClientContext) -> Tensor:
        """Local training of one client in one round; returns its mean losses. Default: the
        federated track for the client's local epochs, with this method's frozen modules and
        penalty."""
        return ctx.train(
            ctx.state,
            frozen=self.frozen(ctx.model, ctx.round),
            penalty=lambda model: self.penalty(ctx, model),
        )

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        """Take the server's output for this client: its encoder row and one row per task.
        Default: they become the model's encoder and decoders (``ctx.model`` holds the
        federated track and is stored afterwards); a ``None`` encoder or a task without a row
        keeps what the client trained."""
        if encoder is not None:
            ctx.encoder_layout.assign(ctx.model.encoder, encoder)
        for task, row in decoders.items():
            ctx.decoder_layout.assign(ctx.model.decoders[task], row)

    def receive_heads(self, ctx: ClientContext, heads: Mapping[str, Tensor]) -> None:
        """Take the server's head rows (task -> flat head), only for a method that shares heads
        and returned them. Default: they become the model's heads."""
        for task, row in heads.items():
            head = ctx.model.heads[task]
            FlatLayout.from_module(head).assign(head, row)

    @property
    def finishes(self) -> bool:
        """Whether :meth:`finish` does anything: the engine skips the pass over every client
        (a read and a write of each state) for a method that does not."""
        return type(self).finish is not Method.finish

    def finish(self, ctx: ClientContext) -> None:
        """After the last round's aggregation, before the final evaluation (FedBABU's
        fine-tuning). Must not change the federated track. Default: nothing."""

    def evaluated_models(self, state: Mapping[str, Any]) -> dict[str, Mapping[str, Tensor]]:
        """Model states to evaluate, by label; the first is the one the results' ``clients``
        table reports (:attr:`evaluated`). Default: the federated track's model."""
        return {self.evaluated: state["model"]}


METHODS: Registry[type[Method]] = Registry("method")

MethodT = TypeVar("MethodT", bound=Method)


def register_method(cls: type[MethodT]) -> type[MethodT]:
    """Class decorator: register a :class:`Method` subclass under its class name."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"only Method subclasses can be registered, got {cls!r}")
    METHODS.add(cls.__name__, cls)
    return cls


def create_method(name: str, **kwargs: Any) -> Method:
    """Build a registered method by class name, e.g. ``create_method("FedProx", mu=0.01)``."""
    return METHODS.get(name)(**kwargs)
