"""PASCAL-Context for multi-task learning: semseg, human_parts, sal, normals, edge.

Labels are read as the public FedHCA² loader reads them (``datasets/pascal_context.py``):

- semseg: the 21-class png as stored (255 = ignore);
- human_parts: PASCAL-Part person parts folded into 6 labels (:data:`HUMAN_PARTS`), 0 elsewhere;
  an image without a person (or whose people have no part annotation) has no label: all 255;
- sal: distilled saliency png / 255 > 0.5;
- normals: distilled normals decoded to [-1, 1], kept only on context classes that NYUD also
  has (where the teacher network was trained), 255 elsewhere;
- edge: boundaries of the context LabelMap, depending on the split (see :class:`PascalContext`):
  train: 4-neighbour Laplacian != 0, thinned (the public training label, :func:`label_boundaries`);
  val: BSDS ``seg2bmap`` (the ground truth of the public SEISM evaluation, :func:`seg2bmap`).

Which images a human_parts dataset keeps, and which it labels, is ``human_parts_selection``
(the config's ``data.human_parts_selection``, :data:`HUMAN_PARTS_SELECTIONS`):

- "correct" (the default): a dataset whose only task is human_parts keeps exactly the images of
  its selection (``indices``, in their order; the whole split without) that show a person, so a
  single-task parts client trains only on images with people; any other dataset keeps them all.
  Every image is labelled from its own annotation (all 255 without a person).
- "public": the public loader's selection, reproduced for the paper's human-parts numbers.
  FedHCA² ``datasets/pascal_context.py`` (innovator-zero/FedHCA2 at 9e3c9b3) computes its
  has-a-person flags over the whole split, ``flag[k]`` of split image k (lines 160-167: class 15
  in ``part_obj_dict``: the classes of the objects of non-empty mask, from ``_preprocess_parts``,
  lines 325-346, or the ``ImageSets/Parts/<split>.txt`` it wrote, lines 157-159 and 316-323; the
  same test as :func:`has_person`). ``__build_truncated_dataset__``
  (called at line 169, lines 184-192) then replaces the image list by the client's ``dataidxs``
  and leaves ``has_human_parts`` as it was, so both readers index the whole split's flags by
  position in the client's list: the parts-only filter (lines 171-182) deletes position i when
  ``has_human_parts[i] == 0``, and ``_load_human_parts`` (lines 251-284) reads the annotation
  only ``if self.has_human_parts[index]``, else returns zeros (line 284), as it does for an
  image without a person with parts (lines 277-279); ``AddIgnoreRegions``
  (``datasets/custom_transforms.py``) turns an all-zero map into all 255. With the client's list
  ``split[indices[0]], ..., split[indices[n - 1]]``:

  * a parts-only client keeps the images at the positions k with ``flag[k] == 1``, whether they
    show a person or not (the filter deletes a flag with its image, so every kept image reads a
    flag 1 at its new position and is labelled from its own annotation: all 255 without a
    person), and drops those at ``flag[k] == 0``, people or not;
  * any other client keeps every image; the one at position k is labelled from its own
    annotation where ``flag[k] == 1`` and all 255 where ``flag[k] == 0``, even if it shows a
    person.

  Only ``flag[0 .. n-1]`` is ever read. Without ``indices`` position k is split image k and the
  two modes agree: the public code builds its validation sets without ``dataidxs`` (``train.py``
  ``get_clients``), so "public" changes the training sets only (it applies to any split given
  ``indices``). The number of images a parts-only client keeps, ``sum(flag[0 .. n-1])``, depends
  only on n; which images they are depends on the order of ``indices``: fedmtl's partitions are
  sorted, the public code's in the order of its random permutation (``utils.get_st_config``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from scipy import ndimage
from skimage.morphology import thin

from fedmtl.data.classes import VOC_CLASSES
from fedmtl.data.datasets import DATASETS, DatasetSpec, DenseDataset
from fedmtl.data.layout import (
    PASCAL_CONTEXT_TREE,
    PartAnnotation,
    PascalContextLayout,
    check_class_values,
    read_class_label,
    read_grey_label,
    read_image,
    read_label_map,
    read_normals,
    read_part_annotations,
)
from fedmtl.data.transforms import IGNORE, Sample

PERSON_CLASS = 15  # VOC class index of "person" in PASCAL-Part

#: Values of ``human_parts_selection`` (see the module docstring); the first is the default.
HUMAN_PARTS_SELECTIONS = ("correct", "public")

# PASCAL-Part person part -> human_parts label (1 head, 2 torso, 3 upper arms,
# 4 lower arms and hands, 5 upper legs, 6 lower legs and feet), as in the public code.
HUMAN_PARTS = {
    "hair": 1,
    "head": 1,
    "lear": 1,
    "lebrow": 1,
    "leye": 1,
    "mouth": 1,
    "nose": 1,
    "rear": 1,
    "rebrow": 1,
    "reye": 1,
    "neck": 2,
    "torso": 2,
    "luarm": 3,
    "ruarm": 3,
    "lhand": 4,
    "llarm": 4,
    "rhand": 4,
    "rlarm": 4,
    "luleg": 5,
    "ruleg": 5,
    "lfoot": 6,
    "llleg": 6,
    "rfoot": 6,
    "rlleg": 6,
}

# Same kernel as cv2.Laplacian(ksize=1); mode="mirror" is OpenCV's default reflect-101 border.
_LAPLACIAN = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], dtype=np.int32)

# part annotation file (path, mtime) -> whether the image shows a person. In memory only:
# the public code writes this index into the dataset root; we never write there.
_HAS_PERSON: dict[tuple[str, int], bool] = {}


def _is_person(obj: PartAnnotation) -> bool:
    return obj.class_ind == PERSON_CLASS and bool(obj.mask.any())


def has_person(path: Path) -> bool:
    """Whether a PASCAL-Part annotation holds a person with a non-empty mask (cached)."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _HAS_PERSON:
        _HAS_PERSON[key] = any(_is_person(obj) for obj in read_part_annotations(path))
    return _HAS_PERSON[key]


