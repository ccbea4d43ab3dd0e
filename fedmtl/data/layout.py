"""The on-disk layouts of PASCAL-Context, NYUD-v2 and Cityscapes, as the public releases ship them.

This module is the single place that knows file names and encodings. The dataset classes
read through it and the synthetic-data generator writes through it, so generated data is
read by exactly the code that reads the real data.

PASCAL-Context (``PASCALContext/``)::

    JPEGImages/<id>.jpg                      RGB image
    ImageSets/Context/{train,val}.txt        one id per line
    semseg/VOC12/<id>.png                    21-class labels, 255 = ignore
    semseg/pascal-context/<id>.png           (fallback location of the same)
    human_parts/<id>.mat                     PASCAL-Part annotation struct ``anno``
    sal_distill/<id>.png                     saliency, 0..255 (foreground > 127)
    normals_distill/<id>.png                 normals, RGB = (n + 1) / 2 * 255
    pascal-context/trainval/<id>.mat         ``LabelMap``: context class per pixel
    json/{pascal_part,nyu_classes,context_classes}.json

NYUD-v2 (``NYUDv2/``)::

    images/<id>.png                          RGB image
    gt_sets/{train,val}.txt                  one id per line
    segmentation/<id>.png                    40 classes stored as label + 1, 0 = unlabelled
    edge/<id>.png                            boundaries, 0 or 255
    normals/<id>.png                         normals, RGB = (n + 1) / 2 * 255
    depth/<id>.npy                           float depth in metres

Cityscapes (``Cityscapes/``), an id being ``<city>/<city>_<seq:06d>_<frame:06d>``; a split is
the sorted list of its ``leftImg8bit`` images (the release has no split files)::

    leftImg8bit/{train,val}/<id>_leftImg8bit.png   RGB image
    gtFine/{train,val}/<id>_gtFine_labelIds.png    official label ids 0..33 (8-bit)
    disparity/{train,val}/<id>_disparity.png       16-bit, d = 256 * disparity + 1, 0 = invalid
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

SPLITS = ("train", "val")

# Layout description printed in "dataset not found / incomplete" errors.
PASCAL_CONTEXT_TREE = """PASCALContext/
  JPEGImages/<id>.jpg
  ImageSets/Context/{train,val}.txt
  semseg/VOC12/<id>.png  (or semseg/pascal-context/<id>.png)
  human_parts/<id>.mat
  sal_distill/<id>.png
  normals_distill/<id>.png
  pascal-context/trainval/<id>.mat
  json/{pascal_part,nyu_classes,context_classes}.json"""

CITYSCAPES_TREE = """Cityscapes/
  leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png
  gtFine/{train,val}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png
  disparity/{train,val}/<city>/<city>_<seq>_<frame>_disparity.png"""

NYUD_TREE = """NYUDv2/
  images/<id>.png
  gt_sets/{train,val}.txt
  segmentation/<id>.png
  edge/<id>.png
  normals/<id>.png
  depth/<id>.npy"""


def encode_normals(normals: np.ndarray) -> np.ndarray:
    """Unit normals in [-1, 1], [H, W, 3] -> uint8 RGB as the releases store them."""
    return np.clip(np.rint((normals + 1.0) * 127.5), 0, 255).astype(np.uint8)


def decode_normals(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB -> float32 normals in [-1, 1] (2x/255 - 1, as the public loaders do)."""
    return (2.0 * rgb.astype(np.float32) / 255.0 - 1.0).astype(np.float32)


