"""Peak host memory of the demo scenario with 6 and with 60 clients, per client-store kind.

    .venv/bin/python benchmarks/memory.py [--rounds 1] [--replicas 1 10] [--stores memory disk]

60 clients are the demo's 6 with ``replicas: 10`` (each client split in 10, the data split
evenly), so the total training work per round stays the same. Each run is a fresh
``fedmtl fit`` process; its peak resident set size is read from the OS. The table, with each
run's peak as a ratio to the run with the fewest clients on the same store, is recorded in
``benchmarks/results/memory.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_file
import yaml

ROOT = Path(__file__).resolve().parent.parent

_MEASURE = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
if code.returncode:
    sys.stderr.write(code.stderr[-2000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code.returncode)
"""


def measure(replicas: int, store: str, rounds: int, tmp: Path) -> tuple[float, float, int]:
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    for group in cfg["clients"]:
        group["replicas"] = replicas
    cfg["data"]["root"] = str(ROOT / cfg["data"]["root"])
    cfg.update(rounds=rounds, store=store, run_dir=str(tmp / f"run-{replicas}-{store}"), checkpoint_every=0)
    cfg["logger"] = {"wandb": False}
    cfg["evaluation"] = {"every": 0}
    path = tmp / f"demo-{replicas}-{store}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "fedmtl", "fit", "--config", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    kib, code = out.stdout.split()
    if int(code) != 0:
        raise RuntimeError(out.stderr)
    clients = len(json.loads((tmp / f"run-{replicas}-{store}" / "results.json").read_text())["clients"])
    return int(kib) / 1024**2, time.perf_counter() - start, clients


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--stores", nargs="+", default=["memory", "disk"])
    args = parser.parse_args(argv)
    lines = [
        f"The demo scenario, {args.rounds} round(s), each run a fresh `fedmtl fit` process, in this "
        "order. Ratio: the run's peak resident set size over that of the run with the fewest clients "
        "on the same store, in this run.",
        "",
        results_file.table_head(
            "clients", "store", "peak RSS (GiB)", "wall (s)", "peak / fewest clients'", labels=2
        ),
    ]
    print("\n".join(lines), flush=True)
    fewest: dict[str, float] = {}  # store -> peak GiB of its first run, the one with min(replicas)
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in sorted(args.replicas):
            for store in args.stores:
                gib, seconds, clients = measure(replicas, store, args.rounds, Path(tmp))
                fewest.setdefault(store, gib)
                cells = (f"{gib:.2f}", f"{seconds:.0f}", f"{gib / fewest[store]:.2f}")
                lines.append(results_file.row(clients, store, *cells))
                print(lines[-1], flush=True)
    results_file.record("memory", "Peak host memory with more clients", "\n".join(lines))


if __name__ == "__main__":
    main()
