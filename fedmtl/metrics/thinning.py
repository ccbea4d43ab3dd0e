"""Morphological thinning of a binary map to 1-pixel-wide lines, as the boundary benchmark does.

The BSDS benchmark thins every binarised prediction with MATLAB's ``bwmorph(·, 'thin', Inf)``,
i.e. the two-sub-iteration algorithm of Guo & Hall (1989) as given by Lam, Lee & Suen (1992).
``skimage.morphology.thin`` implements the same algorithm; :func:`thin` returns exactly its
output (tested on random maps) but is 3-30x faster on large foreground regions, which matters
because odsF thins 99 maps per image.

The speed comes from visiting only pixels whose 3x3 neighbourhood can have changed: a pixel
kept by a sub-iteration's rule is kept again by the same rule unless one of its 8 neighbours
was deleted in between, so sub-iteration k only re-examines the neighbours of the pixels deleted
in sub-iterations k-1 and k-2. skimage instead correlates the whole image on every pass.
"""

from __future__ import annotations

import numpy as np

# Neighbours x1 … x8 of the papers: east, then counter-clockwise. Bit i-1 of a pixel's 8-bit
# neighbourhood code is x_i (the same encoding as skimage's correlation mask).
_NEIGHBOURS = ((0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1), (1, 0), (1, 1))


def _deletion_tables() -> tuple[np.ndarray, np.ndarray]:
    """For each of the 256 neighbourhood codes: is the centre pixel deleted in sub-iteration 1 / 2?

    Conditions (Lam, Lee & Suen 1992, algorithm of Guo & Hall), indices of x taken mod 8:
      G1: X_H = Σ_{i=1..4} [x_{2i-1} = 0 and (x_{2i} = 1 or x_{2i+1} = 1)] equals 1,
      G2: 2 <= min(n1, n2) <= 3, n1 = Σ_k (x_{2k-1} or x_{2k}), n2 = Σ_k (x_{2k} or x_{2k+1}),
      G3: (x2 or x3 or not x8) and x1 is false (sub-iteration 1),
      G3': (x6 or x7 or not x4) and x5 is false (sub-iteration 2).
    """
    codes = np.arange(256)

    def x(i: int) -> np.ndarray:
        return ((codes >> ((i - 1) % 8)) & 1).astype(bool)

    x_h = sum((~x(2 * i - 1) & (x(2 * i) | x(2 * i + 1))).astype(int) for i in range(1, 5))
    n1 = sum((x(2 * k - 1) | x(2 * k)).astype(int) for k in range(1, 5))
    n2 = sum((x(2 * k) | x(2 * k + 1)).astype(int) for k in range(1, 5))
    n = np.minimum(n1, n2)
    g1_g2 = (x_h == 1) & (n >= 2) & (n <= 3)
    g3 = ~((x(2) | x(3) | ~x(8)) & x(1))
    g3_prime = ~((x(6) | x(7) | ~x(4)) & x(5))
    return g1_g2 & g3, g1_g2 & g3_prime


_DELETE_1, _DELETE_2 = _deletion_tables()
_BIT_WEIGHTS = (1 << np.arange(8)).astype(np.int32)


def thin(image: np.ndarray) -> np.ndarray:
    """Thin a 2-D binary map until it no longer changes; returns a bool array of the same shape.

    Pixels outside the image count as background (as in skimage and MATLAB).
    """
    if image.ndim != 2:
        raise ValueError(f"thin expects a 2-D map, got shape {image.shape}")
    h, w = image.shape
    width = w + 2
    skel = np.zeros((h + 2, width), dtype=np.uint8)  # 1-pixel background frame: no bounds checks
    skel[1:-1, 1:-1] = image != 0
    flat = skel.ravel()
    offsets = np.array([dr * width + dc for dr, dc in _NEIGHBOURS])
    stamp = np.empty(flat.size, dtype=np.int64)  # scratch for an O(n) de-duplication

    def foreground_unique(idx: np.ndarray) -> np.ndarray:
        idx = idx[flat[idx] == 1]
        order = np.arange(idx.size)
        stamp[idx] = order  # the last write wins: keep exactly one copy of each index
        return idx[stamp[idx] == order]

    candidates = np.flatnonzero(flat)
    touched_prev = np.empty(0, dtype=np.int64)
    step, idle_steps = 0, 0
    while idle_steps < 2:  # two sub-iterations in a row without deletion: nothing can change any more
        table = _DELETE_1 if step % 2 == 0 else _DELETE_2
        codes = flat[candidates[:, None] + offsets].astype(np.int32) @ _BIT_WEIGHTS
        deleted = candidates[table[codes]]
        flat[deleted] = 0  # all deletions of a sub-iteration are decided first, then applied
        idle_steps = 0 if deleted.size else idle_steps + 1
        touched = (deleted[:, None] + offsets).ravel()
        if step == 0:
            # No pixel has been judged by the second table yet: it must see all survivors.
            next_candidates = candidates[flat[candidates] == 1]
        else:
            next_candidates = foreground_unique(np.concatenate([touched, touched_prev]))
        candidates, touched_prev = next_candidates, touched
        step += 1
    return skel[1:-1, 1:-1].astype(bool)
