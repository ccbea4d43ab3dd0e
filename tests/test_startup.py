"""``fedmtl fit --help`` and the other quick commands import no heavy library (issue 13).

The help text needs every method class (jsonargparse reads their signatures and docstrings),
so the method modules are imported; they must not pull in timm (and with it torchvision and
torch._dynamo), lightning, torchmetrics or scipy, which the commands never use. Checked in a
fresh interpreter, by the modules loaded, not by timing (benchmarks/startup.py times it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "timm",
    "torchvision",
    "lightning",
    "lightning_fabric",
    "torchmetrics",
    "scipy",
    "wandb",
    "matplotlib",
    "opacus",
)

COMMANDS = [
    ["fit", "--help"],
    ["fit", "--algorithm.help", "FedBABU"],
    ["fit", "--config", "demo.yaml", "--print_config"],
    ["fit", "--config", "demo.yaml", "--algorithm", "NoSuchMethod"],
    ["configs"],
    ["data", "check", "--help"],
]

# Every command in one fresh interpreter, in turn (one interpreter start instead of six): the
# modules loaded are read after each, so a heavy import shows at the command that made it.
SCRIPT = """
import contextlib, io, json, sys
from fedmtl.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(sys.argv[2])))
    methods = sorted(name for name in sys.modules if name.startswith("fedmtl.methods."))
    results.append({"code": code, "output": out.getvalue(), "heavy": heavy, "methods": methods})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(COMMANDS), json.dumps(HEAVY)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return dict(zip((" ".join(argv) for argv in COMMANDS), json.loads(done.stdout.splitlines()[-1])))


@pytest.mark.parametrize("command", [" ".join(argv) for argv in COMMANDS])
def test_quick_commands_import_no_heavy_library(results, command):
    result = results[command]
    assert result["output"].strip(), "the command printed nothing"
    assert "fedmtl.methods.fedbabu" in result["methods"]  # the parser was built with every method
    assert result["heavy"] == [], f"`fedmtl {command}` imported {result['heavy']}"


def test_models_package_exports_resolve_on_use():
    import fedmtl.models as models

    for name in models.__all__:
        assert getattr(models, name) is not None
    from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel  # noqa: F401

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        models.nope  # noqa: B018
