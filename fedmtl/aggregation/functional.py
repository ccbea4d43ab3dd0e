"""Pure aggregation math over stacked flat parameters.

Every function takes and returns tensors (rows = clients or decoders, columns = flat
parameters, see :class:`~fedmtl.aggregation.flat.FlatLayout`), works on any device and
floating dtype, returns new tensors and never modifies its inputs. Aggregator classes
compose these; tests check them against small hand-computed cases.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def mean_rows(x: Tensor, weights: Tensor | Sequence[float] | None = None) -> Tensor:
    """Weighted mean of the rows of ``x`` [M, P]: a new tensor [P] in ``x``'s dtype and device.

    ``weights`` [M] must be non-negative with a positive sum; they are normalised to sum to
    1, so sample counts can be passed as they are. None means equal weights.
    """
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"mean_rows takes a non-empty stack [M, P], got shape {tuple(x.shape)}")
    if weights is None:
        return x.mean(dim=0)
    # Weights are M numbers: check and normalise them on the CPU in float64, then move them.
    w = torch.as_tensor(weights, dtype=torch.float64, device="cpu")
    if w.shape != (x.shape[0],):
        raise ValueError(f"weights must have shape [{x.shape[0]}] (one per row), got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"weights must be finite and non-negative, got {w.tolist()}")
    total = w.sum()
    if total <= 0:
        raise ValueError(f"weights must have a positive sum, got {w.tolist()}")
    return (w / total).to(device=x.device, dtype=x.dtype) @ x
