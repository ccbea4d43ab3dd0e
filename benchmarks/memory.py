"""Peak host memory of the demo scenario with 6 and with 60 clients, per client-store kind.

    .venv/bin/python benchmarks/memory.py [--rounds 1] [--replicas 1 10] [--stores memory disk]

60 clients are the demo's 6 with ``replicas: 10`` (each client split in 10, the data split
evenly), so the total training work per round stays the same. Each run is a fresh
``fedmtl fit`` process; its peak resident set size is read from the OS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--stores", nargs="+", default=["memory", "disk"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in args.replicas:
            for store in args.stores:
                gib, seconds, clients = measure(replicas, store, args.rounds, Path(tmp))
                print(
                    f"{clients:3d} clients, store={store:6s}: peak RSS {gib:.2f} GiB ({seconds:.0f} s, {args.rounds} round)"
                )


if __name__ == "__main__":
    main()
