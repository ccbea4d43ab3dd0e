"""How long the paper-shape dry run waits for its synthetic data (issue 37, item 4).

    .venv/bin/python benchmarks/synth_speed.py [--images 4] [--repeats 2] [--checkout DIR ...] [--fit]

Two measurements, each in a fresh process per checkout, one thread (OMP_NUM_THREADS=1):

* per image: ``--images`` images of each dataset rendered and written at the sizes of
  configs/synthetic.yaml (PASCAL-Context 512x512, NYUD-v2 448x576) with the generator's own
  per-image function, in one process (``workers=1``); the total for the dry run's images
  (num_train + num_val of both datasets in configs/synthetic.yaml) is projected from them.
  ``--checkout`` may be given several times, e.g. a copy of an older commit
  (``git archive COMMIT | tar -x -C /tmp/old``) and this one: the checkouts are taken in
  turns, ``--repeats`` times, so a machine that gets busier slows all of them alike.
* ``--fit``: seconds from starting ``python -m fedmtl fit --config configs/scenario1.yaml
  --config configs/synthetic.yaml --cpu_threads 1`` (with a fresh temporary data root and run
  directory) until round 1 starts, i.e. the data generated (``fit``'s own workers: one per
  core) and the model and clients built; the process is ended there. Per checkout, once.

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
sizes, images = json.loads(sys.argv[1]), int(sys.argv[2])
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for dataset, size in sizes.items():
        spec, times = SYNTH.get(dataset), []
        for index in range(images):
            start = time.perf_counter()
            spec.write_sample(Path(tmp) / dataset, spec.image_id("train", index),
                              sample_rng(dataset, 0, "train", index), tuple(size))
            times.append(time.perf_counter() - start)
        out[dataset] = times
print(json.dumps(out))
"""

# Runs in the checkout: fit, ended as soon as round 1 starts; prints the seconds it took.
TO_FIRST_ROUND = """
import os, sys, time
start = time.perf_counter()
from fedmtl.federated import rounds
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


def per_image(checkout: Path, sizes: dict[str, list[int]], images: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [sys.executable, "-c", PER_IMAGE, json.dumps(sizes), str(images)],
        cwd=checkout,
        env={**_env(), "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"per-image timing in {checkout} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def to_first_round(checkout: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "--config",
            "configs/scenario1.yaml",
            "--config",
            "configs/synthetic.yaml",
            "--cpu_threads",
            "1",
        ]
        args += ["--data.root", f"{tmp}/data", "--run_dir", f"{tmp}/run"]
        done = subprocess.run(
            [sys.executable, "-c", TO_FIRST_ROUND, "fit", *args],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            capture_output=True,
            text=True,
        )
    for line in done.stdout.splitlines():
        if line.startswith("FIRST_ROUND "):
            return float(line.split()[1])
    raise SystemExit(f"fit in {checkout} never started round 1:\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4, help="images of each dataset per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkout", type=Path, action="append", help="default: this checkout")
    parser.add_argument("--fit", action="store_true", help="also time fit until round 1 starts")
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    synth = yaml.safe_load((REPO / "configs" / "synthetic.yaml").read_text())["data"]["synth"]
    sizes = {dataset: entry["size"] for dataset, entry in synth.items()}
    counts = {dataset: entry["num_train"] + entry["num_val"] for dataset, entry in synth.items()}

    times: dict[Path, dict[str, list[float]]] = {c: {d: [] for d in sizes} for c in checkouts}
    for _ in range(args.repeats):
        for checkout in checkouts:
            for dataset, seconds in per_image(checkout, sizes, args.images).items():
                times[checkout][dataset] += seconds
    lines = [
        f"One thread, {args.images} images of each dataset x {args.repeats} repeats per checkout; total: "
        f"projected for the dry run's {sum(counts.values())} images ({counts}) rendered in one process.",
        "",
        results_file.table_head("checkout", *(f"{d} s/image (median)" for d in sizes), "total s (projected)"),
    ]
    for checkout in checkouts:
        medians = {d: statistics.median(times[checkout][d]) for d in sizes}
        total = sum(medians[d] * counts[d] for d in sizes)
        lines.append(results_file.row(checkout.name, *(f"{m:.2f}" for m in medians.values()), f"{total:.0f}"))
        print(lines[-1], flush=True)
    if args.fit:
        lines += [
            "",
            f"`fit` until round 1 starts (data generated with one worker per core, {os.cpu_count()}):",
            "",
        ]
        lines.append(results_file.table_head("checkout", "seconds"))
        for checkout in checkouts:
            lines.append(results_file.row(checkout.name, f"{to_first_round(checkout):.0f}"))
            print(lines[-1], flush=True)
    results_file.record("synth_speed", "Synthetic data for the paper-shape dry run", "\n".join(lines))


if __name__ == "__main__":
    main()
