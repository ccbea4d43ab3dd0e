"""Losses against values computed by hand from their definitions (docs/evaluation.md, "Tasks and losses")."""

import math

import pytest
import torch

from fedmtl import losses


def _log_softmax(values):
    top = max(values)
    return [v - top - math.log(sum(math.exp(u - top) for u in values)) for v in values]


def test_cross_entropy_sums_over_valid_pixels_and_divides_by_their_count():
    # two pixels; the second is ignored
    pred = torch.tensor([[[[2.0, 5.0]], [[0.0, -1.0]]]])  # [1, 2, 1, 2]
    target = torch.tensor([[[1, 255]]])
    expected = -_log_softmax([2.0, 0.0])[1]
    assert losses.cross_entropy(pred, target).item() == pytest.approx(expected, rel=1e-6)


def test_balanced_cross_entropy_weights_classes_by_the_share_of_negatives():
    logits = torch.tensor([[0.3, -0.2], [1.0, 0.5], [-0.4, 0.1], [0.2, 0.9], [0.0, 0.0]])  # 5 pixels
    pred = logits.T.reshape(1, 2, 1, 5)
    target = torch.tensor([[[0, 0, 0, 1, 255]]])
    p_neg = 3 / 4  # share of negatives among the 4 valid pixels
    weights = [1 - p_neg, p_neg]
    total = sum(-weights[t] * _log_softmax(logits[i].tolist())[t] for i, t in enumerate([0, 0, 0, 1]))
    assert losses.balanced_cross_entropy(pred, target).item() == pytest.approx(total / 4, rel=1e-6)


def test_balanced_bce_weights_boundaries_by_pos_weight():
    x = [1.5, -0.5, 0.25]
    pred = torch.tensor(x + [3.0]).reshape(1, 1, 1, 4)
    target = torch.tensor([[[1.0, 0.0, 0.0, 255.0]]])
    w = 0.95

    def sig(v):
        return 1 / (1 + math.exp(-v))

    expected = (
        -w * math.log(sig(x[0])) - (1 - w) * math.log(1 - sig(x[1])) - (1 - w) * math.log(1 - sig(x[2]))
    ) / 3
    assert losses.balanced_bce(pred, target, pos_weight=w).item() == pytest.approx(expected, rel=1e-6)


def test_l1_normalised_counts_valid_pixels_not_channels():
    pred = torch.tensor([[3.0, 0.0], [4.0, 1.0], [0.0, 0.0]]).reshape(1, 3, 1, 2)  # pixel 0 -> (0.6, 0.8, 0)
    target = torch.tensor([[0.0, 255.0], [1.0, 255.0], [0.0, 255.0]]).reshape(1, 3, 1, 2)
    expected = (0.6 + 0.2 + 0.0) / 1  # one valid pixel
    assert losses.l1(pred, target, normalize=True).item() == pytest.approx(expected, rel=1e-6)


def test_l1_depth_accepts_unbatched_channel_targets():
    pred = torch.tensor([1.0, 2.0, 3.0]).reshape(1, 1, 1, 3)
    target = torch.tensor([[[1.5, 255.0, 2.0]]])
    assert losses.l1(pred, target).item() == pytest.approx((0.5 + 1.0) / 2)


@pytest.mark.parametrize(
    "loss, channels, target",
    [
        (losses.cross_entropy, 4, torch.full((1, 2, 2), 255)),
        (losses.balanced_cross_entropy, 2, torch.full((1, 2, 2), 255)),
        (losses.balanced_bce, 1, torch.full((1, 2, 2), 255.0)),
        (losses.l1, 3, torch.full((1, 3, 2, 2), 255.0)),
    ],
)
def test_a_batch_without_valid_pixels_gives_zero_loss_and_a_gradient(loss, channels, target):
    pred = torch.randn(1, channels, 2, 2, requires_grad=True)
    value = loss(pred, target)
    value.backward()
    assert value.item() == 0.0
    assert torch.isfinite(pred.grad).all()


