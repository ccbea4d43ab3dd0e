"""Training-step time with fedmtl's optimiser (fused AdamW) against PyTorch's per-tensor AdamW.

    .venv/bin/python benchmarks/optimizer.py [--size 32] [--repeats 5]

For the benchmark's two client shapes (a single-task PASCAL-Context semseg client and the
four-task NYUD-v2 client; the default small backbone, batch 8, one CPU thread), it times a
whole step (forward, loss, backward, optimiser) with each optimiser on random inputs, the two
interleaved ``--repeats`` times so that both see the same machine, and prints the medians and
their ratio. The parameters both start from are the same. The table is recorded in
``benchmarks/results/optimizer.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import results_file


def random_batch(dataset: str, tasks: list[str], size: tuple[int, int]):
    """Eight random images and a valid random target for each task."""
    import torch

    from fedmtl.tasks import get_task

    targets = {}
    for task in tasks:
        if task == "semseg":
            targets[task] = torch.randint(0, get_task(task).channels(dataset), (8, *size))
        elif task == "normals":
            targets[task] = torch.nn.functional.normalize(torch.randn(8, 3, *size), dim=1)
        elif task == "edge":
            targets[task] = (torch.rand(8, *size) > 0.9).float()
        else:  # depth
            targets[task] = torch.rand(8, *size) + 0.5
    return torch.randn(8, 3, *size), targets


def training_step(start, tasks: list[str], images, targets, fused: bool):
    """A step function training a copy of ``start`` with fedmtl's optimiser (``fused``) or
    PyTorch's per-tensor AdamW, already run three times (warm-up)."""
    import torch

    from fedmtl.config import OptimizerConfig
    from fedmtl.federated.client import make_optimizer
    from fedmtl.tasks import multi_task_loss

    config = OptimizerConfig(lr=1e-2)
    model = copy.deepcopy(start)
    params = list(model.parameters())
    if fused:
        optimizer = make_optimizer(params, config, None)[0]
    else:
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=False)

    def step():
        loss = multi_task_loss(model(images), targets, tasks)["total"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=32, help="square image side")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timings of each optimiser")
    parser.add_argument("--steps", type=int, default=20, help="steps per timing")
    args = parser.parse_args(argv)
    for name in ("size", "repeats", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")

    import torch

    from fedmtl.models import MultiTaskModel

    torch.set_num_threads(1)
    size = (args.size, args.size)
    shapes = {"pascal_context": ["semseg"], "nyud": ["semseg", "normals", "edge", "depth"]}
    lines = [
        f"One CPU thread, batch 8 at {args.size}x{args.size}, {args.steps} steps per timing, median of "
        f"{args.repeats} timings taken in turns. Ratio: fused AdamW's step time over the per-tensor "
        "AdamW's, both measured in this run (below 1: the fused one is faster).",
        "",
        results_file.table_head("client", "fused AdamW (ms/step)", "per-tensor AdamW (ms/step)", "ratio"),
    ]
    print("\n".join(lines), flush=True)
    for dataset, tasks in shapes.items():
        torch.manual_seed(0)
        start = MultiTaskModel(dataset, tasks)
        images, targets = random_batch(dataset, tasks, size)
        steps = {fused: training_step(start, tasks, images, targets, fused) for fused in (True, False)}
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for fused, step in steps.items():
                began = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[fused].append(1000 * (time.perf_counter() - began) / args.steps)
        fused_ms, plain_ms = statistics.median(times[True]), statistics.median(times[False])
        lines.append(
            results_file.row(
                f"{dataset} {'+'.join(tasks)}",
                f"{fused_ms:.1f}",
                f"{plain_ms:.1f}",
                f"{fused_ms / plain_ms:.2f}",
            )
        )
        print(lines[-1], flush=True)
    results_file.record("optimizer", "Training step: fused AdamW against per-tensor AdamW", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
