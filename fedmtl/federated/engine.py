"""The round loop: Fabric shards clients across devices, the server aggregates between rounds.

Every rank runs the same loop on its share of the clients (balanced by expected work):

1. train: each of the rank's clients is materialised from the client store into a model of
   its architecture on the device, trains its local epochs, and goes back to the store;
2. exchange: the flat encoder / decoder parameters before and after training are
   all-gathered, so every rank holds every client's update;
3. aggregate: every rank runs the (deterministic) aggregator on the same inputs, so server
   state stays identical everywhere without a broadcast; each rank writes the new
   parameters of its own clients into their stored state;
4. evaluate (every few rounds and at the end) and log; checkpoint.

Client modules are never wrapped in DistributedDataParallel: a client trains on one rank
only. Fabric provides the processes, the device, autocast and the collectives. Nothing
about a client's training depends on which rank trains it (its initial weights, data order
and augmentation derive from the seed and the client index), so results do not depend on
the number of devices.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
from fedmtl.config import RunConfig
from fedmtl.data.datasets import DATASETS, DenseDataset, build_dataset
from fedmtl.federated import checkpoint
from fedmtl.federated.client import ClientModule
from fedmtl.federated.runlog import CSVScalarLogger, create_loggers, log_heatmaps
from fedmtl.federated.scenario import build_clients
from fedmtl.federated.sharding import assign_clients
from fedmtl.federated.store import ClientState, ClientStore
from fedmtl.tasks import TASKS, get_task

TASK_SLOTS = {name: i for i, name in enumerate(TASKS)}  # fixed columns for exchanging per-task scalars


def _seed(*parts: int | str) -> int:
    """A 31-bit seed from named parts, the same in every process and on every run."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _interactive() -> bool:
    return sys.stderr.isatty()