def test_loss_shards_normalise_each_part_by_its_own_valid_pixels():
    """The public 2-GPU run: each half-batch divides by its own valid pixels, then the halves
    are averaged. Image A: 1 valid pixel with CE ln 2 (logits 0, 0); image B: 2 valid pixels
    with CE ln 4 (logits 0, ln 3, target 0). Whole batch: (ln 2 + 2 ln 4) / 3 = 5/3 ln 2;
    two shards: (ln 2 / 1 + 2 ln 4 / 2) / 2 = 3/2 ln 2."""
    from fedmtl.tasks import multi_task_loss, sharded_multi_task_loss

    pred = torch.zeros(2, 2, 1, 2)
    pred[1, 1] = math.log(3)
    target = torch.tensor([[[0, 255]], [[0, 0]]])
    preds, targets = {"semseg": pred}, {"semseg": target}
    whole = multi_task_loss(preds, targets, ("semseg",))
    assert whole["semseg"].item() == pytest.approx(5 / 3 * math.log(2))
    halves = sharded_multi_task_loss(preds, targets, ("semseg",), shards=2)
    assert halves["semseg"].item() == pytest.approx(3 / 2 * math.log(2))
    assert halves["total"].item() == pytest.approx(3 / 2 * math.log(2))  # weight 1
    assert sharded_multi_task_loss(preds, targets, ("semseg",), shards=1)["total"] == whole["total"]


def test_loss_shards_take_the_saliency_class_weight_from_their_own_pixels():
    """Image A all salient, image B all background, logits 0 (CE ln 2 a pixel). Whole batch:
    half the pixels are negatives, weights [0.5, 0.5]: 0.5 · 4 ln 2 / 4 = ln 2 / 2, times the
    task weight 5. Per half: A has no negatives (share 0), class weights [1, 0], and its salient
    pixels weigh 0; B has only negatives (share 1), weights [0, 1], and its pixels weigh 0: each
    half's loss is 0, as on the public code's two GPUs."""
    from fedmtl.tasks import multi_task_loss, sharded_multi_task_loss

    preds = {"sal": torch.zeros(2, 2, 1, 2, requires_grad=True)}
    targets = {"sal": torch.tensor([[[1, 1]], [[0, 0]]])}
    whole = multi_task_loss(preds, targets, ("sal",))
    assert whole["sal"].item() == pytest.approx(math.log(2) / 2)
    assert whole["total"].item() == pytest.approx(5 * math.log(2) / 2)
    halves = sharded_multi_task_loss(preds, targets, ("sal",), shards=2)
    assert halves["sal"].item() == 0.0
    halves["total"].backward()  # still a graph to differentiate
    with pytest.raises(ValueError, match="cannot be split into 3 equal loss shards"):
        sharded_multi_task_loss(preds, targets, ("sal",), shards=3)


def test_a_client_group_s_loss_shards_reach_its_clients_training_step(monkeypatch, tmp_path):
    """clients[].loss_shards goes from the config to each client's spec and its training step."""
    import yaml

    from fedmtl.cli import _run_parser
    from fedmtl.config import ModelConfig, RunConfig
    from fedmtl.federated import scenario
    from fedmtl.federated.client import ClientModule
    from fedmtl.tasks import multi_task_loss, sharded_multi_task_loss

    monkeypatch.setattr(scenario, "train_split_size", lambda cfg, dataset: 8)
    groups = [
        {"dataset": "nyud", "tasks": ["semseg", "depth"], "batch_size": 4, "loss_shards": 2},
        {"dataset": "pascal_context", "tasks": ["sal"], "batch_size": 4},
    ]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"clients": groups, "data": {"root": str(tmp_path)}}))
    parser = _run_parser()
    cfg = RunConfig.from_namespace(parser.instantiate(parser.parse_path(str(tmp_path / "c.yaml"))))
    nyud, pascal = scenario.build_clients(cfg)
    assert (nyud.loss_shards, pascal.loss_shards) == (2, 1)

    torch.manual_seed(0)
    module = ClientModule(nyud, ModelConfig(), total_epochs=1, img_size=(32, 32)).eval()
    batch = {
        "image": torch.randn(4, 3, 32, 32),
        "semseg": torch.randint(0, 40, (4, 32, 32)),
        "depth": torch.rand(4, 32, 32) * 5,
    }
    batch["semseg"][0, 4:] = 255  # the first half has fewer valid pixels: the two normalisations differ
    with torch.no_grad():
        preds = module(batch["image"])
        step = module.training_step(batch)
    assert step["total"] == sharded_multi_task_loss(preds, batch, nyud.tasks, 2)["total"]
    assert step["total"] != multi_task_loss(preds, batch, nyud.tasks)["total"]
