"""The privacy-utility benchmark: Δm against ε for methods under client-level DP.

    python benchmarks/privacy_utility.py --out runs/benchmark/privacy    # what `make benchmark-privacy` runs
    python benchmarks/privacy_utility.py --out runs/benchmark/privacy --dry_run   # the runs, nothing run

On the scenario-1 benchmark config (``--config``), every method of ``--methods`` (FedAvg,
FedPer, FedHCA²) runs at every noise multiplier of ``--noise`` (z = 0.01, 0.1, 1.0) with
privacy.clip = ``--clip`` (1) and privacy.delta = ``--delta`` (1e-5), and Local once without privacy (it
sends nothing: ε = 0), each with every seed of ``--seeds`` (0, 1, 2). ``--mode auto`` puts a
method under central DP (noise on the server's sum) when its server step needs only the sum of
the updates, else under local DP (noise on each client's update, FedHCA²); ``central`` or
``local`` puts every method under that mode, and ``central`` is refused for a method whose
server step reads individual updates.

The runs are ``benchmarks/compare_methods.py``'s: ``fedmtl fit`` in its own process,
``--jobs`` at a time, into ``OUT/Local/seed_S`` and ``OUT/METHOD_MODE_zZ/seed_S``; a finished
run is kept, an interrupted one resumes, and a finished run made with other arguments stops the
command before anything runs. ``--rounds N`` overrides the config's rounds in every run, for a
reduced version: the results file then says so at its top, as it does for any other shape than
the default one (other seeds, methods or noise levels).

At the end it writes ``OUT/report.md`` (``fedmtl report`` of every run: the per-task metrics)
and records in ``benchmarks/results/RECORD.md`` (default ``privacy_utility``, or
``privacy_utility_reduced`` for another shape) a table, one row per method, mode and z: ε (the
mean over seeds of results.json's ``privacy.epsilon``; ∞ where a run's is null) and Δm (mean ±
std over the seeds of each run's Δm against the Local run of its seed, as ``fedmtl report``
computes it), and the figure ``benchmarks/results/RECORD.png``: Δm against ε on a log axis,
one line per method, Local as a horizontal line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test loads this file by path

import compare_methods  # noqa: E402
import results_file  # noqa: E402

from fedmtl.methods import METHODS  # noqa: E402
from fedmtl.report import Stat, display_name, stat  # noqa: E402

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "benchmark" / "scenario1.yaml"
DEFAULT_METHODS = ("FedAvg", "FedPer", "FedHCA2")
# Client-level noise of z·C/m per entry outweighs a few clients' updates of millions of entries
# from z ≈ 0.01 on: the three levels span a usable model at an empty guarantee to a real one.
DEFAULT_NOISE = (0.01, 0.1, 1.0)
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_RECORD = "privacy_utility"
MODES = ("auto", "central", "local")
# The methods whose server step needs only the (weighted) sum of each group's updates, as each
# declares it (Method.individual_updates): central DP noises that sum. The others read each
# update and take local DP only; `fedmtl fit` refuses central DP for them itself too.
CENTRAL_METHODS = frozenset(
    name for name in METHODS.names() if name != "Local" and METHODS.get(name)().individual_updates is None
)
PRIVATE_METHODS = tuple(m for m in compare_methods.METHODS if m != "Local")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every fedmtl refusal
        self.exit(2, f"error: {message} (see --help)\n")


@dataclass(frozen=True)
class Job:
    """One run: a method under one privacy mode and noise multiplier (Local: neither), one seed."""

    method: str
    mode: str | None  # None: no privacy (Local)
    z: float | None
    seed: int

    @property
    def name(self) -> str:
        """The run's folder under OUT, one per (method, mode, z)."""
        return self.method if self.mode is None else f"{self.method}_{self.mode}_z{self.z:g}"

    def run_dir(self, out: Path) -> Path:
        return out / self.name / f"seed_{self.seed}"

    def log(self, out: Path) -> Path:
        return out / "logs" / f"{self.name}_seed_{self.seed}.log"


