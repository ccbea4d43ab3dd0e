"""One round: train → settle → exchange → server step → receipts (→ finish) (→ evaluate).

Every rank runs the same round on its share of the clients:

1. train: each of the rank's clients that trains (or whose rows a method reads although it
   sits the round out) is loaded from the client store with its pending receipts applied, runs
   the method's local update, and is stored once; its rows go to the round's pools (decoders,
   shared heads: stacked, gathered) and its encoder rows to the round's row store;
2. settle: the ranks sum the losses and the health of every update; the ``nonfinite`` policy
   drops diverged updates;
3. exchange: the pools are all-gathered into the server's input;
4. server step: every rank runs the method's (deterministic) step on the same inputs, so server
   state stays identical everywhere without a broadcast;
5. receipts: each rank gives the output to its receiving clients as a receipt, applied when
   each is next loaded (``receipts.py``); nothing is written to the clients now;
6. evaluate (every few rounds and at the end) and return what to log.

A client that neither trains nor is evaluated, under a method that does not read every client,
is never loaded.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from fedmtl.aggregation import FlatLayout, HeadGroup, RoundInput, RoundOutput, communication
from fedmtl.aggregation.stream import EncoderMix
from fedmtl.config import RunConfig
from fedmtl.federated import availability, checkpoint, evaluation, health, held_out, pools
from fedmtl.federated import rows as row_files
from fedmtl.federated.client import ClientModule, ClientSpec
from fedmtl.federated.clients import Clients
from fedmtl.federated.evaluator import Evaluator
from fedmtl.federated.health import RunStopped, nonfinite_pools
from fedmtl.federated.live import Quiet
from fedmtl.federated.pools import Pool, RoundPools
from fedmtl.federated.ranks import Ranks
from fedmtl.federated.receipts import FileRowStore, Receipt, RowStore
from fedmtl.federated.results import RunRecord
from fedmtl.federated.store import ClientState
from fedmtl.federated.training import (
    LOSS_COLUMNS,
    LR_SLOT,
    PENALTY_SLOT,
    TASK_SLOTS,
    TOTAL_SLOT,
    LocalTrainer,
)
from fedmtl.methods.base import ClientContext, Method
from fedmtl.privacy.run import RunPrivacy, shared_up
from fedmtl.tensors import host_state, load_into, to_host

Results = dict[str, dict[str, dict[str, float]]]  # {label: {client: {task: value}}}


@contextlib.contextmanager
def timed(times: dict[str, float], phase: str) -> Iterator[None]:
    """``times[phase]``: the seconds the block took."""
    start = time.perf_counter()
    yield
    times[phase] = time.perf_counter() - start


@dataclass
class Federation:
    """What every round of a run works with, built once by the simulation."""

    cfg: RunConfig
    ranks: Ranks
    clients: Clients
    method: Method
    trainer: LocalTrainer
    encoder_layout: FlatLayout
    decoder_layout: FlatLayout
    head_layouts: list[FlatLayout]
    rows: RowStore
    # The live view's hooks, told as each phase starts (rank 0 on a terminal; else no-ops)
    live: Quiet = field(default_factory=Quiet)
    # Differential privacy and secure aggregation (None: neither; fedmtl.privacy.run)
    privacy: RunPrivacy | None = None
    # Built on the federation once it exists (Simulation.__init__)
    evaluator: Evaluator = field(init=False)
    record: RunRecord = field(init=False)

    def context(
        self, i: int, module: ClientModule, state: ClientState, round_: int, work: float = 1.0
    ) -> ClientContext:
        """What the method's client hooks see of client ``i`` in round ``round_`` (``train``
        runs its tracks, each local epoch cut to ``work`` of its batches: a straggler's round)."""
        spec = self.clients.specs[i]
        return ClientContext(
            index=i,
            client=self.clients.info[i],
            round=round_,
            rounds=self.cfg.rounds,
            local_epochs=spec.local_epochs,
            optimizer=spec.optimizer,
            state=state,
            model=module.model,
            encoder_layout=self.encoder_layout,
            decoder_layout=self.decoder_layout,
            seed=self.cfg.seed,
            train=functools.partial(self.trainer.train, module, i, self.clients.train_data.get(i), work=work),
        )

    def load(self, i: int, params_only: bool = False) -> tuple[ClientModule, ClientState]:
        """Client ``i`` on the device with its receipts applied (:meth:`Clients.load`)."""
        return self.clients.load(i, self.context, params_only)

    def encoder_in_row(self, round_: int) -> bool:
        """Whether a client trained in round ``round_`` is stored with its encoder left in its
        ``"trained"`` row: the rows are files the step reads, the clients are on disk, and the
        row holds the encoder exactly (float32 parameters)."""
        return (
            isinstance(self.rows, FileRowStore)
            and self.clients.store.kind == "disk"
            and "trained" in self.method.encoder_rows(round_)
            and all(dtype == torch.float32 for dtype in self.encoder_layout.dtypes)
        )

    @property
    def reads_idle_clients(self) -> bool:
        """Whether the server step reads the rows of clients that do not train this round."""
        return self.method.reads_every_client or self.method.needs_every_client


