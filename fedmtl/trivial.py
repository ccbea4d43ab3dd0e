"""The trivial predictors a task must beat to count as learnt, on a dataset's validation split.

Per task, with the statistics taken on the training split (no augmentation) and scored by the
task's own metric, the same code as evaluation:

* semseg, human_parts: the majority class everywhere;
* sal: the training share of salient pixels as a constant probability;
* normals: the mean training normal (unit length) everywhere;
* depth: the mean valid training depth everywhere;
* edge: the Sobel gradient magnitude of the image, scaled to [0, 1] per image.

``python benchmarks/trivial.py --config CONFIG`` prints them for a scenario; ``make benchmark``
writes them beside its report.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import torch.nn.functional as F

from fedmtl.config import EvaluationConfig
from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.losses import IGNORE_INDEX
from fedmtl.metrics.depth import MAX_DEPTH
from fedmtl.tasks import get_task


def _stack(dataset, key: str) -> torch.Tensor:
    return torch.stack([dataset[i][key] for i in range(len(dataset))])


def sobel_edges(images: torch.Tensor) -> torch.Tensor:
    """[B, H, W] in [0, 1]: the Sobel gradient magnitude of the grey images [B, 3, H, W], per image
    divided by its maximum."""
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
    kernel = torch.stack([kx, kx.t()]).unsqueeze(1)  # (2, 1, 3, 3)
    grey = images.mean(dim=1, keepdim=True)
    grad = F.conv2d(F.pad(grey, (1, 1, 1, 1), mode="replicate"), kernel)
    magnitude = grad.pow(2).sum(dim=1).sqrt()
    return magnitude / magnitude.amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def trivial_predictions(task: str, train, val) -> torch.Tensor:
    """What the task's metric takes (its ``postprocess`` output) for every validation image."""
    target = _stack(val, task)
    if task in ("semseg", "human_parts"):
        labels = _stack(train, task)
        labels = labels[labels != IGNORE_INDEX]
        return torch.full_like(target, int(torch.bincount(labels).argmax()))
    if task == "sal":
        labels = _stack(train, task)
        share = (labels[labels != IGNORE_INDEX] > 0).float().mean()
        return torch.full(target.shape, float(share))
    if task == "normals":
        normals = _stack(train, task)
        valid = normals.norm(dim=1, keepdim=True) > 0
        mean = (normals * valid).sum(dim=(0, 2, 3))
        return F.normalize(mean, dim=0).view(1, 3, 1, 1).expand_as(target).contiguous()
    if task == "depth":
        depth = _stack(train, task)
        valid = (depth > 0) & (depth < MAX_DEPTH)  # the metric's valid pixels (255: padding, holes)
        return torch.full(target.shape, float(depth[valid].mean()))
    if task == "edge":
        return sobel_edges(_stack(val, "image"))
    raise ValueError(f"no trivial predictor for task {task!r}")


def trivial_metrics(
    dataset: str, root: Path, tasks, train_size, evaluation: EvaluationConfig | None = None
) -> dict[str, float]:
    """Each task's metric of its trivial predictor on ``dataset``'s validation split, scored as
    ``evaluation`` says (the run's: the same edge ground truth as its clients)."""
    train = build_dataset(dataset, root, "train", tasks, train_size, augment=False)
    val = build_dataset(dataset, root, "val", tasks, train_size, augment=False)
    out = {}
    for task in tasks:
        metric = get_task(task).metric(dataset, evaluation)
        metric.update(trivial_predictions(task, train, val), _stack(val, task))
        out[task] = float(metric.compute())
    return out


def scenario_trivial_metrics(cfg) -> dict[str, dict[str, float]]:
    """``{"dataset/task": {metric name: value}}`` for every task of a run config's clients."""
    table = {}
    for dataset in sorted({group.dataset for group in cfg.clients}):
        tasks = sorted({t for group in cfg.clients if group.dataset == dataset for t in group.tasks})
        root = Path(cfg.data.resolved_root()) / DATASETS.get(dataset).root_folder
        for task, value in trivial_metrics(dataset, root, tasks, cfg.data.train_size, cfg.evaluation).items():
            table[f"{dataset}/{task}"] = {get_task(task).metric_name: value}
    return table


#: How much better than the trivial predictor (%, relative) a task's mean must be to count as
#: learnt: a mean a hair above the majority class (4.036 against 4.034) is not learning.
LEARNT_MARGIN = 5.0


def better_than(value: float, floor: float, lower_is_better: bool) -> float:
    """How much better ``value`` is than ``floor``, in % of ``floor`` (negative: worse)."""
    return (floor - value if lower_is_better else value - floor) / abs(floor) * 100


def _learnt_cell(value: float, floor: float, lower_is_better: bool, margin: float) -> str:
    return f"{value:.4g}" + (" ✓" if better_than(value, floor, lower_is_better) >= margin else "")


def learnt_table(
    report_csv: Path,
    trivial: dict[str, dict[str, float]],
    lower_is_better: set[str],
    margin: float = LEARNT_MARGIN,
) -> str:
    """Markdown: per client task (a ``client/task_metric`` column of ``fedmtl report --format
    csv``), the trivial predictor's value and each method's mean, marked ✓ where it is at least
    ``margin`` % better than the trivial predictor. ``lower_is_better`` names the metrics
    (RMSE, mErr) where lower wins."""
    with report_csv.open() as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if "/" in c and not c.endswith("_std")]
    lines = [
        "| task | trivial | " + " | ".join(r["method"] for r in rows) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in rows) + " |",
    ]
    for column in columns:
        client, _, task_metric = column.partition("/")
        task, _, metric = task_metric.rpartition("_")
        dataset = client.split("-")[0]
        floor = trivial[f"{dataset}/{task}"][metric]
        lower = metric in lower_is_better

        cells = [_learnt_cell(float(r[column]), floor, lower, margin) for r in rows]
        lines.append(f"| {column} | {floor:.4g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
