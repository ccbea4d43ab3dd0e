"""The method benchmark: every method × several seeds on one config, then `fedmtl report`.

    python benchmarks/compare_methods.py --config configs/benchmark/scenario1.yaml \
        --seeds 0 1 2 --jobs 2 --out runs/benchmark/scenario1      # what `make benchmark` runs

Each run is ``fedmtl fit --config CONFIG --algorithm METHOD --seed S --cpu_threads 1`` in its
own process, ``--jobs`` at a time, into ``OUT/METHOD/seed_S``. A run with a results.json is
finished and is not run again; an interrupted one resumes (``--resume true``), so the command
can be stopped and restarted. A finished run whose config.yaml differs from what this command
would run (in what the run computes: ``fedmtl fit``'s resume rule) stops the command before
anything runs: its results would otherwise enter the report under the new config. Nothing
outside ``OUT`` is written except the config's generated data, made once before the runs start,
and this script's own results file (below).

At the end it writes, in ``OUT``:

* ``trivial.json``: the trivial predictors of every task (:mod:`fedmtl.trivial`);
* ``report.md`` / ``report.csv``: ``fedmtl report`` of all runs against Local;
* ``learnt.md``: per client task, the trivial predictor and each method, ✓ where it is at least
  ``fedmtl.trivial.LEARNT_MARGIN`` (5 %) better;
* ``timing.json``: the wall time of the whole command and of each run;

then records the report, the learnt table and the runs' timings in
``benchmarks/results/benchmark_<config name>.md`` (or ``--record NAME``: ``NAME.md``, for a run of
some ``--methods`` beside the full record) with the command, commit, date and machine
(``benchmarks/results_file.py``; the docs include it), and prints the report and the wall
time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

METHODS = (
    "Local",
    "FedAvg",
    "FedProx",
    "FedOpt",
    "FedDEA",
    "FedPer",
    "FedBABU",
    "FedSTA",
    "Ditto",
    "FedAMP",
    "MaTFL",
    "FedHCA2",
    "PCGrad",
    "CAGrad",
)


def _fedmtl(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedmtl", *args]


def fit_args(config: Path, method: str, seed: int, run_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """The ``fedmtl fit`` arguments of one run; ``extra``: more of them, after these
    (benchmarks/privacy_utility.py's ``--privacy.*``)."""
    return [
        "--config", str(config), "--algorithm", method, "--seed", str(seed),
        "--run_dir", str(run_dir), "--cpu_threads", "1", "--resume", "true", *extra,
    ]  # fmt: skip


def stale_runs(config: Path, jobs: dict[tuple[str, int], tuple[Path, Path]]) -> list[str]:
    """The finished runs (results.json) made with a config that computes something else than
    this command's (``fedmtl fit``'s own resume rule): kept as they are, they would enter the
    report as if this config had made them."""
    from fedmtl.cli import _run_parser

    parser = _run_parser()
    found = (
        stale_run(config, method, seed, run_dir, parser=parser)
        for (method, seed), (run_dir, _) in jobs.items()
    )
    return [stale for stale in found if stale is not None]


def stale_run(
    config: Path, method: str, seed: int, run_dir: Path, extra: Sequence[str] = (), parser=None
) -> str | None:
    """Why the finished run in ``run_dir`` is stale (:func:`stale_runs`), or None when it is not
    (absent, unfinished, or made by these arguments)."""
    from fedmtl.cli import _run_parser
    from fedmtl.federated.rundir import config_changes

    if not (run_dir / "results.json").is_file():
        return None  # absent or unfinished: fit itself refuses a resume with another config
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return f"{run_dir}: finished, but its config.yaml is missing"
    parser = parser or _run_parser()
    now = parser.parse_args(fit_args(config, method, seed, run_dir, extra))
    now.pop("config", None)
    changes = config_changes(parser.parse_path(str(saved)).as_dict(), now.as_dict())
    return f"{run_dir}: {'; '.join(changes)}" if changes else None


def run_all(runs: Mapping[str, tuple], jobs: int) -> dict[str, float] | None:
    """Each run (name -> :func:`run_one`'s arguments), ``jobs`` at a time, with a progress bar;
    each one's seconds, or None once one failed (said in one line; the runs under way finish,
    nothing else starts)."""
    seconds: dict[str, float] = {}
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(run_one, *arguments): name for name, arguments in runs.items()}
        for future in tqdm(as_completed(futures), total=len(futures), desc="runs"):
            try:
                seconds[futures[future]] = future.result()
            except RuntimeError as failed:
                for queued in futures:
                    queued.cancel()
                print(f"error: {failed}", file=sys.stderr)
                return None
    return seconds


