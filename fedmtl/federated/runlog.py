"""Run logging: every scalar to ``RUN_DIR/metrics.csv``, and to wandb through Fabric's loggers.

metrics.csv is long-format, ``round,key,value``, appended as rounds finish, so a resumed run
continues the same file and a notebook reads it with one ``pandas.read_csv``. wandb runs
offline by default (no account, no network); ``logger.mode: online`` syncs live.

In wandb the round is the x-axis of every series (``round`` is logged with each row), and a
method's per-client aggregation weights (``aggregation/<name>/<client>`` in metrics.csv, e.g.
FedHCA²'s α) are one line chart per run, ``aggregation/<name>``, not one panel per client;
weights of more levels (FedHCA²'s β per decoder and layer) are a heatmap image instead.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import WandbLogger

from fedmtl.config import LoggerConfig
from fedmtl.files import temporary_name, writing

# The metrics.csv and wandb section of a method's own values (``Method.log_values``): α and β of
# FedHCA², ξ of FedAMP. The server's bookkeeping (participants, dropped updates) is ``server/``.
AGGREGATION = "aggregation"


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
        """Append the rows whole: a write that fails (a full disk) leaves the file as it was."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        if new:
            writer.writerow(["round", "key", "value"])
        writer.writerows([step, key, float(value)] for key, value in metrics.items())
        data = memoryview(text.getvalue().encode())
        with writing(self.path, needed=len(data)):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            size = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except BaseException:
                if new:
                    os.unlink(self.path)
                else:
                    os.ftruncate(fd, size)  # frees space: never fails for lack of it
                raise
            finally:
                os.close(fd)

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
        if len(kept) == len(rows):
            return  # nothing to drop: no write (a resume on a full disk gets as far as it can)
        tmp = temporary_name(self.path)  # hidden, and renamed over the file: never half of it
        with writing(self.path, tmp, needed=self.path.stat().st_size):
            with open(tmp, "w", newline="") as f:
                csv.writer(f).writerows(kept)
            os.replace(tmp, self.path)


def heatmap_image(rows: list[str], columns: list[str], values: np.ndarray, title: str) -> np.ndarray:
    """An annotated heatmap (rows x columns) rendered to an RGB array, for wandb."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.1 * len(columns) + 3.5, 0.4 * len(rows) + 1.6), dpi=100)
    canvas = FigureCanvasAgg(fig)  # off-screen: no display needed
    ax = fig.subplots()
    # The colour scale spans the values themselves: β often moves little from its start.
    low, high = float(values.min()), float(values.max())
    image = ax.imshow(values, cmap="viridis", vmin=low, vmax=max(high, low + 1e-9), aspect="auto")
    ax.set_xticks(range(len(columns)), [f"L{j + 1}" for j in range(len(columns))], fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    for (i, j), value in np.ndenumerate(values):
        dark = value < (low + high) / 2  # viridis is dark at the low end
        ax.text(
            j, i, f"{value:.4f}", ha="center", va="center", fontsize=6, color="white" if dark else "black"
        )
    fig.colorbar(image, ax=ax)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def is_charted(key: str) -> bool:
    """Whether ``key`` is one member of a weight family (``aggregation/<name>/<member...>``):
    metrics.csv keeps it, wandb shows its family as one chart (:func:`log_charts`) instead."""
    parts = key.split("/")
    return len(parts) >= 3 and parts[0] == AGGREGATION


def aggregation_series(path: str | Path) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """The per-client weight families of metrics.csv, ``aggregation/<name>/<client>``, as
    ``{name: {client: (rounds, values)}}`` in the order logged (deeper keys, β, are left out)."""
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    if not Path(path).is_file():
        return series
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            parts = row["key"].split("/")
            if len(parts) == 3 and parts[0] == AGGREGATION:
                rounds, values = series.setdefault(parts[1], {}).setdefault(parts[2], ([], []))
                rounds.append(int(row["round"]))
                values.append(float(row["value"]))
    return series


def log_charts(
    loggers: list[Logger], matrices: dict[str, tuple[list[str], list[str], Any]], step: int
) -> None:
    """To wandb: each per-client weight family of metrics.csv as one line chart over the rounds
    so far (``aggregation/alpha``: FedHCA²'s α, one line per client, like the paper's figure),
    and each (rows, columns, values) matrix as an annotated heatmap image (``aggregation/beta``:
    decoder x layer β, like the paper's Fig. 7). The values themselves are in metrics.csv."""
    wandb_loggers = [lg for lg in loggers if isinstance(lg, WandbLogger)]
    csv_loggers = [lg for lg in loggers if isinstance(lg, CSVScalarLogger)]
    if not wandb_loggers:
        return
    import wandb  # only with wandb on: the import takes seconds

    logged: dict[str, Any] = {}
    for name, members in (aggregation_series(csv_loggers[0].path) if csv_loggers else {}).items():
        logged[f"{AGGREGATION}/{name}"] = wandb.plot.line_series(
            xs=[rounds for rounds, _ in members.values()],
            ys=[values for _, values in members.values()],
            keys=list(members),
            title=f"{name} per client, rounds 1-{step}",
            xname="round",
        )
    for name, (rows, columns, values) in matrices.items():
        title = (
            f"{name}, round {step} (columns: "
            + ", ".join(f"L{j + 1}={c}" for j, c in enumerate(columns))
            + ")"
        )
        image = heatmap_image(rows, columns, np.asarray(values, dtype=np.float64), title)
        logged[f"{AGGREGATION}/{name}"] = wandb.Image(image)
    if logged:
        for logger in wandb_loggers:
            logger.log_metrics(logged, step=step)


class RoundWandbLogger(WandbLogger):
    """Lightning's WandbLogger with the round as the x-axis: every row carries ``round`` and
    every series is plotted against it (Lightning's own x-axis, ``trainer/global_step``, is
    neither logged nor used); the members of a weight family (:func:`is_charted`) stay out of
    wandb, where their family is one chart."""

    @property
    def experiment(self) -> Any:
        started = self._experiment is not None
        run = super().experiment
        if not started and rank_zero_only.rank == 0 and getattr(run, "define_metric", None):
            run.define_metric("round")
            # overwrite: Lightning has just defined "*" against trainer/global_step
            run.define_metric("*", step_metric="round", step_sync=True, overwrite=True)
        return run

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        row = {key: value for key, value in metrics.items() if not is_charted(key)}
        if step is not None:
            row["round"] = step
        self.experiment.log(row)


def default_group(config: dict[str, Any]) -> str | None:
    """The wandb group of a run whose ``logger.group`` is null: the method's name and a hash
    of the config without its seed (and without run_dir, resume and logger, which do not change
    the results), so the seeds of one setting gather in one group. None without a config."""
    if not config:
        return None
    kept = {k: v for k, v in config.items() if k not in {"seed", "run_dir", "resume", "logger"}}
    digest = hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]
    algorithm = config.get("algorithm")
    path = algorithm.get("class_path") if isinstance(algorithm, dict) else algorithm
    method = str(path).rsplit(".", 1)[-1] if path else "run"
    return f"{method}-{digest}"


