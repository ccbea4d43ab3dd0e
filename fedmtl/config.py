"""The typed scenario config that ``fedmtl fit`` reads.

The dataclasses below *are* the schema: jsonargparse reads YAML into them, checks every
type, lets any field be overridden on the command line (``--rounds 3``,
``--evaluation.every 2``) and prints the resolved config with ``--print_config``. Config
files state only what differs from these defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from jsonargparse import lazy_instance

from fedmtl.methods import Local, Method
from fedmtl.models.backbone import DEFAULT_BACKBONE


@dataclass(frozen=True)
class ModelConfig:
    """The client model; every client of a run uses the same encoder architecture."""

    backbone: str = DEFAULT_BACKBONE  # timm name or swin_t / swin_s / swin_b
    pretrained_file: str | None = None  # local weights file; nothing is downloaded
    embed_dim: int | None = None  # decoder width; None: the encoder's first-scale channels


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with a per-epoch warm-up cosine schedule (paper 4.1, suppl. C)."""

    lr: float = 1e-4
    weight_decay: float = 1e-4
    warmup_epochs: int = 5  # counted in local epochs
    warmup_lr: float = 1.25e-7  # learning rate at the first warm-up epoch
    min_lr: float = 1.25e-6  # floor of the cosine


@dataclass
class ClientGroup:
    """Clients on one dataset that share a task list and a training recipe.

    ``single_task: true`` makes one client per task (the paper's "ST" clients); otherwise one
    client learns all the tasks ("MT"). ``replicas`` splits every client into that many
    (the paper's 2C / 4C runs): the dataset's training set is then shared by more clients.
    """

    dataset: str  # pascal_context or nyud
    tasks: list[str]
    single_task: bool = False
    replicas: int = 1
    local_epochs: int = 1  # the paper: 1 for PASCAL-Context, 4 for NYUD-v2
    batch_size: int = 8
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)


@dataclass
class SynthConfig:
    """A synthetic dataset to write on first use when the data root lacks it (the demo)."""

    num_train: int = 500
    num_val: int = 200
    size: tuple[int, int] = (96, 96)
    seed: int = 0


@dataclass
class DataConfig:
    root: str | None = None  # holds PASCALContext/ and NYUDv2/; default $FEDMTL_DATA, else ./data
    train_size: tuple[int, int] | None = None  # training crop / eval padding; None: the paper's sizes
    num_workers: int = 0  # DataLoader workers per client
    # dataset name -> synthetic data to generate when that dataset is missing (instead of failing)
    synth: dict[str, SynthConfig] | None = None

    def resolved_root(self) -> str:
        return self.root or os.environ.get("FEDMTL_DATA", "data")


@dataclass
class EvaluationConfig:
    every: int = 4  # rounds between evaluations on the full validation set (the last round always)
    batch_size: int = 8


@dataclass
class LoggerConfig:
    wandb: bool = True  # metrics.csv is always written; wandb in addition
    mode: Literal["offline", "online", "disabled"] = "offline"  # offline needs no account or network
    project: str = "fedmtl"
    name: str | None = None  # run name; default: the run directory's name


@dataclass
class RunConfig:
    """One federated run: who the clients are, how they learn, how the server aggregates."""

    clients: list[ClientGroup]
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: Method = field(default_factory=lambda: lazy_instance(Local))  # class_path / init_args
    data: DataConfig = field(default_factory=DataConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    rounds: int = 100
    accelerator: str = "auto"  # cpu, gpu, auto
    devices: int = 1  # processes per node; clients are sharded across them
    num_nodes: int = 1  # machines, launched with torchrun or SLURM
    precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "32-true"  # mixed: autocast on GPUs
    # torch threads per process on CPU; None: the cores divided among the local processes.
    # Threaded kernels sum in a thread-count-dependent order: equal values give bit-identical
    # results whatever the number of devices.
    cpu_threads: int | None = None
    seed: int = 0
    run_dir: str = "runs/default"
    resume: bool = False  # continue from run_dir's latest checkpoint
    checkpoint_every: int = 1  # rounds between checkpoints (0: only at the end)
    store: Literal["memory", "disk"] = "memory"  # where client state waits between rounds