def link_problem(path: Path) -> str | None:
    """Why ``path`` cannot be reached, when a symbolic link is the cause: a loop (on it or a
    folder above it) or a link to nothing; None otherwise (also when it is fine)."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link loop (Symlink loop): replace the link by the file or folder it stands for"
        if path.is_symlink():
            return (
                f"a broken symbolic link (to {os.readlink(path)}, which does not exist): point it at "
                "the file or folder it stands for, or remove it"
            )
    return None


def read_split(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def write_split(path: Path, ids: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i}\n" for i in ids))


def _save_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, compress_level=1)


# --------------------------------------------------------------------------- PASCAL-Context


@dataclass(frozen=True)
class PartAnnotation:
    """One object of a PASCAL-Part annotation: its VOC class, mask and named part masks."""

    class_name: str
    class_ind: int  # VOC class index; 15 = person
    mask: np.ndarray  # [H, W] bool
    parts: dict[str, np.ndarray] = field(default_factory=dict)  # part name -> [H, W] bool


@dataclass(frozen=True)
class PascalContextLayout:
    root: Path
    split_kind = "split file"  # what split_file() names, for messages

    def has_split(self, split: str) -> bool:
        return self.split_file(split).is_file()

    def split_ids(self, split: str) -> list[str]:
        return read_split(self.split_file(split))

    def split_file(self, split: str) -> Path:
        return self.root / "ImageSets" / "Context" / f"{split}.txt"

    def image(self, i: str) -> Path:
        return self.root / "JPEGImages" / f"{i}.jpg"

    def semseg_candidates(self, i: str) -> tuple[Path, Path]:
        return (
            self.root / "semseg" / "VOC12" / f"{i}.png",
            self.root / "semseg" / "pascal-context" / f"{i}.png",
        )

    def human_parts(self, i: str) -> Path:
        return self.root / "human_parts" / f"{i}.mat"

    def sal(self, i: str) -> Path:
        return self.root / "sal_distill" / f"{i}.png"

    def normals(self, i: str) -> Path:
        return self.root / "normals_distill" / f"{i}.png"

    def label_map(self, i: str) -> Path:
        return self.root / "pascal-context" / "trainval" / f"{i}.mat"

    def json(self, name: str) -> Path:
        return self.root / "json" / f"{name}.json"

    # --- writers (used by the synthetic generator and by tests)

    def write_meta(
        self,
        splits: dict[str, Sequence[str]],
        context_classes: dict[str, int],
        nyu_classes: dict[str, int],
        pascal_part: dict[str, object],
    ) -> None:
        for split, ids in splits.items():
            write_split(self.split_file(split), ids)
        for name, content in (
            ("context_classes", context_classes),
            ("nyu_classes", nyu_classes),
            ("pascal_part", pascal_part),
        ):
            path = self.json(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(content, indent=1))

    def write_sample(
        self,
        i: str,
        image: np.ndarray,
        semseg: np.ndarray,
        label_map: np.ndarray,
        parts: Sequence[PartAnnotation],
        sal: np.ndarray,
        normals: np.ndarray,
        semseg_dir: str = "VOC12",
    ) -> None:
        """Write every label file of one image.

        image [H,W,3] uint8; semseg [H,W] uint8 (0..20, 255); label_map [H,W] int context
        class ids; sal [H,W] uint8 0..255; normals [H,W,3] float in [-1, 1].
        """
        path = self.image(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path, quality=95)
        _save_png(self.root / "semseg" / semseg_dir / f"{i}.png", semseg.astype(np.uint8))
        _save_png(self.sal(i), sal.astype(np.uint8))
        _save_png(self.normals(i), encode_normals(normals))
        _save_mat(self.label_map(i), {"LabelMap": label_map.astype(np.uint16)})
        _save_mat(self.human_parts(i), {"anno": _part_struct(i, parts)})


# scipy stamps the creation time into the 116-byte text of a MAT-file header; a fixed text
# makes the same content the same bytes (reproducible generated datasets).
_MAT_HEADER_TEXT = b"MATLAB 5.0 MAT-file, written by fedmtl".ljust(116, b" ")


def _save_mat(path: Path, content: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, content, do_compression=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_MAT_HEADER_TEXT + buffer.getvalue()[len(_MAT_HEADER_TEXT) :])


def _part_struct(image_id: str, objects: Sequence[PartAnnotation]) -> np.ndarray:
    """The MATLAB struct of PASCAL-Part: anno.imname, anno.objects(class, class_ind, mask,
    parts(part_name, mask)); an object without parts has an empty 0x0 ``parts``."""
    obj_array = np.zeros((1, len(objects)), dtype=[(n, "O") for n in ("class", "class_ind", "mask", "parts")])
    for j, obj in enumerate(objects):
        if obj.parts:
            parts = np.zeros((1, len(obj.parts)), dtype=[("part_name", "O"), ("mask", "O")])
            for k, (name, mask) in enumerate(obj.parts.items()):
                parts[0, k] = (name, mask.astype(np.uint8))
        else:
            parts = np.zeros((0, 0))
        obj_array[0, j] = (
            obj.class_name,
            np.array([[obj.class_ind]], dtype=np.uint8),
            obj.mask.astype(np.uint8),
            parts,
        )
    anno = np.zeros((1, 1), dtype=[("imname", "O"), ("objects", "O")])
    anno[0, 0] = (image_id, obj_array)
    return anno


def read_label_map(path: Path) -> np.ndarray:
    """Read ``pascal-context/trainval/<id>.mat``: the context class of every pixel, [H, W]."""
    return scipy.io.loadmat(path)["LabelMap"]


def read_part_annotations(path: Path) -> list[PartAnnotation]:
    """Read a PASCAL-Part ``.mat`` (real or generated) into :class:`PartAnnotation` objects."""
    anno = scipy.io.loadmat(path)["anno"][0, 0]
    objects = anno["objects"]
    result = []
    for obj in objects.reshape(-1):
        parts_field = obj["parts"]
        parts = {}
        if parts_field.size:
            for part in parts_field.reshape(-1):
                parts[str(part["part_name"].reshape(-1)[0])] = part["mask"].astype(bool)
        result.append(
            PartAnnotation(
                class_name=str(obj["class"].reshape(-1)[0]),
                class_ind=int(obj["class_ind"].reshape(-1)[0]),
                mask=obj["mask"].astype(bool),
                parts=parts,
            )
        )
    return result


# --------------------------------------------------------------------------- NYUD-v2


@dataclass(frozen=True)
class NYUDLayout:
    root: Path
    split_kind = "split file"  # what split_file() names, for messages

    def has_split(self, split: str) -> bool:
        return self.split_file(split).is_file()

    def split_ids(self, split: str) -> list[str]:
        return read_split(self.split_file(split))

    def split_file(self, split: str) -> Path:
        return self.root / "gt_sets" / f"{split}.txt"

    def image(self, i: str) -> Path:
        return self.root / "images" / f"{i}.png"

    def semseg(self, i: str) -> Path:
        return self.root / "segmentation" / f"{i}.png"

    def edge(self, i: str) -> Path:
        return self.root / "edge" / f"{i}.png"

    def normals(self, i: str) -> Path:
        return self.root / "normals" / f"{i}.png"

    def depth(self, i: str) -> Path:
        return self.root / "depth" / f"{i}.npy"

    def write_meta(self, splits: dict[str, Sequence[str]]) -> None:
        for split, ids in splits.items():
            write_split(self.split_file(split), ids)

    def write_sample(
        self,
        i: str,
        image: np.ndarray,
        semseg: np.ndarray,
        edge: np.ndarray,
        normals: np.ndarray,
        depth: np.ndarray,
    ) -> None:
        """image [H,W,3] uint8; semseg [H,W] 0..39 or 255 (stored as label + 1, 0 = unlabelled);
        edge [H,W] bool; normals [H,W,3] in [-1, 1]; depth [H,W] metres (0 = missing)."""
        _save_png(self.image(i), image)
        stored = np.where(semseg == 255, 0, semseg.astype(np.int32) + 1).astype(np.uint8)
        _save_png(self.semseg(i), stored)
        _save_png(self.edge(i), (edge.astype(np.uint8) * 255))
        _save_png(self.normals(i), encode_normals(normals))
        self.depth(i).parent.mkdir(parents=True, exist_ok=True)
        np.save(self.depth(i), depth.astype(np.float32))


# --------------------------------------------------------------------------- Cityscapes

# labelId -> trainId of cityscapesScripts' helpers/labels.py: the 19 evaluated classes, every
# other id (void, and classes not evaluated such as parking, rail track, caravan) 255.
CITYSCAPES_TRAIN_IDS = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12,
    26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}  # fmt: skip
CITYSCAPES_MAX_LABEL_ID = 33
# The release's archives (leftImg8bit_trainvaltest.zip, ...) each hold one of these at the top.
CITYSCAPES_PARTS = ("leftImg8bit", "gtFine", "disparity")
DISPARITY_IGNORE = 255  # = fedmtl.data.transforms.IGNORE (not imported: this module stays light)


def cityscapes_train_ids(label_ids: np.ndarray) -> np.ndarray:
    """Official label ids -> train ids 0..18, every other id (void 0..6, the license plate -1,
    which an 8-bit png can only hold as 255, ids past 33) -> 255."""
    table = np.full(256, 255, dtype=np.int64)
    for label_id, train_id in CITYSCAPES_TRAIN_IDS.items():
        table[label_id] = train_id
    ids = np.asarray(label_ids).astype(np.int64)
    return np.where((ids >= 0) & (ids < 256), table[np.clip(ids, 0, 255)], 255)


def encode_disparity(disparity: np.ndarray) -> np.ndarray:
    """Disparity in pixels -> the release's uint16 ``256 * disparity + 1``; NaN, negative or
    255 (ignore) -> 0 (invalid)."""
    disparity = np.asarray(disparity, dtype=np.float64)
    valid = np.isfinite(disparity) & (disparity >= 0) & (disparity != DISPARITY_IGNORE)
    stored = np.where(valid, np.rint(np.where(valid, disparity, 0) * 256.0) + 1, 0)
    return np.clip(stored, 0, 65535).astype(np.uint16)


def decode_disparity(stored: np.ndarray) -> np.ndarray:
    """The release's uint16 values -> float32 disparity in pixels, (d - 1) / 256 where d > 0;
    d = 0 (invalid) -> 255 (ignored by the loss, the transforms and the metric). A disparity
    of 255 px or more (d >= 65281, under ~2 m from the camera) would read as the ignore value:
    marked ignored too."""
    stored = np.asarray(stored).astype(np.float64)
    disparity = np.where(stored > 0, (stored - 1.0) / 256.0, DISPARITY_IGNORE)
    return np.where(disparity >= DISPARITY_IGNORE, DISPARITY_IGNORE, disparity).astype(np.float32)


DISPARITY_FIX = (
    "save the disparity as the release does: a 16-bit grey png, d = 256 * disparity + 1, 0 = invalid"
)


def read_disparity_png(path: Path) -> np.ndarray:
    """A disparity png's stored uint16 values as int64 [H, W]; an 8-bit or colour png is
    refused (it cannot hold the release's encoding)."""
    with Image.open(path) as im:
        if not _sixteen_bit(im):
            raise _mode_refused(im, path, "a disparity", DISPARITY_FIX)
        stored = np.asarray(im).astype(np.int64)
    if stored.min(initial=0) < 0 or stored.max(initial=0) > 65535:
        raise _form_error(path, f"a disparity with values outside 0..65535: {DISPARITY_FIX}")
    return stored


@dataclass(frozen=True)
class CityscapesLayout:
    root: Path
    split_kind = "image folder"  # split_file() is the split's leftImg8bit folder

    def split_file(self, split: str) -> Path:
        """The folder whose images make the split (the release has no split files)."""
        return self.root / "leftImg8bit" / split

    def has_split(self, split: str) -> bool:
        return self.split_file(split).is_dir()

    def split_ids(self, split: str) -> list[str]:
        suffix = "_leftImg8bit.png"
        return sorted(
            f"{path.parent.name}/{path.name[: -len(suffix)]}"
            for path in self.split_file(split).glob(f"*/*{suffix}")
        )

    def image(self, split: str, i: str) -> Path:
        return self.root / "leftImg8bit" / split / f"{i}_leftImg8bit.png"

    def semseg(self, split: str, i: str) -> Path:
        return self.root / "gtFine" / split / f"{i}_gtFine_labelIds.png"

    def disparity(self, split: str, i: str) -> Path:
        return self.root / "disparity" / split / f"{i}_disparity.png"

    def write_sample(
        self, split: str, i: str, image: np.ndarray, label_ids: np.ndarray, disparity: np.ndarray
    ) -> None:
        """image [H,W,3] uint8; label_ids [H,W] official ids 0..33; disparity [H,W] pixels
        (NaN, negative or 255: invalid, stored 0)."""
        _save_png(self.image(split, i), image)
        _save_png(self.semseg(split, i), np.asarray(label_ids).astype(np.uint8))
        _save_png(self.disparity(split, i), encode_disparity(disparity))


# --------------------------------------------------------------------------- reading pictures
#
# How every png / jpeg is read, by the loaders and by ``fedmtl data check`` alike. The releases
# store 8-bit RGB images, grey (L) or palette (P) class labels, grey intensity labels (sal,
# edge) and 8-bit RGB normals. A file re-saved in another form is read the same where the form
# is unambiguous (a 16-bit image is scaled to 0..255; a palette label's indices are its
# classes; an RGB label whose three channels are equal is grey; an alpha channel that is opaque
# everywhere is dropped), and refused naming the file otherwise, so that it is never read wrong.

_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_RGB_LIKE = ("RGB", "L", "P", "1", "CMYK", "YCbCr")  # convert("RGB") reads them right


class DataFormError(ValueError):
    """A file that opens but is not in a form its loader reads right: the message names the
    file and what to do (one argument, so that a DataLoader worker can re-raise it)."""

    def __init__(self, message: str, path: Path | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.path, self.reason = path, reason or message


def _form_error(path: Path, reason: str) -> DataFormError:
    return DataFormError(f"{path}: {reason}", path, reason)


def _opaque(im: Image.Image) -> bool:
    """Whether an image with transparency is opaque everywhere (its alpha says nothing)."""
    return im.convert("RGBA").getchannel("A").getextrema() == (255, 255)


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info


def _sixteen_bit(im: Image.Image) -> bool:
    """A 16-bit grey picture (PIL opens a 16-bit grey png as I;16, or as I on older versions)."""
    return im.mode in _SIXTEEN_BIT or (im.mode == "I" and im.format == "PNG")


def _equal_channels(rgb: np.ndarray, path: Path, what: str, fix: str) -> np.ndarray:
    """[H, W, 3] whose channels are equal -> [H, W]; a colour picture is refused."""
    if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])):
        raise _form_error(path, f"{what} in colour (RGB), its channels differ: {fix}")
    return rgb[..., 0]


