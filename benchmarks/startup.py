"""How long the quick commands take to start, against ``python -c "import torch"``.

    .venv/bin/python benchmarks/startup.py [--repeats 7] [--checkout DIR ...]

Each command is a fresh process, timed from start to exit (wall clock):

    python -c "import torch"                 the floor: every fedmtl command imports torch
    python -m fedmtl fit --help
    python -m fedmtl configs
    python -m fedmtl data check --help

run with the checkout as the working directory (``python -m`` puts it first on sys.path, so
its fedmtl is the one imported, whatever is installed). ``--checkout`` may be given several
times, e.g. a copy of an older commit (``git archive COMMIT | tar -x -C /tmp/old``) and this
one, to compare them in the same run. The runs are taken in turns (for each repeat, every
command of every checkout once, after one warm-up round), so a machine that gets busier slows
all of them alike. Printed: the median (and min) of ``--repeats`` runs and the ratio of the
medians to ``import torch``'s. Target (issue 13): ``fit --help`` at most 1.5x ``import torch``.

Absolute times depend on the machine and its load; the ratios are what the script is for.
The table is recorded in ``benchmarks/results/startup.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import results_file

REPO = Path(__file__).resolve().parents[1]
BASELINE = ["-c", "import torch"]
COMMANDS = {
    "fit --help": ["-m", "fedmtl", "fit", "--help"],
    "configs": ["-m", "fedmtl", "configs"],
    "data check --help": ["-m", "fedmtl", "data", "check", "--help"],
}


def run(args: list[str], cwd: Path) -> float:
    """Seconds from starting ``python ARGS`` in ``cwd`` to its exit; a failure stops the script."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} (in {cwd}) failed:\n{done.stderr}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="a source tree to run fedmtl from (repeatable; default: this repository)",
    )
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    for checkout in checkouts:
        where = subprocess.run(
            [sys.executable, "-c", "import fedmtl; print(fedmtl.__file__)"],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not Path(where).resolve().is_relative_to(checkout):
            raise SystemExit(f"{checkout}: python -m fedmtl there imports {where}, not the checkout's fedmtl")

    jobs = {("import torch", ""): (BASELINE, checkouts[0])}
    for checkout in checkouts:
        for label, command in COMMANDS.items():
            jobs[(label, str(checkout))] = (command, checkout)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in jobs}
    for i in range(args.repeats + 1):  # round 0 warms the file cache and is not counted
        for key, (command, cwd) in jobs.items():
            seconds = run(command, cwd)
            if i:
                times[key].append(seconds)

    floor = statistics.median(times[("import torch", "")])
    lines = [
        f"Python {sys.version.split()[0]}; each command a fresh process, timed start to exit, "
        f"median and min of {args.repeats} runs taken in turns after one warm-up round. Ratio: the "
        'command\'s median over the median of `python -c "import torch"` in this run (the floor: '
        "every fedmtl command imports torch); target (issue 13) `fit --help` at most 1.5.",
        "",
        results_file.table_head(
            "command", "checkout", "median (s)", "min (s)", "median / import torch", labels=2
        ),
    ]
    for (label, checkout), seconds in times.items():
        median = statistics.median(seconds)
        where = "this checkout" if checkout == str(REPO) else checkout  # no local path in the record
        lines.append(
            results_file.row(label, where, f"{median:.2f}", f"{min(seconds):.2f}", f"{median / floor:.2f}")
        )
    print("\n".join(lines))
    results_file.record(
        "startup", "Start-up time of the quick commands against import torch", "\n".join(lines)
    )


if __name__ == "__main__":
    main()
