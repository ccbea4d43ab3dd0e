"""A client: its typed description and the LightningModule that says what one step is.

The module holds the client's ``MultiTaskModel`` (encoder, decoders, heads) and its task
metrics; *when* steps run is the round loop's business (``fedmtl.federated.engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import lightning as L
import torch
from timm.scheduler import CosineLRScheduler
from torch import nn

from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel
from fedmtl.tasks import get_task, multi_task_loss


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


@dataclass(frozen=True)
class ClientSpec:
    """One client of a scenario: who it is, what it learns, on which data."""

    name: str
    dataset: str
    tasks: tuple[str, ...]
    local_epochs: int
    batch_size: int
    train_indices: tuple[int, ...]  # its partition of the dataset's training split
    optimizer: OptimizerConfig = OptimizerConfig()

    @property
    def single_task(self) -> bool:
        return len(self.tasks) == 1

    @property
    def cost(self) -> float:
        """Expected training work per round, for balancing clients across devices: images
        seen, times the share of the network those images run through (an encoder costs
        about as much as two decoders with heads)."""
        return self.local_epochs * len(self.train_indices) * (2 + len(self.tasks))


class ClientModule(L.LightningModule):
    """One client's model, loss, optimiser and metrics."""

    def __init__(
        self, spec: ClientSpec, model: ModelConfig, total_epochs: int, img_size: tuple[int, int] | None = None
    ) -> None:
        super().__init__()
        self.spec = spec
        self.total_epochs = total_epochs
        self.model = MultiTaskModel(
            spec.dataset,
            spec.tasks,
            backbone=model.backbone,
            pretrained_file=model.pretrained_file,
            img_size=img_size,
            embed_dim=model.embed_dim,
        )
        # A client is validated on one rank only: its metrics must not sync with other ranks.
        self.metrics = nn.ModuleDict(
            {t: get_task(t).metric(spec.dataset, sync_on_compute=False) for t in spec.tasks}
        )

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model(images)

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int = 0) -> dict[str, torch.Tensor]:
        """The client's objective: the weighted sum of its task losses (``"total"``)."""
        return multi_task_loss(self.model(batch["image"]), batch, self.spec.tasks)

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int = 0) -> None:
        preds = self.model(batch["image"])
        for task in self.spec.tasks:
            pred = get_task(task).postprocess(preds[task])
            # Metrics accumulate in full precision even when the forward ran under autocast.
            self.metrics[task].update(pred.float() if pred.is_floating_point() else pred, batch[task])

    def compute_metrics(self) -> dict[str, float]:
        """Task metrics over everything validated since the last call (then reset)."""
        values = {task: float(metric.compute()) for task, metric in self.metrics.items()}
        for metric in self.metrics.values():
            metric.reset()
        return values

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, CosineLRScheduler]:
        cfg = self.spec.optimizer
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        # timm's scheduler, stepped once per local epoch over rounds x local epochs.
        scheduler = CosineLRScheduler(
            optimizer,
            t_initial=self.total_epochs,
            lr_min=cfg.min_lr,
            warmup_t=cfg.warmup_epochs,
            warmup_lr_init=cfg.warmup_lr,
        )
        return optimizer, scheduler
