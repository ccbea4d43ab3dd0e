"""Render small, write large: a rendering scaled up to the size the dataset is written at.

Ray casting costs in proportion to the pixels, so a scene rendered at half the size costs about
a quarter. Each field of the :class:`~fedmtl.synth.render.Rendering` is scaled with the
resampling its meaning allows, on the same pixel-centre grid (a target pixel's centre mapped
to the source, as PIL and ``align_corners=False`` do):

* the image: bicubic (PIL), as a photograph is scaled;
* object ids and parts: nearest, so every label is one the small render has (no class
  between two classes); the labels the generator reads off them (semseg, saliency, parts,
  edges) are then computed at the full size, so edges stay as thin as at full size;
* depth and normals: bilinear inside one object, nearest across an object boundary (where
  the four source pixels around a target pixel do not all show the same object, or one is
  sky). Bilinear everywhere would put depths halfway between a chair and the wall behind it,
  on no surface, and average the normals of two faces; nearest everywhere would turn a
  smooth floor into terraces. Normals are scaled back to unit length after blending. The
  sky keeps depth inf and normal (0, 0, 1); Kinect holes (depth 0) are cut afterwards, at the
  full size, so no valid depth is ever blended with a missing one.

Written by hand rather than with torch's ``interpolate``: the boundary rule needs the four
source pixels of every target pixel, which no library resize exposes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from PIL import Image

from fedmtl.synth.render import Rendering


def _grid(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each output index along one axis: its nearest source index, the two source indices
    either side of its centre and the weight of the second."""
    centre = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    low = np.floor(centre)
    weight = centre - low
    low = low.astype(np.int64)
    nearest = np.clip(np.floor(centre + 0.5).astype(np.int64), 0, n_in - 1)
    return nearest, np.clip(low, 0, n_in - 1), np.clip(low + 1, 0, n_in - 1), weight


def upscale(r: Rendering, size: tuple[int, int]) -> Rendering:
    """``r`` scaled up to ``size`` (height, width), every field as the module docstring says."""
    height, width = size
    h, w = r.object_id.shape
    ny, y0, y1, wy = _grid(height, h)
    nx, x0, x1, wx = _grid(width, w)

    def nearest(a: np.ndarray) -> np.ndarray:
        return a[ny][:, nx]

    # Separable: rows first (at the small width), then columns. The four source pixels of a
    # target pixel show one object iff both rows agree at both columns and the columns agree.
    ids0, ids1 = r.object_id[y0], r.object_id[y1]
    finite = np.isfinite(r.depth)
    rows_same = (ids0 == ids1) & finite[y0] & finite[y1]
    same = rows_same[:, x0] & rows_same[:, x1] & (ids0[:, x0] == ids0[:, x1])
    fy = wy.astype(np.float32).reshape(-1, 1, 1)
    fx = wx.astype(np.float32).reshape(1, -1, 1)

    def blend(a: np.ndarray) -> np.ndarray:
        flat = a.reshape(h, w, -1)
        with np.errstate(invalid="ignore"):  # inf * 0 on the sky: replaced by nearest there
            rows = flat[y0] * (1 - fy) + flat[y1] * fy
            mixed = rows[:, x0] * (1 - fx) + rows[:, x1] * fx
        out = np.where(same[..., None], mixed, flat[ny][:, nx])
        return out.reshape(height, width, *a.shape[2:]).astype(a.dtype)

    normals = blend(r.normals)
    normals /= np.maximum(np.linalg.norm(normals, axis=-1, keepdims=True), 1e-12)
    image = np.asarray(Image.fromarray(r.image).resize((width, height), Image.Resampling.BICUBIC))
    camera = replace(r.camera, focal=r.camera.focal * width / w, height=height, width=width)
    return Rendering(
        image=image,
        depth=blend(r.depth),
        normals=normals.astype(np.float32),
        object_id=nearest(r.object_id),
        part=nearest(r.part),
        part_names=r.part_names,
        camera=camera,
    )
