"""How long the paper-shape dry run waits for its synthetic data (issue 37, item 4).

    .venv/bin/python benchmarks/synth_speed.py [--images 4] [--repeats 2] [--checkout DIR ...]
        [--scale S ...] [--fit]

Two measurements, each in a fresh process per checkout and render scale, one thread
(OMP_NUM_THREADS=1):

* per image: ``--images`` images of each dataset rendered and written at the sizes of
  configs/synthetic.yaml (PASCAL-Context 512x512, NYUD-v2 448x576) with the generator's own
  per-image function, in one process (``workers=1``), at each ``--scale`` (data.synth's
  render_scale; default: 1 and the one configs/synthetic.yaml sets; a checkout older than
  render_scale is timed at 1 only); the total for the dry run's images (num_train + num_val of
  both datasets in configs/synthetic.yaml) is projected from them. ``--checkout`` may be given
  several times, e.g. a copy of an older commit (``git archive COMMIT | tar -x -C /tmp/old``)
  and this one. Every (checkout, scale) is taken in turn, ``--repeats`` times, so a machine
  that gets busier slows all of them alike.
* ``--fit``: seconds from starting ``python -m fedmtl fit --config configs/scenario1.yaml
  --config configs/synthetic.yaml --cpu_threads 1`` (with a fresh temporary data root and run
  directory, OMP_NUM_THREADS=1) until its data is written and until round 1 starts (``Round.run``
  called: the model and clients built); the process is ended there. Data generated with
  ``fit``'s own workers (one per core), at each scale (``--data.synth.*.render_scale``), on
  the last checkout, ``--fit_repeats`` times in turns.

The table is recorded in ``benchmarks/results/synth_speed.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import results_file
import yaml

REPO = Path(__file__).resolve().parents[1]

# Runs in the checkout: times `--images` images of each dataset, prints one JSON line.
PER_IMAGE = """
import json, sys, tempfile, time
from pathlib import Path
from fedmtl.synth.generator import SYNTH, sample_rng
sizes, images, scale = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
extra = () if scale == 1 else (scale,)  # a checkout older than render_scale takes no scale
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for dataset, size in sizes.items():
        spec, times = SYNTH.get(dataset), []
        for index in range(images):
            start = time.perf_counter()
            spec.write_sample(Path(tmp) / dataset, spec.image_id("train", index),
                              sample_rng(dataset, 0, "train", index), tuple(size), *extra)
            times.append(time.perf_counter() - start)
        out[dataset] = times
print(json.dumps(out))
"""

# Runs in the checkout: fit, ended as soon as round 1 starts; prints the seconds it took to
# write the data and to start round 1.
TO_FIRST_ROUND = """
import os, sys, time
start = time.perf_counter()
from fedmtl import cli
from fedmtl.federated import rounds
ensure_data = cli._ensure_data
def timed_ensure_data(cfg):
    ensure_data(cfg)
    print(f"DATA_WRITTEN {time.perf_counter() - start:.1f}", flush=True)
cli._ensure_data = timed_ensure_data
def first_round(self):
    print(f"FIRST_ROUND {time.perf_counter() - start:.1f}", flush=True)
    os._exit(0)
rounds.Round.run = first_round
from fedmtl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    single = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**os.environ, **single}


