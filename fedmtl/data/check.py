"""``fedmtl data check``: does a data root hold PASCAL-Context / NYUD-v2 / Cityscapes as fedmtl reads them?

    fedmtl data check                          # the data root fedmtl fit reads ($FEDMTL_DATA, else ./data)
    fedmtl data check --root /data --dataset nyud

For every dataset (by default: those whose folder is in the root, or both when neither is), it
checks the split files, counts the images listed against the public release (a different
count is a note: a subset is usable), and reads every file each task needs for every listed
image through the readers the loaders use (:mod:`fedmtl.data.layout`,
:func:`~fedmtl.data.pascal_context.human_parts_label`): present, readable, and of its image's
size. A table goes to stdout, then the first problems of each dataset by file name.

What is read, so that 10k images take seconds rather than minutes: the size of every image
and png label from its header (PIL ``Image.open(...).size``); every png's chunks are walked
and their checksums verified (``Image.verify``, no decoding) and every JPEG is decoded at
1/8 scale (``draft``), which catches truncated files; ``.mat`` files are loaded whole (the
loaders need their content); ``.npy`` depth is memory-mapped and every value checked finite
(a NaN trains with loss nan; png labels decode to finite values). Cityscapes has no split
files: a split is the images found in ``leftImg8bit/<split>/``; its disparity pngs must be
16-bit.

:func:`check_command` prints the report and raises ``ValueError`` (one ``error:`` line from
the CLI, exit 1) when anything a loader needs is missing or unreadable, a label's size is
not its image's, or a depth label holds NaN/inf.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from fedmtl.data.cityscapes import Cityscapes
from fedmtl.data.datasets import DATASETS, folder_problem
from fedmtl.data.layout import (
    SPLITS,
    CityscapesLayout,
    DataFormError,
    NYUDLayout,
    PascalContextLayout,
    link_problem,
    read_disparity_png,
    read_grey_label,
    read_image,
    read_label_map,
    read_normals,
    read_part_annotations,
)
from fedmtl.data.nyud import NYUD
from fedmtl.data.pascal_context import PascalContext, human_parts_label

# Images per split of the public releases (docs/data.md, "The layouts").
PUBLIC_COUNTS = {
    "pascal_context": {"train": 4998, "val": 5105},
    "nyud": {"train": 795, "val": 654},
    "cityscapes": {"train": 2975, "val": 500},
}
SHOWN_PROBLEMS = 5  # per dataset
# Images per split whose labels are decoded (class values): every one up to this, a seeded
# sample of this many above it (about 4 ms a png on a slow core: 10k would take a minute).
CONTENT_SAMPLE = 1000
ARCHIVES = "the archives linked from the public FedHCA² README (innovator-zero/FedHCA2)"


def check_hint(root: str | Path) -> str:
    """The end of a missing-data error: how to check the root and where the data comes from."""
    return (
        f"check it with: fedmtl data check --root {root}; the public code's datasets are {ARCHIVES}, "
        f"which fedmtl data prepare ARCHIVE... --root {root} unpacks there"
    )


@dataclass(frozen=True)
class Problem:
    split: str  # "" for a file the dataset needs once (e.g. a class table)
    what: str  # "image", a task name, "split file", ...
    path: Path
    reason: str  # "missing", "unreadable (...)", "size 30x32, image 32x32"

    def __str__(self) -> str:
        where = f"{self.split} {self.what}" if self.split else self.what
        return f"{where}: {self.path}: {self.reason}"


@dataclass
class SplitReport:
    split: str
    listed: int | None  # ids in the split file; None: no split file
    public: int
    ok: dict[str, int] = field(default_factory=dict)  # "image" or task -> images whose files are fine
    content: int = 0  # images whose labels were decoded (class values), of the ids listed
    sampled: bool = False  # whether those are a sample (fewer than the ids listed)
    bad: dict[str, int] = field(default_factory=dict)  # "image" or task -> images with a problem


@dataclass
class DatasetReport:
    name: str
    title: str
    folder: Path
    columns: tuple[str, ...]  # "image" and the tasks
    splits: list[SplitReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Bad(Exception):
    """One file's problem: its path and the reason (missing / unreadable / wrong size)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(path, reason)
        self.path, self.reason = path, reason


