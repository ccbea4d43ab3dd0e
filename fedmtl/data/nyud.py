"""NYUD-v2 for multi-task learning: semseg, normals, edge, depth.

Labels are read as the public FedHCA² loader reads them (``datasets/nyud.py``): semseg png
minus 1 with unlabelled (0) -> 255, 40 classes; normals png decoded to [-1, 1]; edge png / 255;
depth in metres from ``.npy`` (0 = no measurement, ignored by the transforms).

The edge label is ``edge/<id>.png`` in both splits. The public evaluation (innovator-zero/seism
``src/gt_wrappers/db_gt.m``, ``db_root_dir.m``) reads its ground truth elsewhere:
``groundTruth{1}.Boundaries`` of ``NYUDv2/edge_mat/<id>.mat``, passed through BSDS ``seg2bmap``
by ``edgesEvalImg``. ``edge_mat/`` is not part of the release layout read here (docs/data.md,
"The layouts"), so validation keeps the png, unlike PASCAL-Context, whose validation
edges are rebuilt from the LabelMap as SEISM does (:func:`fedmtl.data.pascal_context.seg2bmap`).
Whether the png equals those boundaries: not known.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fedmtl.data.classes import NYU_CLASSES
from fedmtl.data.datasets import DATASETS, DatasetSpec, DenseDataset
from fedmtl.data.layout import (
    NYUD_TREE,
    NYUDLayout,
    check_class_values,
    read_class_label,
    read_grey_label,
    read_image,
    read_normals,
)
from fedmtl.data.transforms import IGNORE, Sample


class NYUD(DenseDataset):
    name = "nyud"
    title = "NYUD-v2"
    tasks_available = ("semseg", "normals", "edge", "depth")
    tree = NYUD_TREE

    layout_class = NYUDLayout
    semseg_classes = NYU_CLASSES
    semseg_background = None  # every NYU-40 class is an object or a surface; 0 (unlabelled) is ignored

    def _files(self, image_id: str) -> Iterator[tuple[str, tuple[Path, ...]]]:
        layout = self.layout
        label_file = {
            "semseg": layout.semseg,
            "normals": layout.normals,
            "edge": layout.edge,
            "depth": layout.depth,
        }
        yield "image", (layout.image(image_id),)
        for task in self.tasks:
            yield f"{task} label", (label_file[task](image_id),)

    def semseg_label(self, image_id: str) -> np.ndarray:
        return self.read_semseg(self.layout.semseg(image_id))

    @staticmethod
    def read_semseg(path: Path) -> np.ndarray:
        """A semseg png as int64 labels (stored - 1, unlabelled 255); a stored value past the 40
        classes raises DataFormError naming the file."""
        stored = read_class_label(path)
        # A stored 255 would read as 254, past the classes: only 0 (unlabelled) and 1..40 are labels.
        allowed = f"0 (unlabelled) and 1-{len(NYU_CLASSES)} (NYUD-v2's {len(NYU_CLASSES)} classes stored as label + 1)"
        check_class_values(stored, path, len(NYU_CLASSES), None, allowed)
        semseg = stored - 1
        semseg[semseg == -1] = IGNORE
        return semseg

    def _load(self, image_id: str) -> Sample:
        layout = self.layout
        image = read_image(layout.image(image_id))
        sample: Sample = {"image": image}
        if "semseg" in self.tasks:
            sample["semseg"] = self.semseg_label(image_id).astype(np.float32)
        if "normals" in self.tasks:
            sample["normals"] = read_normals(layout.normals(image_id))
        if "edge" in self.tasks:
            sample["edge"] = read_grey_label(layout.edge(image_id)) / 255.0
        if "depth" in self.tasks:
            sample["depth"] = np.load(layout.depth(image_id)).astype(np.float32)
        self._check_label_shapes(image_id, sample)
        return sample


DATASETS.add(
    NYUD.name,
    DatasetSpec(
        name=NYUD.name,
        dataset_class=NYUD,
        tasks=NYUD.tasks_available,
        train_size=(448, 576),
        root_folder="NYUDv2",
    ),
)
