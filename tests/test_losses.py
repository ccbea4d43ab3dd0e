"""Losses against values computed by hand from their definitions (REFERENCE.md, Tasks)."""

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
