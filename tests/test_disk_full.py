"""A full disk (or a quota, an I/O error) while a run writes: one ``error:`` line naming the
file and the space, the last complete checkpoint kept, no partial file left behind, and a
resume on the still-full disk says so the same way.

On a real small disk (a tmpfs, where the tests may mount one) and, everywhere, with a writer
made to fail at a chosen file.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from fedmtl.cli import main
from fedmtl.federated import checkpoint, runlog, store
from tests.helpers import file_hashes, fit, read_results, tiny_config


@pytest.fixture(scope="module")
def uninterrupted(module_dir, data_root) -> tuple[Path, dict, int]:
    """The tiny scenario's config, the results of a run that had room, and the bytes of one
    checkpoint of it."""
    config = tiny_config(module_dir, data_root)
    results = fit(config, module_dir / "uninterrupted")
    folder = checkpoint.latest(module_dir / "uninterrupted")
    return config, results, sum(p.stat().st_size for p in folder.iterdir())


def _fit(config: Path, run_dir: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    """``fedmtl fit`` in-process: its exit code and its non-blank stderr lines."""
    capsys.readouterr()
    code = main(["fit", "--config", str(config), "--run_dir", str(run_dir), *extra])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _error_line(lines: list[str]) -> str:
    """The one ``error:`` line, and no traceback (nor logging's ``--- Logging error ---``)."""
    assert not any("Traceback" in line or "Logging error" in line for line in lines), lines
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines
    return errors[0]


def _rows(run_dir: Path) -> list[str]:
    """metrics.csv's rows but the timings (which differ from run to run)."""
    return [row for row in (run_dir / "metrics.csv").read_text().splitlines() if ",time/" not in row]


def _leftovers(run_dir: Path) -> list[Path]:
    """Temporary files and staging folders: what a failed write must not leave."""
    return [p for p in run_dir.rglob("*") if ".tmp" in p.name]


# ---------------------------------------------------------------------------- a real small disk


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A tmpfs mounted at ``tmp_path/disk`` (resized with ``mount -o remount,size=``); skipped
    where mounting is not permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _resize(disk: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def _fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 2**16)
                f.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_a_disk_that_fills_keeps_the_last_checkpoint_and_resumes_once_freed(
    uninterrupted, small_disk, capsys
):
    config, results, one_checkpoint = uninterrupted
    # Room for round 1's checkpoint and half of round 2's.
    _resize(small_disk, int(1.5 * one_checkpoint) + 2**20)
    run_dir = small_disk / "run"
    code, lines = _fit(config, run_dir, capsys)
    assert code == 1
    line = _error_line(lines)
    assert f"error: no space left on device writing {run_dir}/checkpoints/round_0002.tmp/client_" in line
    assert "it needs about" in line and "free there" in line
    assert (
        f"checkpoint round_0001 is complete: free space, then continue with: fedmtl fit --config {config}"
        in line
    )
    assert line.endswith(f"--run_dir {run_dir} --resume true")
    assert _leftovers(run_dir) == []
    assert checkpoint.resumable(run_dir) == (run_dir / "checkpoints" / "round_0001", None)

    # Still full, to the last byte: the resume says so in one line and changes no file.
    filler = _fill(small_disk)
    before = file_hashes(run_dir)
    code, lines = _fit(config, run_dir, capsys, "--resume", "true")
    assert code == 1
    line = _error_line(lines)
    written = re.match(r"error: no space left on device writing (?:into )?(\S+)", line)
    assert written and Path(written[1]).is_relative_to(run_dir), line  # the first file it writes
    assert {k: v for k, v in file_hashes(run_dir).items() if k in before} == before
    assert _leftovers(run_dir) == []

    filler.unlink()
    _resize(small_disk, 4 * one_checkpoint)
    code, lines = _fit(config, run_dir, capsys, "--resume", "true")
    assert code == 0, lines
    assert read_results(run_dir) == results


# ---------------------------------------------------------------------------- a writer made to fail


def test_a_checkpoint_file_that_cannot_be_written_leaves_the_last_checkpoint_as_it_was(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    config, results, _ = uninterrupted
    run_dir = tmp_path / "run"
    save = torch.save
    kept: dict[str, str] = {}

    def full(obj, f, *args, **kwargs):
        if "round_0002.tmp" in str(f.name) and "client_0001" in str(f.name):
            kept.update(file_hashes(run_dir / "checkpoints" / "round_0001"))
            f.write(b"\0" * 4096)  # a part written, as a disk filling mid-file does
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, f, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", full)
        code, lines = _fit(config, run_dir, capsys)
        assert code == 1
        line = _error_line(lines)
        path = run_dir / "checkpoints" / "round_0002.tmp" / "client_0001.pt"
        assert line.startswith(f"error: no space left on device writing {path} (it needs about ")
        assert _leftovers(run_dir) == []
        assert kept and file_hashes(run_dir / "checkpoints" / "round_0001") == kept
        assert checkpoint.latest(run_dir) == run_dir / "checkpoints" / "round_0001"

        # The disk is still full: the resume redoes round 2 and fails the same way, in one
        # line; the checkpoint is untouched and metrics.csv holds the same rows (but timings).
        before, rows = file_hashes(run_dir), _rows(run_dir)
        code, lines = _fit(config, run_dir, capsys, "--resume", "true")
        assert code == 1
        assert _error_line(lines).startswith(f"error: no space left on device writing {path}")
        after = file_hashes(run_dir)
        assert {k: after.get(k) for k in before if k != "metrics.csv"} == {
            k: v for k, v in before.items() if k != "metrics.csv"
        }
        assert _rows(run_dir) == rows
        assert _leftovers(run_dir) == []

    code, lines = _fit(config, run_dir, capsys, "--resume", "true")
    assert code == 0, lines
    assert read_results(run_dir) == results


class _FailingOs:
    """The ``os`` module, but the ``write`` or ``fsync`` number ``at`` (from 1) to a file named
    ``name`` fails with ``code``; a failing ``write`` first writes half of what it was given,
    as a disk that fills mid-file does. ``seen``: that file's bytes just before the failure."""

    def __init__(self, name: str, code: int, at: int = 1) -> None:
        self.name, self.code, self.at, self.calls, self.seen = name, code, at, 0, None

    def __getattr__(self, attr: str):
        return getattr(os, attr)

    def _fails(self, fd: int) -> bool:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if self.name not in path:
            return False
        self.calls += 1
        if self.calls == self.at:
            self.seen = Path(path).read_bytes()
        return self.calls == self.at

    def write(self, fd: int, data) -> int:
        if self._fails(fd):
            os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(self.code, os.strerror(self.code))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self._fails(fd):
            raise OSError(self.code, os.strerror(self.code))
        os.fsync(fd)


def test_rows_that_cannot_be_appended_leave_metrics_csv_as_it_was(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    config, results, _ = uninterrupted
    run_dir = tmp_path / "run"
    failing = _FailingOs("metrics.csv", errno.EDQUOT, at=2)  # round 2's rows
    with monkeypatch.context() as patch:
        patch.setattr(runlog, "os", failing)
        code, lines = _fit(config, run_dir, capsys)
    assert code == 1
    line = _error_line(lines)
    assert line.startswith(f"error: disk quota exceeded writing {run_dir / 'metrics.csv'} (it needs about ")
    assert "checkpoint round_0001 is complete: free space (quota), then continue with" in line
    assert (run_dir / "metrics.csv").read_bytes() == failing.seen  # round 1's rows, whole
    assert _leftovers(run_dir) == []

    code, lines = _fit(config, run_dir, capsys, "--resume", "true")
    assert code == 0, lines
    assert read_results(run_dir) == results


def test_a_first_write_that_fails_leaves_no_file_and_says_to_start_again(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    config, results, _ = uninterrupted
    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(runlog, "os", _FailingOs("metrics.csv", errno.ENOSPC))  # round 1's rows
        code, lines = _fit(config, run_dir, capsys)
    assert code == 1
    line = _error_line(lines)
    assert line.startswith(f"error: no space left on device writing {run_dir / 'metrics.csv'}")
    assert not (run_dir / "metrics.csv").exists()
    assert line.endswith(
        f"no checkpoint was written: free space, then start again with: fedmtl fit --config "
        f"{config} --run_dir {run_dir} --overwrite true"
    )

    code, lines = _fit(config, run_dir, capsys, "--overwrite", "true")  # the command it gives
    assert code == 0, lines
    assert read_results(run_dir) == results


def test_results_that_cannot_be_written_are_written_by_the_resume(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    config, results, _ = uninterrupted
    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(store, "os", _FailingOs("results.json", errno.EIO))
        code, lines = _fit(config, run_dir, capsys)
    assert code == 1
    line = _error_line(lines)
    assert line.startswith(f"error: input/output error writing {run_dir / 'results.json'}. Nothing partial")
    assert "checkpoint round_0003 is complete: check the disk, then continue with" in line
    assert not (run_dir / "results.json").exists()
    assert _leftovers(run_dir) == []

    before = file_hashes(run_dir)
    code, lines = _fit(config, run_dir, capsys, "--resume", "true")  # trains nothing
    assert code == 0, lines
    assert read_results(run_dir) == results
    assert {k: v for k, v in file_hashes(run_dir).items() if k in before} == before
