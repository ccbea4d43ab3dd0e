"""A small vectorised ray caster: the geometry and shading behind the synthetic datasets.

Conventions, the same for both datasets:

* World coordinates are metres with y up; the ground (or a room's floor) is the plane y = 0.
* Camera coordinates are x right, y up, z toward the viewer (OpenGL): the camera looks along -z.
* Depth is planar, as a Kinect measures it: the distance of a hit point along the optical axis
  (-z in camera coordinates), not the length of the ray.
* Normals are unit vectors in camera coordinates pointing out of the surface, so toward the
  camera: for a pixel's viewing ray d, n . d < 0.

Every shape is intersected with the rays of its screen-space bounding box at once and a
z-buffer keeps the nearest hit, so the cost is numpy work in proportion to the pixels a shape
covers; there is no per-pixel Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

_EPS = 1e-6
FloatArray = np.ndarray


def _dot(a: FloatArray, b: FloatArray) -> FloatArray:
    return (a * b).sum(-1)


def _unit(v: FloatArray) -> FloatArray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def rotation_x(angle: float) -> FloatArray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rotation_y(angle: float) -> FloatArray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rotation_z(angle: float) -> FloatArray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


# --------------------------------------------------------------------------- shapes
# Each shape answers intersect(origin, dirs) -> (t, normal): t [N] in units of dirs (inf where
# the ray misses), normal [N, 3] in world coordinates facing the ray. origin is [3] or [N, 3].


def _box_corners(centre: FloatArray, rotation: FloatArray, half: FloatArray) -> FloatArray:
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)
    return centre + (signs * half) @ rotation.T


@dataclass(frozen=True)
class Plane:
    """An infinite plane; used for the ground, floors, walls and ceilings."""

    point: FloatArray
    normal: FloatArray

    def intersect(self, origin: FloatArray, dirs: FloatArray) -> tuple[FloatArray, FloatArray]:
        denom = dirs @ self.normal
        with np.errstate(divide="ignore", invalid="ignore"):
            t = ((self.point - origin) @ self.normal) / denom
        t = np.where((t > _EPS) & np.isfinite(t), t, np.inf)
        normal = np.where((denom < 0)[:, None], self.normal, -self.normal)
        return t, normal

    def corners(self) -> None:
        return None  # unbounded: covers the whole screen

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Plane:
        return Plane(rotation @ self.point + translation, rotation @ self.normal)


@dataclass(frozen=True)
class Box:
    """An oriented box: centre, half extents along its own axes, rotation (columns = axes)."""

    centre: FloatArray
    half: FloatArray
    rotation: FloatArray = field(default_factory=lambda: np.eye(3))

    def intersect(self, origin: FloatArray, dirs: FloatArray) -> tuple[FloatArray, FloatArray]:
        o = (origin - self.centre) @ self.rotation
        d = dirs @ self.rotation
        d = np.where(np.abs(d) < 1e-12, 1e-12, d)
        t1 = (-self.half - o) / d
        t2 = (self.half - o) / d
        near, far = np.minimum(t1, t2), np.maximum(t1, t2)
        axis = near.argmax(-1)
        t_in, t_out = near.max(-1), far.min(-1)
        t = np.where((t_in <= t_out) & (t_in > _EPS), t_in, np.inf)
        sign = -np.sign(np.take_along_axis(d, axis[:, None], -1))
        return t, self.rotation[:, axis].T * sign

    def corners(self) -> FloatArray:
        return _box_corners(self.centre, self.rotation, self.half)

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Box:
        return Box(rotation @ self.centre + translation, self.half, rotation @ self.rotation)


@dataclass(frozen=True)
class Ellipsoid:
    """An oriented ellipsoid (a sphere when all radii are equal)."""

    centre: FloatArray
    radii: FloatArray
    rotation: FloatArray = field(default_factory=lambda: np.eye(3))

    def intersect(self, origin: FloatArray, dirs: FloatArray) -> tuple[FloatArray, FloatArray]:
        o = ((origin - self.centre) @ self.rotation) / self.radii
        d = (dirs @ self.rotation) / self.radii
        a = _dot(d, d)
        b = _dot(o, d)
        c = _dot(o, o) - 1.0
        disc = b * b - a * c
        t = (-b - np.sqrt(np.maximum(disc, 0.0))) / a
        t = np.where((disc >= 0) & (t > _EPS), t, np.inf)
        q = o + np.where(np.isfinite(t), t, 0.0)[:, None] * d  # point on the unit sphere
        return t, _unit((q / self.radii) @ self.rotation.T)

    def corners(self) -> FloatArray:
        return _box_corners(self.centre, self.rotation, self.radii)

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Ellipsoid:
        return Ellipsoid(rotation @ self.centre + translation, self.radii, rotation @ self.rotation)


def _segment_corners(a: FloatArray, b: FloatArray, radius: float) -> FloatArray:
    lo, hi = np.minimum(a, b) - radius, np.maximum(a, b) + radius
    return _box_corners((lo + hi) / 2, np.eye(3), (hi - lo) / 2)


@dataclass(frozen=True)
class Capsule:
    """A segment a-b swept by a sphere: limbs, poles, handles."""

    a: FloatArray
    b: FloatArray
    radius: float

    def intersect(self, origin: FloatArray, dirs: FloatArray) -> tuple[FloatArray, FloatArray]:
        # Inigo Quilez's capsule intersection, on unit directions.
        length = np.linalg.norm(dirs, axis=-1)
        rd = dirs / length[:, None]
        ba = self.b - self.a
        oa = origin - self.a
        baba = ba @ ba
        bard = rd @ ba
        baoa = oa @ ba
        rdoa = _dot(rd, oa)
        oaoa = _dot(oa, oa)
        qa = baba - bard * bard
        qb = baba * rdoa - baoa * bard
        qc = baba * oaoa - baoa * baoa - self.radius**2 * baba
        h = qb * qb - qa * qc
        with np.errstate(divide="ignore", invalid="ignore"):
            t_body = (-qb - np.sqrt(np.maximum(h, 0.0))) / qa
        y = baoa + t_body * bard
        body = (h >= 0) & (y > 0) & (y < baba)
        # Otherwise the ray may hit one of the end spheres.
        oc = np.where((y <= 0)[:, None], oa, origin - self.b)
        cb = _dot(rd, oc)
        cc = _dot(oc, oc) - self.radius**2
        ch = cb * cb - cc
        t_cap = -cb - np.sqrt(np.maximum(ch, 0.0))
        t = np.where(body, t_body, np.where((h >= 0) & (ch > 0), t_cap, np.inf))
        t = np.where(t > _EPS, t, np.inf)
        p = origin + np.where(np.isfinite(t), t, 0.0)[:, None] * rd
        s = np.clip(((p - self.a) @ ba) / baba, 0.0, 1.0)
        normal = _unit(p - self.a - s[:, None] * ba)
        return t / length, normal

    def corners(self) -> FloatArray:
        return _segment_corners(self.a, self.b, self.radius)

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Capsule:
        return Capsule(rotation @ self.a + translation, rotation @ self.b + translation, self.radius)


@dataclass(frozen=True)
class Cylinder:
    """A capped cylinder between a and b: wheels, pots, bottles, poles."""

    a: FloatArray
    b: FloatArray
    radius: float

    def intersect(self, origin: FloatArray, dirs: FloatArray) -> tuple[FloatArray, FloatArray]:
        # Inigo Quilez's capped-cylinder intersection, on unit directions.
        length = np.linalg.norm(dirs, axis=-1)
        rd = dirs / length[:, None]
        ba = self.b - self.a
        oc = origin - self.a
        baba = ba @ ba
        bard = rd @ ba
        baoc = oc @ ba
        k2 = baba - bard * bard
        k1 = baba * _dot(oc, rd) - baoc * bard
        k0 = baba * _dot(oc, oc) - baoc * baoc - self.radius**2 * baba
        h = k1 * k1 - k2 * k0
        sq = np.sqrt(np.maximum(h, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t_body = (-k1 - sq) / k2
            y = baoc + t_body * bard
            body = (h >= 0) & (y > 0) & (y < baba)
            t_cap = (np.where(y < 0, 0.0, baba) - baoc) / bard
            cap = (h >= 0) & ~body & (np.abs(k1 + k2 * t_cap) < sq)
        t = np.where(body, t_body, np.where(cap, t_cap, np.inf))
        t = np.where(t > _EPS, t, np.inf)
        p = oc + np.where(np.isfinite(t), t, 0.0)[:, None] * rd
        side = (p - ba * (y / baba)[:, None]) / self.radius
        axis = ba / np.sqrt(baba) * np.sign(y)[:, None]
        normal = _unit(np.where(body[:, None], side, axis))
        return t / length, normal

    def corners(self) -> FloatArray:
        return _segment_corners(self.a, self.b, self.radius)

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Cylinder:
        return Cylinder(rotation @ self.a + translation, rotation @ self.b + translation, self.radius)


Shape = Plane | Box | Ellipsoid | Capsule | Cylinder


# --------------------------------------------------------------------------- camera


@dataclass(frozen=True)
class Camera:
    """A pinhole camera: position, rotation camera -> world (columns: right, up, backward)."""

    position: FloatArray
    rotation: FloatArray
    focal: float  # pixels
    height: int
    width: int

    @classmethod
    def aimed(
        cls, position: Sequence[float], yaw: float, pitch: float, fov: float, size: tuple[int, int]
    ) -> Camera:
        """A level camera turned by ``yaw`` (radians, left positive) and tilted down by
        ``pitch``; ``fov`` is the horizontal field of view in radians."""
        height, width = size
        rotation = rotation_y(yaw) @ rotation_x(-pitch)
        return cls(np.asarray(position, float), rotation, width / 2 / np.tan(fov / 2), height, width)

    def rays(self) -> FloatArray:
        """[H, W, 3] viewing rays in camera coordinates, scaled to z = -1 so that the ray
        parameter of a hit is its planar depth."""
        u = (np.arange(self.width) + 0.5 - self.width / 2) / self.focal
        v = -(np.arange(self.height) + 0.5 - self.height / 2) / self.focal
        rays = np.empty((self.height, self.width, 3))
        rays[..., 0] = u[None, :]
        rays[..., 1] = v[:, None]
        rays[..., 2] = -1.0
        return rays

    def to_camera(self, vectors: FloatArray) -> FloatArray:
        """World directions -> camera coordinates."""
        return vectors @ self.rotation

    def screen_box(self, corners: FloatArray | None) -> tuple[slice, slice] | None:
        """Rows and columns that the convex hull of ``corners`` can cover; None if none."""
        full = (slice(0, self.height), slice(0, self.width))
        if corners is None:
            return full
        p = (corners - self.position) @ self.rotation
        if (p[:, 2] > -0.05).any():  # reaches behind the camera: no simple projection
            return full if (p[:, 2] < 0).any() else None
        u = self.focal * p[:, 0] / -p[:, 2] + self.width / 2
        v = -self.focal * p[:, 1] / -p[:, 2] + self.height / 2
        c0, c1 = max(int(np.floor(u.min())) - 1, 0), min(int(np.ceil(u.max())) + 1, self.width)
        r0, r1 = max(int(np.floor(v.min())) - 1, 0), min(int(np.ceil(v.max())) + 1, self.height)
        if c0 >= c1 or r0 >= r1:
            return None
        return slice(r0, r1), slice(c0, c1)


@dataclass(frozen=True)
class Hits:
    depth: FloatArray  # [H, W] planar depth, inf where nothing was hit
    normal: FloatArray  # [H, W, 3] world normals facing the camera
    index: np.ndarray  # [H, W] index of the nearest shape, -1 where nothing was hit


def cast(camera: Camera, shapes: Sequence[Shape]) -> Hits:
    """Z-buffer the shapes: the nearest hit of every pixel's ray."""
    h, w = camera.height, camera.width
    dirs = camera.rays() @ camera.rotation.T
    depth = np.full((h, w), np.inf)
    normal = np.zeros((h, w, 3))
    index = np.full((h, w), -1, dtype=np.int32)
    for k, shape in enumerate(shapes):
        box = camera.screen_box(shape.corners())
        if box is None:
            continue
        sub = dirs[box]
        t, n = shape.intersect(camera.position, sub.reshape(-1, 3))
        t = t.reshape(sub.shape[:2])
        zbuf = depth[box]  # views: writing into them writes into the full maps
        closer = t < zbuf
        if not closer.any():
            continue
        zbuf[closer] = t[closer]
        normal[box][closer] = n.reshape(sub.shape)[closer]
        index[box][closer] = k
    return Hits(depth, normal, index)


