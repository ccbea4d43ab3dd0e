"""Foundation figures: synthetic-data generation speed, loader throughput, one training step.

    .venv/bin/python benchmarks/foundation.py [--out /tmp/fedmtl-bench]

Generates 500 train + 200 val images at 96x96 for both datasets (timed), reads them back
through the real loaders with training augmentation (images/s), and times training steps of
the default small model on a batch of 8 (ms/step, after warm-up).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel
from fedmtl.synth import generate
from fedmtl.tasks import multi_task_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/fedmtl-bench")
    parser.add_argument("--size", type=int, nargs=2, default=(96, 96))
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    size = tuple(args.size)

    start = time.perf_counter()
    for name in ("pascal_context", "nyud"):
        generate(
            name, out / DATASETS.get(name).root_folder, num_train=500, num_val=200, size=size, progress=False
        )
    print(f"generate: 2 x (500 train + 200 val) at {size[0]}x{size[1]}: {time.perf_counter() - start:.1f} s")

    for name in ("pascal_context", "nyud"):
        spec = DATASETS.get(name)
        ds = build_dataset(name, out, "train", tasks=spec.tasks, train_size=size)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=0)
        start = time.perf_counter()
        n = sum(len(batch["image"]) for batch in loader)
        rate = n / (time.perf_counter() - start)
        print(f"loader: {name} all tasks {spec.tasks}, train augmentation, 0 workers: {rate:.0f} images/s")

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
    ms = 1000 * sum(times) / len(times)
    print(
        f"train step: {DEFAULT_BACKBONE} + 4 NYUD decoders/heads, batch 8 at {size[0]}x{size[1]}, "
        f"{torch.get_num_threads()} threads: {ms:.0f} ms/step ({8000 / ms:.0f} images/s)"
    )


if __name__ == "__main__":
    main()