def _unreadable(path: Path, err: BaseException) -> _Bad:
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return _Bad(path, f"unreadable ({type(err).__name__}{': ' + detail if detail else ''})")


def _read(path: Path, reader: Callable[[Path], object]):
    if not path.is_file():
        raise _Bad(path, link_problem(path) or "missing")
    try:
        return reader(path)
    except _Bad:
        raise
    except DataFormError as err:  # opens, but in a form the loader would read wrong
        raise _Bad(err.path or path, err.reason) from None
    except Exception as err:  # noqa: BLE001 - whatever PIL / scipy / numpy raise: the file is bad
        raise _unreadable(path, err) from None


def _picture(path: Path) -> tuple[int, int, str]:
    """(height, width, mode) of a png / jpeg from its header; the file is walked (png checksums)
    or decoded at 1/8 scale (jpeg), so a truncated or corrupt file is caught without a full decode."""
    with Image.open(path) as im:
        width, height = im.size
        mode = im.mode
        if im.format == "JPEG":
            im.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            im.load()
        else:
            im.verify()
    return height, width, mode


# The modes the releases store, read right without decoding; a file of another mode (a label
# re-saved as RGB, a 16-bit image) is read through the loader's reader, which reads it right
# or refuses it (fedmtl.data.layout, "reading pictures").
_NATIVE = {
    "image": ("RGB", "L"),
    "class": ("L", "P"),
    "grey": ("L",),
    "normals": ("RGB",),
    "disparity": ("I;16", "I;16B", "I;16L", "I;16N"),
}


def _png(
    path: Path,
    image: tuple[int, int] | None,
    kind: str,
    reader: Callable[[Path], object],
    content: bool = False,
) -> tuple[int, int]:
    """Check a png / jpeg of ``kind`` (a key of ``_NATIVE``): readable, of its image's size, and
    read by ``reader`` (decoded) when ``content`` or its mode is not the release's."""
    height, width, mode = _read(path, _picture)
    _same_size(path, (height, width), image)
    if content or mode not in _NATIVE[kind]:
        _read(path, reader)
    return height, width


def _same_size(path: Path, shape: tuple[int, ...], image: tuple[int, int] | None) -> None:
    if image is not None and tuple(shape[:2]) != image:
        size = "x".join(map(str, shape[:2])) if len(shape) >= 2 else f"shape {tuple(shape)}"
        raise _Bad(path, f"size {size}, image {image[0]}x{image[1]}")


def _depth_shape(path: Path) -> tuple[int, ...]:
    depth = np.load(path, mmap_mode="r")
    shape = depth.shape
    if len(shape) < 2:
        raise _Bad(path, f"unreadable (depth of shape {shape}, expected [H, W])")
    if depth.dtype.kind == "f" and not np.isfinite(depth).all():  # trains with loss nan
        count = int((~np.isfinite(depth)).sum())
        raise _Bad(path, f"holds NaN/inf ({count:,} of {depth.size:,} values)")
    return shape


# A per-image check: (layout, image id, image size or None) -> task -> problem (None: fine).
ImageCheck = Callable[[object, str, "tuple[int, int] | None"], "dict[str, _Bad | None]"]


def _run(checks: dict[str, Callable[[], None]], tasks: Iterable[str] | None = None) -> dict[str, _Bad | None]:
    out: dict[str, _Bad | None] = {}
    for task, check in checks.items():
        if tasks is not None and task not in tasks:
            continue
        try:
            check()
            out[task] = None
        except _Bad as bad:
            out[task] = bad
    return out


def _pascal_checks(layout: PascalContextLayout, i: str, image: tuple[int, int] | None, content: bool) -> dict:
    label_map: dict[str, object] = {}

    def the_label_map() -> None:  # edge and normals need it: read once
        if "result" not in label_map:
            try:
                path = layout.label_map(i)
                _same_size(path, _read(path, read_label_map).shape, image)
                label_map["result"] = None
            except _Bad as bad:
                label_map["result"] = bad
        if label_map["result"] is not None:
            raise label_map["result"]

    def semseg() -> None:
        candidates = layout.semseg_candidates(i)
        path = next((p for p in candidates if p.is_file()), candidates[0])
        _png(path, image, "class", PascalContext.read_semseg, content)

    def human_parts() -> None:
        path = layout.human_parts(i)
        objects = _read(path, read_part_annotations)
        for obj in objects:
            _same_size(path, obj.mask.shape, image)
        if image is not None:
            _read(path, lambda p: human_parts_label(objects, image, p))  # unknown part names

    def normals() -> None:
        _png(layout.normals(i), image, "normals", read_normals)
        the_label_map()

    return {
        "semseg": semseg,
        "human_parts": human_parts,
        "sal": lambda: _png(layout.sal(i), image, "grey", read_grey_label),
        "normals": normals,
        "edge": the_label_map,
    }


