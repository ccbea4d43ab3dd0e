"""What a run keeps of itself: its metrics history, its communication cost, and results.json.

:class:`RunRecord` is checkpointed with the server state (history and traffic) and builds the
results file: the final metrics per client and task of the model the method reports, those of
any other model it evaluates, the server's values, per-task summaries, the communication cost,
the availability totals, the unified model's tasks, the held-out clients, each client's
training images and dominant-class histogram, and the versions of the software that ran it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from fedmtl.aggregation import communication
from fedmtl.config import RunConfig
from fedmtl.federated import availability, evaluation, held_out, scoring
from fedmtl.federated.clients import Clients
from fedmtl.federated.scenario import TrainedImages, class_histograms
from fedmtl.federated.spec import ClientSpec
from fedmtl.methods.base import Method
from fedmtl.tasks import get_task

Results = dict[str, dict[str, dict[str, float]]]  # {label: {client: {task: value}}}


class RunRecord:
    """A run's history of evaluations and its bytes sent and received so far."""

    def __init__(
        self, cfg: RunConfig, clients: Clients, method: Method, labels: list[str], part_bytes: Any
    ) -> None:
        self.cfg, self.clients, self.method, self.labels = cfg, clients, method, labels
        self.part_bytes = part_bytes
        self.history: list[dict[str, Any]] = []
        # Bytes each client sent and received so far, by pool, and the rounds they cover (a
        # checkpoint keeps them: dropped updates make the cost depend on the run, not the config).
        self.traffic: communication.Totals = {}
        self.traffic_rounds = 0
        # Computed for results.json (rank 0), federated then held-out clients.
        self._histograms: list[dict[str, int] | None] | None = None
        self._train_images: list[int] = []
        # Differential privacy (fedmtl.privacy.run.RunPrivacy): its state rides in checkpoints
        self.privacy: Any = None

    def add_traffic(self, traffic: Any) -> None:
        communication.add_round(self.traffic, self.clients.names, traffic)
        self.traffic_rounds += 1

    def state_dict(self) -> dict[str, Any]:
        # As JSON text: pickled, the strings the history and the cost have in common (client
        # names, keys) would be shared differently in a resumed run, which reads part of them
        # back, and the checkpoint's bytes would depend on whether the run was resumed.
        state = {
            "history": json.dumps(self.history),
            "communication": {"rounds": self.traffic_rounds, "totals": json.dumps(self.traffic)},
        }
        if self.privacy is not None:
            state["privacy"] = json.dumps(self.privacy.state_dict())
        return state

    def load_state_dict(self, server: dict[str, Any]) -> None:
        history = server["history"]  # a list in checkpoints written before it was JSON text
        self.history = json.loads(history) if isinstance(history, str) else history
        # A checkpoint written before the cost was counted has none: its rounds go uncounted.
        counted = server.get("communication", {"rounds": 0, "totals": "{}"})
        self.traffic, self.traffic_rounds = json.loads(counted["totals"]), int(counted["rounds"])
        if self.privacy is not None:
            if "privacy" not in server:
                raise ValueError(
                    "the checkpoint was written by a run without privacy or secure_aggregation, so what it "
                    "spent is unknown: resume without them, or start a new run"
                )
            self.privacy.load_state_dict(json.loads(server["privacy"]))

    def summary(self, results: Results, rounds: int, is_zero: bool) -> dict[str, Any]:
        """The results.json content: the run's seed, the final metrics per client and task of the
        model the method reports (``evaluated``), those of any other model it evaluates
        (``also_evaluated``), and the server's values."""
        specs, held = self.clients.specs, self.clients.held_out
        datasets = self.clients.datasets_of

        def metric(label: str, client: str, task: str) -> float | None:
            value = results.get(label, {}).get(client, {}).get(task, math.nan)
            return None if math.isnan(value) else value  # JSON has no NaN: null

        def table(label: str, specs: list[ClientSpec] = specs) -> dict[str, Any]:
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
            "tasks": evaluation.task_summary(results.get(self.labels[0], {}), datasets),
            # Bytes up and down, per client by pool and in all (docs/evaluation.md, "Communication cost")
            "communication": communication.totals_summary(self.traffic, self.traffic_rounds),
            # ε spent for δ and how (docs/privacy.md); null: no privacy
            "privacy": self.privacy.summary() if self.privacy is not None and self.privacy.mode else None,
            # What changes a metric's number: fedmtl report compares only runs scored alike
            "scoring": self.scoring(),
            # What computed it: fedmtl report and a resume never compare it (a rerun may differ here only)
            "versions": versions(),
        }
        if self.cfg.availability.enabled:
            summary["availability"] = self._availability_totals(rounds)
        if len(self.labels) > 1:
            summary["also_evaluated"] = {label: table(label) for label in self.labels[1:]}
        if self.clients.head_groups:
            summary["unified"] = self._unified(summary["clients"])
        if held:
            clients = table(held_out.LABEL, held)
            for spec in held:
                clients[spec.name]["fine_tune_epochs"] = spec.fine_tune_epochs
            summary["held_out"] = {
                "clients": clients,
                "tasks": evaluation.task_summary(results.get(held_out.LABEL, {}), datasets),
            }
        if is_zero:
            self._record_partition(
                summary["clients"],
                *summary.get("also_evaluated", {}).values(),
                *([summary["held_out"]["clients"]] if held else []),
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

    def scoring(self) -> dict[str, Any]:
        """How the metrics were scored (:func:`fedmtl.federated.scoring.scoring_block`): the
        evaluation options in force now (a resume may change them), the padding size, and the
        validation splits of the run's data fingerprint."""
        from pathlib import Path

        from fedmtl.tasks import EDGE_MAX_DIST

        specs = [*self.clients.specs, *self.clients.held_out]
        return scoring.scoring_block(
            self.cfg.evaluation.edge_thin_gt,
            self.cfg.data.train_size,
            [(s.dataset, s.tasks) for s in specs],
            scoring.read_fingerprint(Path(self.cfg.run_dir)),
            EDGE_MAX_DIST,
        )

    def _record_partition(self, *tables: dict[str, Any]) -> None:
        """Each client's ``train_images`` (the images it trains on) and ``class_histogram``
        (those images per dominant class), into its entries of ``tables`` (the federation's
        clients, under each evaluated model, and the held-out ones). The histograms read every
        training label once; only rank 0, which writes results.json, computes them."""
        specs = [*self.clients.specs, *self.clients.held_out]
        if self._histograms is None:
            trained = TrainedImages(self.cfg)  # one read of each subset-keeping dataset for both
            self._histograms = class_histograms(self.cfg, specs, trained)
            self._train_images = [c.num_samples for c in self.clients.info] + [
                len(trained(s.dataset, s.tasks, s.train_indices)) for s in self.clients.held_out
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
        counts = availability.totals(
            config, self.cfg.seed, rounds, len(self.clients), self.method.participants
        )
        return {**dataclasses.asdict(config), **counts}

    def _unified(self, clients: dict[str, Any]) -> dict[str, Any]:
        """The unified model's metric per task (``dataset/task``), for a method that shares
        heads: in the unified-model setting (encoders over all, decoders and heads per task)
        the clients of a task hold the same parameters and differ only in their local
        BatchNorm statistics, so the task's value is the mean over them (null if one is null)."""
        out = {}
        specs = self.clients.specs
        for dataset, task, owners in self.clients.head_groups:
            name = get_task(task).metric_name
            values = [clients[specs[i].name]["metrics"][task][name] for i in owners]
            mean = None if any(v is None for v in values) else sum(values) / len(values)
            out[f"{dataset}/{task}"] = {name: mean, "clients": [specs[i].name for i in owners]}
        return out


def versions() -> dict[str, str | None]:
    """The ``"versions"`` block of results.json: fedmtl's, torch's, Lightning's and Python's
    versions, and ``git_commit``, the commit of the fedmtl checkout it ran from (None when
    fedmtl is not run from a git checkout, or git is missing)."""
    import platform
    from importlib import metadata

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        "fedmtl": version("fedmtl"),
        "torch": version("torch"),
        "lightning": version("lightning"),
        "python": platform.python_version(),
        "git_commit": git_commit(),
    }


def git_commit() -> str | None:
    """HEAD of the git checkout that holds this fedmtl package; None when it is installed
    outside one (a wheel in site-packages, even inside another repository) or git cannot tell."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # fedmtl/federated/results.py -> the checkout
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    if len(lines) != 2 or Path(lines[0]).resolve() != root:
        return None
    return lines[1]
