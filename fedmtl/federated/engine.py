"""The round loop: Fabric shards clients across devices, the server aggregates between rounds.

Every rank runs the same loop on its share of the clients (balanced by expected work):

1. train: each of the rank's clients is materialised from the client store (or drawn, the
   first time) into a model of its architecture on the device, trains its local epochs, and
   goes back to the store;
2. exchange: the round's pools (``pools.py``: encoders, decoders, and the head groups of a
   method that shares heads), before and after training, are all-gathered, so every rank
   holds every client's update; a streamed round (``aggregation``) leaves the encoders in
   files of the run directory (``rows.py``) instead;
3. aggregate: every rank runs the (deterministic) server step on the same inputs, so server
   state stays identical everywhere without a broadcast;
4. write back: each rank writes the new parameters of its own clients into their stored state;
5. evaluate (every few rounds and at the end, all clients or a sample: ``evaluation.py``)
   and log; checkpoint.

Client modules are never wrapped in DistributedDataParallel: a client trains on one rank
only. Fabric provides the processes, the device, autocast and the collectives. Nothing
about a client's training depends on which rank trains it (its initial weights, data order
and augmentation derive from the seed and the client index), so results do not depend on
the number of devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fedmtl.aggregation import (
    ClientInfo,
    FlatLayout,
    HeadGroup,
    RoundInput,
    RoundOutput,
    communication,
    decoder_owners_of,
    head_groups_of,
)
from fedmtl.aggregation.stream import EncoderMix
from fedmtl.config import RunConfig
from fedmtl.data.cache import MIB, SampleCache
from fedmtl.data.datasets import DATASETS, DenseDataset, build_dataset
from fedmtl.federated import availability, checkpoint, evaluation, health, held_out, pools, stopping
from fedmtl.federated import rows as row_files
from fedmtl.federated.client import ClientModule, ClientSpec
from fedmtl.federated.health import RunStopped, all_finite, nonfinite_pools
from fedmtl.federated.pools import Pool, RoundPools
from fedmtl.federated.runlog import CSVScalarLogger, create_loggers, log_heatmaps
from fedmtl.federated.scenario import TrainedImages, build_scenario, class_histograms
from fedmtl.federated.sharding import assign_clients
from fedmtl.federated.store import ClientState, ClientStore, atomic_write_text
from fedmtl.federated.training import (
    LOSS_COLUMNS,
    PENALTY_SLOT,
    TASK_SLOTS,
    TOTAL_SLOT,
    LocalTrainer,
)
from fedmtl.methods.base import ClientContext, Method, new_track
from fedmtl.models import reinitialise
from fedmtl.seeds import derive_seed
from fedmtl.tasks import get_task
from fedmtl.tensors import to_host
from fedmtl.terminal import interactive


@contextlib.contextmanager
def timed(times: dict[str, float], phase: str) -> Iterator[None]:
    """``times[phase]``: the seconds the block took."""
    start = time.perf_counter()
    yield
    times[phase] = time.perf_counter() - start


class Simulation:
    """A federated run on one rank. Construct inside a launched Fabric, then call :meth:`fit`."""

    def __init__(self, fabric: L.Fabric, cfg: RunConfig) -> None:
        self.fabric = fabric
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.specs, self.held_out = build_scenario(cfg)
        self.world = fabric.world_size
        self.ranks = assign_clients([s.cost for s in self.specs], self.world)
        self.mine = [i for i, r in enumerate(self.ranks) if r == fabric.global_rank]
        # Held-out clients are numbered after the federation's (len(specs) + h) for their seeds
        # and modules; they join only after the last round.
        held_ranks = assign_clients([s.cost for s in self.held_out], self.world) if self.held_out else []
        self.mine_held_out = [h for h, r in enumerate(held_ranks) if r == fabric.global_rank]
        self.method = cfg.algorithm
        self.total_epochs = {i: cfg.rounds * s.local_epochs for i, s in enumerate(self.specs)}
        for h, spec in enumerate(self.held_out):
            self.total_epochs[len(self.specs) + h] = max(1, spec.fine_tune_epochs)  # unused: no schedule
        self.store = ClientStore(cfg.store, self.run_dir / "store" / f"rank_{fabric.global_rank}")
        self._modules: dict[tuple[str, tuple[str, ...]], ClientModule] = {}
        # Per architecture: a host model and its state as first drawn (_initial_state).
        self._templates: dict[tuple[str, tuple[str, ...]], tuple[ClientModule, dict[str, torch.Tensor]]] = {}
        self.rows_dir = self.run_dir / "store" / row_files.FOLDER
        self.streamed = False  # set by setup_layouts, which knows the encoder's size
        # This rank's decoded samples, kept across epochs and rounds (data.cache_mib; 0: none).
        self._samples = SampleCache(cfg.data.cache_mib * MIB) if cfg.data.cache_mib > 0 else None
        # One dataset per (dataset, tasks, split), read and checked once; clients take subsets.
        self._datasets: dict[tuple[str, tuple[str, ...], str], DenseDataset] = {}
        self._train_data = {i: self._dataset(i, "train") for i in self.mine}
        counts = self._num_samples()
        self.clients = [
            ClientInfo(s.name, s.dataset, s.tasks, num_samples=counts[i]) for i, s in enumerate(self.specs)
        ]
        self.owners = decoder_owners_of(self.clients)
        # Row of each client's first decoder in the round's decoder stack (owners are by client).
        self._first_decoder = {i: self.owners.index((i, s.tasks[0])) for i, s in enumerate(self.specs)}
        # Heads are exchanged only for a method that aggregates them (the unified model), in
        # (dataset, task, owners) groups; (client, task) -> its group.
        self.head_groups = head_groups_of(self.clients) if self.method.shares_heads else []
        self._head_group = {(i, t): g for g, (_, t, owners) in enumerate(self.head_groups) for i in owners}
        self.method.setup(cfg.rounds, self.clients, cfg.seed)
        self.trainer = LocalTrainer(fabric, cfg.seed, cfg.rounds, self._loader)
        # The models a method evaluates, its paper's one first (e.g. Ditto: personal, global).
        self.labels = [self.method.evaluated, *getattr(self.method, "also_evaluated", ())]
        self.history: list[dict[str, Any]] = []
        # Computed for results.json (rank 0), federated then held-out clients.
        self._histograms: list[dict[str, int] | None] | None = None
        self._train_images: list[int] = []
        # Bytes each client sent and received so far, by pool, and the rounds they cover (a
        # checkpoint keeps them: dropped updates make the cost depend on the run, not the config).
        self.traffic: communication.Totals = {}
        self.traffic_rounds = 0
        # Progress bars on a terminal (rank 0); one plain line per round in logs (CI).
        self._bars = fabric.global_rank == 0 and interactive()

    # ------------------------------------------------------------------ data and modules

    def _spec(self, i: int) -> ClientSpec:
        """Client ``i``: the federation's, or held-out client ``i - len(specs)``."""
        return self.specs[i] if i < len(self.specs) else self.held_out[i - len(self.specs)]

    def _img_size(self, i: int) -> tuple[int, int]:
        """Client ``i``'s training crop: the config's, or its dataset's paper size. Swin fixes
        its input size at construction; its parameters do not depend on it, so clients on
        datasets of different sizes still aggregate."""
        size = self.cfg.data.train_size or DATASETS.get(self._spec(i).dataset).train_size
        return (int(size[0]), int(size[1]))

    def _dataset(self, i: int, split: str) -> DenseDataset:
        """Client ``i``'s part of ``split``: its training indices and augmentation seed on the
        training split, the whole split for validation."""
        spec = self._spec(i)
        key = (spec.dataset, spec.tasks, split)
        if key not in self._datasets:
            self._datasets[key] = build_dataset(
                spec.dataset,
                self.cfg.data.resolved_root(),
                split,
                tasks=spec.tasks,
                train_size=self._img_size(i),
                indices=[] if split == "train" else None,
                scale_range=self.cfg.data.scale_range,
                cache=self._samples,
                human_parts_selection=self.cfg.data.human_parts_selection,
            )
        if split != "train":  # evaluation reads no seed and keeps no state: shared
            return self._datasets[key]
        return self._datasets[key].subset(spec.train_indices, seed=derive_seed(self.cfg.seed, "augment", i))

    def _num_samples(self) -> list[int]:
        """Training samples of every client (known to every rank: the server weighs by them)."""
        local = torch.zeros(len(self.specs), dtype=torch.long, device=self.fabric.device)
        for i, data in self._train_data.items():
            local[i] = len(data)
        return [int(n) for n in self._sum_over_ranks(local).tolist()]

    def _module(self, i: int) -> ClientModule:
        """The device-resident model of client ``i``'s architecture (shared by same-shaped clients)."""
        spec = self._spec(i)
        key = (spec.dataset, spec.tasks)
        if key not in self._modules:
            module = ClientModule(
                spec, self.cfg.model, self.total_epochs[i], self._img_size(i), self.cfg.evaluation
            )
            self._modules[key] = self.fabric.to_device(module)
        module = self._modules[key]
        module.spec = spec
        module.total_epochs = self.total_epochs[i]
        return module

    def _initial_state(self, i: int) -> ClientState:
        module = self._drawn_model(i)
        personal = self.method.init_client(module.model, self.clients[i], self.cfg.seed)
        return {**new_track(module.model), "personal": personal}

    def _drawn_model(self, i: int) -> ClientModule:
        """Client ``i``'s first model, in its architecture's host template.

        Every client starts from the same encoder, as from a shared pretrained backbone; its
        decoders and heads are its own random draw, as the public code builds each client's
        model on its own. Seeds by client index make the start independent of the rank. The
        host template is built once per architecture, its decoders and heads redrawn per client."""
        spec = self._spec(i)
        key = (spec.dataset, spec.tasks)
        if key not in self._templates:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.cfg.seed, "init"))
                module = ClientModule(spec, self.cfg.model, self.total_epochs[i], img_size=self._img_size(i))
            self._templates[key] = (module, to_host(module.model.state_dict()))
        module, drawn = self._templates[key]
        module.model.load_state_dict(drawn)
        reinitialise(module.model.decoders, derive_seed(self.cfg.seed, "init", "decoders", i))
        reinitialise(module.model.heads, derive_seed(self.cfg.seed, "init", "heads", i))
        return module

    def _state(self, i: int, partly: bool = False) -> ClientState:
        """Client ``i``'s stored state (``partly``: only a part of it will be read); a client
        that never trained nor received has none stored and starts from its initial state,
        drawn again when it is needed."""
        return self.store.get(i, partly) if i in self.store else self._initial_state(i)

    def _materialise(self, i: int) -> tuple[ClientModule, ClientState]:
        """Client ``i``'s model on the device, holding its federated track; and its stored state."""
        state = self._state(i)
        module = self._module(i)
        module.model.load_state_dict(state["model"])
        return module, state

    def _context(self, i: int, module: ClientModule, state: ClientState, work: float = 1.0) -> ClientContext:
        """What the method's client hooks see of client ``i`` (``train`` runs its tracks, each
        local epoch cut to ``work`` of its batches: a straggler's round)."""
        return ClientContext(
            index=i,
            client=self.clients[i],
            round=self.round,
            rounds=self.cfg.rounds,
            local_epochs=self.specs[i].local_epochs,
            optimizer=self.specs[i].optimizer,
            state=state,
            model=module.model,
            encoder_layout=self.enc_layout,
            decoder_layout=self.dec_layout,
            seed=self.cfg.seed,
            train=functools.partial(self.trainer.train, module, i, self._train_data.get(i), work=work),
        )

    def _loader(self, dataset: DenseDataset, batch_size: int, shuffle_seed: int | None) -> DataLoader:
        """A training loader (shuffled with ``shuffle_seed``; the last incomplete batch is
        dropped, as the public code does) or, with ``shuffle_seed`` None, an evaluation one.
        Either stops at the next batch when SIGTERM / SIGINT asks the run to stop (stopping.py)."""
        training = shuffle_seed is not None
        generator = torch.Generator().manual_seed(shuffle_seed) if training else None
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=training,
            drop_last=training,
            generator=generator,
            num_workers=self.cfg.data.num_workers,
            persistent_workers=False,
        )
        return stopping.checked(loader)  # type: ignore[return-value] - iterated only

    # ------------------------------------------------------------------ one round

    def _round_pools(self) -> RoundPools:
        """This rank's rows of the round: the encoders (unless streamed: row files), the
        decoders and the shared head groups, before training and as deltas."""

        def pool(layout: FlatLayout, owners: list[tuple[int, str]], part: pools.Part) -> Pool:
            return Pool(layout, owners, part, self.ranks, self.fabric.global_rank, self.fabric.device)

        encoders = None
        if not self.streamed:
            encoders = pool(self.enc_layout, [(i, "") for i in range(len(self.specs))], pools.encoder_part)
        heads = [
            pool(layout, [(i, task) for i in owners], pools.head_part)
            for (_, task, owners), layout in zip(self.head_groups, self.head_layouts, strict=True)
        ]
        return RoundPools(encoders, pool(self.dec_layout, self.owners, pools.decoder_part), heads)

    def _train_client(
        self, i: int, rows: RoundPools, takes_part: bool, work: float = 1.0
    ) -> tuple[torch.Tensor, int, float]:
        """Local training of client ``i`` (the method's ``local_update``, ``work`` of each local
        epoch: ``availability.straggler_work`` for a straggler, else 1): writes its rows of
        parameters before training and of deltas (a streamed round: its encoder row files);
        returns its mean losses [LOSS_COLUMNS], the :mod:`~fedmtl.federated.health` mask of what
        diverged (NaN/inf, or an exploding update: beyond ``update_norm_limit``) and the largest
        growth of its parts. A client that sits the round out, or whose update diverged, writes
        zero deltas (no row file, unless the method reads every client's rows) and keeps the
        state it started the round with."""
        spec = self.specs[i]
        module, state = self._materialise(i)
        for pool in rows:
            pool.start(i, module.model)
        # The encoder before training: its pool row, or (streamed: no encoder pool) a flat copy.
        enc_prev = rows.encoders.row(i)[0] if rows.encoders else self.enc_layout.flatten(module.model.encoder)
        if not takes_part:
            if self.streamed:
                self._write_rows(i, enc_prev, None)
            return torch.zeros(LOSS_COLUMNS, dtype=torch.float64), 0, 0.0
        limit = self.cfg.update_norm_limit
        heads_before = [self._head_vector(module, t) for t in spec.tasks] if limit is not None else []
        # The memory store hands out the stored state itself, which training changes in place.
        kept = to_host(state) if self.store.kind == "memory" else None
        losses = self.method.local_update(self._context(i, module, state, work))
        module.model.load_state_dict(state["model"])  # the federated track (a method may train others)
        bad = nonfinite_pools(module.model, spec.tasks, state["personal"])
        grown = 0.0
        if not bad:
            for pool in rows:
                pool.finish(i, module.model)
            if rows.encoders:
                enc_delta = rows.encoders.row(i)[1]
            else:
                enc_trained = self.enc_layout.flatten(module.model.encoder)
                enc_delta = enc_trained - enc_prev
            if limit is not None:
                growths = self._growths(i, rows.decoders, module, (enc_prev, enc_delta), heads_before)
                bad = health.exploding_parts(growths, limit)
                if bad:
                    grown = max(growths)
                    for pool in rows:
                        pool.drop(i)
        if bad:  # NaN/inf or exploding: no delta, and the state it started the round with
            if kept is not None:
                self.store.put(i, kept)  # a disk store still holds the round-start file
            if self.streamed:
                self._write_rows(i, enc_prev, None)
            return losses, bad, grown
        if self.streamed:
            self._write_rows(i, enc_prev, enc_trained)
        self.store.put(i, state)
        return losses, 0, 0.0

    def _write_rows(self, i: int, prev: torch.Tensor, trained: torch.Tensor | None) -> None:
        """A streamed round: client ``i``'s encoder rows the method names, from its encoder
        before and after training (``trained`` None: it did not train, or its update was
        dropped; it has rows only for a method that reads every client's, with a zero delta)."""
        if trained is None:
            if not self.method.reads_every_client:
                return
            trained = prev
        folder = row_files.round_folder(self.rows_dir, self.round)
        for name in self.method.encoder_rows(self.round):
            row = self.method.encoder_row(name, prev, trained, self.enc_layout)
            row_files.write_row(folder, i, name, row)

    def _growths(
        self,
        i: int,
        decoders: Pool,
        module: ClientModule,
        encoder: tuple[torch.Tensor, torch.Tensor],
        heads_before: list[torch.Tensor],
    ) -> list[float]:
        """How much client ``i``'s encoder (before, delta), then each task's decoder with its
        head, grew against where it started (:func:`~fedmtl.federated.health.growth`)."""
        heads_after = [self._head_vector(module, t) for t in self.specs[i].tasks]
        before, delta = encoder
        return [health.growth([before], [delta])] + [
            health.growth([decoders.prev[k], head], [decoders.delta[k], head_after - head])
            for (k, _), head, head_after in zip(decoders.rows_of(i), heads_before, heads_after, strict=True)
        ]

    @staticmethod
    def _head_vector(module: ClientModule, task: str) -> torch.Tensor:
        """A task head's parameters as one flat copy (heads are small)."""
        return torch.cat([p.detach().flatten().float() for p in module.model.heads[task].parameters()])

    def _train_round(
        self, participants: list[int] | None, stragglers: tuple[int, ...] = ()
    ) -> tuple[RoundPools, torch.Tensor, torch.Tensor]:
        """This rank's clients trained (``participants``; None: all; ``stragglers`` do
        ``availability.straggler_work`` of each epoch): their rows, losses [N, LOSS_COLUMNS]
        and divergence [N, 2]: each client's health mask and largest growth (zero for other
        ranks' clients)."""
        rows = self._round_pools()
        if self.streamed:
            names = self.method.encoder_rows(self.round)
            row_files.start_round(self.rows_dir, self.round, self.mine, names, self.fabric.global_rank == 0)
        losses = torch.zeros(len(self.specs), LOSS_COLUMNS, dtype=torch.float64)
        bad = torch.zeros(len(self.specs), 2, dtype=torch.float64)
        taking_part = set(range(len(self.specs)) if participants is None else participants)
        bar = tqdm(self.mine, desc=f"round {self.round} clients", leave=False, disable=not self._bars)
        work, slow = self.cfg.availability.straggler_work, set(stragglers)
        for i in bar:
            share = work if i in slow else 1.0
            losses[i], mask, grown = self._train_client(i, rows, i in taking_part, share)
            bad[i] = torch.tensor([mask, grown], dtype=torch.float64)
        return rows, losses, bad

    def _drop_nonfinite(self, bad: torch.Tensor, participants: list[int] | None) -> list[int]:
        """Apply the ``nonfinite`` policy to the clients whose update diverged: not finite, or
        exploding (``bad``: every client's health mask and growth, the same on every rank);
        returns the dropped clients. Raising here ends the round before its checkpoint: no
        checkpoint is ever written from a round with a diverged update in it."""
        dropped = [i for i in range(len(self.specs)) if int(bad[i, 0])]
        if not dropped:
            return []
        groups = health.client_groups(self.cfg.clients)

        def why(i: int) -> str:
            what = health.describe_update(int(bad[i, 0]), float(bad[i, 1]), self.specs[i].tasks)
            return f"{self.specs[i].name} ({what})"

        def group(g: int) -> str:
            return f"clients[{g}] ({self.cfg.clients[g].dataset}, lr {self.cfg.clients[g].optimizer.lr!r})"

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
            f"update_norm_limit = {self.cfg.update_norm_limit} times its norm at the start of the round"
            if exploded
            else ""
        )
        trained = len(self.specs) if participants is None else len(participants)
        if self.cfg.nonfinite == "stop" or len(dropped) == trained:
            every = len(dropped) == trained
            named = sorted({groups[i] for i in dropped})
            what = "; ".join(
                f"{group(g)}: {', '.join(why(i) for i in dropped if groups[i] == g)}" for g in named
            )
            latest = checkpoint.latest(self.run_dir)
            kept = f"the last checkpoint, {latest.name}, is kept" if latest else "no checkpoint was written"
            raise RunStopped(
                f"round {self.round}: {'every' if every else 'a'} client's update is {kind}: {what}{growth}. "
                f"The run stops (nonfinite: {self.cfg.nonfinite}) without saving round {self.round}; {kept}. "
                f"Lower the learning rate of {'these client groups' if len(named) > 1 else 'that client group'} "
                "(clients[].optimizer.lr)"
                + (
                    ""
                    if self.cfg.nonfinite == "drop" or every
                    else ", or set nonfinite: drop to skip such updates"
                )
            )
        if self.fabric.global_rank == 0:
            what = "; ".join(f"{why(i)} in {group(groups[i])}" for i in dropped)
            print(
                f"warning: round {self.round}: dropped the {update} of {what}; the client keeps its state "
                f"from before the round (nonfinite: drop; counted in metrics.csv as server/dropped_updates){growth}",
                file=sys.stderr,
                flush=True,
            )
        return dropped

    def _exchange(self, rows: RoundPools, participants: list[int] | None) -> RoundInput:
        """Every rank's rows, gathered into the server's input (a streamed round's encoders
        stay in their row files)."""
        encoders = rows.encoders.gather(self.fabric) if rows.encoders is not None else (None, None)
        decoders = rows.decoders.gather(self.fabric)
        heads = []
        for (dataset, task, owners), pool in zip(self.head_groups, rows.heads, strict=True):
            prev, deltas = pool.gather(self.fabric)
            heads.append(HeadGroup(dataset, task, pool.layout, owners, prev=prev, deltas=deltas))
        return RoundInput(
            round=self.round,
            clients=self.clients,
            encoder_layout=self.enc_layout,
            encoders_prev=encoders[0],
            encoder_deltas=encoders[1],
            decoder_layout=self.dec_layout,
            decoder_owners=self.owners,
            decoders_prev=decoders[0],
            decoder_deltas=decoders[1],
            participants=None if participants is None else tuple(participants),
            heads=heads,
        )

    def _aggregate(self, inputs: RoundInput) -> RoundOutput:
        """The method's server step: stacked, or streamed from the row files."""
        if not self.streamed:
            return self.method.aggregate(inputs)
        folder = row_files.round_folder(self.rows_dir, self.round)
        encoders = {
            name: row_files.FileRows(name, folder, self.enc_layout.numel, len(self.specs), owned=self.mine)
            for name in self.method.encoder_rows(self.round)
        }
        return self.method.server_step(inputs, encoders)

    def _new_encoder(self, output: RoundOutput, i: int, module: ClientModule) -> torch.Tensor:
        """Client ``i``'s row of the server's encoders; a streamed round forms it from the
        client's trained encoder (the model holds it), its other rows and the shared vectors."""
        if not isinstance(output.encoders, EncoderMix):
            return output.encoders[i]
        mix = output.encoders
        rows = {"trained": self.enc_layout.flatten(module.model.encoder)}
        folder = row_files.round_folder(self.rows_dir, self.round)
        for name in mix.needs(i):
            if name not in rows:
                rows[name] = row_files.read_row(folder, i, name, self.enc_layout.numel)
        return mix.row(i, rows)

    def _write_back(self, output: RoundOutput, skip: list[int]) -> None:
        """Hand the server's new encoder / decoder (/ head) rows to this rank's clients (the
        method's ``receive``: into the model by default) and store them; ``skip``: clients
        whose update was dropped keep their state."""
        for i in self.mine:
            if i in skip:
                continue
            module, state = self._materialise(i)
            first = self._first_decoder[i]
            rows = {task: output.decoders[first + j] for j, task in enumerate(self.specs[i].tasks)}
            ctx = self._context(i, module, state)
            self.method.receive(ctx, self._new_encoder(output, i, module), rows)
            if output.heads is not None:
                groups = {task: self._head_group[(i, task)] for task in self.specs[i].tasks}
                heads = {task: output.heads[g][self.head_groups[g][2].index(i)] for task, g in groups.items()}
                self.method.receive_heads(ctx, heads)
            state["model"] = to_host(module.model.state_dict())
            self.store.put(i, state)

    def _check_output(self, output: RoundOutput) -> None:
        """The server step must not create NaN/inf from finite updates (an overflow, a bug)."""
        stacks = [("decoder", output.decoders, [f"{self.specs[i].name}/{t}" for i, t in self.owners])]
        if isinstance(output.encoders, EncoderMix):  # the shared vectors; a client's own rows are finite
            vectors = output.encoders.vectors
            stacks.append(("encoder", vectors, [f"shared encoder vector {g}" for g in range(len(vectors))]))
        else:
            stacks.insert(0, ("encoder", output.encoders, [s.name for s in self.specs]))
        for stack, (_, task, owners) in zip(output.heads or [], self.head_groups, strict=False):
            stacks.append(("head", stack, [f"{self.specs[i].name}/{task}" for i in owners]))
        for what, stack, owner in stacks:
            finite = torch.isfinite(stack).all(dim=1).cpu()
            if not bool(finite.all()):
                rows = [owner[k] for k in torch.nonzero(~finite).flatten().tolist()]
                raise RunStopped(
                    f"round {self.round}: {type(self.method).__name__}'s server step returned non-finite "
                    f"{what} parameters for {', '.join(rows)} from finite client updates; the run stops "
                    "and the last checkpoint is kept (a method option may be out of range)"
                )

    @torch.no_grad()
    def _federated_parts(self) -> dict[held_out.Part, torch.Tensor]:
        """The parts of the federated model the held-out clients take: each shared part's mean
        over the federated clients' evaluated models that hold it (module held_out)."""
        shared = self.method.shared_parts
        first = len(self.specs)
        owner = {}  # a held-out client of each part's architecture: sizes every rank agrees on
        for h, spec in enumerate(self.held_out):
            for part in held_out.parts_of(spec.dataset, spec.tasks, shared):
                owner.setdefault(part, first + h)
        size = {
            part: held_out.flat_state(part.module(self._module(i).model)).numel() for part, i in owner.items()
        }
        sums = held_out.PartSums(list(owner), size)
        for i in self.mine:
            spec = self.specs[i]
            model_state = self.method.evaluated_models(self._state(i, partly=True))[self.labels[0]]
            if not all_finite(model_state.values()):  # a diverged client gives the new ones nothing
                continue
            module = self._module(i)
            module.model.load_state_dict(model_state)
            sums.add(module.model, held_out.parts_of(spec.dataset, spec.tasks, shared))
        sums.sums = self._sum_over_ranks(sums.sums.to(self.fabric.device)).cpu()
        sums.counts = self._sum_over_ranks(sums.counts.to(self.fabric.device)).cpu()
        return sums.means()

    def _held_out_results(self) -> dict[str, dict[str, float]]:
        """Every held-out client after the last round: the federated model's shared parts on
        its first draw, fine-tuned on its own data, evaluated: {client: {task: value}}."""
        parts = self._federated_parts()
        shared = self.method.shared_parts
        first = len(self.specs)
        table = torch.zeros(
            len(self.held_out), len(TASK_SLOTS), dtype=torch.float64, device=self.fabric.device
        )
        with contextlib.suppress(stopping.Abandoned):  # the ranks still meet in the sum below
            for h in self.mine_held_out:
                i, spec = first + h, self.held_out[h]
                module = self._module(i)
                module.model.load_state_dict(self._drawn_model(i).model.state_dict())
                for part in held_out.parts_of(spec.dataset, spec.tasks, shared):
                    if part in parts:
                        held_out.load_flat_state(part.module(module.model), parts[part])
                track = new_track(module.model)
                epochs = spec.fine_tune_epochs
                if epochs:
                    data = self._dataset(i, "train")
                    self.trainer.train(
                        module, i, data, track, epochs=epochs, order="held-out", fine_tune=spec.optimizer
                    )
                module.model.load_state_dict(track["model"])
                if not all_finite(track["model"].values()):
                    table[h] = math.nan
                    continue
                with torch.no_grad():
                    for task, value in self._validate(i, module).items():
                        table[h, TASK_SLOTS[task]] = value
        table = self._sum_over_ranks(table).cpu()
        return {
            spec.name: {t: float(table[h, TASK_SLOTS[t]]) for t in spec.tasks}
            for h, spec in enumerate(self.held_out)
        }

    def _finish_clients(self) -> None:
        """The method's work after the last aggregation (e.g. FedBABU's fine-tuning)."""
        for i in self.mine:
            module, state = self._materialise(i)
            self.method.finish(self._context(i, module, state))
            self.store.put(i, state)

    def _sum_over_ranks(self, table: torch.Tensor) -> torch.Tensor:
        return self.fabric.all_reduce(table, reduce_op="sum") if self.world > 1 else table

    def _agree(self, failure: OSError | None = None, stop: bool = True, finished: bool = False) -> None:
        """Every rank meets here. A write that failed on some rank (``failure``: this rank's)
        ends every rank's run: the lowest failing rank re-raises its error (the CLI prints it),
        the others stop silently. With ``stop``, a SIGTERM / SIGINT received by any rank stops
        them all (:class:`~fedmtl.federated.stopping.Stopped`; ``finished``: the round is done)."""
        signum = stopping.requested() if stop else 0
        failed = self.fabric.global_rank if failure is not None else self.world  # world: none
        round_ = getattr(self, "round", None)
        if self.world > 1:  # one collective: a rank that stopped alone would hang the others
            flags = torch.tensor([signum, self.world - failed], device=self.fabric.device)
            flags = self.fabric.all_reduce(flags, reduce_op="max").tolist()
            signum, failed = int(flags[0]), self.world - int(flags[1])
        if (signum or failed < self.world) and self.fabric.global_rank == 0:
            stopping.expect_children_exit()
        if failed < self.world:
            if failed == self.fabric.global_rank:
                raise failure  # type: ignore[misc]
            raise stopping.PeerFailed(f"rank {failed} failed")
        if signum:
            raise stopping.Stopped(signum, round_, finished)

    @contextlib.contextmanager
    def _phase(self, stop: bool = True, undo: Callable[[], None] | None = None) -> Iterator[None]:
        """A part of a round that may end early (a stop request, a write that fails): every
        rank leaves it before the next collective, then they agree (:meth:`_agree`); if they
        stop, rank 0 runs ``undo`` (removes what the part wrote)."""
        failure = None
        try:
            yield
        except stopping.Abandoned:
            stop = True
        except OSError as err:  # a full disk, or any file error one rank alone would stop on
            failure = err
        try:
            self._agree(failure, stop)
        except BaseException:
            if undo is not None and self.fabric.global_rank == 0:
                undo()
            raise

    @torch.no_grad()
    def evaluate(self, only: list[int] | None = None) -> dict[str, dict[str, dict[str, float]]]:
        """Task metrics of every client (or the clients ``only``) on its dataset's full
        validation split, for each model the method evaluates: {label: {client: {task: value}}},
        its paper's label first. A label some client does not have yet (FedBABU's fine-tuned
        copy before the end) is left out."""
        evaluated = list(range(len(self.specs))) if only is None else sorted(only)
        device = self.fabric.device
        table = torch.zeros(
            len(self.labels), len(self.specs), len(TASK_SLOTS), dtype=torch.float64, device=device
        )
        present = torch.zeros(len(self.labels), dtype=torch.float64, device=device)
        # On a stop request the ranks still meet in the sums below, then stop together (_agree).
        with contextlib.suppress(stopping.Abandoned):
            chosen = set(evaluated)
            for i in [i for i in self.mine if i in chosen]:
                state = self._state(i, partly=True)  # the evaluated models, not the optimiser state
                module = self._module(i)
                for label, model_state in self.method.evaluated_models(state).items():
                    present[self.labels.index(label)] += 1
                    if not all_finite(model_state.values()):  # NaN metrics, not numbers from NaN logits
                        table[self.labels.index(label), i] = math.nan
                        continue
                    module.model.load_state_dict(model_state)
                    for task, value in self._validate(i, module).items():
                        table[self.labels.index(label), i, TASK_SLOTS[task]] = value
        table = self._sum_over_ranks(table).cpu()
        present = self._sum_over_ranks(present).cpu()
        return {
            label: {
                self.specs[i].name: {t: float(table[k, i, TASK_SLOTS[t]]) for t in self.specs[i].tasks}
                for i in evaluated
            }
            for k, label in enumerate(self.labels)
            if int(present[k]) == len(evaluated)
        }

    def _validate(self, i: int, module: ClientModule) -> dict[str, float]:
        """The task metrics of the model in ``module`` on client ``i``'s validation split."""
        module.eval()
        loader = self._loader(self._dataset(i, "val"), self.cfg.evaluation.batch_size, None)
        for batch in self.trainer.batches(loader):
            with self.fabric.autocast():
                module.validation_step(batch)
        return module.compute_metrics()

    def _evaluated_clients(self) -> list[int] | None:
        """The clients this round's evaluation covers (None: every client)."""
        last = self.round == self.cfg.rounds
        return evaluation.sampled_clients(self.cfg.evaluation.clients, len(self.specs), self.cfg.seed, last)

    @property
    def _datasets_of(self) -> dict[str, str]:
        return {s.name: s.dataset for s in [*self.specs, *self.held_out]}

    # ------------------------------------------------------------------ the run

    def setup_layouts(self) -> None:
        """The flat layouts of an encoder and a decoder (the same for every client)."""
        probe = self._module(self.mine[0] if self.mine else 0)
        self.enc_layout = FlatLayout.from_module(probe.model.encoder)
        self.dec_layout = FlatLayout.from_module(next(iter(probe.model.decoders.values())))
        # A head's layout depends on its task and dataset: one per exchanged head group.
        self.head_layouts = [
            FlatLayout.from_module(self._module(owners[0]).model.heads[task])
            for _, task, owners in self.head_groups
        ]
        self.streamed = streams(self.cfg.aggregation, self.method, len(self.specs), self.enc_layout.numel)
        heads = {
            (dataset, task): layout
            for (dataset, task, _), layout in zip(self.head_groups, self.head_layouts, strict=True)
        }
        self.part_bytes = communication.part_bytes(
            self.clients, self.enc_layout, self.dec_layout, heads, pools.WIRE_DTYPE
        )

    def _start(self) -> int:
        """Fill the store from the latest checkpoint (``resume``) or from scratch; the first round."""
        folder, note = checkpoint.resumable(self.run_dir) if self.cfg.resume else (None, None)
        if note and self.fabric.global_rank == 0:
            print(f"resume: {note}", file=sys.stderr)
        if folder is None:
            if self.cfg.resume and self.fabric.global_rank == 0:
                print(f"resume: no checkpoint in {self.run_dir}, starting from round 1", file=sys.stderr)
            return 1  # a client's initial state is drawn when it is first needed
        done = self.restore(folder)
        if self.fabric.global_rank == 0:
            print(f"resume: continuing after round {done} from {folder}", file=sys.stderr)
        return done + 1

    def restore(self, folder: Path) -> int:
        """Load a checkpoint: this rank's clients, the server state, the history. Returns
        the round it was written after."""
        server = checkpoint.load_server(folder)
        self.method.load_state_dict(server["aggregator"])
        self.history = server["history"]
        # A checkpoint written before the cost was counted has none: its rounds go uncounted.
        counted = server.get("communication", {"rounds": 0, "totals": "{}"})
        self.traffic, self.traffic_rounds = json.loads(counted["totals"]), int(counted["rounds"])
        for i in self.mine:
            self.store.put(i, checkpoint.load_client(folder, i))
        return int(server["round"])

    def _checkpoint(self) -> None:
        """Each rank writes its clients, then rank 0 publishes. A write that fails (a full disk)
        on any rank ends the run on every rank; the staging folder goes, the last checkpoint stays."""
        discard = functools.partial(checkpoint.discard, self.run_dir, self.round)
        with self._phase(stop=False, undo=discard):  # also the barrier before publishing
            for i in self.mine:
                stored = self.store.file_of(i)
                if stored is not None:
                    checkpoint.link_client(self.run_dir, self.round, i, stored)
                else:
                    checkpoint.write_client(self.run_dir, self.round, i, self._state(i))
        with self._phase(stop=False, undo=discard):
            if self.fabric.global_rank == 0:
                server = {
                    "round": self.round,
                    "aggregator": self.method.state_dict(),
                    "history": self.history,
                    # As JSON text: pickling the dict would share the client-name strings it
                    # has in common with the history only in an uninterrupted run, and the
                    # checkpoint's bytes would depend on whether the run was resumed.
                    "communication": {"rounds": self.traffic_rounds, "totals": json.dumps(self.traffic)},
                }
                checkpoint.publish(self.run_dir, self.round, server)

    def _round(self) -> tuple[dict[str, float], dict[str, dict[str, dict[str, float]]] | None]:
        """One round on this rank: train → exchange → aggregate → write back (→ finish, after
        the last) → evaluate (on evaluation rounds). Returns the scalars to log and the
        evaluation results (None when not evaluated this round)."""
        times: dict[str, float] = {}
        # Drawn for every client on every rank from the seed: the same everywhere, no exchange.
        drawn = availability.draw(
            self.cfg.availability,
            self.cfg.seed,
            self.round,
            len(self.specs),
            self.method.participants(self.round),
        )
        with timed(times, "train"), self._phase():  # a stop request or a failed write ends the round here
            rows, losses, bad = self._train_round(drawn.training, drawn.stragglers)
        with timed(times, "exchange"):
            losses, dropped, participants = self._settle(losses, bad, drawn.training)
            inputs = self._exchange(rows, participants) if participants != [] else None
        if inputs is None:  # every client that would train is unavailable
            self._skip_server_step(drawn.unavailable)
            receive_nothing = list(range(len(self.specs)))
        else:  # unavailable clients, like dropped updates, receive nothing and keep their state
            receive_nothing = [*dropped, *drawn.unavailable]
            self._server_step(inputs, receive_nothing, times)
        del rows, inputs
        if self.round == self.cfg.rounds and self.method.finishes:
            with timed(times, "finish"), self._phase():
                self._finish_clients()
        values = self._training_values(losses, participants, dropped)
        if self.cfg.availability.enabled:
            values["server/unavailable"] = float(len(drawn.unavailable))
            values["server/stragglers"] = float(len(drawn.stragglers))
        # The clients that trained uploaded (those whose update was dropped too).
        values |= self._count_traffic(drawn.training, receive_nothing)
        results = None
        every = self.cfg.evaluation.every
        if self.round == self.cfg.rounds or (every > 0 and self.round % every == 0):
            with timed(times, "eval"):
                results = self.evaluate(self._evaluated_clients())
                self._agree()  # a stop requested during the evaluation: its numbers are not logged
            if self.round == self.cfg.rounds and self.held_out:
                with timed(times, "held_out"), self._phase():
                    results[held_out.LABEL] = self._held_out_results()
            values |= evaluation.logged_values(results, self.labels, self._datasets_of)
        values |= {f"server/{k}": v for k, v in self.method.log_values().items()}
        values |= {f"time/{k}": v for k, v in times.items()}
        return values, results

    def _server_step(self, inputs: RoundInput, skip: list[int], times: dict[str, float]) -> None:
        """Aggregate the round's rows and hand the result to this rank's clients, but ``skip``."""
        with timed(times, "aggregate"):
            output = self._aggregate(inputs)
            output.check_against(inputs)
            self._check_output(output)
        with timed(times, "write_back"), self._phase(stop=False):  # a stop request waits for the round's end
            self._write_back(output, skip=skip)

    def _skip_server_step(self, unavailable: tuple[int, ...]) -> None:
        """A round in which no client trained (all unavailable): no server step, every client
        keeps its state; the method is told (:meth:`~fedmtl.methods.base.Method.skip_round`)."""
        self.method.skip_round(self.round)
        if self.fabric.global_rank == 0:
            print(
                f"warning: round {self.round}: all {len(unavailable)} clients that would train are unavailable "
                f"(availability.dropout {self.cfg.availability.dropout}); the round has no server step and "
                "every client keeps its state (counted in metrics.csv as server/unavailable)",
                file=sys.stderr,
                flush=True,
            )

    def _count_traffic(self, trained: list[int] | None, receive_nothing: list[int]) -> dict[str, float]:
        """The round's bytes up and down (the method's ``exchange``; the clients that trained
        upload, all but ``receive_nothing`` download: dropped updates, unavailable clients, every
        client in a round without a server step), added to the run's totals; returns its scalars."""
        uploading, downloading = communication.senders_and_receivers(
            len(self.specs), trained, receive_nothing
        )
        exchange = self.method.exchange(self.round)
        traffic = communication.round_traffic(exchange, self.part_bytes, uploading, downloading)
        names = [s.name for s in self.specs]
        communication.add_round(self.traffic, names, traffic)
        self.traffic_rounds += 1
        return communication.traffic_values(names, traffic)

    def _settle(
        self, losses: torch.Tensor, bad: torch.Tensor, participants: list[int] | None
    ) -> tuple[torch.Tensor, list[int], list[int] | None]:
        """Every rank's losses and divergence summed into one table; the ``nonfinite`` policy
        applied. Returns the losses, the dropped clients and the server step's participants: a
        dropped client is a non-participant, its rows its round-start parameters and zero deltas."""
        table = torch.cat([losses, bad], dim=1).to(self.fabric.device)
        table = self._sum_over_ranks(table).cpu()
        losses, bad = table[:, :-2], table[:, -2:]
        dropped = self._drop_nonfinite(bad, participants)
        if dropped:
            taking_part = range(len(self.specs)) if participants is None else participants
            participants = [i for i in taking_part if i not in dropped]
        return losses, dropped, participants

    def _training_values(
        self, losses: torch.Tensor, participants: list[int] | None, dropped: list[int]
    ) -> dict[str, float]:
        """The round's training scalars: each participant's losses, the participants and the
        dropped updates."""
        values: dict[str, float] = {}
        for i, spec in enumerate(self.specs):
            if participants is not None and i not in participants:
                continue
            values[f"train/{spec.name}/loss"] = float(losses[i, TOTAL_SLOT])
            for task in spec.tasks:
                values[f"train/{spec.name}/{task}_loss"] = float(losses[i, TASK_SLOTS[task]])
            if losses[i, PENALTY_SLOT] != 0:
                values[f"train/{spec.name}/penalty"] = float(losses[i, PENALTY_SLOT])
        if participants is not None:
            values["server/participants"] = float(len(participants))
        values["server/dropped_updates"] = float(len(dropped))
        return values

    def fit(self) -> dict[str, Any]:
        """Rounds from the first not yet done to ``cfg.rounds``; writes results.json."""
        cfg = self.cfg
        self.setup_layouts()
        with self._phase(stop=False):  # a disk store that cannot be written stops every rank
            first = self._start()
        is_zero = self.fabric.global_rank == 0
        if first > cfg.rounds and self.history:  # a finished run: nothing to train or rewrite
            if is_zero:
                print(f"resume: the run finished its {cfg.rounds} rounds; its results:", file=sys.stderr)
            self._clear_store()
            summary = self.summary(self.history[-1]["metrics"], cfg.rounds)
            if is_zero and not (self.run_dir / "results.json").is_file():  # its write failed (a full disk)
                atomic_write_text(self.run_dir / "results.json", json.dumps(summary, indent=2))
            return summary
        with self._phase(stop=False):  # a full disk on rank 0 stops every rank
            for logger in self.fabric.loggers:
                if isinstance(logger, CSVScalarLogger) and is_zero:
                    logger.truncate_after(first - 1)  # a resumed run redoes the rounds after its checkpoint
        try:
            return self._rounds(first)
        except stopping.Stopped as stop:
            self._close_loggers("stopped", exit_code=stop.exit_code)  # wandb keeps what was logged
            self._clear_store()  # the checkpoint holds what a resume needs
            raise
        except BaseException as err:
            self._close_loggers("failed")  # a crash still closes the wandb run
            if isinstance(err, OSError | stopping.PeerFailed):
                self._clear_store()  # on a full disk, room: a resume reads the checkpoint, not the store
            raise

    def _clear_store(self) -> None:
        """Forget the client states between rounds and a streamed round's row files (scratch:
        a checkpoint holds what a resume needs)."""
        self.store.clear()
        shutil.rmtree(self.rows_dir, ignore_errors=True)

    def _close_loggers(self, status: str, exit_code: int | None = None) -> None:
        for logger in self.fabric.loggers:
            logger.finalize(status)
            wandb = self.fabric.global_rank == 0 and type(logger).__name__ == "WandbLogger"
            # A failed run never starts a wandb run just to end it.
            if wandb and (status == "success" or logger._experiment is not None):
                code = exit_code if exit_code is not None else 0 if status == "success" else 1
                logger.experiment.finish(exit_code=code)

    def _rounds(self, first: int) -> dict[str, Any]:
        cfg = self.cfg
        is_zero = self.fabric.global_rank == 0
        if is_zero and cfg.availability.dropout > 0 and self.method.needs_every_client:
            print(
                f"note: availability.dropout {cfg.availability.dropout}: {type(self.method).__name__} mixes every "
                "client's update in every round, so an unavailable client enters its server step as a dropped "
                "update does (its round-start parameters, a zero update) and receives nothing",
                file=sys.stderr,
                flush=True,
            )
        rounds = tqdm(
            range(first, cfg.rounds + 1),
            desc="rounds",
            initial=first - 1,
            total=cfg.rounds,
            disable=not self._bars,
        )
        for self.round in rounds:
            values, results = self._round()
            if results is not None:
                self.history.append({"round": self.round, "metrics": results})
            with self._phase(stop=False):  # metrics.csv on a full disk stops every rank
                self.fabric.log_dict(values, step=self.round)
                if is_zero and (results is not None):  # heatmaps on evaluation rounds, like the metrics
                    log_heatmaps(self.fabric.loggers, self.method.log_matrices(), self.round)
            if is_zero and not self._bars:
                print(progress_line(self.round, cfg.rounds, values), file=sys.stderr, flush=True)
            every = cfg.checkpoint_every
            if self.round == cfg.rounds or (every > 0 and self.round % every == 0):
                self._checkpoint()
            if self.round < cfg.rounds:
                self._agree(finished=True)  # the safe point: SIGTERM / SIGINT stop the run here
        return self._finish(self.history[-1]["metrics"] if self.history else {})

    def summary(self, results: dict[str, dict[str, dict[str, float]]], rounds: int) -> dict[str, Any]:
        """The results.json content: the run's seed, the final metrics per client and task of the
        model the method reports (``evaluated``), those of any other model it evaluates
        (``also_evaluated``), and the server's values."""

        def metric(label: str, client: str, task: str) -> float | None:
            value = results.get(label, {}).get(client, {}).get(task, math.nan)
            return None if math.isnan(value) else value  # JSON has no NaN: null

        def table(label: str, specs: list[ClientSpec] = self.specs) -> dict[str, Any]:
            return {
                s.name: {
                    "dataset": s.dataset,
                    "tasks": list(s.tasks),
                    "metrics": {t: {get_task(t).metric_name: metric(label, s.name, t)} for t in s.tasks},
                }
                for s in specs
            }

        summary = {
            "rounds": rounds,
            "algorithm": type(self.method).__name__,
            "seed": self.cfg.seed,  # fedmtl report pairs runs of different methods by seed
            "evaluated": self.labels[0],
            "clients": table(self.labels[0]),
            "server": self.method.log_values(),
            # Per dataset and task, across clients: mean, standard deviation, clients counted
            "tasks": evaluation.task_summary(results.get(self.labels[0], {}), self._datasets_of),
            # Bytes up and down, per client by pool and in all (docs/evaluation.md, "Communication cost")
            "communication": communication.totals_summary(self.traffic, self.traffic_rounds),
        }
        if self.cfg.availability.enabled:
            summary["availability"] = self._availability_totals(rounds)
        if len(self.labels) > 1:
            summary["also_evaluated"] = {label: table(label) for label in self.labels[1:]}
        if self.head_groups:
            summary["unified"] = self._unified(summary["clients"])
        if self.held_out:
            clients = table(held_out.LABEL, self.held_out)
            for spec in self.held_out:
                clients[spec.name]["fine_tune_epochs"] = spec.fine_tune_epochs
            summary["held_out"] = {
                "clients": clients,
                "tasks": evaluation.task_summary(results.get(held_out.LABEL, {}), self._datasets_of),
            }
        self._record_partition(
            summary["clients"],
            *summary.get("also_evaluated", {}).values(),
            *([summary["held_out"]["clients"]] if self.held_out else []),
        )
        # Evaluated models (or their predictions) with NaN/inf: their metrics are null above.
        nonfinite = {
            label: [c for c, tasks in results[label].items() if any(math.isnan(v) for v in tasks.values())]
            for label in self.labels
            if label in results
        }
        if any(nonfinite.values()):
            summary["nonfinite"] = {label: names for label, names in nonfinite.items() if names}
        return summary

    def _record_partition(self, *tables: dict[str, Any]) -> None:
        """Each client's ``train_images`` (the images it trains on) and ``class_histogram``
        (those images per dominant class), into its entries of ``tables`` (the federation's
        clients, under each evaluated model, and the held-out ones). The histograms read every training label once; only
        rank 0, which writes results.json, computes them."""
        if self.fabric.global_rank != 0:
            return
        specs = [*self.specs, *self.held_out]
        if self._histograms is None:
            trained = TrainedImages(self.cfg)  # one read of each subset-keeping dataset for both
            self._histograms = class_histograms(self.cfg, specs, trained)
            self._train_images = [c.num_samples for c in self.clients] + [
                len(trained(s.dataset, s.tasks, s.train_indices)) for s in self.held_out
            ]
        for spec, count, histogram in zip(specs, self._train_images, self._histograms, strict=True):
            for table in tables:
                if spec.name in table:
                    table[spec.name]["train_images"] = count
                    table[spec.name]["class_histogram"] = histogram

    def _availability_totals(self, rounds: int) -> dict[str, Any]:
        """The run's availability settings and its unavailable and straggling client-rounds over
        rounds 1..``rounds``, drawn again from the seed (a resumed run counts every round)."""
        config = self.cfg.availability
        counts = availability.totals(config, self.cfg.seed, rounds, len(self.specs), self.method.participants)
        return {**dataclasses.asdict(config), **counts}

    def _unified(self, clients: dict[str, Any]) -> dict[str, Any]:
        """The unified model's metric per task (``dataset/task``), for a method that shares
        heads: in the unified-model setting (encoders over all, decoders and heads per task)
        the clients of a task hold the same parameters and differ only in their local
        BatchNorm statistics, so the task's value is the mean over them (null if one is null)."""
        out = {}
        for dataset, task, owners in self.head_groups:
            name = get_task(task).metric_name
            values = [clients[self.specs[i].name]["metrics"][task][name] for i in owners]
            mean = None if any(v is None for v in values) else sum(values) / len(values)
            out[f"{dataset}/{task}"] = {name: mean, "clients": [self.specs[i].name for i in owners]}
        return out

    def _finish(self, results: dict[str, dict[str, float]]) -> dict[str, Any]:
        summary = self.summary(results, self.cfg.rounds)
        if self.fabric.global_rank == 0:
            atomic_write_text(self.run_dir / "results.json", json.dumps(summary, indent=2))
        self._close_loggers("success")  # flushes the offline wandb run before the process exits
        self._clear_store()  # the final checkpoint holds every client's state
        return summary


