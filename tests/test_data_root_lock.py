"""Issue #36, item 2: one writer per data root, and the data commands' input cases.

Two real processes write one fresh data root: the first is held inside its write (a gate file
says when it may go on, so nothing depends on timing) while the second starts, says it waits
for the first, then goes on as documented. Neither prints a traceback, and ``fedmtl data
check`` passes on the root afterwards. A staging folder is deleted only when its owner is gone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import types
from pathlib import Path

import pytest

from fedmtl.cli import main
from fedmtl.data import rootlock
from fedmtl.synth import generate
from tests.helpers import TINY, fit_refused, refused_keeping, tiny_config

# A fedmtl command whose synthetic generation (after its first chunk's start) or archive
# unpacking (after the first archive) waits until GATE/go exists, once GATE/holding is touched.
GATED = """
import sys, time
from pathlib import Path
import fedmtl.data.prepare as prepare
import fedmtl.synth.generator as generator

gate = Path(sys.argv[1])
chunk, unpack = generator._write_chunk, prepare.unpack

def wait():
    (gate / "holding").touch()
    while not (gate / "go").exists():
        time.sleep(0.05)

def gated_chunk(*args):
    wait()
    return chunk(*args)

def gated_unpack(*args):
    unpack(*args)
    wait()

generator._write_chunk, prepare.unpack = gated_chunk, gated_unpack
from fedmtl.cli import main
sys.argv = ["fedmtl", *sys.argv[2:]]
sys.exit(main(sys.argv[1:]))
"""

SYNTH = ["data", "synth", "--dataset", "nyud", "--num_train", "8", "--num_val", "2", "--size", "[32,32]"]
SYNTH += ["--workers", "1"]
GUARD_S = 240  # against a hung test only: the gate opens by itself then, and the asserts fail


def _popen(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _two_writers(tmp_path: Path, first: list[str], second: list[str]) -> tuple[dict, dict]:
    """Run ``fedmtl FIRST`` held inside its write, then ``fedmtl SECOND`` until it says it
    waits, then let the first go on; both results (rc, out, err, pid, waited)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    holder = _popen([sys.executable, "-c", GATED, str(gate), *first])
    timer = threading.Timer(GUARD_S, (gate / "go").touch)
    timer.start()
    try:
        while not (gate / "holding").exists():
            assert holder.poll() is None, holder.communicate()
            threading.Event().wait(0.05)
        waiter = _popen([sys.executable, "-m", "fedmtl", *second])
        waited = []
        while not waited or "waiting for" not in waited[-1]:
            line = waiter.stderr.readline()
            assert line, f"the second command never waited: {waited}"
            waited.append(line)
        (gate / "go").touch()
        results = []
        for process in (holder, waiter):
            out, err = process.communicate(timeout=GUARD_S)
            results.append({"rc": process.returncode, "out": out, "err": err, "pid": process.pid})
    finally:
        timer.cancel()
        for process in (holder, locals().get("waiter")):
            if process is not None and process.poll() is None:
                process.kill()
    results[1]["err"] = "".join(waited) + results[1]["err"]
    results[1]["waited"] = waited[-1]
    for result in results:
        assert "Traceback" not in result["err"], result["err"]
    return results[0], results[1]


def _assert_names_holder(line: str, holder: dict, command: str) -> None:
    assert f"PID {holder['pid']} on {socket.gethostname()}" in line and command in line, line


def _check_passes(root: Path, capsys, dataset: str = "nyud") -> None:
    capsys.readouterr()
    assert main(["data", "check", "--root", str(root), "--dataset", dataset]) == 0
    capsys.readouterr()


def test_two_synths_into_one_fresh_root_wait_and_leave_a_whole_dataset(tmp_path, capsys):
    """The second synth waits for the first, then finds the dataset there and refuses to write
    over it, as it would had it started later; the root holds the first's dataset, whole."""
    root = tmp_path / "data"
    args = [*SYNTH, "--root", str(root / "NYUDv2")]
    first, second = _two_writers(tmp_path, args, args)
    assert first["rc"] == 0 and f"wrote 8 train + 2 val nyud images to {root / 'NYUDv2'}" in first["out"]
    _assert_names_holder(second["waited"], first, "fedmtl data synth --dataset nyud")
    assert second["rc"] == 1
    (error,) = [line for line in second["err"].splitlines() if line.startswith("error:")]
    assert f"{root / 'NYUDv2'} already holds files" in error and "--overwrite true" in error
    assert sorted(p.name for p in root.iterdir()) == ["NYUDv2"]  # no staging folder, no lock file
    _check_passes(root, capsys)


