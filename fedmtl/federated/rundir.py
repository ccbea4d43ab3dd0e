"""The run directory: what a run writes there, and the checks that keep a finished run safe.

A fresh fit refuses a directory that already holds anything (``--resume true`` continues the
run there, ``--overwrite true`` replaces it); a resume refuses a config that changes what the
run computes. Both are decided before anything is written.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: What ``fedmtl fit`` / ``validate`` write into a run directory (``--overwrite`` removes these only).
RUN_ENTRIES = (
    "config.yaml",
    "results.json",
    "metrics.csv",
    "checkpoints",
    "store",
    "wandb",
    "wandb_run_id",
    "validate_results.json",
    "test_results.json",
)

#: Config fields a resumed run may change: where and how it runs and logs, never what it
#: computes (the clients, model, method, rounds and their schedules, seed, data sizes).
RESUMABLE_FIELDS = (
    "run_dir",
    "resume",
    "overwrite",
    "devices",
    "num_nodes",
    "accelerator",
    "cpu_threads",
    "store",
    "checkpoint_every",
    "nonfinite",
    "evaluation",
    "logger",
    "data.root",
    "data.num_workers",
    "data.cache_mib",
)


def contents(run_dir: Path) -> list[str]:
    """Names of what ``run_dir`` holds (empty when it does not exist)."""
    return sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []


def check_writable(run_dir: Path) -> None:
    """Raise unless ``run_dir`` exists and is writable or can be created."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run_dir {run_dir} is a file, not a directory: choose another --run_dir")
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"run_dir {run_dir}: cannot write to {existing.resolve()} (permission denied); "
            "choose a writable --run_dir"
        )


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """A fresh fit needs an empty (or absent) ``run_dir``, or ``overwrite``."""
    held = contents(run_dir)
    if held and not overwrite:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise ValueError(
            f"run_dir {run_dir} is not empty ({shown}): continue that run with --resume true, write "
            "this one elsewhere with --run_dir, or replace it with --overwrite true"
        )


def clear(run_dir: Path) -> None:
    """Remove what a previous run wrote (``--overwrite``); anything else in ``run_dir`` stays."""
    for name in RUN_ENTRIES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values (a client group list compares whole)."""
    if not isinstance(tree, Mapping):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if str(key).startswith("__"):  # jsonargparse's bookkeeping (__path__)
            continue
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def is_resumable(field: str) -> bool:
    """Whether a resume may change ``field`` (a dotted name): where and how the run runs and logs."""
    return any(field == f or field.startswith(f + ".") for f in RESUMABLE_FIELDS)


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The fields outside :data:`RESUMABLE_FIELDS` whose value differs, as ``field: old -> new``."""
    old, new = flatten(saved), flatten(now)
    return [
        f"{field}: {old.get(field)!r} -> {new.get(field)!r}"
        for field in sorted(set(old) | set(new))
        if not is_resumable(field) and old.get(field) != new.get(field)
    ]


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of this run directory, created on first use: every resume logs to the
    same wandb run."""
    path = run_dir / "wandb_run_id"
    if path.is_file():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)
    path.write_text(run_id + "\n")
    return run_id
