"""Structured-edge non-maximum suppression of an edge map, as the public odsF pipeline applies it.

FedHCA²'s edge maps are scored after ``nms_process.m`` of innovator-zero/seism (the author's
fork of SEISM; ``edge_evaluation.py --nms`` in innovator-zero/MTDP_Lib and
youngfish42/FMTL-Benchmark runs it and points seism at ``edge/nms/``). Per saved 8-bit PNG::

    x = double(imread(png)) / 255.0;
    E = convTri(single(x), 1);
    [Ox, Oy] = gradient2(convTri(E, 4));
    [Oxx, ~] = gradient2(Ox);
    [Oxy, Oyy] = gradient2(Oy);
    O = mod(atan(Oyy .* sign(-Oxy) ./ (Oxx + 1e-5)), pi);
    E = edgesNmsMex(E, O, 4, 5, 1.01, 4);
    imwrite(uint8(E * 255), nms_png)

(innovator-zero/seism ``nms_process.m``; both stored versions of the file, with and without a
``parpool``, have these lines and the arguments r = 4, s = 5, m = 1.01.) :func:`structured_edge_nms`
ports these lines; every step below names its source. MATLAB arrays are column-major and Piotr's
C code indexes ``I[x*h + y]``: x is the column, y the row. Here arrays are [H, W] = [y, x].

Sources and what was checked
----------------------------
* ``convTri`` — pdollar/toolbox ``channels/convTri.m`` and ``channels/private/convConst.cpp``
  (read). For 0 < r <= 1: the filter [1 p 1]/(2+p), p = 12/r/(r+2) - 2 (p = 2 at r = 1), mex
  ``convTri1``: a pass across columns ``T = nrm·((I[x-1] + p·I[x]) + I[x+1])`` with
  ``nrm = 1/((p+2)²)`` and the border column standing in for its missing neighbour, then a pass
  down rows ``(T[y-1] + p·T[y]) + T[y+1]``, the first/last row ``(1+p)·T[0] + T[1]`` /
  ``T[h-2] + (1+p)·T[h-1]``, all in float32. :func:`conv_tri` repeats these float32 operations
  in this order (verified against the C source, not against the binary: the SSE path uses the
  same operation order and no fused multiply-add). For integer r > 1 (only ``convTri(E, 4)``
  of the orientation): the filter [1 … r, r+1, r … 1]/(r+1)², "exactly equivalent" (convTri.m)
  to ``padarray(I, [r r], 'symmetric')`` followed by two 'valid' convolutions; the mex computes
  it with float32 running sums, here a direct float64 convolution rounded to float32 (assumed
  close enough: the two differ by a few float32 ulps, and this map only feeds the orientation).
  convTri.m switches to the MATLAB expression when ``2r+1 >= min(h, w)``; so does
  :func:`conv_tri` (symmetric padding, float64, rounded to float32).
* ``gradient2`` — pdollar/toolbox ``channels/gradient2.m`` / ``channels/private/gradientMex.cpp``
  ``grad1`` (read): Gx along x (columns), Gy along y (rows); ``(I[+1] - I[-1])·0.5`` inside,
  ``I[1] - I[0]`` and ``I[n-1] - I[n-2]`` at the borders, float32 — MATLAB's ``gradient``
  with unit spacing, i.e. ``numpy.gradient`` (tested). The mex rejects maps narrower than 2;
  here such an axis gets a zero derivative (assumed; never met by real images).
* Orientation — ``nms_process.m`` (read), evaluated in float32 (MATLAB mixes single and double
  as single). ``atan`` is computed in float64 and rounded to float32 (MATLAB's single-precision
  atan is assumed correctly rounded). ``mod(a, pi)`` with a in [-π/2, π/2] is ``a + single(pi)``
  for a < 0, else a. ``sign(0) = 0``: where ``Oxy`` is exactly 0 the orientation is 0 (compare
  along x), so a perfectly symmetric horizontal line is not thinned by the NMS, exactly as in
  MATLAB (the later ``bwmorph`` thinning of each thresholded map still thins it). A 0/0
  orientation (NaN) would make the C code read out of bounds; here it is taken as 0 (assumed).
* ``edgesNmsMex(E, O, r, s, m)`` — pdollar/edges ``private/edgesNmsMex.cpp`` (read; the fork
  keeps ``src/piotr_edges`` but its copy is not in the index, assumed unchanged): for every pixel
  with ``e = E0(x, y) != 0``: ``e *= m`` (float32), and for d = -r … r, d != 0, the pixel is set
  to 0 if ``e < interp(E0, x + d·cos O, y + d·sin O)``; kept pixels keep their unscaled E0 value.
  ``interp`` clamps x to [0, w - 1.001] and y to [0, h - 1.001] (the comparison in double, as
  in C), truncates to x0 = int(x), and sums ``I00·dx1·dy1 + I10·dx0·dy1 + I01·dx1·dy0 +
  I11·dx0·dy0`` left to right in float32 — repeated here in the same order. ``cos``/``sin`` of
  the float32 orientation: float64 rounded to float32 (glibc's ``cosf``/``sinf`` assumed
  correctly rounded). Then "suppress noisy edge estimates near boundaries": ``s = min(s, w/2,
  h/2)`` (integer division), column x < s and column w-1-x multiplied by ``x/float(s)``, then
  row y < s and row h-1-y by ``y/float(s)`` (so the outermost row and column become 0 and
  corners get both factors).
* ``uint8(E*255)`` — MATLAB conversion to uint8 rounds half away from zero and saturates
  (NaN -> 0); ``E*255`` is a single-precision product. :func:`matlab_uint8`.
* The input: ``double(png)/255`` rounded to single — :func:`structured_edge_nms` takes the uint8
  grey levels fedmtl already computes (:func:`fedmtl.metrics.edge.quantize_edge`).

Speed
-----
The arithmetic loops (``convTri``, ``gradient2``, the orientation ratio, ``edgesNmsMex``'s
interpolation, the uint8 conversion) are compiled with numba, element by element in the
operation order of the numpy code they replaced, without fast-math (so no reassociation or
fused multiply-add); ``edgesNmsMex`` stops at the first neighbour that suppresses a pixel (the
outcome is an OR over d). ``atan``, ``cos`` and ``sin`` stay numpy's: another implementation
could differ in the last bit. The numpy code is kept in ``tests/edge_reference.py``;
the tests check the grey levels, orientation and maps equal, bit for bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# nms_process.m: edgesNmsMex(E, O, 4, 5, 1.01, 4) — radius, boundary fade, multiplier (threads).
NMS_RADIUS = 4
NMS_BORDER = 5
NMS_MULTIPLIER = 1.01
_F32 = np.float32
_GREY_TO_SINGLE = (np.arange(256, dtype=np.float64) / 255.0).astype(_F32)


def conv_tri(image: np.ndarray, r: float) -> np.ndarray:
    """Piotr's ``convTri(I, r)`` of a 2-D float32 map (symmetric padding); float32 out."""
    image = np.asarray(image, dtype=_F32)
    if r == 0:
        return image.copy()
    if r < 0 or (r > 1 and r != int(r)):
        raise ValueError(f"convTri radius must be in (0, 1] or an integer, got {r}")
    h, w = image.shape
    if 0 < r <= 1 and 2 * r + 1 < min(h, w):  # convTri.m: the mex only when 2r+1 < min(h, w)
        return _conv_tri1_mex(image, _F32(12 / r / (r + 2) - 2))
    if r <= 1:
        p = 12 / r / (r + 2) - 2
        taps, r = np.array([1.0, p, 1.0]) / (2 + p), 1
    else:
        r = int(r)
        taps = np.concatenate([np.arange(1, r + 2), np.arange(r, 0, -1)]) / (r + 1) ** 2
    padded = np.pad(image.astype(np.float64), r, mode="symmetric")  # = padarray(…, 'symmetric')
    return _separable_valid_conv(padded, np.asarray(taps, dtype=np.float64))


