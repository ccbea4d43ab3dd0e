"""Cityscapes: the labelId -> trainId table, disparity decoding, the transforms' disparity
rule, the metric's validity window, and data check / prepare, on tiny data in the official
layout written here (16x32 images)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedmtl.data.check import check_data, format_report
from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.data.layout import CityscapesLayout, cityscapes_train_ids, decode_disparity, encode_disparity
from fedmtl.data.prepare import format_result, prepare
from fedmtl.data.transforms import IGNORE, AddIgnoreRegions, RandomScale, Resize
from fedmtl.metrics.depth import DepthRMSE
from fedmtl.tasks import get_task
from tests.helpers import run_cli

H, W = 16, 32
IDS = {
    "train": ["aachen/aachen_000000_000019", "bochum/bochum_000000_000313"],
    "val": ["lindau/lindau_000001_000019"],
}


def write_city(folder: Path) -> CityscapesLayout:
    """A tiny Cityscapes in the release layout: label ids 0..33 and a disparity ramp with an
    invalid (0) column."""
    layout = CityscapesLayout(folder)
    rng = np.random.default_rng(0)
    for split, ids in IDS.items():
        for i in ids:
            disparity = np.tile(np.linspace(0.0, 120.0, W), (H, 1))
            disparity[:, 0] = np.nan  # stored 0: invalid
            image = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
            layout.write_sample(split, i, image, rng.integers(0, 34, (H, W)), disparity)
    return layout


@pytest.fixture
def city(tmp_path) -> Path:
    write_city(tmp_path / "Cityscapes")
    return tmp_path


def test_label_ids_map_to_train_ids_by_hand():
    # road 7->0, sidewalk 8->1, sky 23->10, bicycle 33->18; unlabeled 0, ego vehicle 1, parking 9,
    # caravan 29, license plate -1 (255 in an 8-bit png) and an id past 33: 255 (ignored).
    ids = np.array([7, 8, 23, 33, 0, 1, 9, 29, -1, 255, 40])
    assert cityscapes_train_ids(ids).tolist() == [0, 1, 10, 18, 255, 255, 255, 255, 255, 255, 255]


def test_disparity_decodes_as_the_release_encodes_it():
    stored = np.array([0, 1, 257, 25601, 65280, 65281, 65535], dtype=np.uint16)
    # (d - 1) / 256 where d > 0; 0 invalid -> 255; >= 255 px would read as the ignore value -> 255
    assert decode_disparity(stored).tolist() == [255, 0.0, 1.0, 100.0, 65279 / 256, 255, 255]
    assert encode_disparity(np.array([np.nan, -1.0, 0.0, 1.0, 100.0])).tolist() == [0, 0, 1, 257, 25601]


def test_loader_reads_train_ids_and_ignores_invalid_disparity(city):
    data = build_dataset("cityscapes", city, "val", train_size=(H, W))
    assert data.ids == IDS["val"]
    sample = data[0]
    depth, semseg = sample["depth"], sample["semseg"]
    assert (depth[:, 0] == IGNORE).all()  # stored 0
    assert depth[0, -1].item() == pytest.approx(120.0, abs=1 / 256)
    assert depth[0, 1].item() == pytest.approx(120.0 / (W - 1), abs=1 / 256)
    assert set(semseg.unique().tolist()) <= set(range(19)) | {IGNORE}
    assert DATASETS.get("cityscapes").train_size == (768, 1536)  # FMTL-Bench's TRAIN_SCALE


def test_a_zero_disparity_stays_a_valid_target_and_the_metric_scores_it():
    sample = {
        "image": np.zeros((2, 2, 3), np.float32),
        "depth": np.array([[0.0, 255.0], [100.0, 254.0]], np.float32),
    }
    assert AddIgnoreRegions("disparity")(sample, None)["depth"].tolist() == [[0.0, 255.0], [100.0, 254.0]]
    assert AddIgnoreRegions("metres")(sample, None)["depth"].tolist() == [[255.0, 255.0], [100.0, 254.0]]
    metric = get_task("depth").metric("cityscapes")
    metric.update(torch.ones(1, 2, 2), torch.tensor([[[0.0, 255.0], [100.0, 254.0]]]))
    # three valid pixels (0, 100 and 254 px; not 255), none cut by NYUD-v2's 80 m window
    expected = np.sqrt((1.0 + 99.0**2 + 253.0**2) / 3)
    assert metric.compute().item() == pytest.approx(expected)
    nyud = DepthRMSE()
    nyud.update(torch.ones(1, 2, 2), torch.tensor([[[0.0, 255.0], [100.0, 4.0]]]))
    assert nyud.compute().item() == pytest.approx(3.0)  # only the 4 m pixel


def test_a_resize_multiplies_disparity_and_divides_metres():
    sample = {
        "image": np.zeros((4, 4, 3), np.float32),
        "depth": np.array([[10.0, 255.0, 200.0, 0.0]] * 4, np.float32),
    }
    rng = np.random.default_rng(0)
    up = RandomScale(2.0, 2.0, depth_unit="disparity")(sample, rng)["depth"]
    assert up[0, ::2].tolist() == [20.0, 255.0, 255.0, 0.0]  # 200 px * 2 >= 255: ignored; ignore stays
    assert RandomScale(2.0, 2.0)(sample, rng)["depth"][0, ::2].tolist() == [5.0, 127.5, 100.0, 0.0]
    half = Resize((2, 2), depth_unit="disparity")(sample, rng)["depth"]
    assert half.tolist() == [[5.0, 100.0], [5.0, 100.0]]


def test_a_missing_disparity_file_is_one_line_naming_it(city, capsys):
    missing = CityscapesLayout(city / "Cityscapes").disparity("train", IDS["train"][1])
    missing.unlink()
    with pytest.raises(FileNotFoundError) as err:
        build_dataset("cityscapes", city, "train")
    message = str(err.value)
    assert "\n" not in message
    assert f"Cityscapes train depth label not found: {missing}" in message
    assert "fedmtl data synth --dataset cityscapes" in message
    code, lines = run_cli(["data", "check", "--root", str(city), "--dataset", "cityscapes"], capsys)
    assert code != 0 and len(lines) == 1
    assert lines[0].startswith("error: data check found 1 problem(s)") and f"{missing}: missing" in lines[0]


def test_check_reads_the_release_layout_and_refuses_an_8_bit_disparity(city, capsys):
    out = format_report(check_data(city))
    assert "cityscapes  train  2 / 2,975" in out and "cityscapes  val    1 / 500" in out
    path = CityscapesLayout(city / "Cityscapes").disparity("val", IDS["val"][0])
    Image.fromarray(np.zeros((H, W), np.uint8)).save(path)  # 8 bits cannot hold d = 256 * disp + 1
    code, lines = run_cli(["data", "check", "--root", str(city)], capsys)
    assert code != 0 and len(lines) == 1 and "a disparity of mode L" in lines[0] and str(path) in lines[0]


def test_prepare_places_the_release_archives_under_cityscapes(tmp_path):
    release = tmp_path / "release"
    write_city(release)
    archives = []
    for part in ("leftImg8bit", "gtFine", "disparity"):
        archive = tmp_path / f"{part}_trainvaltest.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("README", f"the {part} package")  # differs between the archives: not unpacked
            for path in sorted((release / part).rglob("*.png")):
                z.write(path, path.relative_to(release).as_posix())
        archives.append(str(archive))
    root = tmp_path / "root"
    result = prepare(archives, root)
    out = format_result(result)
    assert result.datasets == ["cityscapes"]
    assert f"{root / 'Cityscapes' / 'disparity'}: unpacked 3 files" in out
    assert "not unpacked (not part of a dataset)" in out and "README" in out
    assert build_dataset("cityscapes", root, "train").ids == IDS["train"]
