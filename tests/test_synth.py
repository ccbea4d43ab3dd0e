"""The synthetic dataset generator: layout, determinism and the geometry of its labels."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedmtl.data.layout import (
    NYUDLayout,
    PascalContextLayout,
    decode_normals,
    encode_normals,
    read_label_map,
    read_part_annotations,
    read_split,
)
from fedmtl.synth import generate, nyud_sample, pascal_sample, sample_rng
from fedmtl.synth.scenes import CONTEXT_CLASSES, NYU_CLASSES, PERSON_PARTS, VOC_CLASSES

SIZE = (40, 56)  # not square, so a swapped height and width shows
SEED = 3
COUNTS = {"train": 10, "val": 6}
GROUND = ("floor", "grass", "road", "ground", "water")


def _generate(dataset: str, root: Path, seed: int = SEED, workers: int = 1) -> Path:
    return generate(
        dataset, root, COUNTS["train"], COUNTS["val"], SIZE, seed=seed, workers=workers, progress=False
    )


@pytest.fixture(scope="module")
def pascal(tmp_path_factory) -> PascalContextLayout:
    root = tmp_path_factory.mktemp("synth") / "PASCALContext"
    assert _generate("pascal_context", root) == root
    return PascalContextLayout(root)


@pytest.fixture(scope="module")
def nyud(tmp_path_factory) -> NYUDLayout:
    root = tmp_path_factory.mktemp("synth") / "NYUDv2"
    assert _generate("nyud", root) == root
    return NYUDLayout(root)


def _ids(layout) -> list[str]:
    return [i for split in COUNTS for i in read_split(layout.split_file(split))]


def _samples(dataset: str) -> list:
    make = pascal_sample if dataset == "pascal_context" else nyud_sample
    return [make(sample_rng(dataset, SEED, split, i), SIZE) for split, n in COUNTS.items() for i in range(n)]


@pytest.fixture(scope="module")
def pascal_samples() -> list:
    return _samples("pascal_context")


@pytest.fixture(scope="module")
def nyud_samples() -> list:
    return _samples("nyud")


def _png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def _pascal_semseg(layout: PascalContextLayout, i: str) -> np.ndarray:
    return _png(next(p for p in layout.semseg_candidates(i) if p.is_file()))


def _neighbour_pairs(a: np.ndarray):
    """(value at p, value at q) for every pair of horizontal and vertical 4-neighbours."""
    yield a[:, :-1], a[:, 1:]
    yield a[:-1, :], a[1:, :]


# --------------------------------------------------------------------------- API and layout


def test_unknown_dataset_is_a_value_error_listing_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="cityscapes, nyud, pascal_context"):
        generate("kitti", tmp_path, 1, 1, SIZE, progress=False)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs", [{"num_train": -1}, {"size": (4, 64)}, {"seed": -2}])
def test_bad_arguments_are_value_errors(tmp_path, kwargs):
    with pytest.raises(ValueError):
        generate(
            "nyud", tmp_path, **{"num_train": 1, "num_val": 1, "size": SIZE, "progress": False, **kwargs}
        )


def test_pascal_layout_has_every_file(pascal):
    for split, n in COUNTS.items():
        ids = read_split(pascal.split_file(split))
        assert len(ids) == n and all(re.fullmatch(r"20(08|09|10|11)_\d{6}", i) for i in ids)
    ids = _ids(pascal)
    assert len(set(ids)) == len(ids)  # unique across train and val
    for name in ("context_classes", "nyu_classes", "pascal_part"):
        assert pascal.json(name).is_file()
    for i in ids:
        for path in (
            pascal.image(i),
            pascal.human_parts(i),
            pascal.sal(i),
            pascal.normals(i),
            pascal.label_map(i),
        ):
            assert path.is_file(), path
        assert sum(p.is_file() for p in pascal.semseg_candidates(i)) == 1
        assert Image.open(pascal.image(i)).size == SIZE[::-1]
        assert _pascal_semseg(pascal, i).shape == read_label_map(pascal.label_map(i)).shape == SIZE
    # both semseg folders are used, so the loader's fallback is exercised
    folders = {next(p for p in pascal.semseg_candidates(i) if p.is_file()).parent.name for i in ids}
    assert folders == {"VOC12", "pascal-context"}


def test_nyud_layout_has_every_file(nyud):
    for split, n in COUNTS.items():
        ids = read_split(nyud.split_file(split))
        assert len(ids) == n and all(re.fullmatch(r"\d{7}", i) for i in ids)
    ids = _ids(nyud)
    assert len(set(ids)) == len(ids)
    for i in ids:
        for path in (nyud.image(i), nyud.semseg(i), nyud.edge(i), nyud.normals(i), nyud.depth(i)):
            assert path.is_file(), path
        assert _png(nyud.image(i)).shape == (*SIZE, 3)
        assert np.load(nyud.depth(i)).shape == _png(nyud.semseg(i)).shape == SIZE


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
def test_same_seed_gives_the_same_bytes_whatever_the_workers(tmp_path, dataset, pascal, nyud):
    first = (pascal if dataset == "pascal_context" else nyud).root
    again = _tree(_generate(dataset, tmp_path / "again", workers=2))
    assert again == _tree(first)  # every file, .mat included, byte for byte
    other = _tree(_generate(dataset, tmp_path / "other", seed=SEED + 1))
    assert len(other) == len(again)  # (a semseg png may sit in the other folder)
    changed = [name for name in again if other.get(name) != again[name]]
    assert len(changed) > 0.9 * len(again) - 3  # all but the split files and class tables


def test_files_hold_the_rendered_labels(pascal, nyud, pascal_samples, nyud_samples):
    """The in-memory samples that the geometric tests below look at are what is on disk."""
    for i, s in zip(_ids(pascal), pascal_samples):
        np.testing.assert_array_equal(_pascal_semseg(pascal, i), s.semseg)
        np.testing.assert_array_equal(read_label_map(pascal.label_map(i)), s.label_map)
        np.testing.assert_array_equal(_png(pascal.sal(i)), s.sal)
        np.testing.assert_array_equal(_png(pascal.normals(i)), encode_normals(s.rendering.normals))
        assert s.semseg_dir == next(p for p in pascal.semseg_candidates(i) if p.is_file()).parent.name
    for i, s in zip(_ids(nyud), nyud_samples):
        np.testing.assert_array_equal(_png(nyud.image(i)), s.rendering.image)
        stored = _png(nyud.semseg(i)).astype(int)
        np.testing.assert_array_equal(np.where(stored == 0, 255, stored - 1), s.semseg)  # label + 1 encoding
        np.testing.assert_array_equal(_png(nyud.edge(i)) > 0, s.edge)
        np.testing.assert_array_equal(np.load(nyud.depth(i)), s.depth)


# --------------------------------------------------------------------------- label values


def test_semseg_values_are_in_range(pascal, nyud):
    pascal_values = np.unique(np.concatenate([_pascal_semseg(pascal, i).ravel() for i in _ids(pascal)]))
    assert set(pascal_values) <= set(range(21)) | {255}
    assert 0 in pascal_values and len(pascal_values) >= 3
    nyud_values = np.unique(np.concatenate([_png(nyud.semseg(i)).ravel() for i in _ids(nyud)]))
    assert set(nyud_values) <= set(range(41))  # 40 classes stored as label + 1, 0 = unlabelled
    assert {1, 2} <= set(nyud_values) and len(nyud_values) >= 8  # wall, floor and furniture


def test_nyud_depth_is_metric_positive_and_finite(nyud):
    holes = []
    for i in _ids(nyud):
        depth = np.load(nyud.depth(i))
        assert depth.dtype == np.float32 and np.isfinite(depth).all() and (depth >= 0).all()
        valid = depth[depth > 0]
        assert valid.min() > 0.3 and valid.max() < 12.0  # a room seen by a Kinect
        holes.append((depth == 0).mean())
    assert 0 < np.mean(holes) < 0.1  # a few Kinect holes, not many


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
def test_normals_files_hold_unit_vectors(dataset, pascal, nyud):
    layout = pascal if dataset == "pascal_context" else nyud
    for i in _ids(layout):
        normals = decode_normals(_png(layout.normals(i)))
        np.testing.assert_allclose(np.linalg.norm(normals, axis=-1), 1.0, atol=0.02)  # 8-bit quantisation


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
def test_normals_face_the_camera(dataset, pascal_samples, nyud_samples):
    for s in pascal_samples if dataset == "pascal_context" else nyud_samples:
        r = s.rendering
        hit = r.object_id >= 0
        facing = (r.normals * r.camera.rays()).sum(-1)  # n . d, camera coordinates
        assert (facing[hit] < 1e-6).all()
        np.testing.assert_allclose(np.linalg.norm(r.normals, axis=-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(
            r.normals[~hit], np.broadcast_to([0.0, 0.0, 1.0], ((~hit).sum(), 3))
        )  # the sky


def _camera_points(r) -> np.ndarray:
    """Camera-space hit points: planar depth times the ray scaled to z = -1."""
    return np.where(np.isfinite(r.depth), r.depth, 0.0)[..., None] * r.camera.rays()  # sky: at the camera


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
def test_floor_is_a_plane_below_the_camera(dataset, pascal_samples, nyud_samples):
    checked = 0
    for s in pascal_samples if dataset == "pascal_context" else nyud_samples:
        r = s.rendering
        if dataset == "nyud":
            floor = s.semseg == NYU_CLASSES.index("floor")
        else:
            floor = np.isin(s.label_map, [CONTEXT_CLASSES.index(g) for g in GROUND])
        if floor.sum() < 20:
            continue
        checked += 1
        up = r.camera.to_camera(np.array([0.0, 1.0, 0.0]))
        np.testing.assert_allclose(r.normals[floor], np.broadcast_to(up, (floor.sum(), 3)), atol=1e-5)
        # every floor point lies camera-height below the camera, along the world's up
        heights = _camera_points(r)[floor] @ up
        np.testing.assert_allclose(heights, -r.camera.position[1], rtol=1e-4)
        # down an image column the floor comes nearer: depth grows toward the horizon
        both = floor[:-1] & floor[1:]
        assert (r.depth[:-1][both] > r.depth[1:][both]).all()
    assert checked >= 3


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
def test_normals_agree_with_depth_gradients(dataset, pascal_samples, nyud_samples):
    angles = []
    for s in pascal_samples if dataset == "pascal_context" else nyud_samples:
        r = s.rendering
        p = _camera_points(r)
        du = p[1:-1, 2:] - p[1:-1, :-2]  # toward the image right
        dv = p[2:, 1:-1] - p[:-2, 1:-1]  # toward the image bottom
        n = np.cross(dv, du)
        n /= np.linalg.norm(n, axis=-1, keepdims=True) + 1e-12
        ids = r.object_id
        inner = np.ones_like(ids[1:-1, 1:-1], dtype=bool)  # whole 3x3 window on one object
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                inner &= (
                    ids[1 + dy : ids.shape[0] - 1 + dy, 1 + dx : ids.shape[1] - 1 + dx] == ids[1:-1, 1:-1]
                )
        inner &= ids[1:-1, 1:-1] >= 0
        cos = (n * r.normals[1:-1, 1:-1]).sum(-1)[inner]
        angles.append(np.degrees(np.arccos(np.clip(cos, -1, 1))))
    angles = np.concatenate(angles)
    assert np.median(angles) < 1.0  # creases inside objects (box edges) make the rest
    assert np.mean(angles < 10.0) > 0.85


# --------------------------------------------------------------------------- edges


def test_nyud_edges_are_the_object_boundaries(nyud, nyud_samples):
    for s in nyud_samples:
        ids, edge = s.rendering.object_id, s.edge
        at_boundary = np.zeros_like(edge)
        for (a, b), (ea, eb) in zip(_neighbour_pairs(ids), _neighbour_pairs(edge)):
            differ = a != b
            assert (ea[differ] & eb[differ]).all()  # both sides of every boundary are edges
        at_boundary[:, :-1] |= ids[:, :-1] != ids[:, 1:]
        at_boundary[:, 1:] |= ids[:, 1:] != ids[:, :-1]
        at_boundary[:-1] |= ids[:-1] != ids[1:]
        at_boundary[1:] |= ids[1:] != ids[:-1]
        np.testing.assert_array_equal(edge, at_boundary)  # and nothing else
    for i in _ids(nyud):  # on disk: every change of class is an edge
        semseg, edge = _png(nyud.semseg(i)), _png(nyud.edge(i)) > 0
        assert set(np.unique(_png(nyud.edge(i)))) <= {0, 255}
        for (a, b), (ea, eb) in zip(_neighbour_pairs(semseg), _neighbour_pairs(edge)):
            differ = (a != b) & (a > 0) & (b > 0)
            assert (ea[differ] & eb[differ]).all()
        assert 0.02 < edge.mean() < 0.4


def test_pascal_label_map_boundaries_are_object_boundaries(pascal, pascal_samples):
    for s in pascal_samples:
        for (a, b), (ia, ib) in zip(_neighbour_pairs(s.label_map), _neighbour_pairs(s.rendering.object_id)):
            assert (ia[a != b] != ib[a != b]).all()  # the loader's edges lie between objects
    for i in _ids(pascal):  # and every VOC class boundary is a context class boundary
        semseg, label_map = _pascal_semseg(pascal, i), read_label_map(pascal.label_map(i))
        for (a, b), (la, lb) in zip(_neighbour_pairs(semseg), _neighbour_pairs(label_map)):
            differ = (a != b) & (a != 255) & (b != 255)
            assert (la[differ] != lb[differ]).all()


# --------------------------------------------------------------------------- saliency and parts


def test_saliency_lies_on_objects_only(pascal):
    salient_images = 0
    for i in _ids(pascal):
        sal, semseg = _png(pascal.sal(i)), _pascal_semseg(pascal, i)
        assert set(np.unique(sal)) <= {0, 255}
        assert (semseg[sal > 127] != 0).all()  # never background (void band allowed)
        objects = np.zeros(sal.shape, dtype=bool)
        for obj in read_part_annotations(pascal.human_parts(i)):
            objects |= obj.mask
        assert (objects[sal > 127]).all()
        salient_images += bool((sal > 127).any())
    assert salient_images >= len(_ids(pascal)) * 0.7


def test_people_have_parts_inside_their_masks(pascal):
    human_parts = set(json.loads(pascal.json("pascal_part").read_text())[str(VOC_CLASSES.index("person"))])
    assert human_parts == set(PERSON_PARTS)
    with_person = 0
    for i in _ids(pascal):
        semseg = _pascal_semseg(pascal, i)
        objects = read_part_annotations(pascal.human_parts(i))
        assert objects  # every image has at least one VOC object
        people = [o for o in objects if o.class_ind == 15]
        with_person += bool(people)
        for obj in objects:
            assert VOC_CLASSES[obj.class_ind] == obj.class_name and obj.mask.any()
            assert (semseg[obj.mask] != 0).all()
            if obj.class_ind != 15:
                assert obj.parts == {}
                continue
            assert obj.parts and set(obj.parts) <= human_parts
            union = np.zeros_like(obj.mask)
            for mask in obj.parts.values():
                assert mask.any() and not (mask & ~obj.mask).any()  # inside the person
                assert not (mask & union).any()  # parts do not overlap
                union |= mask
            np.testing.assert_array_equal(union, obj.mask)  # and cover the whole person
            assert set(np.unique(semseg[obj.mask])) <= {15, 255}
    assert 0 < with_person < len(_ids(pascal))  # some images have nobody: no human_parts label


def test_part_annotations_round_trip(pascal, pascal_samples):
    for i, s in zip(_ids(pascal), pascal_samples):
        read = read_part_annotations(pascal.human_parts(i))
        assert [(o.class_name, o.class_ind) for o in read] == [(o.class_name, o.class_ind) for o in s.parts]
        for got, want in zip(read, s.parts):
            np.testing.assert_array_equal(got.mask, want.mask)
            assert got.parts.keys() == want.parts.keys()
            for name in want.parts:
                np.testing.assert_array_equal(got.parts[name], want.parts[name])


# --------------------------------------------------------------------------- class tables and looks


def test_normals_are_valid_on_most_object_pixels(pascal):
    nyu = json.loads(pascal.json("nyu_classes").read_text())
    context = json.loads(pascal.json("context_classes").read_text())
    assert list(nyu) == list(NYU_CLASSES) and nyu["wall"] == 1
    # the public loader's rule: NYU names that PASCAL-Context also has, plus tvmonitor
    valid = {context[n] for n in nyu if n in context and n != "unknown"} | {context["tvmonitor"]}
    assert {context[n] for n in ("wall", "floor", "chair", "table", "sofa", "person")} <= valid
    assert context["sky"] not in valid and "unknown" in context
    for i in _ids(pascal):
        label_map = read_label_map(pascal.label_map(i))
        assert not np.isin(label_map[label_map == context["sky"]], list(valid)).any()
    # most VOC object pixels are of classes with valid normals (over more, smaller images)
    on_objects = total = 0
    for index in range(60):
        s = pascal_sample(sample_rng("pascal_context", SEED, "train", index), (24, 32))
        objects = (s.semseg > 0) & (s.semseg < 255)
        on_objects += np.isin(s.label_map[objects], list(valid)).sum()
        total += objects.sum()
    assert on_objects > 0.55 * total


def test_datasets_differ_in_colour(pascal, nyud):
    def stats(layout):
        pixels = np.concatenate([_png(layout.image(i)).reshape(-1, 3) for i in _ids(layout)]).astype(float)
        return pixels.mean(), pixels[:, 2].mean() / pixels[:, 0].mean()

    pascal_brightness, pascal_blue = stats(pascal)
    nyud_brightness, nyud_blue = stats(nyud)
    assert pascal_brightness > nyud_brightness + 20  # daylight outdoors, a dim room indoors
    assert pascal_blue > nyud_blue + 0.15  # blue sky, warm lamp light


# --------------------------------------------------------------------------- never overwrite, atomic


TINY = {"num_train": 2, "num_val": 1, "size": (16, 16), "workers": 1, "progress": False}


def _tiny(dataset: str, root: Path, **changes) -> Path:
    return generate(dataset, root, **{**TINY, **changes})


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_an_existing_dataset_is_refused_before_any_file_changes(tmp_path):
    """Synthetic ids collide with real VOC ids: generating over a dataset would silently mix
    synthetic files into it. The refusal names the folder and the fix, and touches nothing."""
    root = tmp_path / "PASCALContext"
    _tiny("pascal_context", root)
    (root / "mine.txt").write_text("a file of the user's")
    before = _hashes(root)
    with pytest.raises(ValueError) as err:
        _tiny("pascal_context", root, seed=1)
    message = _one_line(err)
    assert str(root) in message and "already holds files" in message
    assert "looks like a pascal_context dataset" in message and "ImageSets/Context/train.txt" in message
    assert "--overwrite true" in message and "--root" in message
    assert _hashes(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["PASCALContext"]  # no staging folder either


def test_a_folder_holding_other_files_is_refused_too(tmp_path):
    root = tmp_path / "NYUDv2"
    root.mkdir()
    (root / "notes.txt").write_text("not a dataset, still the user's")
    with pytest.raises(ValueError) as err:
        _tiny("nyud", root)
    message = _one_line(err)
    assert str(root) in message and "already holds files" in message and "--overwrite true" in message
    assert "has no gt_sets/train.txt" in message  # says it does not look like a dataset
    assert [p.name for p in root.iterdir()] == ["notes.txt"]
    assert (root / "notes.txt").read_text() == "not a dataset, still the user's"


def test_an_empty_existing_folder_is_filled(tmp_path):
    """``mkdir data/NYUDv2`` before generating is a normal thing to do, not something to refuse."""
    root = tmp_path / "NYUDv2"
    root.mkdir()
    assert _tiny("nyud", root) == root
    assert read_split(NYUDLayout(root).split_file("train")) == ["0000001", "0000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"]


def test_overwrite_replaces_the_folder_with_the_new_dataset_only(tmp_path):
    root = tmp_path / "data" / "NYUDv2"
    _tiny("nyud", root, seed=5)
    (root / "stale.txt").write_text("from before")
    assert _tiny("nyud", root, overwrite=True) == root
    assert not (root / "stale.txt").exists()
    assert _hashes(root) == _hashes(_tiny("nyud", tmp_path / "fresh"))  # exactly a fresh generation
    assert sorted(p.name for p in root.parent.iterdir()) == ["NYUDv2"]  # the old folder is deleted


def _interrupt_after_first_chunk(monkeypatch) -> None:
    import fedmtl.synth.generator as synth

    original, calls = synth._write_chunk, []

    def interrupted(*args):
        if calls:
            raise KeyboardInterrupt("interrupted")
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(synth, "_write_chunk", interrupted)


def test_an_interrupted_generation_leaves_no_dataset_behind(tmp_path, monkeypatch):
    """A split file is what tells `fedmtl fit` that data is present: after an interruption there
    must be no dataset folder at all, so the next run generates again, and then succeeds."""
    root = tmp_path / "NYUDv2"
    with monkeypatch.context() as patch:
        _interrupt_after_first_chunk(patch)
        with pytest.raises(KeyboardInterrupt):
            _tiny("nyud", root)
    assert not root.exists()
    assert not any(tmp_path.iterdir())  # the partial files are removed too
    _tiny("nyud", root)
    assert len(read_split(NYUDLayout(root).split_file("val"))) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"]


def test_an_interrupted_overwrite_keeps_the_old_dataset(tmp_path, monkeypatch):
    root = tmp_path / "NYUDv2"
    _tiny("nyud", root, seed=5)
    before = _hashes(root)
    with monkeypatch.context() as patch:
        _interrupt_after_first_chunk(patch)
        with pytest.raises(KeyboardInterrupt):
            _tiny("nyud", root, overwrite=True)
    assert _hashes(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"]


KILLED_AFTER_FIRST_CHUNK = """
import os, signal, sys
import fedmtl.synth.generator as synth
original = synth._write_chunk
def killed(*args):
    original(*args)
    os.kill(os.getpid(), signal.SIGKILL)
