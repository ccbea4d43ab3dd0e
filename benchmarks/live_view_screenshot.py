"""Regenerates docs/images/live-view.png: `fedmtl fit` on the tests' tiny scenario in a
pseudo-terminal, its screen as the last checkpoint starts (the loss and the last evaluation's
metrics on the status lines), drawn in a monospace font.

    .venv/bin/python benchmarks/live_view_screenshot.py [--out docs/images/live-view.png]

No terminal emulator (pyte) is installed: :func:`screen` replays the few controls tqdm writes
(carriage return, newline, cursor up, erase line) on a grid of characters.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS, ROWS = 110, 16


def run_in_pty(argv: list[str], columns: int = COLUMNS, rows: int = ROWS, timeout: float = 600) -> str:
    """What ``argv`` writes to a terminal of ``columns`` x ``rows`` (stdout and stderr both)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.OPOST  # the bytes as written (no CR/NL translation): screen() does a terminal's
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": str(columns)}
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    process.wait(timeout=timeout)
    if process.returncode != 0:
        raise SystemExit(f"{argv} exited {process.returncode}:\n{b''.join(chunks).decode(errors='replace')}")
    return b"".join(chunks).decode(errors="replace")


def screen(output: str, columns: int = COLUMNS) -> list[str]:
    """The lines ``output`` leaves on a terminal ``columns`` wide that never scrolls away."""
    lines: list[list[str]] = [[]]
    row = col = 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|.", output, flags=re.S):
        if token == "\r":  # (a newline below returns the carriage too, as a terminal's ONLCR does)
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
        elif token.startswith("\x1b["):
            n = int(token[2:-1] or 1) if token[2:-1].isdigit() else 1
            if token[-1] == "A":
                row = max(row - n, 0)
            elif token[-1] == "K":
                del lines[row][col:]
        elif token >= " ":
            if col == columns:  # the terminal wraps a long line
                row, col = row + 1, 0
                while len(lines) <= row:
                    lines.append([])
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = token
            col += 1
    return ["".join(line).rstrip() for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "live-view.png")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from fedmtl.synth import generate
    from tests.helpers import tiny_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        generate("pascal_context", tmp_path / "data/PASCALContext", num_train=12, num_val=4, size=(32, 32))
        generate("nyud", tmp_path / "data/NYUDv2", num_train=12, num_val=4, size=(32, 32))
        config = tiny_config(tmp_path, tmp_path / "data")
        command = [sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", "runs/tiny"]
        output = run_in_pty([*command[:-1], str(tmp_path / "runs/tiny")])
    shown = output[: output.rindex("checkpoint") + len("checkpoint")]  # the last checkpoint starts
    text = [line for line in screen(shown) if line.strip()]
    text = [f"$ fedmtl fit --config tiny.yaml --run_dir {command[-1]}", *text[-ROWS:]]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.185 * len(text) + 0.2
    fig = plt.figure(figsize=(0.085 * COLUMNS, height), facecolor="#1e1e1e")
    fig.text(
        0.01, 1 - 0.12 / height, "\n".join(text), family="monospace", fontsize=10, color="#e0e0e0", va="top"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110, facecolor=fig.get_facecolor())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
