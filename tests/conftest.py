"""Shared fixtures: tiny generated data in the real on-disk layouts (see ``tests/helpers.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    from fedmtl.synth import generate

    root = tmp_path_factory.mktemp("data")
    generate("pascal_context", root / "PASCALContext", num_train=12, num_val=4, size=(32, 32), progress=False)
    generate("nyud", root / "NYUDv2", num_train=12, num_val=4, size=(32, 32), progress=False)
    return root
