"""How the edge odsF of finished benchmark runs moves with the ground truth's thinning.

    python benchmarks/edge_rescore.py --out runs/benchmark/scenario1

Every finished run under ``OUT/METHOD/seed_S`` (what ``benchmarks/compare_methods.py`` leaves)
is validated twice, ``fedmtl validate --evaluation.edge_thin_gt true`` and ``false`` (its
latest checkpoint, scored against the thinned ground truth as SEISM does, then against the
unthinned one, fedmtl's scoring before issue #25), two runs at a time. The table gives, per
method and edge client, the mean ± std over seeds of both and their mean paired difference;
it is recorded in ``benchmarks/results/edge_rescore_<OUT's name>.md`` (results_file.py).
Each validate replaces the run's own ``validate_results.json``; nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import results_file


def edge_scores(run: Path, thin: bool) -> dict[str, float]:
    """``{client: edge odsF}`` of ``run``'s latest checkpoint scored with or without thinning."""
    flag = "true" if thin else "false"
    command = [
        sys.executable,
        "-m",
        "fedmtl",
        "validate",
        "--run_dir",
        str(run),
        "--evaluation.edge_thin_gt",
        flag,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    clients = json.loads((run / "validate_results.json").read_text())["clients"]
    return {name: c["metrics"]["edge"]["odsF"] for name, c in clients.items() if "edge" in c["metrics"]}


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {spread:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a compare_methods.py output folder")
    args = parser.parse_args(argv)
    runs = sorted(p for p in args.out.glob("*/seed_*") if (p / "results.json").is_file())
    if not runs:
        parser.error(f"--out {args.out}: no finished run (METHOD/seed_S/results.json) there")
    with ThreadPoolExecutor(2) as pool:  # one validate writes a run's file at a time: per run, in order
        scores = dict(zip(runs, pool.map(lambda r: (edge_scores(r, True), edge_scores(r, False)), runs)))
    table: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run, (thinned, unthinned) in scores.items():
        for client in thinned:
            table.setdefault((run.parent.name, client), []).append((thinned[client], unthinned[client]))
    lines = [
        "| method | client | thinned (SEISM) | unthinned | mean paired change |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for (method, client), pairs in table.items():
        change = statistics.mean(a - b for a, b in pairs)
        lines.append(
            f"| {method} | {client} | {_cell([a for a, _ in pairs])} | {_cell([b for _, b in pairs])} | {change:+.2f} |"
        )
    body = f"Edge odsF of {len(runs)} finished runs in {args.out}, each validated both ways.\n\n" + "\n".join(
        lines
    )
    results_file.record(
        f"edge_rescore_{args.out.name}", "Edge odsF: thinned against unthinned ground truth", body
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
