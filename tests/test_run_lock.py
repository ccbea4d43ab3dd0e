"""Issue #26, item 1: one writer per run directory.

A real ``fedmtl fit`` subprocess holds a run directory while it sits in round 2 (its round-1
checkpoint written); every second command on that directory, through the CLI in this
process, is refused with one line naming the holder and changes no byte there. The lock is
an OS lock: SIGKILL frees it, and the run resumes.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmtl.cli import main
from fedmtl.federated import runlock
from tests.helpers import file_hashes, fit, read_results, refused_keeping, tiny_config

# ``fedmtl fit`` whose clients wait at the start of round 2 until GATE/go exists (no sleeps to
# tune: the test says when the holder may go on).
HOLDER = """
import sys, time
from pathlib import Path
from fedmtl.cli import main
from fedmtl.federated.rounds import Round

gate = Path(sys.argv[1])
train = Round.train_client

def waiting(self, *args):
    if self.number == 2:
        (gate / "in_round_2").touch()
        while not (gate / "go").exists():
            time.sleep(0.05)
    return train(self, *args)

Round.train_client = waiting
sys.argv = ["fedmtl", *sys.argv[2:]]
sys.exit(main(sys.argv[1:]))
"""


def _fit_args(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


def _start_holder(tmp_path: Path, config: Path, run_dir: Path) -> tuple[subprocess.Popen, Path]:
    """A fit subprocess stopped in round 2 of ``run_dir``, holding its lock."""
    gate = tmp_path / "gate"
    gate.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(gate), *_fit_args(config, run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300  # a guard against a hung test, not a measurement
    while not (gate / "in_round_2").exists():
        if process.poll() is not None:
            pytest.fail(f"the holder ended early: {process.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the holder never reached round 2")
        time.sleep(0.1)
    return process, gate


def _holder_info(run_dir: Path) -> dict:
    return json.loads((run_dir / runlock.LOCK_FILE).read_text())


def test_a_second_process_on_a_held_run_dir_is_refused_naming_the_holder(
    tmp_path, data_root, capsys, monkeypatch
):
    config = tiny_config(tmp_path, data_root, rounds=2)
    run_dir = tmp_path / "run"
    holder, gate = _start_holder(tmp_path, config, run_dir)
    try:
        info = _holder_info(run_dir)
        assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
        assert info["command"].startswith("fedmtl fit --config")
        assert (run_dir / "checkpoints" / "round_0001").is_dir()  # it has written: there is something to lose
        second = {
            "fit": _fit_args(config, run_dir),
            "resume": _fit_args(config, run_dir, "--resume", "true"),
            "overwrite": _fit_args(config, run_dir, "--overwrite", "true"),
            "other seed": _fit_args(config, run_dir, "--overwrite", "true", "--seed", "1"),
            "validate": ["validate", "--run_dir", str(run_dir)],
            "test": ["test", "--run_dir", str(run_dir)],
        }
        for name, command in second.items():
            (line,) = refused_keeping(command, run_dir, capsys)
            assert line.startswith(f"error: run_dir {run_dir} is in use by another fedmtl process"), name
            assert f"PID {holder.pid} on {socket.gethostname()}" in line and "fedmtl fit --config" in line
        # Two processes that both pass the early check (started at the same moment): the lock
        # taken before the first write is what refuses the second, after its slow checks.
        monkeypatch.setattr(runlock, "check_free", lambda run_dir: None)
        for command in (second["resume"], second["overwrite"]):
            (line,) = refused_keeping(command, run_dir, capsys)
            assert f"in use by another fedmtl process (PID {holder.pid}" in line
        assert holder.poll() is None  # the holder ran on untouched
    finally:
        (gate / "go").touch()
        holder.wait(timeout=300)
    assert holder.returncode == 0, holder.stderr.read()[-3000:]
    assert read_results(run_dir)["rounds"] == 2
    assert (run_dir / runlock.LOCK_FILE).read_text() == ""  # released: an idle run's lock file is empty


def test_the_lock_dies_with_its_process(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, rounds=2)
    run_dir = tmp_path / "run"
    holder, _ = _start_holder(tmp_path, config, run_dir)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=60)
    assert _holder_info(run_dir)["pid"] == holder.pid  # what it wrote stays, but binds no one
    runlock.check_free(run_dir)
    assert fit(config, run_dir, "--resume", "true")["rounds"] == 2
    assert (run_dir / runlock.LOCK_FILE).read_text() == ""


def test_ranks_other_than_the_leader_do_not_lock(tmp_path, data_root):
    """Fabric re-runs the command for rank 1 while rank 0 holds the lock: it must not take it."""
    config = tiny_config(tmp_path, data_root, rounds=1)
    run_dir = tmp_path / "two"
    done = subprocess.run(
        [sys.executable, "-m", "fedmtl", *_fit_args(config, run_dir, "--devices", "2")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in use by another" not in done.stderr
    assert read_results(run_dir)["rounds"] == 1


def test_the_probe_creates_nothing_and_a_held_lock_is_named_in_process(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runlock.check_free(run_dir)
    assert list(run_dir.iterdir()) == []  # no lock file appears just by looking
    with runlock.hold(run_dir, "fit"):
        assert _holder_info(run_dir)["pid"] == os.getpid()
        with pytest.raises(runlock.RunDirBusy, match=f"PID {os.getpid()} on"):
            runlock.check_free(run_dir)
        with pytest.raises(runlock.RunDirBusy, match=f"PID {os.getpid()} on"), runlock.hold(run_dir):
            pass
    runlock.check_free(run_dir)


def test_validate_on_a_read_only_run_dir_is_one_line(tmp_path, data_root, capsys, monkeypatch):
    """As root a chmod does not make a folder read-only, so the filesystem's answer is simulated."""
    run_dir = tmp_path / "run"
    fit(tiny_config(tmp_path, data_root, rounds=1), run_dir)
    (run_dir / runlock.LOCK_FILE).unlink()  # as if copied from a place without one
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(runlock.LOCK_FILE) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(runlock.os, "open", read_only)
    (line,) = refused_keeping(["validate", "--run_dir", str(run_dir)], run_dir, capsys)
    assert f"run_dir {run_dir} is read-only" in line and "writable folder" in line
    assert file_hashes(run_dir) and not (run_dir / "validate_results.json").exists()


def test_main_refuses_a_busy_run_dir_before_reading_the_scenario(tmp_path, data_root, capsys):
    """The early check costs nothing: a busy run directory is named before data or model checks."""
    config = tiny_config(tmp_path, data_root, rounds=1)
    run_dir = tmp_path / "run"
    with runlock.hold(run_dir, "fit"):
        capsys.readouterr()
        assert main(_fit_args(config, run_dir, "--data.root", str(tmp_path / "no data"))) != 0
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert "in use by another fedmtl process" in line
