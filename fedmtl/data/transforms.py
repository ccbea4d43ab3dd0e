"""Sample transforms: training augmentation and evaluation padding, as the public code does them.

A sample is a dict: ``"image"`` float32 [H, W, 3] in 0..255 plus one numpy array per task
(semseg, human_parts, sal, edge, depth [H, W]; normals [H, W, 3]) until :class:`ToTensor`.
Every transform is called as ``t(sample, rng)`` with a numpy ``Generator`` that the dataset
derives from (seed, epoch, sample index), so an augmented epoch is the same whatever the
number of loader workers. Keys other than the image and the task arrays (e.g. ``"meta"``)
are passed through untouched.

Training (the public ``get_transformations(size, train=True)``)::

    RandomScale(0.5, 2.0) -> RandomCrop(size, cat_max_ratio=0.75) -> RandomHorizontalFlip
    -> PhotoMetricDistortion -> Normalize(ImageNet) -> PadTo(size) -> AddIgnoreRegions -> ToTensor

Evaluation: ``Normalize -> PadTo(size) -> AddIgnoreRegions -> ToTensor``. No resize: the public
code evaluates at native resolution, padded (centred) to 512x512 / 448x576 so a batch stacks;
:func:`valid_region` recovers the original pixels.

255 marks pixels to ignore in every label, including normals (all three channels) and depth.

Depth comes in two units (``depth_unit``): NYUD-v2's metres, where 0 is "no measurement", and
Cityscapes' disparity in pixels, where 0 is a valid value (a point at infinity) and the loader
already marks invalid pixels 255. A resize by ``s`` makes a scene look ``1/s`` times as far
(depth / s) but a horizontal shift in pixels ``s`` times as long (disparity * s).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

IGNORE = 255
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLASS_MAP_TASKS = ("semseg", "human_parts", "sal")  # integer labels, int64 tensors
DEPTH_UNITS = ("metres", "disparity")

Sample = dict[str, Any]
Size = tuple[int, int]


class Transform(Protocol):
    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample: ...


def as_size(size: int | Sequence[int]) -> Size:
    """``512`` or ``(448, 576)`` -> (height, width)."""
    if isinstance(size, int):
        return (size, size)
    height, width = size
    return (int(height), int(width))


def _arrays(sample: Sample) -> Iterator[tuple[str, np.ndarray]]:
    """The image and the task arrays of a sample (everything but metadata)."""
    return ((key, value) for key, value in sample.items() if isinstance(value, np.ndarray))


def _all_channels(array: np.ndarray, value: float) -> np.ndarray:
    """[H, W, C] -> [H, W]: all channels equal ``value`` (faster than ``.all(axis=-1)``)."""
    result = array[..., 0] == value
    for c in range(1, array.shape[-1]):
        result &= array[..., c] == value
    return result


def valid_region(padded_hw: Sequence[int], original_hw: Sequence[int]) -> tuple[slice, slice]:
    """Where an original image of ``original_hw`` sits inside its centred padding.

    ``prediction[..., rows, cols]`` with ``rows, cols = valid_region(...)`` cuts the padding
    off again, as the public ``predict`` does before saving predictions.
    """
    top = max(padded_hw[0] - original_hw[0], 0) // 2
    left = max(padded_hw[1] - original_hw[1], 0) // 2
    return slice(top, top + original_hw[0]), slice(left, left + original_hw[1])


@dataclass(frozen=True)
class Compose:
    transforms: tuple[Transform, ...]

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        for transform in self.transforms:
            sample = transform(sample, rng)
        return sample


def _nearest_index(old: int, new: int) -> np.ndarray:
    # cv2 INTER_NEAREST: source pixel floor(dst / (new / old)), in double precision
    return np.minimum(np.floor(np.arange(new) * (1.0 / (new / old))).astype(np.int64), old - 1)


def _linear_taps(old: int, new: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # half-pixel centres, clamped at the borders: cv2 INTER_LINEAR / torch align_corners=False
    src = np.maximum((np.arange(new) + 0.5) * (old / new) - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), old - 1)
    high = np.minimum(low + 1, old - 1)
    return low, high, (src - low).astype(np.float32)


def _resize(array: np.ndarray, size: Size, bilinear: bool) -> np.ndarray:
    """Bilinear (no antialiasing) or nearest resize of [H, W] / [H, W, C], as cv2.resize with
    INTER_LINEAR / INTER_NEAREST does it in the public code.

    Plain numpy on purpose: torch's intra-op threads slow a loader in the main process down.
    """
    if not bilinear:
        rows, cols = _nearest_index(array.shape[0], size[0]), _nearest_index(array.shape[1], size[1])
        return array.take(rows, axis=0).take(cols, axis=1)
    extra = (1,) * (array.ndim - 2)  # broadcast the weights over channels
    low, high, weight = _linear_taps(array.shape[0], size[0])
    top = array.take(low, axis=0)
    array = top + (array.take(high, axis=0) - top) * weight.reshape(-1, 1, *extra)
    low, high, weight = _linear_taps(array.shape[1], size[1])
    left = array.take(low, axis=1)
    return (left + (array.take(high, axis=1) - left) * weight.reshape(1, -1, *extra)).astype(np.float32)


def scale_depth(depth: np.ndarray, factor: float, depth_unit: str) -> np.ndarray:
    """A depth label after the image was resized by ``factor`` (horizontally, for disparity).

    metres: divided by the factor (enlarging the image is moving the camera closer; the 0 of a
    missing measurement stays 0). disparity: multiplied by it (a shift in pixels grows with the
    image); ignored pixels (255) stay ignored, and a disparity scaled to 255 or more is marked
    ignored too, since 255 is the ignore value.
    """
    if depth_unit == "metres":
        return depth / np.float32(factor)
    if depth_unit != "disparity":
        raise ValueError(f"unknown depth_unit {depth_unit!r}; expected one of {', '.join(DEPTH_UNITS)}")
    valid = depth != IGNORE
    scaled = np.where(valid, depth * np.float32(factor), np.float32(IGNORE))
    return np.where(scaled >= IGNORE, np.float32(IGNORE), scaled).astype(np.float32)


@dataclass(frozen=True)
class Resize:
    """Resize image (bilinear) and labels (nearest) to ``size``, as FMTL-Bench does for every
    Cityscapes image (1024x2048 -> 768x1536); depth is rescaled by the width factor."""

    size: Size
    depth_unit: str = "metres"

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        height, width = sample["image"].shape[:2]
        if (height, width) == tuple(self.size):
            return sample
        out = dict(sample)
        for key, value in _arrays(sample):
            out[key] = _resize(value, self.size, bilinear=key == "image")
        if "depth" in out:
            out["depth"] = scale_depth(out["depth"], self.size[1] / width, self.depth_unit)
        return out


@dataclass(frozen=True)
class RandomScale:
    """Rescale image (bilinear) and labels (nearest) by one factor drawn from [min, max).

    Depth follows :func:`scale_depth`: metres divided by the factor, disparity multiplied.
    """

    min_scale: float = 0.5
    max_scale: float = 2.0
    depth_unit: str = "metres"

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        if not 0 < self.min_scale <= self.max_scale:
            raise ValueError(f"need 0 < min_scale <= max_scale, got {self.min_scale}, {self.max_scale}")
        scale = (
            self.min_scale
            if self.min_scale == self.max_scale
            else rng.uniform(self.min_scale, self.max_scale)
        )
        if scale == 1.0:
            return sample
        height, width = sample["image"].shape[:2]
        size = (max(int(height * scale), 1), max(int(width * scale), 1))
        out = dict(sample)
        for key, value in _arrays(sample):
            out[key] = _resize(value, size, bilinear=key == "image")
        if "depth" in out:
            out["depth"] = scale_depth(out["depth"], scale, self.depth_unit)
        return out


@dataclass(frozen=True)
class RandomCrop:
    """Crop a random ``size`` window (smaller sides stay whole; :class:`PadTo` fills them).

    With ``cat_max_ratio < 1`` and a semseg label, up to ``max_tries`` windows are drawn until
    one shows more than one class and no class covers ``cat_max_ratio`` of the valid pixels;
    as in the public code, the window drawn after the last failed try is used unchecked.
    """

    size: Size
    cat_max_ratio: float = 1.0
    max_tries: int = 10

    def _window(self, shape: tuple[int, ...], rng: np.random.Generator) -> tuple[int, int] | None:
        height, width = shape[:2]
        if (height, width) == tuple(self.size):
            return None
        top = int(rng.integers(0, max(height - self.size[0], 0) + 1))
        left = int(rng.integers(0, max(width - self.size[1], 0) + 1))
        return top, left

    def _crop(self, array: np.ndarray, window: tuple[int, int] | None) -> np.ndarray:
        if window is None:
            return array
        top, left = window
        return array[top : top + self.size[0], left : left + self.size[1]]

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        shape = sample["image"].shape
        window = self._window(shape, rng)
        if self.cat_max_ratio < 1.0 and "semseg" in sample:
            for _ in range(self.max_tries):
                counts = np.bincount(
                    self._crop(sample["semseg"], window).astype(np.int64).ravel(), minlength=256
                )
                counts = np.delete(counts, IGNORE)
                counts = counts[counts > 0]
                if len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio:
                    break
                window = self._window(shape, rng)
        out = dict(sample)
        for key, value in _arrays(sample):
            out[key] = self._crop(value, window)
        return out


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror image and labels with probability ``p``; the x component of normals changes sign."""

    p: float = 0.5

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        if rng.random() >= self.p:
            return sample
        out = dict(sample)
        for key, value in _arrays(sample):
            out[key] = value[:, ::-1]  # a view: no later step writes into its input
        if "normals" in out:
            normals = out["normals"] = out["normals"].copy()
            valid = ~_all_channels(normals, IGNORE)  # ignored pixels keep their 255 marker
            normals[valid, 0] *= -1
        return out


