"""The embedded demo, every method, in this checkout and in a baseline checkout: same results?

    .venv/bin/python benchmarks/demo_vs_main.py --baseline /work/main/.base --tmp /tmp/dvm \
        --smoke --rounds 1 --methods FedAvg Local --jobs 1          # a trial, minutes on a CPU
    .venv/bin/python benchmarks/demo_vs_main.py --baseline /work/main/.base --tmp /tmp/dvm \
        --accelerator gpu --jobs 12       # all methods, the demo's 10 rounds: ~5 min, 1 GPU + 16 cores

For every registered method (``fedmtl.methods.METHODS`` of this checkout, default options, or
``--methods``) it runs, each in its own process, ``--jobs`` at a time::

    python -m fedmtl fit --config configs/demo.yaml --algorithm NAME --run_dir RUN \
        --data.root DATA --logger.wandb false --rounds N --accelerator A [smoke options]

once in this checkout (the repository this script is in: cwd and ``PYTHONPATH`` set to it) and
once in the baseline tree ``--baseline DIR`` (a checkout of an older commit: cwd and
``PYTHONPATH`` set to DIR, so ``python -m fedmtl`` imports the baseline's fedmtl). Both runs of a
method read the same generated data: it is written once, before any run starts, by this
checkout's ``fedmtl data synth`` with the demo config's ``data.synth`` settings (as
``fedmtl fit`` resolves them, smoke options included) into ``TMP/data_demo`` (``TMP/data_smoke``
with ``--smoke``); a run that still generates data is flagged in the notes. Then it compares
each method's final metrics in the two results.json (``clients.C.metrics.T.M`` and, where the
method evaluates another model too, ``also_evaluated.L.C.metrics.T.M``): the largest relative
difference ``|new - old| / max(|old|, 1e-12)`` (a metric null in one run only, or present in
one run only, counts as inf) and whether the results are identical.

``--smoke`` makes the runs small: 32x32 training crops and 120 + 8 / 20 + 8 generated 32x32
images (PASCAL-Context / NYUD-v2; enough for a human_parts client's batch of 8). A run that fails
does not stop the others: its first ``error:`` line (or, lacking one, the last line of its
standard error) goes into the table. Run directories and logs go under ``TMP/runs`` and
``TMP/logs`` (a method's run directories are removed before it runs again). The table (method, largest relative difference, where, identical,
wall seconds of each run) is printed and recorded in ``benchmarks/results/OUT.md`` (``--out``, default ``demo_vs_main``)
(``benchmarks/results_file.py``; ``FEDMTL_RESULTS_DIR`` redirects it), rewritten as each method
finishes, so a command stopped early leaves the methods done so far; with ``OUT`` set, the file
is also copied to ``$OUT``. The exit status is 1 when a run failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import results_file
import yaml

NEW = Path(__file__).resolve().parents[1]  # this checkout
CONFIG = "configs/demo.yaml"  # relative to each tree
TREES = ("new", "baseline")
SMOKE = {
    "--data.train_size": "[32,32]",
    "--data.synth.pascal_context.num_train": "120",
    "--data.synth.pascal_context.num_val": "8",
    "--data.synth.pascal_context.size": "[32,32]",
    "--data.synth.nyud.num_train": "20",
    "--data.synth.nyud.num_val": "8",
    "--data.synth.nyud.size": "[32,32]",
}
# What this checkout registers: the method names and each dataset's folder under a data root.
QUERY = (
    "import json\n"
    "from fedmtl.data.datasets import DATASETS\n"
    "from fedmtl.methods import METHODS\n"
    "print(json.dumps({'methods': list(METHODS), "
    "'folders': {n: DATASETS.get(n).root_folder for n in DATASETS.names()}}))\n"
)


def _env(tree: Path) -> dict[str, str]:
    # The tree first; what the environment already adds (packages installed apart) after it
    inherited = [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != NEW
    ]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *inherited]), "PYTHONUNBUFFERED": "1"}


def _fedmtl(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedmtl", *args],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        check=check,
    )


def first_error(stderr: str) -> str:
    """The first ``error:`` line of a failed run's standard error, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("error:") or ": error:" in line.lower():
            return line
    return lines[-1] if lines else "(no standard error)"