class Round:
    """Round ``number`` of a run, on this rank."""

    def __init__(self, federation: Federation, number: int) -> None:
        self.fed = federation
        self.number = number
        self.cfg = federation.cfg
        self.clients = federation.clients
        self.method = federation.method
        self.ranks = federation.ranks
        self.times: dict[str, float] = {}

    # ------------------------------------------------------------------ the whole round

    def run(self) -> tuple[dict[str, float], Results | None]:
        """Returns the scalars to log and the evaluation results (None when not evaluated)."""
        n, times = len(self.clients), self.times
        # Drawn for every client on every rank from the seed: the same everywhere, no exchange.
        drawn = availability.draw(
            self.cfg.availability, self.cfg.seed, self.number, n, self.method.participants(self.number)
        )
        privacy = self.fed.privacy
        self.privacy_columns = torch.zeros(n, 2, dtype=torch.float64)  # update norm, DP-SGD steps
        with (
            timed(times, "train"),
            self.ranks.phase(round_=self.number),
        ):  # a stop or failed write ends it here
            rows, losses, bad = self.train(drawn.training, drawn.stragglers)
        self.fed.live.phase("exchange")
        with timed(times, "exchange"):
            losses, dropped, participants = self.settle(losses, bad, drawn.training)
            if privacy is not None:  # every rank's norms and steps, for the clip and the accountant
                self.privacy_columns = self.ranks.sum(self.privacy_columns.to(self.ranks.device)).cpu()
            inputs = self.exchange(rows, participants) if participants != [] else None
        if inputs is None:  # every client that would train is unavailable
            self.skip_server_step(drawn.unavailable)
            receive_nothing = list(range(n))
        else:  # unavailable clients, like dropped updates, receive nothing and keep their state
            receive_nothing = [*dropped, *drawn.unavailable]
            self.server_step(inputs, receive_nothing)
        if privacy is not None:  # the updates that left their clients (dropped ones too)
            senders = [] if inputs is None else list(range(n) if drawn.training is None else drawn.training)
            norms, steps = self.privacy_columns.unbind(dim=1)
            privacy.after_round(self.number, norms, steps, senders)
        del rows, inputs
        if self.number == self.cfg.rounds and self.method.finishes:
            self.fed.live.phase("finish")
            with timed(times, "finish"), self.ranks.phase(round_=self.number):
                self.finish_clients()
        values = self.training_values(losses, participants, dropped)
        if self.cfg.availability.enabled:
            values["server/unavailable"] = float(len(drawn.unavailable))
            values["server/stragglers"] = float(len(drawn.stragglers))
        # The clients that trained uploaded (those whose update was dropped too).
        values |= self.count_traffic(drawn.training, receive_nothing)
        results = None
        every = self.cfg.evaluation.every
        if self.number == self.cfg.rounds or (every > 0 and self.number % every == 0):
            evaluator = self.fed.evaluator
            self.fed.live.phase("evaluation")
            with timed(times, "eval"):
                results = evaluator.evaluate(self.evaluated_clients())
                self.ranks.agree(
                    round_=self.number
                )  # a stop during the evaluation: its numbers are not logged
            if self.number == self.cfg.rounds and self.clients.held_out:
                self.fed.live.phase("held-out evaluation")
                with timed(times, "held_out"), self.ranks.phase(round_=self.number):
                    results[held_out.LABEL] = evaluator.held_out_results()
            values |= evaluation.logged_values(results, evaluator.labels, self.clients.datasets_of)
        values |= {f"aggregation/{k}": v for k, v in self.method.log_values().items()}  # runlog.AGGREGATION
        if privacy is not None:
            values |= privacy.values()
        values |= {f"time/{k}": v for k, v in times.items()}
        return values, results

    def evaluated_clients(self) -> list[int] | None:
        """The clients this round's evaluation covers (None: every client)."""
        last = self.number == self.cfg.rounds
        return evaluation.sampled_clients(self.cfg.evaluation.clients, len(self.clients), self.cfg.seed, last)

    # ------------------------------------------------------------------ train

    def pools(self) -> RoundPools:
        """This rank's rows of the round: the decoders and the shared head groups, before
        training and as deltas (the encoders go to the row store)."""
        fed, clients = self.fed, self.clients

        def pool(layout: FlatLayout, owners: list[tuple[int, str]], part: pools.Part) -> Pool:
            return Pool(layout, owners, part, clients.rank_of, self.ranks.rank, self.ranks.device)

        heads = [
            pool(layout, [(i, task) for i in owners], pools.head_part)
            for (_, task, owners), layout in zip(clients.head_groups, fed.head_layouts, strict=True)
        ]
        return RoundPools(None, pool(fed.decoder_layout, clients.owners, pools.decoder_part), heads)

    def train(
        self, participants: list[int] | None, stragglers: tuple[int, ...] = ()
    ) -> tuple[RoundPools, torch.Tensor, torch.Tensor]:
        """This rank's clients trained (``participants``; None: all; ``stragglers`` do
        ``availability.straggler_work`` of each epoch): their rows, losses [N, LOSS_COLUMNS]
        and divergence [N, 2]: each client's health mask and largest growth (zero for other
        ranks' clients)."""
        n = len(self.clients)
        rows = self.pools()
        if isinstance(self.fed.rows, FileRowStore):  # what a killed attempt at this round left
            names = self.method.encoder_rows(self.number)
            row_files.start_round(self.fed.rows.directory, self.number, self.clients.mine, names)
        losses = torch.zeros(n, LOSS_COLUMNS, dtype=torch.float64)
        bad = torch.zeros(n, 2, dtype=torch.float64)
        taking_part = set(range(n) if participants is None else participants)
        loaded = [i for i in self.clients.mine if i in taking_part or self.fed.reads_idle_clients]
        work, slow, live = self.cfg.availability.straggler_work, set(stragglers), self.fed.live
        for k, i in enumerate(loaded):
            live.training(k, len(loaded))
            share = work if i in slow else 1.0
            losses[i], mask, grown = self.train_client(i, rows, i in taking_part, share)
            bad[i] = torch.tensor([mask, grown], dtype=torch.float64)
            if i in taking_part:
                spec = self.clients.specs[i]
                live.trained(spec.name, {t: float(losses[i, TASK_SLOTS[t]]) for t in spec.tasks})
        return rows, losses, bad

    def train_client(
        self, i: int, rows: RoundPools, takes_part: bool, work: float = 1.0
    ) -> tuple[torch.Tensor, int, float]:
        """Local training of client ``i`` (the method's ``local_update``, ``work`` of each local
        epoch: ``availability.straggler_work`` for a straggler, else 1): writes its rows of
        parameters before training and of deltas, and its encoder rows; stores it once; returns
        its mean losses [LOSS_COLUMNS], the :mod:`~fedmtl.federated.health` mask of what
        diverged (NaN/inf, or an exploding update: beyond ``update_norm_limit``) and the largest
        growth of its parts. A client that sits the round out (loaded because the method reads
        every client), or whose update diverged, gives zero deltas and is not stored: it keeps
        the state (and the receipts) it started the round with."""
        fed, spec = self.fed, self.clients.specs[i]
        module, state = fed.load(i)
        for pool in rows:
            pool.start(i, module.model)
        enc_prev = fed.encoder_layout.flatten(module.model.encoder)
        if not takes_part:
            if self.method.reads_every_client:
                self.write_rows(i, enc_prev, enc_prev)
            return torch.zeros(LOSS_COLUMNS, dtype=torch.float64), 0, 0.0
        limit = self.cfg.update_norm_limit
        heads_before = [self.head_vector(module, t) for t in spec.tasks] if limit is not None else []
        # The memory store hands out the stored state itself, which training changes in place.
        kept = to_host(state) if self.clients.store.kind == "memory" else None
        privacy = fed.privacy
        parts = shared_up(self.method, self.number) if privacy is not None and privacy.client_level else set()
        starts = RunPrivacy.starts(module.model, parts, spec.tasks) if parts else []
        steps_before = fed.trainer.dp_steps
        losses = self.method.local_update(fed.context(i, module, state, self.number, work))
        load_into(module.model, state["model"])  # the federated track (a method may train others)
        if privacy is not None:
            self.privacy_columns[i, 1] = fed.trainer.dp_steps - steps_before
        bad = nonfinite_pools(module.model, spec.tasks, state["personal"])
        grown = 0.0
        enc_trained = fed.encoder_layout.flatten(module.model.encoder)
        if not bad:
            for pool in rows:
                pool.finish(i, module.model)
            if limit is not None:
                growths = self.growths(
                    i, rows.decoders, module, (enc_prev, enc_trained - enc_prev), heads_before
                )
                bad = health.exploding_parts(growths, limit)
                if bad:
                    grown = max(growths)
                    for pool in rows:
                        pool.drop(i)
        if bad:  # NaN/inf or exploding: no delta, and the state it started the round with
            if kept is not None:
                self.clients.store.put(i, kept)  # the memory store's state was changed in place
            if self.method.reads_every_client:
                self.write_rows(i, enc_prev, enc_prev)
            self.privacy_columns[i, 0] = float("nan")  # sent, but neither clipped nor counted unclipped
            return losses, bad, grown
        if parts:  # what leaves the client is its clipped (and, local, noised) update; the health
            # checks above read the update as trained: deliberate noise is no divergence
            assert privacy is not None
            self.privacy_columns[i, 0] = privacy.privatise_client(
                module.model, starts, parts, spec.tasks, self.number, i
            )
            state["model"] = host_state(module.model)
            enc_trained = fed.encoder_layout.flatten(module.model.encoder)
            for pool in rows:
                pool.finish(i, module.model)
        self.write_rows(i, enc_prev, enc_trained)
        self.clients.store_state(i, state, self.number if self.fed.encoder_in_row(self.number) else None)
        return losses, 0, 0.0

    def write_rows(self, i: int, prev: torch.Tensor, trained: torch.Tensor) -> None:
        """Client ``i``'s encoder rows the method names, from its encoder before and after
        training (equal: it did not train, or its update was dropped)."""
        for name in self.method.encoder_rows(self.number):
            row = self.method.encoder_row(name, prev, trained, self.fed.encoder_layout)
            self.fed.rows.write(self.number, i, name, row)

    def growths(
        self,
        i: int,
        decoders: Pool,
        module: ClientModule,
        encoder: tuple[torch.Tensor, torch.Tensor],
        heads_before: list[torch.Tensor],
    ) -> list[float]:
        """How much client ``i``'s encoder (before, delta), then each task's decoder with its
        head, grew against where it started (:func:`~fedmtl.federated.health.growth`)."""
        heads_after = [self.head_vector(module, t) for t in self.clients.specs[i].tasks]
        before, delta = encoder
        return [health.growth([before], [delta])] + [
            health.growth([decoders.prev[k], head], [decoders.delta[k], head_after - head])
            for (k, _), head, head_after in zip(decoders.rows_of(i), heads_before, heads_after, strict=True)
        ]

    @staticmethod
    def head_vector(module: ClientModule, task: str) -> torch.Tensor:
        """A task head's parameters as one flat copy (heads are small)."""
        return torch.cat([p.detach().flatten().float() for p in module.model.heads[task].parameters()])

    # ------------------------------------------------------------------ settle and exchange

    def settle(
        self, losses: torch.Tensor, bad: torch.Tensor, participants: list[int] | None
    ) -> tuple[torch.Tensor, list[int], list[int] | None]:
        """Every rank's losses and divergence summed into one table; the ``nonfinite`` policy
        applied. Returns the losses, the dropped clients and the server step's participants: a
        dropped client is a non-participant, its rows its round-start parameters and zero deltas."""
        table = torch.cat([losses, bad], dim=1).to(self.ranks.device)
        table = self.ranks.sum(table).cpu()
        losses, bad = table[:, :-2], table[:, -2:]
        dropped = self.drop_nonfinite(bad, participants)
        if dropped:
            taking_part = range(len(self.clients)) if participants is None else participants
            participants = [i for i in taking_part if i not in dropped]
        return losses, dropped, participants

    def drop_nonfinite(self, bad: torch.Tensor, participants: list[int] | None) -> list[int]:
        """Apply the ``nonfinite`` policy to the clients whose update diverged: not finite, or
        exploding (``bad``: every client's health mask and growth, the same on every rank);
        returns the dropped clients. Raising here ends the round before its checkpoint: no
        checkpoint is ever written from a round with a diverged update in it."""
        specs, cfg = self.clients.specs, self.cfg
        dropped = [i for i in range(len(specs)) if int(bad[i, 0])]
        if not dropped:
            return []
        groups = health.client_groups(cfg.clients)

        def why(i: int) -> str:
            what = health.describe_update(int(bad[i, 0]), float(bad[i, 1]), specs[i].tasks)
            return f"{specs[i].name} ({what})"

        def group(g: int) -> str:
            return f"clients[{g}] ({cfg.clients[g].dataset}, lr {cfg.clients[g].optimizer.lr!r})"

        exploded = sum(health.exploding(int(bad[i, 0])) for i in dropped)
        which = (exploded > 0) + (exploded == len(dropped))  # none, some or all of them exploding
        kind = ["not finite (NaN/inf)", "divergent (NaN/inf or exploding)", "exploding"][which]
        update = [
            "non-finite update (NaN/inf)",
            "diverged update (NaN/inf or exploding)",
            "exploding update",
        ][which]
        growth = (
            f"; exploding: a part of the model (the encoder, a task's decoder and head) grew more than "
            f"update_norm_limit = {cfg.update_norm_limit} times its norm at the start of the round"
            if exploded
            else ""
        )
        trained = len(specs) if participants is None else len(participants)
        if cfg.nonfinite == "stop" or len(dropped) == trained:
            every = len(dropped) == trained
            named = sorted({groups[i] for i in dropped})
            what = "; ".join(
                f"{group(g)}: {', '.join(why(i) for i in dropped if groups[i] == g)}" for g in named
            )
            latest = checkpoint.latest(cfg.run_dir)
            kept = f"the last checkpoint, {latest.name}, is kept" if latest else "no checkpoint was written"
            raise RunStopped(
                f"round {self.number}: {'every' if every else 'a'} client's update is {kind}: {what}{growth}. "
                f"The run stops (nonfinite: {cfg.nonfinite}) without saving round {self.number}; {kept}. "
                f"Lower the learning rate of {'these client groups' if len(named) > 1 else 'that client group'} "
                "(clients[].optimizer.lr)"
                + (
                    ""
                    if cfg.nonfinite == "drop" or every
                    else ", or set nonfinite: drop to skip such updates"
                )
            )
        if self.ranks.is_zero:
            what = "; ".join(f"{why(i)} in {group(groups[i])}" for i in dropped)
            print(
                f"warning: round {self.number}: dropped the {update} of {what}; the client keeps its state "
                f"from before the round (nonfinite: drop; counted in metrics.csv as server/dropped_updates){growth}",
                file=sys.stderr,
                flush=True,
            )
        return dropped

    def exchange(self, rows: RoundPools, participants: list[int] | None) -> RoundInput:
        """Every rank's decoder and head rows, gathered into the server's input (the encoders
        stay in the row store, which the server step reads)."""
        fed, clients = self.fed, self.clients
        decoders = rows.decoders.gather(self.ranks.fabric)
        heads = []
        for (dataset, task, owners), pool in zip(clients.head_groups, rows.heads, strict=True):
            prev, deltas = pool.gather(self.ranks.fabric)
            heads.append(HeadGroup(dataset, task, pool.layout, owners, prev=prev, deltas=deltas))
        return RoundInput(
            round=self.number,
            clients=clients.info,
            encoder_layout=fed.encoder_layout,
            encoders_prev=None,
            encoder_deltas=None,
            decoder_layout=fed.decoder_layout,
            decoder_owners=clients.owners,
            decoders_prev=decoders[0],
            decoder_deltas=decoders[1],
            participants=None if participants is None else tuple(participants),
            heads=heads,
        )

    # ------------------------------------------------------------------ server step and receipts

    def server_step(self, inputs: RoundInput, skip: list[int]) -> None:
        """The method's server step on the round's rows; its output becomes a receipt for this
        rank's clients but ``skip`` (dropped updates, unavailable clients)."""
        fed, clients = self.fed, self.clients
        names = self.method.encoder_rows(self.number)
        self.fed.live.phase("server step (aggregation)")
        with timed(self.times, "aggregate"), self.ranks.phase(stop=False, round_=self.number):
            encoders = fed.rows.server_rows(
                self.number, names, len(clients), fed.encoder_layout.numel, clients.mine
            )
            if fed.privacy is not None:
                self.method.set_server_privacy(fed.privacy.server_privacy(self.number))
            try:
                output = self.method.server_step(inputs, encoders)
            finally:
                self.method.set_server_privacy(None)
            output.check_against(inputs)
            self.check_output(output)
        # Every rank has read the rows: what no receipt needs can go.
        self.fed.live.phase("write back (receipts)")
        with timed(self.times, "receipts"), self.ranks.phase(stop=False, round_=self.number):
            receivers = [i for i in clients.mine if i not in set(skip)]
            receipts = clients.receipts
            assert receipts is not None
            receipts.issue(
                Receipt.of(self.number, output), receivers, clients.decoder_rows, clients.head_rows
            )
            made = [name for name in output.encoders.own if name not in ("trained", *names)]
            receipts.drop_unneeded(self.number, [*names, *made])

    def check_output(self, output: RoundOutput) -> None:
        """The server step must not create NaN/inf from finite updates (an overflow, a bug)."""
        specs, clients = self.clients.specs, self.clients
        decoders = [f"{specs[i].name}/{t}" for i, t in clients.owners]
        stacks = [("decoder", output.decoders, decoders, output.decoders_kept)]
        if isinstance(output.encoders, EncoderMix):  # the shared vectors; a client's own rows are finite
            mix = output.encoders
            takers = [  # each vector named by the clients whose new encoder takes it
                ", ".join(specs[i].name for i in torch.nonzero(mix.mixing[:, g]).flatten().tolist())
                or f"no client (shared encoder vector {g})"
                for g in range(len(mix.vectors))
            ]
            stacks.append(("encoder", mix.vectors, takers, None))
        heads_kept = output.heads_kept or [None] * len(output.heads or [])
        for stack, kept, (_, task, owners) in zip(
            output.heads or [], heads_kept, clients.head_groups, strict=False
        ):
            stacks.append(("head", stack, [f"{specs[i].name}/{task}" for i in owners], kept))
        for what, stack, owner, kept in stacks:
            finite = torch.isfinite(stack).all(dim=1).cpu()
            if kept is not None:  # a kept row of a client that did not train is no output
                finite |= kept.cpu()
            if not bool(finite.all()):
                rows = [owner[k] for k in torch.nonzero(~finite).flatten().tolist()]
                raise RunStopped(
                    f"round {self.number}: {type(self.method).__name__}'s server step returned non-finite "
                    f"{what} parameters for {', '.join(rows)} from finite client updates; the run stops "
                    "and the last checkpoint is kept (a method option may be out of range)"
                )

    def skip_server_step(self, unavailable: tuple[int, ...]) -> None:
        """A round in which no client trained (all unavailable): no server step, every client
        keeps its state; the method is told (:meth:`~fedmtl.methods.base.Method.skip_round`)."""
        self.method.skip_round(self.number)
        assert self.clients.receipts is not None
        self.clients.receipts.drop_unneeded(self.number, self.method.encoder_rows(self.number))
        if self.ranks.is_zero:
            print(
                f"warning: round {self.number}: all {len(unavailable)} clients that would train are unavailable "
                f"(availability.dropout {self.cfg.availability.dropout}); the round has no server step and "
                "every client keeps its state (counted in metrics.csv as server/unavailable)",
                file=sys.stderr,
                flush=True,
            )

    def finish_clients(self) -> None:
        """The method's work after the last aggregation (e.g. FedBABU's fine-tuning)."""
        for i in self.clients.mine:
            module, state = self.fed.load(i)
            self.method.finish(self.fed.context(i, module, state, self.number))
            self.clients.store_state(i, state)

    # ------------------------------------------------------------------ what to log

    def count_traffic(self, trained: list[int] | None, receive_nothing: list[int]) -> dict[str, float]:
        """The round's bytes up and down (the method's ``exchange``; the clients that trained
        upload, all but ``receive_nothing`` download: dropped updates, unavailable clients, every
        client in a round without a server step), added to the run's totals; returns its scalars."""
        uploading, downloading = communication.senders_and_receivers(
            len(self.clients), trained, receive_nothing
        )
        exchange = self.method.exchange(self.number)
        traffic = communication.round_traffic(exchange, self.fed.record.part_bytes, uploading, downloading)
        self.fed.record.add_traffic(traffic)
        return communication.traffic_values(self.clients.names, traffic)

    def training_values(
        self, losses: torch.Tensor, participants: list[int] | None, dropped: list[int]
    ) -> dict[str, float]:
        """The round's training scalars: each participant's losses, each client group's
        learning rate, the participants and the
        dropped updates."""
        values: dict[str, float] = {}
        for i, spec in enumerate(self.clients.specs):
            if participants is not None and i not in participants:
                continue
            values[f"train/{spec.name}/loss"] = float(losses[i, TOTAL_SLOT])
            for task in spec.tasks:
                values[f"train/{spec.name}/{task}_loss"] = float(losses[i, TASK_SLOTS[task]])
            if losses[i, PENALTY_SLOT] != 0:
                values[f"train/{spec.name}/penalty"] = float(losses[i, PENALTY_SLOT])
        values |= group_rates(self.clients.specs, losses, participants)
        if participants is not None:
            values["server/participants"] = float(len(participants))
        values["server/dropped_updates"] = float(len(dropped))
        return values


def group_rates(
    specs: list[ClientSpec], losses: torch.Tensor, participants: list[int] | None
) -> dict[str, float]:
    """``lr/clients[g]``: the learning rate client group g trained at this round, the mean over
    its clients that trained of each one's mean rate over its steps. A group's clients share
    one schedule, but one that sat rounds out (availability, participation) is behind in it,
    so they may differ; the mean says where the group is. Groups with no client training this
    round have no value."""
    rates: dict[int, list[float]] = {}
    for i, spec in enumerate(specs):
        if participants is None or i in participants:
            rates.setdefault(spec.group, []).append(float(losses[i, LR_SLOT]))
    return {f"lr/clients[{g}]": sum(r) / len(r) for g, r in sorted(rates.items())}
