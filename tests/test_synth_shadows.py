"""Shadow rays (render.occluded): the same answer as testing every ray against every shape, found
without an array of every ray against every shape (issue 37: the paper-shape dry run's data)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedmtl.synth.render import Box, Capsule, Cylinder, Ellipsoid, Plane, occluded, rotation_y


def _shapes(rng: np.random.Generator, count: int) -> list:
    """Shapes of every bounded kind scattered over a 10 m square, plus an (unbounded) ground."""
    shapes = [Plane(np.zeros(3), np.array([0.0, 1.0, 0.0]))]
    for k in range(count):
        centre = rng.uniform([-5, 0.2, -5], [5, 2.5, 5])
        size = rng.uniform(0.1, 1.0, 3)
        kind = k % 4
        if kind == 0:
            shapes.append(Box(centre, size, rotation_y(rng.uniform(0, np.pi))))
        elif kind == 1:
            shapes.append(Ellipsoid(centre, size, rotation_y(rng.uniform(0, np.pi))))
        elif kind == 2:
            shapes.append(Capsule(centre, centre + rng.normal(0, 0.8, 3), float(size[0]) / 3))
        else:
            shapes.append(Cylinder(centre, centre + rng.normal(0, 0.8, 3), float(size[0]) / 2))
    return shapes


def _every_pair(points, dirs, shapes, limit):
    """The plain answer: every bounded shape against every ray."""
    dirs = np.broadcast_to(dirs, points.shape)
    blocked = np.zeros(len(points), dtype=bool)
    for shape in shapes:
        if shape.corners() is not None:
            t, _ = shape.intersect(points, dirs)
            blocked |= t < limit
    return blocked


def _ground_points(rng: np.random.Generator, n: int) -> np.ndarray:
    # As _irradiance starts them: a hair off the surface along its normal.
    return np.c_[rng.uniform(-6, 6, n), np.full(n, 2e-3), rng.uniform(-6, 6, n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sun_shadows_equal_testing_every_shape(seed):
    rng = np.random.default_rng(seed)
    shapes, points = _shapes(rng, 24), _ground_points(rng, 4000)
    sun = np.array([0.4, 0.8, -0.45]) / np.linalg.norm([0.4, 0.8, -0.45])
    got = occluded(points, sun, shapes)
    assert got.any() and not got.all()  # a test with something to find
    np.testing.assert_array_equal(got, _every_pair(points, sun, shapes, np.inf))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lamp_shadows_equal_testing_every_shape(seed):
    # The lamp's rays head for the lamp from the surface point, but start 2 mm off it: they
    # pass near the lamp, not through it, which the search must allow for.
    rng = np.random.default_rng(seed)
    shapes, points = _shapes(rng, 24), _ground_points(rng, 4000)
    lamp = np.array([0.5, 2.8, 0.3])
    surface = points - np.array([0.0, 2e-3, 0.0])
    dirs = lamp - surface
    got = occluded(points, dirs, shapes, limit=0.98)
    assert got.any() and not got.all()
    np.testing.assert_array_equal(got, _every_pair(points, dirs, shapes, 0.98))


def test_rays_that_share_no_point_are_still_answered_right():
    rng = np.random.default_rng(3)
    shapes, points = _shapes(rng, 16), _ground_points(rng, 2000)
    dirs = rng.normal(0, 1, points.shape) + [0, 2, 0]
    np.testing.assert_array_equal(occluded(points, dirs, shapes), _every_pair(points, dirs, shapes, np.inf))


def test_memory_grows_with_rays_plus_shapes_not_their_product():
    # 512x512 renders cast ~250k shadow rays past ~45 shapes: an array of every ray against
    # every shape was hundreds of MB and most of the render's time.
    rng = np.random.default_rng(4)
    shapes, points = _shapes(rng, 60), _ground_points(rng, 100_000)
    sun = np.array([0.3, 0.9, 0.2]) / np.linalg.norm([0.3, 0.9, 0.2])
    tracemalloc.start()
    try:
        occluded(points, sun, shapes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    every_pair = len(points) * len(shapes) * 3 * 8
    assert peak < every_pair / 4, f"peak {peak / 2**20:.0f} MiB"
