"""Issue #26, item 2: ``--overwrite true`` removes exactly what the previous run wrote.

A run lists what it may write in ``RUN_DIR/.fedmtl-manifest.json`` before writing it; an
overwrite removes those paths and keeps every other file (a user's ``checkpoints/my_model.pt``,
``notes.txt``), saying so in one line. A run directory from before the manifest is overwritten
by the names fedmtl writes; a folder that holds no run loses nothing. Degenerate ``--run_dir``
values (empty, blank, the current directory, home, ``/``, a file) are refused first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedmtl.cli import main
from fedmtl.federated import manifest, runlock
from fedmtl.federated.rundir import MANIFEST_FILE
from tests.helpers import file_hashes, fit, read_results, refused_keeping, tiny_config

MACHINERY = {runlock.LOCK_FILE, MANIFEST_FILE}
USER_FILES = {
    "notes.txt": "my notes",
    "checkpoints/my_model.pt": "my own weights",
    "checkpoints/round_best/model.pt": "not a round folder fedmtl writes",
    "wandb/my_sweep.yaml": "mine too",
    "analysis/plot.png": "a plot",
}


def _fit_args(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path]:
    """A finished 2-round run with everything a run can write: wandb (offline), a disk store."""
    config = tiny_config(module_dir, data_root, rounds=2, logger={"wandb": True}, store="disk")
    fit(config, module_dir / "run")
    return config, module_dir / "run"


def _copy_with_user_files(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    run_dir = tmp_path / "run"
    shutil.copytree(finished[1], run_dir, symlinks=True)
    for rel, text in USER_FILES.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    hashes = file_hashes(run_dir)
    return run_dir, {rel: hashes[rel] for rel in USER_FILES}


def _files(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() or p.is_symlink()}


def test_the_manifest_lists_every_file_a_run_writes(finished):
    _, run_dir = finished
    listed = manifest.read(run_dir)
    assert listed is not None and {"checkpoints", "store", "wandb"} <= set(listed["folders"])
    owned, others = manifest._sort(run_dir, [p.split("/") for p in listed["paths"]])
    assert others == []  # nothing the run wrote is missing from its manifest
    names = {str(p.relative_to(run_dir)) for p in owned}
    assert {"config.yaml", "metrics.csv", "results.json", "wandb_run_id", "checkpoints/latest"} <= names
    assert any(n.startswith("wandb/offline-run-") for n in names)


def test_overwrite_removes_exactly_the_manifest_paths_and_says_what_it_kept(
    finished, tmp_path, data_root, capsys, monkeypatch
):
    run_dir, mine = _copy_with_user_files(finished, tmp_path)
    listed = [p.split("/") for p in manifest.read(run_dir)["paths"]]
    old_run = {rel for rel in _files(run_dir) if rel not in USER_FILES and rel not in MACHINERY}
    assert old_run and all(manifest._matches(rel.split("/"), listed, prefix=True) for rel in old_run)
    seen = {}

    def stop_before_training(cfg, config_dict=None):  # the state the overwrite left, before the new run
        seen["files"] = _files(run_dir)

    monkeypatch.setattr("fedmtl.federated.engine.run", stop_before_training)
    capsys.readouterr()
    assert main(_fit_args(finished[0], run_dir, "--overwrite", "true", "--rounds", "1")) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("overwrite:")]
    assert err == [
        f"overwrite: removed the previous run's {len(old_run)} files from {run_dir}; kept 5 files the run "
        "did not write: analysis/plot.png, checkpoints/my_model.pt, checkpoints/round_best/model.pt, "
        "notes.txt, wandb/my_sweep.yaml"
    ]
    # Left: the user's files, the lock, the new manifest, and what the new fit wrote before training.
    new_run = seen["files"] - set(USER_FILES) - MACHINERY
    assert new_run <= {"config.yaml", "wandb_run_id", "data_fingerprint.json"}, new_run
    assert {rel: h for rel, h in file_hashes(run_dir).items() if rel in USER_FILES} == mine
    assert (run_dir / "checkpoints").is_dir() and not (run_dir / "checkpoints" / "latest").exists()
    assert not (run_dir / "store").exists()  # a folder the run made, empty once its files are gone
    assert json.loads((run_dir / MANIFEST_FILE).read_text())["paths"]  # the new run's own record


def test_a_run_dir_without_a_manifest_is_overwritten_by_name(finished, tmp_path, data_root, capsys):
    """A run written before the manifest existed: only the names fedmtl and wandb write go."""
    run_dir, mine = _copy_with_user_files(finished, tmp_path)
    (run_dir / MANIFEST_FILE).unlink()
    (run_dir / runlock.LOCK_FILE).unlink()
    capsys.readouterr()
    config = tiny_config(tmp_path, data_root, rounds=1, logger={"wandb": True}, store="disk")
    assert fit(config, run_dir, "--overwrite", "true")["rounds"] == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("overwrite:")]
    assert line.startswith(f"overwrite: {run_dir} has no manifest (a run from an older fedmtl): removed the ")
    assert line.endswith(
        "kept 5 files the run did not write: analysis/plot.png, checkpoints/my_model.pt, "
        "checkpoints/round_best/model.pt, notes.txt, wandb/my_sweep.yaml"
    )
    assert {rel: h for rel, h in file_hashes(run_dir).items() if rel in USER_FILES} == mine
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "latest",
        "my_model.pt",
        "round_0001",
        "round_best",
    ]
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1  # the old run's wandb run is gone


def _not_a_run(tmp_path: Path) -> Path:
    """The issue's case: a folder of the user's own, with a config.yaml and checkpoints/my_model.pt."""
    folder = tmp_path / "project"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "my_model.pt").write_text("my own weights")
    (folder / "config.yaml").write_text("lr: 0.1\n")
    return folder


def test_overwrite_never_replaces_a_file_no_run_wrote(tmp_path, data_root, capsys):
    """Nor does a resume that finds no checkpoint and would start the run over."""
    folder = _not_a_run(tmp_path)
    config = tiny_config(tmp_path, data_root, rounds=1)
    for mode in ("--overwrite", "--resume"):
        (line,) = refused_keeping(_fit_args(config, folder, mode, "true"), folder, capsys)
        assert line == (
            f"error: {mode} true: run_dir {folder} holds config.yaml, which no fedmtl run recorded writing "
            "there, and the new run would replace it; nothing was changed. Move it away, or choose another "
            "--run_dir"
        )
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "config.yaml"]  # not even a lock file


def test_overwrite_of_a_folder_without_a_run_keeps_everything_and_says_so(tmp_path, data_root, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes")
    before = file_hashes(folder)
    capsys.readouterr()
    fit(tiny_config(tmp_path, data_root, rounds=1), folder, "--overwrite", "true")
    err = capsys.readouterr().err
    assert (
        f"overwrite: {folder} holds no fedmtl run: removed nothing; kept 1 file the run did not write: notes.txt"
        in err
    )
    assert file_hashes(folder)["notes.txt"] == before["notes.txt"]


@pytest.mark.parametrize("value", ["", "   ", "\t"])
@pytest.mark.parametrize("command", ["fit", "validate", "test"])
def test_an_empty_run_dir_is_refused_before_anything(
    tmp_path, data_root, capsys, monkeypatch, value, command
):
    work = tmp_path / "work"  # the current directory, which an empty run_dir used to mean
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    args = (
        _fit_args(tiny_config(tmp_path, data_root), Path("x"))[:-1] + [value]
        if command == "fit"
        else [command, "--run_dir", value]
    )
    (line,) = refused_keeping(args, work, capsys)
    assert line.startswith(f"error: run_dir is empty ({value!r})") and "--run_dir runs/NAME" in line


@pytest.mark.parametrize("mode", [(), ("--overwrite", "true"), ("--resume", "true")])
@pytest.mark.parametrize("where", [".", "./", "here/..", "absolute", "home"])
def test_fit_refuses_the_current_and_home_directory(tmp_path, data_root, capsys, monkeypatch, where, mode):
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)
    (work / "checkpoints" / "my_model.pt").write_text("my own weights")
    (work / "here").mkdir()
    config = tiny_config(tmp_path, data_root)
    monkeypatch.chdir(work if where != "home" else tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home" if where != "home" else work))
    value = str(work) if where in ("absolute", "home") else where
    (line,) = refused_keeping(_fit_args(config, Path(value), *mode), work, capsys)
    place = "your home directory" if where == "home" else "the current directory"
    assert line.startswith(f"error: run_dir {str(Path(value))!r} is {place} ({work})") and "runs/NAME" in line


def test_fit_refuses_a_filesystem_root(tmp_path, data_root, capsys):
    capsys.readouterr()
    assert main(_fit_args(tiny_config(tmp_path, data_root), Path("/"), "--overwrite", "true")) != 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith("error: run_dir '/' is a filesystem root (/)")


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_a_run_dir_that_is_a_file_is_one_line(tmp_path, data_root, capsys, command):
    path = tmp_path / "results.txt"
    path.write_text("mine")
    args = (
        _fit_args(tiny_config(tmp_path, data_root), path)
        if command == "fit"
        else [command, "--run_dir", str(path)]
    )
    (line,) = refused_keeping(args, tmp_path, capsys)
    assert f"run_dir {path} is a file, not a directory" in line


def test_resuming_a_finished_run_leaves_its_manifest_and_lock_as_they_were(finished, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished[1], run_dir, symlinks=True)
    before = file_hashes(run_dir)
    assert main(_fit_args(finished[0], run_dir, "--resume", "true")) == 0
    assert file_hashes(run_dir) == before
    assert read_results(run_dir)["rounds"] == 2
