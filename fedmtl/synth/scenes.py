"""Procedural scenes for the synthetic datasets: which objects, made of which shapes, where.

Objects are built in their own frame (metres, y up, standing on y = 0, front toward +z) from
the shapes of :mod:`fedmtl.synth.render`, then turned and moved into the world.

* :func:`pascal_scene`: outdoor scenes in daylight with a saturated palette: a ground plane,
  sky, distant buildings, walls, trees and mountains, and objects of the 20 VOC classes,
  including articulated people whose limbs carry PASCAL-Part part names.
* :func:`nyud_scene`: rooms (floor, walls, ceiling) furnished after a room type with the
  NYU-40 classes, under a warm, dim ceiling light.
* :func:`street_scene`: Cityscapes streets seen from a car, labelled with the official
  Cityscapes label ids, through a camera with Cityscapes' field of view.

The datasets differ in class set, palette and lighting as the real datasets do: the data
heterogeneity that federated clients on the two datasets have to cope with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedmtl.data.classes import NYU_CLASSES, VOC_CLASSES
from fedmtl.synth.render import (
    Box,
    Camera,
    Capsule,
    Cylinder,
    Ellipsoid,
    Lighting,
    Material,
    Plane,
    Scene,
    SceneObject,
    Surface,
    rotation_y,
)

Rng = np.random.Generator
Colour = tuple[float, float, float]

# PASCAL-Context classes used by the generated LabelMaps. The ones NYU also has (wall, floor,
# chair, table, sofa, person, ...) plus tvmonitor are where the distilled normals are valid.
CONTEXT_CLASSES = (
    "unknown", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "table",
    "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor", "sky",
    "building", "wall", "fence", "tree", "mountain", "grass", "ground", "road", "floor", "water",
)  # fmt: skip

VOC_TO_CONTEXT = {name: ("table" if name == "diningtable" else name) for name in VOC_CLASSES[1:]}

# The PASCAL-Part names of the person parts this generator draws.
PERSON_PARTS = (
    "hair", "head", "neck", "torso", "luarm", "llarm", "lhand", "ruarm", "rlarm", "rhand",
    "luleg", "llleg", "lfoot", "ruleg", "rlleg", "rfoot",
)  # fmt: skip


# --------------------------------------------------------------------------- building blocks


def _a(values: Sequence[float] | float) -> np.ndarray:
    return np.asarray(values, dtype=float)


def _pick(rng: Rng, options: Sequence):
    return options[int(rng.integers(len(options)))]


def paint(
    rng: Rng,
    base: Colour,
    accent: Colour | None = None,
    pattern: str = "solid",
    scale: float = 1.0,
    axes: Sequence[Sequence[float]] = ((0.0, 1.0, 0.0), (1.0, 0.0, 0.0)),
    emissive: float = 0.0,
    jitter: float = 0.12,
) -> Material:
    """A material whose colours are ``base``/``accent`` varied a little per object."""
    base_rgb = np.clip(_a(base) * rng.uniform(1 - jitter, 1 + jitter, 3), 0.0, 1.0)
    accent_rgb = (
        base_rgb * 0.55
        if accent is None
        else np.clip(_a(accent) * rng.uniform(1 - jitter, 1 + jitter, 3), 0, 1)
    )
    directions = rng.normal(size=(4, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    frequency = 2 * np.pi * scale * rng.uniform(0.7, 1.4, (4, 1))
    waves = np.concatenate([directions * frequency, rng.uniform(0, 2 * np.pi, (4, 1))], axis=1)
    return Material(base_rgb, accent_rgb, pattern, scale, _a(axes), waves, emissive)


def box(centre, size, material: Material, part: str = "") -> Surface:
    return Surface(Box(_a(centre), _a(size) / 2), material, part)


def ball(centre, radii, material: Material, part: str = "") -> Surface:
    return Surface(Ellipsoid(_a(centre), np.broadcast_to(_a(radii), (3,)).copy()), material, part)


def capsule(a, b, radius: float, material: Material, part: str = "") -> Surface:
    return Surface(Capsule(_a(a), _a(b), radius), material, part)


def cylinder(a, b, radius: float, material: Material, part: str = "") -> Surface:
    return Surface(Cylinder(_a(a), _a(b), radius), material, part)


def posed(surfaces: Sequence[Surface], yaw: float, position: Sequence[float]) -> list[Surface]:
    rotation, translation = rotation_y(yaw), _a(position)
    return [s.moved(rotation, translation) for s in surfaces]


def extent(surfaces: Sequence[Surface]) -> tuple[np.ndarray, np.ndarray]:
    """Axis-aligned bounds (lo, hi) of the bounded shapes."""
    corners = np.concatenate([c for s in surfaces if (c := s.shape.corners()) is not None])
    return corners.min(0), corners.max(0)


def _on_ground(surfaces: list[Surface]) -> list[Surface]:
    return posed(surfaces, 0.0, (0.0, -extent(surfaces)[0][1], 0.0))


# --------------------------------------------------------------------------- palettes

SATURATED: tuple[Colour, ...] = (
    (0.75, 0.04, 0.03), (0.03, 0.15, 0.7), (0.85, 0.6, 0.02), (0.04, 0.45, 0.08), (0.85, 0.85, 0.85),
    (0.03, 0.03, 0.03), (0.45, 0.05, 0.5), (0.85, 0.3, 0.02), (0.02, 0.5, 0.6), (0.6, 0.6, 0.62),
)  # fmt: skip
MUTED: tuple[Colour, ...] = (
    (0.35, 0.22, 0.12), (0.55, 0.45, 0.32), (0.25, 0.25, 0.27), (0.6, 0.58, 0.52), (0.3, 0.12, 0.08),
    (0.18, 0.25, 0.32), (0.42, 0.38, 0.22), (0.12, 0.1, 0.09), (0.5, 0.3, 0.25), (0.3, 0.35, 0.25),
)  # fmt: skip
WOOD: tuple[Colour, ...] = ((0.35, 0.18, 0.07), (0.5, 0.3, 0.14), (0.22, 0.11, 0.05), (0.6, 0.42, 0.24))
SKIN: tuple[Colour, ...] = ((0.8, 0.55, 0.4), (0.6, 0.38, 0.25), (0.33, 0.19, 0.11), (0.88, 0.68, 0.55))
HAIR: tuple[Colour, ...] = ((0.04, 0.03, 0.02), (0.22, 0.11, 0.04), (0.6, 0.45, 0.2), (0.4, 0.4, 0.4))
TROUSERS: tuple[Colour, ...] = ((0.08, 0.12, 0.3), (0.04, 0.04, 0.04), (0.42, 0.35, 0.22), (0.28, 0.28, 0.3))
SHOES: tuple[Colour, ...] = ((0.04, 0.04, 0.04), (0.25, 0.12, 0.04), (0.75, 0.75, 0.75))
WOOD_AXES = ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0))


def _wood(rng: Rng) -> Material:
    return paint(rng, _pick(rng, WOOD), pattern="grain", scale=rng.uniform(3, 8), axes=WOOD_AXES)


# --------------------------------------------------------------------------- people


def _limb(flex: float, abduct: float, side: int) -> np.ndarray:
    """Unit direction of a limb hanging down, swung forward by ``flex`` and outward (to the
    person's ``side``: +1 left = +x, -1 right) by ``abduct`` radians."""
    return _a([side * np.sin(abduct) * np.cos(flex), -np.cos(abduct) * np.cos(flex), np.sin(flex)])


def person(rng: Rng, shirts: Sequence[Colour]) -> list[Surface]:
    """An articulated person facing +z, feet on y = 0, every shape named by its PASCAL-Part
    part. Their left is +x, so a person facing the camera shows their left on the image right."""
    s = rng.uniform(0.55, 0.75) if rng.random() < 0.15 else rng.uniform(0.9, 1.08)  # child or adult
    skin = paint(rng, _pick(rng, SKIN), jitter=0.05)
    hair = paint(rng, _pick(rng, HAIR), pattern="noise", scale=25)
    pattern = _pick(rng, ("solid", "solid", "stripes", "checker"))
    shirt = paint(rng, _pick(rng, shirts), _pick(rng, shirts), pattern, scale=8)
    trousers = paint(rng, _pick(rng, TROUSERS), pattern="noise", scale=12)
    shoes = paint(rng, _pick(rng, SHOES))
    forearms = shirt if rng.random() < 0.5 else skin  # long or short sleeves
    shins = trousers if rng.random() < 0.8 else skin  # trousers or shorts

    pose = _pick(rng, ("stand", "stand", "walk", "walk", "wave", "reach"))
    swing = rng.uniform(0.2, 0.45) if pose == "walk" else 0.0
    step = _pick(rng, (-1, 1))
    surfaces = [
        ball((0, 1.17 * s, 0), (0.19 * s, 0.32 * s, 0.12 * s), shirt, "torso"),
        capsule((0, 1.45 * s, 0), (0, 1.55 * s, 0.01 * s), 0.05 * s, skin, "neck"),
        ball((0, 1.65 * s, 0.01 * s), (0.085 * s, 0.11 * s, 0.1 * s), skin, "head"),
    ]
    if rng.random() < 0.5:
        surfaces.append(ball((0, 1.68 * s, -0.02 * s), (0.092 * s, 0.1 * s, 0.1 * s), hair, "hair"))
    elif rng.random() < 0.8:  # long hair framing the face
        surfaces.append(ball((0, 1.62 * s, -0.035 * s), (0.1 * s, 0.16 * s, 0.1 * s), hair, "hair"))
    waving = _pick(rng, (-1, 1))
    for side, tag in ((1, "l"), (-1, "r")):
        hip_flex = step * side * swing + rng.normal(0, 0.05)
        knee = rng.uniform(0, 0.15) + (rng.uniform(0.2, 0.6) if hip_flex < -0.1 else 0.0)
        abduct = rng.uniform(0.0, 0.08)
        hip = _a([side * 0.09 * s, 0.92 * s, 0])
        knee_at = hip + 0.44 * s * _limb(hip_flex, abduct, side)
        ankle = knee_at + 0.42 * s * _limb(hip_flex - knee, abduct, side)
        surfaces += [
            capsule(hip, knee_at, 0.075 * s, trousers, f"{tag}uleg"),
            capsule(knee_at, ankle, 0.055 * s, shins, f"{tag}lleg"),
            ball(ankle + _a([0, -0.02, 0.06]) * s, _a([0.045, 0.04, 0.11]) * s, shoes, f"{tag}foot"),
        ]
        arm_flex, arm_abduct, elbow = (
            -0.8 * hip_flex + rng.normal(0, 0.1),
            rng.uniform(0.05, 0.25),
            rng.uniform(0, 0.5),
        )
        if pose == "wave" and side == waving:
            arm_flex, arm_abduct, elbow = rng.uniform(-0.2, 0.4), rng.uniform(2.0, 2.7), rng.uniform(0.0, 0.7)
        elif pose == "reach":
            arm_flex, arm_abduct, elbow = rng.uniform(0.8, 1.5), rng.uniform(0.0, 0.3), rng.uniform(0.0, 0.3)
        shoulder = _a([side * 0.16 * s, 1.4 * s, 0])
        elbow_at = shoulder + 0.29 * s * _limb(arm_flex, arm_abduct, side)
        forearm = _limb(arm_flex + elbow, arm_abduct, side)
        wrist = elbow_at + 0.25 * s * forearm
        surfaces += [
            capsule(shoulder, elbow_at, 0.05 * s, shirt, f"{tag}uarm"),
            capsule(elbow_at, wrist, 0.04 * s, forearms, f"{tag}larm"),
            ball(wrist + 0.04 * s * forearm, 0.045 * s, skin, f"{tag}hand"),
        ]
    return _on_ground(surfaces)


# --------------------------------------------------------------------------- VOC objects


def _aeroplane(rng: Rng) -> list[Surface]:
    length = rng.uniform(12, 35)
    r = 0.055 * length
    body = paint(
        rng, _pick(rng, ((0.85, 0.85, 0.85), (0.7, 0.72, 0.75))), _pick(rng, SATURATED), "stripes", 0.3 / r
    )
    wing = paint(rng, (0.6, 0.62, 0.65))
    parts = [
        ball((0, 0, 0), (r, r, length / 2), body),
        box((0, -0.3 * r, 0.05 * length), (0.9 * length, 0.15 * r, 0.16 * length), wing),
        box((0, 1.6 * r, -0.43 * length), (0.12 * r, 2.2 * r, 0.1 * length), body),
        box((0, 0.3 * r, -0.44 * length), (0.3 * length, 0.12 * r, 0.07 * length), wing),
    ]
    if rng.random() < 0.6:
        for x in (-0.22 * length, 0.22 * length):
            parts.append(cylinder((x, -0.9 * r, 0.14 * length), (x, -0.9 * r, 0.0), 0.35 * r, wing))
    return _on_ground(parts)


def _bicycle(rng: Rng) -> list[Surface]:
    tyre, rim = paint(rng, (0.03, 0.03, 0.03)), paint(rng, (0.5, 0.5, 0.52))
    frame = paint(rng, _pick(rng, SATURATED))
    hub_b, hub_f, seat, head, crank = (
        _a(p) for p in ((0, 0.34, -0.52), (0, 0.34, 0.52), (0, 0.85, -0.2), (0, 0.88, 0.35), (0, 0.3, 0))
    )
    parts = [cylinder((-0.02, 0.34, z), (0.02, 0.34, z), 0.34, tyre) for z in (-0.52, 0.52)]
    parts += [cylinder((-0.03, 0.34, z), (0.03, 0.34, z), 0.28, rim) for z in (-0.52, 0.52)]
    parts += [
        capsule(a, b, 0.025, frame)
        for a, b in ((hub_b, seat), (seat, head), (head, crank), (crank, hub_b), (crank, seat), (head, hub_f))
    ]
    parts += [
        capsule((-0.25, 1.0, 0.4), (0.25, 1.0, 0.4), 0.02, frame),
        capsule(head, (0, 1.0, 0.4), 0.02, frame),
        ball((0, 0.9, -0.22), (0.08, 0.03, 0.13), paint(rng, (0.05, 0.05, 0.05))),
    ]
    return _on_ground(parts)


def _bird(rng: Rng) -> list[Surface]:
    k = rng.uniform(1.5, 3.0)
    feathers = paint(
        rng,
        _pick(rng, ((0.3, 0.2, 0.1), (0.4, 0.4, 0.42), (0.05, 0.05, 0.05), (0.8, 0.8, 0.8), (0.1, 0.2, 0.6))),
        pattern="noise",
        scale=12 / k,
    )
    beak = paint(rng, (0.85, 0.5, 0.05))
    parts = [
        ball((0, 0.2 * k, 0), _a([0.06, 0.065, 0.13]) * k, feathers),
        ball((0, 0.29 * k, 0.11 * k), 0.045 * k, feathers),
        ball((0, 0.285 * k, 0.165 * k), _a([0.012, 0.012, 0.035]) * k, beak),
        box((0, 0.22 * k, -0.17 * k), _a([0.08, 0.01, 0.12]) * k, feathers),
    ]
    if rng.random() < 0.5:  # spread wings
        parts += [box((x * k, 0.24 * k, 0), _a([0.26, 0.01, 0.09]) * k, feathers) for x in (-0.16, 0.16)]
    else:
        parts += [
            capsule((x * k, 0.15 * k, 0), (x * k, 0, 0.01 * k), 0.007 * k, beak) for x in (-0.025, 0.025)
        ]
    return _on_ground(parts)


def _boat(rng: Rng) -> list[Surface]:
    length = rng.uniform(4, 9)
    beam = 0.32 * length
    hull = paint(rng, _pick(rng, SATURATED), (0.85, 0.85, 0.85), "stripes", 1.2)
    white = paint(rng, (0.85, 0.85, 0.82))
    parts = [
        box((0, 0.1, 0), (beam, 1.0, length), hull),
        ball((0, 0.1, 0.4 * length), (beam / 2, 0.5, 0.25 * length), hull),
        box((0, 0.95, -0.1 * length), (0.7 * beam, 0.7, 0.35 * length), white),
    ]
    if rng.random() < 0.6:  # a sail boat
        parts += [
            cylinder((0, 0.6, 0.1 * length), (0, 0.6 + 0.6 * length, 0.1 * length), 0.05, white),
            box((0, 0.7 + 0.3 * length, -0.08 * length), (0.02, 0.5 * length, 0.35 * length), white),
        ]
    return parts  # floats: its bottom is under the water plane


def _bottle(rng: Rng) -> list[Surface]:
    k = rng.uniform(1.8, 2.8)
    glass = paint(
        rng,
        _pick(rng, ((0.05, 0.3, 0.05), (0.3, 0.12, 0.03), (0.35, 0.5, 0.6))),
        (0.85, 0.85, 0.8),
        "stripes",
        2.0 / k,
    )
    cap = paint(rng, _pick(rng, SATURATED))
    return [
        cylinder((0, 0, 0), (0, 0.2 * k, 0), 0.04 * k, glass),
        ball((0, 0.2 * k, 0), 0.04 * k, glass),
        cylinder((0, 0.21 * k, 0), (0, 0.3 * k, 0), 0.015 * k, glass),
        cylinder((0, 0.3 * k, 0), (0, 0.32 * k, 0), 0.017 * k, cap),
    ]


def _wheels(rng: Rng, zs: Sequence[float], width: float, radius: float) -> list[Surface]:
    rubber = paint(rng, (0.03, 0.03, 0.03))
    return [cylinder((-width / 2, radius, z), (width / 2, radius, z), radius, rubber) for z in zs]


def _bus(rng: Rng) -> list[Surface]:
    length, width, height = rng.uniform(9, 12), 2.5, 2.8
    body = paint(rng, _pick(rng, SATURATED[:4] + SATURATED[7:]))
    glass = paint(rng, (0.05, 0.07, 0.1), (0.3, 0.35, 0.4), "stripes", 0.8, axes=((0, 0, 1), (1, 0, 0)))
    return [
        box((0, 0.35 + height / 2, 0), (width, height, length), body),
        box((0, 0.35 + 0.62 * height, 0), (width + 0.04, 0.8, length - 0.6), glass),
        *_wheels(rng, (-length / 2 + 1.8, length / 2 - 2.0), width + 0.04, 0.5),
    ]


def _car(rng: Rng) -> list[Surface]:
    length, width = rng.uniform(3.8, 4.8), 1.8
    body = paint(rng, _pick(rng, SATURATED))
    glass = paint(rng, (0.04, 0.05, 0.07))
    return [
        box((0, 0.62, 0), (width, 0.72, length), body),
        box((0, 1.18, -0.08 * length), (0.9 * width, 0.42, 0.48 * length), glass),
        box((0, 1.42, -0.08 * length), (0.88 * width, 0.06, 0.42 * length), body),
        *_wheels(rng, (-0.32 * length, 0.32 * length), width + 0.04, 0.33),
    ]


def _train(rng: Rng) -> list[Surface]:
    length, width = rng.uniform(15, 25), 3.0
    body = paint(rng, _pick(rng, SATURATED), _pick(rng, SATURATED), "stripes", 0.4)
    glass = paint(rng, (0.05, 0.06, 0.08))
    return [
        box((0, 2.3, 0), (width, 3.6, length), body),
        ball((0, 2.1, length / 2), (width / 2, 1.7, 1.6), body),
        box((0, 3.0, 0), (width + 0.04, 0.8, length - 1.0), glass),
        *_wheels(rng, np.linspace(-length / 2 + 1.5, length / 2 - 1.5, 4), width - 0.2, 0.5),
    ]


def _tvmonitor(rng: Rng) -> list[Surface]:
    w = rng.uniform(0.5, 0.9)
    h, y = 0.6 * w, rng.uniform(0.9, 1.2)
    frame = paint(rng, _pick(rng, ((0.03, 0.03, 0.03), (0.2, 0.2, 0.22), (0.7, 0.7, 0.7))))
    screen = paint(
        rng, _pick(rng, SATURATED), _pick(rng, SATURATED), "noise", 4 / w, emissive=rng.uniform(0.5, 0.9)
    )
    return [
        box((0, y, 0), (w + 0.06, h + 0.06, 0.06), frame),
        box((0, y, 0.031), (w, h, 0.006), screen),
        cylinder((0, 0.02, -0.05), (0, y - h / 2, -0.05), 0.03, frame),
        box((0, 0.01, -0.05), (0.35, 0.02, 0.25), frame),
    ]


def _chair(rng: Rng, palette: Sequence[Colour] = SATURATED) -> list[Surface]:
    w, seat = rng.uniform(0.42, 0.55), rng.uniform(0.42, 0.5)
    mat = _wood(rng) if rng.random() < 0.4 else paint(rng, _pick(rng, palette))
    legs = mat if rng.random() < 0.6 else paint(rng, (0.5, 0.5, 0.52))
    leg = w / 2 - 0.03
    return [
        box((0, seat, 0), (w, 0.05, w), mat),
        box((0, seat + 0.27, -leg), (w, 0.5, 0.05), mat),
        *[box((x, seat / 2, z), (0.04, seat, 0.04), legs) for x in (-leg, leg) for z in (-leg, leg)],
    ]


def _table(rng: Rng, height: float, palette: Sequence[Colour] = SATURATED) -> list[Surface]:
    length, depth = rng.uniform(1.1, 1.9), rng.uniform(0.7, 1.0)
    top = _wood(rng) if rng.random() < 0.6 else paint(rng, _pick(rng, palette))
    parts = [box((0, height - 0.025, 0), (length, 0.05, depth), top)]
    if rng.random() < 0.3:  # a tablecloth hanging over the edges
        cloth = paint(rng, _pick(rng, palette), (0.9, 0.9, 0.9), "checker", 6, axes=WOOD_AXES)
        parts = [box((0, height - 0.15, 0), (length + 0.1, 0.3, depth + 0.1), cloth)]
    lx, lz = length / 2 - 0.06, depth / 2 - 0.06
    parts += [
        box((x, (height - 0.05) / 2, z), (0.06, height - 0.05, 0.06), top)
        for x in (-lx, lx)
        for z in (-lz, lz)
    ]
    return parts


def _motorbike(rng: Rng) -> list[Surface]:
    paintwork = paint(rng, _pick(rng, SATURATED))
    metal = paint(rng, (0.55, 0.55, 0.58))
    black = paint(rng, (0.04, 0.04, 0.04))
    return [
        *_wheels(rng, (-0.7, 0.7), 0.12, 0.32),
        ball((0, 0.6, -0.05), (0.17, 0.2, 0.5), paintwork),
        ball((0, 0.82, 0.2), (0.15, 0.12, 0.25), paintwork),
        ball((0, 0.84, -0.3), (0.14, 0.06, 0.3), black),
        capsule((0, 0.32, 0.7), (0, 0.98, 0.5), 0.04, metal),
        capsule((-0.35, 1.0, 0.45), (0.35, 1.0, 0.45), 0.025, metal),
    ]


def _pottedplant(rng: Rng) -> list[Surface]:
    k = rng.uniform(1.0, 2.0)
    pot = paint(rng, _pick(rng, ((0.55, 0.22, 0.1), (0.8, 0.8, 0.78), (0.2, 0.2, 0.22))))
    leaves = paint(rng, (0.05, 0.3, 0.04), (0.15, 0.5, 0.08), "patches", 8 / k)
    parts = [cylinder((0, 0, 0), (0, 0.3 * k, 0), 0.15 * k, pot)]
    for _ in range(int(rng.integers(1, 4))):
        offset = rng.uniform(-0.12, 0.12, 3) * k
        parts.append(ball(_a([0, 0.62 * k, 0]) + offset, rng.uniform(0.22, 0.35, 3) * k, leaves))
    return _on_ground(parts)


def _sofa(rng: Rng, palette: Sequence[Colour] = SATURATED) -> list[Surface]:
    width, depth = rng.uniform(1.6, 2.2), 0.9
    fabric = paint(rng, _pick(rng, palette), pattern="noise", scale=6)
    return [
        box((0, 0.22, 0), (width, 0.44, depth), fabric),
        box((0, 0.66, -depth / 2 + 0.12), (width, 0.44, 0.24), fabric),
        *[box((x, 0.55, 0), (0.2, 0.3, depth), fabric) for x in (-width / 2 + 0.1, width / 2 - 0.1)],
    ]


def _quadruped(
    rng: Rng,
    length: float,
    body: float,
    legs: float,
    head: float,
    neck: float,
    neck_angle: float,
    coat: Material,
    limbs: Material | None = None,
    face: Material | None = None,
) -> list[Surface]:
    """A four-legged animal facing +z: body, legs, neck, head, tail."""
    limbs, face = limbs or coat, face or coat
    half_width = 0.85 * body
    y = legs + 0.8 * body
    leg_r = 0.22 * body
    parts = [ball((0, y, 0), (half_width, body, length / 2), coat)]
    for x in (-0.55 * half_width, 0.55 * half_width):
        for z in (-0.33 * length, 0.33 * length):
            stride = rng.normal(0, 0.08) * legs
            parts.append(capsule((x, y - 0.3 * body, z), (x, leg_r, z + stride), leg_r, limbs))
    neck_dir = _a([0, np.sin(neck_angle), np.cos(neck_angle)])
    start = _a([0, y + 0.3 * body, 0.42 * length])
    end = start + neck * neck_dir
    parts += [
        capsule(start, end, 0.35 * body, coat),
        ball(end + _a([0, 0, 0.6 * head]), (0.7 * head, 0.75 * head, 1.3 * head), face),
        capsule(
            (0, y + 0.3 * body, -length / 2),
            (0, y - 0.8 * body, -length / 2 - 0.1 * length),
            0.06 * body,
            coat,
        ),
    ]
    return parts


def _cow(rng: Rng) -> list[Surface]:
    if rng.random() < 0.6:
        coat = paint(rng, (0.85, 0.85, 0.82), (0.03, 0.03, 0.03), "patches", 1.2)
    else:
        coat = paint(rng, _pick(rng, ((0.35, 0.18, 0.08), (0.2, 0.1, 0.05))))
    return _quadruped(rng, 2.0, 0.38, 0.7, 0.2, 0.3, 0.35, coat)


def _horse(rng: Rng) -> list[Surface]:
    coat = paint(
        rng, _pick(rng, ((0.3, 0.13, 0.05), (0.05, 0.04, 0.03), (0.8, 0.78, 0.75), (0.5, 0.25, 0.1)))
    )
    return _quadruped(rng, 1.8, 0.33, 0.95, 0.17, 0.65, 0.95, coat)


def _sheep(rng: Rng) -> list[Surface]:
    wool = paint(rng, (0.85, 0.8, 0.68), (0.6, 0.55, 0.45), "noise", 14)
    dark = paint(rng, (0.08, 0.07, 0.06))
    return _quadruped(rng, 1.1, 0.33, 0.35, 0.12, 0.15, 0.5, wool, limbs=dark, face=dark)


def _dog(rng: Rng) -> list[Surface]:
    coat = paint(
        rng, _pick(rng, ((0.7, 0.45, 0.15), (0.25, 0.14, 0.06), (0.04, 0.04, 0.04), (0.85, 0.82, 0.75)))
    )
    k = rng.uniform(1.0, 1.5)
    return _quadruped(rng, 0.8 * k, 0.17 * k, 0.33 * k, 0.11 * k, 0.14 * k, 0.8, coat)


def _cat(rng: Rng) -> list[Surface]:
    coat = paint(
        rng,
        _pick(rng, ((0.45, 0.45, 0.45), (0.8, 0.45, 0.12), (0.05, 0.05, 0.05))),
        pattern="stripes",
        scale=18,
    )
    return _quadruped(rng, 0.5, 0.1, 0.18, 0.075, 0.05, 0.7, coat)


@dataclass(frozen=True)
class _VocSpec:
    """How a VOC class enters a PASCAL scene."""

    build: Callable[[Rng], list[Surface]]
    weight: float  # relative frequency
    apparent: tuple[float, float] = (0.35, 0.8)  # object size / image height
    where: str = "ground"  # ground | air | water (stands on the ground; water makes the ground water)
    facing: str = "any"  # any | side | front


# Classes whose context name NYU also has (chair, sofa, table, tvmonitor, person) are the
# most frequent, so most object pixels have valid distilled normals, as in the real data.
VOC_OBJECTS: dict[str, _VocSpec] = {
    "aeroplane": _VocSpec(_aeroplane, 0.5, (0.28, 0.56), "air", "side"),
    "bicycle": _VocSpec(_bicycle, 0.6, (0.42, 0.84), facing="side"),
    "bird": _VocSpec(_bird, 0.6, (0.21, 0.49)),
    "boat": _VocSpec(_boat, 0.5, (0.42, 0.84), "water", "side"),
    "bottle": _VocSpec(_bottle, 0.6, (0.28, 0.63)),
    "bus": _VocSpec(_bus, 0.5, (0.42, 0.84), facing="side"),
    "car": _VocSpec(_car, 0.6, (0.35, 0.7), facing="side"),
    "cat": _VocSpec(_cat, 0.5, (0.28, 0.63)),
    "chair": _VocSpec(_chair, 3.0, (0.35, 0.77)),
    "cow": _VocSpec(_cow, 0.5, (0.35, 0.7), facing="side"),
    "diningtable": _VocSpec(lambda rng: _table(rng, rng.uniform(0.7, 0.78)), 2.5, (0.28, 0.63)),
    "dog": _VocSpec(_dog, 0.6, (0.28, 0.63), facing="side"),
    "horse": _VocSpec(_horse, 0.5, (0.42, 0.84), facing="side"),
    "motorbike": _VocSpec(_motorbike, 0.5, (0.42, 0.77), facing="side"),
    "pottedplant": _VocSpec(_pottedplant, 0.7, (0.35, 0.7)),
    "sheep": _VocSpec(_sheep, 0.5, (0.28, 0.63), facing="side"),
    "sofa": _VocSpec(_sofa, 2.5, (0.28, 0.63), facing="front"),
    "train": _VocSpec(_train, 0.4, (0.42, 0.77), facing="side"),
    "tvmonitor": _VocSpec(_tvmonitor, 2.5, (0.35, 0.7), facing="front"),
}
PERSON_SPEC = _VocSpec(lambda rng: person(rng, SATURATED), 0.0, (0.5, 1.2), facing="front")


# --------------------------------------------------------------------------- PASCAL scenes

_GROUNDS = {  # context class -> (base, accent, pattern, scale)
    "floor": ((0.42, 0.4, 0.36), (0.3, 0.29, 0.27), "checker", 1.2),
    "grass": ((0.1, 0.3, 0.04), (0.2, 0.42, 0.08), "noise", 0.8),
    "road": ((0.1, 0.1, 0.11), (0.17, 0.17, 0.18), "noise", 2.0),
    "ground": ((0.38, 0.27, 0.15), (0.28, 0.2, 0.1), "noise", 1.0),
    "water": ((0.03, 0.12, 0.25), (0.1, 0.28, 0.42), "noise", 0.6),
}


def _stuff(name: str, surfaces: list[Surface]) -> SceneObject:
    return SceneObject(name=name, label=0, surfaces=surfaces, context=name)


def _pascal_background(rng: Rng, scene: Scene) -> None:
    """Buildings, a wall, trees and mountains behind the objects: VOC background."""
    if rng.random() < 0.5:
        for x in np.sort(rng.uniform(-45, 45, int(rng.integers(2, 6)))):
            w, h, z = rng.uniform(8, 22), rng.uniform(6, 30), rng.uniform(-65, -28)
            facade = paint(
                rng,
                _pick(rng, ((0.5, 0.48, 0.45), (0.45, 0.2, 0.12), (0.6, 0.52, 0.4))),
                (0.1, 0.12, 0.15),
                "checker",
                0.35,
                axes=((1, 0, 0), (0, 1, 0)),
            )
            scene.add(_stuff("building", [box((x, h / 2, z), (w, h, rng.uniform(8, 15)), facade)]))
    if rng.random() < 0.3:
        z, h = rng.uniform(-30, -12), rng.uniform(1.5, 3.5)
        brick = paint(
            rng,
            _pick(rng, ((0.45, 0.2, 0.12), (0.55, 0.53, 0.5))),
            pattern="checker",
            scale=3,
            axes=((1, 0, 0), (0, 1, 0)),
        )
        scene.add(_stuff("wall", [box((0, h / 2, z), (120, h, 0.3), brick)]))
    if rng.random() < 0.6:
        for _ in range(int(rng.integers(1, 6))):
            x, z = rng.uniform(-30, 30), rng.uniform(-45, -10)
            trunk_h, crown = rng.uniform(2, 4), rng.uniform(2, 4)
            bark = paint(rng, (0.2, 0.12, 0.06))
            leaves = paint(rng, (0.05, 0.22, 0.03), (0.12, 0.35, 0.05), "patches", 1.5)
            tree = [cylinder((x, 0, z), (x, trunk_h + crown * 0.5, z), rng.uniform(0.2, 0.4), bark)]
            tree.append(ball((x, trunk_h + crown, z), (crown, crown * rng.uniform(1.0, 1.4), crown), leaves))
            scene.add(_stuff("tree", tree))
    if rng.random() < 0.3:
        rock = paint(rng, (0.25, 0.27, 0.25), (0.35, 0.33, 0.3), "noise", 0.02)
        for _ in range(int(rng.integers(1, 4))):
            r = rng.uniform(150, 300)
            centre = (rng.uniform(-400, 400), 0, rng.uniform(-600, -300))
            scene.add(_stuff("mountain", [ball(centre, (r, rng.uniform(40, 140), r), rock)]))


def _place(
    rng: Rng, camera: Camera, parts: list[Surface], spec: _VocSpec, taken: list, zoom: float = 1.0
) -> list[Surface] | None:
    """Turn and move an object so that it stands in view at a distance that gives it its
    apparent size (times ``zoom``), clear of the objects already placed (circles on the
    ground in ``taken``)."""
    facing = {"any": rng.uniform(-np.pi, np.pi), "side": _pick(rng, (-1, 1)) * np.pi / 2 + rng.normal(0, 0.4)}
    facing["front"] = rng.normal(0, 0.6) + (np.pi if rng.random() < 0.15 else 0.0)
    yaw = facing[spec.facing]
    lo, hi = extent(parts)
    radius = float(np.hypot(np.maximum(-lo, hi)[0], np.maximum(-lo, hi)[2]))
    size = max(hi[1] - lo[1], radius)
    cam_h = camera.position[1]
    pitch = -np.arcsin(camera.rotation[1, 2])  # how far the camera looks down
    bottom = np.tan(pitch + np.arctan(camera.height / 2 / camera.focal))  # slope of the lowest ray
    # nearest distance at which 60 % of a standing object is above the bottom of the image
    nearest = max((cam_h - 0.4 * hi[1]) / (0.95 * bottom), radius + 0.8)
    for _ in range(15):
        d = camera.focal * size / (zoom * rng.uniform(*spec.apparent) * camera.height)
        y = 0.0
        if spec.where == "air":  # somewhere in the upper part of the view, above the ground
            elevation = -pitch + rng.uniform(0.1, 0.5) * np.arctan(camera.height / 2 / camera.focal)
            y = max(cam_h + d * np.tan(elevation), hi[1] - lo[1] + 2.0)
        else:
            d = max(d, nearest)
        x = rng.uniform(-0.8, 0.8) / zoom * d * camera.width / 2 / camera.focal  # subjects near the middle
        if all(np.hypot(x - tx, -d - tz) > radius + tr for tx, tz, tr in taken):
            taken.append((x, -d, radius))
            return posed(parts, yaw, (x, y, -d))
    return None


def pascal_scene(rng: Rng, size: tuple[int, int]) -> Scene:
    """An outdoor scene: objects of the VOC classes on the ground, in daylight."""
    elevation, azimuth = rng.uniform(0.35, 1.2), rng.uniform(0, 2 * np.pi)
    overcast = rng.random() < 0.2
    horizon = np.clip(_a([0.6, 0.72, 0.85]) * rng.uniform(0.85, 1.1, 3), 0, 1)
    zenith = np.clip(_a([0.12, 0.3, 0.7]) * rng.uniform(0.8, 1.2, 3), 0, 1)
    if overcast:
        horizon = zenith = _a([0.65, 0.67, 0.7]) * rng.uniform(0.8, 1.1)
    lighting = Lighting(
        ambient=_a([0.16, 0.18, 0.22]) * (2.0 if overcast else 1.0),
        skylight=_a([0.12, 0.16, 0.25]),
        sun_direction=_a(
            [np.cos(elevation) * np.sin(azimuth), np.sin(elevation), np.cos(elevation) * np.cos(azimuth)]
        ),
        sun=_a([1.0, 0.93, 0.8]) * rng.uniform(2.0, 2.6) * (0.3 if overcast else 1.0),
        fog=horizon * 0.9,
        fog_distance=rng.uniform(150, 400),
        exposure=rng.uniform(0.85, 1.1),
    )
    people = int(rng.choice([0, 1, 2, 3], p=[0.4, 0.36, 0.18, 0.06]))  # ~40 % of images without a person
    names = list(VOC_OBJECTS)
    weights = np.array([VOC_OBJECTS[n].weight for n in names])
    count = int(rng.integers(0, 3) if people else rng.integers(1, 4))
    chosen = ["person"] * people + [str(n) for n in rng.choice(names, size=count, p=weights / weights.sum())]
    chosen = [chosen[k] for k in rng.permutation(len(chosen))]
    specs = [PERSON_SPEC if name == "person" else VOC_OBJECTS[name] for name in chosen]
    built = [spec.build(rng) for spec in specs]

    # The first object is the subject of the photo: the camera is held at about its height
    # (looking up at aeroplanes) and it is placed nearer and larger than the others.
    subject_height = extent(built[0])[1][1]
    if specs[0].where == "air":
        height, pitch = rng.uniform(1.0, 1.8), rng.uniform(-0.3, 0.0)
    else:
        height = float(np.clip(subject_height * rng.uniform(0.7, 1.1), 0.4, 1.8))
        pitch = rng.uniform(0.05, 0.3)
    camera = Camera.aimed((0.0, height, 0.0), 0.0, pitch, np.radians(rng.uniform(50, 65)), size)
    scene = Scene(camera, lighting, sky=(horizon, zenith), noise=0.015)
    grounds = ("floor", "floor", "floor", "grass", "road", "ground")  # the floor (paving) most often
    ground = "water" if "boat" in chosen else _pick(rng, grounds)
    base, accent, pattern, scale = _GROUNDS[ground]
    floor = paint(rng, base, accent, pattern, scale, axes=WOOD_AXES)
    scene.add(_stuff(ground, [Surface(Plane(_a([0, 0, 0]), _a([0, 1, 0])), floor)]))
    _pascal_background(rng, scene)

    taken: list[tuple[float, float, float]] = []
    for k, (name, spec, parts) in enumerate(zip(chosen, specs, built)):
        surfaces = _place(rng, camera, parts, spec, taken, zoom=1.6 if k == 0 else 1.0)
        if surfaces is not None:
            scene.add(SceneObject(name, VOC_CLASSES.index(name), surfaces, VOC_TO_CONTEXT[name]))
    return scene


# --------------------------------------------------------------------------- NYUD rooms


@dataclass
class _Thing:
    """An object built in its own frame; ``top`` = (y, x0, x1, z0, z1): a surface things can
    stand on."""

    surfaces: list[Surface]
    top: tuple[float, float, float, float, float] | None = None


def _topped(surfaces: list[Surface], inset: float = 0.08) -> _Thing:
    lo, hi = extent(surfaces)
    return _Thing(surfaces, (hi[1], lo[0] + inset, hi[0] - inset, lo[2] + inset, hi[2] - inset))


def _cabinet(rng: Rng) -> _Thing:
    w, h, d = rng.uniform(0.6, 1.4), rng.uniform(0.7, 2.0), rng.uniform(0.4, 0.6)
    doors = paint(
        rng,
        _pick(rng, (*WOOD, (0.75, 0.74, 0.7), (0.4, 0.4, 0.42))),
        pattern="stripes",
        scale=2 / w,
        axes=((1, 0, 0), (0, 1, 0)),
    )
    surfaces = [box((0, h / 2, 0), (w, h, d), doors)]
    return _topped(surfaces) if h < 1.2 else _Thing(surfaces)


def _bed(rng: Rng) -> _Thing:
    w, length = rng.uniform(1.0, 1.9), rng.uniform(1.9, 2.1)
    frame = _wood(rng)
    duvet = paint(
        rng,
        _pick(rng, MUTED + ((0.75, 0.75, 0.72),)),
        _pick(rng, MUTED),
        _pick(rng, ("solid", "stripes", "checker", "noise")),
        4,
    )
    surfaces = [
        box((0, 0.2, 0), (w + 0.1, 0.4, length + 0.1), frame),
        box((0, 0.5, 0), (w, 0.22, length), duvet),
        box((0, 0.55, -length / 2 - 0.03), (w + 0.12, 1.1, 0.06), frame),
    ]
    return _Thing(surfaces, (0.61, -w / 2 + 0.1, w / 2 - 0.1, -length / 2 + 0.05, -length / 2 + 0.6))


def _indoor_sofa(rng: Rng) -> _Thing:
    surfaces = _sofa(rng, MUTED)
    lo, hi = extent(surfaces)
    return _Thing(surfaces, (0.44, lo[0] + 0.25, hi[0] - 0.25, lo[2] + 0.3, hi[2] - 0.05))


def _door(rng: Rng) -> _Thing:
    w, h = rng.uniform(0.8, 0.95), rng.uniform(2.0, 2.1)
    panel = _wood(rng) if rng.random() < 0.6 else paint(rng, (0.75, 0.74, 0.7))
    return _Thing(
        [
            box((0, h / 2, 0.02), (w, h, 0.04), panel),
            ball((0.35 * w, 1.0, 0.05), 0.03, paint(rng, (0.6, 0.55, 0.4))),
        ]
    )


def _window(rng: Rng) -> _Thing:
    w, y0, y1 = rng.uniform(0.8, 1.8), rng.uniform(0.8, 1.0), rng.uniform(1.9, 2.3)
    frame = paint(rng, (0.8, 0.8, 0.78))
    outside = paint(rng, (0.7, 0.8, 0.9), (0.4, 0.55, 0.35), "noise", 1.5, emissive=1.0)
    return _Thing(
        [
            box((0, (y0 + y1) / 2, 0.02), (w + 0.1, y1 - y0 + 0.1, 0.04), frame),
            box((0, (y0 + y1) / 2, 0.045), (w, y1 - y0, 0.01), outside),
        ]
    )


def _bookshelf(rng: Rng) -> _Thing:
    w, h, d = rng.uniform(0.6, 1.2), rng.uniform(1.2, 2.0), 0.32
    wood = _wood(rng)
    books = paint(
        rng,
        _pick(rng, SATURATED),
        _pick(rng, SATURATED),
        "bands",
        25,
        axes=((1, 0, 0), (0, 1, 0)),
        jitter=0.3,
    )
    surfaces = [box((0, h / 2, -0.02), (w, h, d - 0.04), books)]
    surfaces += [box((0, y, 0), (w + 0.04, 0.03, d), wood) for y in np.arange(0.015, h, 0.35)]
    surfaces += [box((x, h / 2, 0), (0.03, h, d), wood) for x in (-w / 2, w / 2)]
    return _Thing(surfaces)


def _picture(rng: Rng) -> _Thing:
    w, h, y = rng.uniform(0.3, 0.9), rng.uniform(0.25, 0.7), rng.uniform(1.3, 1.8)
    frame = paint(rng, _pick(rng, (*WOOD, (0.05, 0.05, 0.05), (0.7, 0.6, 0.3))))
    canvas = paint(rng, _pick(rng, SATURATED + MUTED), _pick(rng, SATURATED + MUTED), "noise", 5 / w)
    return _Thing(
        [box((0, y, 0.015), (w, h, 0.03), frame), box((0, y, 0.032), (w - 0.06, h - 0.06, 0.005), canvas)]
    )


def _counter(rng: Rng) -> _Thing:
    length, depth = rng.uniform(1.2, 2.5), 0.6
    base = paint(
        rng, _pick(rng, (*WOOD, (0.75, 0.74, 0.7))), pattern="stripes", scale=1.6, axes=((1, 0, 0), (0, 1, 0))
    )
    stone = paint(
        rng, _pick(rng, ((0.3, 0.3, 0.3), (0.7, 0.68, 0.62), (0.1, 0.1, 0.1))), pattern="noise", scale=10
    )
    return _topped(
        [
            box((0, 0.43, 0), (length, 0.86, depth), base),
            box((0, 0.88, 0.02), (length + 0.04, 0.04, depth + 0.04), stone),
        ]
    )


def _blinds(rng: Rng) -> _Thing:
    w, y0, y1 = rng.uniform(0.8, 1.6), rng.uniform(0.9, 1.3), rng.uniform(1.9, 2.3)
    slats = paint(rng, _pick(rng, ((0.8, 0.78, 0.72), (0.6, 0.5, 0.35))), pattern="stripes", scale=15)
    return _Thing([box((0, (y0 + y1) / 2, 0.03), (w, y1 - y0, 0.02), slats)])


def _desk(rng: Rng) -> _Thing:
    length, depth = rng.uniform(1.1, 1.6), rng.uniform(0.6, 0.75)
    top = _wood(rng) if rng.random() < 0.6 else paint(rng, _pick(rng, ((0.75, 0.74, 0.7), (0.2, 0.2, 0.2))))
    surfaces = [
        box((0, 0.735, 0), (length, 0.03, depth), top),
        box((length / 2 - 0.22, 0.36, 0), (0.42, 0.72, depth - 0.04), top),
    ]
    surfaces += [
        box((-length / 2 + 0.03, 0.36, z), (0.05, 0.72, 0.05), top)
        for z in (-depth / 2 + 0.03, depth / 2 - 0.03)
    ]
    return _topped(surfaces, inset=0.05)


def _shelves(rng: Rng) -> _Thing:
    w, y = rng.uniform(0.6, 1.2), rng.uniform(1.1, 1.4)
    board = _wood(rng) if rng.random() < 0.5 else paint(rng, (0.75, 0.74, 0.7))
    return _Thing(
        [box((0, y + 0.32 * i, 0.13), (w, 0.03, 0.25), board) for i in range(int(rng.integers(2, 4)))]
    )


def _curtain(rng: Rng) -> _Thing:
    w, h = rng.uniform(0.5, 1.0), rng.uniform(2.0, 2.3)
    cloth = paint(rng, _pick(rng, MUTED), None, "stripes", 6, axes=((1, 0, 0), (0, 1, 0)))
    return _Thing([box((0, 0.1 + h / 2, 0.05), (w, h, 0.06), cloth)])


def _dresser(rng: Rng) -> _Thing:
    w, h = rng.uniform(0.8, 1.5), rng.uniform(0.75, 1.1)
    drawers = paint(rng, _pick(rng, (*WOOD, (0.75, 0.74, 0.7))), pattern="stripes", scale=4)
    return _topped([box((0, h / 2, 0), (w, h, 0.5), drawers)])


def _pillow(rng: Rng) -> _Thing:
    cover = paint(
        rng,
        _pick(rng, MUTED + ((0.8, 0.8, 0.78),)),
        pattern=_pick(rng, ("solid", "noise", "stripes")),
        scale=10,
    )
    return _Thing([ball((0, 0.08, 0), (rng.uniform(0.25, 0.35), 0.08, rng.uniform(0.16, 0.22)), cover)])


def _mirror(rng: Rng) -> _Thing:
    w, h, y = rng.uniform(0.5, 1.0), rng.uniform(0.6, 1.0), rng.uniform(1.3, 1.6)
    glass = paint(rng, (0.65, 0.68, 0.7), (0.35, 0.36, 0.38), "noise", 2)
    return _Thing([box((0, y, 0.015), (w, h, 0.03), glass)])


def _floor_mat(rng: Rng) -> _Thing:
    rug = paint(
        rng,
        _pick(rng, SATURATED + MUTED),
        _pick(rng, MUTED),
        _pick(rng, ("checker", "stripes", "noise")),
        3,
        axes=WOOD_AXES,
    )
    return _Thing([box((0, 0.008, 0), (rng.uniform(1.0, 2.0), 0.016, rng.uniform(0.7, 1.4)), rug)])


def _clothes(rng: Rng) -> _Thing:
    cloth = paint(rng, _pick(rng, SATURATED + MUTED), pattern="noise", scale=12)
    heaps = [
        ball(
            rng.uniform(-0.15, 0.15, 3) * (1, 0, 1) + (0, 0.05, 0),
            (rng.uniform(0.15, 0.3), 0.06, rng.uniform(0.15, 0.3)),
            cloth,
        )
        for _ in range(int(rng.integers(1, 4)))
    ]
    return _Thing(_on_ground(heaps))


def _books(rng: Rng) -> _Thing:
    surfaces, y = [], 0.0
    for _ in range(int(rng.integers(1, 5))):
        t = rng.uniform(0.03, 0.06)
        cover = paint(rng, _pick(rng, SATURATED), jitter=0.3)
        surfaces.append(
            box(
                (rng.normal(0, 0.01), y + t / 2, rng.normal(0, 0.01)),
                (rng.uniform(0.15, 0.25), t, rng.uniform(0.2, 0.3)),
                cover,
            )
        )
        y += t
    return _Thing(surfaces)


def _fridge(rng: Rng) -> _Thing:
    w, h = rng.uniform(0.6, 0.9), rng.uniform(1.7, 1.9)
    steel = paint(rng, _pick(rng, ((0.8, 0.8, 0.78), (0.55, 0.56, 0.58))), pattern="stripes", scale=1.5)
    return _Thing(
        [
            box((0, h / 2, 0), (w, h, 0.7), steel),
            capsule((w / 2 - 0.08, 0.9, 0.38), (w / 2 - 0.08, 1.4, 0.38), 0.015, paint(rng, (0.3, 0.3, 0.3))),
        ]
    )


def _television(rng: Rng, where: str) -> _Thing:
    w = rng.uniform(0.6, 1.2)
    h = 0.58 * w
    y = rng.uniform(1.2, 1.6) if where == "mount" else 0.08 + h / 2
    frame = paint(rng, (0.03, 0.03, 0.03))
    on = rng.random() < 0.4
    screen = paint(
        rng,
        (0.06, 0.06, 0.07),
        (0.5, 0.4, 0.3),
        "noise" if on else "solid",
        4 / w,
        emissive=0.8 if on else 0.0,
    )
    surfaces = [
        box((0, y, 0.03), (w + 0.04, h + 0.04, 0.06), frame),
        box((0, y, 0.062), (w, h, 0.004), screen),
    ]
    if where != "mount":
        surfaces.append(box((0, 0.03, 0.03), (0.3, 0.06, 0.2), frame))
    return _Thing(surfaces)


def _paper(rng: Rng) -> _Thing:
    return _Thing(
        [
            box((0, 0.003 * (i + 1), 0), (0.21, 0.006, 0.3), paint(rng, (0.85, 0.85, 0.82)))
            for i in range(int(rng.integers(1, 3)))
        ]
    )


def _towel(rng: Rng) -> _Thing:
    cloth = paint(rng, _pick(rng, MUTED + ((0.8, 0.8, 0.78),)), pattern="noise", scale=15)
    return _Thing(
        [box((0, rng.uniform(0.9, 1.3), 0.03), (rng.uniform(0.4, 0.6), rng.uniform(0.5, 0.8), 0.04), cloth)]
    )


def _shower_curtain(rng: Rng) -> _Thing:
    cloth = paint(
        rng,
        _pick(rng, SATURATED),
        (0.85, 0.85, 0.85),
        _pick(rng, ("stripes", "checker")),
        5,
        axes=((1, 0, 0), (0, 1, 0)),
    )
    return _Thing([box((0, 1.3, 0.6), (rng.uniform(1.2, 1.6), 1.8, 0.03), cloth)])


def _box(rng: Rng) -> _Thing:
    size = rng.uniform(0.25, 0.6, 3)
    card = paint(rng, (0.5, 0.35, 0.18), (0.7, 0.6, 0.45), "stripes", 1 / size[1], axes=WOOD_AXES)
    return _topped([box((0, size[1] / 2, 0), size, card)])


def _whiteboard(rng: Rng) -> _Thing:
    w, h = rng.uniform(1.2, 2.0), rng.uniform(0.9, 1.2)
    board = paint(rng, (0.85, 0.85, 0.85), (0.2, 0.25, 0.6), "noise", 3, jitter=0.03)
    frame = paint(rng, (0.5, 0.5, 0.52))
    y = 0.95 + h / 2
    return _Thing(
        [box((0, y, 0.01), (w + 0.05, h + 0.05, 0.02), frame), box((0, y, 0.022), (w, h, 0.004), board)]
    )


def _night_stand(rng: Rng) -> _Thing:
    h = rng.uniform(0.5, 0.65)
    wood = paint(rng, _pick(rng, WOOD), pattern="stripes", scale=5)
    return _topped([box((0, h / 2, 0), (rng.uniform(0.45, 0.55), h, 0.4), wood)])


def _toilet(rng: Rng) -> _Thing:
    ceramic = paint(rng, (0.85, 0.85, 0.83), jitter=0.03)
    return _Thing(
        [
            box((0, 0.6, -0.1), (0.4, 0.4, 0.18), ceramic),
            cylinder((0, 0, 0.15), (0, 0.3, 0.15), 0.13, ceramic),
            ball((0, 0.33, 0.2), (0.19, 0.1, 0.26), ceramic),
        ]
    )


def _sink(rng: Rng) -> _Thing:
    basin = paint(rng, _pick(rng, ((0.85, 0.85, 0.83), (0.6, 0.6, 0.62))), jitter=0.03)
    metal = paint(rng, (0.6, 0.6, 0.62))
    return _Thing(
        [
            box((0, 0.07, 0), (0.55, 0.14, 0.42), basin),
            capsule((0, 0.14, -0.15), (0, 0.3, -0.1), 0.015, metal),
        ]
    )


def _lamp(rng: Rng, where: str) -> _Thing:
    height = rng.uniform(0.4, 0.6) if where == "top" else rng.uniform(1.4, 1.7)
    metal = paint(rng, _pick(rng, ((0.6, 0.55, 0.4), (0.1, 0.1, 0.1), (0.7, 0.7, 0.7))))
    shade = paint(rng, (1.0, 0.85, 0.6), emissive=0.7, jitter=0.05)
    r = 0.12 if where == "top" else 0.2
    return _Thing(
        [
            cylinder((0, 0, 0), (0, 0.02, 0), 0.12, metal),
            capsule((0, 0.02, 0), (0, height - 0.1, 0), 0.015, metal),
            cylinder((0, height - 0.25 * r * 2.5, 0), (0, height, 0), r, shade),
        ]
    )


def _bathtub(rng: Rng) -> _Thing:
    enamel = paint(rng, (0.85, 0.85, 0.83), jitter=0.03)
    inside = paint(rng, (0.6, 0.65, 0.68))
    return _Thing(
        [box((0, 0.275, 0), (1.6, 0.55, 0.75), enamel), box((0, 0.552, 0), (1.45, 0.01, 0.6), inside)]
    )


def _bag(rng: Rng) -> _Thing:
    leather = paint(
        rng, _pick(rng, ((0.05, 0.05, 0.05), (0.3, 0.15, 0.05), (0.1, 0.15, 0.35), (0.5, 0.1, 0.1)))
    )
    w, h = rng.uniform(0.2, 0.35), rng.uniform(0.2, 0.35)
    return _Thing(
        [
            ball((0, h / 2, 0), (w, h / 2, 0.1), leather),
            capsule((-w / 2, h, 0), (w / 2, h, 0), 0.015, leather),
        ]
    )


def _column(rng: Rng) -> _Thing:
    w = rng.uniform(0.3, 0.6)
    plaster = paint(rng, _pick(rng, ((0.7, 0.68, 0.62), (0.5, 0.5, 0.5))))
    return _Thing([box((0, 1.6, 0), (w, 3.2, w), plaster)])


def _furniture(rng: Rng) -> _Thing:
    size = rng.uniform(0.4, 1.2, 3)
    mat = _wood(rng) if rng.random() < 0.5 else paint(rng, _pick(rng, MUTED))
    return _topped([box((0, size[1] / 2, 0), size, mat)])


def _prop(rng: Rng) -> _Thing:
    mat = paint(rng, _pick(rng, SATURATED + MUTED))
    r = rng.uniform(0.05, 0.15)
    shape = _pick(rng, ("ball", "can", "block"))
    if shape == "ball":
        return _Thing([ball((0, r, 0), r, mat)])
    if shape == "can":
        return _Thing([cylinder((0, 0, 0), (0, 2.5 * r, 0), r, mat)])
    return _Thing([box((0, r, 0), (2 * r, 2 * r, 1.5 * r), mat)])


# NYU class -> builder(rng, where) of the object in its own frame
NYU_BUILDERS: dict[str, Callable[[Rng, str], _Thing]] = {
    "cabinet": lambda rng, where: _cabinet(rng),
    "bed": lambda rng, where: _bed(rng),
    "chair": lambda rng, where: _Thing(_chair(rng, MUTED)),
    "sofa": lambda rng, where: _indoor_sofa(rng),
    "table": lambda rng, where: _topped(_table(rng, _pick(rng, (0.45, 0.75)), MUTED)),
    "door": lambda rng, where: _door(rng),
    "window": lambda rng, where: _window(rng),
    "bookshelf": lambda rng, where: _bookshelf(rng),
    "picture": lambda rng, where: _picture(rng),
    "counter": lambda rng, where: _counter(rng),
    "blinds": lambda rng, where: _blinds(rng),
    "desk": lambda rng, where: _desk(rng),
    "shelves": lambda rng, where: _shelves(rng),
    "curtain": lambda rng, where: _curtain(rng),
    "dresser": lambda rng, where: _dresser(rng),
    "pillow": lambda rng, where: _pillow(rng),
    "mirror": lambda rng, where: _mirror(rng),
    "floor mat": lambda rng, where: _floor_mat(rng),
    "clothes": lambda rng, where: _clothes(rng),
    "books": lambda rng, where: _books(rng),
    "refridgerator": lambda rng, where: _fridge(rng),
    "television": _television,
    "paper": lambda rng, where: _paper(rng),
    "towel": lambda rng, where: _towel(rng),
    "shower curtain": lambda rng, where: _shower_curtain(rng),
    "box": lambda rng, where: _box(rng),
    "whiteboard": lambda rng, where: _whiteboard(rng),
    "person": lambda rng, where: _Thing(person(rng, MUTED)),
    "night stand": lambda rng, where: _night_stand(rng),
    "toilet": lambda rng, where: _toilet(rng),
    "sink": lambda rng, where: _sink(rng),
    "lamp": _lamp,
    "bathtub": lambda rng, where: _bathtub(rng),
    "bag": lambda rng, where: _bag(rng),
    "otherstructure": lambda rng, where: _column(rng),
    "otherfurniture": lambda rng, where: _furniture(rng),
    "otherprop": lambda rng, where: _prop(rng),
}

_TOPS = ("table", "desk", "counter", "dresser", "night stand", "cabinet", "otherfurniture", "box")

# room type -> what it holds: (class, where, min count, max count, supports for "top")
# where: "wall" (on the floor, back to a wall), "free" (on the floor), "mount" (on a wall),
# "top" (on one of the supports).
ROOMS: dict[str, tuple[tuple, ...]] = {
    "bedroom": (
        ("bed", "wall", 1, 1), ("pillow", "top", 1, 2, ("bed",)), ("night stand", "wall", 0, 2),
        ("dresser", "wall", 0, 1), ("lamp", "top", 0, 1, ("night stand", "dresser")), ("window", "mount", 0, 1),
        ("curtain", "mount", 0, 2), ("picture", "mount", 0, 2), ("clothes", "top", 0, 2, ("bed", "dresser")),
        ("door", "mount", 0, 1), ("floor mat", "free", 0, 1), ("bag", "free", 0, 2), ("television", "mount", 0, 1),
        ("clothes", "free", 0, 1), ("chair", "free", 0, 1), ("box", "free", 0, 2), ("otherfurniture", "wall", 0, 1),
    ),
    "living room": (
        ("sofa", "wall", 1, 2), ("pillow", "top", 0, 2, ("sofa",)), ("table", "free", 1, 1), ("chair", "free", 0, 3),
        ("television", "mount", 0, 1), ("bookshelf", "wall", 0, 1), ("cabinet", "wall", 0, 1),
        ("picture", "mount", 0, 2), ("window", "mount", 0, 1), ("blinds", "mount", 0, 1), ("lamp", "free", 0, 1),
        ("floor mat", "free", 0, 1), ("otherfurniture", "wall", 0, 1), ("books", "top", 0, 2, _TOPS),
        ("person", "free", 0, 1), ("box", "free", 0, 1), ("door", "mount", 0, 1), ("otherprop", "top", 0, 2, _TOPS),
    ),
    "kitchen": (
        ("counter", "wall", 1, 3), ("cabinet", "wall", 0, 3), ("refridgerator", "wall", 0, 1),
        ("sink", "top", 0, 1, ("counter",)), ("table", "free", 0, 1), ("chair", "free", 0, 3), ("window", "mount", 0, 1),
        ("otherprop", "top", 0, 3, _TOPS), ("paper", "top", 0, 1, _TOPS), ("box", "free", 0, 1),
        ("door", "mount", 0, 1), ("picture", "mount", 0, 1), ("bag", "free", 0, 1), ("person", "free", 0, 1),
    ),
    "office": (
        ("desk", "wall", 1, 2), ("chair", "free", 1, 3), ("bookshelf", "wall", 0, 2), ("books", "top", 0, 3, _TOPS),
        ("paper", "top", 0, 2, _TOPS), ("whiteboard", "mount", 0, 1), ("box", "free", 0, 3),
        ("television", "top", 0, 1, ("desk",)), ("window", "mount", 0, 1), ("blinds", "mount", 0, 1),
        ("shelves", "mount", 0, 1), ("person", "free", 0, 1), ("bag", "free", 0, 1), ("otherstructure", "wall", 0, 1),
        ("lamp", "top", 0, 1, ("desk",)), ("cabinet", "wall", 0, 1), ("otherprop", "top", 0, 2, _TOPS),
    ),
    "bathroom": (
        ("toilet", "wall", 1, 1), ("cabinet", "wall", 1, 1), ("sink", "top", 1, 1, ("cabinet",)),
        ("bathtub", "wall", 0, 1), ("mirror", "mount", 0, 1), ("towel", "mount", 0, 2),
        ("shower curtain", "mount", 0, 1), ("door", "mount", 0, 1), ("otherprop", "top", 0, 2, _TOPS),
        ("floor mat", "free", 0, 1), ("window", "mount", 0, 1),
    ),
}  # fmt: skip


@dataclass
class _Wall:
    """A wall of the room seen from inside: its plane and the free spans along it."""

    origin: np.ndarray  # a point on the wall at floor level, u = 0
    along: np.ndarray  # unit vector along the wall (the local x axis of things against it)
    inward: np.ndarray  # unit normal into the room (their local z axis)
    yaw: float  # turns an object's frame to face into the room from this wall
    span: tuple[float, float]  # usable range of u
    taken: list[tuple[float, float, float, float]] = field(default_factory=list)  # u0, u1, y0, y1


@dataclass
class _Room:
    walls: list[_Wall]
    width: float
    depth: float
    floor: list[tuple[float, float, float, float]] = field(default_factory=list)  # x0, x1, z0, z1
    supports: list[tuple[str, float, np.ndarray, tuple, list]] = field(default_factory=list)

    def free_on_floor(self, lo: np.ndarray, hi: np.ndarray) -> bool:
        return all(hi[0] < x0 or lo[0] > x1 or hi[2] < z0 or lo[2] > z1 for x0, x1, z0, z1 in self.floor)


_Placed = tuple[list[Surface], float, np.ndarray]  # surfaces in the world, yaw, position


def _mount(rng: Rng, room: _Room, thing: _Thing, on_floor: bool) -> _Placed | None:
    """Put a thing with its back (local -z) against a wall: standing on the floor or hung."""
    lo, hi = extent(thing.surfaces)
    for _ in range(12):
        wall = room.walls[int(rng.integers(len(room.walls)))]
        if wall.span[1] - wall.span[0] < hi[0] - lo[0]:
            continue
        u = rng.uniform(wall.span[0] - lo[0], wall.span[1] - hi[0])
        y0, y1 = (0.0, hi[1]) if on_floor else (lo[1], hi[1])
        if any(u + hi[0] > a and u + lo[0] < b and y1 > c and y0 < d for a, b, c, d in wall.taken):
            continue
        position = wall.origin + u * wall.along + wall.inward * (0.02 - lo[2] if on_floor else 0.0)
        surfaces = posed(thing.surfaces, wall.yaw, position)
        if on_floor:
            wlo, whi = extent(surfaces)
            if not room.free_on_floor(wlo, whi):
                continue
            room.floor.append((wlo[0], whi[0], wlo[2], whi[2]))
        wall.taken.append((u + lo[0], u + hi[0], y0, y1))
        return surfaces, wall.yaw, position
    return None


def _free(rng: Rng, room: _Room, thing: _Thing) -> _Placed | None:
    """Stand a thing anywhere on the floor in front of the camera, turned at random."""
    for _ in range(12):
        yaw = rng.uniform(-np.pi, np.pi)
        position = _a(
            [
                rng.uniform(-room.width / 2 + 0.5, room.width / 2 - 0.5),
                0.0,
                rng.uniform(-room.depth + 0.5, -1.0),
            ]
        )
        surfaces = posed(thing.surfaces, yaw, position)
        lo, hi = extent(surfaces)
        if (
            lo[0] < -room.width / 2
            or hi[0] > room.width / 2
            or lo[2] < -room.depth
            or not room.free_on_floor(lo, hi)
        ):
            continue
        if hi[1] > 0.05:  # flat things (floor mats) may lie under others
            room.floor.append((lo[0], hi[0], lo[2], hi[2]))
        return surfaces, yaw, position
    return None


def _on_top(rng: Rng, room: _Room, thing: _Thing, supports: Sequence[str]) -> _Placed | None:
    """Set a thing on the top of one of the already placed ``supports``."""
    candidates = [s for s in room.supports if s[0] in supports]
    lo, hi = extent(thing.surfaces)
    for _ in range(8 if candidates else 0):
        _, yaw, origin, (y, x0, x1, z0, z1), taken = candidates[int(rng.integers(len(candidates)))]
        if x1 - x0 < hi[0] - lo[0] or z1 - z0 < hi[2] - lo[2]:
            continue
        x, z = rng.uniform(x0 - lo[0], x1 - hi[0]), rng.uniform(z0 - lo[2], z1 - hi[2])
        if any(x + hi[0] > a and x + lo[0] < b and z + hi[2] > c and z + lo[2] < d for a, b, c, d in taken):
            continue
        taken.append((x + lo[0], x + hi[0], z + lo[2], z + hi[2]))
        position = rotation_y(yaw) @ _a([x, y, z]) + origin
        return posed(thing.surfaces, yaw, position), yaw, position
    return None


WALLS: tuple[Colour, ...] = (
    (0.6, 0.5, 0.38),
    (0.7, 0.68, 0.62),
    (0.5, 0.5, 0.5),
    (0.45, 0.52, 0.6),
    (0.5, 0.58, 0.45),
)
FLOORS: dict[str, Callable[[Rng], Material]] = {
    "wood": lambda rng: paint(rng, _pick(rng, WOOD), pattern="grain", scale=4, axes=WOOD_AXES),
    "carpet": lambda rng: paint(rng, _pick(rng, MUTED), pattern="noise", scale=3),
    "tiles": lambda rng: paint(rng, (0.6, 0.6, 0.58), (0.42, 0.42, 0.4), "checker", 3, axes=WOOD_AXES),
}


def nyud_scene(rng: Rng, size: tuple[int, int]) -> Scene:
    """An indoor scene: a furnished room of one of :data:`ROOMS`, lit warm and dim."""
    kind = _pick(rng, list(ROOMS))
    small = kind == "bathroom"
    width = rng.uniform(2.2, 3.0) if small else rng.uniform(3.0, 5.0)
    depth = rng.uniform(2.6, 3.6) if small else rng.uniform(3.2, 5.5)
    height = rng.uniform(2.5, 3.0)
    camera = Camera.aimed(
        (rng.uniform(-width / 4, width / 4), rng.uniform(1.0, 1.6), 0.0),
        rng.uniform(-0.45, 0.45),
        rng.uniform(0.1, 0.4),
        np.radians(rng.uniform(55, 62)),
        size,
    )
    lighting = Lighting(
        ambient=_a([0.1, 0.08, 0.055]) * rng.uniform(0.8, 1.2),
        skylight=_a([0.03, 0.03, 0.03]),
        lamp_position=_a([rng.uniform(-width / 4, width / 4), height - 0.25, -rng.uniform(0.3, 0.7) * depth]),
        lamp=_a([1.0, 0.78, 0.5]) * rng.uniform(3.0, 6.0),
        exposure=rng.uniform(0.9, 1.3),
    )
    scene = Scene(camera, lighting, noise=0.025)

    wall_paint = paint(rng, _pick(rng, WALLS), pattern="noise", scale=0.5, jitter=0.05)
    floor_paint = FLOORS[_pick(rng, list(FLOORS))](rng)
    planes = (
        ("floor", (0, 0, 0), (0, 1, 0), floor_paint),
        ("ceiling", (0, height, 0), (0, -1, 0), paint(rng, (0.75, 0.74, 0.7), jitter=0.03)),
        ("wall", (0, 0, -depth), (0, 0, 1), wall_paint),
        ("wall", (-width / 2, 0, 0), (1, 0, 0), wall_paint),
        ("wall", (width / 2, 0, 0), (-1, 0, 0), wall_paint),
    )
    for name, point, normal, material in planes:
        scene.add(
            SceneObject(name, NYU_CLASSES.index(name), [Surface(Plane(_a(point), _a(normal)), material)])
        )

    room = _Room(
        walls=[
            _Wall(_a([0, 0, -depth]), _a([1, 0, 0]), _a([0, 0, 1]), 0.0, (-width / 2, width / 2)),
            _Wall(_a([-width / 2, 0, 0]), _a([0, 0, -1]), _a([1, 0, 0]), np.pi / 2, (1.0, depth)),
            _Wall(_a([width / 2, 0, 0]), _a([0, 0, 1]), _a([-1, 0, 0]), -np.pi / 2, (-depth, -1.0)),
        ],
        width=width,
        depth=depth,
    )
    for entry in ROOMS[kind]:
        name, where, lo, hi = entry[:4]
        for _ in range(int(rng.integers(lo, hi + 1))):
            thing = NYU_BUILDERS[name](rng, where)
            if where == "top":
                placed = _on_top(rng, room, thing, entry[4])
            elif where == "free":
                placed = _free(rng, room, thing)
            else:
                placed = _mount(rng, room, thing, on_floor=where == "wall")
            if placed is None:
                continue
            surfaces, yaw, position = placed
            if thing.top is not None and where != "top":
                room.supports.append((name, yaw, position, thing.top, []))
            scene.add(SceneObject(name, NYU_CLASSES.index(name), surfaces))
    return scene


# --------------------------------------------------------------------------- Cityscapes streets

# The official Cityscapes label ids (cityscapesScripts' labels.py) of the classes a street scene
# draws: the 19 evaluated classes it has, and four void ones (ego vehicle, static, parking,
# ground) that the loader maps to ignore.
CITYSCAPES_IDS = {
    "unlabeled": 0, "ego vehicle": 1, "ground": 6, "static": 4, "road": 7, "sidewalk": 8, "parking": 9,
    "building": 11, "wall": 12, "fence": 13, "pole": 17, "traffic light": 19, "traffic sign": 20,
    "vegetation": 21, "terrain": 22, "sky": 23, "person": 24, "car": 26, "bus": 28, "bicycle": 33,
}  # fmt: skip

# Cityscapes' stereo rig (its camera/*.json): fx 2262.52 px at the 2048 px wide images, a
# 0.209313 m baseline, the camera about 1.2 m above the road. fx scales with the image width, so
# a generated image keeps the real horizontal field of view (48.7 degrees).
CITYSCAPES_FX = 2262.52
CITYSCAPES_WIDTH = 2048
CITYSCAPES_BASELINE = 0.209313


def cityscapes_focal(width: int) -> float:
    """The focal length in pixels of a Cityscapes image scaled to ``width``."""
    return CITYSCAPES_FX * width / CITYSCAPES_WIDTH


def _city(name: str, surfaces: list[Surface]) -> SceneObject:
    return SceneObject(name, CITYSCAPES_IDS[name], surfaces)


def _facade(rng: Rng) -> Material:
    return paint(
        rng,
        _pick(rng, ((0.55, 0.52, 0.48), (0.5, 0.3, 0.22), (0.68, 0.62, 0.5), (0.4, 0.42, 0.45))),
        (0.12, 0.13, 0.16),
        "checker",
        rng.uniform(0.25, 0.45),
        axes=((1, 0, 0), (0, 1, 0)),
    )


def _street_side(rng: Rng, scene: Scene, side: int, curb_x: float, curb: float, length: float) -> float:
    """The sidewalk, buildings and street furniture on one side (``side`` -1 left, +1 right) of
    a road whose edge is at x = ``curb_x``; returns the x of the sidewalk's outer edge."""
    width = rng.uniform(2.0, 4.5)
    outer = curb_x + side * width
    lo, hi = sorted((curb_x, outer))
    pavement = paint(rng, (0.45, 0.43, 0.4), (0.36, 0.35, 0.33), "checker", 2.0, axes=WOOD_AXES)
    scene.add(
        _city(
            "sidewalk", [box(((lo + hi) / 2, curb / 2, -length / 2 + 3), (hi - lo, curb, length), pavement)]
        )
    )
    if rng.random() < 0.35:  # a strip of grass along the outer edge
        strip = rng.uniform(0.8, 1.5)
        x = outer - side * strip / 2
        grass = paint(rng, (0.2, 0.32, 0.08), (0.3, 0.38, 0.12), "noise", 2.0)
        scene.add(
            _city(
                "terrain", [box((x, curb / 2 + 0.01, -length / 2 + 3), (strip, curb + 0.02, length), grass)]
            )
        )
    z = rng.uniform(-4, 2)
    while z > -length:  # a row of buildings, now and then a gap, a wall or a fence
        run = rng.uniform(8, 25)
        kind = rng.choice(["building", "gap", "wall", "fence"], p=[0.75, 0.1, 0.08, 0.07])
        setback = outer + side * rng.uniform(0.0, 1.5)
        if kind == "building":
            height, deep = rng.uniform(6, 25), 12.0
            scene.add(
                _city(
                    "building",
                    [
                        box(
                            (setback + side * deep / 2, height / 2, z - run / 2),
                            (deep, height, run - 0.2),
                            _facade(rng),
                        )
                    ],
                )
            )
        elif kind in ("wall", "fence"):
            height = rng.uniform(1.2, 2.5)
            material = (
                paint(rng, (0.5, 0.48, 0.44))
                if kind == "wall"
                else paint(
                    rng, (0.3, 0.3, 0.28), (0.15, 0.15, 0.14), "stripes", 6.0, axes=((0, 0, 1), (1, 0, 0))
                )
            )
            scene.add(_city(kind, [box((setback, height / 2, z - run / 2), (0.2, height, run), material)]))
            if rng.random() < 0.7:  # a building set further back
                height = rng.uniform(6, 20)
                scene.add(
                    _city(
                        "building",
                        [
                            box(
                                (setback + side * 14, height / 2, z - run / 2),
                                (12, height, run),
                                _facade(rng),
                            )
                        ],
                    )
                )
        z -= run
    near = curb_x + side * 0.4  # the curb side of the sidewalk: poles, signs and trees
    for _ in range(int(rng.integers(0, 4))):
        pz = -rng.uniform(5, 45)
        metal = paint(rng, (0.35, 0.36, 0.38))
        top = rng.uniform(3.0, 6.0)
        scene.add(_city("pole", [cylinder((near, curb, pz), (near, top, pz), rng.uniform(0.06, 0.1), metal)]))
        if rng.random() < 0.5:
            sign = paint(
                rng, _pick(rng, ((0.7, 0.05, 0.05), (0.05, 0.2, 0.6), (0.85, 0.75, 0.1))), jitter=0.05
            )
            scene.add(_city("traffic sign", [box((near, top - 0.5, pz), (0.7, 0.7, 0.06), sign)]))
        elif rng.random() < 0.4:
            housing = paint(rng, (0.08, 0.08, 0.08))
            scene.add(_city("traffic light", [box((near, top - 0.5, pz + 0.1), (0.35, 0.9, 0.3), housing)]))
    for _ in range(int(rng.integers(0, 4))):
        tz, trunk, crown = -rng.uniform(4, 60), rng.uniform(2.0, 4.0), rng.uniform(1.5, 3.0)
        leaves = paint(rng, (0.06, 0.2, 0.04), (0.14, 0.32, 0.06), "patches", 1.5)
        bark = paint(rng, (0.2, 0.14, 0.08))
        tx = near + side * 0.6
        tree = [cylinder((tx, curb, tz), (tx, trunk + 0.5 * crown, tz), 0.15, bark)]
        tree.append(ball((tx, trunk + crown, tz), (crown, crown * rng.uniform(1.0, 1.3), crown), leaves))
        scene.add(_city("vegetation", tree))
    for _ in range(int(rng.integers(0, 3))):  # bins, boxes, bollards: void "static"
        w = rng.uniform(0.4, 0.9)
        x = rng.uniform(lo + 0.5, max(hi - 0.5, lo + 0.6))
        scene.add(
            _city(
                "static",
                [box((x, curb + w / 2, -rng.uniform(4, 30)), (w, w, w), paint(rng, _pick(rng, MUTED)))],
            )
        )
    for _ in range(int(rng.choice([0, 1, 2, 3], p=[0.35, 0.35, 0.2, 0.1]))):
        x = rng.uniform(lo + 0.5, max(hi - 0.5, lo + 0.6))
        walker = posed(person(rng, MUTED), rng.uniform(-np.pi, np.pi), (x, curb, -rng.uniform(5, 30)))
        scene.add(_city("person", walker))
    if rng.random() < 0.25:
        bike = posed(_bicycle(rng), _pick(rng, (0.0, np.pi)), (near + side * 0.5, curb, -rng.uniform(5, 25)))
        scene.add(_city("bicycle", bike))
    return outer


def street_scene(rng: Rng, size: tuple[int, int]) -> Scene:
    """A street as a Cityscapes car sees it: road, sidewalks, buildings, sky, parked and moving
    cars, people, poles with signs and lights, trees, and the ego vehicle's bonnet, seen through
    a camera with Cityscapes' field of view (:func:`cityscapes_focal`)."""
    width = size[1]
    fov = 2 * np.arctan(width / 2 / cityscapes_focal(width))
    cam_h = rng.uniform(1.15, 1.3)
    camera = Camera.aimed((0.0, cam_h, 0.0), rng.normal(0, 0.04), rng.uniform(0.0, 0.05), fov, size)
    elevation, azimuth = rng.uniform(0.3, 1.0), rng.uniform(0, 2 * np.pi)
    overcast = rng.random() < 0.4  # German cities, mostly grey
    horizon = np.clip(_a([0.7, 0.76, 0.82]) * rng.uniform(0.9, 1.1, 3), 0, 1)
    zenith = np.clip(_a([0.35, 0.5, 0.75]) * rng.uniform(0.85, 1.15, 3), 0, 1)
    if overcast:
        horizon = zenith = _a([0.72, 0.74, 0.76]) * rng.uniform(0.85, 1.1)
    lighting = Lighting(
        ambient=_a([0.2, 0.21, 0.23]) * (1.8 if overcast else 1.0),
        skylight=_a([0.12, 0.14, 0.2]),
        sun_direction=_a(
            [np.cos(elevation) * np.sin(azimuth), np.sin(elevation), np.cos(elevation) * np.cos(azimuth)]
        ),
        sun=_a([1.0, 0.95, 0.85]) * rng.uniform(1.6, 2.2) * (0.25 if overcast else 1.0),
        fog=horizon * 0.9,
        fog_distance=rng.uniform(200, 500),
        exposure=rng.uniform(0.85, 1.05),
    )
    scene = Scene(camera, lighting, sky=(horizon, zenith), noise=0.012)
    asphalt = paint(rng, (0.2, 0.2, 0.21), (0.26, 0.26, 0.27), "noise", 1.5)
    scene.add(_city("road", [Surface(Plane(_a([0, 0, 0]), _a([0, 1, 0])), asphalt)]))

    # Driving on the right: the camera's lane is the rightmost one, the road reaches further left.
    left, right = -rng.uniform(4.5, 9.0), rng.uniform(1.8, 3.5)
    length, curb = 160.0, rng.uniform(0.1, 0.18)
    parking = rng.random() < 0.3
    if parking:  # a parking lane along the right curb (void)
        lane = paint(rng, (0.3, 0.28, 0.27), (0.22, 0.22, 0.22), "checker", 1.0, axes=WOOD_AXES)
        scene.add(_city("parking", [box((right - 1.1, 0.005, -length / 2 + 3), (2.2, 0.01, length), lane)]))
    _street_side(rng, scene, -1, left, curb, length)
    _street_side(rng, scene, 1, right, curb, length)
    if rng.random() < 0.5:  # the street ends at a building across it; else the road meets the sky
        far, height = rng.uniform(60, 140), rng.uniform(8, 25)
        scene.add(_city("building", [box((0, height / 2, -far - 6), (60, height, 12), _facade(rng))]))

    # Vehicles: parked on the right, moving in the lanes to the left (either direction).
    taken: list[tuple[float, float, float]] = []  # x, z, half length
    lanes = [x for x in np.arange(-1.75 - 3.5 * 0.5, left + 1.2, -3.5)]
    for _ in range(int(rng.integers(1, 6))):
        bus = rng.random() < 0.1
        parts = _bus(rng) if bus else _car(rng)
        lo, hi = extent(parts)
        half = (hi[2] - lo[2]) / 2
        if rng.random() < 0.5 or not lanes:
            x, yaw = right - 1.1, _pick(rng, (0.0, np.pi))
        else:
            x, yaw = float(_pick(rng, lanes)), _pick(rng, (0.0, np.pi))
        z = -rng.uniform(5 + half, 60)
        if all(abs(x - tx) > 2.2 or abs(z - tz) > half + th + 0.5 for tx, tz, th in taken):
            taken.append((x, z, half))
            scene.add(_city("bus" if bus else "car", posed(parts, yaw, (x, 0.0, z))))

    # The ego vehicle's bonnet along the bottom of the view (void; Cityscapes' id 1).
    bonnet = paint(rng, _pick(rng, ((0.1, 0.1, 0.12), (0.6, 0.6, 0.62), (0.15, 0.2, 0.35))), jitter=0.05)
    scene.add(_city("ego vehicle", [ball((0, cam_h - 0.45, 0.2), (1.0, 0.27, 2.1), bonnet)]))
    return scene
