"""Issue #36: a run is resumed and evaluated only under the config it was written under.

Every checkpoint records the config the run computes with (its ``server.pt``); a resume,
``validate`` and ``test`` compare it (and config.yaml) with theirs before loading a state and
name the first difference. A resume without ``--config`` uses the run's own. A config file
with a repeated key is refused; a checkpoint whose file does not load and whose SHA256SUMS is
gone is skipped like one whose checksums fail. Several processes or nodes started with
different configs are refused before the first round, and a rank killed with SIGKILL ends the
others with one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from fedmtl.federated import checkpoint
from tests.helpers import TINY_BACKBONE, file_hashes, read_results, refused_keeping, run_cli, tiny_config


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path]:
    """A finished 2-round run (config, run_dir) with both rounds' checkpoints; tests copy it."""
    from tests.helpers import fit

    config = tiny_config(module_dir, data_root, rounds=2)
    fit(config, module_dir / "run")
    return config, module_dir / "run"


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    shutil.copytree(finished[1], tmp_path / "run")
    return tmp_path / "run"


def _fit(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


def _edit_config(run_dir: Path, change) -> None:
    """The run's config.yaml changed by ``change(dict)``."""
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    change(saved)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))


# ---------------------------------------------------------------------------- the recorded config


def test_every_checkpoint_records_the_config_it_computes_with(finished):
    for folder in checkpoint.round_folders(finished[1]):
        recorded = checkpoint.recorded_config(folder)
        assert recorded["seed"] == 0 and recorded["rounds"] == 2
        assert [g["dataset"] for g in recorded["clients"]] == ["pascal_context", "nyud"]
        assert "run_dir" not in recorded and "root" not in recorded["data"]  # where it ran: not recorded


