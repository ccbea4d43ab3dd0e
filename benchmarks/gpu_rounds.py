"""Round times, training throughput and peak GPU memory of the demo and of the paper-shape dry run.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_rounds.py --tmp /tmp/gpu [--only demo|paper]
        [--rounds-demo 10] [--rounds-paper 2] [--accelerator gpu] [--smoke]

Four ``fedmtl fit`` runs, one after the other, in this process (``fedmtl.cli.main``), so
that torch's peak CUDA memory can be read after each:

1. the demo (``configs/demo.yaml``), ``--precision 32-true`` and then ``16-mixed``;
2. the paper-shape dry run (``scenario1.yaml`` + ``synthetic.yaml``: scenario 1's clients and
   Swin-T at the paper's input sizes on generated data), fp32 and then 16-mixed, over
   ``--rounds-paper`` rounds.

Each run gets a fresh run directory under ``--tmp`` (a ``--tmp`` that holds an earlier call's
runs is refused before anything runs: nothing is removed); the generated data go there too
(``--data.root``), written before the first run of each scenario so that no run's wall time
includes it (the ``data (s)`` column says how long that took). wandb is off. For every run
the table gives the wall time, the peak GPU memory allocated and reserved by torch, every
``time/*`` column of the run's metrics.csv per round (whatever phases the engine logs, in
sorted order), and the training throughput: the images trained in a round over the round's
``time/train``. Images trained in a round: the sum over the clients of
``floor(train_images / batch_size) * batch_size * local_epochs`` (the training loader drops
the last incomplete batch), with ``train_images`` from the run's results.json and the client's
batch size and local epochs from its group in the run's config.yaml. The clients train one
after the other on the one device, so this is also the rate of a client training alone.

A run that fails does not stop the others: its error line is in the table. ``--smoke``
shrinks everything (32x32 / 64x64 images, few of them, 2 rounds, the paper-shape run on
the small default backbone instead of Swin-T) so that the script runs on a
CPU in a few minutes (``--accelerator cpu --smoke``, with ``FEDMTL_RESULTS_DIR`` set to keep
its table out of ``benchmarks/results/``). The table is recorded in
``benchmarks/results/gpu_rounds.md`` (results_file.py); with ``$OUT`` set, that file and each
run's metrics.csv (``RUN.metrics.csv``) are copied there too.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import io
import json
import math
import os
import platform
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import results_file

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the fedmtl of this checkout, also where another one is installed
    sys.path.insert(0, str(ROOT))

PRECISIONS = ("32-true", "16-mixed")
GIB = 1024**3


def log(message: str) -> None:
    print(f"[gpu_rounds {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Scenario:
    name: str
    configs: list[str]  # --config arguments, in order
    options: list[str]  # further fit options, before the per-run ones


@dataclass
class Run:
    name: str
    scenario: Scenario
    precision: str
    run_dir: Path
    status: str = "not run"
    error: str = ""
    wall: float = math.nan
    peak_allocated: float = math.nan  # GiB
    peak_reserved: float = math.nan  # GiB
    times: dict[int, dict[str, float]] = field(default_factory=dict)  # round -> time/* key -> seconds
    images: int | None = None  # images trained per round, all clients


def scenarios(args: argparse.Namespace, tmp: Path) -> list[Scenario]:
    """The demo and the paper-shape dry run, as ``fedmtl fit`` options."""
    common = ["--accelerator", args.accelerator, "--logger.wandb", "false"]
    suffix = "-smoke" if args.smoke else ""
    demo = [
        "--data.root",
        str(tmp / "data" / f"demo{suffix}"),
        "--rounds",
        str(args.rounds_demo),
        *common,
    ]
    paper = [
        "--data.root",
        str(tmp / "data" / f"synthetic{suffix}"),
        "--rounds",
        str(args.rounds_paper),
        *common,
    ]
    if args.smoke:  # tiny images, few of them: minutes on a CPU
        from fedmtl.models.backbone import DEFAULT_BACKBONE

        demo += ["--data.train_size", "[32, 32]"]
        for dataset, count in (("pascal_context", 80), ("nyud", 32)):
            demo += [f"--data.synth.{dataset}.num_train", str(count)]
            demo += [f"--data.synth.{dataset}.num_val", "8", f"--data.synth.{dataset}.size", "[32, 32]"]
        # The default small backbone, not Swin-T: a Swin-T round on 2 CPU cores is minutes
        # (aggregation and write-back of its encoder too), and the smoke checks only the script.
        paper += ["--data.train_size", "[64, 64]", "--model.backbone", DEFAULT_BACKBONE]
        for dataset in ("pascal_context", "nyud"):
            paper += [f"--data.synth.{dataset}.size", "[64, 64]"]
    chosen = []
    if args.only in (None, "demo"):
        chosen.append(Scenario("demo", ["configs/demo.yaml"], demo))
    if args.only in (None, "paper"):
        chosen.append(Scenario("paper", ["scenario1.yaml", "synthetic.yaml"], paper))
    return chosen


def fit_argv(scenario: Scenario, precision: str | None, run_dir: Path | None) -> list[str]:
    argv = ["fit"]
    for config in scenario.configs:
        argv += ["--config", config]
    argv += scenario.options
    if precision is not None:
        argv += ["--precision", precision]
    if run_dir is not None:
        argv += ["--run_dir", str(run_dir)]
    return argv


def prepare_data(scenario: Scenario) -> str:
    """Generate the scenario's synthetic data now, as ``fedmtl fit`` would on first use, so
    that no run's wall time includes it. Uses fedmtl.cli's own config reading; returns the
    seconds taken, or a note when that failed (the first run then generates the data)."""
    start = time.perf_counter()
    try:
        from fedmtl import cli

        argv = cli._check_config_files(fit_argv(scenario, None, None))[1:]
        parser = cli._run_parser()
        cfg_ns = parser.parse_args(argv)
        cfg_ns.pop("config", None)
        cli._ensure_data(cli._instantiate(parser, cfg_ns))
    except (Exception, SystemExit) as err:  # a changed cli: the first run generates the data
        note = f"not prepared ({type(err).__name__}: {first_line(str(err))}); in the first run's wall time"
        log(f"{scenario.name}: data {note}")
        return note
    seconds = time.perf_counter() - start
    log(f"{scenario.name}: data ready in {seconds:.1f} s")
    return f"{seconds:.1f}"


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


class Tee(io.TextIOBase):
    """Writes to a stream and keeps a copy (a run's output goes to the log and is searched
    for its error line)."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False  # no progress bars in a log

    def fileno(self) -> int:
        return self.stream.fileno()


