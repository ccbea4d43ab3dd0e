"""Evaluation time against training time, per evaluation round, from a run's metrics.csv.

    .venv/bin/fedmtl fit --config configs/demo.yaml --run_dir runs/demo-ratio --cpu_threads 1
    .venv/bin/python benchmarks/eval_ratio.py runs/demo-ratio

Prints, for every round that evaluated, ``time/eval`` (every client's validation split, every
model the method reports) over ``time/train`` (the same round's local training of all clients):
issue #13 asks for at most 0.3 at every evaluation of the demo.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path


def ratios(metrics_csv: Path) -> dict[int, tuple[float, float]]:
    """{round: (train seconds, eval seconds)} for the rounds that evaluated."""
    times: dict[int, dict[str, float]] = defaultdict(dict)
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            if row["key"] in ("time/train", "time/eval"):
                times[int(row["round"])][row["key"]] = float(row["value"])
    return {r: (t["time/train"], t["time/eval"]) for r, t in sorted(times.items()) if "time/eval" in t}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    metrics = args.run_dir / "metrics.csv"
    if not metrics.is_file():
        parser.error(f"{metrics}: no such file (is {args.run_dir} a run directory?)")
    for round_, (train, evaluate) in ratios(metrics).items():
        print(
            f"round {round_:3d}: train {train:7.1f} s, evaluate {evaluate:6.1f} s, ratio {evaluate / train:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