@numba.njit(cache=True, nogil=True)
def _separable_valid_conv(padded: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """'valid' convolution with ``taps`` along x, then along y, in float64, rounded to float32.

    Each output is accumulated from 0.0 tap by tap in order, i.e. numpy's
    ``sum(t * padded[:, k : k + w] for k, t in enumerate(taps))`` element by element (the
    bit-identical float64 sums of the earlier numpy code, without its temporaries).
    """
    n = taps.size
    h, w = padded.shape[0] - n + 1, padded.shape[1] - n + 1
    rows = np.empty((padded.shape[0], w), dtype=np.float64)
    for y in range(padded.shape[0]):
        for x in range(w):
            acc = 0.0
            for k in range(n):
                acc += taps[k] * padded[y, x + k]
            rows[y, x] = acc
    out = np.empty((h, w), dtype=np.float32)
    for y in range(h):
        for x in range(w):
            acc = 0.0
            for k in range(n):
                acc += taps[k] * rows[y + k, x]
            out[y, x] = np.float32(acc)
    return out


@numba.njit(cache=True, nogil=True)
def _conv_tri1_mex(image: np.ndarray, p: np.float32) -> np.ndarray:
    """convConst.cpp ``convTri1`` with s = 1, float32, in the C code's operation order.

    A pass across columns ``nrm·((I[x-1] + p·I[x]) + I[x+1])`` (the border column standing in
    for its missing neighbour), then down rows ``(T[y-1] + p·T[y]) + T[y+1]``, the first/last
    row ``(1+p)·T[0] + T[1]`` / ``T[h-2] + (1+p)·T[h-1]``. Needs h, w >= 2.
    """
    h, w = image.shape
    one, two = np.float32(1.0), np.float32(2.0)
    nrm = one / ((p + two) * (p + two))
    t = np.empty((h, w), dtype=np.float32)
    for y in range(h):
        for x in range(w):
            left = image[y, x - 1] if x > 0 else image[y, 0]
            right = image[y, x + 1] if x < w - 1 else image[y, w - 1]
            t[y, x] = nrm * ((left + p * image[y, x]) + right)
    out = np.empty((h, w), dtype=np.float32)
    q = one + p
    for x in range(w):
        out[0, x] = q * t[0, x] + t[1, x]
        out[h - 1, x] = t[h - 2, x] + q * t[h - 1, x]
    for y in range(1, h - 1):
        for x in range(w):
            out[y, x] = (t[y - 1, x] + p * t[y, x]) + t[y + 1, x]
    return out


def _derivative(image: np.ndarray) -> np.ndarray:
    """d/dy (along axis 0) as gradientMex ``grad1``: centred inside, one-sided at the ends."""
    out = np.zeros_like(image)
    if image.shape[0] >= 2:
        out[1:-1] = (image[2:] - image[:-2]) * _F32(0.5)
        out[0] = image[1] - image[0]
        out[-1] = image[-1] - image[-2]
    return out


def gradient2(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Piotr's ``gradient2`` (gradientMex ``grad1``): (Gx along columns, Gy along rows), float32."""
    image = np.asarray(image, dtype=_F32)
    return _derivative(image.T).T, _derivative(image)


def edge_orientation(edges: np.ndarray) -> np.ndarray:
    """nms_process.m: ``O = mod(atan(Oyy.*sign(-Oxy)./(Oxx+1e-5)), pi)`` of ``convTri(E, 4)``."""
    ratio = _orientation_ratio(conv_tri(edges, 4))
    return _wrap_angle(np.arctan(ratio.astype(np.float64)).astype(_F32))


@numba.njit(cache=True, nogil=True)
def _ddx(image: np.ndarray) -> np.ndarray:
    """Gx of :func:`gradient2` (gradientMex ``grad1`` along columns), float32."""
    h, w = image.shape
    out = np.zeros((h, w), dtype=np.float32)
    if w >= 2:
        half = np.float32(0.5)
        for y in range(h):
            out[y, 0] = image[y, 1] - image[y, 0]
            for x in range(1, w - 1):
                out[y, x] = (image[y, x + 1] - image[y, x - 1]) * half
            out[y, w - 1] = image[y, w - 1] - image[y, w - 2]
    return out


@numba.njit(cache=True, nogil=True)
def _ddy(image: np.ndarray) -> np.ndarray:
    """Gy of :func:`gradient2` (gradientMex ``grad1`` along rows), float32."""
    h, w = image.shape
    out = np.zeros((h, w), dtype=np.float32)
    if h >= 2:
        half = np.float32(0.5)
        for x in range(w):
            out[0, x] = image[1, x] - image[0, x]
            out[h - 1, x] = image[h - 1, x] - image[h - 2, x]
        for y in range(1, h - 1):
            for x in range(w):
                out[y, x] = (image[y + 1, x] - image[y - 1, x]) * half
    return out


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _orientation_ratio(smooth: np.ndarray) -> np.ndarray:
    """``Oyy .* sign(-Oxy) ./ (Oxx + 1e-5)`` of ``smooth`` = convTri(E, 4), float32 throughout.

    The same float32 operations as ``gradient2`` and numpy's ``sign`` (±0 -> 0, NaN stays);
    division by zero gives ±inf or NaN (``error_model="numpy"``), as in numpy and MATLAB.
    """
    ox, oy = _ddx(smooth), _ddy(smooth)
    oxx, oxy, oyy = _ddx(ox), _ddx(oy), _ddy(oy)
    h, w = smooth.shape
    eps = np.float32(1e-5)
    zero, one = np.float32(0.0), np.float32(1.0)
    out = np.empty((h, w), dtype=np.float32)
    for y in range(h):
        for x in range(w):
            v = -oxy[y, x]
            if v > zero:
                sign = one
            elif v < zero:
                sign = -one
            elif v == zero:
                sign = zero
            else:
                sign = v  # NaN
            out[y, x] = (oyy[y, x] * sign) / (oxx[y, x] + eps)
    return out


@numba.njit(cache=True, nogil=True)
def _wrap_angle(angle: np.ndarray) -> np.ndarray:
    """``mod(a, pi)`` for a = atan(·) in [-π/2, π/2]: a + single(pi) where a < 0; NaN -> 0."""
    h, w = angle.shape
    pi = np.float32(math.pi)
    out = np.empty((h, w), dtype=np.float32)
    for y in range(h):
        for x in range(w):
            a = angle[y, x]
            if a < 0:
                a = a + pi
            out[y, x] = a if a == a else np.float32(0.0)
    return out


@numba.njit(cache=True, nogil=True)
def _suppress(
    flat: np.ndarray,
    h: int,
    w: int,
    idx: np.ndarray,
    cos_o: np.ndarray,
    sin_o: np.ndarray,
    r: int,
    m: np.float32,
    out: np.ndarray,
) -> None:
    """edgesNmsMex.cpp's loop: zero ``out[idx[i]]`` if e·m < the map interpolated at d = ±1 … ±r.

    ``flat`` is the [h, w] float32 map raveled, ``idx`` its nonzero pixels, ``cos_o``/``sin_o``
    their float32 cos/sin of the orientation. Every float32 operation of ``interp`` is the C
    code's (and the earlier numpy code's), in the same order; a pixel stops at the first
    neighbour that suppresses it (the outcome is an OR over d, so the order of d is free).
    """
    x_limit, y_limit = w - 1.001, h - 1.001  # compared in double, as in C
    x_cap, y_cap = np.float32(x_limit), np.float32(y_limit)
    zero, one = np.float32(0.0), np.float32(1.0)
    for i in range(idx.size):
        p = idx[i]
        py = p // w
        px = p - py * w
        e = flat[p] * m
        xf, yf = np.float32(px), np.float32(py)
        c, s = cos_o[i], sin_o[i]
        suppressed = False
        for k in range(1, r + 1):
            for sign in range(2):
                d = np.float32(k) if sign == 0 else np.float32(-k)
                x = xf + d * c
                y = yf + d * s
                if x < zero:
                    x = zero
                elif np.float64(x) > x_limit:
                    x = x_cap
                if y < zero:
                    y = zero
                elif np.float64(y) > y_limit:
                    y = y_cap
                x0, y0 = int(x), int(y)
                x1, y1 = min(x0 + 1, w - 1), min(y0 + 1, h - 1)  # only h or w = 1 needs this
                dx0, dy0 = x - np.float32(x0), y - np.float32(y0)
                dx1, dy1 = one - dx0, one - dy0
                value = (
                    flat[y0 * w + x0] * dx1 * dy1
                    + flat[y0 * w + x1] * dx0 * dy1
                    + flat[y1 * w + x0] * dx1 * dy0
                    + flat[y1 * w + x1] * dx0 * dy0
                )
                if e < value:
                    suppressed = True
                    break
            if suppressed:
                break
        if suppressed:
            out[p] = zero


def edges_nms(
    edges: np.ndarray,
    orientation: np.ndarray,
    r: int = NMS_RADIUS,
    s: int = NMS_BORDER,
    m: float = NMS_MULTIPLIER,
) -> np.ndarray:
    """pdollar/edges ``edgesNmsMex(E, O, r, s, m)`` of an [H, W] map; float32 out."""
    e0 = np.ascontiguousarray(edges, dtype=_F32)
    h, w = e0.shape
    out = e0.copy()
    flat = e0.ravel()
    idx = np.flatnonzero(flat)
    if idx.size:
        theta = np.asarray(orientation).ravel()[idx].astype(np.float64)
        cos_o, sin_o = np.cos(theta).astype(_F32), np.sin(theta).astype(_F32)
        _suppress(flat, h, w, idx, cos_o, sin_o, int(r), _F32(m), out.ravel())
    # "suppress noisy edge estimates near boundaries"
    s = min(s, w // 2, h // 2)
    if s > 0:
        fade = np.arange(s, dtype=_F32) / _F32(s)
        cols, rows = np.ones(w, dtype=_F32), np.ones(h, dtype=_F32)
        cols[:s], cols[w - s :] = fade, fade[::-1]
        rows[:s], rows[h - s :] = fade, fade[::-1]
        out *= cols[None, :]
        out *= rows[:, None]
    return out


def matlab_uint8(values: np.ndarray) -> np.ndarray:
    """MATLAB ``uint8(x)`` of a float array: round half away from zero, saturate, NaN -> 0."""
    rounded = np.floor(np.abs(np.asarray(values, dtype=np.float64)) + 0.5) * np.sign(values)
    return np.nan_to_num(np.clip(rounded, 0, 255), nan=0.0).astype(np.uint8)


def structured_edge_nms(levels: np.ndarray) -> np.ndarray:
    """[H, W] uint8 grey levels -> [H, W] uint8 grey levels after innovator-zero/seism ``nms_process.m``."""
    if levels.dtype != np.uint8 or levels.ndim != 2:
        raise TypeError(f"expected a 2-D uint8 grey-level map, got {levels.dtype} of shape {levels.shape}")
    edges = conv_tri(_GREY_TO_SINGLE[levels], 1)  # single(double(png) / 255)
    edges = edges_nms(edges, edge_orientation(edges))
    return _grey_levels(edges)


@numba.njit(cache=True, nogil=True)
def _grey_levels(edges: np.ndarray) -> np.ndarray:
    """``matlab_uint8(edges * float32(255))`` of a 2-D float32 map, in one pass."""
    h, w = edges.shape
    out = np.empty((h, w), dtype=np.uint8)
    for y in range(h):
        for x in range(w):
            v = edges[y, x] * np.float32(255.0)  # the single-precision product
            if v > 0:  # NaN, zero and negative values give 0
                out[y, x] = np.uint8(min(np.floor(np.float64(v) + 0.5), 255.0))
            else:
                out[y, x] = 0
    return out
