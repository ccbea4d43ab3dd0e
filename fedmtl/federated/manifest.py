"""What a run writes into its run directory, recorded so that ``--overwrite true`` removes
exactly that and nothing else.

``RUN_DIR/.fedmtl-manifest.json``::

    {"format": 1, "paths": ["config.yaml", "checkpoints/round_000[1-9]", ...,
                            "wandb/offline-run-????????_??????-*"],
     "folders": ["checkpoints", "store", "wandb"]}

``paths`` are the run's files, and folders the run owns whole (a round's checkpoint folder, a
rank's client store: the run itself replaces and deletes those); a name the writer picks at
run time (wandb's timestamped run folder) is a glob pattern. ``folders`` are the folders the
run made to hold them: removed once empty, kept, with what is in them, otherwise. So a
user's ``checkpoints/my_model.pt`` or ``notes.txt`` survives an overwrite.

The leader writes the manifest under the run's lock (``runlock.py``) before the run's first
write, listing everything the run *may* write (every round's checkpoint folder, as a few glob
patterns so that the file does not grow with the rounds planned; every rank's store), so a path is recorded before it exists, never after: a run killed at any moment
leaves nothing unrecorded, and no two ranks ever write the file. A resume or ``validate``
adds what it may add (more ranks) and rewrites the file only when that changes it. A new
file a run writes goes into :data:`~fedmtl.federated.rundir.RUN_ENTRIES` (top level) or
:func:`planned`; ``tests/test_overwrite_manifest.py`` fails when a run writes a file its
manifest does not list. A file put inside a round's checkpoint folder goes with the folder,
as it does when a newer round replaces that folder.

A run directory without a manifest (written before fedmtl kept one) is overwritten by name:
the top-level files of :data:`~fedmtl.federated.rundir.RUN_ENTRIES`, and inside
``checkpoints/``, ``store/`` and ``wandb/`` only the names fedmtl and wandb write there; and
only if the folder shows a fedmtl run was there (see :func:`looks_like_a_run`). A folder
without one loses nothing, and an overwrite that would replace a file the run did not write
(a user's ``config.yaml``) is refused before anything is removed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
from pathlib import Path

from fedmtl.federated import checkpoint
from fedmtl.federated.rundir import MACHINERY, MANIFEST_FILE, RUN_ENTRIES

FORMAT = 1
FOLDERS = ("checkpoints", "store", "wandb")  # the RUN_ENTRIES whose content is listed entry by entry
# What wandb writes under save_dir/wandb: its symlinks and logs, and one folder per run
# (run-YYYYMMDD_HHMMSS-ID, offline-run-... when offline).
WANDB = (
    "latest-run",
    "debug.log",
    "debug-internal.log",
    "run-????????_??????-*",
    "offline-run-????????_??????-*",
)
SHOWN = 5  # kept files named in the overwrite line


def planned(rounds: int | None, ranks: int | None) -> tuple[list[str], list[str]]:
    """(paths, folders) a run of ``rounds`` rounds on ``ranks`` processes may write; ``None``:
    any number (patterns), for a run directory that has no manifest."""
    paths = []
    for name in RUN_ENTRIES:
        if name not in FOLDERS:
            # and the temporary names its writer may use (name.tmp, or .name.tmp-PID)
            paths += [name, f"{name}.tmp", f".{name}.tmp-*"]
    paths += checkpoint.run_paths(rounds)
    # engine.Simulation keeps each rank's clients in store/rank_R (store: disk), and a streamed
    # round's encoder rows in store/rows
    paths += [f"store/rank_{r}" for r in range(ranks)] if ranks is not None else ["store/rank_[0-9]*"]
    paths += ["store/rows"]
    paths += [f"wandb/{name}" for name in WANDB]
    return paths, list(FOLDERS)


def read(run_dir: Path) -> dict | None:
    """The manifest of ``run_dir``; None when there is none or it cannot be read."""
    try:
        data = json.loads((run_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and all(
        isinstance(data.get(key), list) and all(isinstance(p, str) for p in data[key])
        for key in ("paths", "folders")
    )
    return data if ok else None


def record(run_dir: Path, rounds: int, ranks: int) -> None:
    """Add what this run may write to the manifest (the leader, under the lock, before writing)."""
    paths, folders = planned(rounds, ranks)
    current = read(run_dir)
    old = current or {"paths": [], "folders": []}
    if f"checkpoints/{checkpoint.round_name(rounds)}" in old["paths"]:
        # An older fedmtl's manifest names each round's folder: it already lists the rounds the
        # patterns cover, so a resume (of a finished run: no file changes) leaves it as it is.
        covered = set(checkpoint.run_paths(rounds))
        paths = [p for p in paths if p not in covered or p in old["paths"]]
    new = {
        "format": FORMAT,
        "about": "what fedmtl wrote in this folder; `fedmtl fit --overwrite true` removes these and nothing else",
        "paths": sorted(set(old["paths"]) | set(paths)),
        "folders": sorted(set(old["folders"]) | set(folders)),
    }
    if current == new:
        return  # e.g. resuming a finished run: no file changes
    path = run_dir / MANIFEST_FILE
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(new, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())  # on disk before the files it lists
    os.replace(tmp, path)


def looks_like_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` shows that a fedmtl run wrote there: its manifest, or (written before
    the manifest) a checkpoint pointer or round folder, a wandb run id, a metrics.csv with the
    run's header, or a config.yaml as ``fedmtl fit`` dumps it (every field, run_dir included)."""
    if (run_dir / MANIFEST_FILE).is_file() or (run_dir / "wandb_run_id").is_file():
        return True
    if (run_dir / "checkpoints" / "latest").is_file() or checkpoint.round_folders(run_dir):
        return True
    with contextlib.suppress(OSError, UnicodeDecodeError), open(run_dir / "metrics.csv") as f:
        if f.readline().strip() == "round,key,value":
            return True
    with contextlib.suppress(Exception):  # any YAML error: not a run's config
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        return isinstance(config, dict) and {"run_dir", "resume", "overwrite", "clients", "rounds"} <= set(
            config
        )
    return False


