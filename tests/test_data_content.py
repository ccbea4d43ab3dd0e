"""Labels and images that load but are wrong: ``fedmtl data check`` and ``fit`` read them as the
loaders do, read an unambiguous form right and refuse the rest naming the file; dataset folders
that are broken links or link loops are named."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedmtl.cli import main
from fedmtl.data.datasets import build_dataset
from fedmtl.data.layout import NYUDLayout, PascalContextLayout, read_split
from tests.helpers import fit_refused, refused_keeping, stderr_lines, tiny_config


def _first(layout, split: str = "train") -> str:
    return read_split(layout.split_file(split))[0]


def _pascal(root: Path) -> PascalContextLayout:
    return PascalContextLayout(root / "PASCALContext")


def _nyud(root: Path) -> NYUDLayout:
    return NYUDLayout(root / "NYUDv2")


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path)).copy()


# ---------------------------------------------------------------------------- refused


def _class_100(root: Path) -> Path:  # was: IndexError: Target 100 is out of bounds, mid-round
    path = _pascal(root).semseg_candidates(_first(_pascal(root)))[0]
    label = _pixels(path)
    label[:2, :3] = 100
    Image.fromarray(label).save(path)
    return path


def _nyud_stored_255(root: Path) -> Path:  # read as 254 after the -1 of NYUD's encoding
    path = _nyud(root).semseg(_first(_nyud(root), "val"))
    label = _pixels(path)
    label[0, 0] = 255
    Image.fromarray(label).save(path)
    return path


def _colour_label(root: Path) -> Path:  # RGB re-saved, channels differ: not a class id per pixel
    path = _nyud(root).semseg(_first(_nyud(root)))
    rgb = np.asarray(Image.open(path).convert("RGB")).copy()
    rgb[0, 0] = (1, 2, 3)
    Image.fromarray(rgb).save(path)
    return path


def _transparent_image(root: Path) -> Path:
    path = _nyud(root).image(_first(_nyud(root)))
    rgba = np.asarray(Image.open(path).convert("RGBA")).copy()
    rgba[:4, :4, 3] = 0
    Image.fromarray(rgba).save(path)
    return path


def _grey_normals(root: Path) -> Path:  # one channel holds no normal
    path = _pascal(root).normals(_first(_pascal(root)))
    Image.open(path).convert("L").save(path)
    return path


REFUSED = {
    _class_100: "holds class value 100 in 6 pixels, outside 0-20 (the 21 classes) and 255 (ignored)",
    _nyud_stored_255: "holds class value 255 in 1 pixels, outside 0 (unlabelled) and 1-40",
    _colour_label: "a label in colour (RGB), its channels differ: save the class ids as a grey (L) or palette (P)",
    _transparent_image: "an image with transparent pixels: save it as an 8-bit RGB image",
    _grey_normals: "a normals label of mode L (PNG), not read: save the normals as an 8-bit RGB png",
}


@pytest.mark.parametrize("damage", list(REFUSED), ids=lambda f: f.__name__.strip("_"))
def test_content_a_loader_would_read_wrong_is_refused_by_check_and_fit(tmp_path, data, damage, capsys):
    path = damage(data)
    reason = REFUSED[damage]
    (line,) = refused_keeping(["data", "check", "--root", str(data)], data, capsys)
    assert line.startswith("error: data check found 1 problem(s)") and f"{path}: {reason}" in line
    config = tiny_config(tmp_path, data, rounds=1)
    if damage is _grey_normals:  # the tiny scenario has no normals client
        config = tiny_config(
            tmp_path,
            data,
            rounds=1,
            clients=[{"dataset": "pascal_context", "tasks": ["normals"], "batch_size": 4}],
        )
    run_dir = tmp_path / "run"
    lines = fit_refused(config, run_dir, capsys)
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"{path}: {reason}" in lines[0], lines
    assert not run_dir.exists()


def test_check_decodes_a_seeded_sample_and_says_how_many(data, capsys):
    code = main(["data", "check", "--root", str(data), "--sample", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "content: the labels of train 5 of 12, val 4 of 4 images decoded (class values, forms), a seeded sample"
        in out
    )
    main(["data", "check", "--root", str(data), "--sample", "0"])
    assert capsys.readouterr().out.count("content: every image's labels decoded (class values, forms)") == 2
    (line,) = refused_keeping(["data", "check", "--root", str(data), "--sample", "-1"], data, capsys)
    assert "--sample -1: must be >= 0" in line


def test_a_label_changed_after_the_checks_names_the_file_in_training(tmp_path, data, monkeypatch, capsys):
    """The checks passed, then a label changed (or it was outside fit's sample): the read names
    the file instead of ``IndexError: Target 100 is out of bounds``."""
    from fedmtl.federated import preflight

    checked = preflight.check_content

    def then_changed(*args):
        checked(*args)
        _class_100(data)

    monkeypatch.setattr(preflight, "check_content", then_changed)
    config = tiny_config(tmp_path, data, rounds=1)
    capsys.readouterr()
    assert main(["fit", "--config", str(config), "--run_dir", str(tmp_path / "run")]) == 1
    lines = stderr_lines(capsys.readouterr().err)
    path = _pascal(data).semseg_candidates(_first(_pascal(data)))[0]
    assert len(lines) == 1 and lines[0].startswith("error: PASCAL-Context train image "), lines
    assert f"{path}: holds class value 100" in lines[0] and "Traceback" not in lines[0]


# ---------------------------------------------------------------------------- read right


def _same_samples(root: Path, other: Path, name: str, tasks: tuple[str, ...]) -> None:
    """Every sample of both splits is the same tensor out of ``__getitem__`` under both roots."""
    for split in ("train", "val"):
        a = build_dataset(name, root, split, tasks=tasks, train_size=32, seed=3)
        b = build_dataset(name, other, split, tasks=tasks, train_size=32, seed=3)
        for k in range(len(a)):
            x, y = a[k], b[k]
            for key in ("image", *tasks):
                assert torch.equal(x[key], y[key]), (split, k, key)


def _resave(paths, convert) -> None:
    for path in paths:
        convert(Image.open(path)).save(path)


def _ids(layout) -> list[str]:
    return [i for split in ("train", "val") for i in read_split(layout.split_file(split))]


def _as_palette(im: Image.Image) -> Image.Image:
    """A grey class label as a palette png: the indices are the classes, colours arbitrary."""
    out = Image.fromarray(np.asarray(im), "P")
    out.putpalette([c for v in range(256) for c in ((v * 37) % 256, (v * 91) % 256, (v * 53) % 256)])
    return out


def _grey_palette(im: Image.Image) -> Image.Image:
    """A grey intensity label as a palette png whose index is not its grey level (a 2-colour
    palette: index 0 black, index 1 white), as a paint program saves a binary mask."""
    grey = np.asarray(im)
    levels = np.unique(grey)
    out = Image.fromarray(np.searchsorted(levels, grey).astype(np.uint8), "P")
    out.putpalette([c for v in levels for c in (int(v),) * 3])
    return out


def _sixteen_bit(im: Image.Image) -> Image.Image:
    return Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257)


def test_unambiguous_forms_read_as_the_release_form(tmp_path, data, capsys):
    """Palette class labels, RGB re-saved grey labels, a palette intensity label, 16-bit grey
    and opaque-RGBA images: the same tensors as the 8-bit grey / RGB forms, and the check passes."""
    grey = tmp_path / "grey"  # the reference: images in 8-bit grey, the labels as released
    shutil.copytree(data, grey)
    pascal, nyud = _pascal(data), _nyud(data)
    _resave([_nyud(grey).image(i) for i in _ids(nyud)], lambda im: im.convert("L"))
    _resave([nyud.image(i) for i in _ids(nyud)], _sixteen_bit)
    _resave([nyud.semseg(i) for i in _ids(nyud)], lambda im: im.convert("RGB"))
    _resave([nyud.edge(i) for i in _ids(nyud)], lambda im: im.convert("RGB"))
    _resave([next(p for p in pascal.semseg_candidates(i) if p.is_file()) for i in _ids(pascal)], _as_palette)
    _resave([pascal.sal(i) for i in _ids(pascal)], _grey_palette)
    rgb = tmp_path / "rgb"  # PASCAL-Context images are jpegs: opaque RGBA pngs are the other case
    shutil.copytree(data, rgb)
    for i in _ids(pascal):
        Image.open(pascal.image(i)).convert("RGBA").save(_pascal(rgb).image(i).with_suffix(".png"))
        _pascal(rgb).image(i).with_suffix(".png").rename(_pascal(rgb).image(i))
    assert Image.open(nyud.image(_first(nyud))).mode == "I;16"
    assert Image.open(pascal.sal(_first(pascal))).mode == "P"
    _same_samples(data, grey, "nyud", ("semseg", "normals", "edge", "depth"))
    _same_samples(data, grey, "pascal_context", ("semseg", "sal"))
    _same_samples(rgb, data, "pascal_context", ("semseg",))
    for root in (data, rgb):
        assert main(["data", "check", "--root", str(root), "--sample", "0"]) == 0
        assert capsys.readouterr().err == ""


def test_a_sixteen_bit_image_is_scaled_not_clipped(data):
    nyud = _nyud(data)
    path = nyud.image(_first(nyud))
    eight = np.asarray(Image.open(path).convert("L"))
    _sixteen_bit(Image.open(path)).save(path)
    sample = build_dataset("nyud", data, "train", tasks=("depth",), augment=False, train_size=32)._raw(0)
    assert sample["image"].dtype == np.float32 and sample["image"].max() <= 255
    assert np.array_equal(sample["image"], np.repeat(eight[..., None], 3, axis=2).astype(np.float32))


# ---------------------------------------------------------------------------- links


def _broken_folder(root: Path) -> tuple[Path, str]:
    folder = root / "NYUDv2"
    shutil.rmtree(folder)
    folder.symlink_to(root / "elsewhere" / "NYUDv2", target_is_directory=True)
    return (
        folder,
        f"a broken symbolic link (to {root / 'elsewhere' / 'NYUDv2'}, which does not exist)",
    )


def _looping_folder(root: Path) -> tuple[Path, str]:
    folder = root / "NYUDv2"
    shutil.rmtree(folder)
    folder.symlink_to("NYUDv2")
    return folder, "a symbolic link loop (Symlink loop)"


def _looping_file(root: Path) -> tuple[Path, str]:
    path = _nyud(root).image(_first(_nyud(root)))
    path.unlink()
    path.symlink_to(path.name)
    return path, "a symbolic link loop (Symlink loop)"


@pytest.mark.parametrize(
    "damage", [_broken_folder, _looping_folder, _looping_file], ids=lambda f: f.__name__.strip("_")
)
def test_links_that_lead_nowhere_are_named_by_check_and_fit(tmp_path, data, damage, capsys):
    path, reason = damage(data)
    (line,) = refused_keeping(["data", "check", "--root", str(data)], data, capsys)
    assert line.startswith("error: data check found 1 problem(s)") and f"{path}: {reason}" in line
    run_dir = tmp_path / "run"
    lines = fit_refused(tiny_config(tmp_path, data, rounds=1), run_dir, capsys)
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"{path} is {reason}" in lines[0], lines
    assert "Traceback" not in lines[0] and not run_dir.exists()


def test_a_looping_folder_is_refused_before_synthetic_data_is_generated(tmp_path, capsys):
    root = tmp_path / "data"
    root.mkdir()
    (root / "NYUDv2").symlink_to("NYUDv2")
    synth = {"nyud": {"num_train": 4, "num_val": 2, "size": [32, 32]}}
    config = tiny_config(
        tmp_path,
        root,
        rounds=1,
        clients=[{"dataset": "nyud", "tasks": ["semseg"], "batch_size": 2}],
        data={"root": str(root), "train_size": [32, 32], "synth": synth},
    )
    lines = fit_refused(config, tmp_path / "run", capsys)
    assert len(lines) == 1 and f"nyud dataset folder {root / 'NYUDv2'} is a symbolic link loop" in lines[0]
    assert sorted(os.listdir(root)) == ["NYUDv2"]