synth._write_chunk = killed
synth.generate("nyud", sys.argv[1], 2, 1, (16, 16), workers=1, progress=False)
"""


def test_the_leftover_of_a_killed_generation_is_deleted_by_the_next_call(tmp_path):
    """A killed process cannot clean up after itself; the next call removes its staging folder
    (it holds the generator's marker file) and generates normally."""
    root = tmp_path / "NYUDv2"
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_CHUNK, str(root)], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert not root.exists()
    # its staging folder, named after it, and the data root's lock file (the lock itself is gone)
    (leftover,) = [p for p in tmp_path.iterdir() if p.name != ".fedmtl-data.lock"]
    assert re.fullmatch(r"\.NYUDv2\.synth-partial\.[^.]+.*\.\d+", leftover.name), leftover.name
    assert (leftover / "gt_sets" / "train.txt").is_file()
    _tiny("nyud", root)
    assert len(read_split(NYUDLayout(root).split_file("train"))) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"]


def test_a_folder_with_the_staging_name_but_no_marker_is_not_deleted(tmp_path):
    """Only a folder the generator itself made is deleted; anything else of that name is the
    user's, and is refused with the way out."""
    staging = tmp_path / ".NYUDv2.synth-partial"
    staging.mkdir()
    (staging / "keep.txt").write_text("the user's")
    with pytest.raises(ValueError) as err:
        _tiny("nyud", tmp_path / "NYUDv2")
    message = _one_line(err)
    assert str(staging) in message and "move or delete it" in message
    assert (staging / "keep.txt").read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".NYUDv2.synth-partial"]