def cuda() -> object | None:
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def execute(run: Run) -> None:
    """One ``fedmtl fit`` in this process: wall time, peak memory, status."""
    from fedmtl.cli import main

    run.run_dir.parent.mkdir(parents=True, exist_ok=True)  # the run directory is new: refuse_earlier_runs
    gc.collect()
    device = cuda()
    if device is not None:
        device.empty_cache()  # what the last run left cached does not count as this one's
        device.reset_peak_memory_stats()
    argv = fit_argv(run.scenario, run.precision, run.run_dir)
    log(f"{run.name}: fedmtl {' '.join(argv)}")
    out, err = Tee(sys.stdout), Tee(sys.stderr)
    start = time.perf_counter()
    code: int | str
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as stop:  # an argument error
        code = stop.code if stop.code is not None else 0
    except Exception as error:  # CUDA out of memory, a bug: the other runs still run
        traceback.print_exc()
        code = "exception"
        run.error = f"{type(error).__name__}: {first_line(str(error))}"
    run.wall = time.perf_counter() - start
    if device is not None:
        device.synchronize()
        run.peak_allocated = device.max_memory_allocated() / GIB
        run.peak_reserved = device.max_memory_reserved() / GIB
    if code == 0:
        run.status = "ok"
    else:
        run.status = "failed"
        if not run.error:
            said = [line for line in err.copy.getvalue().splitlines() if line.startswith("error:")]
            run.error = said[-1] if said else f"exit {code}: " + (first_line(err.copy.getvalue()[-2000:]))
    gc.collect()
    if device is not None:
        device.empty_cache()
    log(
        f"{run.name}: {run.status} in {run.wall:.1f} s"
        + (f" ({run.error})" if run.error else "")
        + (
            f", peak {run.peak_allocated:.2f} / {run.peak_reserved:.2f} GiB allocated / reserved"
            if device
            else ""
        )
    )