def _mode_refused(im: Image.Image, path: Path, what: str, fix: str) -> DataFormError:
    return _form_error(path, f"{what} of mode {im.mode} ({im.format or 'unknown format'}), not read: {fix}")


def _read_opaque(im: Image.Image, path: Path, what: str, fix: str) -> Image.Image:
    if _has_alpha(im):
        if not _opaque(im):
            raise _form_error(path, f"{what} with transparent pixels: {fix}")
        return im.convert("RGBA").convert("RGB")
    return im


IMAGE_FIX = "save it as an 8-bit RGB image"


def read_image(path: Path) -> np.ndarray:
    """An input image as float32 [H, W, 3] in 0..255: 8-bit RGB, grey or palette as stored,
    16-bit grey scaled by 255/65535 (v / 257: 257 * x reads x)."""
    with Image.open(path) as im:
        if _sixteen_bit(im):
            grey = np.asarray(im, dtype=np.float32)
            if grey.max(initial=0) > 65535 or grey.min(initial=0) < 0:
                raise _mode_refused(im, path, "an image", IMAGE_FIX)
            grey = grey / 257.0
            return np.repeat(grey[..., None], 3, axis=2)
        if _has_alpha(im):
            im = _read_opaque(im, path, "an image", IMAGE_FIX)
        elif im.mode not in _RGB_LIKE:
            raise _mode_refused(im, path, "an image", IMAGE_FIX)
        return np.asarray(im.convert("RGB"), dtype=np.float32)


