"""Cityscapes for multi-task learning: semseg (19 classes) and depth (disparity, pixels).

Read from the official release layout (:class:`fedmtl.data.layout.CityscapesLayout`); a split
is the sorted list of its ``leftImg8bit`` images. Labels:

- semseg: ``gtFine_labelIds.png`` through the official labelId -> trainId table, every other
  id 255 (ignored), as FMTL-Bench's ``datasets/cityscapes.py`` does.
- depth: ``disparity.png`` decoded to ``(d - 1) / 256`` pixels where d > 0; d = 0 (no stereo
  match) is 255, ignored. FMTL-Bench sets those pixels to -1 and the sky's to 0 (a valid
  target); fedmtl keeps the sky's measured disparity (docs/differences.md, "Cityscapes").

Every image is resized to the training size before the transforms (FMTL-Bench's 768x1536 for
the 1024x2048 release), the disparity multiplied by the width factor.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fedmtl.data.classes import CITYSCAPES_CLASSES
from fedmtl.data.datasets import DATASETS, DatasetSpec, DenseDataset
from fedmtl.data.layout import (
    CITYSCAPES_MAX_LABEL_ID,
    CITYSCAPES_TREE,
    CityscapesLayout,
    check_class_values,
    cityscapes_train_ids,
    decode_disparity,
    read_class_label,
    read_disparity_png,
    read_image,
)
from fedmtl.data.transforms import Sample

# The license plate's id -1, as an 8-bit png holds it.
LICENSE_PLATE_STORED = 255


class Cityscapes(DenseDataset):
    name = "cityscapes"
    title = "Cityscapes"
    tasks_available = ("semseg", "depth")
    tree = CITYSCAPES_TREE

    layout_class = CityscapesLayout
    semseg_classes = CITYSCAPES_CLASSES
    semseg_background = None  # void pixels are 255 (ignored); road, sky ... are all classes

    def _files(self, image_id: str) -> Iterator[tuple[str, tuple[Path, ...]]]:
        layout, split = self.layout, self.split
        yield "image", (layout.image(split, image_id),)
        if "semseg" in self.tasks:
            yield "semseg label", (layout.semseg(split, image_id),)
        if "depth" in self.tasks:
            yield "depth label", (layout.disparity(split, image_id),)

    def semseg_label(self, image_id: str) -> np.ndarray:
        return self.read_semseg(self.layout.semseg(self.split, image_id))

    @staticmethod
    def read_semseg(path: Path) -> np.ndarray:
        """A labelIds png as int64 train ids (0..18, 255 ignored); a stored value that is no
        label id (34..254) raises DataFormError naming the file."""
        stored = read_class_label(path)
        allowed = f"the official label ids 0-{CITYSCAPES_MAX_LABEL_ID} (and 255, the license plate's -1)"
        check_class_values(stored, path, CITYSCAPES_MAX_LABEL_ID, LICENSE_PLATE_STORED, allowed)
        return cityscapes_train_ids(stored)

    def _load(self, image_id: str) -> Sample:
        layout, split = self.layout, self.split
        image = read_image(layout.image(split, image_id))
        sample: Sample = {"image": image}
        if "semseg" in self.tasks:
            sample["semseg"] = self.semseg_label(image_id).astype(np.float32)
        if "depth" in self.tasks:
            sample["depth"] = decode_disparity(read_disparity_png(layout.disparity(split, image_id)))
        self._check_label_shapes(image_id, sample)
        return sample


DATASETS.add(
    Cityscapes.name,
    DatasetSpec(
        name=Cityscapes.name,
        dataset_class=Cityscapes,
        tasks=Cityscapes.tasks_available,
        train_size=(768, 1536),  # FMTL-Bench's TRAIN_SCALE / TEST_SCALE (datasets/utils/configs.py)
        root_folder="Cityscapes",
        depth_unit="disparity",
        resize=True,
    ),
)
