"""Training time of a client with the sample cache and the channels-last layout, on and off.

    .venv/bin/python benchmarks/client_speed.py [--repeats 3] [--rounds 2] [--local_epochs 4]

For the benchmark's two client shapes (the four-task NYUD-v2 client and a single-task
PASCAL-Context semseg client, on the benchmark's 32x32 generated data, its recipe, one CPU
thread), it runs ``fedmtl fit`` (Local) with each setting of ``data.cache_mib`` (0 / 64) and
``model.channels_last`` (false / true), the settings in turns ``--repeats`` times so that all
see the same machine, and prints the median training time (the runs' ``time/train``, summed
over rounds; data loading and steps, no evaluation) and its ratio to the plain setting. It
also checks that the cache leaves the results unchanged, bit for bit. The data are read from
``--root`` (generated there when missing); the runs go to a temporary folder, removed after.
The table is recorded in ``benchmarks/results/client_speed.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import statistics
import tempfile
from pathlib import Path

import results_file

BENCHMARK_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "benchmark" / "scenario1.yaml"
CLIENTS = {
    "nyud": {"dataset": "nyud", "tasks": ["semseg", "normals", "edge", "depth"]},
    "pascal_context": {"dataset": "pascal_context", "tasks": ["semseg"], "single_task": True},
}
SETTINGS = {  # name -> (data.cache_mib, model.channels_last)
    "plain": (0, False),
    "cache": (64, False),
    "channels_last": (0, True),
    "both": (64, True),
}


def config(client: dict, root: str, rounds: int, local_epochs: int) -> dict:
    """One client alone with the benchmark's recipe, read from configs/benchmark/scenario1.yaml
    (its data, optimiser and threads; the two settings under test are passed on the command
    line, so the file's own values do not matter)."""
    import yaml

    cfg = yaml.safe_load(BENCHMARK_CONFIG.read_text())
    optimizer = next(group for group in cfg["clients"] if group["dataset"] == client["dataset"])["optimizer"]
    cfg["clients"] = [{**client, "local_epochs": local_epochs, "optimizer": optimizer}]
    cfg["algorithm"] = {"class_path": "Local"}
    cfg["data"]["root"] = root
    cfg.update(evaluation={"every": 0}, rounds=rounds)
    del cfg["run_dir"]  # each run gets its own folder under a temporary directory
    return cfg


def timed_fit(config_file: Path, run_dir: Path, cache_mib: int, channels_last: bool) -> tuple[float, dict]:
    """Seconds of training (time/train over the rounds) and the run's final metrics."""
    from fedmtl.cli import main

    argv = ["fit", "--config", str(config_file), "--run_dir", str(run_dir)]
    argv += ["--data.cache_mib", str(cache_mib), "--model.channels_last", str(channels_last).lower()]
    output = io.StringIO()  # a run's own report would bury the table
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"{output.getvalue()}\nfedmtl {' '.join(argv)} failed")
    with open(run_dir / "metrics.csv") as f:
        seconds = sum(float(row["value"]) for row in csv.DictReader(f) if row["key"] == "time/train")
    return seconds, json.loads((run_dir / "results.json").read_text())["clients"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting, in turns")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each run")
    parser.add_argument("--local_epochs", type=int, default=4, help="local epochs of the client per round")
    parser.add_argument("--root", default="data/benchmark", help="the benchmark's generated data")
    args = parser.parse_args(argv)
    for name in ("repeats", "rounds", "local_epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")

    import yaml

    lines = [
        f"Local, one client, {args.rounds} rounds of {args.local_epochs} local epochs, one CPU thread, "
        f"the settings in turns, median of {args.repeats}: training seconds (time/train) and, in "
        "brackets, their ratio to plain (data.cache_mib 0, model.channels_last false) measured in "
        'this run. "Same results": the final metrics with the cache equal those without, bit for bit.',
        "",
        results_file.table_head("client", *SETTINGS, "cache: same results"),
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for shape, client in CLIENTS.items():
            config_file = Path(tmp) / f"{shape}.yaml"
            config_file.write_text(yaml.safe_dump(config(client, args.root, args.rounds, args.local_epochs)))
            seconds = {name: [] for name in SETTINGS}
            results = {}
            for repeat in range(args.repeats):
                for name, (cache_mib, channels_last) in SETTINGS.items():
                    run_dir = Path(tmp) / f"{shape}-{name}-{repeat}"
                    took, results[name] = timed_fit(config_file, run_dir, cache_mib, channels_last)
                    seconds[name].append(took)
            plain = statistics.median(seconds["plain"])
            cells = [
                f"{statistics.median(s):.1f} s ({statistics.median(s) / plain:.2f})" for s in seconds.values()
            ]
            same = (
                "yes"
                if results["cache"] == results["plain"] and results["both"] == results["channels_last"]
                else "NO"
            )
            lines.append(results_file.row(shape, *cells, same))
            print(lines[-1], flush=True)
    results_file.record(
        "client_speed", "Client training time: sample cache and channels-last", "\n".join(lines)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
