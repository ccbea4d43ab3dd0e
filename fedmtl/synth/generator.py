"""Synthetic datasets written in the real layouts: labels read off each rendered scene,
the files, and the staging that keeps a dataset folder absent or whole (overview: the package
docstring, :mod:`fedmtl.synth`)."""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fedmtl.config import render_scale_problem, render_size
from fedmtl.data import rootlock
from fedmtl.data.layout import (
    DISPARITY_IGNORE,
    SPLITS,
    CityscapesLayout,
    NYUDLayout,
    PartAnnotation,
    PascalContextLayout,
)
from fedmtl.registry import Registry
from fedmtl.synth.render import Rendering, Scene, render
from fedmtl.synth.resample import upscale
from fedmtl.synth.scenes import (
    CITYSCAPES_BASELINE,
    CITYSCAPES_IDS,
    CONTEXT_CLASSES,
    NYU_CLASSES,
    VOC_CLASSES,
    cityscapes_focal,
    nyud_scene,
    pascal_scene,
    street_scene,
)

IGNORE = 255
VOC_VOID_BAND = 0.5  # share of PASCAL images whose semseg has VOC's void band around objects
PASCAL_CONTEXT_SEMSEG = 0.15  # share of PASCAL semseg pngs written to the fallback folder
NYUD_UNLABELLED_EDGES = 0.3  # share of NYUD images whose object boundaries are left unlabelled


