"""A client's stored state with ``clients[].optimizer.keep_state`` true against false.

    .venv/bin/python benchmarks/keep_state.py [--backbone regnetx_002] [--size 32]

For the benchmark's two client shapes (a single-task PASCAL-Context semseg client and the
four-task NYUD-v2 client) on the default backbone, it builds the client's model, trains it
one step (one epoch of one batch of 8 random images, through fedmtl's ``LocalTrainer``, on the
CPU) with keep_state true and with keep_state false, and saves each client state as the
checkpoints and the disk store do (``torch.save`` of the track plus an empty ``personal``).
It prints both file sizes and their ratio; the table is recorded in
``benchmarks/results/keep_state.md`` (results_file.py). The sizes do not depend on the data
or on how long the client trains: AdamW keeps two moments per parameter whatever the step.
"""

from __future__ import annotations

import argparse
import io

import results_file
from optimizer import random_batch

MIB = 2**20


class OneBatch:
    """A stand-in dataset whose every epoch is one fixed batch (``LocalTrainer`` only sets
    its epoch and hands it to the loader)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def set_epoch(self, epoch: int) -> None:
        pass


def stored_bytes(state: dict) -> int:
    """Bytes of ``torch.save(state)``, what a checkpoint's client file or the disk store holds."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


def state_after_one_step(dataset: str, tasks: list[str], backbone: str, size: int, keep_state: bool) -> dict:
    """The client's stored state (track and an empty ``personal``) after one training step."""
    import lightning as L
    import torch

    from fedmtl.config import ModelConfig, OptimizerConfig
    from fedmtl.federated.client import ClientModule, ClientSpec
    from fedmtl.federated.training import LocalTrainer
    from fedmtl.methods.base import new_track

    torch.manual_seed(0)
    spec = ClientSpec(
        name=f"{dataset}-{'+'.join(tasks)}",
        dataset=dataset,
        tasks=tuple(tasks),
        local_epochs=1,
        batch_size=8,
        train_indices=tuple(range(8)),
        optimizer=OptimizerConfig(keep_state=keep_state),
    )
    module = ClientModule(spec, ModelConfig(backbone=backbone), total_epochs=1, img_size=(size, size))
    images, targets = random_batch(dataset, tasks, (size, size))
    dataset_ = OneBatch({"image": images, **targets})
    trainer = LocalTrainer(
        L.Fabric(accelerator="cpu", devices=1), seed=0, rounds=1, loader=lambda d, *_: [d.batch]
    )
    track = new_track(module.model)
    trainer.train(module, 0, dataset_, track)  # type: ignore[arg-type] - a stand-in dataset
    return {**track, "personal": {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default=None, help="the encoder (default: fedmtl's default backbone)")
    parser.add_argument("--size", type=int, default=32, help="square image side of the one batch")
    args = parser.parse_args(argv)
    if args.size < 32:
        parser.error(f"--size must be at least 32 (the encoder downsamples by 32), got {args.size}")

    import torch

    from fedmtl.models.backbone import DEFAULT_BACKBONE

    torch.set_num_threads(1)
    backbone = args.backbone or DEFAULT_BACKBONE
    shapes = {"pascal_context": ["semseg"], "nyud": ["semseg", "normals", "edge", "depth"]}
    lines = [
        f"A client's stored state (its checkpoint file: the track plus an empty personal state) after "
        f"one training step, backbone {backbone}, MiB. keep_state true stores the model, AdamW's two "
        "moments per parameter and the schedule; false, the model alone. Ratio: false over true.",
        "",
        results_file.table_head("client", "keep_state true (MiB)", "keep_state false (MiB)", "ratio"),
    ]
    print("\n".join(lines), flush=True)
    for dataset, tasks in shapes.items():
        kept, fresh = (
            stored_bytes(state_after_one_step(dataset, tasks, backbone, args.size, keep))
            for keep in (True, False)
        )
        lines.append(
            results_file.row(
                f"{dataset} {'+'.join(tasks)}",
                f"{kept / MIB:.2f}",
                f"{fresh / MIB:.2f}",
                f"{fresh / kept:.2f}",
            )
        )
        print(lines[-1], flush=True)
    results_file.record(
        "keep_state", "Client state with optimizer.keep_state true and false", "\n".join(lines)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