def human_parts_label(
    objects: list[PartAnnotation], shape: tuple[int, int], source: Path | str = ""
) -> np.ndarray:
    """6-part label map of the people in an image; all 255 when it has no part label."""
    target = np.zeros(shape, dtype=np.float32)
    if not any(_is_person(obj) for obj in objects):
        return np.full(shape, IGNORE, dtype=np.float32)
    for obj in objects:  # later people overwrite earlier ones where they overlap
        if obj.class_ind != PERSON_CLASS:
            continue
        for part, mask in obj.parts.items():
            if part not in HUMAN_PARTS:
                raise ValueError(
                    f"unknown person part {part!r} in {source}; known: {', '.join(sorted(HUMAN_PARTS))}"
                )
            target[mask] = HUMAN_PARTS[part]
    if not target.any():  # people without part annotations: the public code ignores them too
        return np.full(shape, IGNORE, dtype=np.float32)
    return target


def label_boundaries(label_map: np.ndarray) -> np.ndarray:
    """Edges of a label map: pixels whose 4-neighbour Laplacian is non-zero, thinned; {0, 1}."""
    laplacian = ndimage.convolve(label_map.astype(np.int32), _LAPLACIAN, mode="mirror")
    return thin(laplacian != 0).astype(np.float32)


def seg2bmap(labels: np.ndarray) -> np.ndarray:
    """Boundary map of a label map as the BSDS benchmark draws it: 1 px wide, bool [H, W].

    A port of ``seg2bmap.m`` (David Martin, BSDS, 2003; the copy in innovator-zero/seism
    ``src/misc/seg2bmap.m``, called by ``edgesEvalImg`` on every ground truth), for an output
    of the input's size (its ``width``/``height`` resampling is then the identity)::

        b = (seg~=e | seg~=s | seg~=se);         % east, south, south-east neighbour
        b(end,:) = (seg(end,:)~=e(end,:));       % last row: east neighbour only
        b(:,end) = (seg(:,end)~=s(:,end));       % last column: south neighbour only
        b(end,end) = 0;                          % bottom-right pixel: never

    so a pixel is a boundary if its label differs from its east, south or south-east
    neighbour; the line lies on the top/left side of a label change ("offset by 1/2 pixel
    towards the origin"). The zeros MATLAB pads ``e``/``s``/``se`` with never count: the last
    row and column are overwritten, in that order, and the corner is cleared (for a single row
    or column the same rules give: compare along it, last pixel 0). No label value is special:
    0 and 255 are labels like any other, and nothing is thinned. Any dtype that compares with
    ``!=`` works (labels of different dtypes compare by value).
    """
    seg = np.asarray(labels)
    if seg.ndim != 2:
        raise ValueError(f"seg2bmap needs a 2-D label map, got shape {seg.shape}")
    bmap = np.zeros(seg.shape, dtype=bool)
    if seg.size == 0:
        return bmap
    inner = seg[:-1, :-1]
    bmap[:-1, :-1] = (inner != seg[:-1, 1:]) | (inner != seg[1:, :-1]) | (inner != seg[1:, 1:])
    bmap[-1, :-1] = seg[-1, :-1] != seg[-1, 1:]
    bmap[:-1, -1] = seg[:-1, -1] != seg[1:, -1]
    bmap[-1, -1] = False
    return bmap


