"""Where a benchmark script records what it measured: ``benchmarks/results/NAME.md``.

A figure belongs to the script that measured it: the script writes it here, headed by the
command that produced it, the commit it ran (``+ uncommitted changes`` when the tree was
dirty), the date and the machine, and the docs point to the file instead of copying numbers.
A rerun of the same script replaces its own file, nothing else. The probes (``probes/``)
record their tables the same way in ``probes/results/`` (``folder=PROBES``).

With ``FEDMTL_RESULTS_DIR`` set, every file goes to that folder instead: a trial run or a test
writes there, never over the figures the docs include.

The scripts run as ``python benchmarks/NAME.py``, so this folder is first on ``sys.path`` and
``import results_file`` finds this module.
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
PROBES = RESULTS.parents[1] / "probes" / "results"  # where the probes record theirs
RESULTS_DIR_VARIABLE = "FEDMTL_RESULTS_DIR"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> str:
    """The checked-out commit, short, and whether the tracked files differ from it. The
    recorded figures themselves (this folder, the probes') do not count: a script that writes
    its figure before its table, or a record not yet committed, changes no code that ran."""
    head = _git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    records = [f":(top,exclude){folder.relative_to(RESULTS.parents[1])}" for folder in (RESULTS, PROBES)]
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ":/", *records)
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


def row(*cells: object) -> str:
    """One row of a markdown table."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table_head(*columns: str, labels: int = 1) -> str:
    """A markdown table's header row and rule: the first ``labels`` columns left-aligned, the
    figures after them right-aligned."""
    return row(*columns) + "\n" + row(*["---"] * labels, *["---:"] * (len(columns) - labels))


def write(
    name: str, title: str, body: str, argv: list[str] | None = None, folder: Path | None = None
) -> Path:
    """Write ``FOLDER/NAME.md``: :func:`header`, then ``body``; returns its path. ``folder``
    defaults to ``benchmarks/results/``; ``$FEDMTL_RESULTS_DIR``, when set, replaces either."""
    folder = Path(os.environ.get(RESULTS_DIR_VARIABLE) or folder or RESULTS)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text(header(title, argv) + "\n" + body.rstrip() + "\n")
    return path


def record(
    name: str, title: str, body: str, argv: list[str] | None = None, folder: Path | None = None
) -> Path:
    """:func:`write`, then say where on standard output: what every script ends with."""
    path = write(name, title, body, argv, folder)
    print(f"recorded in {path}", flush=True)
    return path