CLASS_FIX = "save the class ids as a grey (L) or palette (P) png, one id per pixel"


def read_class_label(path: Path) -> np.ndarray:
    """A class label (semseg) as int64 [H, W], the stored values: a grey png's values, a
    palette png's indices (not its colours), a 16-bit png's values; an RGB png whose channels
    are equal is read as grey."""
    with Image.open(path) as im:
        if _has_alpha(im) and im.mode != "P":
            im = _read_opaque(im, path, "a label", CLASS_FIX)
        if im.mode in ("L", "P", "1") or _sixteen_bit(im):
            return np.asarray(im).astype(np.int64)
        if im.mode == "RGB":
            return _equal_channels(np.asarray(im), path, "a label", CLASS_FIX).astype(np.int64)
        raise _mode_refused(im, path, "a label", CLASS_FIX)


GREY_FIX = "save it as a grey (L) 8-bit png"


def read_grey_label(path: Path) -> np.ndarray:
    """An intensity label (sal, edge) as float32 [H, W] in 0..255: a grey png's values, a
    bilevel png's 0/255, a palette png's grey levels, a 16-bit png scaled by 255/65535; an RGB
    png (or palette) whose channels are equal is read as grey."""
    with Image.open(path) as im:
        if _sixteen_bit(im):
            return np.asarray(im, dtype=np.float32) / 257.0
        if _has_alpha(im):
            im = _read_opaque(im, path, "a label", GREY_FIX)
        if im.mode in ("L", "1"):
            return np.asarray(im.convert("L"), dtype=np.float32)
        if im.mode in ("RGB", "P"):
            grey = _equal_channels(np.asarray(im.convert("RGB")), path, "a label", GREY_FIX)
            return grey.astype(np.float32)
        raise _mode_refused(im, path, "a label", GREY_FIX)