def run_one(
    config: Path, method: str, seed: int, run_dir: Path, log: Path, extra: Sequence[str] = ()
) -> float:
    """One run in its own process; its wall time in seconds (0 when it had finished before)."""
    if (run_dir / "results.json").is_file():
        return 0.0
    command = _fedmtl("fit", *fit_args(config, method, seed, run_dir, extra))
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method} seed {seed} failed (exit {done.returncode}); its log: {log}")
    return time.perf_counter() - start


def load_config(config: Path):
    from fedmtl.cli import _run_parser

    parser = _run_parser()
    return parser.instantiate(parser.parse_args(["--config", str(config)]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs and the report")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument(
        "--record",
        default=None,
        help="name of the results file in benchmarks/results/ (default: benchmark_<config stem>); "
        "a run of some --methods only records under another name, beside the full benchmark's",
    )
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    from fedmtl.cli import _ensure_data
    from fedmtl.tasks import TASKS
    from fedmtl.trivial import learnt_table, scenario_trivial_metrics

    start = time.perf_counter()
    cfg = load_config(args.config)
    jobs = {
        (method, seed): (args.out / method / f"seed_{seed}", args.out / "logs" / f"{method}_seed_{seed}.log")
        for seed in args.seeds
        for method in args.methods
    }
    stale = stale_runs(args.config, jobs)
    if stale:
        print(
            f"error: {len(stale)} finished run(s) in {args.out} were made with another config than "
            f"{args.config}:\n  " + "\n  ".join(stale) + f"\nNothing was run or changed. Move {args.out} "
            "aside (or pass another --out) to run the benchmark again, or restore the config they were made with.",
            file=sys.stderr,
        )
        return 2
    _ensure_data(cfg)  # once, before the runs start in parallel
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    seconds = run_all(
        {
            f"{method}/seed_{seed}": (args.config, method, seed, run_dir, log)
            for (method, seed), (run_dir, log) in jobs.items()
        },
        args.jobs,
    )
    if seconds is None:
        return 1

    trivial = scenario_trivial_metrics(cfg)
    (args.out / "trivial.json").write_text(json.dumps(trivial, indent=2))
    run_dirs = [str(run_dir) for run_dir, _ in jobs.values()]
    for fmt, suffix in (("markdown", "md"), ("csv", "csv")):
        target = str(args.out / f"report.{suffix}")  # this command's own output, redone each time
        report = subprocess.run(
            _fedmtl("report", *run_dirs, "--format", fmt, "--output", target, "--overwrite", "true")
        )
        if report.returncode != 0:  # fedmtl report said why on stderr
            return report.returncode
    wall = time.perf_counter() - start
    (args.out / "timing.json").write_text(json.dumps({"wall_seconds": wall, "runs": seconds}, indent=2))
    lower = {TASKS.get(t).metric_name for t in TASKS if TASKS.get(t).lower_is_better}
    learnt = learnt_table(args.out / "report.csv", trivial, lower)
    (args.out / "learnt.md").write_text(learnt + "\n")
    trained = {run: s for run, s in seconds.items() if s > 0}
    timing = (
        f"wall time: {wall / 60:.1f} min for {len(jobs)} runs, {args.jobs} at a time"
        if len(trained) == len(jobs)
        else f"wall time: {wall / 60:.1f} min; {len(trained)} of the {len(jobs)} runs trained in this "
        f"invocation, {len(jobs) - len(trained)} finished by an earlier one and reused (not timed here)"
    )
    record = _results_file().write(
        args.record or f"benchmark_{args.config.stem}",
        f"Method benchmark on {args.config.name}",
        "\n".join(
            [
                f"{timing}; runs in {args.out}",
                *(f"- {run}: {s:.0f} s" for run, s in sorted(trained.items())),
                "",
                (args.out / "report.md").read_text().strip(),
                "",
                "Learnt (✓: at least 5 % better than the trivial predictor):",
                "",
                learnt.strip(),
            ]
        ),
    )
    print((args.out / "report.md").read_text())
    print(learnt)
    print(timing)
    print(f"recorded in {record}")
    return 0


def _results_file():
    # benchmarks/ is a folder of scripts, not a package: the other scripts import results_file at
    # the top (run as scripts, their folder is on sys.path); this one is also loaded by path by
    # tests/test_compare_methods.py, without that folder on sys.path, so it imports it late.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import results_file

    return results_file


if __name__ == "__main__":
    sys.exit(main())
