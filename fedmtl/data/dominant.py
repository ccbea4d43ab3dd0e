"""Each training image's dominant class: the semantic class covering most of its pixels,
background and ignored pixels (255) aside. Label-skewed partitions split by it, and
results.json counts each client's images by it (``class_histogram``).

The background is the dataset's ``semseg_background``: PASCAL-Context's class 0; NYUD-v2 has
none (its png's 0 is "unlabelled", read as 255), so there every NYU-40 class counts, and wall
or floor is the dominant class of most images. An image without any such pixel has the
dominant class :data:`~fedmtl.data.partition.NO_FOREGROUND`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedmtl.data.datasets import DATASETS, dataset_root
from fedmtl.data.partition import NO_FOREGROUND
from fedmtl.data.transforms import IGNORE

#: The histogram key of the images without foreground.
NO_FOREGROUND_KEY = "(no foreground)"

# (dataset, dataset folder, split file mtime and size) -> dominant classes: once per process.
_CACHE: dict[tuple[str, str, int, int], np.ndarray] = {}


def dominant_class(label: np.ndarray, background: int | None) -> int:
    """The most frequent value of an integer label map other than ``background`` and 255
    (ties: the lowest), or :data:`NO_FOREGROUND` when there is none."""
    values = (
        label[label != IGNORE] if background is None else label[(label != IGNORE) & (label != background)]
    )
    if values.size == 0:
        return NO_FOREGROUND
    return int(np.bincount(values.ravel()).argmax())


def dominant_classes(dataset: str, root: str | Path) -> np.ndarray:
    """The dominant class of every image of ``dataset``'s training split under the data root
    ``root``, in split order. Only the semseg pngs are decoded; computed once per process (and
    again only if the split file changes). A missing label file raises FileNotFoundError
    naming it."""
    spec = DATASETS.get(dataset)
    folder = dataset_root(spec, root)
    split_file = spec.split_file(root, "train")
    stat = split_file.stat()
    key = (dataset, str(folder.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _CACHE:
        data = spec.dataset_class(folder, split="train", tasks=("semseg",))  # checks the files exist
        background = spec.dataset_class.semseg_background
        _CACHE[key] = np.array(
            [dominant_class(data.semseg_label(i), background) for i in data.ids], dtype=np.int64
        )
    return _CACHE[key]


def class_key(dataset: str, cls: int) -> str:
    """A dominant class as results.json names it: the class name, or the id if it has none."""
    if cls == NO_FOREGROUND:
        return NO_FOREGROUND_KEY
    names = DATASETS.get(dataset).dataset_class.semseg_classes
    return names[cls] if 0 <= cls < len(names) else str(cls)


def class_histogram(dataset: str, classes: Iterable[int]) -> dict[str, int]:
    """Images per dominant class (class id order, no foreground last), classes with none left out."""
    counts = Counter(int(c) for c in classes)
    order = sorted(counts, key=lambda c: (c == NO_FOREGROUND, c))
    return {class_key(dataset, c): counts[c] for c in order}