def method_mode(method: str, mode: str) -> str:
    """The privacy mode ``method`` runs under: ``auto`` is central where the method allows it."""
    if mode == "auto":
        return "central" if method in CENTRAL_METHODS else "local"
    if mode == "central" and method not in CENTRAL_METHODS:
        raise ValueError(
            f"--mode central: {method}'s server step reads each client's update, so central DP (noise "
            "on the sum) does not cover it; use --mode auto (local DP for it) or leave it out of --methods"
        )
    return mode


def plan(methods: Sequence[str], noise: Sequence[float], seeds: Sequence[int], mode: str) -> list[Job]:
    """Every run: Local at each seed, then each method at each z and seed (pure)."""
    jobs = [Job("Local", None, None, seed) for seed in seeds]
    for method in methods:
        chosen = method_mode(method, mode)
        jobs += [Job(method, chosen, z, seed) for z in noise for seed in seeds]
    return jobs


def extra_args(job: Job, clip: float, delta: float, rounds: int | None) -> list[str]:
    """The ``fedmtl fit`` arguments a job adds to compare_methods' (pure)."""
    extra = [] if rounds is None else ["--rounds", str(rounds)]
    if job.mode is not None:
        extra += [
            "--privacy.mode", job.mode, "--privacy.noise_multiplier", repr(job.z),
            "--privacy.clip", repr(clip), "--privacy.delta", repr(delta),
        ]  # fmt: skip
    return extra


