"""Run logging: every scalar to ``RUN_DIR/metrics.csv``, and to wandb through Fabric's loggers.

metrics.csv is long-format, ``round,key,value``, appended as rounds finish, so a resumed run
continues the same file and a notebook reads it with one ``pandas.read_csv``. wandb runs
offline by default (no account, no network); ``logger.mode: online`` syncs live.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only

from fedmtl.config import LoggerConfig
from fedmtl.files import temporary_name, writing


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


def log_heatmaps(
    loggers: list[Logger], matrices: dict[str, tuple[list[str], list[str], Any]], step: int
) -> None:
    """Draw each (rows, columns, values) matrix as a heatmap image in wandb (decoder x layer β,
    like the paper's Fig. 7); the values themselves are in metrics.csv as scalars."""
    wandb_loggers = [lg for lg in loggers if type(lg).__name__ == "WandbLogger"]
    if not wandb_loggers or not matrices:
        return
    for name, (rows, columns, values) in matrices.items():
        title = (
            f"{name}, round {step} (columns: "
            + ", ".join(f"L{j + 1}={c}" for j, c in enumerate(columns))
            + ")"
        )
        image = heatmap_image(rows, columns, np.asarray(values, dtype=np.float64), title)
        for logger in wandb_loggers:
            logger.log_image(key=f"server/{name}_heatmap", images=[image], step=step)


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
    the same wandb run (its id is in ``RUN_DIR/wandb_run_id``)."""
    loggers: list[Logger] = [CSVScalarLogger(run_dir / "metrics.csv")]
    if cfg.wandb and cfg.mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

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
        logger = WandbLogger(
            project=cfg.project,
            name=cfg.name or run_dir.resolve().name,
            save_dir=str(run_dir),
            offline=offline,
            id=id_file.read_text().strip() if id_file.is_file() else None,
            config=config,
        )
        # Lightning passes anonymous=None to wandb.init, which warns that the setting is
        # deprecated on every run; leaving it out means the same to wandb.
        logger._wandb_init.pop("anonymous", None)
        loggers.append(logger)
    return loggers
