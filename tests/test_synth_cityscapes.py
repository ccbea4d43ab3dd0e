"""Synthetic Cityscapes: the release's layout, official label ids, disparity from the rendered
depth, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedmtl.data.cityscapes import Cityscapes
from fedmtl.data.classes import CITYSCAPES_CLASSES
from fedmtl.data.layout import CityscapesLayout, decode_disparity, encode_disparity
from fedmtl.synth import cityscapes_sample, generate, sample_rng
from fedmtl.synth.generator import CITYSCAPES_FAR, TRAIN_CITIES, VAL_CITIES, stereo_holes
from fedmtl.synth.scenes import CITYSCAPES_BASELINE, CITYSCAPES_IDS, cityscapes_focal

SIZE = (32, 64)
SEED = 5
COUNTS = {"train": 6, "val": 3}
# cityscapesScripts labels.py: the 19 evaluated classes' label ids; every other id is void
EVALUATED = {7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33}


def _generate(root: Path, seed: int = SEED, workers: int = 1, **kwargs) -> Path:
    return generate(
        "cityscapes",
        root,
        COUNTS["train"],
        COUNTS["val"],
        SIZE,
        seed=seed,
        workers=workers,
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def city(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "Cityscapes"
    assert _generate(root) == root
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _files(root: Path, split: str) -> list[tuple[Path, Path, Path]]:
    """(image, labelIds, disparity) of every image of a split, as the loader finds them."""
    layout = CityscapesLayout(root)
    return [
        (layout.image(split, i), layout.semseg(split, i), layout.disparity(split, i))
        for i in layout.split_ids(split)
    ]


def test_the_release_layout_with_every_file_and_its_encoding(city):
    assert sorted(p.name for p in city.iterdir()) == ["disparity", "gtFine", "leftImg8bit"]
    for split, cities in (("train", TRAIN_CITIES), ("val", VAL_CITIES)):
        files = _files(city, split)
        assert len(files) == COUNTS[split]
        for image, label, disparity in files:
            assert image.parent.name in cities
            assert image.name.startswith(f"{image.parent.name}_") and image.name.endswith(
                "_000019_leftImg8bit.png"
            )
            with Image.open(image) as im, Image.open(label) as lab, Image.open(disparity) as disp:
                assert (im.mode, lab.mode, disp.mode) == ("RGB", "L", "I;16")
                assert im.size == lab.size == disp.size == (SIZE[1], SIZE[0])
    assert len(list(city.rglob("*.png"))) == 3 * sum(COUNTS.values())  # nothing else, no split files


def test_same_seed_gives_the_same_bytes_whatever_the_workers(tmp_path, city):
    assert _tree(_generate(tmp_path / "again", workers=2)) == _tree(city)
    other = _tree(_generate(tmp_path / "other", seed=SEED + 1))
    assert other.keys() == _tree(city).keys()
    assert sum(other[name] != data for name, data in _tree(city).items()) == len(other)


def test_an_existing_dataset_is_refused_naming_its_images(city):
    before = _tree(city)
    with pytest.raises(
        ValueError, match=r"looks like a cityscapes dataset: it has leftImg8bit/train.*--overwrite"
    ):
        _generate(city)
    assert _tree(city) == before


def test_labels_are_official_label_ids_not_train_ids(city):
    seen: set[int] = set()
    for split in COUNTS:
        for _, label, _ in _files(city, split):
            seen |= set(np.unique(np.asarray(Image.open(label))).tolist())
    assert seen <= set(CITYSCAPES_IDS.values())  # ids 0..33, all of them ones a street scene draws
    assert {7, 8, 11, 23, 26} <= seen  # road, sidewalk, building, sky, car: train ids 0, 1, 2, 10, 13
    assert seen - EVALUATED  # void ids too (ego vehicle 1, static 4, parking 9), which train to ignore


def _stored_and_rendered():
    for split, n in COUNTS.items():
        for index in range(n):
            yield cityscapes_sample(sample_rng("cityscapes", SEED, split, index), SIZE)


def test_the_files_hold_the_rendered_sample(city):
    samples = list(_stored_and_rendered())
    files = [f for split in COUNTS for f in sorted(_files(city, split), key=lambda f: _index(f[0]))]
    for s, (image, label, disparity) in zip(samples, files, strict=True):
        assert np.array_equal(np.asarray(Image.open(image)), s.rendering.image)
        assert np.array_equal(np.asarray(Image.open(label)), s.label_ids)
        assert np.array_equal(np.asarray(Image.open(disparity)), encode_disparity(s.disparity))


def _index(image: Path) -> int:
    """The generator's image index back from a file name: sequence * cities + city."""
    cities = TRAIN_CITIES if image.parent.parent.name == "train" else VAL_CITIES
    sequence = int(image.name.split("_")[-3])
    return sequence * len(cities) + cities.index(image.parent.name)


