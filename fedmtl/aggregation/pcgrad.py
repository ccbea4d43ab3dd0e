"""PCGrad as a server step (Yu et al., NeurIPS 2020, as FMTL-Bench's ``aggregate_all.py`` applies
it to client updates): pure functions over a Gram matrix, and a direct reference on vectors.

For M client deltas Δ_1..Δ_M, each normalised, ĝ_k = Δ_k/‖Δ_k‖ (ĝ_k = 0 for a zero delta), and
for each client i, with PC_i = ĝ_i, in its order of the other clients j:

    if ⟨PC_i, ĝ_j⟩ < 0:  PC_i ← PC_i − ⟨PC_i, ĝ_j⟩/‖ĝ_j‖² · ĝ_j

and the update is U = (1/M) Σ_i PC_i, the mean over all M (a zero delta contributes 0 but
counts in M, as in the public code). Every step is a linear combination of the ĝ_k, so U is
Σ_k w_k Δ_k with coefficients w that depend on the Gram matrix G = [⟨Δ_k, Δ_l⟩] alone:
:func:`pcgrad_coefficients` finds them from G (one pass over the rows for G, one for the
weighted sum, as the streamed engine reads rows), :func:`pcgrad_update` does the same on the
explicit vectors, for tests.

U is a mean of vectors of norm at most 1, so ‖U‖ ≤ 1 whatever the size of the deltas: the
step's length does not follow the clients' learning rates (FMTL-Bench's behaviour).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import Tensor


def pcgrad_orders(seeds: Sequence[int]) -> list[list[int]]:
    """For M members (``seeds[i]`` the seed of member i), member i's order of the others
    0..M-1 but i: a permutation drawn from ``random.Random(seeds[i])``."""
    orders = []
    for i, seed in enumerate(seeds):
        others = [j for j in range(len(seeds)) if j != i]
        random.Random(int(seed)).shuffle(others)
        orders.append(others)
    return orders


def _check_orders(orders: Sequence[Sequence[int]], m: int) -> list[list[int]]:
    if len(orders) != m:
        raise ValueError(f"PCGrad needs one order per member ({m}), got {len(orders)}")
    checked = []
    for i, order in enumerate(orders):
        order = [int(j) for j in order]
        if sorted(order) != [j for j in range(m) if j != i]:
            raise ValueError(f"member {i}'s order must list every other member 0..{m - 1} once, got {order}")
        checked.append(order)
    return checked


def pcgrad_coefficients(gram: Tensor, orders: Sequence[Sequence[int]]) -> Tensor:
    """w [M] float64 with U = Σ_k w_k Δ_k, from the Gram matrix G [M, M] of the deltas and each
    member's order of the others (``orders[i]``, e.g. :func:`pcgrad_orders`).

    PC_i is kept as its coefficients c_i over the normalised deltas ĝ (PC_i = Σ_k c_i[k] ĝ_k):
    ⟨PC_i, ĝ_j⟩ = (c_i Ĝ)_j with Ĝ = D⁻¹GD⁻¹, D = diag(‖Δ_k‖); then w_k = mean_i c_i[k] / ‖Δ_k‖
    (0 for a zero delta, whose ĝ is 0 and which is never projected on).
    """
    gram = torch.as_tensor(gram).to("cpu", torch.float64)
    m = gram.shape[0] if gram.ndim == 2 else -1
    if m < 1 or tuple(gram.shape) != (m, m):
        raise ValueError(f"PCGrad takes a square Gram matrix [M, M], M >= 1, got {tuple(gram.shape)}")
    if not bool(torch.isfinite(gram).all()):
        raise ValueError("the Gram matrix of the deltas must be finite")
    orders = _check_orders(orders, m)
    norms = gram.diagonal().clamp(min=0).sqrt()
    live = norms > 0
    inverse = torch.where(live, 1.0 / torch.where(live, norms, 1.0), 0.0)
    normal = inverse[:, None] * gram * inverse[None, :]  # Ĝ: zero rows/columns for zero deltas
    coefficients = torch.eye(m, dtype=torch.float64) * live.to(torch.float64)[:, None]
    for i, order in enumerate(orders):
        c = coefficients[i]
        for j in order:
            if not live[j]:
                continue  # ĝ_j = 0: ⟨PC_i, ĝ_j⟩ = 0, nothing to remove
            inner = c @ normal[:, j]
            if inner < 0:
                c[j] -= inner / normal[j, j]
    return coefficients.mean(dim=0) * inverse


def pcgrad_update(deltas: Tensor, orders: Sequence[Sequence[int]]) -> Tensor:
    """U [P] (float64) computed directly on the deltas [M, P], step by step as the public code
    does it, without its 1e-8 terms: the reference :func:`pcgrad_coefficients` is tested against."""
    if deltas.ndim != 2 or deltas.shape[0] < 1:
        raise ValueError(f"PCGrad takes deltas [M, P], M >= 1, got {tuple(deltas.shape)}")
    orders = _check_orders(orders, deltas.shape[0])
    unit = deltas.to(torch.float64).clone()
    for k in range(len(unit)):
        norm = unit[k].norm()
        if norm > 0:
            unit[k] /= norm
    projected = unit.clone()
    for i, order in enumerate(orders):
        for j in order:
            inner = projected[i] @ unit[j]
            if inner < 0:
                projected[i] -= inner / (unit[j] @ unit[j]) * unit[j]
    return projected.mean(dim=0)
