"""Papercuts of #37: ``fedmtl --version``, the versions in results.json, a closed stdout pipe,
a finished run reprinted without the simulation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys):
    from importlib import metadata

    from fedmtl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"fedmtl {metadata.version('fedmtl')}\n"


def test_versions_name_the_software_and_the_checkout_commit():
    from fedmtl.federated.results import versions

    found = versions()
    assert set(found) == {"fedmtl", "torch", "lightning", "python", "git_commit"}
    import torch

    assert torch.__version__.startswith(found["torch"])
    assert found["python"] == ".".join(map(str, sys.version_info[:3]))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    except OSError:
        head = ""
    assert found["git_commit"] == (head.strip() or None)


def test_no_git_gives_no_commit_not_an_error(monkeypatch):
    from fedmtl.federated import results

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", missing)
    assert results.git_commit() is None
    assert results.versions()["git_commit"] is None


@pytest.mark.parametrize("command", [["configs"], ["configs", "show", "demo.yaml"]])
def test_a_reader_that_leaves_early_stops_the_command_quietly(command):
    """``fedmtl configs | head -3``: the reader closes the pipe before the command writes."""
    import os

    child = subprocess.Popen(
        [sys.executable, "-m", "fedmtl", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child.stdout.close()  # before the child has imported anything: its first write finds no reader
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141
    assert err == ""


def test_no_docstring_holds_an_rst_table():
    """The API reference renders docstrings as Markdown, where an RST table is rows of ``=====``:
    a table is written as a Markdown one (tests/test_docs.py checks the built pages)."""
    import ast
    import re

    rule = re.compile(r"^\s*=+(\s+=+)+\s*$", re.MULTILINE)
    found = []
    for path in sorted((ROOT / "fedmtl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc and rule.search(doc):
                    found.append(f"{path.relative_to(ROOT)}: {getattr(node, 'name', 'module')}")
    assert found == []