#: ``aggregation: auto`` streams the encoders when their stacked rows (before training and
#: deltas, [N, P] each) would take more than this many bytes; below, the stacked step runs.
STACKED_ENCODERS_UP_TO = 2**30


def streams(aggregation: str, method: Method, num_clients: int, encoder_numel: int) -> bool:
    """Whether a run's server step takes the encoders streamed (``RunConfig.aggregation``)."""
    if aggregation == "auto":
        return 2 * num_clients * encoder_numel * 4 > STACKED_ENCODERS_UP_TO
    return aggregation == "streamed"


#: Up to this many clients the round line names each one; above, it summarises each group of
#: replicas (the clients whose names differ only in the replica number) as mean [min, max].
PER_CLIENT_UP_TO = 8


def progress_line(round_: int, rounds: int, values: dict[str, float]) -> str:
    """One line per round for logs without a terminal (CI, nohup): each client's training
    loss, the metrics of the evaluated model when it was evaluated, the megabytes all clients
    sent and received, and the timings; with more than :data:`PER_CLIENT_UP_TO` clients, per
    group of replicas instead, so the line stays readable at a thousand clients."""
    parts = [f"round {round_}/{rounds}"]
    if "server/participants" in values:  # client sampling
        parts.append(f"participants {int(values['server/participants'])}")
    losses = {k.split("/")[1]: v for k, v in values.items() if k.startswith("train/") and k.endswith("/loss")}
    summarise = len(losses) > PER_CLIENT_UP_TO
    if losses:
        parts.append("loss: " + _listed({(c, ""): v for c, v in losses.items()}, summarise))
    metrics = {tuple(k[4:].split("/", 1)): v for k, v in values.items() if k.startswith("val/")}
    if metrics:
        parts.append("val: " + _listed(metrics, summarise))
    if values.get("server/dropped_updates"):
        parts.append(f"dropped updates: {int(values['server/dropped_updates'])}")
    for key, what in [("server/unavailable", "unavailable"), ("server/stragglers", "stragglers")]:
        if values.get(key):
            parts.append(f"{what}: {int(values[key])}")
    if "comm/up_bytes" in values:
        up, down = values["comm/up_bytes"] / 1e6, values["comm/down_bytes"] / 1e6
        parts.append(f"comm: {up:.3g} MB up, {down:.3g} MB down")
    parts.append(
        "time: " + ", ".join(f"{k[5:]} {v:.1f}s" for k, v in values.items() if k.startswith("time/"))
    )
    return " | ".join(parts)


