"""Pure aggregation math over stacked flat parameters.

Every function takes and returns tensors (rows = clients or decoders, columns = flat
parameters, see :class:`~fedmtl.aggregation.flat.FlatLayout`), works on any device and
floating dtype, returns new tensors and never modifies its inputs. Aggregator classes
compose these; tests check them against small hand-computed cases.

The conflict-averse update solves a small N×N problem on the CPU: only its N×N Gram matrix
leaves the device; the [N, P] work stays on the inputs' device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fedmtl.aggregation.flat import FlatLayout


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


# --- Gram matrices ----------------------------------------------------------------------

# Columns per float64 chunk in gram_matrix. CPU: [M, 2**16] float64 is M × 512 KiB, small
# enough to stay in cache between the conversion and the products. GPU: fewer, larger chunks
# (M × 8 MiB) keep the number of kernel launches small.
_GRAM_CHUNK_CPU, _GRAM_CHUNK_GPU = 1 << 16, 1 << 20
# A chunk is multiplied as this many column blocks in one batched product (bmm), then summed:
# BLAS runs a single [M, C] × [C, M] product with tiny M on one core and slowly; batched
# small products run in parallel (measured 2x faster on a 2-core CPU).
_GRAM_BLOCKS = 16


def gram_matrix(rows: Tensor | Sequence[Tensor], chunk_size: int | None = None) -> Tensor:
    """G = X Xᵀ in float64: [M, M] on X's device, for X the rows [M, P].

    ``rows`` is one stack [M, P] or several [m_j, P] on one device, taken as stacked row-wise
    without being concatenated (e.g. a round's deltas plus last round's update). The product
    of two float32 (or lower) numbers is exact in float64, so G carries only float64
    rounding from the sums. The rows are converted to float64 ``chunk_size`` columns at a
    time (default 2**16 on the CPU, 2**20 on a GPU), so memory beyond the inputs stays at
    about 2 × M × chunk_size float64 numbers.
    Deterministic: the summation order depends on the shapes only.
    """
    blocks = [rows] if isinstance(rows, Tensor) else list(rows)
    if not blocks:
        raise ValueError("gram_matrix needs at least one [m, P] block of rows")
    for block in blocks:
        if block.ndim != 2 or not block.is_floating_point():
            raise ValueError(
                f"gram_matrix takes floating-point blocks [m, P], got {block.dtype} {tuple(block.shape)}"
            )
    width, device = blocks[0].shape[1], blocks[0].device
    if any(b.shape[1] != width or b.device != device for b in blocks):
        raise ValueError(
            "gram_matrix blocks must share their column count and device, got "
            f"{[(tuple(b.shape), str(b.device)) for b in blocks]}"
        )
    if chunk_size is None:
        chunk_size = _GRAM_CHUNK_CPU if device.type == "cpu" else _GRAM_CHUNK_GPU
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    m = sum(b.shape[0] for b in blocks)
    out = torch.zeros(m, m, dtype=torch.float64, device=device)
    parts = _GRAM_BLOCKS if chunk_size % _GRAM_BLOCKS == 0 else 1
    size = chunk_size // parts  # columns per part
    full = width // chunk_size * chunk_size
    if full:
        buffer = torch.empty(parts, m, size, dtype=torch.float64, device=device)
        for start in range(0, full, chunk_size):
            row = 0
            for block in blocks:  # columns [start, start + chunk) as [parts, rows, size]
                chunk = block[:, start : start + chunk_size].reshape(block.shape[0], parts, size)
                buffer[:, row : row + block.shape[0]].copy_(chunk.transpose(0, 1))
                row += block.shape[0]
            out += torch.bmm(buffer, buffer.transpose(1, 2)).sum(dim=0)
    if full < width:  # the last columns, fewer than a chunk
        tail = torch.cat([b[:, full:] for b in blocks]).to(torch.float64)
        out.addmm_(tail, tail.T)
    return out


# --- Hyper Conflict-Averse encoder aggregation (FedHCA², Eq. 6-9; suppl. Alg. 1) ----------

# ‖g_w‖ below this fraction of the clients' root-mean-square update norm means the weighted
# updates cancel: g_w has no reliable direction (a float32 g_w is only accurate to ~N·1e-7 of
# the norms), so the c'·g_w/‖g_w‖ term is dropped, as the public code's +1e-8 does for g_w = 0.
_CANCELLED = 1e-6


def conflict_averse_weights(gram: Tensor, c: float = 0.4) -> Tensor:
    """The simplex weights w* [N] (float64, CPU) of the conflict-averse update, from G = D Dᵀ.

    Minimises F(w) = wᵀ G (𝟙/N) + c'·sqrt(wᵀ G w) subject to w ≥ 0, Σ w = 1, where
    c' = c·‖ḡ‖ and ‖ḡ‖ = sqrt(mean of G) is the norm of the mean update (FedHCA² Eq. 7-8;
    docs/methods.md, FedHCA2). F is convex. The N×N problem
    is scaled by the mean squared update norm (so tolerances do not depend on the updates'
    scale) and solved on the CPU by SLSQP from 𝟙/N, as the public code does, but with the
    analytic gradient and ftol 1e-15, then polished by Newton steps on the optimality
    conditions of the face SLSQP stops on (SLSQP alone leaves w off by ~1e-9; polished, the
    Frank-Wolfe gap is at float64 rounding). The uniform weights and the simplex vertices
    are kept as fall-backs, so w* is never worse than any of them. Deterministic for a
    given G. All-zero updates give 𝟙/N.
    """
    from scipy import optimize  # here, not at the top: a slow import that `fedmtl fit --help` skips

    g = _host_gram(gram)
    n = g.shape[0]
    _check_c(c)
    uniform = np.full(n, 1.0 / n)
    scale = float(np.trace(g)) / n  # mean squared update norm
    if n == 1 or not scale > 0:
        return torch.from_numpy(uniform)
    g = g / scale
    b = g.mean(axis=1)  # G 𝟙/N
    c_scaled = c * math.sqrt(max(float(g.mean()), 0.0))  # c' in the scaled problem

    def objective(w: np.ndarray) -> float:
        return float(w @ b) + c_scaled * math.sqrt(max(float(w @ g @ w), 0.0))

    def gradient(w: np.ndarray) -> np.ndarray:
        gw = g @ w
        norm = math.sqrt(max(float(w @ gw), 0.0))
        return b + c_scaled * gw / norm if norm > 0 else b.copy()

    def hessian(w: np.ndarray) -> np.ndarray | None:
        gw = g @ w
        norm = math.sqrt(max(float(w @ gw), 0.0))
        return c_scaled * (g / norm - np.outer(gw, gw) / norm**3) if norm > 0 else None

    result = optimize.minimize(
        objective,
        uniform,
        jac=gradient,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones_like(w)}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    best = uniform
    if np.all(np.isfinite(result.x)):
        solved = np.clip(result.x, 0.0, None)
        if solved.sum() > 0:
            best = _polish(solved / solved.sum(), objective, gradient, hessian)
    best_value = objective(best)
    for candidate in [uniform, *np.eye(n)]:
        value = objective(candidate)
        if value < best_value - 1e-12:  # the solver's answer wins ties
            best, best_value = candidate, value
    return torch.from_numpy(np.array(best, dtype=np.float64))


def _polish(
    w: np.ndarray,
    objective: Callable[[np.ndarray], float],
    gradient: Callable[[np.ndarray], np.ndarray],
    hessian: Callable[[np.ndarray], np.ndarray | None],
) -> np.ndarray:
    """Newton steps on the KKT conditions of the simplex face SLSQP stopped on.

    SLSQP stops on a change of F, which leaves w accurate to about sqrt(ftol); on the face
    {w_i = 0 off the support, Σ w = 1} the optimum solves ∇F_S = λ𝟙, which Newton's method
    reaches to float64 precision in a few steps. A step is kept only while w stays on the
    simplex, the Frank-Wolfe gap ∇F(w)ᵀw − min_j ∇F(w)_j (zero exactly at the optimum of a
    convex F) shrinks, and F does not grow.
    """

    def gap(x: np.ndarray) -> float:
        grad = gradient(x)
        return float(grad @ x - grad.min())

    w = np.where(w > 1e-12, w, 0.0)
    w = w / w.sum()
    best_gap = gap(w)
    for _ in range(10):
        support = np.flatnonzero(w)
        curvature = hessian(w)
        if len(support) < 2 or curvature is None:
            break  # a vertex, or g_w = 0 where F is not differentiable: keep w
        m = len(support)
        kkt = np.zeros((m + 1, m + 1))
        kkt[:m, :m] = curvature[np.ix_(support, support)]
        kkt[:m, m] = kkt[m, :m] = 1.0
        rhs = np.concatenate([-gradient(w)[support], [0.0]])
        step = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:m]
        candidate = w.copy()
        candidate[support] += step
        if candidate.min() < 0:
            break
        candidate /= candidate.sum()
        candidate_gap = gap(candidate)
        if not (candidate_gap < best_gap and objective(candidate) <= objective(w) + 1e-15):
            break
        w, best_gap = candidate, candidate_gap
    return w


def conflict_averse_coefficients(
    gram: Tensor, c: float = 0.4, rescale: bool = True, weights: Tensor | None = None
) -> Tensor:
    """v [N] (float64, CPU) such that the conflict-averse update is Ũ = Σ_i v_i Δ_i = vᵀ D.

    Ũ = (ḡ + c'/‖g_w‖ · g_w) / (1 + c²) with ḡ = mean_i Δ_i, g_w = Σ_i w*_i Δ_i (FedHCA² Eq. 9
    with CAGrad's default rescaling; without the division when ``rescale`` is False), so
    v = (𝟙/N + c'/‖g_w‖ · w*) / (1 + c²). Norms come from G: ‖ḡ‖² = mean(G),
    ‖g_w‖² = w*ᵀ G w*. ``weights`` defaults to :func:`conflict_averse_weights`.
    If the weighted updates cancel (‖g_w‖ ≤ 1e-6 × the rms update norm, including all-zero
    updates) the g_w term is dropped and v = 𝟙/N (divided by 1 + c² when ``rescale``).
    """
    g = _host_gram(gram)
    n = g.shape[0]
    _check_c(c)
    w = conflict_averse_weights(gram, c) if weights is None else weights.detach().to("cpu", torch.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must have shape [{n}], got {tuple(w.shape)}")
    w = w.numpy()
    coefficients = np.full(n, 1.0 / n)
    mean_sq = float(np.trace(g)) / n
    c_prime = c * math.sqrt(max(float(g.mean()), 0.0))
    gw_sq = float(w @ g @ w)
    if c_prime > 0 and gw_sq > _CANCELLED**2 * mean_sq:
        coefficients = coefficients + (c_prime / math.sqrt(gw_sq)) * w
    if rescale:
        coefficients = coefficients / (1.0 + c * c)
    return torch.from_numpy(coefficients)


def conflict_averse_update(deltas: Tensor, c: float = 0.4, rescale: bool = True) -> Tensor:
    """The Hyper Conflict-Averse aggregated update Ũ [P] of the client updates ``deltas`` [N, P].

    FedHCA² (Lu et al., CVPR 2024) Eq. 6-9 and suppl. Alg. 1, after CAGrad (Liu et al.,
    NeurIPS 2021): Ũ maximises the worst client's agreement min_i ⟨Δ_i, Ũ⟩ within the ball
    ‖Ũ − ḡ‖ ≤ c‖ḡ‖ around the mean update ḡ, then is divided by (1 + c²) when ``rescale``
    (the public code's default). So ‖(1 + c²)Ũ − ḡ‖ = c‖ḡ‖; c = 0 gives ḡ; N identical
    updates Δ give (1 + c)/(1 + c²)·Δ (without rescaling (1 + c)·Δ); all-zero updates give 0.

    The Gram matrix is accumulated in float64 (:func:`gram_matrix`), the N×N problem solved
    on the CPU (:func:`conflict_averse_weights`), and Ũ = vᵀ D formed in one pass in
    ``deltas``' dtype and device. A new tensor; ``deltas`` is not modified.
    """
    if deltas.ndim != 2 or deltas.shape[0] == 0:
        raise ValueError(f"conflict_averse_update takes a stack [N, P], got shape {tuple(deltas.shape)}")
    coefficients = conflict_averse_coefficients(gram_matrix(deltas), c, rescale)
    return coefficients.to(device=deltas.device, dtype=deltas.dtype) @ deltas


def _host_gram(gram: Tensor) -> np.ndarray:
    """A Gram matrix as a symmetric float64 NumPy array (BLAS may leave G a hair asymmetric)."""
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or gram.shape[0] == 0:
        raise ValueError(f"a Gram matrix is square [N, N] with N >= 1, got shape {tuple(gram.shape)}")
    g = gram.detach().to("cpu", torch.float64).numpy()
    if not np.all(np.isfinite(g)):
        raise ValueError("the Gram matrix of the updates is not finite (an update holds inf or nan)")
    return (g + g.T) / 2


def _check_c(c: float) -> None:
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")


# --- Hyper Cross-Attention decoder aggregation (FedHCA², Eq. 12-13; suppl. Alg. 2) --------


def cross_attention_update(deltas: Tensor) -> Tensor:
    """Cross-attention over K decoders' updates of one parameter tensor: [K, *shape] -> [K, *shape].

    With V = ``deltas`` viewed [K, d] (d elements per decoder), A = softmax(V Vᵀ / sqrt(d)) V,
    softmax over the K decoders (FedHCA² Eq. 12-13): decoder k's aggregated update A_k mixes
    all K updates, weighted by their agreement with its own. Scores and the mix are computed
    in float64, the result is returned in ``deltas``' dtype (a new tensor). K = 1 gives the
    update itself; permuting the decoders permutes the result.
    """
    if deltas.ndim < 1 or deltas.shape[0] == 0 or deltas[0].numel() == 0:
        raise ValueError(
            f"cross_attention_update takes K >= 1 non-empty updates [K, *shape], got {tuple(deltas.shape)}"
        )
    return _attend(deltas.reshape(deltas.shape[0], -1)).view(deltas.shape)


def cross_attention_update_flat(deltas: Tensor, layout: FlatLayout) -> Tensor:
    """:func:`cross_attention_update` of every parameter tensor of stacked flat decoders.

    ``deltas`` [K, Q] are K decoders' flat updates laid out by ``layout``; the result [K, Q]
    holds each tensor's attention-mixed update in place of the tensor (a new tensor).

    One loop over the layout's parameter tensors (12 for the FCN decoder): each is a
    [K, d] view, and its attention is two small matrix products on it. Attention needs one
    K×K softmax per tensor; a loop-free segment sum would materialise K² products per
    element ([K, K, Q], 81 times the decoder stack for K = 9) for the same result.
    """
    if deltas.ndim != 2 or deltas.shape[0] == 0:
        raise ValueError(f"cross_attention_update_flat takes a stack [K, Q], got shape {tuple(deltas.shape)}")
    out = torch.empty_like(deltas, memory_format=torch.contiguous_format)
    for part, target in zip(layout.split(deltas), layout.split(out), strict=True):
        target.copy_(_attend(part))
    return out


def _attend(v: Tensor) -> Tensor:
    """softmax(V Vᵀ / sqrt(d)) V for V [K, d], computed in float64, returned in V's dtype."""
    x = v.to(torch.float64)
    scores = (x @ x.T) / math.sqrt(v.shape[1])
    return (torch.softmax(scores, dim=-1) @ x).to(v.dtype)


# --- Means within groups (FedAvg's scopes, MaT-FL's clusters) ------------------------------


def group_means(
    prev: Tensor, deltas: Tensor, groups: Sequence[Sequence[int]], weights: Sequence[float] | None = None
) -> Tensor:
    """Every row of a group replaced by the group's mean trained row: [M, D] -> [M, D] (new).

    Row m of the result is mean_{j ∈ g}(prev_j + deltas_j) for the group g holding m (weighted
    by ``weights`` [M] when given); rows in no group keep prev_m + deltas_m. Groups must not
    overlap. ``targets`` of a group are its members; see :func:`group_means_to` to write a
    group's mean into rows outside it (non-participants of a round).
    """
    return group_means_to(prev, deltas, [(g, g) for g in groups], weights)


def group_means_to(
    prev: Tensor,
    deltas: Tensor,
    groups: Sequence[tuple[Sequence[int], Sequence[int]]],
    weights: Sequence[float] | None = None,
) -> Tensor:
    """Like :func:`group_means`, with (sources, targets) pairs: the mean of the source rows'
    trained parameters is written into the target rows. Rows that are no target keep
    prev_m + deltas_m; a row may be the target of one group only.

    The mean is mean(prev) + mean(deltas), by linearity, so a group of all rows costs no
    [M, D] temporary (and gives the same bits as FedAvg's mean of the whole stack).
    """
    if prev.shape != deltas.shape or prev.ndim != 2:
        raise ValueError(
            f"prev and deltas must be equal stacks [M, D], got {tuple(prev.shape)}, {tuple(deltas.shape)}"
        )
    m = prev.shape[0]
    means: list[tuple[list[int], Tensor]] = []
    seen: set[int] = set()
    for sources, targets in groups:
        sources, targets = [int(i) for i in sources], [int(i) for i in targets]
        if not sources or not targets:
            continue
        if not all(0 <= i < m for i in (*sources, *targets)):
            raise ValueError(f"group ({sources}, {targets}) names a row outside 0..{m - 1}")
        if seen & set(targets):
            raise ValueError(f"rows {sorted(seen & set(targets))} are targets of two groups")
        seen |= set(targets)
        w = None if weights is None else [weights[i] for i in sources]
        if sources == list(range(m)):
            mean = mean_rows(prev, w) + mean_rows(deltas, w)
        else:
            index = torch.tensor(sources, device=prev.device)
            mean = mean_rows(prev.index_select(0, index), w) + mean_rows(deltas.index_select(0, index), w)
        means.append((targets, mean))
    out = torch.empty_like(prev)
    kept = [i for i in range(m) if i not in seen]  # rows no group writes: their trained values
    if kept:
        index = torch.tensor(kept, device=prev.device)
        out[index] = prev.index_select(0, index) + deltas.index_select(0, index)
    for targets, mean in means:
        out[targets] = mean
    return out


# --- FedAMP's attentive message passing (Huang et al., AAAI 2021) --------------------------


def squared_distances(gram: Tensor) -> Tensor:
    """d_ij = ‖w_i − w_j‖² = G_ii + G_jj − 2 G_ij from a float64 Gram matrix G [M, M] (≥ 0)."""
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be square [M, M], got {tuple(gram.shape)}")
    diag = gram.diagonal()
    return (diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0).fill_diagonal_(0)


def fedamp_weights(gram: Tensor, alpha_k: float = 1.0, sigma: float = 1.0) -> Tensor:
    """FedAMP's message-passing weights ξ [M, M] (float64) from the Gram matrix of M models.

    With A(x) = 1 − e^{−x/σ}: ξ_ij = α_k·e^{−d_ij/σ}/σ for j ≠ i and ξ_ii = 1 − Σ_{j≠i} ξ_ij,
    d_ij = ‖w_i − w_j‖² (docs/methods.md, FedAMP). Rows sum to 1; ξ_ii may be negative (nearly equal
    models with α_k/σ = 1 extrapolate beyond the convex hull) and is *not* clipped, as in the
    public implementations. Distances come from the float64 Gram (G_ii + G_jj − 2G_ij).
    """
    if not (alpha_k > 0 and sigma > 0):
        raise ValueError(f"alpha_k and sigma must be > 0, got {alpha_k!r}, {sigma!r}")
    distances = squared_distances(gram.to(torch.float64))
    xi = alpha_k * torch.exp(-distances / sigma) / sigma
    xi.fill_diagonal_(0)
    xi += torch.diag(1 - xi.sum(dim=1))
    return xi


def heuristic_fedamp_weights(gram: Tensor, sigma: float = 1.0, self_weight: float = 0.5) -> Tensor:
    """HeurFedAMP's weights ξ [M, M] (float64): ξ_ii = ``self_weight`` and, for j ≠ i,
    ξ_ij = (1 − ξ_ii)·e^{σ·cos(w_i, w_j)} / Σ_{h≠i} e^{σ·cos(w_i, w_h)} (a softmax of
    scaled cosine similarities over the other models). One model keeps itself (ξ = 1)."""
    if not (sigma > 0 and 0 <= self_weight <= 1):
        raise ValueError(f"sigma must be > 0 and self_weight in [0, 1], got {sigma!r}, {self_weight!r}")
    g = gram.to(torch.float64)
    m = g.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    norms = g.diagonal().clamp_min(0).sqrt()
    cosine = g / (norms[:, None] * norms[None, :]).clamp_min(torch.finfo(torch.float64).tiny)
    logits = (sigma * cosine).masked_fill(torch.eye(m, dtype=torch.bool), float("-inf"))
    xi = (1 - self_weight) * torch.softmax(logits, dim=1)
    return xi + torch.diag(torch.full((m,), float(self_weight), dtype=torch.float64))


def mix_rows(weights: Tensor, prev: Tensor, deltas: Tensor) -> Tensor:
    """Σ_j weights_ij (prev_j + deltas_j) for every i: [M, M] × [M, D] -> [M, D] in the rows'
    dtype and device, without a temporary [M, D] sum."""
    w = weights.to(device=prev.device, dtype=prev.dtype)
    return torch.addmm(w @ prev, w, deltas)


# --- MaT-FL's grouping (Cai et al., 2022; VITA-Group/MaT-FL dg_utils.py) -----------------


def cosine_clusters(gram: Tensor, num_clusters: int) -> list[list[int]]:
    """Agglomerative clustering of M models' deviations from their mean: cosine distance,
    average linkage, cut at ``num_clusters`` clusters (MaT-FL's grouping).

    ``gram`` [M, M] is the Gram matrix of the models themselves; the deviations' Gram is
    C G C with C = I − 𝟙𝟙ᵀ/M, so no deviation vector is formed. Returns the clusters as
    sorted lists of row indices, ordered by their first member. A deviation of norm 0 makes
    the cosine undefined: then every model is one cluster (FedAvg; docs/methods.md, MaTFL).
    """
    from scipy.cluster import hierarchy

    m = gram.shape[0]
    if not 1 <= num_clusters <= m:
        raise ValueError(f"num_clusters must be between 1 and the number of models ({m}), got {num_clusters}")
    if num_clusters == m:
        return [[i] for i in range(m)]
    g = gram.to(torch.float64).cpu()
    centring = torch.eye(m, dtype=torch.float64) - 1.0 / m
    deviations = centring @ g @ centring
    norms = deviations.diagonal().clamp_min(0).sqrt()
    if num_clusters == 1 or bool((norms <= 1e-12 * norms.max().clamp_min(1e-300)).any()):
        return [list(range(m))]
    cosine = deviations / (norms[:, None] * norms[None, :])
    distance = (1 - cosine).clamp_min(0).fill_diagonal_(0)
    distance = (distance + distance.T) / 2
    condensed = distance.numpy()[np.triu_indices(m, k=1)]
    labels = hierarchy.cut_tree(hierarchy.linkage(condensed, method="average"), n_clusters=num_clusters)[:, 0]
    clusters: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        clusters.setdefault(label, []).append(i)
    return sorted(clusters.values(), key=lambda members: members[0])