def _shadow_keys(
    points: FloatArray, dirs: FloatArray, unit: FloatArray, centres: FloatArray, radii: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Two keys per ray [N, 2] and two key intervals per shape [S, 2] such that a ray can
    pass through a shape's bounding sphere only if both its keys are in the shape's
    intervals: ``(keys, lo, hi)``.

    Parallel rays (the sun): the position across them along two axes e perpendicular to them;
    a ray within r of c has |(p - c) . e| < r. Rays that all pass within eps of one point L
    (a lamp: points + dirs): two components of their direction w = -unit, those that spread
    most; a ray within r of c, D = |c - L| >= 1.5 r + eps (so c is on the ray's side of L),
    has |w - d| < asin(r / (D - eps)) + 2 eps / (D - eps), d = (c - L) / D. Any other shape,
    or rays that share no point, get the whole range."""
    if np.ndim(dirs) == 1:
        e1 = np.cross(unit[0], [0.0, 1.0, 0.0])
        if np.linalg.norm(e1) < 0.1:
            e1 = np.cross(unit[0], [1.0, 0.0, 0.0])
        e1 = _unit(e1)
        axes = np.stack([e1, np.cross(unit[0], e1)], 1)  # [3, 2]
        keys, at, half = points @ axes, centres @ axes, np.repeat(radii[:, None], 2, 1)
    else:
        targets = points + dirs
        light = targets.mean(0)
        eps = np.linalg.norm(targets - light, axis=-1).max()
        axes = np.argsort(-unit.std(0))[:2]
        keys = -unit[:, axes]
        offset = centres - light
        distance = np.linalg.norm(offset, axis=-1)
        at = offset[:, axes] / distance[:, None]
        far = (distance - eps >= 1.5 * radii) & (distance > 10 * eps)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.arcsin(np.minimum(radii / (distance - eps), 1.0)) + 2 * eps / (distance - eps)
        half = np.repeat(np.where(far, bound, np.inf)[:, None], 2, 1)
    finite = np.isfinite(half) & np.isfinite(at)
    at, half = np.where(finite, at, 0.0), np.where(finite, half + 1e-6 * (1 + np.abs(at)), np.inf)
    return keys, at - half, at + half


def occluded(
    points: FloatArray,
    dirs: FloatArray,
    shapes: Sequence[Shape],
    limit: float = np.inf,
) -> np.ndarray:
    """Whether the segment points + t dirs, 0 < t < limit, hits a bounded shape: shadow rays.
    ``dirs`` is one direction [3] (parallel rays) or one per point [N, 3]. Each shape is tested
    only against the rays that pass through its bounding sphere, looked for among the rays
    whose keys (:func:`_shadow_keys`) are in its intervals: a slice of the rays sorted by the
    first key, not a test of every ray against every shape (which was most of a 512x512 render)."""
    blocked = np.zeros(len(points), dtype=bool)
    bounded = [(shape, c) for shape in shapes if (c := shape.corners()) is not None]
    if not bounded or not len(points):
        return blocked
    corners = np.stack([c for _, c in bounded])  # [S, 8, 3]
    centres = corners.mean(1)
    radii = np.linalg.norm(corners - centres[:, None], axis=-1).max(1)
    given = dirs
    dirs = np.broadcast_to(dirs, points.shape)
    length = np.linalg.norm(dirs, axis=-1)
    unit = dirs / length[:, None]
    keys, lo, hi = _shadow_keys(points, given, unit, centres, radii)
    # Rays in the order of their first key, so that a shape's candidates are a slice (a view).
    order = np.argsort(keys[:, 0], kind="stable")
    first, second = keys[order, 0], np.ascontiguousarray(keys[order, 1])
    points_s, dirs_s, unit_s, reach_s = points[order], dirs[order], unit[order], (limit * length)[order]
    blocked_s = np.zeros(len(points), dtype=bool)
    starts, stops = np.searchsorted(first, lo[:, 0]), np.searchsorted(first, hi[:, 0], side="right")
    for (shape, _), c, r, start, stop, lo2, hi2 in zip(
        bounded, centres, radii, starts, stops, lo[:, 1], hi[:, 1]
    ):
        window = np.s_[start:stop]
        rays = start + np.flatnonzero((second[window] >= lo2) & (second[window] <= hi2) & ~blocked_s[window])
        if not len(rays):
            continue
        v = c - points_s[rays]
        along = _dot(v, unit_s[rays])
        near = (along > -r) & (_dot(v, v) - along**2 < r**2) & (along - r < reach_s[rays])
        if near.any():
            test = rays[near]
            t, _ = shape.intersect(points_s[test], dirs_s[test])
            blocked_s[test[t < limit]] = True
    blocked[order] = blocked_s
    return blocked


# --------------------------------------------------------------------------- appearance


def _waves(p: FloatArray, m: Material) -> FloatArray:
    return np.sin(p @ m.waves[:, :3].T + m.waves[:, 3]).sum(-1) / 2


def _hash01(x: FloatArray) -> FloatArray:
    return np.modf(np.abs(np.sin(x * 12.9898 + 78.233) * 43758.5453))[0]


# pattern name -> weight in [0, 1] of the accent colour at world points [N, 3]
PATTERNS: dict[str, Callable[[FloatArray, Material], FloatArray]] = {
    "solid": lambda p, m: np.zeros(len(p)),
    "stripes": lambda p, m: (
        0.5 + 0.5 * np.tanh(4 * np.sin(2 * np.pi * m.scale * (p @ m.axes[0]) + m.waves[0, 3]))
    ),
    "checker": lambda p, m: (np.floor(m.scale * (p @ m.axes[0])) + np.floor(m.scale * (p @ m.axes[1]))) % 2,
    "noise": lambda p, m: np.clip(0.5 + 0.5 * _waves(p, m), 0.0, 1.0),
    "patches": lambda p, m: (_waves(p, m) > 0.2).astype(float),
    "bands": lambda p, m: _hash01(np.floor(m.scale * (p @ m.axes[0])) + m.waves[0, 3]),
    "grain": lambda p, m: 0.5 + 0.5 * np.sin(2 * np.pi * m.scale * (p @ m.axes[0]) + 2.5 * _waves(p, m)),
}


@dataclass(frozen=True)
class Material:
    """Albedo = mix(base, accent, pattern(point)); ``emissive`` of it glows unlit."""

    base: FloatArray  # [3] linear RGB in [0, 1]
    accent: FloatArray  # [3]
    pattern: str = "solid"
    scale: float = 1.0  # pattern frequency, cycles per metre
    axes: FloatArray = field(default_factory=lambda: np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))  # [2, 3]
    waves: FloatArray = field(default_factory=lambda: np.zeros((1, 4)))  # [K, 4]: wave vector, phase
    emissive: float = 0.0

    def albedo(self, points: FloatArray) -> FloatArray:
        w = PATTERNS[self.pattern](points, self)[:, None]
        return self.base * (1 - w) + self.accent * w


@dataclass(frozen=True)
class Surface:
    """One shape of an object, with its material and (for people) its PASCAL-Part name."""

    shape: Shape
    material: Material
    part: str = ""

    def moved(self, rotation: FloatArray, translation: FloatArray) -> Surface:
        return Surface(self.shape.moved(rotation, translation), self.material, self.part)


@dataclass
class SceneObject:
    """A labelled object: ``name`` is its class, ``label`` the dataset's class index
    (VOC for PASCAL, NYU-40 minus one for NYUD), ``context`` its PASCAL-Context class."""

    name: str
    label: int
    surfaces: list[Surface]
    context: str = ""


@dataclass(frozen=True)
class Lighting:
    ambient: FloatArray  # [3] light from every direction
    skylight: FloatArray  # [3] extra light on upward-facing surfaces
    sun_direction: FloatArray | None = None  # [3] unit vector toward the sun
    sun: FloatArray = field(default_factory=lambda: np.zeros(3))
    lamp_position: FloatArray | None = None  # a point light
    lamp: FloatArray = field(default_factory=lambda: np.zeros(3))  # irradiance at 1 m
    fog: FloatArray = field(default_factory=lambda: np.zeros(3))  # colour far surfaces fade to
    fog_distance: float = np.inf  # metres
    exposure: float = 1.0


@dataclass
class Scene:
    camera: Camera
    lighting: Lighting
    objects: list[SceneObject] = field(default_factory=list)
    sky: tuple[FloatArray, FloatArray] | None = None  # horizon and zenith colours; None: black
    noise: float = 0.02  # std of the sensor noise, on [0, 1] pixel values

    def add(self, obj: SceneObject) -> SceneObject:
        self.objects.append(obj)
        return obj


@dataclass(frozen=True)
class Rendering:
    image: np.ndarray  # [H, W, 3] uint8
    depth: FloatArray  # [H, W] planar depth in metres, inf on the sky
    normals: FloatArray  # [H, W, 3] camera coordinates, unit, facing the camera; sky: (0, 0, 1)
    object_id: np.ndarray  # [H, W] index into scene.objects, -1 on the sky
    part: np.ndarray  # [H, W] index into part_names, -1 where no part
    part_names: tuple[str, ...]
    camera: Camera


def _irradiance(p: FloatArray, n: FloatArray, light: Lighting, shapes: Sequence[Shape]) -> FloatArray:
    e = light.ambient + light.skylight * (0.5 + 0.5 * n[:, 1:2])
    start = p + 2e-3 * n
    if light.sun_direction is not None:
        lam = np.clip(n @ light.sun_direction, 0.0, None)
        lit = lam > 0
        lit[lit] = ~occluded(start[lit], light.sun_direction, shapes)
        e = e + light.sun * (lam * lit)[:, None]
    if light.lamp_position is not None:
        to_lamp = light.lamp_position - p
        dist = np.linalg.norm(to_lamp, axis=-1)
        lam = np.clip(_dot(n, to_lamp) / dist, 0.0, None)
        lit = lam > 0
        lit[lit] = ~occluded(start[lit], to_lamp[lit], shapes, limit=0.98)
        e = e + light.lamp * (lam * lit / np.maximum(dist, 0.7) ** 2)[:, None]
    return e


def render(scene: Scene, rng: np.random.Generator) -> Rendering:
    """Ray-cast, texture and light a scene; add sensor noise drawn from ``rng``."""
    camera, light = scene.camera, scene.lighting
    surfaces = [s for obj in scene.objects for s in obj.surfaces]
    owner = np.array([k for k, obj in enumerate(scene.objects) for _ in obj.surfaces] + [-1], dtype=np.int32)
    part_names = tuple(sorted({s.part for s in surfaces if s.part}))
    part_of = np.array([part_names.index(s.part) if s.part else -1 for s in surfaces] + [-1], dtype=np.int32)
    shapes = [s.shape for s in surfaces]
    hits = cast(camera, shapes)

    rays = camera.rays()
    dirs = rays @ camera.rotation.T
    hit = hits.index >= 0
    colour = np.zeros((camera.height, camera.width, 3))
    # The sky: a vertical gradient from the horizon colour to the zenith colour.
    horizon, zenith = scene.sky if scene.sky is not None else (np.zeros(3), np.zeros(3))
    up = np.clip(_unit(dirs)[..., 1], 0.0, 1.0)[..., None] ** 0.6
    colour[~hit] = (horizon * (1 - up) + zenith * up)[~hit]

    idx = hits.index[hit]
    depth = hits.depth[hit]
    points = camera.position + depth[:, None] * dirs[hit]
    normals_w = hits.normal[hit]
    albedo = np.empty_like(points)
    emissive = np.empty(len(points))
    for k in np.unique(idx):
        sel = idx == k
        material = surfaces[k].material
        albedo[sel] = material.albedo(points[sel])
        emissive[sel] = material.emissive
    shade = _irradiance(points, normals_w, light, shapes)
    lit = albedo * (shade * (1 - emissive[:, None]) + emissive[:, None])
    if np.isfinite(light.fog_distance):
        fade = 1 - np.exp(-np.linalg.norm(points - camera.position, axis=-1) / light.fog_distance)
        lit = lit * (1 - fade[:, None]) + light.fog * fade[:, None]
    colour[hit] = lit

    colour = np.clip(colour * light.exposure, 0.0, 1.0) ** (1 / 2.2)
    colour = colour + rng.normal(0.0, scene.noise, colour.shape)
    image = np.clip(np.rint(colour * 255), 0, 255).astype(np.uint8)

    normals = np.zeros_like(hits.normal)
    normals[..., 2] = 1.0
    normals[hit] = _unit(camera.to_camera(normals_w))
    return Rendering(
        image=image,
        depth=hits.depth.astype(np.float32),
        normals=normals.astype(np.float32),
        object_id=owner[hits.index],
        part=part_of[hits.index],
        part_names=part_names,
        camera=camera,
    )