def per_image(
    checkout: Path, sizes: dict[str, list[int]], images: int, scale: float
) -> dict[str, list[float]]:
    done = subprocess.run(
        [sys.executable, "-c", PER_IMAGE, json.dumps(sizes), str(images), str(scale)],
        cwd=checkout,
        env={**_env(), "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"per-image timing in {checkout} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_args(datasets: list[str], scale: float, tmp: str) -> list[str]:
    """fit's arguments: the dry run, data and run directory in ``tmp``, rendered at ``scale``."""
    args = ["--config", "configs/scenario1.yaml", "--config", "configs/synthetic.yaml", "--cpu_threads", "1"]
    args += ["--data.root", f"{tmp}/data", "--run_dir", f"{tmp}/run"]
    for dataset in datasets:
        args += [f"--data.synth.{dataset}.render_scale", str(scale)]
    return args


def to_first_round(checkout: Path, datasets: list[str], scale: float) -> tuple[float, float]:
    """Seconds from fit's start until its data is written, and until round 1 starts."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", TO_FIRST_ROUND, "fit", *fit_args(datasets, scale, tmp)],
            cwd=checkout,
            env={**_env(), "PYTHONPATH": str(checkout)},
            capture_output=True,
            text=True,
        )
    marks = dict(line.split() for line in done.stdout.splitlines() if line.startswith(("DATA_", "FIRST_")))
    if "FIRST_ROUND" not in marks:
        raise SystemExit(f"fit in {checkout} never started round 1:\n{done.stderr[-3000:]}")
    return float(marks["DATA_WRITTEN"]), float(marks["FIRST_ROUND"])


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4, help="images of each dataset per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkout", type=Path, action="append", help="default: this checkout")
    parser.add_argument(
        "--scale", type=float, action="append", help="render_scale (default: 1 and the config's)"
    )
    parser.add_argument("--fit", action="store_true", help="also time fit until round 1 starts")
    parser.add_argument("--fit_repeats", type=int, default=1, help="fit runs per render_scale")
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    synth = yaml.safe_load((REPO / "configs" / "synthetic.yaml").read_text())["data"]["synth"]
    sizes = {dataset: entry["size"] for dataset, entry in synth.items()}
    counts = {dataset: entry["num_train"] + entry["num_val"] for dataset, entry in synth.items()}
    configured = sorted({float(entry.get("render_scale", 1)) for entry in synth.values()}, reverse=True)
    scales = sorted(set(args.scale or [1.0, *configured]), reverse=True)

    def takes(checkout: Path, scale: float) -> bool:  # an older checkout renders at full size only
        return scale == 1 or "render_scale" in (checkout / "fedmtl" / "synth" / "generator.py").read_text()

    cases = [(c, s) for c in checkouts for s in scales if takes(c, s)]
    times: dict[tuple[Path, float], dict[str, list[float]]] = {case: {d: [] for d in sizes} for case in cases}
    loads = [_load()]
    for _ in range(args.repeats):
        for checkout, scale in cases:
            for dataset, seconds in per_image(checkout, sizes, args.images, scale).items():
                times[checkout, scale][dataset] += seconds
        loads.append(_load())
    lines = [
        f"One thread, {args.images} images of each dataset x {args.repeats} repeats per checkout and "
        f"render_scale; total: projected for the dry run's {sum(counts.values())} images ({counts}) rendered "
        f"in one process. Machine load while measuring: {'; '.join(loads)}.",
        "",
        results_file.table_head(
            "checkout",
            "render_scale",
            *(f"{d} s/image (median)" for d in sizes),
            "total s (projected)",
            "x faster",
            labels=2,
        ),
    ]
    reference: dict[Path, float] = {}
    for checkout, scale in cases:
        medians = {d: statistics.median(times[checkout, scale][d]) for d in sizes}
        total = sum(medians[d] * counts[d] for d in sizes)
        reference.setdefault(checkout, total)
        ratio = reference[checkout] / total
        row = results_file.row(
            checkout.name,
            f"{scale:g}",
            *(f"{m:.2f}" for m in medians.values()),
            f"{total:.0f}",
            f"{ratio:.1f}",
        )
        lines.append(row)
        print(row, flush=True)
    if args.fit:
        checkout = checkouts[-1]
        fit_scales = [s for s in scales if takes(checkout, s)]
        runs: dict[float, list[tuple[float, float]]] = {s: [] for s in fit_scales}
        loads = [_load()]
        for _ in range(args.fit_repeats):
            for scale in fit_scales:
                runs[scale].append(to_first_round(checkout, list(sizes), scale))
                print(f"fit render_scale {scale:g}: data, round 1 at {runs[scale][-1]} s", flush=True)
            loads.append(_load())
        lines += [
            "",
            f"`fit` from its start until its data is written and until round 1 starts ({checkout.name}; data "
            f"generated with one worker per core, {os.cpu_count()}; every run in a fresh data root; "
            f"{args.fit_repeats} runs each, in turns; load: {'; '.join(loads)}). The command, at render_scale S:",
            "",
            "    OMP_NUM_THREADS=1 python -m fedmtl fit " + " ".join(fit_args(list(sizes), "S", "TMP")),  # type: ignore[arg-type]
            "",
            results_file.table_head(
                "render_scale", "data written, s (each run)", "round 1 starts, s (each run)"
            ),
        ]
        for scale, marks in runs.items():
            data = ", ".join(f"{d:.0f}" for d, _ in marks)
            first = ", ".join(f"{f:.0f}" for _, f in marks)
            lines.append(results_file.row(f"{scale:g}", data, first))
    results_file.record("synth_speed", "Synthetic data for the paper-shape dry run", "\n".join(lines))


if __name__ == "__main__":
    main()
