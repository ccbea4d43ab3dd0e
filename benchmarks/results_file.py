"""Where a benchmark script records what it measured: ``benchmarks/results/NAME.md``.

A figure belongs to the script that measured it: the script writes it here, headed by the
command that produced it, the commit it ran (``+ uncommitted changes`` when the tree was
dirty), the date and the machine, and the docs point to the file instead of copying numbers.
A rerun of the same script replaces its own file, nothing else.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> str:
    """The checked-out commit, short, and whether the tracked files differ from it."""
    head = _git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head} + uncommitted changes" if dirty else head


def machine() -> str:
    """CPU model, cores and OS, e.g. 'AMD EPYC, 2 cores, Linux-6.1-x86_64'."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, {platform.platform(terse=True)}"


def header(title: str, argv: list[str] | None = None) -> str:
    """The lines every results file starts with."""
    argv = sys.argv if argv is None else argv
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            f"# {title}",
            "",
            f"- command: `python {shlex.join(argv)}`",
            f"- commit: {commit()}",
            f"- date: {now}",
            f"- machine: {machine()}",
            "",
        ]
    )


def write(name: str, title: str, body: str, argv: list[str] | None = None) -> Path:
    """Write ``benchmarks/results/NAME.md``: :func:`header`, then ``body``; returns its path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(header(title, argv) + "\n" + body.rstrip() + "\n")
    return path
