"""The six dense-prediction tasks: outputs, losses and weights, post-processing, metrics.

One registry, ``TASKS``, holds everything a client needs to know about a task, so adding a
task is one entry here. Per-dataset facts (the number of semantic classes, the edge
matching tolerance) live in the task entry, keyed by dataset name.

| task        | datasets            | out ch. | loss (weight)                 | metric          |
|-------------|---------------------|---------|-------------------------------|-----------------|
| semseg      | pascal_context, nyud, cityscapes | 21 / 40 / 19 | CE (1)           | mIoU  ↑         |
| human_parts | pascal_context      | 7       | CE (2)                        | mIoU  ↑         |
| sal         | pascal_context      | 2       | class-balanced CE (5)         | maxF  ↑         |
| normals     | pascal_context, nyud| 3       | L1 on normalised pred (10)    | mErr  ↓         |
| edge        | pascal_context, nyud| 1       | balanced BCE, w = 0.95 (50)   | odsF  ↑         |
| depth       | nyud, cityscapes    | 1       | L1 (1)                        | RMSE  ↓         |

Depth on Cityscapes is disparity in pixels (the release's label), scored by the same RMSE
(valid 0 <= gt < 255, not NYUD-v2's 0 < gt < 80 m). The MTL literature on Cityscapes (MTAN,
CAGrad, Nash-MTL) reports the absolute and relative error of disparity, FMTL-Bench a mean
relative error (|gt - pred| / gt over 0 < gt < 80, labelled "abs_err"); fedmtl keeps one metric
per task, so that the report, Δm and the comparison tables need no per-dataset metric name:
the figure is not comparable to those papers' (docs/data.md, "Cityscapes").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fedmtl import losses
from fedmtl.config import EvaluationConfig
from fedmtl.registry import Registry

if TYPE_CHECKING:
    from torchmetrics import Metric

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Task:
    name: str
    out_channels: Mapping[str, int]  # dataset name -> head output channels
    loss: Loss  # (raw head output, target) -> scalar
    loss_weight: float  # weight in a multi-task client's summed loss
    postprocess: Callable[[torch.Tensor], torch.Tensor]  # raw output -> what the metric takes
    # (dataset name, evaluation config, **torchmetrics options) -> a fresh metric
    make_metric: Callable[..., Metric]
    metric_name: str
    lower_is_better: bool

    @property
    def datasets(self) -> tuple[str, ...]:
        return tuple(self.out_channels)

    def channels(self, dataset: str) -> int:
        self.check_dataset(dataset)
        return self.out_channels[dataset]

    def metric(self, dataset: str, evaluation: EvaluationConfig | None = None, **options) -> Metric:
        """A fresh metric scored as ``evaluation`` says (default: the defaults of
        :class:`EvaluationConfig`); ``options`` go to torchmetrics (e.g. ``sync_on_compute=False``)."""
        self.check_dataset(dataset)
        return self.make_metric(dataset, evaluation or EvaluationConfig(), **options)

    def check_dataset(self, dataset: str) -> None:
        if dataset not in self.out_channels:
            raise ValueError(
                f"task {self.name!r} is not available on dataset {dataset!r}; "
                f"it is defined for: {', '.join(self.datasets)}"
            )


TASKS: Registry[Task] = Registry("task")

SEMSEG_CLASSES = {"pascal_context": 21, "nyud": 40, "cityscapes": 19}
# Depth label unit per dataset: what the metric scores as valid (fedmtl.metrics.depth).
DEPTH_UNIT = {"nyud": "metres", "cityscapes": "disparity"}
HUMAN_PART_CLASSES = 7  # background + 6 parts
# Edge matching tolerance as a fraction of the image diagonal (the reference evaluation's maxDist).
EDGE_MAX_DIST = {"pascal_context": 0.0075, "nyud": 0.011}


def _metrics():
    """fedmtl.metrics, imported when a metric is first made: torchmetrics takes seconds to
    import, and the commands that only check a config or reprint a run never score."""
    import fedmtl.metrics

    return fedmtl.metrics


def _argmax(pred: torch.Tensor) -> torch.Tensor:
    return pred.argmax(dim=1)


def _foreground_probability(pred: torch.Tensor) -> torch.Tensor:
    return F.softmax(pred, dim=1)[:, 1]


def _unit_normals(pred: torch.Tensor) -> torch.Tensor:
    return F.normalize(pred, p=2, dim=1)


def _edge_probability(pred: torch.Tensor) -> torch.Tensor:
    # EdgeODSF quantises this to the uint8 grey level the public code saves as a PNG.
    return torch.sigmoid(pred[:, 0])


def _depth(pred: torch.Tensor) -> torch.Tensor:
    return pred[:, 0]


TASKS.add(
    "semseg",
    Task(
        name="semseg",
        out_channels=SEMSEG_CLASSES,
        loss=losses.cross_entropy,
        loss_weight=1.0,
        postprocess=_argmax,
        make_metric=lambda dataset, evaluation, **kw: _metrics().MeanIoU(
            num_classes=SEMSEG_CLASSES[dataset], **kw
        ),
        metric_name="mIoU",
        lower_is_better=False,
    ),
)
TASKS.add(
    "human_parts",
    Task(
        name="human_parts",
        out_channels={"pascal_context": HUMAN_PART_CLASSES},
        loss=losses.cross_entropy,
        loss_weight=2.0,
        postprocess=_argmax,
        make_metric=lambda dataset, evaluation, **kw: _metrics().MeanIoU(
            num_classes=HUMAN_PART_CLASSES, **kw
        ),
        metric_name="mIoU",
        lower_is_better=False,
    ),
)
TASKS.add(
    "sal",
    Task(
        name="sal",
        out_channels={"pascal_context": 2},
        loss=losses.balanced_cross_entropy,
        loss_weight=5.0,
        postprocess=_foreground_probability,
        make_metric=lambda dataset, evaluation, **kw: _metrics().SaliencyMaxF(**kw),
        metric_name="maxF",
        lower_is_better=False,
    ),
)
TASKS.add(
    "normals",
    Task(
        name="normals",
        out_channels={"pascal_context": 3, "nyud": 3},
        loss=partial(losses.l1, normalize=True),
        loss_weight=10.0,
        postprocess=_unit_normals,
        make_metric=lambda dataset, evaluation, **kw: _metrics().NormalsMeanError(**kw),
        metric_name="mErr",
        lower_is_better=True,
    ),
)
TASKS.add(
    "edge",
    Task(
        name="edge",
        out_channels={"pascal_context": 1, "nyud": 1},
        loss=partial(losses.balanced_bce, pos_weight=0.95),
        loss_weight=50.0,
        postprocess=_edge_probability,
        make_metric=lambda dataset, evaluation, **kw: _metrics().EdgeODSF(
            max_dist=EDGE_MAX_DIST[dataset], thin_gt=evaluation.edge_thin_gt, **kw
        ),
        metric_name="odsF",
        lower_is_better=False,
    ),
)
TASKS.add(
    "depth",
    Task(
        name="depth",
        out_channels={"nyud": 1, "cityscapes": 1},
        loss=losses.l1,
        loss_weight=1.0,
        postprocess=_depth,
        make_metric=lambda dataset, evaluation, **kw: _metrics().DepthRMSE(unit=DEPTH_UNIT[dataset], **kw),
        metric_name="RMSE",
        lower_is_better=True,
    ),
)


def get_task(name: str) -> Task:
    return TASKS.get(name)


def check_tasks(dataset: str, tasks: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Validate a client's task list for a dataset; returns it as a tuple."""
    if not tasks:
        raise ValueError(f"a client on {dataset!r} needs at least one task")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"duplicate task in {list(tasks)}")
    for name in tasks:
        get_task(name).check_dataset(dataset)
    return tuple(tasks)


