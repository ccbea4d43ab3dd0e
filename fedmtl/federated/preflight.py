"""Checks a fit runs before it writes anything: the machine, the data and the model.

Each failure is one ValueError / FileNotFoundError naming the problem and the fix; the CLI
prints it as one ``error:`` line. Everything here is cheap next to a round: one sample per
split and client architecture is read, and one forward pass of each architecture runs at
the training size.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from fedmtl.config import RunConfig
from fedmtl.data.check import check_hint
from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.data.layout import read_split
from fedmtl.federated.client import ClientModule, ClientSpec
from fedmtl.federated.scenario import build_scenario

_LAUNCHERS = ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def check_environment(cfg: RunConfig) -> None:
    """The accelerator exists, CPU processes fit the cores, several nodes have a launcher."""
    accelerator = cfg.accelerator.lower()
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"accelerator {cfg.accelerator}: no CUDA GPU is visible to torch on this machine; "
                "use --accelerator cpu (or auto)"
            )
        if cfg.devices > torch.cuda.device_count():
            raise ValueError(
                f"devices {cfg.devices}: this machine has {torch.cuda.device_count()} GPU(s); "
                f"use --devices {torch.cuda.device_count()} or fewer"
            )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ValueError("accelerator mps: MPS is not available on this machine; use --accelerator cpu")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    cores = os.cpu_count() or 1
    if on_cpu and cfg.devices > cores:
        raise ValueError(
            f"devices {cfg.devices}: on CPU each device is a process and this machine has {cores} cores; "
            f"use --devices {cores} or fewer"
        )
    if cfg.num_nodes > 1 and not any(v in os.environ for v in _LAUNCHERS):
        raise ValueError(
            f"num_nodes {cfg.num_nodes} needs one process per device on every node, started by a launcher "
            "(torchrun --nnodes ... or srun under SLURM, see docs/performance.md); without one the run would wait "
            "forever for the other nodes. For one machine, use --num_nodes 1"
        )


def check_scenario(cfg: RunConfig) -> list[ClientSpec]:
    """The clients build (tasks, data splits, partitions, a batch for every client: see
    ``build_scenario``), every split they use is readable and not empty, and every client
    architecture runs at the training size (held-out clients too); returns the federation's
    clients."""
    federated, held_out = build_scenario(cfg)
    specs = [*federated, *held_out]
    root = cfg.data.resolved_root()
    for name in sorted({s.dataset for s in specs}):
        val = DATASETS.get(name).split_file(root, "val")
        if not val.is_file():
            raise FileNotFoundError(
                f"{name} validation split not found: {val} (every client is evaluated on it); {check_hint(root)}"
            )
        if not read_split(val):
            raise ValueError(
                f"{name} validation split {val} lists no image: every client is evaluated on it; {check_hint(root)}"
            )
    size = cfg.data.train_size
    state_bytes = {}
    for spec in {(s.dataset, s.tasks): s for s in specs}.values():
        img_size = tuple(size or DATASETS.get(spec.dataset).train_size)
        for split in ("train", "val"):
            try:
                dataset = build_dataset(
                    spec.dataset, root, split, tasks=spec.tasks, train_size=img_size,
                    indices=spec.train_indices if split == "train" else None,
                    human_parts_selection=cfg.data.human_parts_selection,
                )  # fmt: skip
            except FileNotFoundError as err:  # a file of the split is missing (named)
                raise FileNotFoundError(f"{err}; {check_hint(root)}") from None
            if len(dataset) == 0:
                raise ValueError(
                    f"client {spec.name}: its {split} part of {spec.dataset} has no image with labels for "
                    f"{', '.join(spec.tasks)}; use fewer clients or a larger dataset"
                )
            try:
                dataset[0]  # the first sample reads (errors name the file)
            except ValueError as err:
                raise ValueError(f"{err}; {check_hint(root)}") from None
        state_bytes[(spec.dataset, spec.tasks)] = _check_model(cfg, spec, img_size)
    check_memory_store(cfg, [state_bytes[(s.dataset, s.tasks)] for s in federated])
    return federated


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable); None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory_store(cfg: RunConfig, state_bytes: list[int]) -> None:
    """``store: memory`` keeps every client's state (model, AdamW moments) in RAM: refuse a
    scenario whose states would not fit in what this machine has available, before anything
    is written (``state_bytes``: each client's)."""
    if cfg.store != "memory":
        return
    needed = sum(state_bytes) / cfg.num_nodes  # the clients are split among the nodes
    available = available_memory()
    if available is None or needed <= 0.8 * available:
        return
    gib = 2**30
    raise ValueError(
        f"store memory: the {len(state_bytes)} clients' states (parameters and AdamW moments, "
        f"{max(state_bytes) / 2**20:.0f} MiB for the largest client) need about {needed / gib:.1f} GiB "
        f"of RAM{' per node' if cfg.num_nodes > 1 else ''}, and this machine has {available / gib:.1f} GiB "
        "available: use --store disk (states in run_dir/store), or fewer clients"
    )


def _check_model(cfg: RunConfig, spec: ClientSpec, img_size: tuple[int, ...]) -> int:
    """Build the client's model (backbone name, pretrained file) and run it once at ``img_size``;
    returns the bytes of a client state of it once trained: its state dict and two AdamW
    moments of each parameter."""
    module = ClientModule(spec, cfg.model, total_epochs=1, img_size=(int(img_size[0]), int(img_size[1])))
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(1, 3, int(img_size[0]), int(img_size[1])))
    except (RuntimeError, AssertionError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"data.train_size {list(img_size)}: backbone {cfg.model.backbone} cannot run on "
            f"{img_size[0]}x{img_size[1]} images ({detail}); use a size both backbone and decoders accept, "
            "e.g. a multiple of 32 (Swin: of 32 x its window size)"
        ) from None
    model = module.model
    tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return tensors + 2 * sum(p.numel() * p.element_size() for p in model.parameters())