def _pascal_meta(layout: PascalContextLayout) -> list[tuple[str, _Bad]]:
    """The class tables the normals loader reads once."""
    problems = []
    for name in ("nyu_classes", "context_classes"):
        try:
            _read(layout.json(name), lambda p: json.loads(p.read_text()))
        except _Bad as bad:
            problems.append(("normals", bad))
    return problems


def _nyud_checks(layout: NYUDLayout, i: str, image: tuple[int, int] | None, content: bool) -> dict:
    def depth() -> None:
        path = layout.depth(i)
        _same_size(path, _read(path, _depth_shape), image)

    return {
        "semseg": lambda: _png(layout.semseg(i), image, "class", NYUD.read_semseg, content),
        "normals": lambda: _png(layout.normals(i), image, "normals", read_normals),
        "edge": lambda: _png(layout.edge(i), image, "grey", read_grey_label),
        "depth": depth,
    }


@dataclass(frozen=True)
class _CityscapesSplit:
    """A Cityscapes layout bound to one split: its files named by image id alone."""

    layout: CityscapesLayout
    split: str

    def image(self, i: str) -> Path:
        return self.layout.image(self.split, i)

    def semseg(self, i: str) -> Path:
        return self.layout.semseg(self.split, i)

    def disparity(self, i: str) -> Path:
        return self.layout.disparity(self.split, i)


def _cityscapes_checks(
    layout: _CityscapesSplit, i: str, image: tuple[int, int] | None, content: bool
) -> dict:
    return {
        "semseg": lambda: _png(layout.semseg(i), image, "class", Cityscapes.read_semseg, content),
        "depth": lambda: _png(layout.disparity(i), image, "disparity", read_disparity_png, content),
    }


@dataclass(frozen=True)
class _Checker:
    layout_class: type
    image_checks: Callable
    meta_checks: Callable = lambda layout: []
    bind: Callable = lambda layout, split: layout  # the layout whose paths take an id alone


_CHECKERS = {
    "pascal_context": _Checker(PascalContextLayout, _pascal_checks, _pascal_meta),
    "nyud": _Checker(NYUDLayout, _nyud_checks),
    "cityscapes": _Checker(CityscapesLayout, _cityscapes_checks, bind=_CityscapesSplit),
}


def _check_image(
    layout, checker: _Checker, i: str, content: bool = False, tasks: Iterable[str] | None = None
) -> tuple[_Bad | None, dict[str, _Bad | None]]:
    try:
        size = _png(layout.image(i), None, "image", read_image)
        image_problem = None
    except _Bad as bad:
        size, image_problem = None, bad
    return image_problem, _run(checker.image_checks(layout, i, size, content), tasks)


def sample_ids(ids: Sequence[str], sample: int | None, seed: int = 0) -> set[str]:
    """The ids whose labels are decoded: all when ``sample`` is None or 0 or they are as few,
    else a sample of ``sample`` drawn with ``seed`` (the same ids every run)."""
    unique = sorted(set(ids))
    if not sample or len(unique) <= sample:
        return set(unique)
    return {unique[k] for k in np.random.default_rng(seed).choice(len(unique), sample, replace=False)}


def dataset_folder(name: str, root: Path) -> Path:
    """The folder of dataset ``name`` in ``root``, or ``root`` itself when it is that folder."""
    folder = DATASETS.get(name).root_folder
    return root if root.name == folder and not (root / folder).is_dir() else root / folder


def found_datasets(root: Path) -> list[str]:
    """The datasets whose folder is in ``root`` (or that ``root`` is); a folder that is a
    broken link or a link loop counts (then it is named, not skipped)."""
    return [
        name
        for name in DATASETS.names()
        if dataset_folder(name, root).is_dir() or folder_problem(DATASETS.get(name), root)
    ]


def check_dataset(
    name: str,
    root: str | Path,
    progress: bool = False,
    workers: int | None = None,
    sample: int | None = CONTENT_SAMPLE,
) -> DatasetReport:
    """Check dataset ``name`` in the data root ``root`` (or ``root`` is its folder); the labels
    of ``sample`` images per split (seeded; None or 0: all) are decoded and their values checked."""
    spec = DATASETS.get(name)
    checker = _CHECKERS[name]
    folder = dataset_folder(name, Path(root))
    report = DatasetReport(name, spec.dataset_class.title, folder, ("image", *spec.tasks))
    if not folder.is_dir():
        reason = link_problem(folder) or "missing"
        report.problems.append(Problem("", "dataset folder", folder, reason))
        return report
    layout = checker.layout_class(folder)
    for what, bad in checker.meta_checks(layout):
        report.problems.append(Problem("", what, bad.path, bad.reason))
    workers = max(1, min(8, os.cpu_count() or 1)) if workers is None else max(1, workers)
    kind = layout.split_kind  # "split file", or Cityscapes' "image folder"
    for split in SPLITS:
        split_file = layout.split_file(split)
        row = SplitReport(split, None, PUBLIC_COUNTS[name][split])
        report.splits.append(row)
        if not layout.has_split(split):
            report.problems.append(Problem(split, kind, split_file, "missing"))
            continue
        try:
            ids = layout.split_ids(split)
        except (OSError, UnicodeDecodeError) as err:
            bad = _unreadable(split_file, err)
            report.problems.append(Problem(split, kind, split_file, bad.reason))
            continue
        row.listed = len(ids)
        if not ids:
            empty = "lists no image" if kind == "split file" else "holds no <city>/*_leftImg8bit.png image"
            report.problems.append(Problem(split, kind, split_file, empty))
        if len(set(ids)) != len(ids):
            report.notes.append(f"{split}: {len(ids) - len(set(ids))} ids are listed more than once")
        if len(ids) != row.public:
            report.notes.append(
                f"{split}: {len(ids):,} images listed, the public release has {row.public:,} "
                "(a subset is usable: fedmtl reads the images listed)"
            )
        row.ok = dict.fromkeys(report.columns, 0)
        row.bad = dict.fromkeys(report.columns, 0)
        seen: set[Path] = set()  # a file two tasks need (the LabelMap) is listed once
        decoded = sample_ids(ids, sample, seed=SPLITS.index(split))
        bound = checker.bind(layout, split)
        row.content, row.sampled = len(decoded), len(decoded) < len(set(ids))
        pool = ThreadPoolExecutor(workers)
        try:
            bar = tqdm(total=len(ids), desc=f"check {name} {split}", unit="img", disable=not progress)
            checks = pool.map(lambda i, d=decoded, b=bound: _check_image(b, checker, i, i in d), ids)
            for image_problem, tasks in checks:
                bar.update()
                for what, bad in (("image", image_problem), *tasks.items()):
                    if bad is None:
                        row.ok[what] += 1
                        continue
                    row.bad[what] += 1
                    if bad.path not in seen:
                        seen.add(bad.path)
                        report.problems.append(Problem(split, what, bad.path, bad.reason))
            bar.close()
        finally:  # on Ctrl-C, the images not read yet are dropped rather than waited for
            pool.shutdown(cancel_futures=True)
    return report


def check_data(
    root: str | Path,
    datasets: Sequence[str] | None = None,
    progress: bool = False,
    workers: int | None = None,
    sample: int | None = CONTENT_SAMPLE,
) -> list[DatasetReport]:
    """Check ``datasets`` (default: those found in ``root``, or all when none is)."""
    root = Path(root)
    if datasets is None:
        datasets = found_datasets(root) or DATASETS.names()
    return [check_dataset(name, root, progress, workers, sample) for name in datasets]


def check_sample(
    name: str, root: str | Path, tasks: Iterable[str], ids_by_split: dict[str, Sequence[str]], sample: int
) -> list[Problem]:
    """``fit``'s content check: the files of ``tasks`` of a seeded sample of ``sample`` images
    of each split (out of ``ids_by_split``), decoded as the loaders read them; the problems."""
    checker = _CHECKERS[name]
    layout = checker.layout_class(dataset_folder(name, Path(root)))
    tasks = tuple(tasks)
    problems = []
    for split, ids in ids_by_split.items():
        bound = checker.bind(layout, split)
        for i in sorted(sample_ids(ids, sample, seed=SPLITS.index(split))):
            image_problem, by_task = _check_image(bound, checker, i, content=True, tasks=tasks)
            for what, bad in (("image", image_problem), *by_task.items()):
                if bad is not None:
                    problems.append(Problem(split, what, bad.path, bad.reason))
    return problems


