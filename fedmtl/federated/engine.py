"""The orchestrator of a run: start or resume, the rounds, checkpoints, and results.json.

Fabric launches one process per device (and node); every rank runs a :class:`Simulation` on
its share of the clients (balanced by expected work). The pieces, each in its own module:

- ``clients.py``: who the clients are, their data, models and stored state;
- ``rounds.py``: one round (train → settle → exchange → server step → receipts → evaluate);
- ``receipts.py``: the server's output kept per client and applied when it is next loaded;
- ``evaluator.py``: validating the clients and the held-out clients;
- ``ranks.py``: what every rank does together (sums, agreeing to stop);
- ``results.py``: the history, the communication cost and results.json;
- ``checkpoint.py`` / ``integrity.py``: checkpoint folders and their checksums.

Client modules are never wrapped in DistributedDataParallel: a client trains on one rank
only. Fabric provides the processes, the device, autocast and the collectives. Nothing
about a client's training depends on which rank trains it (its initial weights, data order
and augmentation derive from the seed and the client index), so results do not depend on
the number of devices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch

from fedmtl.aggregation import communication
from fedmtl.config import RunConfig
from fedmtl.federated import checkpoint, held_out, pools, stopping
from fedmtl.federated import rows as row_files
from fedmtl.federated.clients import Clients
from fedmtl.federated.evaluator import Evaluator
from fedmtl.federated.live import PER_CLIENT_UP_TO, LiveView, Quiet
from fedmtl.federated.ranks import Ranks
from fedmtl.federated.receipts import FileRowStore, MemoryRowStore, Receipt, Receipts, RowStore
from fedmtl.federated.results import RunRecord
from fedmtl.federated.rounds import Federation, Round
from fedmtl.federated.runlog import CSVScalarLogger, RoundWandbLogger, create_loggers, log_charts
from fedmtl.federated.store import ClientState, atomic_write_text, encoder_row_numel, encoder_row_of
from fedmtl.federated.training import LocalTrainer
from fedmtl.methods.base import Method
from fedmtl.privacy.dpsgd import SampleDP
from fedmtl.privacy.run import run_privacy
from fedmtl.terminal import interactive


class Simulation:
    """A federated run on one rank. Construct inside a launched Fabric, then call :meth:`fit`."""

    def __init__(self, fabric: L.Fabric, cfg: RunConfig, config: dict[str, Any] | None = None) -> None:
        self.fabric = fabric
        self.cfg = cfg
        # What every checkpoint records of the resolved config (``config``: the CLI's), which a
        # resume and ``validate`` compare with theirs before loading a state.
        self.config_record = checkpoint.config_record(config) if config else None
        self.run_dir = Path(cfg.run_dir)
        self.ranks = Ranks(fabric)
        self.method = cfg.algorithm
        self.clients = Clients(cfg, self.ranks, self.method)
        self.method.setup(cfg.rounds, self.clients.info, cfg.seed)
        encoder, decoder, heads = self.clients.layouts()
        self.streamed = streams(cfg.aggregation, self.method, len(self.clients), encoder.numel)
        rows: RowStore = (
            FileRowStore(self.run_dir / "store" / row_files.FOLDER)
            if self.streamed
            else MemoryRowStore(fabric)
        )
        self.clients.receipts = Receipts(rows, self.clients.mine)
        self.clients.encoder_keys = [f"encoder.{name}" for name in encoder.names]
        privacy = None
        if cfg.privacy.enabled or cfg.secure_aggregation:
            planned = int(config["rounds"]) if config and "rounds" in config else None
            privacy = run_privacy(cfg, self.method, self.clients, planned)
        trainer = LocalTrainer(
            fabric,
            cfg.seed,
            cfg.rounds,
            self.clients.loader,
            dp=SampleDP(privacy.noise_multiplier, cfg.privacy.clip, cfg.seed)
            if cfg.privacy.mode == "sample"
            else None,
        )
        head_layouts = {
            (dataset, task): layout
            for (dataset, task, _), layout in zip(self.clients.head_groups, heads, strict=True)
        }
        part_bytes = communication.part_bytes(
            self.clients.info, encoder, decoder, head_layouts, pools.WIRE_DTYPE
        )
        # The live view on a terminal (rank 0); one plain line per round in logs (CI).
        self.live = self.ranks.is_zero and interactive()
        self.federation = Federation(
            cfg, self.ranks, self.clients, self.method, trainer, encoder, decoder, heads, rows
        )
        self.evaluator = self.federation.evaluator = Evaluator(self.federation)
        self.record = self.federation.record = RunRecord(
            cfg, self.clients, self.method, self.evaluator.labels, part_bytes
        )
        self.federation.privacy = self.record.privacy = privacy

    @property
    def receipts(self) -> Receipts:
        assert self.clients.receipts is not None
        return self.clients.receipts

    # ------------------------------------------------------------------ the run

    def fit(self) -> dict[str, Any]:
        """Rounds from the first not yet done to ``cfg.rounds``; writes results.json."""
        cfg, is_zero = self.cfg, self.ranks.is_zero
        with self.ranks.phase(stop=False):  # every rank clears before any rank restores
            self._clear_store()  # scratch a killed process left (a resume reads the checkpoint)
        with self.ranks.phase(stop=False):  # a disk store that cannot be written stops every rank
            first = self._start()
        if first > cfg.rounds and self.record.history:  # a finished run: nothing to train or rewrite
            if is_zero:
                print(f"resume: the run finished its {cfg.rounds} rounds; its results:", file=sys.stderr)
            self._clear_store()
            summary = self.summary(self.record.history[-1]["metrics"], cfg.rounds)
            if is_zero and not (self.run_dir / "results.json").is_file():  # its write failed (a full disk)
                atomic_write_text(self.run_dir / "results.json", json.dumps(summary, indent=2))
            return summary
        with self.ranks.phase(stop=False):  # a full disk on rank 0 stops every rank
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

    def _rounds(self, first: int) -> dict[str, Any]:
        cfg, is_zero, history = self.cfg, self.ranks.is_zero, self.record.history
        if is_zero and cfg.availability.dropout > 0 and self.method.needs_every_client:
            print(
                f"note: availability.dropout {cfg.availability.dropout}: {type(self.method).__name__} mixes every "
                "client's update in every round, so an unavailable client enters its server step as a dropped "
                "update does (its round-start parameters, a zero update) and receives nothing",
                file=sys.stderr,
                flush=True,
            )
        live = self.federation.live = (
            LiveView(first, cfg.rounds, self.clients.datasets_of, len(self.clients)) if self.live else Quiet()
        )
        try:
            for number in range(first, cfg.rounds + 1):
                live.round_started(number)
                values, results = Round(self.federation, number).run()
                if results is not None:
                    history.append({"round": number, "metrics": results})
                live.phase("logging")
                # metrics.csv on a full disk stops every rank
                with self.ranks.phase(stop=False, round_=number):
                    self.fabric.log_dict(values, step=number)
                    if is_zero and (results is not None):  # α chart, β heatmap on evaluation rounds
                        log_charts(self.fabric.loggers, self.method.log_matrices(), number)
                line = progress_line(number, cfg.rounds, values)
                if is_zero and not self.live:
                    print(line, file=sys.stderr, flush=True)
                live.round_done(number, values, line)
                self._prune_receipts(number)
                every = cfg.checkpoint_every
                if number == cfg.rounds or (every > 0 and number % every == 0):
                    live.phase("checkpoint")
                    self._checkpoint(number)
                if number < cfg.rounds:
                    self.ranks.agree(
                        finished=True, round_=number
                    )  # the safe point: SIGTERM / SIGINT stop the run here
            live.phase("writing results.json")
            return self._finish(history[-1]["metrics"] if history else {})
        finally:
            live.close()

    def summary(self, results: dict[str, dict[str, dict[str, float]]], rounds: int) -> dict[str, Any]:
        """The results.json content (:meth:`RunRecord.summary`)."""
        return self.record.summary(results, rounds, self.ranks.is_zero)

    def _finish(self, results: dict[str, dict[str, float]]) -> dict[str, Any]:
        summary = self.summary(results, self.cfg.rounds)
        if self.ranks.is_zero:
            atomic_write_text(self.run_dir / "results.json", json.dumps(summary, indent=2))
        self._close_loggers("success")  # flushes the offline wandb run before the process exits
        self._clear_store()  # the final checkpoint holds every client's state
        return summary

    def _clear_store(self) -> None:
        """Forget the client states between rounds and the rows of the server steps (scratch:
        a checkpoint holds what a resume needs)."""
        self.clients.store.clear()
        self.receipts.clear()

    def _close_loggers(self, status: str, exit_code: int | None = None) -> None:
        for logger in self.fabric.loggers:
            logger.finalize(status)
            wandb = self.fabric.global_rank == 0 and isinstance(logger, RoundWandbLogger)
            # A failed run never starts a wandb run just to end it.
            if wandb and (status == "success" or logger._experiment is not None):
                code = exit_code if exit_code is not None else 0 if status == "success" else 1
                logger.experiment.finish(exit_code=code)

    # ------------------------------------------------------------------ start, resume, checkpoint

    def _start(self) -> int:
        """Fill the store from the latest checkpoint (``resume``) or from scratch; the first round."""
        folder, note = checkpoint.resumable(self.run_dir) if self.cfg.resume else (None, None)
        if note and self.ranks.is_zero:
            print(f"resume: {note}", file=sys.stderr)
        if folder is None:
            if self.cfg.resume and self.ranks.is_zero:
                print(f"resume: no checkpoint in {self.run_dir}, starting from round 1", file=sys.stderr)
            return 1  # a client's initial state is drawn when it is first needed
        done = self.restore(folder)
        if self.ranks.is_zero:
            print(f"resume: continuing after round {done} from {folder}", file=sys.stderr)
        return done + 1

    def restore(self, folder: Path) -> int:
        """Load a checkpoint: this rank's clients and their pending receipts, the server state,
        the history. Returns the round it was written after."""
        server = checkpoint.load_server(folder)
        self.method.load_state_dict(server["aggregator"])
        self.record.load_state_dict(server)
        receipts = self.receipts
        by_round = {int(r): Receipt.from_state_dict(state) for r, state in server.get("receipts", {}).items()}
        pending = {int(i): [int(r) for r in rounds] for i, rounds in server.get("pending", {}).items()}
        drawn = set(server.get("drawn", ()))  # never stored: drawn again from the seed when needed
        for i in self.clients.mine:
            if i not in drawn:
                state = checkpoint.load_client(folder, i, whole=False)
                row_round = encoder_row_of(state)
                if row_round is not None:  # its encoder is in a row: back into the row store
                    row = checkpoint.load_row(folder, row_round, i, "trained", encoder_row_numel(state))
                    receipts.rows.write(row_round, i, "trained", row)
                    receipts.encoder_rows[i] = row_round
                self.clients.store.put(i, state)
            if i not in pending:
                continue
            receipts.pending[i] = pending[i]
            for r in pending[i]:
                receipts.by_round[r] = by_round[r]
                for name in by_round[r].own_rows(i):
                    row = checkpoint.load_row(folder, r, i, name, self.federation.encoder_layout.numel)
                    receipts.rows.write(r, i, name, row)
        return int(server["round"])

    def _checkpoint(self, number: int) -> None:
        """Each rank writes its clients (and the rows their pending receipts name or that hold
        their stored encoders), then rank 0 publishes with the server state and the pending
        receipts. A write that fails (a full disk) on any rank ends the run on every rank; the
        staging folder goes, the last checkpoint stays."""
        discard = functools.partial(checkpoint.discard, self.run_dir, number)
        receipts, clients = self.receipts, self.clients
        with self.ranks.phase(stop=False, undo=discard, round_=number):  # also the barrier before publishing
            for i in clients.mine:
                stored = clients.store.files_of(i)
                if stored:
                    checkpoint.link_client(self.run_dir, number, i, stored)
                elif i in clients.store:
                    checkpoint.write_client(self.run_dir, number, i, clients.store.get(i))
                rows = [(receipt.round, name) for receipt in receipts.of(i) for name in receipt.own_rows(i)]
                if i in receipts.encoder_rows:  # the row holding its stored encoder
                    rows.append((receipts.encoder_rows[i], "trained"))
                for row_round, name in rows:
                    source = receipts.rows.files(row_round, i, name)
                    row = (
                        None
                        if source
                        else receipts.rows.read(row_round, i, name, self.federation.encoder_layout.numel)
                    )
                    checkpoint.write_row(self.run_dir, number, row_round, i, name, source, row)
        pending, drawn = self._pending_everywhere(number)
        with self.ranks.phase(stop=False, undo=discard, round_=number):
            if self.ranks.is_zero:
                rounds = sorted({r for rs in pending.values() for r in rs})
                server = {
                    "round": number,
                    "aggregator": self.method.state_dict(),
                    **self.record.state_dict(),
                    "receipts": {r: receipts.by_round[r].state_dict() for r in rounds},
                    "pending": pending,
                    "drawn": drawn,
                }
                if self.config_record is not None:
                    server[checkpoint.CONFIG] = self.config_record
                checkpoint.publish(self.run_dir, number, server, keep=self.cfg.checkpoint_keep)

    def _prune_receipts(self, number: int) -> None:
        """Forget the receipts that no client of any rank holds any more, after round ``number``
        (receipts are of rounds done: the table grows with them, not with the rounds planned)."""
        held = torch.zeros(number + 1, dtype=torch.int32, device=self.ranks.device)
        for r in self.receipts.held_rounds():
            held[r] = 1
        held = self.ranks.sum(held).cpu()
        self.receipts.prune({r for r in range(len(held)) if held[r]})

    def _pending_everywhere(self, number: int) -> tuple[dict[int, list[int]], list[int]]:
        """Every client's pending receipts, in round order, and the clients never stored (a
        client that has not trained is drawn again from the seed: the checkpoint holds no file
        of it), at round ``number``: receipts are of rounds done, so the table is clients x
        rounds done, not x rounds planned. Each rank knows its own."""
        n, rounds = len(self.clients), number
        table = torch.zeros(n, rounds + 2, dtype=torch.int32, device=self.ranks.device)
        for i, held in self.receipts.pending.items():
            table[i, held] = 1
        for i in self.clients.mine:
            table[i, -1] = int(i not in self.clients.store)
        table = self.ranks.sum(table).cpu()
        pending = {
            i: [r for r in range(rounds + 1) if table[i, r]] for i in range(n) if bool(table[i, :-1].any())
        }
        return pending, [i for i in range(n) if table[i, -1]]

    # ------------------------------------------------------------------ evaluating a checkpoint

    def evaluate(self, only: list[int] | None = None) -> dict[str, dict[str, dict[str, float]]]:
        """Every client's metrics as :meth:`Evaluator.evaluate` gives them."""
        return self.evaluator.evaluate(only)

    def client_state(self, i: int) -> ClientState:
        """Client ``i``'s state (this rank's) with its pending receipts applied: the client as it
        would start its next round, or as the finished run leaves it."""
        return self.federation.load(i)[1]


