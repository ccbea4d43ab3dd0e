"""Engine overhead and the demo's round time split.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine.py [--rounds 3] [--demo-run runs/demo]

(One thread: the engine trains with its default ``cpu_threads: 1`` and leaves the process at
one thread, so the plain loop's first runs would otherwise have torch's default threads.)

1. Local training through the engine (Fabric, client store, flattening, exchange, Local
   aggregation) against a plain PyTorch loop on the same model, data, optimiser, schedule and
   number of steps, in one process, alternating ``--repeats`` times. Wall time wanders on a
   shared machine, so the ratio is printed for the fastest runs (the least disturbed), the
   medians, and the process CPU time of the whole call — for the engine that includes its
   set-up and final evaluation, so that ratio errs against the engine (goal <= 1.10).
2. If a demo run directory exists, its per-round time split (train / exchange / aggregate /
   eval) from metrics.csv, and each phase's total over the training's.

The tables are recorded in ``benchmarks/results/engine.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import results_file
import torch
from timm.scheduler import CosineLRScheduler

from fedmtl.config import ClientGroup, DataConfig, EvaluationConfig, LoggerConfig, RunConfig
from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.federated.engine import run
from fedmtl.methods import Local
from fedmtl.models import MultiTaskModel
from fedmtl.seeds import derive_seed as _seed
from fedmtl.synth import generate
from fedmtl.tasks import multi_task_loss

TASKS = ("semseg", "normals", "edge", "depth")
SIZE = (96, 96)


def _round_times(metrics_csv: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            if row["key"].startswith("time/"):
                times[row["key"][5:]].append(float(row["value"]))
    return times


def plain_loop(root: Path, epochs: int, batch_size: int, seed: int) -> tuple[float, float]:
    """(wall seconds of the training loop, process CPU seconds of the whole call)

    The same work as the engine's client 0: its initial weights, its augmentation and data
    order (the engine derives them from the seed with ``_seed``), so both time the same steps."""
    cpu = time.process_time()
    torch.manual_seed(_seed(seed, "init"))
    model = MultiTaskModel("nyud", TASKS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    scheduler = CosineLRScheduler(
        optimizer, t_initial=epochs, lr_min=1.25e-6, warmup_t=5, warmup_lr_init=1.25e-7
    )
    dataset = build_dataset(
        "nyud", root, "train", tasks=TASKS, train_size=SIZE, seed=_seed(seed, "augment", 0)
    )
    start = time.perf_counter()
    model.train()
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        order = torch.Generator().manual_seed(_seed(seed, "order", 0, epoch))
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order)
        for batch in loader:
            loss = multi_task_loss(model(batch["image"]), batch, TASKS)["total"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step(epoch + 1)
    return time.perf_counter() - start, time.process_time() - cpu


def engine_loop(
    root: Path, run_dir: Path, rounds: int, local_epochs: int, batch_size: int, seed: int
) -> tuple[float, float]:
    """(wall seconds of train + exchange + aggregate from metrics.csv, process CPU seconds of
    the whole run including set-up and the final evaluation)"""
    cpu = time.process_time()
    cfg = RunConfig(
        clients=[
            ClientGroup(dataset="nyud", tasks=list(TASKS), local_epochs=local_epochs, batch_size=batch_size)
        ],
        algorithm=Local(),
        data=DataConfig(root=str(root), train_size=SIZE),
        evaluation=EvaluationConfig(every=0),
        logger=LoggerConfig(wandb=False),
        rounds=rounds,
        accelerator="cpu",
        seed=seed,
        run_dir=str(run_dir),
        checkpoint_every=0,
    )
    run(cfg)
    cpu = time.process_time() - cpu
    times = _round_times(run_dir / "metrics.csv")
    return sum(times["train"]) + sum(times["exchange"]) + sum(times["aggregate"]), cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-train", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--demo-run", default="runs/demo")
    args = parser.parse_args(argv)

    epochs = args.rounds * args.local_epochs
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        folder = root / DATASETS.get("nyud").root_folder
        generate("nyud", folder, num_train=args.num_train, num_val=8, size=SIZE, progress=False)
        plain_loop(root, 2, args.batch_size, seed=1)  # warm-up: imports, allocator, oneDNN kernels
        plains, engines = [], []
        for r in range(args.repeats):
            plains.append(plain_loop(root, epochs, args.batch_size, seed=0))
            engine_run = engine_loop(
                root, Path(tmp) / f"run{r}", args.rounds, args.local_epochs, args.batch_size, 0
            )
            engines.append(engine_run)

    steps = epochs * -(-args.num_train // args.batch_size)
    wall_p, wall_e = [w for w, _ in plains], [w for w, _ in engines]
    cpu_p, cpu_e = [c for _, c in plains], [c for _, c in engines]
    median = statistics.median
    lines = [
        f"Local training of one multi-task client (nyud, 4 tasks, {SIZE[0]}x{SIZE[1]}), {epochs} epochs = "
        f"{steps} steps of batch {args.batch_size}, {torch.get_num_threads()} CPU thread(s), the plain "
        f"loop and the engine alternating {args.repeats} times in one process. Ratio: engine over plain "
        "in this run (goal: at most 1.10). The engine's wall time is its train + exchange + aggregate; "
        "its process CPU time includes its set-up and final evaluation, so that ratio errs against it.",
        "",
        results_file.table_head("measure", "plain PyTorch loop (s)", "engine (s)", "engine / plain"),
        *(
            results_file.row(name, f"{p:.2f}", f"{e:.2f}", f"{e / p:.3f}")
            for name, p, e in (
                ("wall, fastest run", min(wall_p), min(wall_e)),
                ("wall, median", median(wall_p), median(wall_e)),
                ("process CPU, median", median(cpu_p), median(cpu_e)),
            )
        ),
        "",
        f"Every run's wall time: plain {', '.join(f'{w:.2f}' for w in wall_p)} s; engine "
        f"{', '.join(f'{w:.2f}' for w in wall_e)} s.",
    ]

    demo = Path(args.demo_run) / "metrics.csv"
    if demo.exists():
        times = _round_times(demo)
        lines += [
            "",
            f"Round time split of the run in {args.demo_run} ({len(times['train'])} rounds, evaluation in "
            f"{len(times.get('eval', []))}), read from its metrics.csv, not measured by this command. "
            "Ratio: the phase's total over the training's.",
            "",
            results_file.table_head("phase", "mean per round (s)", "total (s)", "/ train"),
        ]
        for phase in ("train", "exchange", "aggregate", "eval"):
            values = times.get(phase, [])
            if values:
                lines.append(
                    results_file.row(
                        phase,
                        f"{statistics.mean(values):.2f}",
                        f"{sum(values):.1f}",
                        f"{sum(values) / sum(times['train']):.3f}",
                    )
                )
    print("\n".join(lines))
    results_file.record("engine", "Engine overhead against a plain PyTorch loop", "\n".join(lines))


if __name__ == "__main__":
    main()