def test_a_resume_whose_config_yaml_was_lost_refuses_another_seed(finished, run_dir, tmp_path, capsys):
    """Before: accepted silently, and results.json reported a seed round 1 never used."""
    (run_dir / "config.yaml").unlink()
    (run_dir / "checkpoints" / "round_0002").rename(run_dir / "checkpoints" / "away")  # round 2 to train
    (run_dir / "checkpoints" / "latest").write_text("round_0001")
    other = tiny_config(tmp_path, yaml.safe_load(finished[0].read_text())["data"]["root"], rounds=2, seed=1)
    (line,) = refused_keeping(_fit(other, run_dir, "--resume", "true"), run_dir, capsys)
    folder = run_dir / "checkpoints" / "round_0001"
    assert line.startswith(
        f"error: resume: this config differs from the config checkpoint {folder} was written under "
        "(recorded in its server.pt) in what the run computes: seed: 0 -> 1. Resume with the run's values"
    )
    # With the run's own values it resumes, restores config.yaml and ends as the run did.
    code, err = run_cli(_fit(finished[0], run_dir, "--resume", "true"), capsys)
    assert code == 0, err
    assert read_results(run_dir)["clients"] == read_results(finished[1])["clients"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 0


def test_validate_after_the_client_groups_were_reordered_names_them(run_dir, capsys):
    """Before: ``Error(s) in loading state_dict`` from one architecture's state in another's model."""
    _edit_config(run_dir, lambda c: c["clients"].reverse())
    (line,) = refused_keeping(["validate", "--run_dir", str(run_dir)], run_dir, capsys)
    assert line.startswith(
        f"error: validate: {run_dir / 'config.yaml'} differs from the config checkpoint "
        f"{run_dir / 'checkpoints' / 'round_0002'} was written under (recorded in its server.pt) in what the "
        "run computes: clients[0].dataset: 'pascal_context' -> 'nyud'; "
    )
    assert "clients[0].tasks: ['semseg', 'sal'] -> ['semseg', 'depth']" in line
    assert "Restore the run's own config.yaml" in line


@pytest.mark.parametrize("command", ["validate", "test"])
def test_validate_refuses_an_edited_seed_or_architecture(run_dir, capsys, command):
    _edit_config(run_dir, lambda c: c.update(seed=1, model={**c["model"], "backbone": "resnet18"}))
    (line,) = refused_keeping([command, "--run_dir", str(run_dir)], run_dir, capsys)
    assert f"error: {command}: " in line
    assert f"model.backbone: '{TINY_BACKBONE}' -> 'resnet18'; seed: 0 -> 1" in line


# ---------------------------------------------------------------------------- no --config


def test_a_resume_without_config_uses_the_runs_config_yaml(finished, run_dir, capsys):
    """Before: ``Parser key "clients": ... required``."""
    code, err = run_cli(["fit", "--run_dir", str(run_dir), "--resume", "true"], capsys)
    assert code == 0, err
    assert err[0] == f"resume: no --config given: using the run's {run_dir / 'config.yaml'}"
    assert "the run finished its 2 rounds" in err[-1]


def test_a_resume_without_config_or_config_yaml_uses_the_checkpoints(finished, run_dir, capsys):
    (run_dir / "config.yaml").unlink()
    root = yaml.safe_load(finished[0].read_text())["data"]["root"]
    code, err = run_cli(["fit", "--run_dir", str(run_dir), "--resume", "true", "--data.root", root], capsys)
    assert code == 0, err
    assert err[0].startswith(
        f"resume: no --config given and no {run_dir / 'config.yaml'}: using the config recorded in "
        f"{run_dir / 'checkpoints' / 'round_0002'}"
    )
    assert "the run finished its 2 rounds" in err[-1]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 0  # restored


def test_validate_without_config_yaml_uses_the_checkpoints(finished, run_dir, capsys, monkeypatch):
    (run_dir / "config.yaml").unlink()
    monkeypatch.setenv("FEDMTL_DATA", yaml.safe_load(finished[0].read_text())["data"]["root"])
    code, err = run_cli(["validate", "--run_dir", str(run_dir)], capsys)
    assert code == 0, err
    assert err[0] == (
        f"validate: {run_dir / 'config.yaml'} not found: using the config recorded in checkpoint "
        f"{run_dir / 'checkpoints' / 'round_0002'}"
    )
    assert (run_dir / "validate_results.json").is_file()


def test_a_resume_without_any_config_is_one_line(tmp_path, capsys):
    for run_dir in (tmp_path / "absent", tmp_path / "empty"):
        if run_dir.name == "empty":
            run_dir.mkdir()
        (line,) = refused_keeping(["fit", "--run_dir", str(run_dir), "--resume", "true"], tmp_path, capsys)
        held = "does not exist" if run_dir.name == "absent" else "holds no config.yaml and no checkpoint"
        assert line == (
            f"error: fit --resume true without --config needs the run's config: {run_dir} {held}; pass it "
            "with --config (the scenario file the run was started with)"
        )
    (line,) = refused_keeping(["validate", "--run_dir", str(tmp_path / "empty")], tmp_path, capsys)
    assert line == (
        f"error: `fedmtl validate` needs the run's config: {tmp_path / 'empty'} holds no config.yaml and no "
        "checkpoint; --run_dir must be the folder a `fedmtl fit` run wrote"
    )


# ---------------------------------------------------------------------------- duplicate keys


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("rounds: 2\nseed: 0\nrounds: 3\n", "rounds", (1, 3)),
        ("data:\n  train_size: [32, 32]\n  train_size: [64, 64]\n", "train_size", (2, 3)),
        (
            "clients:\n- dataset: nyud\n  tasks: [depth]\n  batch_size: 2\n  batch_size: 4\n",
            "batch_size",
            (4, 5),
        ),
    ],
    ids=["top", "nested", "client-group"],
)
def test_a_key_repeated_in_a_config_file_is_refused_naming_it(tmp_path, capsys, text, key, lines):
    """Before: accepted silently, the last value winning."""
    config = tmp_path / "dup.yaml"
    config.write_text(text)
    (line,) = refused_keeping(_fit(config, tmp_path / "run"), tmp_path, capsys)
    assert line == (
        f"error: config file {config}: key {key!r} appears twice in one mapping (lines {lines[0]} and "
        f"{lines[1]}); YAML would keep the last silently: keep one"
    )


# ---------------------------------------------------------------------------- no SHA256SUMS


@pytest.mark.parametrize("command", ["resume", "validate"])
def test_a_truncated_file_without_sha256sums_falls_back_to_the_previous_checkpoint(
    finished, run_dir, capsys, command
):
    """Before: the resume stopped on the file that does not load."""
    for sums in run_dir.glob("checkpoints/round_*/SHA256SUMS"):
        sums.unlink()
    damaged = run_dir / "checkpoints" / "round_0002" / "client_0001.pt"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    argv = (
        _fit(finished[0], run_dir, "--resume", "true")
        if command == "resume"
        else ["validate", "--run_dir", str(run_dir)]
    )
    code, err = run_cli(argv, capsys)
    assert code == 0, err
    skipped = [line for line in err if "skipped" in line]
    assert len(skipped) == 1
    assert skipped[0].startswith(f"{command}: checkpoint round_0002 skipped: {damaged} is corrupt, truncated")
    assert skipped[0].endswith(
        "and the folder has no SHA256SUMS to check it against; falling back to round_0001, the newest "
        "intact checkpoint"
    )
    if command == "resume":  # round 2 trained again: the uninterrupted run's results
        assert read_results(run_dir)["clients"] == read_results(finished[1])["clients"]
    assert file_hashes(run_dir / "checkpoints" / "round_0001")  # the fallback is kept


# ---------------------------------------------------------------------------- several processes


