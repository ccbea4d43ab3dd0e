"""SIGTERM and SIGINT stop ``fedmtl fit`` at a safe point (fedmtl/federated/stopping.py).

A stopped run exits 128 + the signal's number with one line saying how to continue, its
latest checkpoint complete (a checkpoint is never cut short), and a resume from it gives the
results of a run that was never stopped. Real signals go to real ``fedmtl fit`` processes
once their first checkpoint is published; the paths that must hit an exact moment (a signal
while a checkpoint is written, a signal before training starts) send the signal in-process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmtl.cli import main
from fedmtl.federated import checkpoint
from tests.helpers import TINY_CLIENTS, fit, tiny_config

# The poll sees round 1's checkpoint during round 2, so a stop lands in round 2 or 3: never
# after the last round, which would finish the run instead.
ROUNDS = 4


@pytest.fixture(scope="module")
def uninterrupted(module_dir, data_root) -> tuple[Path, dict]:
    """The scenario's config and the results.json of a run that was never stopped."""
    config = tiny_config(module_dir, data_root, rounds=ROUNDS)
    return config, fit(config, module_dir / "uninterrupted")


def _start(config: Path, run_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``fedmtl fit`` in its own session (so a signal to the group reaches only it), stderr to
    ``out``; returns once the run published its first checkpoint."""
    command = [sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(run_dir)]
    with open(out, "w") as err:
        proc = subprocess.Popen(
            [*command, *extra],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while checkpoint.latest(run_dir) is None:
        assert proc.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.05)
    return proc


def _session_alive(sid: int) -> bool:
    """Whether a process of session ``sid`` (the command and the ranks it launched) remains."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[3]) == sid:
                return True
    return False


def _wait(proc: subprocess.Popen, out: Path) -> list[str]:
    """The exit of ``proc`` and of every process it started; its non-blank stderr lines."""
    try:
        proc.wait(timeout=180)
        deadline = time.monotonic() + 60
        while _session_alive(proc.pid):
            assert time.monotonic() < deadline, "a rank outlived the stopped run"
            time.sleep(0.1)
    finally:
        if _session_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    return [line for line in out.read_text().splitlines() if line.strip()]


def _assert_stopped(lines: list[str], run_dir: Path, name: str, safe: bool = True) -> str:
    """One line says how to continue, naming the latest checkpoint, which is complete; no
    traceback from any rank; at a safe point, no staging folder left. Returns that line."""
    assert not any("Traceback" in line or line.startswith("[rank") for line in lines), lines
    said = [line for line in lines if "resume" in line]
    assert len(said) == 1, lines
    assert said[0].startswith(f"stopped by {name}"), said
    folder = checkpoint.latest(run_dir)
    assert folder is not None
    assert f"checkpoint {folder.name} is complete" in said[0]
    assert "--resume true" in said[0]
    expected = {"server.pt", *(f"client_{i:04d}.pt" for i in range(TINY_CLIENTS))}
    assert expected <= {p.name for p in folder.iterdir()}
    assert not safe or not list((run_dir / "checkpoints").glob("*.tmp"))
    return said[0]


def test_sigterm_stops_at_a_safe_point_keeps_the_wandb_history_and_resumes_identically(
    uninterrupted, tmp_path, data_root
):
    config, results = uninterrupted
    logged = tiny_config(tmp_path, data_root, name="wandb.yaml", rounds=ROUNDS, logger={"wandb": True})
    run_dir = tmp_path / "run"
    proc = _start(logged, run_dir, tmp_path / "stderr")
    os.kill(proc.pid, signal.SIGTERM)  # as `kill PID`, SLURM or Kubernetes
    lines = _wait(proc, tmp_path / "stderr")
    assert proc.returncode == 128 + signal.SIGTERM, lines
    _assert_stopped(lines, run_dir, "SIGTERM")
    # wandb was closed, not killed: its offline file holds the rounds logged before the stop
    # (a killed run leaves only the file's header).
    (history,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert b"train/pascal_context-semseg/loss" in history.read_bytes()

    assert fit(logged, run_dir, "--resume", "true", "--logger.wandb", "false") == results


def test_ctrl_c_stops_at_a_safe_point_and_resumes_identically(uninterrupted, tmp_path):
    config, results = uninterrupted
    run_dir = tmp_path / "run"
    proc = _start(config, run_dir, tmp_path / "stderr")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
    lines = _wait(proc, tmp_path / "stderr")
    assert proc.returncode == 128 + signal.SIGINT, lines
    line = _assert_stopped(lines, run_dir, "SIGINT")
    assert line.endswith(f"--config {config} --run_dir {run_dir} --resume true")

    assert fit(config, run_dir, "--resume", "true") == results


def test_sigterm_to_a_two_process_run_stops_every_rank_with_one_line(uninterrupted, tmp_path):
    config, results = uninterrupted
    run_dir = tmp_path / "run"
    proc = _start(config, run_dir, tmp_path / "stderr", "--devices", "2")
    os.kill(proc.pid, signal.SIGTERM)  # rank 0 only: it passes the signal on to rank 1
    lines = _wait(proc, tmp_path / "stderr")  # every rank has exited
    assert proc.returncode == 128 + signal.SIGTERM, lines
    line = _assert_stopped(lines, run_dir, "SIGTERM")
    assert "--devices 2" in line

    assert fit(config, run_dir, "--resume", "true") == results  # a resume may change devices


def test_a_second_signal_exits_at_once_with_one_line(uninterrupted, tmp_path):
    config, _ = uninterrupted
    run_dir = tmp_path / "run"
    proc = _start(config, run_dir, tmp_path / "stderr")
    # Both signals arrive together: the first asks for a stop, the second ends the process.
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGCONT)
    lines = _wait(proc, tmp_path / "stderr")
    assert proc.returncode == 128 + signal.SIGTERM, lines
    line = _assert_stopped(lines, run_dir, "SIGTERM", safe=False)  # publishing is atomic all the same
    assert "a second signal: exiting now" in line


def test_a_signal_while_a_checkpoint_is_written_stops_after_it(uninterrupted, tmp_path, monkeypatch, capsys):
    """The signal lands inside the publish of round 1: the checkpoint completes, the run stops
    at the end of that round, and the resume matches the run that was never stopped."""
    config, results = uninterrupted
    run_dir = tmp_path / "run"
    publish = checkpoint.publish

    def interrupted(run_dir, round_, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (the main) thread
        return publish(run_dir, round_, *args, **kwargs)

    before = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "publish", interrupted)
        code = main(["fit", "--config", str(config), "--run_dir", str(run_dir)])
    assert code == 128 + signal.SIGTERM
    line = _assert_stopped(capsys.readouterr().err.splitlines(), run_dir, "SIGTERM")
    assert line.startswith(f"stopped by SIGTERM after round 1 of {ROUNDS}; checkpoint round_0001 is complete")
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handlers are gone

    assert fit(config, run_dir, "--resume", "true") == results


def test_a_signal_before_training_stops_at_once(uninterrupted, tmp_path, monkeypatch, capsys):
    from fedmtl.federated import preflight

    config, _ = uninterrupted
    run_dir = tmp_path / "run"
    monkeypatch.setattr(preflight, "check_scenario", lambda cfg: os.kill(os.getpid(), signal.SIGINT))
    before = signal.getsignal(signal.SIGINT)
    code = main(["fit", "--config", str(config), "--run_dir", str(run_dir)])
    assert code == 128 + signal.SIGINT
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "stopped by SIGINT; no checkpoint was written; start again with: fedmtl fit"
    ), lines
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C is pytest's again
