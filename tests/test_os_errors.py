"""The operating system saying no, other than with a full disk (tests/test_disk_full.py): a
file-size limit, permission denied, a read-only file system, too many open files, a symbolic
link loop, a file where a folder must be. Each is one ``error:`` line naming the path, the
cause and the fix, at the phase it happens (setup, training, checkpoint, report, validate);
nothing of the user's is lost, no partial or temporary file is left, and a resume once the
cause is gone ends as an uninterrupted run. Files a command replaces are replaced whole.

A file-size limit (RLIMIT_FSIZE) and the open-file limit (RLIMIT_NOFILE) are real, set in
this process and lifted again; permissions and read-only disks are injected (the suite runs
as root, which neither stops), at the call that opens the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedmtl import files
from fedmtl.cli import main
from fedmtl.federated import checkpoint, store
from tests.helpers import file_hashes, fit, fit_killed_in_round, read_results, tiny_config


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path, dict]:
    """The tiny scenario's config, a finished run of it and its results."""
    config = tiny_config(module_dir, data_root)
    run_dir = module_dir / "finished"
    return config, run_dir, fit(config, run_dir)


def _run(command: list[str], capsys) -> tuple[int, list[str]]:
    """``fedmtl COMMAND`` in-process: its exit code and its non-blank stderr lines."""
    capsys.readouterr()
    code = main(command)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _error_line(lines: list[str]) -> str:
    """The one ``error:`` line, and no traceback."""
    assert not any("Traceback" in line for line in lines), lines
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines
    return errors[0]


