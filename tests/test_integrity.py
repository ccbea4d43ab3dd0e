"""Issue #26 item 5: what a run reads back is checked before it is trusted.

A damaged checkpoint file is named and the run falls back to the checkpoint before it (or is
refused when there is none); a NaN state is refused; a NaN depth label is one error naming
the file, at training and in ``fedmtl data check``; a resume on other data is refused naming
what differs, and the same data under another root resumes and is recorded in config.yaml.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedmtl.cli import _run_parser, main
from fedmtl.data.layout import NYUDLayout, read_split
from fedmtl.federated import checkpoint, packing, preflight
from fedmtl.federated.integrity import CHECKSUMS, verify
from fedmtl.federated.store import safe_load
from tests.helpers import file_hashes, read_results, refused_keeping, run_cli, tiny_config


def _fit_args(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path]:
    """A finished 2-round run (config, run_dir) with both rounds' checkpoints; tests copy it."""
    from tests.helpers import fit

    config = tiny_config(module_dir, data_root, rounds=2)
    fit(config, module_dir / "run")
    assert [p.name for p in checkpoint.round_folders(module_dir / "run")] == ["round_0001", "round_0002"]
    return config, module_dir / "run"


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    shutil.copytree(finished[1], tmp_path / "run")
    return tmp_path / "run"