def test_old_contents_moved_aside_by_an_interrupted_overwrite_are_kept(tmp_path):
    """Killed between the two renames of an overwrite, the old dataset sits in a sibling folder:
    it is the user's, so the next call refuses and says how to get it back."""
    aside = tmp_path / ".NYUDv2.synth-replaced"
    aside.mkdir()
    (aside / "real.png").write_bytes(b"real data")
    with pytest.raises(ValueError) as err:
        _tiny("nyud", tmp_path / "NYUDv2", overwrite=True)
    message = _one_line(err)
    assert str(aside) in message and f"rename it back to {tmp_path / 'NYUDv2'}" in message
    assert (aside / "real.png").read_bytes() == b"real data"
    assert not (tmp_path / "NYUDv2").exists()


@pytest.mark.parametrize("parent", ["read_only", "read_only/missing"])
def test_a_parent_folder_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch, parent):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root ignores file modes: make creating a folder in there fail as it would

        def mkdir(path, mode=0o777):
            if Path(path).parent == read_only:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_mkdir(path, mode)

        real_mkdir = os.mkdir
        monkeypatch.setattr(os, "mkdir", mkdir)
    root = tmp_path / parent / "NYUDv2"
    try:
        with pytest.raises(ValueError) as err:
            _tiny("nyud", root)
    finally:
        read_only.chmod(0o755)
    message = _one_line(err)
    assert str(root.parent if parent == "read_only" else read_only / "missing") in message
    assert "Permission denied" in message and "--root" in message
    assert not any(read_only.iterdir())


def test_a_mount_point_is_refused_before_rendering(tmp_path, monkeypatch):
    """A finished dataset is renamed into place, which fails on a mount point: say so at once,
    not after an hour of rendering."""
    import fedmtl.synth.generator as synth

    root = tmp_path / "NYUDv2"
    root.mkdir()
    monkeypatch.setattr(synth.os.path, "ismount", lambda path: Path(path) == root)
    with pytest.raises(ValueError) as err:
        _tiny("nyud", root)
    message = _one_line(err)
    assert str(root) in message and "mount point" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"] and not any(root.iterdir())


def test_a_symlinked_dataset_folder_is_filled_where_it_points(tmp_path):
    """data/NYUDv2 -> /big/disk/NYUDv2 is a common setup: the link stays, the data lands on the disk."""
    target = tmp_path / "disk" / "NYUDv2"
    target.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    link = tmp_path / "data" / "NYUDv2"
    link.symlink_to(target, target_is_directory=True)
    assert _tiny("nyud", link) == link
    assert link.is_symlink() and NYUDLayout(target).split_file("train").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["NYUDv2"]