def _leftovers(folder: Path) -> list[Path]:
    """Temporary files and staging folders: what a failed write must not leave."""
    return [p for p in folder.rglob("*") if ".tmp" in p.name]


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """``ulimit -f``: this process writes no file past ``limit`` bytes (EFBIG; Python ignores
    SIGXFSZ), until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _refusing_open(module, match: str, code: int):
    """``module``'s ``open``, but opening a path containing ``match`` fails with ``code``, as a
    read-only disk or a folder of another user does."""

    def refusing(file, *args, **kwargs):
        if match in str(file):
            raise OSError(code, os.strerror(code), str(file))
        return open(file, *args, **kwargs)

    return refusing


# ---------------------------------------------------------------------------- checkpoints


def test_a_file_size_limit_on_a_checkpoint_keeps_the_last_one_and_the_resume_equals_an_uninterrupted_run(
    finished, tmp_path, monkeypatch, capsys
):
    config, full, results = finished
    run_dir = tmp_path / "run"
    fit_killed_in_round(config, run_dir, monkeypatch, 2)  # round 1's checkpoint, published
    kept = file_hashes(run_dir / "checkpoints" / "round_0001")
    smallest = min(p.stat().st_size for p in checkpoint.latest(full).glob("client_*.pt"))
    # torch.save fails as a RuntimeError of its C++ writer here; the EFBIG behind it is said.
    with _file_size_limit(smallest // 2):
        code, lines = _run(
            ["fit", "--config", str(config), "--run_dir", str(run_dir), "--resume", "true"], capsys
        )
    assert code == 1
    assert _error_line(lines) == (
        f"error: file too large writing {run_dir}/checkpoints/round_0002.tmp/client_0000.pt. Nothing partial "
        "was kept and checkpoint round_0001 is complete: raise the file-size limit (ulimit -f), then continue "
        f"with: fedmtl fit --config {config} --run_dir {run_dir} --resume true"
    )
    assert _leftovers(run_dir) == []
    assert file_hashes(run_dir / "checkpoints" / "round_0001") == kept
    assert checkpoint.latest(run_dir) == run_dir / "checkpoints" / "round_0001"

    assert fit(config, run_dir, "--resume", "true") == results


def test_a_checkpoint_denied_then_a_read_only_checkpoints_folder_on_resume_then_a_resume_that_ends_the_run(
    finished, tmp_path, monkeypatch, capsys
):
    config, _, results = finished
    run_dir = tmp_path / "run"
    command = ["fit", "--config", str(config), "--run_dir", str(run_dir)]
    with monkeypatch.context() as patch:  # a client file of round 2 (a folder of another user)
        patch.setattr(
            store, "open", _refusing_open(store, "round_0002.tmp/.client_0001", errno.EACCES), raising=False
        )
        code, lines = _run(command, capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: permission denied writing {run_dir}/checkpoints/round_0002.tmp/client_0001.pt. Nothing partial "
        "was kept and checkpoint round_0001 is complete: give this user access to it (ls -ld shows its owner "
        f"and mode), then continue with: fedmtl fit --config {config} --run_dir {run_dir} --resume true"
    )
    assert _leftovers(run_dir) == []

    kept = file_hashes(run_dir / "checkpoints")
    with monkeypatch.context() as patch:  # checkpoints/ on a read-only file system: the resume says so
        patch.setattr(store, "open", _refusing_open(store, "/checkpoints/", errno.EROFS), raising=False)
        code, lines = _run([*command, "--resume", "true"], capsys)
    assert code == 1
    line = _error_line(lines)
    assert line.startswith(
        f"error: read-only file system writing {run_dir}/checkpoints/round_0002.tmp/client_"
    )
    assert (
        "checkpoint round_0001 is complete: make the file system writable (it is mounted read-only), then "
        in line
    )
    assert file_hashes(run_dir / "checkpoints") == kept
    assert _leftovers(run_dir) == []

    assert fit(config, run_dir, "--resume", "true") == results


# ---------------------------------------------------------------------------- setup


def test_too_many_open_files_when_the_run_is_locked_is_one_line(finished, tmp_path, monkeypatch, capsys):
    config, _, _ = finished
    run_dir = tmp_path / "run"
    from fedmtl.federated import runlock

    real_open = os.open

    def exhausted(path, *args, **kwargs):
        if str(path).endswith(".fedmtl.lock") and len(args) and args[0] & os.O_CREAT:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(runlock.os, "open", exhausted)
    code, lines = _run(["fit", "--config", str(config), "--run_dir", str(run_dir)], capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: too many open files: {run_dir}/.fedmtl.lock. Nothing partial was kept and no checkpoint was "
        f"written: raise the open-file limit (ulimit -n), then start again with: fedmtl fit --config {config} "
        f"--run_dir {run_dir}"
    )


def test_a_symbolic_link_loop_or_a_file_in_the_run_dir_path_is_one_line(finished, tmp_path, capsys):
    config, full, _ = finished
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a_file").write_text("mine\n")
    before = file_hashes(tmp_path)
    code, lines = _run(["fit", "--config", str(config), "--run_dir", str(tmp_path / "loop" / "run")], capsys)
    assert code == 1
    line = _error_line(lines)
    assert line.startswith(f"error: too many levels of symbolic links: {tmp_path / 'loop'}"), line
    assert "fix the symbolic link in that path that leads back to itself" in line

    code, lines = _run(
        ["fit", "--config", str(config), "--run_dir", str(tmp_path / "a_file" / "run")], capsys
    )
    assert code == 1
    assert f"{tmp_path / 'a_file'} is a file, not a folder" in _error_line(lines)

    code, lines = _run(["report", str(full), "--output", str(tmp_path / "loop" / "table.md")], capsys)
    assert code == 1
    assert _error_line(lines).startswith(f"error: too many levels of symbolic links: {tmp_path / 'loop'}")
    assert file_hashes(tmp_path) == before


# ---------------------------------------------------------------------------- validate


def test_validate_that_cannot_read_the_checkpoint_or_write_its_results_is_one_line(
    finished, monkeypatch, capsys
):
    _, run_dir, _ = finished
    before = file_hashes(run_dir)
    latest = checkpoint.latest(run_dir)
    load = torch.load

    def denied(path, *args, **kwargs):
        if str(path).endswith("client_0001.pt"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return load(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "load", denied)
        code, lines = _run(["validate", "--run_dir", str(run_dir)], capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: permission denied: {latest / 'client_0001.pt'}; give this user access to it (ls -ld shows "
        "its owner and mode), then run the command again"
    )
    with monkeypatch.context() as patch:
        patch.setattr(
            store, "open", _refusing_open(store, "validate_results.json", errno.EROFS), raising=False
        )
        code, lines = _run(["validate", "--run_dir", str(run_dir)], capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: read-only file system writing {run_dir / 'validate_results.json'}; make the file system "
        "writable (it is mounted read-only), then run the command again"
    )
    assert file_hashes(run_dir) == before  # the lock file is empty again
    assert _leftovers(run_dir) == []


# ---------------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def reportable(finished, module_dir) -> Path:
    """The finished run's results as a report reads them, its zero mIoU (a tiny run's) made
    non-zero so that it can be its own baseline."""
    _, full, _ = finished
    run = module_dir / "reportable"
    run.mkdir()
    for name in ("results.json", "metrics.csv", "config.yaml"):
        shutil.copy(full / name, run / name)
    results = read_results(run)
    for client in results["clients"].values():
        for metric in client["metrics"].values():
            for key, value in metric.items():
                metric[key] = value or 0.5
    (run / "results.json").write_text(json.dumps(results))
    return run


def _report(run: Path, folder: Path, *extra: str) -> list[str]:
    return [
        "report",
        str(run),
        "--output",
        str(folder / "table.md"),
        "--curves",
        str(folder / "curves.png"),
        *extra,
    ]


def test_a_report_under_a_file_size_limit_leaves_the_files_it_would_replace(reportable, tmp_path, capsys):
    assert main(_report(reportable, tmp_path)) == 0
    before = file_hashes(tmp_path)
    table, curves = (tmp_path / "table.md").stat().st_size, (tmp_path / "curves.png").stat().st_size
    assert table < curves
    with _file_size_limit(table // 2):
        code, lines = _run(_report(reportable, tmp_path, "--overwrite", "true"), capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: file too large writing {tmp_path / 'table.md'}; raise the file-size limit (ulimit -f), then run "
        "the command again"
    )
    assert file_hashes(tmp_path) == before  # byte for byte, and no temporary file
    with _file_size_limit((table + curves) // 2):  # the table fits, the figure does not
        code, lines = _run(_report(reportable, tmp_path, "--overwrite", "true"), capsys)
    assert code == 1
    assert _error_line(lines).startswith(f"error: file too large writing {tmp_path / 'curves.png'}; ")
    assert file_hashes(tmp_path) == before


def test_a_report_that_is_denied_or_out_of_files_says_so_in_one_line(
    reportable, tmp_path, monkeypatch, capsys
):
    (tmp_path / "table.md").write_text("my table\n")
    with monkeypatch.context() as patch:
        patch.setattr(files, "open", _refusing_open(files, "table.md", errno.EACCES), raising=False)
        code, lines = _run(_report(reportable, tmp_path, "--overwrite", "true"), capsys)
    assert code == 1
    assert _error_line(lines) == (
        f"error: permission denied writing {tmp_path / 'table.md'}; give this user access to it (ls -ld shows its "
        "owner and mode), then run the command again"
    )
    assert (tmp_path / "table.md").read_text() == "my table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]

    # Every descriptor this process may open is in use: the report's first open says so.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    free = os.dup(0)  # the lowest free descriptor: with the limit there, no file opens
    os.close(free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))
    try:
        code, lines = _run(_report(reportable, tmp_path, "--overwrite", "true"), capsys)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert code == 1
    line = _error_line(lines)
    assert line.startswith("error: too many open files"), line
    assert line.endswith("raise the open-file limit (ulimit -n), then run the command again")
    assert (tmp_path / "table.md").read_text() == "my table\n"


def test_a_report_killed_while_it_writes_leaves_the_previous_figure_and_no_partial_file(
    reportable, tmp_path, capsys
):
    assert main(_report(reportable, tmp_path)) == 0
    before = file_hashes(tmp_path)
    # SIGKILL in the middle of writing the figure, after a part of it is written.
    script = (
        "import os, signal, sys\n"
        "from matplotlib.figure import Figure\n"
        "def killed(self, f, **kwargs):\n"
        "    f.write(b'part of a png'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "Figure.savefig = killed\n"
        "from fedmtl.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *_report(reportable, tmp_path, "--overwrite", "true")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    visible = {k: v for k, v in file_hashes(tmp_path).items() if not k.startswith(".")}
    assert visible == before  # the table replaced whole (same bytes), the figure as it was
    # The killed process's hidden temporary file goes with the next report that writes there.
    assert main(_report(reportable, tmp_path, "--overwrite", "true")) == 0
    assert file_hashes(tmp_path) == before