def _flip(path: Path, count: int = 64) -> None:
    """``count`` bytes in the middle of ``path`` inverted, as by a bad disk or a stray write."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + count] = bytes(b ^ 0xFF for b in raw[middle : middle + count])
    path.write_bytes(bytes(raw))


def _client_file(run_dir: Path, round_: int = 2, client: int = 1) -> Path:
    return run_dir / "checkpoints" / f"round_{round_:04d}" / f"client_{client:04d}.pt"


# ---------------------------------------------------------------------------- checkpoints


def test_every_checkpoint_folder_lists_its_files_sha256(finished):
    folder = checkpoint.latest(finished[1])
    lines = (folder / CHECKSUMS).read_text().splitlines()
    assert [line.split()[1] for line in lines] == [
        "client_0000.pt",
        "client_0001.pt",
        "client_0002.pt",
        "server.pt",
    ]
    for line in lines:
        digest, name = line.split()
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    assert not list(folder.glob(".*"))  # the ranks' per-file digests were collected and removed


def test_a_damaged_checkpoint_file_is_named_and_validate_and_resume_fall_back(finished, run_dir, capsys):
    """Before: the 64 bytes loaded as NaN and the run resumed with exit 0 and other results."""
    damaged = _client_file(run_dir)
    _flip(damaged)
    damaged_bytes = damaged.read_bytes()
    skipped = (
        f"checkpoint round_0002 skipped: {damaged} does not match the sha256 recorded in SHA256SUMS when it "
        "was written (it changed on disk); falling back to round_0001, the newest intact checkpoint"
    )

    code, err = run_cli(["validate", "--run_dir", str(run_dir)], capsys)
    assert code == 0
    assert err == [f"validate: {skipped}"]
    assert read_results(run_dir)["rounds"] == 2  # the run's own results stay
    assert json.loads((run_dir / "validate_results.json").read_text())["rounds"] == 1  # round 1's model

    code, err = run_cli(_fit_args(finished[0], run_dir, "--resume", "true"), capsys)
    assert code == 0
    assert err[0] == f"resume: {skipped}"
    assert "resume: continuing after round 1" in err[1]
    # Round 2 was trained again from round 1: the results are the uninterrupted run's.
    assert read_results(run_dir)["clients"] == read_results(finished[1])["clients"]
    assert verify(damaged.parent) is None  # republished whole
    # The damaged folder is kept aside, byte for byte, never deleted; no older checkpoint is lost.
    kept = damaged.parent.with_name("round_0002.superseded") / damaged.name
    assert kept.read_bytes() == damaged_bytes
    assert (run_dir / "checkpoints" / "round_0001" / "server.pt").is_file()


@pytest.mark.parametrize("command", ["resume", "validate"])
def test_a_damaged_checkpoint_without_a_previous_one_is_refused(finished, run_dir, capsys, command):
    shutil.rmtree(run_dir / "checkpoints" / "round_0001")
    damaged = _client_file(run_dir, client=0)
    _flip(damaged)
    argv = (
        _fit_args(finished[0], run_dir, "--resume", "true")
        if command == "resume"
        else ["validate", "--run_dir", str(run_dir)]
    )
    (line,) = refused_keeping(argv, run_dir, capsys)
    assert line == (
        f"error: {damaged} does not match the sha256 recorded in SHA256SUMS when it was written (it changed "
        "on disk), and no earlier checkpoint is intact to fall back to; nothing was changed. Restore the "
        "file from a copy, or start a new run with another --run_dir"
    )


@pytest.mark.parametrize("command", ["resume", "validate"])
def test_a_checkpoint_holding_nan_is_refused_even_with_a_valid_checksum(finished, run_dir, capsys, command):
    """A NaN written into the file and its sha256 recomputed: the checksum cannot tell, the
    finite check does (and does not fall back: the run's own writer never writes one)."""
    path = _client_file(run_dir)
    state = safe_load(path)
    state["model"] = {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state["model"].items()
    }
    torch.save(packing.pack(state), path)
    sums = path.parent / CHECKSUMS
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums.write_text(
        "".join(
            f"{digest}  {path.name}\n" if line.endswith(path.name) else line + "\n"
            for line in sums.read_text().splitlines()
        )
    )
    assert verify(path.parent) is None
    argv = (
        _fit_args(finished[0], run_dir, "--resume", "true")
        if command == "resume"
        else ["validate", "--run_dir", str(run_dir)]
    )
    (line,) = refused_keeping(argv, run_dir, capsys)
    assert line.startswith(f"error: {path}: client 1's state holds NaN/inf (")
    assert "so it cannot be resumed or evaluated; nothing was changed" in line
    assert f"Move round_0002 out of {path.parent.parent}" in line


# ---------------------------------------------------------------------------- labels


def test_a_nan_depth_label_is_one_error_at_training_and_in_data_check(tmp_path, data, capsys, monkeypatch):
    """Before: it trained with loss nan, and data check said ok."""
    layout = NYUDLayout(data / "NYUDv2")
    last = read_split(layout.split_file("train"))[-1]
    depth = layout.depth(last)
    np.save(depth, np.full(np.load(depth).shape, np.nan, dtype=np.float32))
    before = file_hashes(data)

    code, err = run_cli(["data", "check", "--root", str(data)], capsys)
    assert code == 1
    (line,) = err
    assert line.startswith("error: data check found 1 problem(s)")
    assert f"first: train depth: {depth}: holds NaN/inf (1,024 of 1,024 values)" in line

    config = tiny_config(tmp_path, data, rounds=1)
    code, err = run_cli(_fit_args(config, tmp_path / "checked"), capsys)  # fit's own content check
    assert code == 1
    assert err[0].startswith(f"error: NYUD-v2 train depth: {depth}: holds NaN/inf (1,024 of 1,024 values)")
    assert not (tmp_path / "checked").exists() or not any((tmp_path / "checked").iterdir())

    # A file damaged after that check (or outside its sample) is named when training reads it.
    monkeypatch.setattr(preflight, "check_content", lambda cfg, specs: None)
    for workers in ("0", "1"):  # read in the training process, and in a DataLoader worker
        code, err = run_cli(
            _fit_args(config, tmp_path / f"run{workers}", "--data.num_workers", workers), capsys
        )
        assert code == 1
        assert err == [
            f"error: NYUD-v2 train depth label of image {last!r} holds NaN/inf (1,024 of 1,024 values): "
            f"{depth}. Replace the file, or remove the id from the split file"
        ]
    assert file_hashes(data) == before


# ---------------------------------------------------------------------------- data of a resume


def _drop_last_training_image(data: Path) -> str:
    layout = NYUDLayout(data / "NYUDv2")
    ids = read_split(layout.split_file("train"))
    layout.split_file("train").write_text("".join(f"{i}\n" for i in ids[:-1]))
    for path in (layout.image(ids[-1]), layout.semseg(ids[-1]), layout.depth(ids[-1])):
        path.unlink()
    return "nyud train split (gt_sets/train.txt) lists 11 images, the run's 12"


def _resize_a_label(data: Path) -> str:
    """The same pixels saved uncompressed: only the size tells."""
    layout = NYUDLayout(data / "NYUDv2")
    path = layout.semseg(read_split(layout.split_file("train"))[4])
    before = path.stat().st_size
    with Image.open(path) as im:
        im.load()
    im.save(path, compress_level=0)
    relative = path.relative_to(data).as_posix()
    return f"1 file(s) differ in size: {relative} ({before} -> {path.stat().st_size} bytes)"


@pytest.mark.parametrize("change", [_drop_last_training_image, _resize_a_label])
def test_a_resume_on_other_data_is_refused_naming_what_differs(finished, run_dir, data, capsys, change):
    """Before: it ran on silently (56 of 78 values differed) and config.yaml kept the old root."""
    differs = change(data)
    before = file_hashes(data)
    args = _fit_args(finished[0], run_dir, "--resume", "true", "--data.root", str(data))
    (line,) = refused_keeping(args, run_dir, capsys)
    assert file_hashes(data) == before
    assert line.startswith(f"error: resume: the data under data.root {data} differs from the data this run")
    assert differs in line
    assert "Point --data.root at the run's data" in line


def test_the_same_data_under_another_root_resumes_and_config_yaml_records_it(tmp_path, data, capsys):
    config = tiny_config(tmp_path, data, rounds=1)
    run_dir = tmp_path / "run"
    assert main(_fit_args(config, run_dir)) == 0
    moved = tmp_path / "moved"
    data.rename(moved)
    before = file_hashes(run_dir)
    saved = (run_dir / "config.yaml").read_text()

    code, err = run_cli(_fit_args(config, run_dir, "--resume", "true", "--data.root", str(moved)), capsys)
    assert code == 0, err
    assert err == [
        "resume: continuing after round 1 from " + str(run_dir / "checkpoints" / "round_0001"),
        "resume: the run finished its 1 rounds; its results:",
    ]
    after = file_hashes(run_dir)
    assert {k for k in before if before[k] != after[k]} == {"config.yaml"}  # nothing else changed
    assert _run_parser().parse_path(str(run_dir / "config.yaml")).data.root == str(moved)
    assert (run_dir / "config.yaml").read_text() == saved.replace(str(data), str(moved))
    # validate reads config.yaml: the old root is gone, the recorded one works
    assert run_cli(["validate", "--run_dir", str(run_dir)], capsys)[0] == 0


def test_validate_on_other_data_is_refused_naming_config_yaml(run_dir, data, data_root, capsys):
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(f"root: {data_root}", f"root: {data}"))
    assert _run_parser().parse_path(str(config)).data.root == str(data)
    differs = _resize_a_label(data)
    (line,) = refused_keeping(["validate", "--run_dir", str(run_dir)], run_dir, capsys)
    assert line.startswith(f"error: validate: the data under data.root {data} differs")
    assert differs in line and f"Point data.root in {config} at the run's data" in line


def test_a_run_written_before_checksums_and_fingerprints_still_resumes(finished, run_dir, capsys):
    for path in [*run_dir.glob("checkpoints/round_*/SHA256SUMS"), run_dir / "data_fingerprint.json"]:
        path.unlink()
    code, err = run_cli(_fit_args(finished[0], run_dir, "--resume", "true"), capsys)
    assert code == 0
    assert err[0] == (
        f"resume: {run_dir} has no data_fingerprint.json (the run is older than fedmtl's data check): the "
        f"data under {_run_parser().parse_path(str(finished[0])).data.root} is not compared with the run's"
    )
    assert "the run finished its 2 rounds" in err[-1]


def test_importing_integrity_does_not_import_checkpoint():
    """integrity holds the checksums that checkpoint uses; the resume checks that read
    checkpoints live in resume_checks, so there is no import circle between the two."""
    script = (
        "import sys, fedmtl.federated.integrity; "
        "print('fedmtl.federated.checkpoint' in sys.modules, 'fedmtl.federated.resume_checks' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],  # this checkout's fedmtl
    )
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr
