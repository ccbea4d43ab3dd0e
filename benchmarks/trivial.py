"""Print the trivial predictors of every task of a scenario (:mod:`fedmtl.trivial`).

python benchmarks/trivial.py --config configs/benchmark/scenario1.yaml [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedmtl.cli import _run_parser
from fedmtl.trivial import scenario_trivial_metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a run config (its data and clients)")
    parser.add_argument("--json", type=Path, help="also write the values to this file")
    args = parser.parse_args(argv)
    run_parser = _run_parser()
    cfg = run_parser.instantiate(run_parser.parse_args(["--config", args.config]))
    table = scenario_trivial_metrics(cfg)
    for key, metrics in table.items():
        ((name, value),) = metrics.items()
        print(f"{key:28s} {name:5s} {value:8.3f}  (trivial)")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