def _torchrun_fit(configs: list[Path], run_dir: Path) -> list[tuple[int, str]]:
    """Two ``torchrun --nnodes 2`` launches of ``fedmtl fit`` on 127.0.0.1 (as tests/test_multinode.py
    starts them), node ``k`` given ``configs[k]``: each launch's exit code and output."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, config in enumerate(configs):
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(run_dir),
            "--num_nodes", "2", "--devices", "1",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        procs.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        )
    out = []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=300)
            out.append((proc.returncode, text))
    finally:  # a launch that hangs is not left behind
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return out


def _fedmtl_lines(output: str) -> list[str]:
    """A launch's output up to torchrun's own report of a failed worker."""
    return output.split("torch/distributed/elastic/multiprocessing/api.py")[0].splitlines()


def test_nodes_started_with_different_configs_are_refused_naming_the_field(tmp_path, data_root):
    import importlib.util

    if importlib.util.find_spec("torch.distributed.run") is None:
        pytest.skip("torchrun (torch.distributed.run) is missing")
    configs = [
        tiny_config(tmp_path, data_root, name="node0.yaml", rounds=1),
        tiny_config(tmp_path, data_root, name="node1.yaml", rounds=1, seed=1),
    ]
    launches = _torchrun_fit(configs, tmp_path / "run")
    assert [code for code, _ in launches] == [1, 1], launches
    expected = (
        "error: the processes of this run were started with different configs: seed is 0 on rank 0 and 1 on "
        "rank 1 (node 1). Start every process and node with the same config; nothing was trained "
        "(config.yaml holds rank 0's)"
    )
    for _, output in launches:  # each node's log says why, once, without a traceback
        lines = _fedmtl_lines(output)
        assert [line for line in lines if line.startswith("error:")] == [expected], output
        assert not any("Traceback" in line for line in lines), output
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------------------- a rank killed

_OBSERVED = """
import signal, subprocess, sys, threading, time
from types import SimpleNamespace
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from fedmtl.federated import stopping

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
observer = _ChildProcessObserver(main_pid=0, child_processes=[child], sleep_period=0.05)
observer.start()  # as Fabric's launcher starts it, watching rank 1
stopping.watch_children(SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=[child]))), sys.argv[1])
child.send_signal(signal.SIGKILL)  # kill -9 of rank 1 while this rank computes
time.sleep(30)
print("not stopped", file=sys.stderr)
"""


def test_a_local_rank_killed_while_the_launcher_computes_is_one_line(tmp_path):
    """Lightning's observer SIGKILLed the launcher without a word; a collective that met the
    dead rank first ended in gloo's traceback (checked by hand with ``--devices 2``: either rank
    killed with SIGKILL mid-round leaves the other's one line below, exit 1)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _OBSERVED, str(tmp_path / "run")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "error: the process of rank 1 ended unexpectedly (ended by SIGKILL: killed, out of memory, or its machine "
        "failed); no checkpoint was written: start the run again with --overwrite true"
    ]


def test_a_collective_whose_peer_is_gone_is_told_from_other_errors(finished):
    from fedmtl.federated import stopping

    gloo = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:46791: "
        "Connection reset by peer. This is typically caused by a remote worker hanging"
    )
    assert stopping.is_peer_lost(RuntimeError(gloo))
    assert not stopping.is_peer_lost(RuntimeError("stack expects each tensor to be equal size"))
    assert not stopping.is_peer_lost(OSError(gloo))
    assert stopping.lost_line("the process of rank 0", "its connection closed", finished[1]) == (
        "error: the process of rank 0 ended unexpectedly (its connection closed: killed, out of memory, or its "
        "machine failed); the latest complete checkpoint is round_0002: continue the run with --resume true"
    )


def test_a_record_from_before_a_field_existed_compares_it_at_its_default():
    """Issue #39 added privacy, secure_aggregation and model.norm: a checkpoint recorded before
    them ran without privacy, with BatchNorm, and still resumes; a change of them is named."""
    from fedmtl.cli import _run_parser
    from fedmtl.federated import rundir
    from fedmtl.federated.resume_checks import with_defaults

    defaults = checkpoint.comparable(_run_parser().get_defaults().as_dict())
    now = dict(defaults)
    old = {k: v for k, v in defaults.items() if k not in ("privacy", "secure_aggregation")}
    old["model"] = {k: v for k, v in defaults["model"].items() if k != "norm"}
    assert rundir.config_changes(old, now)  # compared as they are, the new fields read as changes
    assert rundir.config_changes(with_defaults(old, defaults), now) == []
    private = {**now, "privacy": {**now["privacy"], "mode": "central"}}
    assert rundir.config_changes(with_defaults(old, defaults), private) == ["privacy.mode: None -> 'central'"]
