"""Run logging: every scalar to ``RUN_DIR/metrics.csv``, and to wandb through Fabric's loggers.

metrics.csv is long-format, ``round,key,value``, appended as rounds finish, so a resumed run
continues the same file and a notebook reads it with one ``pandas.read_csv``. wandb runs
offline by default (no account, no network); ``logger.mode: online`` syncs live.
"""

from __future__ import annotations

import csv
import os
from argparse import Namespace
from pathlib import Path
from typing import Any

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only

from fedmtl.config import LoggerConfig


class CSVScalarLogger(Logger):
    """A Fabric logger appending ``round,key,value`` rows to one CSV file."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)

    @property
    def name(self) -> str:
        return "csv"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["round", "key", "value"])
            writer.writerows([step, key, float(value)] for key, value in metrics.items())

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Hyper-parameters go to config.yaml in the run directory, not to the scalar file."""

    def truncate_after(self, round_: int) -> None:
        """Drop rows of rounds after ``round_`` (a resumed run redoes them)."""
        if not self.path.exists():
            return
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= round_]
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows(kept)
        os.replace(tmp, self.path)


def create_loggers(cfg: LoggerConfig, run_dir: Path, config: dict[str, Any]) -> list[Logger]:
    loggers: list[Logger] = [CSVScalarLogger(run_dir / "metrics.csv")]
    if cfg.wandb and cfg.mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        loggers.append(
            WandbLogger(
                project=cfg.project,
                name=cfg.name or run_dir.resolve().name,
                save_dir=str(run_dir),
                offline=cfg.mode == "offline",
                config=config,
            )
        )
    return loggers