NORMALS_FIX = "save the normals as an 8-bit RGB png, RGB = (n + 1) / 2 * 255"


def read_normals(path: Path) -> np.ndarray:
    """A normals png as float32 [H, W, 3] in [-1, 1]: 8-bit RGB (or palette) as stored; a grey
    png holds no normals and is refused."""
    with Image.open(path) as im:
        if _has_alpha(im):
            im = _read_opaque(im, path, "a normals label", NORMALS_FIX)
        if im.mode not in ("RGB", "P"):
            raise _mode_refused(im, path, "a normals label", NORMALS_FIX)
        return decode_normals(np.asarray(im.convert("RGB")))


def check_class_values(
    stored: np.ndarray, path: Path, highest: int, ignore: int | None, allowed: str
) -> None:
    """A class label's stored values are ``0 .. highest`` or ``ignore``; else DataFormError naming
    the file, the values outside (``allowed`` says what is allowed) and how many pixels hold them.
    A value past the classes would stop training mid-round (``Target 100 is out of bounds``)."""
    bad = (stored < 0) | (stored > highest)
    if ignore is not None:
        bad &= stored != ignore
    if not bad.any():
        return
    values = [str(v) for v in np.unique(stored[bad])[:4]]
    raise _form_error(
        path,
        f"holds class value {', '.join(values)} in {int(bad.sum()):,} pixels, outside {allowed}: fix or "
        "replace the label, or remove the image's id from the split files",
    )
