"""Past one machine, on Fabric's own multi-node launch (issue #27, item 3).

``torchrun --nnodes 2 --nproc-per-node 1`` started twice on this machine (node ranks 0 and 1,
rendezvous on 127.0.0.1, gloo) runs ``fedmtl fit --num_nodes 2 --devices 1``: two "nodes" of
one CPU process each, sharing the run directory as nodes share a file system. The results
(and every client's checkpointed state) are bit-identical to one process on one CPU thread,
and so are those of a two-node run killed (SIGKILL, every process of both launches) after
round 1's checkpoint and resumed with the same two-node launch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fedmtl.federated import checkpoint
from tests.helpers import fit, read_results, tiny_config

ROUNDS = 2
TIMEOUT = 300  # seconds, per launch: generous, the machine's two cores are shared
_MARK = "FEDMTL_TEST_MULTINODE"  # in the environment of every process of one launch


def _has_torchrun() -> bool:
    import torch.distributed

    return (
        torch.distributed.is_available()
        and torch.distributed.is_gloo_available()
        and importlib.util.find_spec("torch.distributed.run") is not None
    )


pytestmark = pytest.mark.skipif(
    not _has_torchrun(), reason="torchrun (torch.distributed.run, gloo) is missing"
)


@pytest.fixture(scope="module")
def one_process(module_dir, data_root) -> tuple[Path, Path]:
    """The tiny scenario's config and a one-process, one-thread run of it (``tiny_config``
    sets ``accelerator: cpu``, ``cpu_threads: 1``)."""
    config = tiny_config(module_dir, data_root, rounds=ROUNDS)
    run_dir = module_dir / "one_process"
    fit(config, run_dir)
    return config, run_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodes:
    """``torchrun`` for node ranks 0 and 1 of a two-node, one-process-per-node launch of
    ``fedmtl fit`` on 127.0.0.1; every process it starts carries a mark in its environment
    (torchrun's workers run in sessions of their own, so a process group does not hold them)."""

    def __init__(self, config: Path, run_dir: Path, logs: Path, *extra: str) -> None:
        self.mark = uuid.uuid4().hex
        self.logs = [logs / f"{run_dir.name}-node{rank}.log" for rank in (0, 1)]
        port = _free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", _MARK: self.mark}
        self.procs: list[subprocess.Popen] = []
        for rank, log in enumerate(self.logs):
            command = [
                sys.executable, "-m", "torch.distributed.run",  # torchrun
                "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(run_dir),
                "--num_nodes", "2", "--devices", "1", "--accelerator", "cpu", "--cpu_threads", "1",
                *extra,
            ]  # fmt: skip
            with open(log, "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs)

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self) -> None:
        """Both launches end within TIMEOUT, exit 0."""
        deadline = time.monotonic() + TIMEOUT
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the two-node run did not end in {TIMEOUT} s\n{self.output()}")
        codes = [p.returncode for p in self.procs]
        assert codes == [0, 0], f"exit codes {codes}\n{self.output()}"

    def _marked(self) -> list[int]:
        """Every live process of this launch (torchrun, its workers and what they started)."""
        needle = f"{_MARK}={self.mark}".encode()
        pids = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry.name}/environ").read_bytes()
                state = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if needle in environ.split(b"\0") and state != "Z":
                pids.append(int(entry.name))
        return pids

    def kill(self) -> None:
        """SIGKILL every process of both launches and wait until none is left."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while pids := self._marked():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert time.monotonic() < deadline, f"processes {pids} outlived SIGKILL"
            time.sleep(0.05)
        for proc in self.procs:
            proc.wait(timeout=60)


def _checksums(run_dir: Path) -> str:
    """SHA256SUMS of the run's latest checkpoint: every client's state and the server's."""
    folder = checkpoint.latest(run_dir)
    assert folder is not None, f"no complete checkpoint in {run_dir}"
    return (folder / "SHA256SUMS").read_text()


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    got, want = read_results(run_dir), read_results(reference)
    assert got["clients"] == want["clients"]
    assert got == want
    assert checkpoint.latest(run_dir).name == checkpoint.latest(reference).name
    assert _checksums(run_dir) == _checksums(reference)


def test_two_nodes_on_torchrun_give_the_results_of_one_process(one_process, module_dir):
    config, reference = one_process
    run_dir = module_dir / "two_nodes"
    launch = TwoNodes(config, run_dir, module_dir)
    try:
        launch.wait()
    finally:
        launch.kill()
    _assert_same_run(run_dir, reference)


def test_two_nodes_killed_after_round_one_resume_to_the_results_of_one_process(one_process, module_dir):
    config, reference = one_process
    run_dir = module_dir / "two_nodes_killed"
    launch = TwoNodes(config, run_dir, module_dir)
    try:
        deadline = time.monotonic() + TIMEOUT
        while checkpoint.latest(run_dir) is None:
            assert launch.alive(), f"the two-node run ended before its first checkpoint\n{launch.output()}"
            assert time.monotonic() < deadline, f"no checkpoint after {TIMEOUT} s\n{launch.output()}"
            time.sleep(0.02)
    finally:
        launch.kill()
    # The kill landed in round 2: round 1 is the latest checkpoint and the run did not finish.
    assert checkpoint.latest(run_dir).name == "round_0001", launch.output()
    assert not (run_dir / "results.json").exists()

    resumed = TwoNodes(config, run_dir, module_dir, "--resume", "true")
    try:
        resumed.wait()
    finally:
        resumed.kill()
    _assert_same_run(run_dir, reference)
