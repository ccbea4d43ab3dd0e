"""FedDEA's update transform (arXiv 2505.24185; docs/methods.md, FedDEA): in each
update keep the k = ⌈ρ·D⌉ entries of largest magnitude, zero the rest, rescale by 1/ρ.

The selection is exact — the same set as a full sort — but costs a few passes over the row
instead of a sort, because an exact ``torch.topk`` of a 27.5 M-entry encoder update takes
tens of times a copy of it. For each row:

1. ``|Δ|`` is written into the output row (so the row's memory is touched once, as a copy
   would), and a fixed-seed random sample of it gives an interval [lo, hi] that holds the
   k-th largest magnitude with overwhelming probability (a 6σ margin on the sample rank).
2. One pass counts the entries above ``hi`` (all kept); a second marks the candidates in
   [lo, hi]. If the count shows the interval missed, the row is redone with [0, ∞], which
   is always exact; the sample therefore changes the speed, never the result.
3. Among the few candidates, ``kthvalue`` finds the exact threshold; ties at it are taken
   by lowest index.
4. The output row becomes ``Δ * (1/ρ)`` with everything else zeroed.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

# Rows of at most this many entries skip sampling: their exact selection is cheap already.
_DIRECT_MAX = 1 << 15
# Sample size: at most 2**16 entries (its gather and selection cost well under a copy of a large
# row), and at least 1/8 of the row so that mid-sized rows get a narrow interval too.
_SAMPLE_MAX = 1 << 16
# Margin of the candidate interval, in standard deviations of the sample rank of the k-th
# largest entry: a miss (which costs a redo with an exact full selection) has probability
# about 1e-9 per row.
_SIGMAS = 6.0
_SEED = 0x5EED_DEA


def feddea_k(rho: float, d: int) -> int:
    """k = ⌈ρ·d⌉, the number of entries FedDEA keeps of a d-entry update (at least 1 if d > 0).

    ρ·d within float rounding (a relative 1e-9) of an integer counts as that integer, so
    ρ = 0.3, d = 10 keeps 3 entries, not the 4 that ``math.ceil(0.3 * 10)`` would give.
    """
    check_rho(rho)
    if d <= 0:
        return 0
    product = rho * d
    nearest = round(product)
    k = nearest if abs(product - nearest) <= 1e-9 * max(1.0, product) else math.ceil(product)
    return min(d, max(1, k))


def feddea_mask(updates: Tensor, rho: float, rescale: bool = True) -> Tensor:
    """FedDEA's transform of each row of ``updates`` [N, D]: a new tensor [N, D].

    In each row the k = ⌈ρ·D⌉ entries of largest |Δ| (see :func:`feddea_k` for the
    rounding) keep their value, multiplied by the Python float ``1/rho`` when ``rescale``
    (computed as ``Δ * (1 / rho)`` in the row's dtype, as torch does it); all other entries
    become +0. Exactly k entries are kept in every row: among entries tied at the
    threshold, those of lowest index are kept, so the kept set equals the first k positions
    of a stable descending sort of |Δ|. NaN counts as the largest magnitude (as in
    ``torch.sort``/``torch.topk``); ±inf is an ordinary magnitude.

    ρ = 1 returns a copy of ``updates``, bit-identical (nothing is masked, nothing is
    scaled). ``updates`` is never modified; any device and floating dtype (float16, bfloat16,
    float32, float64). ρ outside (0, 1] raises ValueError naming ``algorithm.rho``.

    Cost: a few passes over each row (about 4-5× a copy of it on one CPU thread for a
    27.5 M-entry float32 row, see ``benchmarks/feddea_mask.py``), against tens of times for
    ``torch.topk``. Extra memory: two bool masks of one row.
    """
    check_rho(rho)
    if updates.ndim != 2 or not updates.is_floating_point():
        raise ValueError(
            f"feddea_mask takes a floating-point stack of updates [N, D], got {updates.dtype} "
            f"{tuple(updates.shape)}"
        )
    if rho == 1:
        return updates.clone(memory_format=torch.contiguous_format)
    n, d = updates.shape
    out = torch.empty((n, d), dtype=updates.dtype, device=updates.device)
    if n == 0 or d == 0:
        return out
    k = feddea_k(rho, d)
    scale = 1.0 / rho if rescale else None
    generator = torch.Generator(device=updates.device)
    zero = torch.empty(d, dtype=torch.bool, device=updates.device)
    cand = torch.empty_like(zero)
    for i in range(n):
        _mask_row(updates[i], out[i], k, scale, generator, zero, cand)
    return out


def check_rho(rho: float) -> None:
    if isinstance(rho, bool) or not isinstance(rho, Real) or not 0 < float(rho) <= 1:
        raise ValueError(
            f"algorithm.rho must be a number in (0, 1] (the fraction of each update FedDEA keeps), "
            f"got {rho!r}; set algorithm.rho to e.g. 0.25"
        )


def _mask_row(
    x: Tensor,
    out: Tensor,
    k: int,
    scale: float | None,
    generator: torch.Generator,
    zero: Tensor,
    cand: Tensor,
) -> None:
    """Write FedDEA's transform of the row ``x`` [D] into ``out`` [D] (contiguous).

    ``zero`` and ``cand`` are [D] bool scratch rows; on return ``zero`` marks the entries that
    are zeroed unless listed in the selected indices.
    """
    d = x.numel()
    if k >= d:
        _write(x, out, scale, None, None)
        return
    a = torch.abs(x, out=out)  # |x| lives in the output row until the selection is done
    selected = None
    if d > _DIRECT_MAX:
        bounds = _sample_bounds(a, k, generator)
        if bounds is not None:
            selected = _select(a, k, *bounds, zero, cand)
    if selected is None:  # small row, or the sampled interval missed: exact over the whole row
        selected = _select(a, k, 0.0, math.inf, zero, cand)
    _write(x, out, scale, zero, selected)


def _sample_bounds(a: Tensor, k: int, generator: torch.Generator) -> tuple[float, float] | None:
    """An interval [lo, hi] of magnitudes that very probably holds the k-th largest of ``a``,
    from a fixed-seed random sample; None if the sample cannot give one (NaN at lo)."""
    d = a.numel()
    s = min(_SAMPLE_MAX, max(d // 8, 1024))
    generator.manual_seed(_SEED)
    positions = torch.randint(d, (s,), generator=generator, device=a.device)
    sample = a[positions]
    below = (d - k) / d  # fraction of entries below the k-th largest
    centre = below * s
    margin = math.ceil(_SIGMAS * math.sqrt(s * below * (1 - below))) + 2
    lo_pos, hi_pos = math.floor(centre) - margin, math.ceil(centre) + margin
    # Two O(s) selections instead of a sort; any NaN in the sample ranks last, as in a sort.
    lo = float(torch.kthvalue(sample, lo_pos + 1).values) if lo_pos >= 0 else 0.0
    hi = float(torch.kthvalue(sample, hi_pos + 1).values) if hi_pos < s else math.inf
    if math.isnan(lo):
        return None
    return lo, (math.inf if math.isnan(hi) else hi)


def _select(a: Tensor, k: int, lo: float, hi: float, zero: Tensor, cand: Tensor) -> Tensor | None:
    """The indices to keep in [lo, hi] for an exact top-k of ``a``, with ``zero`` = (a <= hi)
    marking everything else that is zeroed; None if the k-th largest is not in [lo, hi].

    With lo = 0, hi = ∞ this never returns None.
    """
    d = a.numel()
    torch.le(a, hi, out=zero)  # False for NaN: NaN is above every hi, as in topk
    above = d - int(torch.count_nonzero(zero))
    if above > k:
        if hi != math.inf:
            return None
        # More NaNs than k: keep the k NaNs of lowest index, zero everything else.
        nans = torch.nonzero(torch.isnan(a)).flatten()[:k]
        zero.fill_(True)
        return nans
    need = k - above
    if need == 0:
        return torch.empty(0, dtype=torch.long, device=a.device)
    torch.ge(a, lo, out=cand)
    cand.logical_and_(zero)
    idx = torch.nonzero(cand).flatten()  # ascending
    m = idx.numel()
    if m < need:
        return None
    if m == need or lo == hi:  # all candidates, or all tied: the lowest indices
        return idx[:need]
    vals = a[idx]
    threshold = torch.kthvalue(vals, m - need + 1).values  # the need-th largest candidate
    greater = vals > threshold
    n_greater = int(torch.count_nonzero(greater))
    tied = torch.nonzero(vals == threshold).flatten()[: need - n_greater]
    return torch.cat([idx[greater], idx[tied]])


def _write(x: Tensor, out: Tensor, scale: float | None, zero: Tensor | None, selected: Tensor | None) -> None:
    """out = x (times ``scale``), then zeroed where ``zero`` except at ``selected``."""
    if scale is None:
        out.copy_(x)
    else:
        torch.mul(x, scale, out=out)
    if zero is None:
        return
    out.masked_fill_(zero, 0)
    if selected is not None and selected.numel():
        kept = x[selected]
        out[selected] = kept if scale is None else kept * scale