@pytest.mark.parametrize("split", COUNTS)
def test_the_loader_reads_train_ids_and_the_valid_disparity(city, split):
    data = Cityscapes(city, split, tasks=["semseg", "depth"])
    assert len(data) == COUNTS[split]
    classes = set()
    for k in range(len(data)):
        sample = data[k]
        semseg = np.asarray(sample["semseg"]).squeeze()
        depth = np.asarray(sample["depth"]).squeeze()
        values = set(np.unique(semseg).tolist())
        assert values <= set(range(len(CITYSCAPES_CLASSES))) | {255}
        classes |= values
        valid = depth != 255
        assert 0.3 < valid.mean() < 1 and (depth[valid] > 0).all()
    assert {0, 2, 10} <= classes  # road, building, sky by train id


def test_disparity_decodes_to_the_rendered_depth_within_rounding():
    fx_b = cityscapes_focal(SIZE[1]) * CITYSCAPES_BASELINE
    assert fx_b == pytest.approx(2262.52 * 64 / 2048 * 0.209313)
    valid_share = []
    for s in _stored_and_rendered():
        decoded = decode_disparity(encode_disparity(s.disparity))  # as written, as the loader reads
        depth, ids = s.rendering.depth, s.label_ids
        valid = decoded != 255
        assert np.array_equal(valid, np.isfinite(s.disparity))
        assert np.abs(decoded[valid] - fx_b / depth[valid]).max() <= 0.5 / 256 + 1e-5
        assert not valid[ids == CITYSCAPES_IDS["sky"]].any()  # the sky: infinitely far
        assert not valid[ids == CITYSCAPES_IDS["ego vehicle"]].any()
        assert not valid[depth > CITYSCAPES_FAR].any()
        valid_share.append(valid.mean())
    assert 0.5 < np.mean(valid_share) < 0.97  # mostly valid, with holes, as the release's maps


def test_stereo_holes_by_hand(monkeypatch):
    """Background at disparity 1, a surface at disparity 3 over columns 5..8: in the right image
    column 5 lands at 2, over the background's column 4 (landing at 3); column 0 lands at -1,
    off the right image. Nothing else is hidden."""
    monkeypatch.setattr("fedmtl.synth.generator.STEREO_BLOBS", 0.0)
    disparity = np.ones((1, 12))
    disparity[0, 5:9] = 3.0
    holes = stereo_holes(np.random.default_rng(0), disparity)
    assert np.flatnonzero(holes[0]).tolist() == [0, 4]


def test_render_scale_writes_the_full_size_with_the_same_camera():
    s = cityscapes_sample(sample_rng("cityscapes", SEED, "train", 0), SIZE, render_scale=0.5)
    assert s.label_ids.shape == s.disparity.shape == SIZE
    assert s.rendering.camera.focal == pytest.approx(cityscapes_focal(SIZE[1]))
    valid = np.isfinite(s.disparity)
    rendered = cityscapes_focal(SIZE[1]) * CITYSCAPES_BASELINE / s.rendering.depth[valid]
    assert np.allclose(s.disparity[valid], rendered)


def test_synth_command_writes_cityscapes_at_its_1_to_2_default_size(tmp_path, capsys):
    from fedmtl.cli import main

    root = tmp_path / "Cityscapes"
    assert (
        main(
            [
                "data",
                "synth",
                "--dataset",
                "cityscapes",
                "--root",
                str(root),
                "--num_train",
                "1",
                "--num_val",
                "1",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == f"wrote 1 train + 1 val cityscapes images to {root}"
    (image,) = (root / "leftImg8bit" / "train").glob("*/*.png")
    assert Image.open(image).size == (128, 64)