def multi_task_loss(
    preds: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor], tasks: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Per-task losses and their weighted sum under ``"total"`` (an MT client's objective)."""
    out = {t: get_task(t).loss(preds[t], targets[t]) for t in tasks}
    out["total"] = torch.stack([get_task(t).loss_weight * out[t] for t in tasks]).sum()
    return out


def sharded_multi_task_loss(
    preds: Mapping[str, torch.Tensor],
    targets: Mapping[str, torch.Tensor],
    tasks: tuple[str, ...],
    shards: int = 1,
) -> dict[str, torch.Tensor]:
    """:func:`multi_task_loss` of each of ``shards`` equal parts of the batch, averaged.

    Data-parallel training on ``shards`` devices computes each device's losses over its own
    part of the batch (normalised by that part's valid pixels, saliency's class weight from
    that part's pixels) and averages the gradients, i.e. differentiates this average. One
    shard is :func:`multi_task_loss` itself.
    """
    if shards == 1:
        return multi_task_loss(preds, targets, tasks)
    batch = next(iter(preds.values())).shape[0]
    if batch % shards:
        raise ValueError(f"a batch of {batch} cannot be split into {shards} equal loss shards")
    pred_parts = {t: preds[t].tensor_split(shards) for t in tasks}
    target_parts = {t: targets[t].tensor_split(shards) for t in tasks}
    parts = [
        multi_task_loss({t: pred_parts[t][k] for t in tasks}, {t: target_parts[t][k] for t in tasks}, tasks)
        for k in range(shards)
    ]
    return {key: torch.stack([part[key] for part in parts]).mean() for key in parts[0]}
