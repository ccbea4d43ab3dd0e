"""Foundation figures: synthetic-data generation speed, loader throughput, one training step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/foundation.py [--out /tmp/fedmtl-bench]

(One thread: with torch's default two on a 2-core machine that another job kept busy, a
training step took 35x as long as with one.)

Generates 500 train + 200 val images at 96x96 for both datasets (timed), reads them back
through the real loaders with training augmentation (images/s), and times training steps of
the default small model on a batch of 8 (ms/step, after warm-up). Each is also given per batch
of 8 images as a ratio to that training step, measured in the same run; the table is recorded
in ``benchmarks/results/foundation.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import results_file
import torch

from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel
from fedmtl.synth import generate
from fedmtl.tasks import multi_task_loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/fedmtl-bench")
    parser.add_argument("--size", type=int, nargs=2, default=(96, 96))
    args = parser.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    size = tuple(args.size)

    rows = []  # (what, figure as measured, seconds per batch of 8 images)
    start = time.perf_counter()
    for name in ("pascal_context", "nyud"):
        generate(
            name, out / DATASETS.get(name).root_folder, num_train=500, num_val=200, size=size, progress=False
        )
    seconds = time.perf_counter() - start
    rows.append(("generate: 2 × (500 train + 200 val)", f"{seconds:.1f} s", seconds / 1400 * 8))

    for name in ("pascal_context", "nyud"):
        spec = DATASETS.get(name)
        ds = build_dataset(name, out, "train", tasks=spec.tasks, train_size=size)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=0)
        start = time.perf_counter()
        n = sum(len(batch["image"]) for batch in loader)
        rate = n / (time.perf_counter() - start)
        what = f"loader: {name}, all tasks ({', '.join(spec.tasks)}), train augmentation, 0 workers"
        rows.append((what, f"{rate:.0f} images/s", 8 / rate))

    torch.manual_seed(0)
    tasks = DATASETS.get("nyud").tasks
    model = MultiTaskModel("nyud", tasks, backbone=DEFAULT_BACKBONE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    ds = build_dataset("nyud", out, "train", tasks=tasks, train_size=size)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))
    times = []
    for step in range(13):
        start = time.perf_counter()
        loss = multi_task_loss(model(batch["image"]), batch, tasks)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step >= 3:
            times.append(time.perf_counter() - start)
    step = sum(times) / len(times)
    what = f"train step: {DEFAULT_BACKBONE} + 4 NYUD decoders/heads, batch 8"
    rows.append((what, f"{1000 * step:.0f} ms/step ({8 / step:.0f} images/s)", step))

    lines = [
        f"All at {size[0]}x{size[1]}, {torch.get_num_threads()} CPU thread(s). Ratio: the time per batch "
        "of 8 images over one training step of the default small model on a batch of 8, both measured "
        "in this run (the step: mean of 10 after 3 warm-up steps).",
        "",
        results_file.table_head("what", "measured", "per batch of 8 (ms)", "× a training step"),
        *(results_file.row(what, figure, f"{1000 * s:.1f}", f"{s / step:.2f}") for what, figure, s in rows),
    ]
    print("\n".join(lines))
    results_file.record(
        "foundation", "Foundation: data generation, loading and a training step", "\n".join(lines)
    )


if __name__ == "__main__":
    main()