def test_a_fit_that_generates_waits_for_a_synth_then_uses_its_data(tmp_path, capsys):
    root = tmp_path / "data"
    config = tiny_config(
        tmp_path,
        root,
        clients=[{"dataset": "nyud", "tasks": ["semseg"], "batch_size": 4}],
        rounds=1,
        data={
            **TINY["data"],
            "root": str(root),
            "synth": {"nyud": {"num_train": 8, "num_val": 2, "size": [32, 32]}},
        },
    )
    run_dir = tmp_path / "run"
    first, second = _two_writers(
        tmp_path,
        [*SYNTH, "--root", str(root / "NYUDv2")],
        ["fit", "--config", str(config), "--run_dir", str(run_dir)],
    )
    assert first["rc"] == 0
    _assert_names_holder(second["waited"], first, "fedmtl data synth")
    assert second["rc"] == 0, second["err"][-3000:]
    assert f"using the synthetic nyud data another process wrote in {root / 'NYUDv2'}" in second["err"]
    assert "generating synthetic" not in second["err"]
    assert (run_dir / "results.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["NYUDv2"]
    _check_passes(root, capsys)


def test_two_prepares_of_one_archive_wait_and_the_second_changes_nothing(tmp_path, data_root, capsys):
    archive = tmp_path / "NYUDv2.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data_root / "NYUDv2", arcname="NYUDv2")
    root = tmp_path / "root"
    args = ["data", "prepare", str(archive), "--root", str(root)]
    first, second = _two_writers(tmp_path, args, args)
    assert first["rc"] == 0 and f"{root / 'NYUDv2'}: unpacked " in first["out"]
    _assert_names_holder(second["waited"], first, "fedmtl data prepare")
    assert second["rc"] == 0 and "nothing changed" in second["out"]
    assert sorted(p.name for p in root.iterdir()) == ["NYUDv2"]
    _check_passes(root, capsys)


# --------------------------------------------------------------------------- staging folders


def _staging_of(parent: Path, pid: int, host: str | None = None) -> Path:
    """A generator's staging folder as process ``pid`` on ``host`` leaves it."""
    staging = parent / f".NYUDv2.synth-partial.{host or socket.gethostname()}.{pid}"
    (staging / "gt_sets").mkdir(parents=True)
    (staging / "gt_sets" / "train.txt").write_text("0000001\n")
    owner = {"pid": pid, "host": host or socket.gethostname(), "since": "-", "command": "fedmtl data synth"}
    (staging / ".fedmtl-synth-partial").write_text(json.dumps(owner))
    return staging


def _tiny(root: Path) -> Path:
    return generate("nyud", root, num_train=2, num_val=1, size=(16, 16), workers=1, progress=False)


def test_the_staging_folder_of_a_live_process_is_not_removed(tmp_path):
    """Another process of this host still writing there (it has no lock: an older fedmtl, or a
    filesystem that cannot lock): its folder is left alone, and ours is a folder of our own."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        staging = _staging_of(tmp_path, live.pid)
        _tiny(tmp_path / "NYUDv2")
        assert (staging / "gt_sets" / "train.txt").read_text() == "0000001\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([staging.name, "NYUDv2"])
    finally:
        live.kill()
        live.wait()


def test_the_staging_folder_of_a_dead_process_is_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _staging_of(tmp_path, dead.pid)
    _tiny(tmp_path / "NYUDv2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NYUDv2"]


@pytest.mark.parametrize(
    "owner, locked, gone",
    [
        ({"pid": "this host, running"}, True, False),
        ({"pid": "this host, ended"}, False, True),
        ({"pid": 1234, "host": "another-node"}, True, True),  # its writer would hold the lock
        ({"pid": 1234, "host": "another-node"}, False, False),  # no lock: it cannot be told
        (None, True, True),  # an older fedmtl's marker, which names no owner
        (None, False, False),
    ],
)
def test_an_owner_is_gone_by_its_pid_or_the_lock_never_by_age(owner, locked, gone):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    if owner is not None and isinstance(owner["pid"], str):
        running = owner["pid"].endswith("running")
        owner = {"pid": os.getppid() if running else ended.pid, "host": socket.gethostname()}
    assert rootlock.owner_gone(owner, locked) is gone


def test_a_fit_holding_the_root_generates_without_waiting_for_itself(tmp_path):
    """The lock is re-entrant within a process: the fit holds the data root, and the generator
    it calls takes it again (a second flock on the same file would wait for ever)."""
    from fedmtl.cli import _ensure_data
    from fedmtl.config import SynthConfig

    root = tmp_path / "data"
    data = types.SimpleNamespace(
        synth={"nyud": SynthConfig(num_train=2, num_val=1, size=(16, 16))}, resolved_root=lambda: str(root)
    )
    _ensure_data(types.SimpleNamespace(data=data, clients=[types.SimpleNamespace(dataset="nyud")]))
    assert sorted(p.name for p in root.iterdir()) == ["NYUDv2"]
    assert (root / "NYUDv2" / "gt_sets" / "train.txt").read_text().split() == ["0000001", "0000003"]


# --------------------------------------------------------------------------- input cases


def test_a_synth_root_under_a_regular_file_is_one_line_naming_the_file(tmp_path, capsys):
    blocker = tmp_path / "data"
    blocker.write_text("a file of the user's")
    root = blocker / "NYUDv2"
    (line,) = refused_keeping(["data", "synth", "--dataset", "nyud", "--root", str(root)], tmp_path, capsys)
    assert line == (
        f"error: --root {root} is under {blocker}, which is a file, not a folder: choose another --root, "
        f"or move {blocker} away"
    )


def test_a_prepare_root_under_a_regular_file_is_one_line_naming_the_file(tmp_path, data_root, capsys):
    archive = tmp_path / "NYUDv2.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data_root / "NYUDv2", arcname="NYUDv2")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    root = blocker / "deeper" / "root"
    (line,) = refused_keeping(["data", "prepare", str(archive), "--root", str(root)], tmp_path, capsys)
    assert f"--root {root} is under {blocker}, which is a file" in line and "choose another --root" in line


def test_a_data_root_to_generate_into_under_a_regular_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    synth = {"nyud": {"num_train": 2, "num_val": 1, "size": [16, 16]}}
    root = blocker / "data"
    config = tiny_config(
        tmp_path, root, clients=[TINY["clients"][1]], data={**TINY["data"], "root": str(root), "synth": synth}
    )
    (line,) = fit_refused(config, tmp_path / "run", capsys)
    assert line.startswith(f"error: data.root {root} is under {blocker}, which is a file"), line
    assert "choose another data.root" in line


def test_a_misspelt_data_synth_key_is_refused_naming_it_and_the_valid_keys(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root)
    lines = fit_refused(config, tmp_path / "run", capsys, "--data.synth", '{"nyu": {"num_train": 4}}')
    assert lines == [
        "error: data.synth has no dataset 'nyu': its keys are the datasets to generate, "
        "cityscapes, nyud or pascal_context; correct or remove that key"
    ]


def test_the_config_knows_every_synthetic_dataset():
    from fedmtl.config import SYNTH_DATASETS
    from fedmtl.synth import SYNTH

    assert tuple(SYNTH.names()) == SYNTH_DATASETS


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--num_train", "0", "--num_train must be at least 1, got 0 (the training images to write)"),
        ("--num_train", "-3", "--num_train must be at least 1, got -3"),
        (
            "--num_val",
            "0",
            "--num_val must be at least 1, got 0 (every client is evaluated on the validation",
        ),
        ("--size", "[0,32]", "--size must be [height, width], each at least 8 pixels, got [0, 32]"),
        ("--size", "[32,-1]", "--size must be [height, width], each at least 8 pixels, got [32, -1]"),
        ("--seed", "-1", "--seed must be at least 0, got -1"),
        ("--workers", "0", "--workers must be at least 1, got 0 (or leave it out: one per core)"),
    ],
)
def test_a_non_positive_synth_count_or_size_is_refused_naming_the_option(
    tmp_path, capsys, option, value, message
):
    command = ["data", "synth", "--dataset", "nyud", "--root", str(tmp_path / "NYUDv2"), option, value]
    (line,) = refused_keeping(command, tmp_path, capsys)
    assert line.startswith(f"error: {message}"), line
    assert not any(tmp_path.iterdir())