# Colour conversions work on planar arrays [3, ...]: numpy is slow on a last axis of size 3.


def _rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """Float RGB in [0, 1], [3, ...] -> HSV [3, ...] with hue in [0, 1)."""
    r, g, b = rgb
    value = np.maximum(np.maximum(r, g), b)
    chroma = value - np.minimum(np.minimum(r, g), b)
    grey = chroma == 0
    inv_chroma = 1.0 / np.where(grey, 1.0, chroma)
    is_r, is_g = value == r, value == g
    # sector offsets folded into the numerator: (b - r) / c + 2 = (b - r + 2c) / c
    hue = np.where(is_r, g - b, np.where(is_g, b - r + 2 * chroma, r - g + 4 * chroma)) * inv_chroma
    hue = np.where(hue < 0, hue + 6, hue)
    hue[grey] = 0
    saturation = chroma / np.where(value == 0, 1.0, value)
    return np.stack((hue / 6.0, saturation, value)).astype(rgb.dtype, copy=False)


def _hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """HSV [3, ...] (hue in [0, 1)) -> RGB in [0, 1], [3, ...]."""
    hue, saturation, value = hsv
    channels = []
    chroma = value * saturation
    for n in (5, 3, 1):  # R, G, B
        k = hue * 6 + n  # in [n, n + 6): wrap once instead of a (slow) float modulo
        k = np.where(k >= 6, k - 6, k)
        channels.append(value - chroma * np.maximum(np.minimum(np.minimum(k, 4 - k), 1), 0))
    return np.stack(channels)