def normals_valid_classes(nyu_classes: object, context_classes: dict[str, int]) -> np.ndarray:
    """Context class ids on which the distilled normals are valid: the NYU classes that
    PASCAL-Context also has, without 'unknown', plus 'tvmonitor' (named differently in NYU)."""
    valid = [context_classes[name] for name in nyu_classes if name in context_classes and name != "unknown"]
    if "tvmonitor" in context_classes:
        valid.append(context_classes["tvmonitor"])
    return np.asarray(sorted(set(valid)), dtype=np.int64)


class PascalContext(DenseDataset):
    """PASCAL-Context (see the module docstring for how every label is read).

    The edge label depends on the split, on purpose: each split gets the ground truth the
    public code uses it with.

    - train (and any split other than val): the public *training* label, FedHCA²
      ``datasets/pascal_context.py`` ``_load_edge``: 4-neighbour Laplacian of the LabelMap
      != 0, thinned (:func:`label_boundaries`);
    - val: the public *evaluation* ground truth, innovator-zero/seism
      ``src/gt_wrappers/db_gt.m`` (``relabel(uint32(LabelMap))``) and ``edgesEvalImg.m``
      (``seg2bmap`` of every ground truth; jponttuset/seism's copy, the fork's is not in the
      index): ``seg2bmap(relabel(LabelMap))`` of the same ``pascal-context/trainval/<id>.mat``
      (:func:`seg2bmap`). ``relabel`` (jponttuset/seism ``src/aux/relabel.m``: 4-connected
      regions numbered anew) does not change the map: two 4-neighbours keep equal labels
      either way, and a south-east neighbour only decides a pixel whose east and south
      neighbours share its label, which connects the two (``uint32`` is the identity on
      the non-negative integer class ids of a LabelMap). Edge odsF on val therefore scores
      against the lines SEISM scores against.

    Both are {0, 1} float32 maps and go through the same transforms: the validation
    transform only normalises and pads (padding 255 = ignored, which
    :class:`fedmtl.metrics.edge.EdgeODSF` crops off); a val dataset built with
    ``augment=True`` still carries ``seg2bmap`` lines. The split is the one given to
    :func:`fedmtl.data.datasets.build_dataset` (``self.split``).
    """

    name = "pascal_context"
    title = "PASCAL-Context"
    tasks_available = ("semseg", "human_parts", "sal", "normals", "edge")
    tree = PASCAL_CONTEXT_TREE
    layout_class = PascalContextLayout
    semseg_classes = VOC_CLASSES
    semseg_background = 0

    def __init__(self, *args, human_parts_selection: str = HUMAN_PARTS_SELECTIONS[0], **kwargs) -> None:
        """The arguments of :class:`~fedmtl.data.datasets.DenseDataset`, and which images a
        human_parts dataset keeps and labels: "correct" or "public" (see the module docstring)."""
        if human_parts_selection not in HUMAN_PARTS_SELECTIONS:
            raise ValueError(
                f"human_parts_selection must be one of {', '.join(HUMAN_PARTS_SELECTIONS)}, "
                f"got {human_parts_selection!r} (the config's data.human_parts_selection)"
            )
        self.human_parts_selection = human_parts_selection
        # Per sample: whether its human_parts label is replaced by all 255 ("public" only).
        self._parts_ignored: list[bool] = []
        super().__init__(*args, **kwargs)

    def _prepare(self) -> None:
        if "normals" in self.tasks:
            nyu = json.loads(self.layout.json("nyu_classes").read_text())
            context = json.loads(self.layout.json("context_classes").read_text())
            self.normals_classes = normals_valid_classes(nyu, context)

    @classmethod
    def keeps_subset(cls, tasks: Sequence[str]) -> bool:
        return tuple(tasks) == ("human_parts",)  # a parts-only client keeps images with a person

    def semseg_label(self, image_id: str) -> np.ndarray:
        return self.read_semseg(next(p for p in self.layout.semseg_candidates(image_id) if p.is_file()))

    @staticmethod
    def read_semseg(path: Path) -> np.ndarray:
        """A semseg png as int64 labels, its values as stored; one past the 21 classes (not 255)
        raises DataFormError naming the file."""
        label = read_class_label(path)
        allowed = f"0-{len(VOC_CLASSES) - 1} (the {len(VOC_CLASSES)} classes) and {IGNORE} (ignored)"
        check_class_values(label, path, len(VOC_CLASSES) - 1, IGNORE, allowed)
        return label

    def _has_person(self, image_id: str) -> bool:
        return has_person(self.layout.human_parts(image_id))

    def _select(self, split_ids: Sequence[str], positions: list[int]) -> list[int]:
        parts_only = self.tasks == ("human_parts",)
        if self.human_parts_selection == "correct" or "human_parts" not in self.tasks:
            return [i for i in positions if self._has_person(split_ids[i])] if parts_only else positions
        # "public": the image at position k of the selection reads the flag of split image k.
        if len(positions) > len(split_ids):
            raise ValueError(
                f"human_parts_selection 'public' reads, for position k of the {len(positions)} indices, "
                f"the flag of split image k: the {self.split} split has only {len(split_ids)}; "
                "list each image once, or use human_parts_selection 'correct'"
            )
        flags = [self._has_person(split_ids[k]) for k in range(len(positions))]
        if parts_only:  # kept images read flag 1 at their new positions: their own labels
            return [i for i, flag in zip(positions, flags) if flag]
        self._parts_ignored = [not flag for flag in flags]
        return positions

    def _raw(self, index: int) -> Sample:
        sample = super()._raw(index)
        if self._parts_ignored and self._parts_ignored[index]:
            sample = {**sample, "human_parts": np.full_like(sample["human_parts"], IGNORE)}
        return sample

    def _meta_files(self) -> list[Path]:
        if "normals" in self.tasks:
            return [self.layout.json("nyu_classes"), self.layout.json("context_classes")]
        return []

    def _files(self, image_id: str) -> Iterator[tuple[str, tuple[Path, ...]]]:
        layout = self.layout
        yield "image", (layout.image(image_id),)
        if "semseg" in self.tasks:
            yield "semseg label", layout.semseg_candidates(image_id)
        if "human_parts" in self.tasks:
            yield "human_parts label", (layout.human_parts(image_id),)
        if "sal" in self.tasks:
            yield "sal label", (layout.sal(image_id),)
        if "normals" in self.tasks:
            yield "normals label", (layout.normals(image_id),)
        if "normals" in self.tasks or "edge" in self.tasks:
            yield "LabelMap (for edge / normals)", (layout.label_map(image_id),)

    def edge_label(self, label_map: np.ndarray) -> np.ndarray:
        """The edge label of this split from a LabelMap, {0, 1} float32 (see the class docstring)."""
        if self.split == "val":
            return seg2bmap(label_map).astype(np.float32)
        return label_boundaries(label_map)

    def _load(self, image_id: str) -> Sample:
        layout = self.layout
        image = read_image(layout.image(image_id))
        shape = image.shape[:2]
        sample: Sample = {"image": image}
        label_map = None
        if "normals" in self.tasks or "edge" in self.tasks:
            label_map = read_label_map(layout.label_map(image_id))
        if "semseg" in self.tasks:
            sample["semseg"] = self.semseg_label(image_id).astype(np.float32)
        if "human_parts" in self.tasks:
            path = layout.human_parts(image_id)
            sample["human_parts"] = human_parts_label(read_part_annotations(path), shape, path)
        if "sal" in self.tasks:
            sample["sal"] = (read_grey_label(layout.sal(image_id)) / 255.0 > 0.5).astype(np.float32)
        if "normals" in self.tasks:
            normals = read_normals(layout.normals(image_id))
            # The public code writes 0 here and turns zero-length normals into 255 later
            # (AddIgnoreRegions); we mark them 255 at once: 255 = ignore everywhere.
            normals[~np.isin(label_map, self.normals_classes)] = IGNORE
            sample["normals"] = normals
        if "edge" in self.tasks:
            sample["edge"] = self.edge_label(label_map)
        self._check_label_shapes(image_id, sample)
        return sample


DATASETS.add(
    PascalContext.name,
    DatasetSpec(
        name=PascalContext.name,
        dataset_class=PascalContext,
        tasks=PascalContext.tasks_available,
        train_size=(512, 512),
        root_folder="PASCALContext",
    ),
)
