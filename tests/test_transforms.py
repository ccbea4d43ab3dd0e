"""Transforms on hand-made samples (no files)."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedmtl.data.transforms import (
    IGNORE,
    IMAGENET_MEAN,
    AddIgnoreRegions,
    Normalize,
    PadTo,
    PhotoMetricDistortion,
    RandomCrop,
    RandomHorizontalFlip,
    RandomScale,
    ToTensor,
    _hsv_to_rgb,
    _resize,
    _rgb_to_hsv,
    eval_transforms,
    train_transforms,
    valid_region,
)

H, W = 32, 40
PART_VALUES = {0, 1, 2, 3, 4, 5, 6}


def make_sample(seed: int = 0) -> dict:
    """Every task, with labels in their raw (loader) encodings."""
    rng = np.random.default_rng(seed)
    normals = rng.normal(size=(H, W, 3)).astype(np.float32)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    normals[:4] = IGNORE  # masked rows
    semseg = np.zeros((H, W), np.float32)
    semseg[8:24, 10:30] = 7
    semseg[:, :5] = IGNORE
    parts = np.zeros((H, W), np.float32)
    parts[10:20, 20:30] = rng.integers(1, 7, size=(10, 10))
    depth = rng.uniform(1.0, 8.0, size=(H, W)).astype(np.float32)
    depth[20:, :8] = 0.0
    return {
        "image": rng.uniform(0, 255, size=(H, W, 3)).astype(np.float32),
        "semseg": semseg,
        "human_parts": parts,
        "sal": (rng.random((H, W)) > 0.7).astype(np.float32),
        "normals": normals,
        "edge": (rng.random((H, W)) > 0.9).astype(np.float32),
        "depth": depth,
        "meta": {"id": "x"},
    }


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- training pipeline


@pytest.mark.parametrize("size", [(24, 28), (48, 64), (32, 40)])
@pytest.mark.parametrize("seed", range(4))
def test_train_output_shapes_types_and_value_sets(size, seed):
    out = train_transforms(size)(make_sample(), rng(seed))
    assert out["image"].shape == (3, *size) and out["image"].dtype == torch.float32
    assert out["normals"].shape == (3, *size) and out["normals"].dtype == torch.float32
    for task in ("semseg", "human_parts", "sal"):
        assert out[task].shape == size and out[task].dtype == torch.int64
    for task in ("edge", "depth"):
        assert out[task].shape == size and out[task].dtype == torch.float32
    # nearest resizing and 255 padding never invent a label
    assert set(out["semseg"].unique().tolist()) <= {0, 7, IGNORE}
    assert set(out["human_parts"].unique().tolist()) <= PART_VALUES | {IGNORE}
    assert set(out["sal"].unique().tolist()) <= {0, 1, IGNORE}
    assert set(out["edge"].unique().tolist()) <= {0.0, 1.0, float(IGNORE)}
    normals = out["normals"].permute(1, 2, 0)
    ignored = (normals == IGNORE).all(dim=-1)
    assert ((normals == IGNORE).any(dim=-1) == ignored).all()  # all three channels or none
    torch.testing.assert_close(normals[~ignored].norm(dim=-1), torch.ones((~ignored).sum()))
    assert out["meta"] == {"id": "x"}


def test_train_is_deterministic_for_a_seed():
    a = train_transforms(24)(make_sample(), rng(5))
    b = train_transforms(24)(make_sample(), rng(5))
    c = train_transforms(24)(make_sample(), rng(6))
    for key in ("image", "semseg", "human_parts", "sal", "normals", "edge", "depth"):
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a["image"], c["image"])


def test_transforms_do_not_modify_their_input():
    sample = make_sample()
    copy = {k: v.copy() for k, v in sample.items()}
    RandomHorizontalFlip(p=1.0)(sample, rng())
    train_transforms(24)(sample, rng())
    for key, value in copy.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(sample[key], value)


# --------------------------------------------------------------------------- single steps


def test_flip_mirrors_labels_and_negates_normals_x():
    sample = make_sample()
    out = RandomHorizontalFlip(p=1.0)(sample, rng())
    for key in ("image", "semseg", "human_parts", "sal", "edge", "depth"):
        np.testing.assert_array_equal(out[key], sample[key][:, ::-1])
    mirrored = sample["normals"][:, ::-1]
    np.testing.assert_array_equal(out["normals"][4:, :, 0], -mirrored[4:, :, 0])
    np.testing.assert_array_equal(out["normals"][4:, :, 1:], mirrored[4:, :, 1:])
    assert (out["normals"][:4] == IGNORE).all()  # ignored pixels keep their marker
    never = RandomHorizontalFlip(p=0.0)(sample, rng())
    np.testing.assert_array_equal(never["normals"], sample["normals"])


def test_flip_probability():
    flips = sum(
        RandomHorizontalFlip()(make_sample(), rng(s))["image"][0, 0, 0] != make_sample()["image"][0, 0, 0]
        for s in range(200)
    )
    assert 70 < flips < 130


@pytest.mark.parametrize("scale", [2.0, 0.5, 1.5])
def test_scale_resizes_and_divides_depth(scale):
    sample = make_sample()
    out = RandomScale(scale, scale)(sample, rng())
    size = (int(H * scale), int(W * scale))
    for key in ("image", "semseg", "human_parts", "sal", "normals", "edge", "depth"):
        assert out[key].shape[:2] == size
    assert out["depth"].dtype == np.float32
    # nearest: every output value is an input value (depth: divided by the scale)
    depth = np.unique(sample["depth"])
    assert np.isclose(out["depth"].reshape(-1, 1) * scale, depth[None], rtol=1e-6, atol=0).any(axis=1).all()
    for key in ("semseg", "human_parts", "sal", "edge"):
        assert set(np.unique(out[key])) <= set(np.unique(sample[key]))
    normals = {tuple(n) for n in sample["normals"].reshape(-1, 3)}
    assert {tuple(n) for n in out["normals"].reshape(-1, 3)} <= normals


def test_scale_by_two_is_nearest_for_labels_and_bilinear_for_the_image():
    sample = make_sample()
    out = RandomScale(2.0, 2.0)(sample, rng())
    np.testing.assert_array_equal(out["semseg"], sample["semseg"].repeat(2, 0).repeat(2, 1))
    np.testing.assert_allclose(out["depth"], sample["depth"].repeat(2, 0).repeat(2, 1) / 2, rtol=1e-6)
    # half-pixel centres: output pixel 1 sits at input 0.25 -> 3/4 of pixel 0 plus 1/4 of pixel 1
    expected = 0.75 * sample["image"][0, 0] + 0.25 * sample["image"][0, 1]
    np.testing.assert_allclose(out["image"][0, 1], expected, rtol=1e-5)


@pytest.mark.parametrize("size", [(64, 80), (16, 20), (45, 17), (32, 40)])
def test_bilinear_matches_torch_half_pixel_interpolation(size):
    image = make_sample()["image"]
    out = _resize(image, size, bilinear=True)
    chw = torch.from_numpy(image).permute(2, 0, 1)[None]
    expected = F.interpolate(chw, size=size, mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-3)
    assert out.dtype == np.float32


def test_scale_range():
    scales = [RandomScale()(make_sample(), rng(s))["image"].shape[0] / H for s in range(100)]
    assert 0.5 <= min(scales) < 0.7 and 1.8 < max(scales) <= 2.0


@pytest.mark.parametrize("scale_range", [(1.0, 1.0), (0.8, 1.25)])
def test_train_transforms_rescale_within_the_given_range(scale_range):
    # depth is divided by the factor drawn: its ratio to the unscaled depth reads the factor back
    sample = make_sample()
    sample["depth"][:] = 2.0
    factors = set()
    for seed in range(40):
        out = train_transforms((H, W), scale_range)(sample, rng(seed))
        valid = out["depth"] != IGNORE
        factors |= {round(2.0 / float(d), 3) for d in out["depth"][valid].unique()}
    assert min(factors) >= scale_range[0] - 1e-3 and max(factors) <= scale_range[1] + 1e-3
    assert (len(factors) == 1) == (scale_range[0] == scale_range[1])


def test_crop_window_is_aligned_across_keys():
    sample = make_sample()
    sample["semseg"] = np.arange(H * W, dtype=np.float32).reshape(H, W)  # every pixel unique
    out = RandomCrop((10, 12))(sample, rng(3))
    top, left = np.argwhere(sample["semseg"] == out["semseg"][0, 0])[0]
    for key in ("image", "human_parts", "normals", "depth"):
        np.testing.assert_array_equal(out[key], sample[key][top : top + 10, left : left + 12])


def test_crop_keeps_small_sides_and_pad_centres_them():
    sample = make_sample()
    cropped = RandomCrop((48, 30))(sample, rng())
    assert cropped["image"].shape[:2] == (H, 30)
    padded = PadTo((48, 30))(cropped, rng())
    rows, cols = valid_region((48, 30), (H, 30))
    assert rows == slice(8, 40) and cols == slice(0, 30)
    assert padded["image"].shape == (48, 30, 3) and (padded["image"][:8] == 0).all()
    for key in ("semseg", "human_parts", "sal", "normals", "edge", "depth"):
        assert (padded[key][:8] == IGNORE).all() and (padded[key][40:] == IGNORE).all()
        np.testing.assert_array_equal(padded[key][rows, cols], cropped[key])


def test_crop_avoids_windows_dominated_by_one_class():
    # left 30 columns class 0, right 10 columns class 1; a 20x20 window is balanced enough
    # (no class >= 75 %) only for left offsets 16..20, i.e. 5 of 21 possible windows
    semseg = np.zeros((40, 40), np.float32)
    semseg[:, 30:] = 1

    def balanced_share(ratio):
        hits = 0
        for seed in range(200):
            out = RandomCrop((20, 20), cat_max_ratio=ratio)(
                {"image": np.zeros((40, 40, 3)), "semseg": semseg}, rng(seed)
            )
            share = out["semseg"].mean()
            hits += 0.25 < share < 0.75
        return hits / 200

    assert balanced_share(0.75) > 0.85
    assert balanced_share(1.0) < 0.4


def test_photometric_distortion_changes_only_the_image():
    sample = make_sample()
    outs = [PhotoMetricDistortion()(sample, rng(s)) for s in range(20)]
    for out in outs:
        image = out["image"]
        assert image.dtype == np.float32 and image.shape == (H, W, 3)
        assert image.min() >= 0 and image.max() <= 255 and (image == np.round(image)).all()
        np.testing.assert_array_equal(out["semseg"], sample["semseg"])
    assert sum(not np.array_equal(out["image"], np.floor(sample["image"])) for out in outs) >= 15
    again = PhotoMetricDistortion()(sample, rng(7))
    np.testing.assert_array_equal(again["image"], outs[7]["image"])


def test_hsv_round_trip_matches_colorsys():
    rgb = rng().random((50, 3))
    rgb[0] = (0.5, 0.5, 0.5)  # grey: hue and saturation 0
    rgb[1] = (0.0, 0.0, 0.0)
    rgb[2] = (1.0, 0.0, 0.5)  # red is the maximum, hue wraps below 0
    hsv = _rgb_to_hsv(rgb.T).T  # planar [3, N]
    np.testing.assert_allclose(hsv, [colorsys.rgb_to_hsv(*c) for c in rgb], atol=1e-12)
    np.testing.assert_allclose(_hsv_to_rgb(hsv.T).T, rgb, atol=1e-12)
    shifted = hsv.copy()
    shifted[:, 0] = (shifted[:, 0] + 0.1) % 1.0
    np.testing.assert_allclose(
        _hsv_to_rgb(shifted.T).T, [colorsys.hsv_to_rgb(*c) for c in shifted], atol=1e-12
    )


def test_normalize_uses_imagenet_statistics():
    image = np.broadcast_to(np.asarray(IMAGENET_MEAN, np.float32) * 255, (4, 4, 3)).copy()
    image[0, 0] = 255.0
    out = Normalize()({"image": image}, rng())["image"]
    np.testing.assert_allclose(out[1:, 1:], 0.0, atol=1e-6)
    np.testing.assert_allclose(
        out[0, 0], (1 - np.array(IMAGENET_MEAN)) / np.array([0.229, 0.224, 0.225]), rtol=1e-5
    )


def test_add_ignore_regions():
    sample = make_sample()
    out = AddIgnoreRegions()(sample, rng())
    assert (out["depth"][20:, :8] == IGNORE).all() and (out["depth"][:20] == sample["depth"][:20]).all()
    np.testing.assert_array_equal(out["human_parts"], sample["human_parts"])  # has parts: kept
    missed = AddIgnoreRegions()({**sample, "human_parts": sample["human_parts"][:8]}, rng())
    assert (missed["human_parts"] == IGNORE).all()  # a crop that missed the person: no label
    zero = sample["normals"].copy()
    zero[10, 10] = 0
    assert (AddIgnoreRegions()({"normals": zero}, rng())["normals"][10, 10] == IGNORE).all()


def test_to_tensor_types():
    out = ToTensor()(make_sample(), rng())
    assert out["image"].shape == (3, H, W) and out["normals"].shape == (3, H, W)
    assert out["semseg"].dtype == out["human_parts"].dtype == out["sal"].dtype == torch.int64
    assert out["edge"].dtype == out["depth"].dtype == torch.float32 and out["depth"].shape == (H, W)


# --------------------------------------------------------------------------- evaluation pipeline


def test_eval_pads_without_resizing():
    sample = make_sample()
    out = eval_transforms((36, 48))(sample, rng())
    rows, cols = valid_region((36, 48), (H, W))
    assert (rows, cols) == (slice(2, 34), slice(4, 44))
    assert out["image"].shape == (3, 36, 48) and (out["image"][:, :2] == 0).all()
    np.testing.assert_array_equal(out["semseg"][rows, cols].numpy(), sample["semseg"])
    assert (out["semseg"][:2] == IGNORE).all() and (out["semseg"][:, :4] == IGNORE).all()
    inner = out["depth"][rows, cols].numpy()
    np.testing.assert_array_equal(inner, np.where(sample["depth"] == 0, IGNORE, sample["depth"]))
    assert (out["depth"][34:] == IGNORE).all()
    same_size = eval_transforms((H, W))(sample, rng())
    np.testing.assert_array_equal(same_size["semseg"].numpy(), sample["semseg"])


def test_eval_is_deterministic_and_refuses_to_crop():
    a = eval_transforms(40)(make_sample(), rng(0))
    b = eval_transforms(40)(make_sample(), rng(1))
    assert torch.equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="never crops"):
        eval_transforms((H, W - 1))(make_sample(), rng())


def test_the_config_default_scale_range_is_the_papers():
    # fedmtl.config keeps its own copy of the default (importing transforms would load torch at
    # `fit --help`): the two must not drift apart
    from fedmtl.config import DataConfig
    from fedmtl.data.transforms import PAPER_SCALE_RANGE

    assert tuple(DataConfig().scale_range) == PAPER_SCALE_RANGE
