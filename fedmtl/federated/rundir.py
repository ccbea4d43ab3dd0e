"""The run directory: what a run writes there, and the checks that keep a finished run safe.

A fresh fit refuses a directory that already holds anything (``--resume true`` continues the
run there, ``--overwrite true`` replaces it, removing only what the run wrote: see
``manifest.py``); a resume refuses a config that changes what the run computes. Both are
decided before anything is written, and again under the run's lock (``runlock.py``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedmtl.federated.runlock import LOCK_FILE

#: What ``fedmtl fit`` / ``validate`` write at the top of a run directory: the run's manifest
#: lists these (and what the folders among them hold), and ``--overwrite`` removes only that.
RUN_ENTRIES = (
    "config.yaml",
    "data_fingerprint.json",
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
    "aggregation",  # stacked or streamed: the same parameters up to float rounding, as cpu_threads
    "checkpoint_every",
    "checkpoint_keep",
    "nonfinite",
    "update_norm_limit",
    "evaluation",
    "logger",
    "data.root",
    "data.num_workers",
    "data.cache_mib",
)


#: The run's record of what it wrote (``manifest.py``).
MANIFEST_FILE = ".fedmtl-manifest.json"

#: Bookkeeping files, not the run's output: they never make a run directory look "not empty".
MACHINERY = (LOCK_FILE, MANIFEST_FILE, MANIFEST_FILE + ".tmp")


def contents(run_dir: Path) -> list[str]:
    """Names of what ``run_dir`` holds, its lock and manifest aside (empty when it does not exist)."""
    return sorted(p.name for p in run_dir.iterdir() if p.name not in MACHINERY) if run_dir.is_dir() else []


def check_path(value: str | None, command: str) -> None:
    """Refuse a ``--run_dir`` that cannot be a run's own folder, before anything else happens.

    Empty or blank is refused everywhere (``Path("")`` is silently the current directory). A
    fit also refuses the current directory, the home directory and a filesystem root: folders
    that hold other things, where a run's files would mix with the user's (a fresh fit there
    used to be refused as "not empty" with advice to overwrite). ``validate`` and ``test`` only
    read an existing run and add their results file, so ``cd RUN && fedmtl validate --run_dir .``
    stays possible."""
    if value is None or not str(value).strip():
        raise ValueError(
            f"run_dir is empty ({value!r}), which would mean the current directory: give the run its own "
            "folder, e.g. --run_dir runs/NAME"
        )
    if command != "fit":
        return
    resolved = Path(value).resolve()
    place = (
        "the current directory"
        if resolved == Path.cwd().resolve()
        else "your home directory"
        if resolved == Path.home().resolve()
        else "a filesystem root"
        if resolved.parent == resolved
        else None
    )
    if place:
        raise ValueError(
            f"run_dir {value!r} is {place} ({resolved}): a run needs a folder of its own, where its files "
            "do not mix with others; pass --run_dir runs/NAME (to continue a run that is in this folder, "
            "run from the folder above it and pass the run's folder name)"
        )


def check_writable(run_dir: Path) -> None:
    """Raise unless ``run_dir`` exists and is writable or can be created."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run_dir {run_dir} is a file, not a directory: choose another --run_dir")
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():  # a regular file in the path: no folder can be made under it
        raise ValueError(
            f"run_dir {run_dir}: {existing} is a file, not a folder, so nothing can be written under it; "
            "choose another --run_dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
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
            "this one elsewhere with --run_dir, or replace it with --overwrite true (which removes only what "
            "that run wrote)"
        )


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
    """The fields outside :data:`RESUMABLE_FIELDS` whose value differs, as ``field: old -> new``.

    Mappings compare key by key (a missing key is None) and lists of mappings (the client
    groups) item by item, so a change inside a group is named by its place,
    ``clients[1].local_epochs: 2 -> 4``, not as the whole list; a group added or removed is
    one entry, ``clients[2]: (absent) -> {...}``. Other lists (a group's tasks) compare whole."""
    changes: list[str] = []
    _diff(saved, now, "", changes)
    return changes


_ABSENT = "(absent)"  # a list item one side does not have


def _diff(old: Any, new: Any, field: str, changes: list[str]) -> None:
    if field and is_resumable(field):
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted({str(k) for k in (*old, *new) if not str(k).startswith("__")})  # __path__: bookkeeping
        for key in keys:
            _diff(old.get(key), new.get(key), f"{field}.{key}" if field else key, changes)
    elif _records(old) and _records(new):
        for k in range(max(len(old), len(new))):
            before = old[k] if k < len(old) else _ABSENT
            after = new[k] if k < len(new) else _ABSENT
            _diff(before, after, f"{field}[{k}]", changes)
    elif old != new:
        shown = [value if value is _ABSENT else repr(value) for value in (old, new)]
        changes.append(f"{field}: {shown[0]} -> {shown[1]}")


def _records(value: Any) -> bool:
    """A non-empty list of mappings, compared item by item."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of this run directory, created on first use: every resume logs to the
    same wandb run."""
    path = run_dir / "wandb_run_id"
    if path.is_file():
        return path.read_text().strip()
    from fedmtl.files import replace_file  # never an empty id left by a write cut short

    run_id = secrets.token_hex(4)
    replace_file(path, lambda f: f.write(f"{run_id}\n".encode()))
    return run_id


def read_config(parser: Any, path: Path) -> Any:
    """The run's saved ``config.yaml`` parsed by ``parser`` (a namespace), in today's form: a
    FedDEA config written before its host became a nested method is read with the host nested
    (:func:`fedmtl.methods.feddea.nest_flat_host`), so such runs still resume and validate."""
    import yaml

    from fedmtl.methods.feddea import nest_flat_host

    raw = yaml.safe_load(path.read_text())
    algorithm = raw.get("algorithm") if isinstance(raw, dict) else None
    nested = nest_flat_host(algorithm)
    if nested is not algorithm:
        return parser.parse_string(yaml.safe_dump({**raw, "algorithm": nested}))
    return parser.parse_path(str(path))
