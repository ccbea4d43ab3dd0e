"""The README's runnable command blocks run as written, on a tiny config.

A ```bash block preceded by a ``<!-- runnable ... -->`` line is run line by line in an empty
folder, as a newcomer would run it from the repository root after ``make demo``'s install:
``.venv/bin/fedmtl`` is this interpreter's ``python -m fedmtl``, and every ``fedmtl fit`` gets
one more ``--config``, a fragment that shrinks the demo (32×32 images, a few per client, two
rounds) without changing its clients, method or run directories. Each command must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = re.compile(r"^<!-- runnable\b.*-->\s*$")
FEDMTL = ".venv/bin/fedmtl"

# The demo's clients at batch size 2 (a parts-only client keeps only the images with a person),
# without warm-up so that two rounds leave no metric at 0, which `fedmtl report` refuses as a
# baseline for Δm.
_DEMO = yaml.safe_load((README.parent / "configs" / "demo.yaml").read_text())
TINY_DEMO = {
    "clients": [
        {**group, "batch_size": 2, "optimizer": {"lr": 0.01, "warmup_epochs": 0}}
        for group in _DEMO["clients"]
    ],
    "data": {
        "train_size": [32, 32],
        "synth": {
            "pascal_context": {"num_train": 60, "num_val": 4, "size": [32, 32]},
            "nyud": {"num_train": 8, "num_val": 4, "size": [32, 32]},
        },
    },
    "rounds": 2,
    "evaluation": {"every": 1},
    "logger": {"wandb": False},
}


def runnable_blocks(text: str) -> list[list[str]]:
    """The command lines of each ```bash block that follows a runnable mark (backslash
    continuations joined, comments and blank lines dropped)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if MARK.match(lines[i]) and i + 1 < len(lines) and lines[i + 1].startswith("```bash"):
            body, i = [], i + 2
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            joined = "\n".join(body).replace("\\\n", " ")
            blocks.append([line for line in joined.splitlines() if shlex.split(line, comments=True)])
        i += 1
    return blocks


def _command(line: str, tiny: Path) -> list[str]:
    words = shlex.split(line, comments=True)
    assert words[0] == FEDMTL, f"a runnable README line runs {FEDMTL}: {line!r}"
    command = [sys.executable, "-m", "fedmtl", *words[1:]]
    if words[1] == "fit":
        command += ["--config", str(tiny)]
    return command


def test_the_readme_marks_a_block_that_trains_and_compares():
    blocks = runnable_blocks(README.read_text())
    assert blocks, "the README has no runnable block"
    commands = [shlex.split(line, comments=True)[1] for block in blocks for line in block]
    assert {"fit", "report", "validate"} <= set(commands)


def test_the_marked_blocks_parse_as_written():
    text = "intro\n<!-- runnable: x -->\n```bash\na b \\\n  c   # note\n\n# only a comment\nd\n```\n```bash\nskipped\n```\n"
    assert runnable_blocks(text) == [["a b    c   # note", "d"]]


@pytest.mark.parametrize("block", range(len(runnable_blocks(README.read_text()))))
def test_a_runnable_block_runs(block, tmp_path):
    tiny = tmp_path / "tiny_demo.yaml"
    tiny.write_text(yaml.safe_dump(TINY_DEMO))
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FEDMTL_DATA"}
    env["PYTHONPATH"] = str(README.parent)
    for line in runnable_blocks(README.read_text())[block]:
        done = subprocess.run(
            _command(line, tiny), cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