@dataclass(frozen=True)
class PhotoMetricDistortion:
    """Colour jitter of the public code (mmseg's PhotoMetricDistortion), each step with p = 0.5.

    brightness +U(-32, 32); contrast xU(0.5, 1.5), either first or last (coin flip);
    saturation xU(0.5, 1.5); hue shifted by an integer in [-18, 17] OpenCV units (2 degrees).
    Values are truncated to 0..255 integers after each step, as the uint8 original does; the
    HSV round trip is done in float rather than in OpenCV's 8-bit HSV.
    """

    brightness_delta: float = 32
    contrast_range: tuple[float, float] = (0.5, 1.5)
    saturation_range: tuple[float, float] = (0.5, 1.5)
    hue_delta: int = 18

    @staticmethod
    def _convert(image: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        return np.floor(np.clip(image * alpha + beta, 0, 255))

    def _contrast(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rng.random() < 0.5:
            return self._convert(image, alpha=rng.uniform(*self.contrast_range))
        return image

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        image = np.floor(np.clip(sample["image"], 0, 255)).astype(np.float32)  # as .astype(uint8)
        contrast_first = rng.random() < 0.5
        if rng.random() < 0.5:
            image = self._convert(image, beta=rng.uniform(-self.brightness_delta, self.brightness_delta))
        if contrast_first:
            image = self._contrast(image, rng)
        saturation = rng.uniform(*self.saturation_range) if rng.random() < 0.5 else None
        hue_shift = int(rng.integers(-self.hue_delta, self.hue_delta)) if rng.random() < 0.5 else None
        if saturation is not None or hue_shift is not None:
            hsv = _rgb_to_hsv(np.ascontiguousarray(image.transpose(2, 0, 1)) / np.float32(255.0))
            if saturation is not None:
                hsv[1] = np.floor(np.clip(hsv[1] * 255.0 * saturation, 0, 255)) / 255.0
            if hue_shift is not None:
                hsv[0] = (hsv[0] + hue_shift / 180.0) % 1.0
            image = np.clip(np.rint(_hsv_to_rgb(hsv).transpose(1, 2, 0) * 255.0), 0, 255)
        if not contrast_first:
            image = self._contrast(image, rng)
        return {**sample, "image": image.astype(np.float32)}


@dataclass(frozen=True)
class Normalize:
    """0..255 -> [0, 1] -> (x - mean) / std per channel (ImageNet statistics by default)."""

    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return {**sample, "image": ((sample["image"] / np.float32(255.0) - mean) / std).astype(np.float32)}


class LargerThanEvalSize(ValueError):
    """An evaluation image larger than the evaluation size (``image``, ``size``: height,
    width): the caller knows which field set the size and says so."""

    def __init__(self, image: tuple[int, int], size: Size) -> None:
        self.image, self.size = image, size
        super().__init__(
            f"image of {image[0]}x{image[1]} is larger than the evaluation size {size[0]}x{size[1]}; "
            "evaluation pads but never crops: pass a larger size"
        )


@dataclass(frozen=True)
class PadTo:
    """Pad image (with 0, i.e. the mean colour once normalised) and labels (with 255),
    centred, to at least ``size``.

    ``strict=True`` (evaluation) refuses an image larger than ``size``: evaluation never
    crops, and a batch must stack. The public code leaves such an image as it is.
    """

    size: Size
    strict: bool = False

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        height, width = sample["image"].shape[:2]
        if self.strict and (height > self.size[0] or width > self.size[1]):
            raise LargerThanEvalSize((height, width), self.size)
        if height >= self.size[0] and width >= self.size[1]:
            return sample
        out_h, out_w = max(height, self.size[0]), max(width, self.size[1])
        rows, cols = valid_region((out_h, out_w), (height, width))
        out = dict(sample)
        for key, value in _arrays(sample):
            padded = np.full(
                (out_h, out_w, *value.shape[2:]), 0 if key == "image" else IGNORE, dtype=value.dtype
            )
            padded[rows, cols] = value
            out[key] = padded
        return out


@dataclass(frozen=True)
class AddIgnoreRegions:
    """Mark what carries no label with 255, as the public ``AddIgnoreRegions``:

    depth 0 (no measurement) -> 255; normals of zero length -> 255; a human_parts map with no
    part pixel (no person, a person without part annotations, or a crop that missed the
    people) -> all 255, so such an image or crop gives no background supervision either.
    A disparity of 0 is a valid value (the loader marks invalid pixels 255): left as it is.
    """

    depth_unit: str = "metres"

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        out = dict(sample)
        if "depth" in out and self.depth_unit == "metres":
            out["depth"] = np.where(out["depth"] == 0, np.float32(IGNORE), out["depth"]).astype(np.float32)
        if "normals" in out:
            normals = out["normals"].copy()
            normals[_all_channels(normals, 0)] = IGNORE
            out["normals"] = normals
        if "human_parts" in out:
            parts = out["human_parts"]
            if ((parts == 0) | (parts == IGNORE)).all():
                out["human_parts"] = np.full_like(parts, IGNORE)
        return out


@dataclass(frozen=True)
class ToTensor:
    """numpy -> torch: image and normals [C, H, W] float32; class maps [H, W] int64;
    edge and depth [H, W] float32."""

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        out = dict(sample)
        for key, value in _arrays(sample):
            if value.ndim == 3:
                value = value.transpose(2, 0, 1)
            dtype = np.int64 if key in CLASS_MAP_TASKS else np.float32
            out[key] = torch.from_numpy(np.ascontiguousarray(value, dtype=dtype))
        return out


#: The public code's training rescaling range.
PAPER_SCALE_RANGE = (0.5, 2.0)


def train_transforms(
    size: int | Sequence[int],
    scale_range: Sequence[float] = PAPER_SCALE_RANGE,
    depth_unit: str = "metres",
    resize: bool = False,
) -> Compose:
    """The public code's training augmentation; ``scale_range`` bounds the random rescaling.
    ``resize``: every image is first resized to ``size`` (Cityscapes, as FMTL-Bench does)."""
    size = as_size(size)
    first = (Resize(size, depth_unit),) if resize else ()
    return Compose(
        (
            *first,
            RandomScale(*scale_range, depth_unit=depth_unit),
            RandomCrop(size, cat_max_ratio=0.75),
            RandomHorizontalFlip(),
            PhotoMetricDistortion(),
            Normalize(),
            PadTo(size),
            AddIgnoreRegions(depth_unit),
            ToTensor(),
        )
    )


def eval_transforms(size: int | Sequence[int], depth_unit: str = "metres", resize: bool = False) -> Compose:
    """Normalise and pad to ``size``; ``resize``: resize every image to ``size`` first."""
    size = as_size(size)
    first = (Resize(size, depth_unit),) if resize else ()
    return Compose((*first, Normalize(), PadTo(size, strict=True), AddIgnoreRegions(depth_unit), ToTensor()))