def refuse_earlier_runs(parser: argparse.ArgumentParser, tmp: Path, run_dirs: list[Path]) -> None:
    """Stop, before anything runs, when ``--tmp`` already holds one of the run directories
    (an earlier call's runs are the user's now: nothing is removed)."""
    for run_dir in run_dirs:
        if run_dir.exists():
            parser.error(f"--tmp {tmp} already holds {run_dir} from an earlier call: give a new --tmp")


def read_times(run: Run) -> None:
    """Every ``time/*`` value per round from the run's metrics.csv (long format: round,key,value)."""
    path = run.run_dir / "metrics.csv"
    if not path.is_file():
        return
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["key"].startswith("time/"):
                run.times.setdefault(int(row["round"]), {})[row["key"][5:]] = float(row["value"])


def read_images(run: Run) -> None:
    """Images trained per round: sum over the clients of floor(train_images / batch) * batch
    * local_epochs. A client's group in config.yaml: ``-gN`` in its name, else the group of its
    dataset whose tasks hold the client's."""
    import yaml

    results, config = run.run_dir / "results.json", run.run_dir / "config.yaml"
    if not (results.is_file() and config.is_file()):
        return
    clients = json.loads(results.read_text())["clients"]
    groups = yaml.safe_load(config.read_text())["clients"]
    total = 0
    for name, client in clients.items():
        if "train_images" not in client:
            return
        suffix = name.rsplit("-g", 1)
        if len(suffix) == 2 and suffix[1].isdigit():
            group = groups[int(suffix[1])]
        else:
            group = next(
                g
                for g in groups
                if g["dataset"] == client["dataset"] and set(client["tasks"]) <= set(g["tasks"])
            )
        batch = int(group.get("batch_size") or 8)
        total += client["train_images"] // batch * batch * int(group.get("local_epochs") or 1)
    run.images = total


