"""Input checks and small numeric helpers shared by the metrics.

Every metric validates what it is given before touching its state: a wrong dtype or shape
silently broadcast into a confusion matrix or a threshold count gives a plausible but wrong
number, which is the worst kind of evaluation bug.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_floating(name: str, x: Tensor) -> None:
    if not torch.is_floating_point(x):
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def check_integer(name: str, x: Tensor, hint: str = "") -> None:
    if torch.is_floating_point(x) or torch.is_complex(x) or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}{hint}")


def check_ndim(name: str, x: Tensor, ndim: int, layout: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor {layout}, got shape {tuple(x.shape)}")


def check_same_shape(pred: Tensor, target: Tensor) -> None:
    if pred.shape != target.shape:
        raise ValueError(
            f"pred and target must have the same shape, got {tuple(pred.shape)} and {tuple(target.shape)}"
        )


def check_probabilities(name: str, x: Tensor) -> None:
    """Values must lie in [0, 1]: thresholds 0.05 … 0.95 applied to logits would be meaningless."""
    if x.numel() and (x.min() < 0 or x.max() > 1):
        raise ValueError(
            f"{name}: expected probabilities in [0, 1], got values in "
            f"[{x.min().item():.4g}, {x.max().item():.4g}] (apply sigmoid/softmax first)"
        )


def check_binary_target(target: Tensor, ignore_index: int) -> None:
    """Targets of the binary tasks hold 0 (background), 1 (foreground/boundary) or ignore_index."""
    allowed = (target == 0) | (target == 1) | (target == ignore_index)
    if not bool(allowed.all()):
        bad = torch.unique(target[~allowed])[:5].tolist()
        raise ValueError(f"target: expected values in {{0, 1, {ignore_index}}}, found e.g. {bad}")


def safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den in float64, with 0/0 (and x/0) defined as 0 — e.g. precision with no positives."""
    num, den = num.double(), den.double()
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(torch.float64).tiny), torch.zeros_like(num))