#: ``aggregation: auto`` keeps a server step's encoder rows in files when they (before training
#: and deltas, [N, P] each) would take more than this many bytes; below, in memory.
STACKED_ENCODERS_UP_TO = 2**30


def streams(aggregation: str, method: Method, num_clients: int, encoder_numel: int) -> bool:
    """Whether a run's server step reads its encoder rows from files (``RunConfig.aggregation``
    ``streamed``) rather than from memory (``stacked``); ``auto`` chooses by size."""
    if aggregation == "auto":
        return 2 * num_clients * encoder_numel * 4 > STACKED_ENCODERS_UP_TO
    return aggregation == "streamed"


# Up to PER_CLIENT_UP_TO clients (live.py's, shared with the live view and fit's final table)
# the round line names each one; above, it summarises each group of replicas (the clients whose
# names differ only in the replica number) as mean [min, max].


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
        stopping.watch_children(fabric, run_dir)
        try:
            if config_dict is not None:  # several processes or nodes: all on one config
                Ranks(fabric).check_same_config(config_dict, cfg.devices)
            fabric.seed_everything(cfg.seed, verbose=False)
            summary = Simulation(fabric, cfg, config_dict).fit()
        except RuntimeError as err:  # a collective whose peer is gone (kill -9): one line, no traceback
            if fabric.world_size < 2 or not stopping.is_peer_lost(err):
                raise
            other = f"rank {1 - fabric.global_rank}" if fabric.world_size == 2 else "another rank"
            stopping.peer_lost(f"the process of {other}", "its connection closed", run_dir)
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
    rounds = sim.restore(folder)
    results = sim.evaluate()
    history = sim.record.history
    recorded = history[-1]["metrics"] if history and history[-1]["round"] == cfg.rounds else {}
    if held_out.LABEL in recorded:  # held-out clients are never stored: their recorded metrics
        results[held_out.LABEL] = recorded[held_out.LABEL]
    summary = sim.summary(results, rounds=rounds)
    if fabric.global_rank != 0:
        return None
    if output is not None:
        atomic_write_text(output, json.dumps(summary, indent=2))
    return summary


def checkpoint_states(cfg: RunConfig, folder: Path | None = None) -> list[ClientState]:
    """Every client's state in a run's latest checkpoint (or checkpoint ``folder``) with its
    pending receipts applied: the clients as the run leaves them (one process; for studies
    and tests)."""
    if folder is None:
        folder, _ = checkpoint.resumable(cfg.run_dir)
    if folder is None:
        raise FileNotFoundError(
            f"no checkpoint in {Path(cfg.run_dir) / 'checkpoints'}: run `fedmtl fit` first"
        )
    cfg = dataclasses.replace(
        cfg, devices=1, num_nodes=1, accelerator="cpu", store="memory", aggregation="stacked"
    )
    fabric = L.Fabric(accelerator="cpu", devices=1)
    sim = Simulation(fabric, cfg)
    sim.restore(folder)
    return [sim.client_state(i) for i in range(len(sim.clients))]