def fmt(value: float, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def rate(images: int | None, seconds: float) -> float:
    return images / seconds if images and seconds > 0 else math.nan


def report(runs: list[Run], data: dict[str, str], args: argparse.Namespace) -> str:
    import lightning
    import torch

    device = cuda()
    if device is not None:
        name = f"{device.get_device_name(0)} (CUDA {torch.version.cuda}, {device.device_count()} visible)"
    else:
        name = f"no CUDA device: {args.accelerator} ({platform.processor() or platform.machine()})"
    keys = sorted({key for run in runs for round_ in run.times.values() for key in round_})
    lines = [
        f"- device: {name}",
        f"- torch {torch.__version__}, lightning {lightning.__version__}, Python {platform.python_version()}",
        f"- rounds: demo {args.rounds_demo}, paper-shape {args.rounds_paper}"
        + (" (--smoke: tiny images, for a CPU check only)" if args.smoke else ""),
        "",
        "Each run is `fedmtl fit` in this process, in this order, with `--accelerator "
        f"{args.accelerator} --logger.wandb false` and a fresh run directory; the generated data "
        "were written before the scenario's first run (data (s)), so no wall time includes them. "
        "Peak memory: torch.cuda.max_memory_allocated / max_memory_reserved over the run (reset "
        "before it). img/round: images trained in a round, the sum over the clients of "
        "floor(train_images / batch_size) * batch_size * local_epochs (train_images from "
        "results.json). img/s: img/round over the round's time/train; the clients train one after "
        "the other on the one device, so this is also a single client's rate. 'img/s r2+' leaves "
        "out round 1 (CUDA and cuDNN warm-up). Times are means over the rounds, in seconds; a "
        "phase that runs only in some rounds (eval, finish) is averaged over those.",
        "",
        results_file.table_head(
            "run",
            "status",
            "wall (s)",
            "data (s)",
            "peak alloc (GiB)",
            "peak reserved (GiB)",
            "rounds",
            "img/round",
            "img/s",
            "img/s r2+",
            *[f"{key} (s)" for key in keys],
            labels=2,
        ),
    ]
    for run in runs:
        rounds = sorted(run.times)
        train = [run.times[r].get("train", math.nan) for r in rounds]
        later = [t for r, t in zip(rounds, train) if r > 1]
        means = []
        for key in keys:
            values = [run.times[r][key] for r in rounds if key in run.times[r]]
            means.append(fmt(sum(values) / len(values)) if values else "-")
        lines.append(
            results_file.row(
                run.name,
                run.status,
                fmt(run.wall, 1),
                data.get(run.scenario.name, "-"),
                fmt(run.peak_allocated),
                fmt(run.peak_reserved),
                len(rounds),
                run.images if run.images is not None else "-",
                fmt(rate(run.images * len(train) if run.images else None, sum(train)), 1),
                fmt(rate(run.images * len(later) if run.images else None, sum(later)), 1) if later else "-",
                *means,
            )
        )
    failed = [run for run in runs if run.error]
    if failed:
        lines += ["", "Errors:", ""] + [f"- {run.name}: `{run.error}`" for run in failed]
    for run in runs:
        if not run.times:
            continue
        lines += [
            "",
            f"### {run.name}: per round (s)",
            "",
            results_file.table_head("round", *keys, "img/s"),
        ]
        for r in sorted(run.times):
            cells = [fmt(run.times[r][key]) if key in run.times[r] else "-" for key in keys]
            lines.append(
                results_file.row(r, *cells, fmt(rate(run.images, run.times[r].get("train", math.nan)), 1))
            )
    return "\n".join(lines)


def copy_out(path: Path, runs: list[Run]) -> None:
    """The results file and each run's metrics.csv into $OUT (at most 8 files come back)."""
    out = os.environ.get("OUT")
    if not out:
        return
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, target / path.name)
    copied = [path.name]
    for run in runs[:6]:  # with the results file and the log: 8 at most
        metrics = run.run_dir / "metrics.csv"
        if metrics.is_file():
            shutil.copy(metrics, target / f"{run.name}.metrics.csv")
            copied.append(f"{run.name}.metrics.csv")
    log(f"copied to {target}: {', '.join(copied)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds-demo", type=int, default=10, help="rounds of each demo run (the demo's 10)")
    parser.add_argument("--rounds-paper", type=int, default=2, help="rounds of each paper-shape run")
    parser.add_argument("--accelerator", default="gpu", help="gpu; cpu for a smoke test")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and 2 rounds: a CPU check")
    parser.add_argument("--tmp", type=Path, required=True, help="folder for the data and run directories")
    parser.add_argument("--only", choices=("demo", "paper"), help="run one scenario only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds_demo = args.rounds_paper = 2
    for name in ("rounds_demo", "rounds_paper"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    os.chdir(ROOT)  # configs/demo.yaml and the commit are this checkout's
    tmp = args.tmp.resolve()
    import lightning
    import torch

    device = cuda()
    log(
        f"torch {torch.__version__}, lightning {lightning.__version__}, device "
        + (device.get_device_name(0) if device is not None else "none (no CUDA)")
    )
    chosen = scenarios(args, tmp)
    refuse_earlier_runs(parser, tmp, [tmp / "runs" / f"{s.name}-{p}" for s in chosen for p in PRECISIONS])
    runs: list[Run] = []
    data: dict[str, str] = {}
    for scenario in chosen:
        data[scenario.name] = prepare_data(scenario)
        for precision in PRECISIONS:
            name = f"{scenario.name}-{precision}"
            run = Run(name, scenario, precision, tmp / "runs" / name)
            runs.append(run)
            execute(run)
            read_times(run)
            try:
                read_images(run)
            except (KeyError, StopIteration, ValueError, TypeError) as err:
                log(f"{run.name}: images per round unknown ({type(err).__name__}: {err})")
    body = report(runs, data, args)
    print(body, flush=True)
    path = results_file.record("gpu_rounds", "GPU round times, throughput and peak memory", body)
    copy_out(path, runs)
    return 0 if all(run.status == "ok" for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
