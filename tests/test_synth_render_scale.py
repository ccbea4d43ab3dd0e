"""render_scale: a scene rendered small and scaled up to the dataset's size (issue 37, item 4:
the paper-shape dry run waited minutes for its synthetic data)."""

from __future__ import annotations

import numpy as np
import pytest

from fedmtl.config import DataConfig, SynthConfig, render_size
from fedmtl.synth import generate, nyud_sample, pascal_sample, sample_rng
from fedmtl.synth.generator import boundaries, check_options
from fedmtl.synth.render import render
from fedmtl.synth.resample import upscale
from fedmtl.synth.scenes import nyud_scene, pascal_scene
from tests.helpers import run_cli

SIZE = (48, 64)  # not square, so a swapped height and width shows
SCALE = 0.5
SCENES = {"pascal_context": (pascal_scene, pascal_sample), "nyud": (nyud_scene, nyud_sample)}
INDICES = range(3)


def _small(dataset: str, index: int):
    """The small rendering that a sample at SCALE is scaled up from (the same random draws)."""
    make_scene = SCENES[dataset][0]
    rng = sample_rng(dataset, 0, "train", index)
    return render(make_scene(rng, render_size(SIZE, SCALE)), rng)


@pytest.fixture(scope="module")
def pairs() -> list:
    """(small rendering, its upscale to SIZE) for a few images of each dataset."""
    out = []
    for dataset in SCENES:
        for index in INDICES:
            small = _small(dataset, index)
            out.append((small, upscale(small, SIZE)))
    return out


def test_every_field_is_written_at_the_target_size():
    for dataset, (_, make) in SCENES.items():
        s = make(sample_rng(dataset, 0, "train", 0), SIZE, SCALE)
        r = s.rendering
        assert r.image.shape == (*SIZE, 3) and r.image.dtype == np.uint8
        assert r.normals.shape == (*SIZE, 3) and r.depth.shape == SIZE
        assert r.object_id.shape == r.part.shape == s.semseg.shape == SIZE
        assert (r.camera.height, r.camera.width) == SIZE
        if dataset == "nyud":
            assert s.edge.shape == s.depth.shape == SIZE
        else:
            assert s.sal.shape == s.label_map.shape == SIZE


def test_labels_are_only_those_of_the_small_render(pairs):
    for small, big in pairs:
        assert set(np.unique(big.object_id)) <= set(np.unique(small.object_id))
        assert set(np.unique(big.part)) <= set(np.unique(small.part))


def test_depth_is_never_blended_across_objects_and_the_sky_stays_inf(pairs):
    for small, big in pairs:
        assert np.isinf(big.depth[big.object_id < 0]).all()
        for k in np.unique(big.object_id[big.object_id >= 0]):
            own = small.depth[small.object_id == k]  # a blend across objects would leave this range
            assert own.min() - 1e-5 <= big.depth[big.object_id == k].min()
            assert big.depth[big.object_id == k].max() <= own.max() + 1e-5


def test_normals_are_unit_length_and_the_sky_keeps_its_normal(pairs):
    for _, big in pairs:
        np.testing.assert_allclose(np.linalg.norm(big.normals, axis=-1), 1.0, atol=1e-5)
        assert (big.normals[big.object_id < 0] == [0.0, 0.0, 1.0]).all()


def test_depth_and_normals_are_smooth_inside_an_object_not_blocky(pairs):
    """Bilinear inside an object: a smooth surface has more distinct depths than the small render."""
    for small, big in pairs:
        inside = big.object_id >= 0
        assert np.unique(big.depth[inside]).size > np.unique(small.depth[small.object_id >= 0]).size


def test_edges_are_computed_at_the_target_size_as_thin_as_at_full_size():
    for index in INDICES:
        s = nyud_sample(sample_rng("nyud", 0, "train", index), SIZE, 0.25)
        # Both sides of each boundary, 2 px, as at full size: not the small render's edges
        # scaled up to 8 px bands.
        np.testing.assert_array_equal(s.edge, boundaries(s.rendering.object_id))
        assert s.edge.any()


@pytest.mark.parametrize("dataset", list(SCENES))
def test_the_same_seed_gives_the_same_sample(dataset):
    make = SCENES[dataset][1]
    a, b = (make(sample_rng(dataset, 5, "val", 1), SIZE, SCALE) for _ in range(2))
    np.testing.assert_array_equal(a.rendering.image, b.rendering.image)
    np.testing.assert_array_equal(a.semseg, b.semseg)
    np.testing.assert_array_equal(a.rendering.normals, b.rendering.normals)
    np.testing.assert_array_equal(a.rendering.depth, b.rendering.depth)


@pytest.mark.parametrize("dataset", list(SCENES))
def test_scale_one_is_the_direct_render(dataset):
    make_scene, make = SCENES[dataset]
    rng = sample_rng(dataset, 0, "train", 2)
    direct = render(make_scene(rng, SIZE), rng)
    r = make(sample_rng(dataset, 0, "train", 2), SIZE, 1.0).rendering
    for field in ("image", "depth", "normals", "object_id", "part"):
        assert getattr(r, field).tobytes() == getattr(direct, field).tobytes(), field


def test_a_scaled_dataset_is_written_and_deterministic(tmp_path):
    paths = []
    for name in ("a", "b"):
        root = generate(
            "nyud", tmp_path / name, 2, 1, SIZE, seed=1, workers=1, progress=False, render_scale=SCALE
        )
        paths.append(sorted(p for p in root.rglob("*") if p.is_file()))
    assert [p.relative_to(tmp_path / "a") for p in paths[0]] == [
        p.relative_to(tmp_path / "b") for p in paths[1]
    ]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*paths))


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (0.0, "data.synth.nyud.render_scale must be in (0, 1], got 0.0 (1: render at the full size)"),
        (1.5, "data.synth.nyud.render_scale must be in (0, 1], got 1.5 (1: render at the full size)"),
        (
            0.02,
            "data.synth.nyud.render_scale 0.02 renders 9 x 12 pixels for size [448, 576], under 16 a side: "
            "raise it (1: render at the full size)",
        ),
    ],
)
def test_an_out_of_range_render_scale_is_refused_naming_it(scale, message):
    with pytest.raises(ValueError) as err:
        DataConfig(synth={"nyud": SynthConfig(size=(448, 576), render_scale=scale)})
    assert str(err.value) == message


def test_synth_command_refuses_a_bad_render_scale_as_typed(tmp_path, capsys):
    argv = ["data", "synth", "--dataset", "nyud", "--root", str(tmp_path / "NYUDv2"), "--size", "[32,32]"]
    code, lines = run_cli([*argv, "--render_scale", "0.25"], capsys)
    assert code not in (0, None)
    assert lines == [
        "error: --render_scale 0.25 renders 8 x 8 pixels for size [32, 32], under 16 a side: "
        "raise it (1: render at the full size)"
    ]
    assert not (tmp_path / "NYUDv2").exists()
    with pytest.raises(ValueError, match=r"^render_scale must be in \(0, 1\], got -1"):
        check_options(1, 1, (32, 32), 0, None, render_scale=-1)