def _has_wandb_account() -> bool:
    """An API key in the environment or in ~/.netrc (where ``wandb login`` puts it)."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _wandb_unreachable(timeout: float = 5.0) -> str | None:
    """Why the wandb server cannot be reached (None when it answers). Without this probe, an
    online run with a key but no network trained its first round and then died in
    ``wandb.init`` with a traceback, after about 90 s of retries."""
    import requests  # wandb's own dependency; it honours HTTPS_PROXY as wandb does

    try:
        from wandb.sdk.lib.urls import DEFAULT_BASE_URL
    except ImportError:  # another wandb version
        DEFAULT_BASE_URL = "https://api.wandb.ai"
    url = os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    try:
        requests.head(url, timeout=timeout)  # any answer, even an error status, is a server
    except requests.RequestException as err:
        return f"{url} cannot be reached ({type(err).__name__})"
    return None


def create_loggers(cfg: LoggerConfig, run_dir: Path, config: dict[str, Any]) -> list[Logger]:
    """metrics.csv, and wandb unless switched off. ``mode: online`` without a wandb account,
    or with one but no connection to the wandb server, logs offline instead (one warning
    line; ``wandb sync RUN_DIR/wandb/offline-run-*`` later). Every resume of a run logs to
    the same wandb run (its id is in ``RUN_DIR/wandb_run_id``); ``logger.group``, ``tags`` and
    ``entity`` go to ``wandb.init`` (a null group: :func:`default_group`)."""
    loggers: list[Logger] = [CSVScalarLogger(run_dir / "metrics.csv")]
    if cfg.wandb and cfg.mode != "disabled":
        os.environ.setdefault("WANDB_SILENT", "true")
        offline = cfg.mode == "offline"
        if not offline and not _has_wandb_account():
            offline = True
            if rank_zero_only.rank == 0:
                print(
                    "warning: logger.mode online but no wandb account here (WANDB_API_KEY or `wandb login`): "
                    f"logging offline to {run_dir / 'wandb'}; sync it later with `wandb sync`",
                    file=sys.stderr,
                )
        elif not offline and rank_zero_only.rank == 0 and (problem := _wandb_unreachable()):
            offline = True  # the other ranks never start a wandb run
            print(
                f"warning: logger.mode online but the wandb server {problem}: logging offline to "
                f"{run_dir / 'wandb'}; sync it later with `wandb sync`",
                file=sys.stderr,
            )
        id_file = run_dir / "wandb_run_id"
        logger = RoundWandbLogger(
            project=cfg.project,
            name=cfg.name or run_dir.resolve().name,
            save_dir=str(run_dir),
            offline=offline,
            id=id_file.read_text().strip() if id_file.is_file() else None,
            config=config,
            entity=cfg.entity,
            group=cfg.group or default_group(config),
            tags=list(cfg.tags) or None,
        )
        # Lightning passes anonymous=None to wandb.init, which warns that the setting is
        # deprecated on every run; leaving it out means the same to wandb.
        logger._wandb_init.pop("anonymous", None)
        loggers.append(logger)
    return loggers