def boundaries(ids: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """Pixels with a 4-neighbour of another id (both sides of every boundary: 2 px thick);
    with ``where``, only boundaries that touch a pixel where ``where`` is true."""
    out = np.zeros(ids.shape, dtype=bool)
    for a, b in ((np.s_[:, :-1], np.s_[:, 1:]), (np.s_[:-1, :], np.s_[1:, :])):
        differ = ids[a] != ids[b]
        if where is not None:
            differ &= where[a] | where[b]
        out[a] |= differ
        out[b] |= differ
    return out


def _render(
    make_scene: Callable[[np.random.Generator, tuple[int, int]], Scene],
    rng: np.random.Generator,
    size: tuple[int, int],
    render_scale: float,
) -> tuple[Scene, Rendering]:
    """The scene drawn for the rendered size and its rendering scaled up to ``size``
    (:mod:`fedmtl.synth.resample`); with ``render_scale`` 1, rendered at ``size`` directly."""
    small = render_size(size, render_scale)
    scene = make_scene(rng, small)
    r = render(scene, rng)
    return scene, r if small == tuple(size) else upscale(r, size)


def _areas(rendering: Rendering, count: int) -> np.ndarray:
    return np.bincount(rendering.object_id.ravel() + 1, minlength=count + 1)[1:]


# --------------------------------------------------------------------------- PASCAL-Context


@dataclass(frozen=True)
class PascalSample:
    rendering: Rendering
    semseg: np.ndarray  # [H, W] uint8, VOC 0..20, 255 = void
    label_map: np.ndarray  # [H, W] context class ids (CONTEXT_CLASSES)
    parts: list[PartAnnotation]  # one per visible VOC object; people carry their parts
    sal: np.ndarray  # [H, W] uint8, 0 or 255
    semseg_dir: str  # "VOC12" or the fallback "pascal-context"


def pascal_sample(rng: np.random.Generator, size: tuple[int, int], render_scale: float = 1.0) -> PascalSample:
    scene, r = _render(pascal_scene, rng, size, render_scale)
    objects = scene.objects
    # object id -1 (the sky) indexes the last entry of these lookup tables
    voc = np.array([o.label for o in objects] + [0], dtype=np.uint8)
    context = np.array([CONTEXT_CLASSES.index(o.context) for o in objects] + [CONTEXT_CLASSES.index("sky")])
    semseg = voc[r.object_id]
    label_map = context[r.object_id].astype(np.uint16)
    if rng.random() < VOC_VOID_BAND:
        semseg[boundaries(r.object_id, where=semseg > 0)] = IGNORE

    areas = _areas(r, len(objects))
    things = [k for k, o in enumerate(objects) if o.label > 0 and areas[k] > 0]
    parts = []
    for k in things:
        mask = r.object_id == k
        person_parts = {}
        if objects[k].name == "person":
            for j, name in enumerate(r.part_names):
                if (part := mask & (r.part == j)).any():
                    person_parts[name] = part
        parts.append(PartAnnotation(objects[k].name, objects[k].label, mask, person_parts))

    # Salient: the nearest of the objects that are not tiny, those about as near, the largest.
    salient: set[int] = set()
    big = [k for k in things if areas[k] >= 0.005 * r.object_id.size]
    if big:
        distance = {k: float(np.median(r.depth[r.object_id == k])) for k in big}
        nearest = min(distance.values())
        salient = {k for k in big if distance[k] <= 1.5 * nearest} | {max(big, key=lambda k: areas[k])}
    sal = np.isin(r.object_id, sorted(salient)).astype(np.uint8) * 255

    semseg_dir = "pascal-context" if rng.random() < PASCAL_CONTEXT_SEMSEG else "VOC12"
    return PascalSample(r, semseg, label_map, parts, sal, semseg_dir)


def _pascal_id(split: str, index: int) -> str:
    """Like 2008_000123; train and val never share an id (even / odd numbers)."""
    return f"{2008 + index % 4}_{2 * (index // 4) + SPLITS.index(split):06d}"


def _pascal_part_json() -> dict[str, dict[str, int]]:
    """PASCAL-Part's category -> part -> id map; the loader's own 6-part map for people."""
    parts = {
        "aeroplane": "body stern lwing rwing tail engine wheel",
        "bicycle": "fwheel bwheel saddle handlebar chainwheel headlight",
        "bird": "head leye reye beak torso neck lwing rwing lleg lfoot rleg rfoot tail",
        "bottle": "cap body",
        "bus": "frontside leftside rightside backside roofside leftmirror rightmirror fliplate bliplate door wheel headlight window",
        "car": "frontside leftside rightside backside roofside leftmirror rightmirror fliplate bliplate door wheel headlight window",
        "cat": "head leye reye lear rear nose torso neck lfleg lfpa rfleg rfpa lbleg lbpa rbleg rbpa tail",
        "cow": "head leye reye lear rear muzzle lhorn rhorn torso neck lfuleg lflleg rfuleg rflleg lbuleg lblleg rbuleg rblleg tail",
        "dog": "head leye reye lear rear nose muzzle torso neck lfleg lfpa rfleg rfpa lbleg lbpa rbleg rbpa tail",
        "horse": "head leye reye lear rear muzzle lfho rfho lbho rbho torso neck lfuleg lflleg rfuleg rflleg lbuleg lblleg rbuleg rblleg tail",
        "motorbike": "fwheel bwheel handlebar saddle headlight",
        "pottedplant": "pot plant",
        "sheep": "head leye reye lear rear muzzle lhorn rhorn torso neck lfuleg lflleg rfuleg rflleg lbuleg lblleg rbuleg rblleg tail",
        "train": "head hfrontside hleftside hrightside hbackside hroofside headlight coach cfrontside cleftside crightside cbackside croofside",
        "tvmonitor": "screen",
    }
    person = {"head": 1, "hair": 1, "neck": 2, "torso": 2, "luarm": 3, "ruarm": 3, "llarm": 4, "rlarm": 4}
    person |= {"lhand": 4, "rhand": 4, "luleg": 5, "ruleg": 5, "llleg": 6, "rlleg": 6, "lfoot": 6, "rfoot": 6}
    table = {str(k): {} for k in range(1, len(VOC_CLASSES))}
    for name, names in parts.items():
        table[str(VOC_CLASSES.index(name))] = {p: i + 1 for i, p in enumerate(names.split())}
    table[str(VOC_CLASSES.index("person"))] = person
    return table


def _pascal_meta(root: Path, splits: dict[str, list[str]]) -> None:
    PascalContextLayout(root).write_meta(
        splits,
        context_classes={name: i for i, name in enumerate(CONTEXT_CLASSES)},
        nyu_classes={name: i + 1 for i, name in enumerate(NYU_CLASSES)},
        pascal_part=_pascal_part_json(),
    )


def _pascal_write(
    root: Path,
    split: str,
    image_id: str,
    rng: np.random.Generator,
    size: tuple[int, int],
    render_scale: float = 1.0,
) -> None:
    s = pascal_sample(rng, size, render_scale)
    layout = PascalContextLayout(root)
    for path in layout.semseg_candidates(image_id):  # a stale png in the other folder would win
        if path.parent.name != s.semseg_dir:
            path.unlink(missing_ok=True)
    layout.write_sample(
        image_id, s.rendering.image, s.semseg, s.label_map, s.parts, s.sal, s.rendering.normals, s.semseg_dir
    )


# --------------------------------------------------------------------------- NYUD-v2


@dataclass(frozen=True)
class NYUDSample:
    rendering: Rendering
    semseg: np.ndarray  # [H, W] uint8, NYU-40 label 0..39, 255 = unlabelled
    edge: np.ndarray  # [H, W] bool
    depth: np.ndarray  # [H, W] float32 metres, 0 = no measurement


def _kinect_holes(rng: np.random.Generator, r: Rendering, glass: np.ndarray) -> np.ndarray:
    """Where a Kinect returns no depth: the projector's shadow just left of a nearer surface,
    and blobs on glass (windows, mirrors, screens)."""
    holes = np.zeros(r.depth.shape, dtype=bool)
    holes[:, :-1] = r.depth[:, :-1] - r.depth[:, 1:] > 0.3
    holes[:, :-2] |= holes[:, 1:-1] & (rng.random((holes.shape[0], holes.shape[1] - 2)) < 0.5)
    h, w = r.depth.shape
    blobs = np.kron(rng.random((h // 6 + 1, w // 6 + 1)) < 0.35, np.ones((6, 6), dtype=bool))[:h, :w]
    return holes | (glass & blobs)


def nyud_sample(rng: np.random.Generator, size: tuple[int, int], render_scale: float = 1.0) -> NYUDSample:
    scene, r = _render(nyud_scene, rng, size, render_scale)
    labels = np.array([o.label for o in scene.objects] + [IGNORE], dtype=np.uint8)
    semseg = labels[r.object_id]
    edge = boundaries(r.object_id)
    if rng.random() < NYUD_UNLABELLED_EDGES:
        semseg[edge] = IGNORE
    glass_ids = [k for k, o in enumerate(scene.objects) if o.name in ("window", "mirror", "television")]
    depth = r.depth.copy()
    depth[_kinect_holes(rng, r, np.isin(r.object_id, glass_ids))] = 0.0
    return NYUDSample(r, semseg, edge, depth)


def _nyud_id(split: str, index: int) -> str:
    """Like 0000123; train ids are odd, val ids even."""
    return f"{2 * index + 1 + SPLITS.index(split):07d}"


def _nyud_write(
    root: Path,
    split: str,
    image_id: str,
    rng: np.random.Generator,
    size: tuple[int, int],
    render_scale: float = 1.0,
) -> None:
    s = nyud_sample(rng, size, render_scale)
    NYUDLayout(root).write_sample(image_id, s.rendering.image, s.semseg, s.edge, s.rendering.normals, s.depth)


# --------------------------------------------------------------------------- Cityscapes

CITYSCAPES_FAR = 150.0  # metres: no disparity beyond (under 1/15 px at 128 px wide), as on the real far road
STEREO_BLOBS = 0.02  # share of 4x4 blocks where the stereo matcher finds nothing (texture-less patches)
# Cities of the release's train and val splits (an image id names its city).
TRAIN_CITIES = (
    "aachen", "bochum", "bremen", "cologne", "darmstadt", "dusseldorf", "erfurt", "hamburg", "hanover",
    "jena", "krefeld", "monchengladbach", "strasbourg", "stuttgart", "tubingen", "ulm", "weimar", "zurich",
)  # fmt: skip
VAL_CITIES = ("frankfurt", "lindau", "munster")


@dataclass(frozen=True)
class CityscapesSample:
    rendering: Rendering
    label_ids: np.ndarray  # [H, W] uint8, official Cityscapes label ids (not train ids)
    disparity: np.ndarray  # [H, W] float64 pixels, NaN where the stereo matcher has none


def disparity_of(depth: np.ndarray, width: int) -> np.ndarray:
    """Disparity in pixels of an image ``width`` wide from planar depth in metres: fx * baseline
    / Z with Cityscapes' fx scaled to the width and its baseline (0 where the depth is inf)."""
    with np.errstate(divide="ignore"):
        return cityscapes_focal(width) * CITYSCAPES_BASELINE / depth.astype(np.float64)


def stereo_holes(rng: np.random.Generator, disparity: np.ndarray) -> np.ndarray:
    """Where a stereo matcher finds no disparity for the left image: pixels the right camera
    does not see (they land off its left edge, or behind a nearer surface that lands left of
    them) and a few random texture-less blocks."""
    h, w = disparity.shape
    landing = np.arange(w)[None, :] - disparity  # a pixel's column in the right image
    # the leftmost landing of the pixels to its right: one that lands left of it hides it
    right_of = np.minimum.accumulate(landing[:, ::-1], axis=1)[:, ::-1]
    hidden = np.concatenate([right_of[:, 1:] < landing[:, :-1], np.zeros((h, 1), dtype=bool)], axis=1)
    blocks = np.kron(rng.random((h // 4 + 1, w // 4 + 1)) < STEREO_BLOBS, np.ones((4, 4), dtype=bool))
    return (landing < -0.5) | hidden | blocks[:h, :w]


def cityscapes_sample(
    rng: np.random.Generator, size: tuple[int, int], render_scale: float = 1.0
) -> CityscapesSample:
    scene, r = _render(street_scene, rng, size, render_scale)
    ids = np.array([o.label for o in scene.objects] + [CITYSCAPES_IDS["sky"]], dtype=np.uint8)
    label_ids = ids[r.object_id]
    disparity = disparity_of(r.depth, size[1])
    ego = label_ids == CITYSCAPES_IDS["ego vehicle"]  # void, and its paint defeats the matcher
    valid = np.isfinite(r.depth) & (r.depth <= CITYSCAPES_FAR) & ~ego & ~stereo_holes(rng, disparity)
    valid &= disparity < DISPARITY_IGNORE  # nearer than the loader can tell from its ignore value
    return CityscapesSample(r, label_ids, np.where(valid, disparity, np.nan))


def _cityscapes_id(split: str, index: int) -> str:
    """Like frankfurt/frankfurt_000003_000019: the city, a sequence number and the frame (the
    release's annotated frame is the 20th of each snippet)."""
    cities = TRAIN_CITIES if split == "train" else VAL_CITIES
    city = cities[index % len(cities)]
    return f"{city}/{city}_{index // len(cities):06d}_000019"


def _cityscapes_write(
    root: Path,
    split: str,
    image_id: str,
    rng: np.random.Generator,
    size: tuple[int, int],
    render_scale: float = 1.0,
) -> None:
    s = cityscapes_sample(rng, size, render_scale)
    CityscapesLayout(root).write_sample(split, image_id, s.rendering.image, s.label_ids, s.disparity)


# --------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class SynthSpec:
    """How to write one synthetic dataset."""

    image_id: Callable[[str, int], str]  # (split, index) -> image id
    write_meta: Callable[[Path, dict[str, list[str]]], None]  # split files and class tables
    # (root, split, image id, rng, size, render_scale)
    write_sample: Callable[[Path, str, str, np.random.Generator, tuple[int, int], float], None]
    # what a folder holding this dataset has (named when synth refuses to write over a folder)
    marker: Callable[[Path], Path]
    size: tuple[int, int] = (96, 96)  # (height, width) when none is given


SYNTH = Registry[SynthSpec]("synthetic dataset")
SYNTH.add(
    "pascal_context",
    SynthSpec(
        _pascal_id, _pascal_meta, _pascal_write, lambda root: PascalContextLayout(root).split_file("train")
    ),
)
SYNTH.add(
    "nyud",
    SynthSpec(
        _nyud_id,
        lambda root, splits: NYUDLayout(root).write_meta(splits),
        _nyud_write,
        lambda root: NYUDLayout(root).split_file("train"),
    ),
)
# The release has no split files: a split is the images found under leftImg8bit/<split>/.
SYNTH.add(
    "cityscapes",
    SynthSpec(
        _cityscapes_id,
        lambda root, splits: None,
        _cityscapes_write,
        lambda root: CityscapesLayout(root).split_file("train"),
        size=(64, 128),  # the release's 1:2 (1024 x 2048)
    ),
)


def sample_rng(dataset: str, seed: int, split: str, index: int) -> np.random.Generator:
    """The random stream of one image: depends on nothing but these four values."""
    return np.random.default_rng(
        np.random.SeedSequence([seed, zlib.crc32(dataset.encode()), SPLITS.index(split), index])
    )


def _write_chunk(
    dataset: str,
    root: Path,
    seed: int,
    split: str,
    indices: Sequence[int],
    size: tuple[int, int],
    render_scale: float,
) -> int:
    spec = SYNTH.get(dataset)
    for index in indices:
        rng = sample_rng(dataset, seed, split, index)
        spec.write_sample(root, split, spec.image_id(split, index), rng, size, render_scale)
    return len(indices)


_MARKER = ".fedmtl-synth-partial"  # in the staging folder: only a folder holding it is ours to delete
_WHOSE = "the synthetic generator's"


def _staging_base(target: Path) -> str:
    """The name a generation's staging folder starts with: a hidden sibling of the dataset
    folder, ``.NAME.synth-partial.HOST.PID`` (rootlock.staging_path), one per writer."""
    return f".{target.name}.synth-partial"


def _aside(target: Path) -> Path:
    """Where ``overwrite=True`` moves the old dataset folder until the new one is in place."""
    return target.parent / f".{target.name}.synth-replaced"


def check_options(
    num_train: int,
    num_val: int,
    size: Sequence[int],
    seed: int,
    workers: int | None,
    prefix: str = "",
    render_scale: float = 1.0,
) -> None:
    """Refuse an out-of-range option, naming it (``prefix``: "--" on the command line)."""
    if num_train < 1:
        raise ValueError(
            f"{prefix}num_train must be at least 1, got {num_train} (the training images to write)"
        )
    if num_val < 1:
        raise ValueError(
            f"{prefix}num_val must be at least 1, got {num_val} (every client is evaluated on the "
            "validation images)"
        )
    if len(size) != 2 or min(int(v) for v in size) < 8:
        raise ValueError(f"{prefix}size must be [height, width], each at least 8 pixels, got {list(size)}")
    if seed < 0:
        raise ValueError(f"{prefix}seed must be at least 0, got {seed}")
    if workers is not None and workers < 1:
        raise ValueError(f"{prefix}workers must be at least 1, got {workers} (or leave it out: one per core)")
    if (problem := render_scale_problem(tuple(int(v) for v in size), render_scale)) is not None:
        raise ValueError(f"{prefix}render_scale {problem}")


def _check_target(dataset: str, root: Path, target: Path, overwrite: bool) -> None:
    """Refuse, before anything is rendered or written, whatever would overwrite or delete files
    that are not ours. ``root`` as the user gave it (for messages), ``target`` resolved."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"{root} is a file, not a folder: choose another --root for the {dataset} dataset")
    if not overwrite and target.is_dir():
        try:
            holds_files = any(target.iterdir())
        except PermissionError as err:
            raise ValueError(f"cannot read {root} ({err.strerror}): choose another --root") from None
        if holds_files:
            marker = SYNTH.get(dataset).marker(target)
            name = marker.relative_to(target)
            kind = f"it looks like a {dataset} dataset: it has" if marker.exists() else "it has no"
            raise ValueError(
                f"{root} already holds files ({kind} {name}), which synthetic data would overwrite: pass "
                "--overwrite true to replace it with synthetic data, or choose another --root"
            )
    if target.is_dir() and os.path.ismount(target):
        raise ValueError(
            f"{root} is a mount point, and a generated dataset is renamed into place, which a mount "
            "point cannot be: mount its parent folder instead, or choose another --root"
        )
    aside = _aside(target)
    if aside.exists() or aside.is_symlink():
        keep = "" if target.exists() else f"rename it back to {root} to keep them, or "
        raise ValueError(
            f"{aside} holds the old contents of {root}, moved aside by an interrupted --overwrite: "
            f"{keep}delete it, then run again"
        )


def _start_staging(root: Path, target: Path) -> Path:
    """This process's empty staging folder, holding only our marker (naming us)."""
    staging = rootlock.staging_path(target.parent, _staging_base(target))
    try:
        staging.mkdir()
    except PermissionError as err:
        raise ValueError(
            f"cannot create {err.filename or staging} ({err.strerror}): {root} must be in a folder "
            f"you can write to ({target.parent}); choose another --root"
        ) from None
    rootlock.write_marker(
        staging, _MARKER, f"fedmtl data synth is writing {target} here; removed when complete"
    )
    return staging


def _move_into_place(staging: Path, target: Path, root: Path) -> None:
    """Rename the complete ``staging`` folder to ``target``. An existing non-empty ``target``
    (only with overwrite) is first renamed aside, and deleted only once the new folder is in place."""
    aside = _aside(target)
    replacing = target.is_dir() and any(target.iterdir())
    if replacing:
        os.replace(target, aside)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(aside, target)
            raise
    else:
        os.replace(staging, target)  # (an empty folder is replaced too)
    (target / _MARKER).unlink()
    if replacing:
        try:
            shutil.rmtree(aside)
        except OSError as err:
            raise ValueError(
                f"wrote {root}, but could not delete its old contents, moved aside to {aside} ({err}): "
                "delete that folder by hand"
            ) from None


def generate(
    dataset: str,
    root: str | Path,
    num_train: int = 500,
    num_val: int = 200,
    size: tuple[int, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    render_scale: float = 1.0,
) -> Path:
    """Render ``num_train`` + ``num_val`` images of ``dataset`` ("pascal_context", "nyud" or
    "cityscapes") at ``size`` (height, width; default 96 x 96, Cityscapes 64 x 128) into
    ``root``, the dataset folder itself; return ``root``.

    ``workers`` processes render in parallel (default: one per core; 1 renders in this process).
    ``render_scale`` < 1 renders each scene at that fraction of ``size`` and scales the
    rendering up to ``size`` before the labels are read off it (:mod:`fedmtl.synth.resample`):
    about ``1 / render_scale**2`` times faster, with less detail (thin objects and parts
    narrower than ``1 / render_scale`` pixels can vanish, boundaries follow a coarser grid).

    A ``root`` that already holds files is refused with a ValueError (before anything is written)
    unless ``overwrite``. The images are written to a hidden sibling folder of this process's
    own, renamed to ``root`` only when complete (with ``overwrite``, the old folder is deleted
    only after that), so an interrupted generation leaves no ``root``; its leftover is deleted by
    a later call once its owner is gone. One writer at a time per folder holding ``root``: a
    second waits for the first (:mod:`fedmtl.data.rootlock`).
    """
    try:
        spec = SYNTH.get(dataset)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    size = spec.size if size is None else size
    check_options(num_train, num_val, size, seed, workers, render_scale=render_scale)
    height, width = (int(v) for v in size)
    root = Path(root)
    target = root.resolve()  # a symlinked dataset folder: work next to the folder it points to
    _check_target(dataset, root, target, overwrite)  # at once, not after waiting for the lock
    # One writer per data root (rootlock): a second one waits, then sees what the first wrote.
    with rootlock.hold(target.parent, "--root", root) as held:
        _check_target(dataset, root, target, overwrite)
        rootlock.clear_leftovers(target.parent, _staging_base(target), _MARKER, _WHOSE, held.locked)
        staging = _start_staging(root, target)
        try:
            counts = dict(zip(SPLITS, (num_train, num_val)))
            spec.write_meta(
                staging, {split: [spec.image_id(split, i) for i in range(n)] for split, n in counts.items()}
            )

            workers = max(1, os.cpu_count() or 1) if workers is None else workers
            total = num_train + num_val
            chunk = max(1, min(32, total // (4 * workers)))
            jobs = [
                (
                    dataset,
                    staging,
                    seed,
                    split,
                    range(start, min(start + chunk, n)),
                    (height, width),
                    render_scale,
                )
                for split, n in counts.items()
                for start in range(0, n, chunk)
            ]
            with tqdm(total=total, desc=f"synth {dataset}", unit="img", disable=not progress) as bar:
                if workers == 1:
                    for job in jobs:
                        bar.update(_write_chunk(*job))
                else:
                    with ProcessPoolExecutor(workers) as pool:
                        for done in as_completed([pool.submit(_write_chunk, *job) for job in jobs]):
                            bar.update(done.result())
            _move_into_place(staging, target, root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # best effort; else a later call deletes it
            raise
    return root
