"""Datasets of the HC-FMTL benchmark: one registry of specs and one factory.

Example::

    train = build_dataset("nyud", "data", "train", tasks=("semseg", "depth"), indices=client_part)
    val = build_dataset("nyud", "data", "val", tasks=("semseg", "depth"))

``root`` is a data directory that holds ``PASCALContext/`` / ``NYUDv2/``, or the dataset
folder itself (what ``fedmtl data synth --root`` writes). Training samples are augmented by
default, validation samples only padded; see :mod:`fedmtl.data.transforms`.

A training loop calls ``dataset.set_epoch(e)`` every epoch, or every epoch repeats the same
augmentations. The random state of a sample depends only on (dataset seed, epoch, the
sample's index in its split), so runs reproduce whatever the number of loader workers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedmtl.data.cache import SampleCache
from fedmtl.data.layout import SPLITS, DataFormError, link_problem
from fedmtl.data.transforms import (
    PAPER_SCALE_RANGE,
    Sample,
    Transform,
    as_size,
    eval_transforms,
    train_transforms,
)
from fedmtl.files import describe_write_error, os_failure, os_fix
from fedmtl.registry import Registry
from fedmtl.tasks import TASKS


def check_tasks(dataset: str, tasks: Sequence[str] | None, available: Sequence[str]) -> tuple[str, ...]:
    """Validate a task selection against a dataset's tasks; ``None`` means all of them."""
    if tasks is None:
        return tuple(available)
    if isinstance(tasks, str):
        tasks = (tasks,)
    tasks = tuple(tasks)
    if not tasks:
        raise ValueError(f"no task requested for {dataset}; its tasks: {', '.join(available)}")
    for task in tasks:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; {dataset} has the tasks: {', '.join(available)}")
        if task not in available:
            raise ValueError(f"{dataset} has no task {task!r}; its tasks: {', '.join(available)}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"task listed twice in {tasks}")
    return tasks


def one_line(tree: str) -> str:
    """A dataset's layout tree on one line, for an error message."""
    top, *entries = (line.strip() for line in tree.splitlines() if line.strip())
    return f"{top} holding {', '.join(entries)}"


class DenseDataset(torch.utils.data.Dataset):
    """Common machinery of the dense-prediction datasets: split, subset, file checks, RNG.

    A subclass sets the class attributes, ``_files`` (the files one image needs for the
    requested tasks) and ``_load`` (the raw sample, before transforms).
    """

    name: ClassVar[str]  # registry name, e.g. "nyud"
    title: ClassVar[str]  # for messages, e.g. "NYUD-v2"
    tasks_available: ClassVar[tuple[str, ...]]
    tree: ClassVar[str]  # expected layout, printed when something is missing
    layout_class: ClassVar[type]  # fedmtl.data.layout class: file names of the dataset
    semseg_classes: ClassVar[tuple[str, ...]]  # class names by semseg label value
    semseg_background: ClassVar[int | None]  # the semseg label of the background; None: none

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        tasks: Sequence[str] | None = None,
        transform: Transform | None = None,
        indices: Sequence[int] | None = None,
        seed: int = 0,
        cache: SampleCache | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        self.root = Path(root)
        self.split = split
        self.tasks = check_tasks(self.name, tasks, self.tasks_available)
        self.transform = transform
        self.seed = seed
        self.epoch = 0
        self.cache = cache
        if not self.root.is_dir():
            raise self.missing(f"{self.title} root directory", self.root)
        self.layout = self.layout_class(self.root)
        if not self.layout.has_split(split):
            raise self.missing(
                f"{self.title} {split} {self.layout.split_kind}", self.layout.split_file(split)
            )
        split_ids = self.layout.split_ids(split)
        self._check_files(split_ids)
        self._split_ids = split_ids
        self._prepare()
        self._use(range(len(split_ids)) if indices is None else indices)

    def _use(self, indices: Sequence[int]) -> None:
        positions = [int(i) for i in indices]
        bad = [i for i in positions if not 0 <= i < len(self._split_ids)]
        if bad:
            raise IndexError(
                f"indices {bad[:5]} out of range for the {len(self._split_ids)} {self.split} images of {self.name}"
            )
        positions = self._select(self._split_ids, positions)
        self.split_indices = positions  # index in the split file, of every sample
        self.ids = [self._split_ids[i] for i in positions]

    def subset(self, indices: Sequence[int], seed: int) -> DenseDataset:
        """This dataset on the split positions ``indices`` with augmentation seed ``seed``: what
        building it with those arguments gives, without reading the split and checking every
        file of it again (a thousand clients of one dataset share that work)."""
        out = copy.copy(self)
        out.seed, out.epoch = seed, 0
        out._use(indices)
        return out

    # --- subclass hooks

    def _prepare(self) -> None:
        """Read what the requested tasks need once, after the files were checked."""

    def _select(self, split_ids: Sequence[str], positions: list[int]) -> list[int]:
        """The positions in the split of the images used, in order, given the selection
        ``positions`` (``indices``, or the whole split): all of them by default."""
        return positions

    def _meta_files(self) -> list[Path]:
        """Files needed once (not per image) for the requested tasks."""
        return []

    def _files(self, image_id: str) -> Iterator[tuple[str, tuple[Path, ...]]]:
        """Per required file: what it is ("image", "sal label") and the paths it may be found
        at (the first existing one is used)."""
        raise NotImplementedError

    def _load(self, image_id: str) -> Sample:
        raise NotImplementedError

    def semseg_label(self, image_id: str) -> np.ndarray:
        """The semseg label of an image as integers (255 = ignore): its png alone, decoded."""
        raise NotImplementedError

    @staticmethod
    def read_semseg(path: Path) -> np.ndarray:
        """A semseg png as the integer labels ``semseg_label`` gives, its class values checked."""
        raise NotImplementedError

    @classmethod
    def keeps_subset(cls, tasks: Sequence[str]) -> bool:
        """Whether a dataset of ``tasks`` may keep fewer images than its ``indices`` (then
        ``len`` of it, not of the indices, is what a client trains on)."""
        return False

    # --- errors and checks

    def missing(self, what: str, path: Path, more: str = "") -> FileNotFoundError:
        return FileNotFoundError(
            f"{what} not found: {path}{more}. To write a small synthetic dataset in this layout: "
            f"fedmtl data synth --dataset {self.name} --root {self._dataset_folder()} "
            f"(expected layout: {one_line(self.tree)})"
        )

    def _dataset_folder(self) -> Path:
        """The dataset folder itself (``root`` may be the data directory that lacks it)."""
        folder = DATASETS.get(self.name).root_folder
        return self.root if self.root.name == folder else self.root / folder

    def _check_files(self, ids: Sequence[str]) -> None:
        for path in self._meta_files():
            if not path.is_file():
                raise self.missing(f"{self.title} metadata file", path)
        missing = [
            (what, candidates[0])
            for i in ids
            for what, candidates in self._files(i)
            if not any(p.is_file() for p in candidates)
        ]
        if missing:
            what, path = missing[0]
            more = f" (and {len(missing) - 1} more missing files)" if len(missing) > 1 else ""
            problem = link_problem(path)
            if problem:  # there, but a link that leads nowhere: "not found" would send the user looking
                raise FileNotFoundError(f"{self.title} {self.split} {what} {path} is {problem}{more}")
            raise self.missing(f"{self.title} {self.split} {what}", path, more)

    # --- Dataset protocol

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentations of epoch ``epoch`` (like DistributedSampler.set_epoch)."""
        self.epoch = int(epoch)

    def rng(self, index: int) -> np.random.Generator:
        """Random state of sample ``index``: depends on (seed, epoch, its index in the split) only."""
        return np.random.default_rng((self.seed, self.epoch, self.split_indices[index]))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> Sample:
        image_id = self.ids[index]
        sample = self._raw(index)
        height, width = sample["image"].shape[:2]
        if self.transform is not None:
            sample = self.transform(sample, self.rng(index))
        sample["meta"] = {"id": image_id, "index": self.split_indices[index], "size": (height, width)}
        return sample

    def _check_label_shapes(self, image_id: str, sample: Sample) -> None:
        """Every requested label has the image's height and width (called by ``_load``)."""
        shape = sample["image"].shape[:2]
        for task in self.tasks:
            if sample[task].shape[:2] != shape:
                raise ValueError(f"{task} label of {image_id} is {sample[task].shape[:2]}, image is {shape}")

    def _raw(self, index: int) -> Sample:
        """Sample ``index`` before transforms: its decoded files (a subclass may change labels
        by position; the cached sample itself is never modified)."""
        return self._read(self.ids[index])

    def _read(self, image_id: str) -> Sample:
        """The decoded sample, from the cache when it holds it (then kept there if it fits)."""
        key = (self.name, str(self.root), self.split, self.tasks, image_id)
        if self.cache is not None and (sample := self.cache.get(key)) is not None:
            return sample
        try:
            sample = self._load(image_id)
        except (
            DataFormError
        ) as err:  # names the file and the fix already (e.g. a file changed after the check)
            raise DataFormError(
                f"{self.title} {self.split} image {image_id!r}: {err}", err.path, err.reason
            ) from err
        except (OSError, ValueError, KeyError, IndexError) as err:  # PIL, scipy.io, numpy
            if (failure := os_failure(err)) is not None:
                # The system's refusal (permissions, an open-file limit), not a corrupt file. A
                # ValueError keeps its words through a DataLoader worker, which drops an errno.
                raise ValueError(
                    f"{self.title} {self.split} image {image_id!r}: {describe_write_error(failure)}; "
                    f"{os_fix(failure)}, then run the command again"
                ) from err
            files = [next((p for p in paths if p.is_file()), paths[0]) for _, paths in self._files(image_id)]
            raise ValueError(
                f"{self.title} {self.split} image {image_id!r} cannot be read ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); its files: {', '.join(map(str, files))}. "
                "Replace the corrupt file, or remove the id from the split file"
            ) from err
        self._check_finite(image_id, sample)
        if self.cache is not None:
            self.cache.put(key, sample)
        return sample

    def _check_finite(self, image_id: str, sample: Sample) -> None:
        """A NaN/inf in a label (a float ``.npy`` depth map) would train with loss nan: refused,
        naming the file. A png decodes to finite values; a ``.npy`` need not."""
        for key, value in sample.items():
            if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or np.isfinite(value).all():
                continue
            files = {
                what: next((p for p in paths if p.is_file()), paths[0])
                for what, paths in self._files(image_id)
            }
            what = key if key in files else f"{key} label"
            path = files.get(what) or ", ".join(map(str, files.values()))
            count = int((~np.isfinite(value)).sum())
            raise ValueError(
                f"{self.title} {self.split} {what} of image {image_id!r} holds NaN/inf ({count:,} of "
                f"{value.size:,} values): {path}. Replace the file, or remove the id from the split file"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={str(self.root)!r}, split={self.split!r}, tasks={self.tasks}, n={len(self)})"


@dataclass(frozen=True)
class DatasetSpec:
    """What the rest of fedmtl needs to know about a dataset, besides its files."""

    name: str
    dataset_class: type[DenseDataset]
    tasks: tuple[str, ...]
    train_size: tuple[int, int]  # paper's training crop (and evaluation padding), (H, W)
    root_folder: str  # folder name under the data directory
    depth_unit: str = "metres"  # of the depth label: "metres" or "disparity" (pixels)
    resize: bool = False  # every image resized to train_size before the transforms (Cityscapes)

    def split_file(self, root: str | Path, split: str) -> Path:
        """Where the split's image list comes from under a data directory (or the dataset
        folder): a split file, or (Cityscapes) the folder whose images make the split."""
        return self.dataset_class.layout_class(dataset_root(self, root)).split_file(split)

    def has_split(self, root: str | Path, split: str) -> bool:
        return self.dataset_class.layout_class(dataset_root(self, root)).has_split(split)

    def split_ids(self, root: str | Path, split: str) -> list[str]:
        """The image ids of a split, in order."""
        return self.dataset_class.layout_class(dataset_root(self, root)).split_ids(split)


DATASETS = Registry[DatasetSpec]("dataset")


def folder_problem(spec: DatasetSpec, root: str | Path) -> str | None:
    """What is wrong with the dataset folder under the data root ``root`` when it is a symbolic
    link that leads nowhere (broken, or a loop): one line naming it; None otherwise."""
    folder = Path(root) / spec.root_folder
    problem = link_problem(folder)
    return f"{spec.name} dataset folder {folder} is {problem}" if problem else None


def dataset_root(spec: DatasetSpec, root: str | Path) -> Path:
    """``root`` is a data directory holding ``spec.root_folder``, or the dataset folder itself."""
    root = Path(root)
    return root / spec.root_folder if (root / spec.root_folder).is_dir() else root


def build_dataset(
    name: str,
    root: str | Path,
    split: str = "train",
    tasks: Sequence[str] | None = None,
    train_size: int | Sequence[int] | None = None,
    augment: bool | None = None,
    indices: Sequence[int] | None = None,
    seed: int = 0,
    scale_range: Sequence[float] = PAPER_SCALE_RANGE,
    cache: SampleCache | None = None,
    human_parts_selection: str | None = None,
) -> DenseDataset:
    """A dataset with the transforms of the public code.

    train_size: training crop and evaluation padding, (H, W) or an int; default the paper's
        (PASCAL-Context 512x512, NYUD-v2 448x576; the public code uses the same for both).
    augment: training augmentation (default: for the train split only); otherwise the
        evaluation transform (normalise and pad to ``train_size``).
    indices: a subset of the split, e.g. one client's partition.
    seed: augmentation seed (per sample and epoch, see ``DenseDataset.rng``).
    scale_range: [min, max] of the training augmentation's random rescaling (the public code's
        0.5-2.0 by default; depth is divided by the factor).
    cache: where decoded samples are kept between epochs (:mod:`fedmtl.data.cache`); None:
        every sample is read from disk each time.
    human_parts_selection: which images a human_parts dataset keeps and labels, "correct" or
        "public" (:mod:`fedmtl.data.pascal_context`); None: the dataset's default ("correct").
        Passed only to a dataset that has the human_parts task.
    """
    spec = DATASETS.get(name)
    size = as_size(train_size) if train_size is not None else spec.train_size
    if augment is None:
        augment = split == "train"
    transform = (
        train_transforms(size, scale_range, spec.depth_unit, spec.resize)
        if augment
        else eval_transforms(size, spec.depth_unit, spec.resize)
    )
    options = {}
    if human_parts_selection is not None and "human_parts" in spec.tasks:
        options["human_parts_selection"] = human_parts_selection
    return spec.dataset_class(
        dataset_root(spec, root),
        split=split,
        tasks=tasks,
        transform=transform,
        indices=indices,
        seed=seed,
        cache=cache,
        **options,
    )


# The concrete datasets subclass DenseDataset above and register their specs on import.
from fedmtl.data import cityscapes, nyud, pascal_context  # noqa: E402, F401