def _listed(values: dict[tuple[str, str], float], summarise: bool) -> str:
    """``{(client, metric): value}`` as "client/metric v, ...", or per group of replicas as
    "group/metric ×n mean [min, max]" (``metric`` "" for a client's loss)."""

    def label(client: str, metric: str) -> str:
        return f"{client}/{metric}" if metric else client

    if not summarise:
        return ", ".join(f"{label(c, m)} {v:.4g}" for (c, m), v in values.items())
    groups: dict[tuple[str, str], list[float]] = {}
    for (client, metric), value in values.items():
        groups.setdefault((re.sub(r"-\d+$", "", client), metric), []).append(value)
    return ", ".join(
        f"{label(g, m)} ×{len(v)} {sum(v) / len(v):.4g} [{min(v):.4g}, {max(v):.4g}]"
        for (g, m), v in groups.items()
    )


def _limit_threads(fabric: L.Fabric, cfg: RunConfig) -> None:
    # CPU processes on one machine share its cores; more threads than cores only slows them down.
    if fabric.device.type == "cpu":
        torch.set_num_threads(cfg.cpu_threads or max(1, (os.cpu_count() or 1) // max(1, cfg.devices)))


def _launch(cfg: RunConfig, loggers: list | None = None) -> L.Fabric:
    """Fabric with the config's devices, launched (on CPU, with its thread budget)."""
    fabric = L.Fabric(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        precision=cfg.precision,
        strategy="ddp" if cfg.devices * cfg.num_nodes > 1 else "auto",
        loggers=loggers,
    )
    fabric.launch()
    _limit_threads(fabric, cfg)
    return fabric


def run(cfg: RunConfig, config_dict: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Launch Fabric with ``cfg``'s devices and run the simulation.

    Returns the results summary on global rank 0 and None on the other ranks."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with stopping.deferred():  # SIGTERM / SIGINT stop the run at a safe point (stopping.py)
        fabric = _launch(cfg, loggers=create_loggers(cfg.logger, run_dir, config_dict or {}))
        stopping.watch_children(fabric)
        fabric.seed_everything(cfg.seed, verbose=False)
        summary = Simulation(fabric, cfg).fit()
    return summary if fabric.global_rank == 0 else None


def evaluate_checkpoint(cfg: RunConfig, output: Path | None = None) -> dict[str, Any] | None:
    """Evaluate every client of a run's latest checkpoint on its validation split."""
    from fedmtl.federated.preflight import check_environment

    check_environment(cfg)  # --accelerator gpu without a GPU: one line, not Lightning's traceback
    if output is not None and not os.access(output.parent, os.W_OK | os.X_OK):
        # Said before the evaluation, not as a traceback after it (a read-only copy of a run)
        raise ValueError(
            f"run_dir {output.parent} is read-only for this process, and `fedmtl {output.name.split('_')[0]}` "
            f"writes {output.name} there: copy the run to a writable folder and pass that as --run_dir"
        )
    folder, note = checkpoint.resumable(cfg.run_dir)
    if note:
        print(f"validate: {note}", file=sys.stderr)
    if folder is None:
        raise FileNotFoundError(
            f"no checkpoint in {Path(cfg.run_dir) / 'checkpoints'}: run `fedmtl fit` first"
        )
    fabric = _launch(cfg)
    sim = Simulation(fabric, cfg)
    sim.setup_layouts()
    rounds = sim.restore(folder)
    results = sim.evaluate()
    recorded = sim.history[-1]["metrics"] if sim.history and sim.history[-1]["round"] == cfg.rounds else {}
    if held_out.LABEL in recorded:  # held-out clients are never stored: their recorded metrics
        results[held_out.LABEL] = recorded[held_out.LABEL]
    summary = sim.summary(results, rounds=rounds)
    if fabric.global_rank != 0:
        return None
    if output is not None:
        atomic_write_text(output, json.dumps(summary, indent=2))
    return summary
