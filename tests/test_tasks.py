"""The task registry: per-dataset outputs, losses, post-processing and metrics fit together."""

import pytest
import torch

from fedmtl.tasks import TASKS, check_tasks, get_task, multi_task_loss

DATASET_TASKS = {
    "pascal_context": ("semseg", "human_parts", "sal", "normals", "edge"),
    "nyud": ("semseg", "normals", "edge", "depth"),
    "cityscapes": ("semseg", "depth"),
}
CASES = [(d, t) for d, tasks in DATASET_TASKS.items() for t in tasks]


def _target(task: str, channels: int, shape=(2, 16, 16)) -> torch.Tensor:
    b, h, w = shape
    if task in ("semseg", "human_parts", "sal"):
        target = torch.randint(0, channels, shape)
        target[:, 0, 0] = 255
        return target
    if task == "normals":
        return torch.nn.functional.normalize(torch.randn(b, 3, h, w), dim=1)
    if task == "edge":
        return (torch.rand(shape) > 0.9).float()
    return torch.rand(shape) * 5 + 0.5  # depth in metres


def test_registry_holds_exactly_the_six_tasks():
    assert TASKS.names() == sorted(["semseg", "human_parts", "sal", "normals", "edge", "depth"])


def test_each_dataset_has_the_tasks_of_the_paper():
    for dataset, tasks in DATASET_TASKS.items():
        assert tuple(t for t in tasks if dataset in get_task(t).datasets) == tasks
    assert [t for t in TASKS if "nyud" in get_task(t).datasets] == sorted(DATASET_TASKS["nyud"])


def test_output_channels_follow_the_reference():
    assert get_task("semseg").channels("pascal_context") == 21
    assert get_task("semseg").channels("nyud") == 40
    assert get_task("human_parts").channels("pascal_context") == 7
    assert get_task("sal").channels("pascal_context") == 2
    assert get_task("normals").channels("nyud") == 3
    assert [
        get_task(t).loss_weight for t in ("semseg", "human_parts", "sal", "normals", "edge", "depth")
    ] == [
        1,
        2,
        5,
        10,
        50,
        1,
    ]
    assert {t for t in TASKS if get_task(t).lower_is_better} == {"normals", "depth"}


@pytest.mark.parametrize("dataset, task", CASES)
def test_loss_postprocess_and_metric_fit_together(dataset, task):
    spec = get_task(task)
    channels = spec.channels(dataset)
    pred = torch.randn(2, channels, 16, 16, requires_grad=True)
    target = _target(task, channels)
    loss = spec.loss(pred, target)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss) and pred.grad.abs().sum() > 0
    metric = spec.metric(dataset)
    with torch.no_grad():
        metric.update(spec.postprocess(pred), target)
    value = float(metric.compute())
    assert value == value  # not NaN


def test_unknown_task_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown task 'segmentation'.*known: depth, edge"):
        get_task("segmentation")


def test_task_missing_from_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="'human_parts' is not available on dataset 'nyud'"):
        check_tasks("nyud", ["semseg", "human_parts"])
    with pytest.raises(ValueError, match="duplicate"):
        check_tasks("nyud", ["semseg", "semseg"])


def test_multi_task_loss_is_the_weighted_sum():
    preds = {"semseg": torch.randn(1, 40, 8, 8), "depth": torch.randn(1, 1, 8, 8)}
    targets = {"semseg": _target("semseg", 40, (1, 8, 8)), "depth": _target("depth", 1, (1, 8, 8))}
    out = multi_task_loss(preds, targets, ("semseg", "depth"))
    assert out["total"].item() == pytest.approx(out["semseg"].item() * 1 + out["depth"].item() * 1)
    preds["edge"] = torch.randn(1, 1, 8, 8)
    targets["edge"] = _target("edge", 1, (1, 8, 8))
    out = multi_task_loss(preds, targets, ("edge", "depth"))
    assert out["total"].item() == pytest.approx(50 * out["edge"].item() + out["depth"].item())


def test_task_registry_and_dataset_registry_agree():
    from fedmtl.data.datasets import DATASETS

    for name in DATASETS:
        assert DATASETS.get(name).tasks == DATASET_TASKS[name]
        assert all(name in get_task(t).datasets for t in DATASETS.get(name).tasks)


def test_the_evaluation_config_chooses_the_edge_ground_truth_of_every_client():
    """A client's edge metric thins the ground truth unless ``evaluation.edge_thin_gt`` is false;
    the option is the edge metric's only, every other task's metric takes the config as well."""
    from fedmtl.config import EvaluationConfig, ModelConfig
    from fedmtl.federated.client import ClientModule, ClientSpec

    spec = ClientSpec("c", "nyud", ("semseg", "normals", "edge", "depth"), 1, 2, (0, 1))
    default = ClientModule(spec, ModelConfig(), total_epochs=1, img_size=(32, 32))
    assert default.metrics["edge"].thin_gt is True
    off = ClientModule(spec, ModelConfig(), 1, (32, 32), EvaluationConfig(edge_thin_gt=False))
    assert off.metrics["edge"].thin_gt is False
    assert get_task("edge").metric("pascal_context").thin_gt is True