def generate_data(fit_args: list[str], data: Path, folders: dict[str, str]) -> None:
    """Write the demo's synthetic data into ``data`` with this checkout, once, as ``fit`` would."""
    printed = _fedmtl(NEW, "fit", *fit_args, "--print_config")
    synth = (yaml.safe_load(printed.stdout).get("data") or {}).get("synth") or {}
    for dataset, spec in synth.items():
        folder = data / folders[dataset]
        if folder.is_dir() and any(folder.iterdir()):
            continue  # written by an earlier invocation with the same --tmp and --smoke
        print(f"generating {dataset} data in {folder}", flush=True)
        size = ",".join(str(s) for s in spec["size"])
        _fedmtl(
            NEW,
            "data",
            "synth",
            *("--dataset", dataset, "--root", str(folder), "--num_train", str(spec["num_train"])),
            *("--num_val", str(spec["num_val"]), "--size", f"[{size}]", "--seed", str(spec["seed"])),
        )


def run_one(tree: Path, args: list[str], run_dir: Path, log: Path) -> dict[str, Any]:
    """One ``fedmtl fit`` in ``tree``: its wall seconds, results.json (None on failure) and error."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = _fedmtl(tree, "fit", *args, "--run_dir", str(run_dir), check=False)
    seconds = time.perf_counter() - start
    log.write_text(f"$ rc {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    results = run_dir / "results.json"
    if done.returncode != 0 or not results.is_file():
        return {"seconds": seconds, "results": None, "error": first_error(done.stderr)}
    regenerated = "generating synthetic" in done.stderr
    return {"seconds": seconds, "results": json.loads(results.read_text()), "regenerated": regenerated}


def final_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """``clients.C.metrics.T.M`` and ``also_evaluated.L.C.metrics.T.M`` -> value (None: null)."""
    tables = {"clients": results.get("clients", {})}
    for label, table in (results.get("also_evaluated") or {}).items():
        tables[f"also_evaluated.{label}"] = table
    return {
        f"{prefix}.{client}.metrics.{task}.{metric}": value
        for prefix, table in tables.items()
        for client, entry in table.items()
        for task, metrics in entry.get("metrics", {}).items()
        for metric, value in metrics.items()
    }


def compare(new: dict[str, Any], old: dict[str, Any]) -> tuple[float, str, bool]:
    """The largest relative difference of the final metrics, where, and whether all are equal."""
    a, b = final_metrics(new), final_metrics(old)
    largest, where = 0.0, "-"
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if key not in a or key not in b:
            diff = math.inf
        elif x is None or y is None:
            diff = 0.0 if x is y else math.inf
        else:
            diff = abs(x - y) / max(abs(y), 1e-12)
        if diff > largest:
            largest, where = diff, key
    return largest, where, a == b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout of the commit to compare with")
    parser.add_argument("--tmp", type=Path, required=True, help="folder of the run dirs, logs and data")
    parser.add_argument("--rounds", type=int, default=10, help="federated rounds (the demo's: 10)")
    parser.add_argument("--accelerator", default="cpu", help="cpu, or gpu on a GPU machine")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--smoke", action="store_true", help="32x32 crops and a few tiny generated images")
    parser.add_argument("--methods", nargs="+", help="these methods only (default: all registered)")
    parser.add_argument(
        "--out",
        default="demo_vs_main",
        help="benchmarks/results/OUT.md: demo_vs_main or a name that starts with it",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if not re.fullmatch(r"demo_vs_main[A-Za-z0-9_-]*", args.out):
        # A name of its own: a rerun never replaces another script's results file.
        parser.error(
            f"--out must be demo_vs_main or start with it (letters, digits, - or _), got {args.out!r}"
        )
    baseline, tmp = args.baseline.resolve(), args.tmp.resolve()
    if not (baseline / CONFIG).is_file():
        parser.error(f"--baseline {baseline} has no {CONFIG}")
    start = time.perf_counter()

    query = subprocess.run(
        [sys.executable, "-c", QUERY], cwd=NEW, env=_env(NEW), capture_output=True, text=True, check=True
    )
    registered = json.loads(query.stdout.strip().splitlines()[-1])
    methods = args.methods or registered["methods"]
    data = tmp / ("data_smoke" if args.smoke else "data_demo")
    common = ["--config", CONFIG, "--data.root", str(data), "--logger.wandb", "false"]
    common += ["--rounds", str(args.rounds), "--accelerator", args.accelerator]
    if args.smoke:
        common += [item for pair in SMOKE.items() for item in pair]
    generate_data([*common, "--algorithm", methods[0]], data, registered["folders"])

    base_commit = subprocess.run(
        ["git", "-C", str(baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (tmp / "logs").mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in methods}
    lock = threading.Lock()

    def table() -> str:
        columns = ("method", "largest rel. diff", "where", "identical", "new (s)", "baseline (s)", "notes")
        lines = [
            results_file.row(*columns),
            results_file.row("---", "---:", "---", "---", "---:", "---:", "---"),
        ]
        for method in methods:
            new, old = runs[method].get("new"), runs[method].get("baseline")
            seconds = [f"{r['seconds']:.0f}" if r else "-" for r in (new, old)]
            notes = [f"{tree}: {r['error']}" for tree, r in zip(TREES, (new, old)) if r and r.get("error")]
            notes += [
                f"{tree}: generated data" for tree, r in zip(TREES, (new, old)) if r and r.get("regenerated")
            ]
            if new and old and new["results"] is not None and old["results"] is not None:
                largest, where, same = compare(new["results"], old["results"])
                cells = [f"{largest:.3g}", f"`{where}`" if where != "-" else "-", "yes" if same else "no"]
            else:  # not finished yet ("-") or failed ("n/a")
                cells = ["-", "-", "-" if new is None or old is None else "n/a"]
            lines.append(results_file.row(method, *cells, *seconds, "; ".join(notes).replace("|", "\\|")))
        return "\n".join(lines)

    def body(finished: bool) -> str:
        done = sum(len(r) for r in runs.values())
        state = "" if finished else f"**Partial: {done} of {2 * len(methods)} runs finished.**\n\n"
        return (
            f"{state}This checkout ({NEW}) against the baseline {baseline} (commit {base_commit or 'unknown'}): "
            f"`fedmtl fit --config {CONFIG}`, {args.rounds} round(s), accelerator {args.accelerator}, "
            f"{'smoke data (32x32)' if args.smoke else 'the demo data'}, {args.jobs} run(s) at a time; "
            f"largest relative difference |new - old| / max(|old|, 1e-12) over each method's final metrics.\n\n"
            f"{table()}\n\nWall time of the whole command: {time.perf_counter() - start:.0f} s.\n"
        )

    def save(finished: bool) -> Path:
        write = results_file.record if finished else results_file.write
        path = write(args.out, "The demo in this checkout and in a baseline", body(finished))
        if os.environ.get("OUT"):
            copy = Path(os.environ["OUT"]).resolve() / path.name
            if copy != path.resolve():  # not when FEDMTL_RESULTS_DIR is $OUT
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, copy)
        return path

    trees = {"new": NEW, "baseline": baseline}
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {
            pool.submit(
                run_one,
                trees[tree],
                [*common, "--algorithm", method],
                tmp / "runs" / tree / method,
                tmp / "logs" / f"{tree}_{method}.log",
            ): (method, tree)
            for method in methods
            for tree in TREES
        }
        for future in as_completed(futures):
            method, tree = futures[future]
            result = future.result()
            with lock:
                runs[method][tree] = result
                state = f"failed: {result['error']}" if result.get("error") else "done"
                print(f"{method} ({tree}): {result['seconds']:.0f} s, {state}", flush=True)
                save(finished=False)

    print(table())
    save(finished=True)
    print(f"wall time: {time.perf_counter() - start:.0f} s")
    failed = any(r.get("error") for by_tree in runs.values() for r in by_tree.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
