"""Per-task losses of the FedHCA² training protocol (docs/evaluation.md, "Tasks and losses").

Pure functions of (prediction, target): ``pred`` is the raw head output [B, C, H, W];
``target`` is what the datasets return, batched: class maps and scalar maps [B, H, W],
normals [B, 3, H, W]. The value 255 marks pixels to ignore, everywhere.

Every loss is a *sum over valid pixels divided by the number of valid pixels*, as the
public implementation computes it; a batch with no valid pixel gives a zero loss that
still carries a gradient path, so a multi-task step never sees NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = 255


def cross_entropy(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Semantic segmentation and human parts: CE summed over valid pixels / #valid."""
    target = target.long()
    loss = F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / (target != IGNORE_INDEX).sum().clamp(min=1)


def balanced_cross_entropy(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Saliency: two-class CE with class weights [1 - p, p], p = share of negatives.

    The share is taken over the valid pixels of the whole batch, so rare foreground
    pixels weigh as much in total as the background. The sum is divided by the number of
    valid pixels (not by the sum of weights, which is what ``reduction="mean"`` would do).
    """
    target = target.long()
    valid = target != IGNORE_INDEX
    n_valid = valid.sum().clamp(min=1)
    negatives_share = (target[valid] == 0).sum() / n_valid
    class_weight = torch.stack((1.0 - negatives_share, negatives_share)).to(pred.dtype)
    loss = F.cross_entropy(pred, target, weight=class_weight, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / n_valid


def balanced_bce(pred: torch.Tensor, target: torch.Tensor, pos_weight: float = 0.95) -> torch.Tensor:
    """Edges: binary CE with weight ``pos_weight`` on boundary pixels and 1 - w elsewhere.

    Boundaries cover a few percent of the image, so the positives are weighted up (HED).
    Computed as BCE-with-logits with pos_weight w/(1-w), then scaled back by (1-w).
    """
    logits = pred[:, 0] if pred.dim() == 4 else pred
    target = target.to(logits.dtype)
    valid = target != IGNORE_INDEX
    neg_weight = 1.0 - pos_weight
    loss = F.binary_cross_entropy_with_logits(
        logits[valid],
        target[valid],
        pos_weight=torch.tensor(pos_weight / neg_weight, dtype=logits.dtype, device=logits.device),
        reduction="sum",
    )
    return loss * neg_weight / valid.sum().clamp(min=1)


def l1(pred: torch.Tensor, target: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """Normals (``normalize=True``: L1 on the L2-normalised prediction) and depth.

    A pixel counts when all of its target channels are valid; the sum of absolute errors
    over its channels is divided by the number of valid *pixels*.
    """
    if target.dim() == 3:
        target = target.unsqueeze(1)
    if normalize:
        pred = F.normalize(pred, p=2, dim=1)
    valid = (target != IGNORE_INDEX).all(dim=1, keepdim=True).expand_as(target)
    loss = (pred[valid] - target[valid]).abs().sum()
    n_valid_pixels = valid[:, 0].sum().clamp(min=1)
    return loss / n_valid_pixels


def proximal_term(params: Sequence[Tensor], anchors: Sequence[Tensor], coefficient: float) -> Tensor:
    """coefficient/2 · Σ_i ‖params_i − anchors_i‖²: the squared (not plain) norm that FedProx,
    Ditto and FedAMP add to the client loss. Differentiable in ``params``; the anchors are
    detached snapshots. Its gradient is coefficient·(p − a), never zero while p ≠ a (the
    public codes' ``p.data − a.data`` form has no gradient at all)."""
    if len(params) != len(anchors):
        raise ValueError(f"{len(params)} parameters but {len(anchors)} anchors")
    if not params:
        raise ValueError("a proximal term needs at least one parameter")
    total = sum(((p - a.detach()) ** 2).sum() for p, a in zip(params, anchors, strict=True))
    return 0.5 * coefficient * total
