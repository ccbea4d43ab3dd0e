"""The clients of a run on one rank: who they are, their data, their models, and their state.

:class:`Clients` answers everything the rounds ask about clients: the scenario's specs (the
federation's and the held-out ones, numbered after them), which rank holds each, their
training and validation data (each dataset read and checked once), the device model of each
architecture (shared by same-shaped clients), a client's first draw, and its state in the
client store with its pending receipts (``receipts.py``) applied when it is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from fedmtl.aggregation import ClientInfo, FlatLayout, decoder_owners_of, head_groups_of
from fedmtl.config import RunConfig
from fedmtl.data.cache import MIB, SampleCache
from fedmtl.data.datasets import DATASETS, DenseDataset, build_dataset
from fedmtl.federated import stopping
from fedmtl.federated.client import ClientModule, ClientSpec
from fedmtl.federated.ranks import Ranks
from fedmtl.federated.receipts import Receipt, Receipts
from fedmtl.federated.scenario import build_scenario
from fedmtl.federated.sharding import assign_clients
from fedmtl.federated.store import (
    ClientState,
    ClientStore,
    encoder_row_numel,
    encoder_row_of,
    with_encoder,
    without_encoder,
)
from fedmtl.methods.base import ClientContext, Method, new_track
from fedmtl.models import reinitialise
from fedmtl.seeds import derive_seed
from fedmtl.tensors import host_state, load_into

Architecture = tuple[str, tuple[str, ...]]  # (dataset, tasks)
#: (client, its device module, its state, round) -> what the method's hooks see of it.
ContextMaker = Callable[[int, ClientModule, ClientState, int], ClientContext]


class Clients:
    """The scenario's clients as this rank sees them (construct once per run)."""

    def __init__(self, cfg: RunConfig, ranks: Ranks, method: Method) -> None:
        self.cfg = cfg
        self.ranks = ranks
        self.method = method
        self.specs, self.held_out = build_scenario(cfg)
        self.rank_of = assign_clients([s.cost for s in self.specs], ranks.world)
        self.mine = [i for i, r in enumerate(self.rank_of) if r == ranks.rank]
        # Held-out clients are numbered after the federation's (len(specs) + h) for their seeds
        # and modules; they join only after the last round.
        held_ranks = assign_clients([s.cost for s in self.held_out], ranks.world) if self.held_out else []
        self.mine_held_out = [h for h, r in enumerate(held_ranks) if r == ranks.rank]
        self.total_epochs = {i: cfg.rounds * s.local_epochs for i, s in enumerate(self.specs)}
        for h, spec in enumerate(self.held_out):
            self.total_epochs[len(self.specs) + h] = max(1, spec.fine_tune_epochs)  # unused: no schedule
        self.store = ClientStore(cfg.store, Path(cfg.run_dir) / "store" / f"rank_{ranks.rank}")
        self._modules: dict[Architecture, ClientModule] = {}
        # Per architecture: a host model and its state as first drawn (drawn_model).
        self._templates: dict[Architecture, tuple[ClientModule, dict[str, torch.Tensor]]] = {}
        # This rank's decoded samples, kept across epochs and rounds (data.cache_mib; 0: none).
        self._samples = SampleCache(cfg.data.cache_mib * MIB) if cfg.data.cache_mib > 0 else None
        # One dataset per (dataset, tasks, split), read and checked once; clients take subsets.
        self._datasets: dict[tuple[str, tuple[str, ...], str], DenseDataset] = {}
        self.train_data = {i: self.dataset(i, "train") for i in self.mine}
        counts = self._num_samples()
        self.info = [
            ClientInfo(s.name, s.dataset, s.tasks, num_samples=counts[i]) for i, s in enumerate(self.specs)
        ]
        self.owners = decoder_owners_of(self.info)
        # Each client's rows in the round's decoder stack (owners are by client).
        self.decoder_rows = {
            i: [k for k, (c, _) in enumerate(self.owners) if c == i] for i in range(len(self.specs))
        }
        # Heads are exchanged only for a method that aggregates them (the unified model), in
        # (dataset, task, owners) groups; each client's (group, row in the group) per task.
        self.head_groups = head_groups_of(self.info) if method.shares_heads else []
        self.head_rows = {
            i: [(g, owners.index(i)) for g, (_, task, owners) in enumerate(self.head_groups) if i in owners]
            for i in range(len(self.specs))
        }
        self.receipts: Receipts | None = None  # set by the simulation once it knows the layouts
        # The encoder's parameter keys in the model's state, in its flat layout's order (set
        # with the receipts): what a state stored with its encoder in a row leaves out.
        self.encoder_keys: list[str] = []

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def spec(self, i: int) -> ClientSpec:
        """Client ``i``: the federation's, or held-out client ``i - len(specs)``."""
        return self.specs[i] if i < len(self.specs) else self.held_out[i - len(self.specs)]

    @property
    def datasets_of(self) -> dict[str, str]:
        return {s.name: s.dataset for s in [*self.specs, *self.held_out]}

    # ------------------------------------------------------------------ data

    def img_size(self, i: int) -> tuple[int, int]:
        """Client ``i``'s training crop: the config's, or its dataset's paper size. Swin fixes
        its input size at construction; its parameters do not depend on it, so clients on
        datasets of different sizes still aggregate."""
        size = self.cfg.data.train_size or DATASETS.get(self.spec(i).dataset).train_size
        return (int(size[0]), int(size[1]))

    def dataset(self, i: int, split: str) -> DenseDataset:
        """Client ``i``'s part of ``split``: its training indices and augmentation seed on the
        training split, the whole split for validation."""
        spec = self.spec(i)
        key = (spec.dataset, spec.tasks, split)
        if key not in self._datasets:
            self._datasets[key] = build_dataset(
                spec.dataset,
                self.cfg.data.resolved_root(),
                split,
                tasks=spec.tasks,
                train_size=self.img_size(i),
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
        local = torch.zeros(len(self.specs), dtype=torch.long, device=self.ranks.device)
        for i, data in self.train_data.items():
            local[i] = len(data)
        return [int(n) for n in self.ranks.sum(local).tolist()]

    def loader(self, dataset: DenseDataset, batch_size: int, shuffle_seed: int | None) -> DataLoader:
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

    # ------------------------------------------------------------------ models

    def module(self, i: int) -> ClientModule:
        """The device-resident model of client ``i``'s architecture (shared by same-shaped clients)."""
        spec = self.spec(i)
        key = (spec.dataset, spec.tasks)
        if key not in self._modules:
            module = ClientModule(
                spec, self.cfg.model, self.total_epochs[i], self.img_size(i), self.cfg.evaluation
            )
            self._modules[key] = self.ranks.fabric.to_device(module)
        module = self._modules[key]
        module.spec = spec
        module.total_epochs = self.total_epochs[i]
        return module

    def drawn_model(self, i: int) -> ClientModule:
        """Client ``i``'s first model, in its architecture's host template.

        Every client starts from the same encoder, as from a shared pretrained backbone; its
        decoders and heads are its own random draw, as the public code builds each client's
        model on its own. Seeds by client index make the start independent of the rank. The
        host template is built once per architecture, its decoders and heads redrawn per client."""
        spec = self.spec(i)
        key = (spec.dataset, spec.tasks)
        if key not in self._templates:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.cfg.seed, "init"))
                module = ClientModule(spec, self.cfg.model, self.total_epochs[i], img_size=self.img_size(i))
            self._templates[key] = (module, host_state(module.model))
        module, drawn = self._templates[key]
        load_into(module.model, drawn)
        reinitialise(module.model.decoders, derive_seed(self.cfg.seed, "init", "decoders", i))
        reinitialise(module.model.heads, derive_seed(self.cfg.seed, "init", "heads", i))
        return module

    def initial_state(self, i: int) -> ClientState:
        module = self.drawn_model(i)
        personal = self.method.init_client(module.model, self.info[i], self.cfg.seed)
        return {**new_track(module.model), "personal": personal}

    def layouts(self) -> tuple[FlatLayout, FlatLayout, list[FlatLayout]]:
        """The flat layouts of an encoder and a decoder (the same for every client) and of each
        exchanged head group (a head's layout depends on its task and dataset)."""
        probe = self.module(self.mine[0] if self.mine else 0)
        encoder = FlatLayout.from_module(probe.model.encoder)
        decoder = FlatLayout.from_module(next(iter(probe.model.decoders.values())))
        heads = [
            FlatLayout.from_module(self.module(owners[0]).model.heads[task])
            for _, task, owners in self.head_groups
        ]
        return encoder, decoder, heads

    # ------------------------------------------------------------------ state

    def stored(self, i: int, params_only: bool = False) -> ClientState:
        """Client ``i``'s stored state (``params_only``: without optimiser and schedule state),
        its encoder read back from the row that holds it (see :meth:`store_state`); a client that
        was never stored starts from its initial state, drawn again when needed."""
        if i not in self.store:
            return self.initial_state(i)
        state = self.store.get(i, params_only)
        row_round = encoder_row_of(state)
        if row_round is None:
            return state
        assert self.receipts is not None
        row = self.receipts.rows.read_kept(row_round, i, "trained", encoder_row_numel(state))
        return with_encoder(state, row)

    def load(
        self, i: int, context: ContextMaker, params_only: bool = False
    ) -> tuple[ClientModule, ClientState]:
        """Client ``i``'s model on the device, holding its federated track with every pending
        receipt applied (oldest first, through the method's ``receive`` hooks), and its state
        (``state["model"]`` updated to match). Nothing is stored: :meth:`store` does that."""
        state = self.stored(i, params_only)
        module = self.module(i)
        load_into(module.model, state["model"])
        receipts = self.receipts.of(i) if self.receipts is not None else []
        if receipts:  # a memory store hands out its own dicts: the receipts' changes stay out of them
            state = {**state, "personal": dict(state["personal"])}
        for receipt in receipts:
            self._apply(i, receipt, context(i, module, state, receipt.round))
        if receipts:
            state["model"] = host_state(module.model)
        return module, state

    def store_state(self, i: int, state: ClientState, encoder_row: int | None = None) -> None:
        """Store client ``i``'s state, its receipts taken. ``encoder_row``: the round whose
        ``"trained"`` row (a file of the run's row store) already holds the state's encoder
        parameters, which the state's own file then leaves out (each encoder written once)."""
        if encoder_row is not None:
            state = without_encoder(state, self.encoder_keys, encoder_row)
        self.store.put(i, state)
        if self.receipts is not None:
            self.receipts.stored(i, encoder_row)

    def _apply(self, i: int, receipt: Receipt, ctx: ClientContext) -> None:
        """Client ``i`` takes ``receipt``: its new encoder (formed from the encoder it holds,
        the round's shared vectors and its own rows) and its decoder and head rows that the
        server step did not keep."""
        layout = ctx.encoder_layout
        assert self.receipts is not None
        rows = {"trained": layout.flatten(ctx.model.encoder)}
        for name in receipt.own_rows(i):
            rows[name] = self.receipts.rows.read(receipt.round, i, name, layout.numel)
        encoder = receipt.encoders.row(i, rows)
        kept = receipt.decoders_kept
        decoders = {
            self.owners[k][1]: receipt.decoders[k]
            for k in self.decoder_rows[i]
            if kept is None or not bool(kept[k])
        }
        self.method.receive(ctx, encoder, decoders)
        if receipt.heads is not None:
            heads_kept = receipt.heads_kept
            heads = {
                self.head_groups[g][1]: receipt.heads[g][j]
                for g, j in self.head_rows[i]
                if heads_kept is None or not bool(heads_kept[g][j])
            }
            self.method.receive_heads(ctx, heads)