def check_args(args: argparse.Namespace) -> None:
    """Raise naming the option, its range and the fix; nothing is run or written before."""
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}: the runs at a time")
    bad = [z for z in args.noise if not (math.isfinite(z) and z >= 0)]
    if bad:
        raise ValueError(f"--noise must be finite numbers >= 0 (noise multipliers z), got {bad[0]!r}")
    if not (args.clip > 0 and math.isfinite(args.clip)):
        raise ValueError(
            f"--clip must be a finite number > 0 (the L2 norm C updates are clipped to), got {args.clip!r}"
        )
    if not (math.isfinite(args.delta) and 0 < args.delta < 1):
        raise ValueError(f"--delta must be in (0, 1) (the δ of the (ε, δ) guarantee), got {args.delta!r}")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1 (it overrides the config's rounds), got {args.rounds}")
    for name in ("seeds", "noise", "methods"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            raise ValueError(f"--{name} lists a value twice ({' '.join(map(str, values))}): give each once")
    if "/" in args.record or not args.record.strip():
        raise ValueError(
            f"--record {args.record!r}: give a file name without a folder (benchmarks/results/NAME.md)"
        )
    for method in args.methods:
        method_mode(method, args.mode)


def shape_notes(args: argparse.Namespace, config_rounds: int) -> list[str]:
    """How this invocation's shape differs from the benchmark's (pure); empty: the full one."""
    notes = []
    if args.rounds is not None and args.rounds != config_rounds:
        notes.append(f"--rounds {args.rounds} instead of the config's {config_rounds}")
    for name, default in (("seeds", DEFAULT_SEEDS), ("methods", DEFAULT_METHODS), ("noise", DEFAULT_NOISE)):
        if tuple(getattr(args, name)) != default:
            notes.append(
                f"--{name} {' '.join(map(str, getattr(args, name)))} instead of {' '.join(map(str, default))}"
            )
    return notes


# ---------------------------------------------------------------------------- the table and figure (pure)


@dataclass(frozen=True)
class Row:
    method: str
    mode: str | None
    z: float | None
    epsilon: float  # mean over seeds; inf where a run's is infinite, 0 for Local
    delta_m: Stat
    seeds: tuple[int, ...]


def epsilon_of(results: Mapping) -> float:
    """The ε a run spent, from its results.json: 0 without privacy (Local sends nothing; the
    script runs no other method without it), inf where the accountant gave none (z = 0)."""
    privacy = results.get("privacy")
    if privacy is None:
        return 0.0
    epsilon = privacy.get("epsilon")
    return math.inf if epsilon is None else float(epsilon)


def summarise(records: Sequence[Mapping]) -> list[Row]:
    """One row per (method, mode, z), in the order first seen, from per-run records
    ``{method, mode, z, seed, epsilon, delta_m}``."""
    groups: dict[tuple, list[Mapping]] = {}
    for record in records:
        groups.setdefault((record["method"], record["mode"], record["z"]), []).append(record)
    rows = []
    for (method, mode, z), runs in groups.items():
        epsilons = [r["epsilon"] for r in runs]
        rows.append(
            Row(
                method,
                mode,
                z,
                math.inf if math.inf in epsilons else statistics.fmean(epsilons),
                stat([r["delta_m"] for r in runs]),
                tuple(r["seed"] for r in runs),
            )
        )
    return rows


def _epsilon_text(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:.3g}" if epsilon < 100 else f"{epsilon:.0f}"


def render_table(rows: Sequence[Row]) -> str:
    """The markdown table: method, mode, z, ε, Δm mean ± std over the seeds, the seeds."""
    lines = [results_file.table_head("method", "mode", "z", "ε", "Δm (%)", "seeds", labels=2)]
    for row in rows:
        dm = f"{row.delta_m.mean:+.2f}" + ("" if row.delta_m.std is None else f" ± {row.delta_m.std:.2f}")
        lines.append(
            results_file.row(
                display_name(row.method),
                row.mode or "none",
                "—" if row.z is None else f"{row.z:g}",
                _epsilon_text(row.epsilon),
                dm,
                " ".join(map(str, row.seeds)),
            )
        )
    return "\n".join(lines)


def draw_figure(rows: Sequence[Row], path: Path) -> Path:
    """Δm against ε, log x, symmetric-log y, one line (with ± std bars) per method and mode,
    Local (no privacy) as a horizontal line. A point of infinite ε cannot sit on a log axis and is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lines: dict[tuple[str, str | None], list[Row]] = {}
    for row in rows:
        if row.mode is None:
            ax.axhline(
                row.delta_m.mean, color="black", linestyle="--", label=f"{display_name(row.method)} (ε = 0)"
            )
        elif math.isfinite(row.epsilon) and row.epsilon > 0:
            lines.setdefault((row.method, row.mode), []).append(row)
    for (method, mode), points in lines.items():
        points = sorted(points, key=lambda r: r.epsilon)
        ax.errorbar(
            [p.epsilon for p in points],
            [p.delta_m.mean for p in points],
            yerr=[p.delta_m.std or 0.0 for p in points],
            marker="o",
            capsize=3,
            label=f"{display_name(method)} ({mode} DP)",
        )
    ax.set_xscale("log")
    # Noise that wrecks a model drives Δm to -10^6 %: linear within ±100 %, logarithmic beyond.
    ax.set_yscale("symlog", linthresh=100)
    ax.set_xlabel("ε (δ as in the table; log scale)")
    ax.set_ylabel("Δm against Local (%; log beyond ±100)")
    ax.set_title("Privacy-utility: Δm against ε")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def record_body(
    rows: Sequence[Row], notes: Sequence[str], figure: str, clip: float, delta: float, extra: str = ""
) -> str:
    """The results file's body: the shape warning, the table (between the snippet markers the
    docs include) and the figure's link, then ``extra`` (pure)."""
    warning = (
        ["**Reduced shape, not the benchmark's numbers:** " + "; ".join(notes) + ".", ""] if notes else []
    )
    return "\n".join(
        [
            "<!-- --8<-- [start:table] -->",
            *warning,
            f"Client-level DP, clip C = {clip:g}, δ = {delta:g}; Δm mean ± std over the seeds, each "
            "seed's run against the Local run of that seed.",
            "",
            render_table(rows),
            "<!-- --8<-- [end:table] -->",
            "",
            f"![Δm against ε]({figure})",
            "",
            extra,
        ]
    )


# ---------------------------------------------------------------------------- orchestration


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=PRIVATE_METHODS)
    parser.add_argument(
        "--noise", type=float, nargs="+", default=list(DEFAULT_NOISE), help="noise multipliers z"
    )
    parser.add_argument(
        "--mode", default="auto", choices=MODES, help="auto: central where the method allows it"
    )
    parser.add_argument("--clip", type=float, default=1.0, help="privacy.clip C")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy.delta")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument(
        "--rounds", type=int, default=None, help="override the config's rounds (a reduced run)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument("--record", default=None, help="results file name in benchmarks/results/")
    parser.add_argument(
        "--dry_run", action="store_true", help="list the runs and exit; nothing is run or written"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not args.config.is_file():
            raise ValueError(f"--config {args.config}: no such file")
        cfg = compare_methods.load_config(args.config)
        notes = shape_notes(args, cfg.rounds)
        # another shape records beside the full benchmark's file, not over it
        args.record = args.record or (f"{DEFAULT_RECORD}_reduced" if notes else DEFAULT_RECORD)
        check_args(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    jobs = plan(args.methods, args.noise, args.seeds, args.mode)
    extra = {job: extra_args(job, args.clip, args.delta, args.rounds) for job in jobs}
    stale = [
        s
        for job in jobs
        if (
            s := compare_methods.stale_run(
                args.config, job.method, job.seed, job.run_dir(args.out), extra[job]
            )
        )
    ]
    if stale:
        print(
            f"error: {len(stale)} finished run(s) in {args.out} were made with other arguments than this "
            f"command's: {' | '.join(stale)}. Nothing was run or changed: pass another --out, or move those aside",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        for job in jobs:
            state = "finished, kept" if (job.run_dir(args.out) / "results.json").is_file() else "to run"
            fit = compare_methods.fit_args(
                args.config, job.method, job.seed, job.run_dir(args.out), extra[job]
            )
            print(f"{state}: fedmtl fit {' '.join(fit)}")
        print(
            f"{len(jobs)} runs; " + ("shape: " + "; ".join(notes) if notes else "the full benchmark's shape")
        )
        return 0

    from fedmtl.cli import _ensure_data

    start = time.perf_counter()
    _ensure_data(cfg)  # once, before the runs start in parallel
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    seconds = compare_methods.run_all(
        {
            f"{job.name}/seed_{job.seed}": (
                args.config, job.method, job.seed, job.run_dir(args.out), job.log(args.out), extra[job],
            )
            for job in jobs
        },
        args.jobs,
    )  # fmt: skip
    if seconds is None:
        return 1

    try:
        records = run_records(jobs, args.out)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    rows = summarise(records)
    report = subprocess.run(
        compare_methods._fedmtl(
            "report",
            *dict.fromkeys(str(job.run_dir(args.out)) for job in jobs),
            "--output",
            str(args.out / "report.md"),
            "--overwrite",
            "true",
        )  # fmt: skip
    )
    per_task = (
        (args.out / "report.md").read_text().strip() if report.returncode == 0 else "(fedmtl report failed)"
    )
    wall = time.perf_counter() - start
    trained = sum(1 for s in seconds.values() if s > 0)
    timing = f"wall time: {wall / 60:.1f} min; {trained} of the {len(jobs)} runs trained in this invocation"
    folder = Path(os.environ.get(results_file.RESULTS_DIR_VARIABLE) or results_file.RESULTS)
    figure = draw_figure(rows, folder / f"{args.record}.png")
    body = record_body(
        rows, notes, figure.name, args.clip, args.delta,
        extra=f"{timing}; runs in {args.out}\n\nEvery run's metrics (`fedmtl report`):\n\n{per_task}",
    )  # fmt: skip
    path = results_file.write(args.record, "Privacy-utility benchmark on " + args.config.name, body)
    print(render_table(rows))
    print(timing)
    print(f"recorded in {path} and {figure}")
    return 0


def run_records(jobs: Sequence[Job], out: Path) -> list[dict]:
    """Each finished run's ε and its Δm against the Local run of its seed (``fedmtl report``'s
    definition, its checks that the runs share a scenario and scoring)."""
    from fedmtl.report import RunGroup, check_baseline_defined, load_runs, paired_delta_m

    runs = dict(zip(jobs, load_runs([job.run_dir(out) for job in jobs]), strict=True))
    local = {job.seed: run for job, run in runs.items() if job.mode is None}
    columns = next(iter(local.values())).columns
    check_baseline_defined(RunGroup("Local", tuple(local.values())), columns)
    records = []
    for job, run in runs.items():
        results = json.loads((job.run_dir(out) / "results.json").read_text())
        records.append(
            {
                "method": job.method,
                "mode": job.mode,
                "z": job.z,
                "seed": job.seed,
                "epsilon": epsilon_of(results),
                "delta_m": paired_delta_m(run, local[job.seed], columns),
            }
        )
    return records


if __name__ == "__main__":
    sys.exit(main())
