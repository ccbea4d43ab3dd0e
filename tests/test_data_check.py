"""``fedmtl data check`` and ``fedmtl data prepare`` on generated data in the real layouts."""

from __future__ import annotations

import io
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedmtl.cli import main
from fedmtl.data.layout import NYUDLayout, PascalContextLayout, read_split
from fedmtl.data.prepare import MARKER, STAGING
from tests.helpers import file_hashes, refused_keeping, tiny_config

FOLDERS = ("NYUDv2", "PASCALContext")


def _run(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """``fedmtl ARGV`` in-process: exit code, stdout, non-blank stderr lines."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def _first(layout, split: str = "train") -> str:
    return read_split(layout.split_file(split))[0]


# ---------------------------------------------------------------------------- check


def test_generated_data_checks_ok_and_notes_the_counts(data_root, capsys):
    code, out, err = _run(["data", "check", "--root", str(data_root)], capsys)
    assert code == 0 and err == []
    lines = out.splitlines()
    assert (
        "dataset         split  images (listed / public)  image  semseg  human_parts  sal    normals  edge"
        in lines
    )
    assert (
        "pascal_context  train  12 / 4,998                12 ok  12 ok   12 ok        12 ok  12 ok    12 ok"
        in lines
    )
    assert "nyud     val    4 / 654                   4 ok   4 ok    4 ok     4 ok   4 ok" in lines
    assert (
        "note: train: 12 images listed, the public release has 4,998 (a subset is usable: fedmtl reads the images listed)"
        in lines
    )
    assert (
        "note: val: 4 images listed, the public release has 654 (a subset is usable: fedmtl reads the images listed)"
        in lines
    )
    assert out.count("ok: every file the loaders read is present, readable and of its image's size") == 2


def test_the_default_root_is_the_one_fit_reads(data_root, capsys, monkeypatch):
    monkeypatch.setenv("FEDMTL_DATA", str(data_root))
    code, out, _ = _run(["data", "check"], capsys)
    assert code == 0 and f"in {data_root / 'NYUDv2'}" in out and f"in {data_root / 'PASCALContext'}" in out


def _missing_split(root: Path) -> tuple[Path, str]:
    path = NYUDLayout(root / "NYUDv2").split_file("val")
    path.unlink()
    return path, "val split file: {path}: missing"


def _missing_image(root: Path) -> tuple[Path, str]:
    layout = PascalContextLayout(root / "PASCALContext")
    path = layout.image(_first(layout))
    path.unlink()
    return path, "train image: {path}: missing"


def _missing_label(root: Path) -> tuple[Path, str]:
    layout = NYUDLayout(root / "NYUDv2")
    path = layout.depth(_first(layout, "val"))
    path.unlink()
    return path, "val depth: {path}: missing"


def _garbage_png(root: Path) -> tuple[Path, str]:
    layout = PascalContextLayout(root / "PASCALContext")
    path = layout.sal(_first(layout))
    path.write_bytes(b"garbage, not a png")
    return path, "train sal: {path}: unreadable (UnidentifiedImageError"


def _truncated_png(root: Path) -> tuple[Path, str]:
    layout = NYUDLayout(root / "NYUDv2")
    path = layout.normals(_first(layout))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path, "train normals: {path}: unreadable ("


def _truncated_jpeg(root: Path) -> tuple[Path, str]:
    layout = PascalContextLayout(root / "PASCALContext")
    path = layout.image(_first(layout, "val"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path, "val image: {path}: unreadable ("


def _garbage_mat(root: Path) -> tuple[Path, str]:
    layout = PascalContextLayout(root / "PASCALContext")
    path = layout.human_parts(_first(layout))
    path.write_bytes(b"\x00" * 300)
    return path, "train human_parts: {path}: unreadable ("


def _garbage_npy(root: Path) -> tuple[Path, str]:
    layout = NYUDLayout(root / "NYUDv2")
    path = layout.depth(_first(layout))
    path.write_bytes(b"not numpy")
    return path, "train depth: {path}: unreadable ("


def _wrong_size(root: Path) -> tuple[Path, str]:
    layout = NYUDLayout(root / "NYUDv2")
    path = layout.edge(_first(layout))
    Image.fromarray(np.zeros((30, 32), dtype=np.uint8)).save(path)
    return path, "train edge: {path}: size 30x32, image 32x32"


def _wrong_size_label_map(root: Path) -> tuple[Path, str]:
    from fedmtl.data.layout import _save_mat

    layout = PascalContextLayout(root / "PASCALContext")
    path = layout.label_map(_first(layout))
    _save_mat(path, {"LabelMap": np.zeros((32, 31), dtype=np.uint16)})
    return path, "train normals: {path}: size 32x31, image 32x32"


@pytest.mark.parametrize(
    "damage",
    [
        _missing_split,
        _missing_image,
        _missing_label,
        _garbage_png,
        _truncated_png,
        _truncated_jpeg,
        _garbage_mat,
        _garbage_npy,
        _wrong_size,
        _wrong_size_label_map,
    ],
)
def test_each_defect_is_named_by_file_and_fails(data, damage, capsys):
    path, problem = damage(data)
    problem = problem.format(path=path)
    (line,) = refused_keeping(["data", "check", "--root", str(data)], data, capsys)
    assert line.startswith("error: data check found 1 problem(s) in ") and problem in line
    _, out, _ = _run(["data", "check", "--root", str(data)], capsys)
    assert f"problems (1):\n  {problem}" in out


def test_a_missing_label_shows_in_its_task_column_only(data, capsys):
    _missing_label(data)
    _, out, _ = _run(["data", "check", "--root", str(data), "--dataset", "nyud"], capsys)
    assert (
        "nyud     val    4 / 654                   4 ok   4 ok    4 ok     4 ok   3 ok / 1 bad"
        in out.splitlines()
    )


def test_the_first_five_problems_are_listed_and_the_rest_counted(data, capsys):
    layout = NYUDLayout(data / "NYUDv2")
    for image_id in read_split(layout.split_file("train")):
        layout.depth(image_id).unlink()
    code, out, err = _run(["data", "check", "--root", str(data)], capsys)
    assert code == 1 and "error: data check found 12 problem(s)" in err[0] and "NYUD-v2 12" in err[0]
    assert "problems (12):" in out and out.count("train depth: ") == 5 and "  ... and 7 more" in out


def test_dataset_nyud_checks_only_nyud(data, capsys):
    _garbage_png(data)  # a PASCAL-Context defect: not looked at
    code, out, err = _run(["data", "check", "--root", str(data), "--dataset", "nyud"], capsys)
    assert code == 0 and err == []
    assert "NYUD-v2 (nyud)" in out and "PASCAL" not in out and "pascal_context" not in out


def test_only_the_datasets_found_are_checked_by_default(data, capsys):
    shutil.rmtree(data / "PASCALContext")
    code, out, _ = _run(["data", "check", "--root", str(data)], capsys)
    assert code == 0 and "pascal_context" not in out
    code, out, err = _run(["data", "check", "--root", str(data), "--dataset", "pascal_context"], capsys)
    assert code == 1 and f"dataset folder: {data / 'PASCALContext'}: missing" in err[0]


def test_a_dataset_folder_given_as_root_is_checked(data_root, capsys):
    code, out, _ = _run(["data", "check", "--root", str(data_root / "NYUDv2")], capsys)
    assert code == 0 and "nyud     train  12 / 795" in out and "pascal_context" not in out


def test_a_missing_root_and_an_unknown_dataset_are_one_line(tmp_path, data_root, capsys):
    (line,) = refused_keeping(["data", "check", "--root", str(tmp_path / "nowhere")], tmp_path, capsys)
    assert f"data root {tmp_path / 'nowhere'} not found" in line and "fedmtl data prepare" in line
    (line,) = refused_keeping(
        ["data", "check", "--root", str(data_root), "--dataset", "coco"], tmp_path, capsys
    )
    assert "unknown dataset 'coco'; known: cityscapes, nyud, pascal_context" in line


def test_fit_on_incomplete_data_points_to_the_check(tmp_path, data, capsys):
    NYUDLayout(data / "NYUDv2").split_file("val").unlink()
    config = tiny_config(tmp_path, data)
    command = ["fit", "--config", str(config), "--run_dir", str(tmp_path / "run")]
    (line,) = refused_keeping(command, tmp_path, capsys)
    assert "nyud validation split not found" in line
    assert f"check it with: fedmtl data check --root {data}" in line
    assert "the archives linked from the public FedHCA² README (innovator-zero/FedHCA2)" in line


def test_fit_with_a_missing_label_file_points_to_the_check(tmp_path, data, capsys):
    _missing_label(data)
    config = tiny_config(tmp_path, data)
    command = ["fit", "--config", str(config), "--run_dir", str(tmp_path / "run")]
    (line,) = refused_keeping(command, tmp_path, capsys)
    assert "depth label not found" in line and f"fedmtl data check --root {data}" in line


# ---------------------------------------------------------------------------- prepare


def _tar(path: Path, entries: dict[str, Path]) -> Path:
    """A tar archive (compressed by the name's suffix) holding each folder under its name."""
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    with tarfile.open(path, mode) as tar:
        for name, folder in entries.items():
            tar.add(folder, arcname=name)
    return path


def _zip(path: Path, entries: dict[str, Path]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, folder in entries.items():
            for file in sorted(folder.rglob("*")):
                zf.write(file, f"{name}/{file.relative_to(folder).as_posix()}")
    return path


@pytest.fixture
def archives(tmp_path, data_root) -> dict[str, Path]:
    """PASCALContext/ as a .tar.gz, NYUDv2/ as a .zip, both in one .tar and in one .zip."""
    folders = {name: data_root / name for name in FOLDERS}
    out = tmp_path / "archives"
    out.mkdir()
    return {
        "tgz": _tar(out / "PASCALContext.tar.gz", {"PASCALContext": folders["PASCALContext"]}),
        "zip": _zip(out / "NYUDv2.zip", {"NYUDv2": folders["NYUDv2"]}),
        "tar": _tar(out / "both.tar", folders),
        "both.zip": _zip(out / "both.zip", folders),
    }


def _prepare(archive_paths, root: Path, capsys) -> tuple[int, str, list[str]]:
    return _run(["data", "prepare", *map(str, archive_paths), "--root", str(root)], capsys)


@pytest.mark.parametrize("which", [("tgz", "zip"), ("tar",), ("both.zip",)])
def test_prepare_unpacks_checks_and_a_second_run_changes_nothing(
    tmp_path, data_root, archives, which, capsys
):
    root = tmp_path / "root"
    code, out, err = _prepare([archives[w] for w in which], root, capsys)
    assert code == 0 and err == [], err
    assert sorted(p.name for p in root.iterdir()) == list(FOLDERS)  # no staging folder left
    for name in FOLDERS:
        assert file_hashes(root / name) == file_hashes(data_root / name)
        assert f"{root / name}: unpacked " in out
    assert "pascal_context  train  12 / 4,998" in out and "nyud     train  12 / 795" in out
    before = file_hashes(root)
    code, out, err = _prepare([archives[w] for w in which], root, capsys)
    assert code == 0 and err == []
    assert file_hashes(root) == before and sorted(p.name for p in root.iterdir()) == list(FOLDERS)
    assert "nothing changed: every file of the archives is already in the root" in out
    assert f"{root / 'NYUDv2'}: nothing changed, its" in out


def test_prepare_adds_missing_files_to_an_existing_dataset(tmp_path, data_root, archives, capsys):
    root = tmp_path / "root"
    _prepare([archives["zip"]], root, capsys)
    layout = NYUDLayout(root / "NYUDv2")
    layout.depth(_first(layout)).unlink()
    code, out, _ = _prepare([archives["zip"]], root, capsys)
    assert code == 0 and "added 1 files" in out
    assert file_hashes(root / "NYUDv2") == file_hashes(data_root / "NYUDv2")


def test_an_existing_different_file_is_named_and_nothing_is_written(tmp_path, archives, capsys):
    root = tmp_path / "root"
    split = NYUDLayout(root / "NYUDv2").split_file("train")
    split.parent.mkdir(parents=True)
    split.write_text("0000001\n")
    (line,) = refused_keeping(["data", "prepare", str(archives["tar"]), "--root", str(root)], root, capsys)
    assert f"{split} already exists with other content than in {archives['tar']}" in line
    assert "never overwrites" in line
    assert sorted(p.name for p in root.iterdir()) == ["NYUDv2"]  # PASCALContext/ was not written either


def test_archives_that_disagree_are_refused(tmp_path, data_root, archives, capsys):
    other = tmp_path / "other"
    shutil.copytree(data_root / "NYUDv2", other)
    (other / "gt_sets" / "val.txt").write_text("0000002\n")
    second = _tar(tmp_path / "archives" / "other.tar", {"NYUDv2": other})
    root = tmp_path / "root"
    root.mkdir()
    (line,) = refused_keeping(
        ["data", "prepare", str(archives["zip"]), str(second), "--root", str(root)], root, capsys
    )
    assert f"{root / 'NYUDv2' / 'gt_sets' / 'val.txt'} differs between the archives" in line
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("kind", ["truncated tgz", "corrupt zip"])
def test_a_corrupt_archive_leaves_the_root_unchanged(tmp_path, archives, kind, capsys):
    source = archives["tgz"] if kind == "truncated tgz" else archives["both.zip"]
    broken = tmp_path / ("broken.tar.gz" if kind == "truncated tgz" else "broken.zip")
    content = bytearray(source.read_bytes())
    if kind == "truncated tgz":
        content = content[: len(content) // 2]
    else:  # flip bytes in the middle of the compressed data: the CRC check fails
        middle = len(content) // 2
        content[middle : middle + 64] = bytes(b ^ 0xFF for b in content[middle : middle + 64])
    broken.write_bytes(bytes(content))
    root = tmp_path / "root"
    root.mkdir()
    (line,) = refused_keeping(["data", "prepare", str(broken), "--root", str(root)], tmp_path, capsys)
    assert f"{broken} cannot be unpacked" in line and "corrupt or incomplete" in line
    assert list(root.iterdir()) == []  # no dataset folder, no staging folder
    (line,) = refused_keeping(
        ["data", "prepare", str(broken), "--root", str(tmp_path / "new")], tmp_path, capsys
    )
    assert not (tmp_path / "new").exists()  # a root it created is removed again


def _tar_with(path: Path, member: tarfile.TarInfo, content: bytes = b"x") -> Path:
    with tarfile.open(path, "w") as tar:
        if member.isreg():
            member.size = len(content)
            tar.addfile(member, io.BytesIO(content))
        else:
            tar.addfile(member)
    return path


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (tarfile.TarInfo("NYUDv2/../../evil.txt"), "has a '..' component"),
        (tarfile.TarInfo("/tmp/evil.txt"), "has an absolute path"),
        (_link("NYUDv2/evil", "../../outside"), "points outside the archive"),
        (_link("NYUDv2/evil", "/etc/passwd"), "points outside the archive"),
    ],
)
def test_unsafe_tar_members_are_refused(tmp_path, member, reason, capsys):
    archive = _tar_with(tmp_path / "evil.tar", member)
    root = tmp_path / "a" / "b" / "root"
    root.mkdir(parents=True)
    (line,) = refused_keeping(["data", "prepare", str(archive), "--root", str(root)], tmp_path / "a", capsys)
    assert reason in line and str(archive) in line
    assert list(root.iterdir()) == [] and not (tmp_path / "a" / "evil.txt").exists()


def test_unsafe_zip_members_are_refused(tmp_path, capsys):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("NYUDv2/gt_sets/train.txt", "1\n")
        zf.writestr("../evil.txt", "x")
    root = tmp_path / "root"
    (line,) = refused_keeping(["data", "prepare", str(archive), "--root", str(root)], tmp_path, capsys)
    assert "member '../evil.txt' has a '..' component" in line
    assert not root.exists() and not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize(
    ("names", "ignored"),
    [
        ({"PASCALContext": "release/PASCALContext", "NYUDv2": "release/NYUDv2"}, None),  # one wrapper folder
        ({"PASCALContext": "PASCAL_MT", "NYUDv2": "NYUD_MT"}, None),  # recognised by their split files
        ({"NYUDv2": "."}, None),  # the dataset folder's contents at the top
        ({"NYUDv2": "NYUDv2", "README.txt": "README.txt"}, "README.txt"),  # other entries are listed
    ],
)
def test_where_the_contents_of_an_archive_go(tmp_path, data_root, names, ignored, capsys):
    archive = tmp_path / "layout.tar"
    with tarfile.open(archive, "w") as tar:
        for folder, arcname in names.items():
            if folder == "README.txt":
                (tmp_path / folder).write_text("hello\n")
                tar.add(tmp_path / folder, arcname=arcname)
            elif arcname == ".":
                for entry in sorted((data_root / folder).iterdir()):
                    tar.add(entry, arcname=entry.name)
            else:
                tar.add(data_root / folder, arcname=arcname)
    root = tmp_path / "root"
    code, out, err = _prepare([archive], root, capsys)
    assert code == 0, err
    expected = sorted(n for n in names if n != "README.txt")
    assert sorted(p.name for p in root.iterdir()) == expected
    for name in expected:
        assert file_hashes(root / name) == file_hashes(data_root / name)
    if ignored:
        assert f"not unpacked (not part of a dataset): {archive}: {ignored}" in out


def test_an_archive_without_a_dataset_is_refused(tmp_path, capsys):
    archive = _tar_with(tmp_path / "other.tar", tarfile.TarInfo("photos/cat.jpg"))
    (line,) = refused_keeping(
        ["data", "prepare", str(archive), "--root", str(tmp_path / "root")], tmp_path, capsys
    )
    assert "holds no PASCALContext/ or NYUDv2/ dataset (it holds: photos/cat.jpg)" in line
    assert not (tmp_path / "root").exists()


def test_a_missing_or_unknown_archive_or_a_dataset_folder_as_root_is_one_line(tmp_path, archives, capsys):
    (line,) = refused_keeping(["data", "prepare", str(tmp_path / "no.tgz")], tmp_path, capsys)
    assert f"archive {tmp_path / 'no.tgz'} not found" in line
    (line,) = refused_keeping(
        ["data", "prepare", str(archives["tar"]), "--root", str(tmp_path / "NYUDv2")], tmp_path, capsys
    )
    assert f"--root {tmp_path / 'NYUDv2'} is a dataset folder" in line and f"--root {tmp_path})" in line
    (tmp_path / "notes.txt").write_text("not an archive")
    (line,) = refused_keeping(["data", "prepare", str(tmp_path / "notes.txt")], tmp_path, capsys)
    assert "is not a tar or zip archive" in line


def test_an_interrupted_prepare_leaves_nothing_and_a_leftover_is_removed(
    tmp_path, archives, monkeypatch, capsys
):
    from fedmtl.data import prepare

    root = tmp_path / "root"
    root.mkdir()

    def interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(prepare, "locate", interrupted)  # after the archive was unpacked
        with pytest.raises(KeyboardInterrupt):
            main(["data", "prepare", str(archives["tar"]), "--root", str(root)])
    assert list(root.iterdir()) == []
    # a prepare killed outright leaves its staging folder (with the marker): the next one removes it
    (root / STAGING / "0" / "NYUDv2").mkdir(parents=True)
    (root / STAGING / MARKER).write_text("")
    code, out, _ = _prepare([archives["tar"]], root, capsys)
    assert code == 0 and "removed the staging folder an interrupted prepare left" in out
    assert sorted(p.name for p in root.iterdir()) == list(FOLDERS)


def test_a_folder_with_the_staging_name_but_no_marker_is_not_deleted(tmp_path, archives, capsys):
    root = tmp_path / "root"
    (root / STAGING).mkdir(parents=True)
    (root / STAGING / "mine.txt").write_text("keep me")
    (line,) = refused_keeping(["data", "prepare", str(archives["tar"]), "--root", str(root)], root, capsys)
    assert f"{root / STAGING} is in the way" in line


def test_prepared_data_that_fails_the_check_exits_non_zero(tmp_path, data_root, capsys):
    broken = tmp_path / "NYUDv2"
    shutil.copytree(data_root / "NYUDv2", broken)
    depth = NYUDLayout(broken).depth(_first(NYUDLayout(broken)))
    depth.unlink()
    archive = _tar(tmp_path / "nyud.tar", {"NYUDv2": broken})
    code, out, err = _prepare([archive], tmp_path / "root", capsys)
    assert code == 1 and len(err) == 1
    assert err[0].startswith("error: data prepare: unpacked, but the check found 1 problem(s)")
    assert "train depth: " in out
    assert (tmp_path / "root" / "NYUDv2").is_dir()  # unpacked: the files it has are kept
