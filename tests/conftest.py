"""Shared fixtures: tiny generated data in the real on-disk layouts (see ``tests/helpers.py``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    from fedmtl.synth import generate

    root = tmp_path_factory.mktemp("data")
    generate("pascal_context", root / "PASCALContext", num_train=12, num_val=4, size=(32, 32), progress=False)
    generate("nyud", root / "NYUDv2", num_train=12, num_val=4, size=(32, 32), progress=False)
    return root


@pytest.fixture
def data(tmp_path, data_root) -> Path:
    """A private copy of the session's data (12 train + 4 val images per dataset, 32x32), for a
    test to damage: the shared one must never change."""
    shutil.copytree(data_root, tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory, request) -> Iterator[Path]:
    """A folder for the runs a test module shares, removed when the module is done unless one
    of its tests failed: left to the end of the session, modules' runs once filled CI's disk."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def method_run(tmp_path_factory, data_root):
    """``method_run(name)``: method ``name``'s 2-round run of the tiny scenario, (config, run_dir),
    made the first time a test of the session asks for it and shared by every test after."""
    from tests.helpers import fit, tiny_config

    folder = tmp_path_factory.mktemp("method_runs")
    made: dict[str, tuple[Path, Path]] = {}

    def run(name: str) -> tuple[Path, Path]:
        if name not in made:
            config = tiny_config(
                folder, data_root, name=f"{name}.yaml", algorithm={"class_path": name}, rounds=2
            )
            fit(config, folder / name)
            made[name] = (config, folder / name)
        return made[name]

    return run
