"""Evaluation time against training time, per evaluation round, from a run's metrics.csv.

    .venv/bin/fedmtl fit --config configs/demo.yaml --run_dir runs/demo-ratio --cpu_threads 1
    .venv/bin/python benchmarks/eval_ratio.py runs/demo-ratio

Prints, for every round that evaluated, ``time/eval`` (every client's validation split, every
model the method reports) over ``time/train`` (the same round's local training of all clients):
issue #13 asks for at most 0.3 at every evaluation of the demo. The times are the run's own, so
the figure belongs to the two commands together: run them one after the other, on the same
checkout. The table is recorded in ``benchmarks/results/eval_ratio.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import results_file


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
    rounds = ratios(metrics)
    lines = [
        f"The rounds of the run in {args.run_dir} that evaluated, from its metrics.csv (times measured by "
        "its `fedmtl fit`). Ratio: time/eval (every client's validation split, every model the method "
        "reports) over time/train (the same round's local training of all clients); issue #13 asks for "
        f"at most 0.3 at every evaluation of the demo. Highest: "
        f"{max((e / t for t, e in rounds.values()), default=float('nan')):.2f}.",
        "",
        results_file.table_head("round", "train (s)", "evaluate (s)", "evaluate / train"),
        *(
            results_file.row(r, f"{train:.1f}", f"{evaluate:.1f}", f"{evaluate / train:.2f}")
            for r, (train, evaluate) in rounds.items()
        ),
    ]
    print("\n".join(lines))
    results_file.record("eval_ratio", "Evaluation time against training time", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