# --------------------------------------------------------------------------- report


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _cell(row: SplitReport, column: str) -> str:
    if row.listed is None:
        return "-"
    ok, bad = row.ok.get(column, 0), row.bad.get(column, 0)
    return f"{ok:,} ok / {bad:,} bad" if bad else f"{ok:,} ok"


def _content_line(splits: Sequence[SplitReport]) -> str:
    """How many images' labels were decoded (class values, forms), per split."""
    read = [s for s in splits if s.listed]
    if not any(s.sampled for s in read):
        return "content: every image's labels decoded (class values, forms)"
    parts = [f"{s.split} {s.content:,} of {s.listed:,}" for s in read]
    return (
        f"content: the labels of {', '.join(parts)} images decoded (class values, forms), a seeded "
        "sample (--sample 0 decodes every one); every file's header (mode, size) is read"
    )


def format_report(reports: Iterable[DatasetReport]) -> str:
    """One table per dataset (split, images listed / public, per column: ok / bad), its notes
    and its first problems by file name."""
    blocks = []
    for r in reports:
        lines = [f"{r.title} ({r.name}) in {r.folder}"]
        if r.splits:
            rows = [["dataset", "split", "images (listed / public)", *r.columns]]
            for s in r.splits:
                listed = "no split file" if s.listed is None else f"{s.listed:,}"
                rows.append([r.name, s.split, f"{listed} / {s.public:,}", *(_cell(s, c) for c in r.columns)])
            lines += _table(rows)
            lines.append(_content_line(r.splits))
        lines += [f"note: {note}" for note in r.notes]
        if r.problems:
            lines.append(f"problems ({len(r.problems):,}):")
            lines += [f"  {p}" for p in r.problems[:SHOWN_PROBLEMS]]
            if len(r.problems) > SHOWN_PROBLEMS:
                lines.append(f"  ... and {len(r.problems) - SHOWN_PROBLEMS:,} more")
        else:
            lines.append("ok: every file the loaders read is present, readable and of its image's size")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def raise_on_problems(
    reports: Sequence[DatasetReport], root: str | Path, doing: str = "data check found"
) -> None:
    """One ValueError summing up the problems of ``reports`` (listed above it), if any."""
    bad = [r for r in reports if r.problems]
    if not bad:
        return
    count = sum(len(r.problems) for r in bad)
    where = ", ".join(f"{r.title} {len(r.problems):,}" for r in bad)
    first = bad[0].problems[0]
    raise ValueError(
        f"{doing} {count:,} problem(s) in {root} ({where}; listed above), first: {first}. Replace the "
        f"missing or broken files (unpack {ARCHIVES} with: fedmtl data prepare ARCHIVE... --root {root}), "
        "or remove their ids from the split files"
    )


def check_command(
    root: str | Path | None, dataset: str | None, progress: bool, sample: int | None = CONTENT_SAMPLE
) -> None:
    """``fedmtl data check``: print the report; ValueError when a loader would fail."""
    if root is None:
        from fedmtl.config import DataConfig

        root = DataConfig().resolved_root()
    if dataset is not None and dataset not in DATASETS:
        raise ValueError(f"--dataset: unknown dataset {dataset!r}; known: {', '.join(DATASETS.names())}")
    if sample is not None and sample < 0:
        raise ValueError(
            f"--sample {sample}: must be >= 0 (images per split whose labels are decoded; 0: all)"
        )
    if (problem := link_problem(Path(root))) is not None:
        raise FileNotFoundError(f"data root {root} is {problem}")
    if not Path(root).is_dir():
        raise FileNotFoundError(
            f"data root {root} not found: --root (or $FEDMTL_DATA) must be the folder holding PASCALContext/ "
            f"and NYUDv2/; to get them: unpack {ARCHIVES} with: fedmtl data prepare ARCHIVE... --root {root}"
        )
    reports = check_data(root, None if dataset is None else [dataset], progress=progress, sample=sample)
    print(format_report(reports))
    raise_on_problems(reports, root)
