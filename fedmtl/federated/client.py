"""A client: the LightningModule that says what one step is (its description, ``ClientSpec``,
lives in ``spec.py``, which the checks import without Lightning).

The module holds the client's ``MultiTaskModel`` (encoder, decoders, heads) and its task
metrics; *when* steps run is the round loop's business (``fedmtl.federated.engine``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import lightning as L
import torch
from timm.scheduler import CosineLRScheduler
from torch import nn

from fedmtl.config import EvaluationConfig, ModelConfig, OptimizerConfig
from fedmtl.federated.spec import ClientSpec  # here too, where the client is
from fedmtl.models import MultiTaskModel
from fedmtl.tasks import get_task, sharded_multi_task_loss

# timm warns, for every optimiser it builds, that a one-epoch cosine does not anneal: true
# and harmless (a one-round run, FedBABU's fine-tuning), and noise in every log.
logging.getLogger("timm.scheduler.cosine_lr").setLevel(logging.ERROR)


class ClientModule(L.LightningModule):
    """One client's model, loss, optimiser and metrics."""

    def __init__(
        self,
        spec: ClientSpec,
        model: ModelConfig,
        total_epochs: int,
        img_size: tuple[int, int] | None = None,
        evaluation: EvaluationConfig | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.total_epochs = total_epochs
        self.model = MultiTaskModel(
            spec.dataset,
            spec.tasks,
            backbone=model.backbone,
            pretrained_file=model.pretrained_file,
            pretrained_strict=model.pretrained_strict,
            img_size=img_size,
            embed_dim=model.embed_dim,
            channels_last=model.channels_last,
            swin_windows=model.swin_windows,
            norm=model.norm,
        )
        # A client is validated on one rank only: its metrics must not sync with other ranks.
        self.metrics = nn.ModuleDict(
            {t: get_task(t).metric(spec.dataset, evaluation, sync_on_compute=False) for t in spec.tasks}
        )
        self._nonfinite: set[str] = set()  # tasks whose predictions held NaN/inf since the last compute

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model(images)

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int = 0) -> dict[str, torch.Tensor]:
        """The client's objective: the weighted sum of its task losses (``"total"``), averaged
        over ``spec.loss_shards`` parts of the batch."""
        return sharded_multi_task_loss(
            self.model(batch["image"]), batch, self.spec.tasks, self.spec.loss_shards
        )

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int = 0) -> None:
        preds = self.model(batch["image"])
        for task in self.spec.tasks:
            if not torch.isfinite(preds[task]).all():
                # argmax / thresholds would turn NaN into plausible labels: the metric is NaN.
                self._nonfinite.add(task)
            pred = get_task(task).postprocess(preds[task])
            # Metrics accumulate in full precision even when the forward ran under autocast.
            self.metrics[task].update(pred.float() if pred.is_floating_point() else pred, batch[task])

    def compute_metrics(self) -> dict[str, float]:
        """Task metrics over everything validated since the last call (then reset); NaN for a
        task whose predictions were not finite."""
        values = {
            task: math.nan if task in self._nonfinite else float(metric.compute())
            for task, metric in self.metrics.items()
        }
        for metric in self.metrics.values():
            metric.reset()
        self._nonfinite.clear()
        return values

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, CosineLRScheduler]:
        """AdamW over all parameters with the run's schedule (the engine builds its optimisers
        with :func:`make_optimizer` over the parameters a method trains)."""
        return make_optimizer(list(self.model.parameters()), self.spec.optimizer, self.total_epochs)


def _fused_adamw_runs(params: list[nn.Parameter]) -> bool:
    # PyTorch refuses fused=True for other devices and for integer tensors; there the default
    # (per-tensor) implementation runs.
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def make_optimizer(
    params: list[nn.Parameter], cfg: OptimizerConfig, total_epochs: int | None
) -> tuple[torch.optim.AdamW, CosineLRScheduler | None]:
    """AdamW over ``params`` and, unless ``total_epochs`` is None, timm's warm-up cosine
    schedule over the whole run (paper 4.1, suppl. C), built as the public code builds it:
    the warm-up is a prefix and the cosine spans the remaining ``total_epochs − warmup``
    epochs (at least one). Step it with :func:`end_epoch`.

    The update is PyTorch's fused AdamW kernel wherever it runs (floating-point parameters on
    CPU or CUDA): the same AdamW arithmetic in one kernel instead of a dozen per tensor; a
    training step of the benchmark's clients takes 0.85x the time (benchmarks/optimizer.py)."""
    # None, not False, where the kernel cannot run: PyTorch picks its foreach default only when
    # both fused and foreach are None, so an explicit False would also slow CUDA's fallback.
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=_fused_adamw_runs(params) or None
    )
    if total_epochs is None:
        return optimizer, None
    scheduler = CosineLRScheduler(
        optimizer,
        t_initial=max(total_epochs - cfg.warmup_epochs, 1),
        lr_min=cfg.min_lr,
        warmup_t=cfg.warmup_epochs,
        warmup_lr_init=cfg.warmup_lr,
        warmup_prefix=True,
    )
    return optimizer, scheduler


def end_epoch(scheduler: CosineLRScheduler, epoch: int) -> None:
    """Step the schedule at the end of global epoch ``epoch`` (0-based), as the public code
    does (``scheduler.step(cr * local_epochs + epoch)``): the next epoch trains at the
    schedule's value for ``epoch``. Epoch e therefore trains at its value for max(e − 1, 0),
    one epoch behind the schedule, and the first two epochs both train at the warm-up's start."""
    scheduler.step(epoch)
