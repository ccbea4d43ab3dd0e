"""Secure aggregation (Bonawitz et al. 2017) simulated exactly: what the server learns when
clients mask their updates with pairwise masks that cancel in the sum (docs/privacy.md).

Each update is quantised to fixed point (FRACTION_BITS fraction bits) in the ring of integers
mod 2^RING_BITS, held in int64 tensors. Members i < j share a mask drawn from a seed of
(run seed, round, key, i, j); i adds it and j subtracts it, so each masked update alone is
uniform in the ring while the modular sum of all of them is the sum of the quantised updates,
exactly. The server's sum then differs from the plain float sum by rounding alone, at most
quantisation_bound(members). Dropouts and the key agreement of the real protocol are not
simulated: every member of a group reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedmtl.seeds import derive_seed

__all__ = [
    "FRACTION_BITS",
    "MASK_CHUNK",
    "RING_BITS",
    "check_range",
    "dequantise",
    "masked_input",
    "pair_mask",
    "quantisation_bound",
    "quantise",
    "secure_sum",
    "unmasked_sum",
]

RING_BITS = 32
FRACTION_BITS = 16
MASK_CHUNK = 2**20  # columns of a pair's mask drawn from one generator, so block reads agree

_RING = 2**RING_BITS
_SCALE = 2.0**FRACTION_BITS
_HALF = 2 ** (RING_BITS - 1)


def quantise(x: torch.Tensor) -> torch.Tensor:
    """x as fixed point: round(x·2^FRACTION_BITS) mod 2^RING_BITS, int64 in [0, 2^RING_BITS)."""
    fixed = torch.round(x.detach().to(torch.float64) * _SCALE).to(torch.int64)
    return torch.remainder(fixed, _RING)


def dequantise(s: torch.Tensor) -> torch.Tensor:
    """The float64 value of ring elements; the ring's upper half holds the negative values."""
    s = torch.remainder(s, _RING)
    return torch.where(s >= _HALF, s - _RING, s).to(torch.float64) / _SCALE


def quantisation_bound(members: int) -> float:
    """The largest absolute error of the secure sum of members values, entrywise: each value
    is rounded to the nearest multiple of 2^-FRACTION_BITS, off by at most half of one."""
    return members * 2.0 ** -(FRACTION_BITS + 1)


def check_range(x: torch.Tensor, members: int, what: str) -> None:
    """Refuse, in one line, values whose sum over members could leave the ring's signed range
    [-2^(RING_BITS-1), 2^(RING_BITS-1)) and wrap around, silently corrupting the sum."""
    limit = 2.0 ** (RING_BITS - 1 - FRACTION_BITS)
    largest = float(x.detach().abs().max()) if x.numel() else 0.0
    if not math.isfinite(largest):
        raise ValueError(
            f"{what} has a non-finite entry, which secure aggregation cannot encode: "
            "lower the learning rate or set a finite privacy.clip"
        )
    # round() is monotone, so the largest quantised magnitude is that of the largest entry.
    if members * round(largest * _SCALE) > _HALF - 1:
        raise ValueError(
            f"{what} has an entry of magnitude {largest:g}; summed over {members} members it could reach "
            f"{largest * members:g}, outside secure aggregation's range ±{limit:g} ({RING_BITS}-bit fixed point "
            f"with {FRACTION_BITS} fraction bits): set privacy.clip below {limit / members:g}"
        )


def pair_mask(seed: int, round_: int, key: str, i: int, j: int, numel: int, offset: int = 0) -> torch.Tensor:
    """Columns [offset, offset+numel) of the mask members i and j share in round round_ for the
    tensor named key: int64 uniform in the ring, the same whichever of i, j asks and however
    the columns are read in blocks (each MASK_CHUNK columns come from their own generator)."""
    low, high = min(i, j), max(i, j)
    if numel == 0:
        return torch.zeros(0, dtype=torch.int64)
    first, last = offset // MASK_CHUNK, (offset + numel - 1) // MASK_CHUNK
    chunks = []
    for chunk in range(first, last + 1):
        generator = torch.Generator().manual_seed(derive_seed(seed, "secagg", round_, key, low, high, chunk))
        chunks.append(torch.randint(0, _RING, (MASK_CHUNK,), generator=generator, dtype=torch.int64))
    start = offset - first * MASK_CHUNK
    return torch.cat(chunks)[start : start + numel]


def masked_input(
    x: torch.Tensor, me: int, members: Sequence[int], seed: int, round_: int, key: str, offset: int = 0
) -> torch.Tensor:
    """What member me sends: quantise(x) + Σ_{j>me} mask(me, j) − Σ_{j<me} mask(j, me), mod
    2^RING_BITS (int64, x's shape flattened)."""
    if me not in members:
        raise ValueError(f"secure aggregation: member {me} is not among the group's members {list(members)}")
    out = quantise(x.reshape(-1))
    for j in members:
        if j == me:
            continue
        mask = pair_mask(seed, round_, key, me, j, out.numel(), offset)
        out = out + mask if j > me else out - mask
    return torch.remainder(out, _RING)


def unmasked_sum(masked: torch.Tensor) -> torch.Tensor:
    """The server's view: the modular sum of the masked inputs [m, D], in which the masks
    cancel, dequantised (float64 [D])."""
    return dequantise(torch.remainder(masked.sum(0), _RING))


def secure_sum(
    values: torch.Tensor, members: Sequence[int], seed: int, round_: int, key: str, offset: int = 0
) -> torch.Tensor:
    """The sum of values [m, D] (row k from members[k]) as secure aggregation gives it to the
    server: each row masked as its member would mask it, summed in the ring, dequantised
    (float64 [D]); within quantisation_bound(m) of the plain sum."""
    if values.shape[0] != len(members):
        raise ValueError(f"secure aggregation: {values.shape[0]} rows of values for {len(members)} members")
    check_range(values, len(members), f"the update {key!r}")
    masked = torch.stack(
        [
            masked_input(row, me, members, seed, round_, key, offset)
            for row, me in zip(values, members, strict=True)
        ]
    )
    return unmasked_sum(masked)