def _matches(parts: list[str], entries: list[list[str]], prefix: bool = False) -> bool:
    """Whether the path ``parts`` is an entry (or, with ``prefix``, lies inside one)."""
    return any(
        (len(parts) == len(e) or (prefix and len(parts) > len(e)))
        and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, e, strict=False))
        for e in entries
    )


def _sort(run_dir: Path, entries: list[list[str]]) -> tuple[list[Path], list[str]]:
    """The outermost paths under ``run_dir`` that are entries, and every other file (relative
    paths), the lock and manifest aside. Symlinks are never followed: a link is itself a file."""
    owned: list[Path] = []
    others: list[str] = []

    def visit(folder: Path, parts: list[str]) -> None:
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # unreadable: whatever is in it stays
            others.append("/".join(parts))
            return
        for name in names:
            path, here = folder / name, [*parts, name]
            if not parts and name in MACHINERY:
                continue
            if _matches(here, entries):
                owned.append(path)
            elif path.is_dir() and not path.is_symlink():
                visit(path, here)
            else:
                others.append("/".join(here))

    if run_dir.is_dir():
        visit(run_dir, [])
    return owned, others


def _count_files(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(len(files) for _, _, files in os.walk(path))
    return 1


def _named(paths: list[str]) -> str:
    return ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def check_overwrite(
    run_dir: Path, rounds: int, ranks: int, doing: str = "--overwrite true"
) -> tuple[list[Path], list[str], list[str], str]:
    """What ``--overwrite true`` would remove from ``run_dir`` and keep, and the folders it would
    remove if emptied, and how it knows; raises ValueError when the new run would replace a file
    the previous one did not write (a user's ``config.yaml``). Changes nothing."""
    manifest = read(run_dir)
    if manifest is not None:
        entries, folders, how = manifest["paths"], manifest["folders"], "manifest"
    elif looks_like_a_run(run_dir):
        (entries, folders), how = planned(None, None), "by name"
    else:
        entries, folders, how = [], [], "nothing"
    owned, kept = _sort(run_dir, [e.split("/") for e in entries])
    new = [e.split("/") for e in planned(rounds, ranks)[0]]
    clash = [rel for rel in kept if _matches(rel.split("/"), new, prefix=True)]
    if clash:
        raise ValueError(
            f"{doing}: run_dir {run_dir} holds {_named(clash)}, which no fedmtl run recorded writing there, "
            "and the new run would replace it; nothing was changed. Move it away, or choose another --run_dir"
        )
    return owned, kept, folders, how


def clear(run_dir: Path, rounds: int, ranks: int) -> str | None:
    """``--overwrite true``: remove what the previous run in ``run_dir`` wrote, nothing else.
    Returns the line to print (None when the folder held nothing); raises ValueError, before
    removing anything, when the new run would replace a file the previous one did not write."""
    owned, kept, folders, how = check_overwrite(run_dir, rounds, ranks)
    removed = sum(_count_files(p) for p in owned)
    for path in owned:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for name in sorted(folders, key=lambda f: f.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # not empty (a user's file) or not there: it stays
            (run_dir / name).rmdir()
    with contextlib.suppress(FileNotFoundError):
        (run_dir / MANIFEST_FILE).unlink()  # done with; the new run records its own
    if how == "manifest":
        line = f"overwrite: removed the previous run's {removed} files from {run_dir}"
    elif how == "by name":
        line = (
            f"overwrite: {run_dir} has no manifest (a run from an older fedmtl): removed the {removed} files "
            "there that fedmtl writes by name (the top-level run files, checkpoints/round_NNNN, "
            "checkpoints/latest, store/rank_N, wandb's runs and logs)"
        )
    elif kept:
        line = f"overwrite: {run_dir} holds no fedmtl run: removed nothing"
    else:
        return None
    if kept:
        line += f"; kept {len(kept)} file{'s' if len(kept) > 1 else ''} the run did not write: {_named(kept)}"
    return line