class Simulation:
    """A federated run on one rank. Construct inside a launched Fabric, then call :meth:`fit`."""

    def __init__(self, fabric: L.Fabric, cfg: RunConfig) -> None:
        self.fabric = fabric
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.specs = build_clients(cfg)
        self.world = fabric.world_size
        self.ranks = assign_clients([s.cost for s in self.specs], self.world)
        self.mine = [i for i, r in enumerate(self.ranks) if r == fabric.global_rank]
        self.aggregator = cfg.algorithm
        self.total_epochs = {i: cfg.rounds * s.local_epochs for i, s in enumerate(self.specs)}
        self.store = ClientStore(cfg.store, self.run_dir / "store" / f"rank_{fabric.global_rank}")
        self._modules: dict[tuple[str, tuple[str, ...]], ClientModule] = {}
        self._train_data = {i: self._dataset(i, "train") for i in self.mine}
        self._val_data: dict[int, DenseDataset] = {}
        self.clients = [
            ClientInfo(s.name, s.dataset, s.tasks, num_samples=self._num_samples(i))
            for i, s in enumerate(self.specs)
        ]
        self.owners = decoder_owners_of(self.clients)
        # Row of each client's first decoder in the round's decoder stack (owners are by client).
        self._first_decoder = {i: self.owners.index((i, s.tasks[0])) for i, s in enumerate(self.specs)}
        self.history: list[dict[str, Any]] = []
        # Progress bars on a terminal (rank 0); one plain line per round in logs (CI).
        self._bars = fabric.global_rank == 0 and _interactive()

    # ------------------------------------------------------------------ data and modules

    def _img_size(self, i: int) -> tuple[int, int]:
        """Client ``i``'s training crop: the config's, or its dataset's paper size. Swin fixes
        its input size at construction; its parameters do not depend on it, so clients on
        datasets of different sizes still aggregate."""
        size = self.cfg.data.train_size or DATASETS.get(self.specs[i].dataset).train_size
        return (int(size[0]), int(size[1]))

    def _dataset(self, i: int, split: str) -> DenseDataset:
        spec = self.specs[i]
        return build_dataset(
            spec.dataset,
            self.cfg.data.resolved_root(),
            split,
            tasks=spec.tasks,
            train_size=self._img_size(i),
            indices=spec.train_indices if split == "train" else None,
            seed=_seed(self.cfg.seed, "augment", i),
        )

    def _num_samples(self, i: int) -> int:
        """Training samples of every client (known to every rank: the server weighs by them)."""
        local = torch.tensor(
            [len(self._train_data[i]) if i in self._train_data else 0], device=self.fabric.device
        )
        return int(self._sum_over_ranks(local).item())

    def _module(self, i: int) -> ClientModule:
        """The device-resident model of client ``i``'s architecture (shared by same-shaped clients)."""
        spec = self.specs[i]
        key = (spec.dataset, spec.tasks)
        if key not in self._modules:
            module = ClientModule(spec, self.cfg.model, self.total_epochs[i], img_size=self._img_size(i))
            self._modules[key] = self.fabric.to_device(module)
        module = self._modules[key]
        module.spec = spec
        module.total_epochs = self.total_epochs[i]
        return module

    def _initial_state(self, i: int) -> ClientState:
        # Every client starts from the same encoder, as from a shared pretrained backbone; the
        # same seed on every rank makes the start independent of where the client trains.
        torch.manual_seed(_seed(self.cfg.seed, "init"))
        module = ClientModule(self.specs[i], self.cfg.model, self.total_epochs[i], img_size=self._img_size(i))
        return _client_state(module, *module.configure_optimizers(), epochs_done=0)

    def _materialise(self, i: int) -> tuple[ClientModule, ClientState]:
        """Client ``i``'s model on the device, with its parameters and buffers from the store."""
        state = self.store.get(i)
        module = self._module(i)
        module.model.load_state_dict(state["model"])
        return module, state

    def _loader(self, dataset: DenseDataset, batch_size: int, shuffle_seed: int | None) -> DataLoader:
        generator = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle_seed is not None,
            generator=generator,
            num_workers=self.cfg.data.num_workers,
            persistent_workers=False,
        )

    def _batches(self, loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
        for batch in loader:
            batch.pop("meta", None)
            yield self.fabric.to_device(batch)

    # ------------------------------------------------------------------ one round

    def _round_buffers(self) -> dict[str, torch.Tensor]:
        """This rank's rows of the round: its clients' encoders, then their decoders in owner
        order, before training and as deltas. Written in place as clients finish, so no
        client's parameters are held twice."""
        n_enc = len(self.mine)
        n_dec = sum(len(self.specs[i].tasks) for i in self.mine)
        device = self.fabric.device
        return {
            "enc_prev": torch.empty(n_enc, self.enc_layout.numel, device=device),
            "enc_delta": torch.empty(n_enc, self.enc_layout.numel, device=device),
            "dec_prev": torch.empty(n_dec, self.dec_layout.numel, device=device),
            "dec_delta": torch.empty(n_dec, self.dec_layout.numel, device=device),
        }

    def _train_client(
        self, i: int, rows: dict[str, torch.Tensor], enc_row: int, dec_rows: slice
    ) -> torch.Tensor:
        """Local training of client ``i``: writes its parameter rows, returns mean losses
        (one column per task, the total last)."""
        spec = self.specs[i]
        module, state = self._materialise(i)
        optimizer, scheduler = module.configure_optimizers()
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        decoders = [module.model.decoders[t] for t in spec.tasks]
        rows["enc_prev"][enc_row] = self.enc_layout.flatten(module.model.encoder)
        rows["dec_prev"][dec_rows] = self.dec_layout.stack(decoders)
        optimizer = self.fabric.setup_optimizers(optimizer)
        dataset = self._train_data[i]
        # Summed on the device: reading a loss with .item() every step would stall a GPU.
        sums = torch.zeros(len(TASK_SLOTS) + 1, dtype=torch.float64, device=self.fabric.device)
        slots = [TASK_SLOTS[task] for task in spec.tasks]
        steps = 0
        module.train()
        for _ in range(spec.local_epochs):
            epoch = state["epochs_done"]
            dataset.set_epoch(epoch)
            torch.manual_seed(_seed(self.cfg.seed, "train", i, epoch))
            for batch in self._batches(
                self._loader(dataset, spec.batch_size, _seed(self.cfg.seed, "order", i, epoch))
            ):
                with self.fabric.autocast():
                    losses = module.training_step(batch)
                self.fabric.backward(losses["total"])
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                sums[-1] += losses["total"].detach()
                sums[slots] += torch.stack([losses[task].detach() for task in spec.tasks]).to(sums.dtype)
                steps += 1
            state["epochs_done"] = epoch + 1
            scheduler.step(state["epochs_done"])
        rows["enc_delta"][enc_row] = self.enc_layout.flatten(module.model.encoder)
        rows["enc_delta"][enc_row] -= rows["enc_prev"][enc_row]
        rows["dec_delta"][dec_rows] = self.dec_layout.stack(decoders)
        rows["dec_delta"][dec_rows] -= rows["dec_prev"][dec_rows]
        self.store.put(i, _client_state(module, optimizer, scheduler, state["epochs_done"]))
        return (sums / max(steps, 1)).cpu()

    def _train_round(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows = self._round_buffers()
        losses = torch.zeros(len(self.specs), len(TASK_SLOTS) + 1, dtype=torch.float64)
        dec_start = 0
        bar = tqdm(self.mine, desc=f"round {self.round} clients", leave=False, disable=not self._bars)
        for enc_row, i in enumerate(bar):
            n_tasks = len(self.specs[i].tasks)
            losses[i] = self._train_client(i, rows, enc_row, slice(dec_start, dec_start + n_tasks))
            dec_start += n_tasks
        return rows, losses

    def _gather(self, local: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Every rank's rows in client order; ``local`` holds this rank's, ``counts[i]`` rows
        per client. Ranks own different numbers of rows, so each pads to the largest share."""
        if self.world == 1:
            return local
        per_rank = [
            sum(c for c, r in zip(counts, self.ranks, strict=True) if r == rank) for rank in range(self.world)
        ]
        padded = torch.zeros(max(per_rank), local.shape[1], device=local.device, dtype=local.dtype)
        padded[: len(local)] = local
        gathered = self.fabric.all_gather(padded)  # [world, max rows, D]
        cursor = [0] * self.world
        out = []
        for count, rank in zip(counts, self.ranks, strict=True):
            out.append(gathered[rank, cursor[rank] : cursor[rank] + count])
            cursor[rank] += count
        return torch.cat(out)

    def _exchange(self, rows: dict[str, torch.Tensor]) -> RoundInput:
        enc_counts = [1] * len(self.specs)
        dec_counts = [len(s.tasks) for s in self.specs]
        return RoundInput(
            round=self.round,
            clients=self.clients,
            encoder_layout=self.enc_layout,
            encoders_prev=self._gather(rows.pop("enc_prev"), enc_counts),
            encoder_deltas=self._gather(rows.pop("enc_delta"), enc_counts),
            decoder_layout=self.dec_layout,
            decoder_owners=self.owners,
            decoders_prev=self._gather(rows.pop("dec_prev"), dec_counts),
            decoder_deltas=self._gather(rows.pop("dec_delta"), dec_counts),
        )

    def _write_back(self, encoders: torch.Tensor, decoders: torch.Tensor) -> None:
        """Put the server's new encoder / decoder parameters into this rank's stored clients."""
        for i in self.mine:
            state = self.store.get(i)
            model = state["model"]
            for name, value in self.enc_layout.unflatten(encoders[i]).items():
                model[f"encoder.{name}"] = value.detach().to("cpu", model[f"encoder.{name}"].dtype).clone()
            for j, task in enumerate(self.specs[i].tasks):
                row = decoders[self._first_decoder[i] + j]
                for name, value in self.dec_layout.unflatten(row).items():
                    key = f"decoders.{task}.{name}"
                    model[key] = value.detach().to("cpu", model[key].dtype).clone()
            self.store.put(i, state)

    def _sum_over_ranks(self, table: torch.Tensor) -> torch.Tensor:
        return self.fabric.all_reduce(table, reduce_op="sum") if self.world > 1 else table

    @torch.no_grad()
    def evaluate(self) -> dict[str, dict[str, float]]:
        """Task metrics of every client on its dataset's full validation split."""
        table = torch.zeros(len(self.specs), len(TASK_SLOTS), dtype=torch.float64, device=self.fabric.device)
        for i in self.mine:
            if i not in self._val_data:
                self._val_data[i] = self._dataset(i, "val")
            module, _ = self._materialise(i)
            module.eval()
            for batch in self._batches(self._loader(self._val_data[i], self.cfg.evaluation.batch_size, None)):
                with self.fabric.autocast():
                    module.validation_step(batch)
            for task, value in module.compute_metrics().items():
                table[i, TASK_SLOTS[task]] = value
        table = self._sum_over_ranks(table).cpu()
        return {
            s.name: {t: float(table[i, TASK_SLOTS[t]]) for t in s.tasks} for i, s in enumerate(self.specs)
        }

    # ------------------------------------------------------------------ the run

    def setup_layouts(self) -> None:
        """The flat layouts of an encoder and a decoder (the same for every client)."""
        probe = self._module(self.mine[0] if self.mine else 0)
        self.enc_layout = FlatLayout.from_module(probe.model.encoder)
        self.dec_layout = FlatLayout.from_module(next(iter(probe.model.decoders.values())))

    def _start(self) -> int:
        """Fill the store from the latest checkpoint (``resume``) or from scratch; the first round."""
        folder = checkpoint.latest(self.run_dir) if self.cfg.resume else None
        if folder is None:
            if self.cfg.resume and self.fabric.global_rank == 0:
                print(f"resume: no checkpoint in {self.run_dir}, starting from round 1", file=sys.stderr)
            for i in self.mine:
                self.store.put(i, self._initial_state(i))
            return 1
        done = self.restore(folder)
        if self.fabric.global_rank == 0:
            print(f"resume: continuing after round {done} from {folder}", file=sys.stderr)
        return done + 1

    def restore(self, folder: Path) -> int:
        """Load a checkpoint: this rank's clients, the server state, the history. Returns
        the round it was written after."""
        server = checkpoint.load_server(folder)
        self.aggregator.load_state_dict(server["aggregator"])
        self.history = server["history"]
        for i in self.mine:
            self.store.put(i, checkpoint.load_client(folder, i))
        return int(server["round"])

    def _checkpoint(self) -> None:
        for i in self.mine:
            checkpoint.write_client(self.run_dir, self.round, i, self.store.get(i))
        self.fabric.barrier()
        if self.fabric.global_rank == 0:
            server = {
                "round": self.round,
                "aggregator": self.aggregator.state_dict(),
                "history": self.history,
            }
            checkpoint.publish(self.run_dir, self.round, server)
        self.fabric.barrier()

    def _round(self) -> tuple[dict[str, float], dict[str, dict[str, float]] | None]:
        """One round on this rank: train, exchange, aggregate, maybe evaluate. Returns the
        scalars to log and the evaluation results (None when not evaluated this round)."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        rows, loss_table = self._train_round()
        timings["train"] = time.perf_counter() - start

        start = time.perf_counter()
        loss_table = self._sum_over_ranks(loss_table.to(self.fabric.device)).cpu()
        inputs = self._exchange(rows)
        timings["exchange"] = time.perf_counter() - start

        start = time.perf_counter()
        output = self.aggregator.aggregate(inputs)
        output.check_against(inputs)
        self._write_back(output.encoders, output.decoders)
        timings["aggregate"] = time.perf_counter() - start
        del rows, inputs, output

        values: dict[str, float] = {}
        for i, spec in enumerate(self.specs):
            values[f"train/{spec.name}/loss"] = float(loss_table[i, -1])
            for task in spec.tasks:
                values[f"train/{spec.name}/{task}_loss"] = float(loss_table[i, TASK_SLOTS[task]])
        every = self.cfg.evaluation.every
        results = None
        if self.round == self.cfg.rounds or (every > 0 and self.round % every == 0):
            start = time.perf_counter()
            results = self.evaluate()
            timings["eval"] = time.perf_counter() - start
            for name, metrics in results.items():
                for task, value in metrics.items():
                    values[f"val/{name}/{task}_{get_task(task).metric_name}"] = value
        values.update({f"server/{k}": v for k, v in self.aggregator.log_values().items()})
        values.update({f"time/{k}": v for k, v in timings.items()})
        return values, results

    def fit(self) -> dict[str, Any]:
        """Rounds from the first not yet done to ``cfg.rounds``; writes results.json."""
        cfg = self.cfg
        self.setup_layouts()
        first = self._start()
        is_zero = self.fabric.global_rank == 0
        for logger in self.fabric.loggers:
            if isinstance(logger, CSVScalarLogger) and is_zero:
                logger.truncate_after(first - 1)  # a resumed run redoes the rounds after its checkpoint
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
            self.fabric.log_dict(values, step=self.round)
            if is_zero and (results is not None):  # heatmaps on evaluation rounds, like the metrics
                log_heatmaps(self.fabric.loggers, self.aggregator.log_matrices(), self.round)
            if is_zero and not self._bars:
                line = " ".join(f"{k[5:]}={v:.1f}s" for k, v in values.items() if k.startswith("time/"))
                print(f"round {self.round}/{cfg.rounds} {line}", file=sys.stderr, flush=True)
            every = cfg.checkpoint_every
            if self.round == cfg.rounds or (every > 0 and self.round % every == 0):
                self._checkpoint()
        return self._finish(self.history[-1]["metrics"] if self.history else {})

    def summary(self, results: dict[str, dict[str, float]], rounds: int) -> dict[str, Any]:
        """The results.json content: final metrics per client and task, and the server's values."""
        return {
            "rounds": rounds,
            "algorithm": type(self.aggregator).__name__,
            "clients": {
                s.name: {
                    "dataset": s.dataset,
                    "tasks": list(s.tasks),
                    "metrics": {
                        t: {get_task(t).metric_name: results.get(s.name, {}).get(t, math.nan)}
                        for t in s.tasks
                    },
                }
                for s in self.specs
            },
            "server": self.aggregator.log_values(),
        }

    def _finish(self, results: dict[str, dict[str, float]]) -> dict[str, Any]:
        summary = self.summary(results, self.cfg.rounds)
        if self.fabric.global_rank == 0:
            path = self.run_dir / "results.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(path)
        for logger in self.fabric.loggers:
            logger.finalize("success")
            if self.fabric.global_rank == 0 and type(logger).__name__ == "WandbLogger":
                logger.experiment.finish()  # flush the offline run before the process exits
        self.store.clear()  # the final checkpoint holds every client's state
        return summary


def _client_state(module: ClientModule, optimizer: Any, scheduler: Any, epochs_done: int) -> ClientState:
    """What the store and the checkpoint keep of a client between rounds."""
    return {
        "model": module.model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epochs_done": epochs_done,
    }


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
    fabric = _launch(cfg, loggers=create_loggers(cfg.logger, run_dir, config_dict or {}))
    fabric.seed_everything(cfg.seed, verbose=False)
    summary = Simulation(fabric, cfg).fit()
    return summary if fabric.global_rank == 0 else None


def evaluate_checkpoint(cfg: RunConfig, output: Path | None = None) -> dict[str, Any] | None:
    """Evaluate every client of a run's latest checkpoint on its validation split."""
    folder = checkpoint.latest(cfg.run_dir)
    if folder is None:
        raise FileNotFoundError(
            f"no checkpoint in {Path(cfg.run_dir) / 'checkpoints'}: run `fedmtl fit` first"
        )
    fabric = _launch(cfg)
    sim = Simulation(fabric, cfg)
    sim.setup_layouts()
    rounds = sim.restore(folder)
    summary = sim.summary(sim.evaluate(), rounds=rounds)
    if fabric.global_rank != 0:
        return None
    if output is not None:
        output.write_text(json.dumps(summary, indent=2))
    return summary
