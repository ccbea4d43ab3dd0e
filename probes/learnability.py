"""Does a task learn? One client trained alone, against the task's trivial predictor.

    python probes/learnability.py --dataset pascal_context --tasks semseg human_parts \
        --images 60 --epochs 10 40 --lr 0.002 0.01 --seeds 0 1 --size 32 [--train_size 32] \
        [--out learnability]

For every task, learning rate, epoch count and seed, it trains a fresh single-task client on
the first ``--images`` training images of the generated dataset (one client's partition in
the benchmark) as a Local client trains it (:class:`fedmtl.federated.client.ClientModule`: the
same model, loss, AdamW and per-epoch cosine, batch 8, no warm-up, the training augmentation
with ``--scale_range``; only the data order and augmentation draws are seeded differently),
then scores it on the validation split, whole images of ``--size``, next to the trivial
predictor (:mod:`fedmtl.trivial`); ``--train_size`` (default ``--size``) trains on random crops
of that side instead, as ``data.train_size`` does in a run. It answers, in
seconds per setting, what ``make benchmark`` answers in an hour: which tasks learn on this
data with this many steps. No federation, no engine: the loop is the engine's local epoch
without the round machinery, so a probe costs what its optimiser steps cost.

The data are generated into ``--root`` (default ``data/learnability/SIZE``) when that folder
does not hold them; an existing dataset is read, never rewritten. The table is recorded in
``probes/results/OUT.md`` (``--out``, default ``learnability``; one name per question asked, so
that one question's rerun replaces only its own table) by ``benchmarks/results_file.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' recorder
import results_file  # noqa: E402


def train_and_score(
    dataset: str,
    root: Path,
    task: str,
    images: int,
    epochs: int,
    lr: float,
    seed: int,
    size,
    scale_range,
    train_size,
):
    """The metric of a single-task client after ``epochs`` local epochs, and its optimiser steps;
    it trains on random crops of ``train_size`` and is scored on whole images of ``size``."""
    import torch
    from torch.utils.data import DataLoader

    from fedmtl.config import ModelConfig, OptimizerConfig
    from fedmtl.data.datasets import build_dataset
    from fedmtl.federated.client import ClientModule, ClientSpec, end_epoch

    torch.manual_seed(seed)
    spec = ClientSpec(
        name=f"{dataset}-{task}",
        dataset=dataset,
        tasks=(task,),
        local_epochs=epochs,
        batch_size=8,
        train_indices=tuple(range(images)),
        optimizer=OptimizerConfig(lr=lr, warmup_epochs=0),
    )
    client = ClientModule(spec, ModelConfig(), total_epochs=epochs)
    train = build_dataset(
        dataset,
        root,
        "train",
        [task],
        train_size,
        indices=spec.train_indices,
        seed=seed,
        scale_range=scale_range,
    )
    loader = DataLoader(train, batch_size=spec.batch_size, shuffle=True, drop_last=True)
    optimizer, scheduler = client.configure_optimizers()
    steps = 0
    client.train()
    for epoch in range(epochs):
        for batch in loader:
            loss = client.training_step(batch)["total"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
        end_epoch(scheduler, epoch)
    client.eval()
    with torch.no_grad():
        for batch in DataLoader(build_dataset(dataset, root, "val", [task], size), batch_size=8):
            client.validation_step(batch)
    return client.compute_metrics()[task], steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=("pascal_context", "nyud"), default="pascal_context")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--images", type=int, default=60, help="training images of the client")
    parser.add_argument("--epochs", type=int, nargs="+", default=[10, 40])
    parser.add_argument("--lr", type=float, nargs="+", default=[0.002, 0.01])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--size", type=int, default=32, help="square image side, generated and scored")
    parser.add_argument("--train_size", type=int, help="side of the random training crops (default --size)")
    parser.add_argument("--num_train", type=int, default=300, help="training images to generate")
    parser.add_argument("--num_val", type=int, default=60, help="validation images to generate")
    parser.add_argument("--root", type=Path, help="data folder (default data/learnability/SIZE)")
    parser.add_argument("--out", default="learnability", help="the table goes to probes/results/OUT.md")
    # Library defaults resolved after parsing, so that --help and argument errors import no torch.
    parser.add_argument(
        "--scale_range",
        type=float,
        nargs=2,
        help="training rescaling, data.scale_range (default the paper's)",
    )
    parser.add_argument(
        "--margin", type=float, help="%% better than the trivial predictor that counts as learnt (default 5)"
    )
    args = parser.parse_args(argv)
    for name in ("images", "size", "num_train", "num_val"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.train_size is not None and not 1 <= args.train_size <= args.size:
        parser.error(f"--train_size must be between 1 and --size {args.size}, got {args.train_size}")
    if args.images > args.num_train:
        parser.error(
            f"--images {args.images} is more than the {args.num_train} training images (--num_train)"
        )
    if min(args.epochs) < 1 or min(args.lr) <= 0:
        parser.error("--epochs must be at least 1 and --lr positive")
    if args.scale_range is not None and not 0 < args.scale_range[0] <= args.scale_range[1]:
        parser.error(f"--scale_range needs 0 < min <= max, got {args.scale_range}")

    import torch

    from fedmtl.data.datasets import DATASETS
    from fedmtl.data.transforms import PAPER_SCALE_RANGE
    from fedmtl.synth import generate
    from fedmtl.tasks import check_tasks, get_task
    from fedmtl.trivial import LEARNT_MARGIN, better_than, trivial_metrics

    scale_range = list(args.scale_range or PAPER_SCALE_RANGE)
    margin = LEARNT_MARGIN if args.margin is None else args.margin

    try:
        check_tasks(args.dataset, args.tasks)
    except (KeyError, ValueError) as err:
        parser.error(str(err))
    torch.set_num_threads(1)
    size = (args.size, args.size)
    root = args.root or Path("data") / "learnability" / str(args.size)
    folder = root / DATASETS.get(args.dataset).root_folder
    if not folder.exists():
        generate(args.dataset, folder, args.num_train, args.num_val, size)
    trivial = trivial_metrics(args.dataset, root, args.tasks, size)

    train_size = args.train_size or args.size
    lines = [
        f"{args.dataset}, {args.images} training images, {args.size}x{args.size} "
        f"(training crops {train_size}x{train_size}), scale range {scale_range}",
        f"learnt: at least {margin:g} % better than the trivial predictor",
        "",
        results_file.table_head(
            "task", "lr", "epochs", "steps", "seed", "metric", "trivial", "better (%)", "learnt", "seconds"
        ),
    ]
    print("\n".join(lines), flush=True)
    for task in args.tasks:
        lower = get_task(task).lower_is_better
        for lr in args.lr:
            for epochs in args.epochs:
                for seed in args.seeds:
                    start = time.perf_counter()
                    value, steps = train_and_score(
                        args.dataset,
                        root,
                        task,
                        args.images,
                        epochs,
                        lr,
                        seed,
                        size=size,
                        scale_range=scale_range,
                        train_size=(train_size, train_size),
                    )
                    better = better_than(value, trivial[task], lower)
                    lines.append(
                        results_file.row(
                            task,
                            f"{lr:g}",
                            epochs,
                            steps,
                            seed,
                            f"{value:.2f}",
                            f"{trivial[task]:.2f}",
                            f"{better:+.1f}",
                            "yes" if better >= margin else "no",
                            f"{time.perf_counter() - start:.0f}",
                        )
                    )
                    print(lines[-1], flush=True)
    results_file.record(
        args.out,
        "Does a task learn? One client alone against the trivial predictor",
        "\n".join(lines),
        folder=results_file.PROBES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
