"""Issue #26, item 8: the remaining bad inputs, each one ``error:`` line (or one warning).

A config file that is a YAML list or empty, ``--config`` or ``model.pretrained_file`` naming a
directory, ``validate`` on a read-only run or with ``--accelerator gpu`` and no GPU, a resume
that changes a field inside ``clients`` (named by group and field, not the whole list), and
wandb online with a key but no network (one warning, then offline). Each refusal exits
non-zero with exactly one ``error:`` line and leaves every file the user had byte for byte
as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import TINY, file_hashes, fit, refused_keeping, tiny_config

SHAPE = "a scenario config is a YAML mapping of fields"


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path]:
    """A finished 1-round run (config, run_dir); tests copy it before touching it."""
    config = tiny_config(module_dir, data_root, rounds=1)
    fit(config, module_dir / "run")
    return config, module_dir / "run"


def _copy(finished: tuple[Path, Path], tmp_path: Path) -> Path:
    return shutil.copytree(finished[1], tmp_path / "run")


def _fit(config: Path | str, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


# ---------------------------------------------------------------------------- config files


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ("- dataset: nyud\n- rounds: 2\n", "holds a YAML list, not a config"),
        ("", "is empty"),
        ("# clients: [...]\n\n", "is empty"),  # only comments: no field either
        ("demo.yaml\n", "holds a YAML single value ('demo.yaml'), not a config"),
    ],
)
def test_a_config_that_is_not_a_mapping_names_the_file_and_the_shape(tmp_path, capsys, content, what):
    config = tmp_path / "mine.yaml"
    config.write_text(content)
    (line,) = refused_keeping(_fit(config, tmp_path / "run"), tmp_path, capsys)
    assert line.startswith(f"error: config file {config} {what}: {SHAPE}"), line
    assert "fedmtl configs show demo.yaml" in line
    assert not (tmp_path / "run").exists()


def test_a_config_that_is_a_directory_is_named(tmp_path, capsys):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "note.txt").write_text("mine\n")
    (line,) = refused_keeping(_fit(tmp_path / "configs", tmp_path / "run"), tmp_path, capsys)
    assert line == (
        f"error: config file {tmp_path / 'configs'} is a directory, not a file: --config takes a "
        "scenario YAML file (`fedmtl configs` lists the bundled ones)"
    )


def test_a_pretrained_file_that_is_a_directory_is_named(tmp_path, data_root, capsys):
    weights = tmp_path / "weights"
    weights.mkdir()
    torch.save({"w": torch.zeros(1)}, weights / "encoder.pt")
    config = tiny_config(tmp_path, data_root, rounds=1)
    extra = ("--model.pretrained_file", str(weights))
    (line,) = refused_keeping(_fit(config, tmp_path / "run", *extra), tmp_path, capsys)
    assert line.startswith(f"error: model.pretrained_file '{weights}' is a directory, not a weights file"), (
        line
    )
    assert "pass the path of the file itself" in line
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- validate


def test_validate_on_a_read_only_run_is_refused_before_evaluating(finished, tmp_path, capsys, monkeypatch):
    """Tests may run as root, for whom permissions do not apply: the check asks os.access, as
    a read-only copy of a run (chmod -w, a read-only mount) answers it."""
    run_dir = _copy(finished, tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == run_dir else real(p, mode))
    lines = refused_keeping(["validate", "--run_dir", str(run_dir)], run_dir, capsys)
    (line,) = [line for line in lines if line.startswith("error:")]
    assert line.startswith(
        f"error: run_dir {run_dir} is read-only for this process, and `fedmtl validate`"
    ), line
    assert "copy the run to a writable folder" in line
    assert not (run_dir / "validate_results.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_validate_with_a_gpu_that_is_not_there_is_one_line(finished, tmp_path, capsys):
    run_dir = _copy(finished, tmp_path)
    lines = refused_keeping(["validate", "--run_dir", str(run_dir), "--accelerator", "gpu"], run_dir, capsys)
    (line,) = [line for line in lines if line.startswith("error:")]
    assert (
        line
        == "error: accelerator gpu: no CUDA GPU is visible to torch on this machine; use --accelerator cpu (or auto)"
    )
    assert not any("Traceback" in line for line in lines)


# ---------------------------------------------------------------------------- resume


def test_a_resume_that_changes_a_client_group_names_the_group_and_field(
    finished, tmp_path, data_root, capsys
):
    run_dir = _copy(finished, tmp_path)
    clients = json.loads(json.dumps(TINY["clients"]))
    clients[1]["local_epochs"] = 4
    clients[1]["optimizer"] = {"lr": 0.01}
    config = tiny_config(tmp_path, data_root, name="changed.yaml", clients=clients, rounds=1)
    (line,) = refused_keeping(_fit(config, run_dir, "--resume", "true"), tmp_path, capsys)
    assert (
        "in what the run computes: clients[1].local_epochs: 2 -> 4; clients[1].optimizer.lr: 0.0001 -> 0.01."
        in line
    )
    assert "{'dataset'" not in line  # not the whole list of groups


def test_a_resume_with_a_group_more_names_that_group_only(finished, tmp_path, data_root, capsys):
    run_dir = _copy(finished, tmp_path)
    clients = [*TINY["clients"], {"dataset": "nyud", "tasks": ["normals"]}]
    config = tiny_config(tmp_path, data_root, name="more.yaml", clients=clients, rounds=1)
    (line,) = refused_keeping(_fit(config, run_dir, "--resume", "true"), tmp_path, capsys)
    assert (
        "in what the run computes: clients[2]: (absent) -> {'dataset': 'nyud', 'tasks': ['normals']" in line
    )
    assert "clients[0]" not in line and "clients[1]" not in line


# ---------------------------------------------------------------------------- wandb


def test_wandb_online_with_a_key_but_no_network_logs_offline_with_one_warning(
    tmp_path, data_root, capsys, monkeypatch
):
    """The probe is the call that fails without a network; before it, such a run trained a
    round and then died in wandb.init (about 90 s of retries, a traceback)."""
    import requests

    def no_network(*args, **kwargs):
        raise requests.ConnectionError("no route to host")

    monkeypatch.setattr(requests, "head", no_network)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tiny_config(tmp_path, data_root, rounds=1, logger={"wandb": True, "mode": "online"})
    capsys.readouterr()
    fit(config, tmp_path / "run")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "wandb" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: logger.mode online but the wandb server ")
    assert "cannot be reached (ConnectionError): logging offline to" in warnings[0]
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    assert [p.name.endswith(run_id) for p in (tmp_path / "run" / "wandb").glob("offline-run-*")] == [True]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["logger"]["mode"] == "online"


def test_the_user_files_of_a_refused_fit_are_unchanged(tmp_path, capsys):
    """refused_keeping compares every file's sha256; here the folder holds a user's notes too."""
    (tmp_path / "notes.md").write_text("my notes\n")
    config = tmp_path / "list.yaml"
    config.write_text("- a\n")
    before = file_hashes(tmp_path)
    refused_keeping(_fit(config, tmp_path / "run"), tmp_path, capsys)
    assert file_hashes(tmp_path) == before and set(before) == {"notes.md", "list.yaml"}
