"""How long ``fedmtl fit --resume true`` takes on a finished run (it reprints the results).

    .venv/bin/python benchmarks/reprint.py [--repeats 3] [--checkout DIR ...]

Trains the tiny scenario of the tests (3 rounds, 32x32 images, CPU, one thread) once with the
first checkout, then times, as fresh processes run in each checkout's directory,

    python -m fedmtl fit --config SCENARIO --run_dir RUN --resume true --cpu_threads 1

which finds the run finished and prints its results. ``--checkout`` may be given several times,
e.g. a copy of an older commit (``git archive COMMIT | tar -x -C /tmp/old``) and this one; the
runs are taken in turns (each repeat times every checkout once), so a machine that gets busier
slows all of them alike. Printed: every time, the median and the min. Absolute times depend on
the machine and its load. The table is recorded in ``benchmarks/results/reprint.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_file

REPO = Path(__file__).resolve().parents[1]


def python(args: list[str], cwd: Path) -> tuple[float, str]:
    """Seconds from starting ``python ARGS`` in ``cwd`` to its exit, and its stdout; a failure
    stops the script."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} (in {cwd}) failed:\n{done.stderr}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkout", type=Path, action="append", help="default: this one")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import tiny_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "data"
        for dataset, folder in (("pascal_context", "PASCALContext"), ("nyud", "NYUDv2")):
            synth = ["-m", "fedmtl", "data", "synth", "--dataset", dataset, "--root", str(data / folder)]
            python([*synth, "--num_train", "12", "--num_val", "4", "--size", "[32, 32]"], checkouts[0])
        scenario, run = str(tiny_config(tmp_path, data)), str(tmp_path / "run")
        fit = ["-m", "fedmtl", "fit", "--config", scenario, "--run_dir", run]
        python(fit, checkouts[0])
        reprint = [*fit, "--resume", "true", "--cpu_threads", "1"]
        times: dict[Path, list[float]] = {c: [] for c in checkouts}
        printed: dict[Path, str] = {}
        for _ in range(args.repeats):
            for checkout in checkouts:
                seconds, printed[checkout] = python(reprint, checkout)
                times[checkout].append(seconds)
    same = len(set(printed.values())) == 1
    lines = [
        "`fedmtl fit --resume true --cpu_threads 1` on a finished tiny run (3 rounds), a fresh process each, "
        f"{args.repeats} repeats taken in turns; the checkouts printed {'the same' if same else 'different'} "
        "results.",
        "",
        results_file.table_head("checkout", "times (s)", "median (s)", "min (s)"),
    ]
    for checkout, seconds in times.items():
        lines.append(
            results_file.row(
                checkout.name,
                ", ".join(f"{s:.1f}" for s in seconds),
                f"{statistics.median(seconds):.1f}",
                f"{min(seconds):.1f}",
            )
        )
    print("\n".join(lines))
    results_file.record("reprint", "Reprinting a finished run", "\n".join(lines))


if __name__ == "__main__":
    main()
