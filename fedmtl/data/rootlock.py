"""One writer per data root: an OS file lock on ``DATA_ROOT/.fedmtl-data.lock``.

Every command that writes datasets holds the data root while it writes: ``fedmtl data
prepare`` (its ``--root``), ``fedmtl data synth`` (the folder holding its ``--root``, the
dataset folder) and a ``fedmtl fit`` that generates the synthetic data its config asks for
(``data.root``). A second writer waits, saying once for whom, then goes on as if it had been
started after the first ended: it sees what the first wrote (a synth then refuses the folder
that now holds a dataset, a prepare of the same archives finds every file there and changes
nothing, a fit finds its data and uses it).

The lock is :mod:`fedmtl.federated.runlock`'s ``flock``: the kernel drops it however its
holder ends, so a killed writer never leaves a stale lock. Unlike a run directory's, the lock
file is removed when its holder is done (a data root is the user's folder, and an idle one
keeps no trace): the holder unlinks it while still holding it, and a process that got the
lock checks that the file it locked is still the one at that path, else it locked a removed
file and locks the new one. Within one process the lock is re-entrant (a fit holds the data
root while the generator it calls takes it again).

Staging folders: each writer stages in a folder named after its host and PID, and writes
itself (PID, host, command) into the folder's marker file. A leftover is deleted only when its
owner is gone: a PID of this host that no longer runs, or, for another host's, when this
process holds the data root's lock (its owner, a writer, would hold it). Never by age.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fedmtl.federated.runlock import NO_LOCKING, describe_holder, holder_record

LOCK_FILE = ".fedmtl-data.lock"

_held: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of a data root this process holds -> depth
_fds: set[int] = set()  # the lock files this process holds open


def _close_in_child() -> None:
    """A forked child (the generator's worker processes) must not keep the lock alive after its
    parent is killed: closing its copy leaves the parent's lock in place (LOCK_UN would not)."""
    for fd in _fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _fds.clear()
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


@dataclass(frozen=True)
class Held:
    """A data root held by this process; ``locked`` is False where its filesystem cannot lock."""

    root: Path
    locked: bool


def file_in_path(path: Path) -> Path | None:
    """The first component of ``path`` (or ``path`` itself) that exists and is not a folder."""
    for part in [*reversed(path.parents), path]:
        if part.is_symlink() and not part.exists():  # a broken link cannot hold a folder either
            return part
        if part.exists() and not part.is_dir():
            return part
    return None


def make_folder(folder: Path, option: str, shown: Path | str) -> None:
    """Create ``folder`` (and its parents); ValueError naming the file in the way or the folder
    that cannot be written. ``option`` and ``shown``: the setting and value the user gave."""
    blocker = file_in_path(folder)
    if blocker is not None:
        where = "is" if Path(shown).absolute() == blocker.absolute() else f"is under {blocker}, which is"
        raise ValueError(
            f"{option} {shown} {where} a file, not a folder: choose another {option}, or move {blocker} away"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except PermissionError as err:
        raise ValueError(
            f"cannot create {err.filename or folder} ({err.strerror}): {option} {shown} must be in a "
            f"folder you can write to; choose another {option}"
        ) from None


def _open_lock(path: Path, option: str, shown: Path | str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ValueError(
                f"cannot create {path} ({err.strerror}): {option} {shown} must be in a folder you can "
                f"write to; choose another {option}"
            ) from None
        raise


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


@contextlib.contextmanager
def hold(root: Path, option: str = "--root", shown: Path | str | None = None) -> Iterator[Held]:
    """Hold the data root ``root`` (created if missing) for the ``with`` block, waiting while
    another process holds it. ``option``/``shown`` name it in messages as the user gave it."""
    root = Path(root)
    shown = root if shown is None else shown
    path = root / LOCK_FILE
    make_folder(root, option, shown)
    stat = root.stat()
    key = (stat.st_dev, stat.st_ino)
    if key in _held:  # this process holds it already (a fit, then the generator it calls)
        _held[key] += 1
        try:
            yield Held(root, True)
        finally:
            _held[key] -= 1
        return
    said = False
    locked = True
    while True:
        make_folder(root, option, shown)  # again: a prepare that made it removes it when empty
        try:
            fd = _open_lock(path, option, shown)
        except FileNotFoundError:  # that prepare removed it just now: make it again
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in NO_LOCKING:
                    print(
                        f"warning: the filesystem of {root} cannot lock files ({err.strerror}): make sure "
                        "no other fedmtl process writes datasets into this folder meanwhile",
                        file=sys.stderr,
                    )
                    locked = False
                elif err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    if not said:
                        print(
                            f"waiting for {describe_holder(path)}, which is writing data in {root}",
                            file=sys.stderr,
                            flush=True,
                        )
                        said = True
                    fcntl.flock(fd, fcntl.LOCK_EX)  # a signal still stops the wait (stopping.py)
                else:
                    raise
        except BaseException:
            os.close(fd)
            raise
        if not locked or _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file we waited on: lock the one there now
    try:
        _fds.add(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_record(), 0)
        _held[key] = 1
        try:
            yield Held(root, locked)
        finally:
            del _held[key]
            with contextlib.suppress(OSError):
                path.unlink()  # while still holding it: a waiter then sees another file there
    finally:
        _fds.discard(fd)
        os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- staging folders


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def staging_path(parent: Path, base: str) -> Path:
    """This process's staging folder: ``parent/base.HOST.PID``."""
    return parent / f"{base}.{_host()}.{os.getpid()}"


def write_marker(staging: Path, marker: str, doing: str) -> None:
    """Mark ``staging`` as ours: the owner's PID, host and command, and what it is for."""
    record = json.loads(holder_record()) | {"doing": doing}
    (staging / marker).write_text(json.dumps(record) + "\n")


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def owner_gone(owner: dict | None, locked: bool) -> bool:
    """Whether the owner of a staging folder (its marker's record; None: a marker that records
    no owner) can no longer be writing it. ``locked``: this process holds the data root."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return locked
    if owner.get("host") == socket.gethostname():
        return owner["pid"] == os.getpid() or not _pid_runs(owner["pid"])
    return locked  # another host's PID cannot be checked; its writer would hold the lock


def _owner(marker: Path) -> dict | None:
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def clear_leftovers(parent: Path, base: str, marker: str, whose: str, locked: bool) -> list[Path]:
    """Delete the staging folders (``parent/base`` and ``parent/base.*``) whose owners are gone;
    return them. One without ``marker`` is not ours: ValueError naming it (nothing deleted)."""
    if not parent.is_dir():
        return []
    found = sorted(p for p in parent.iterdir() if p.name == base or p.name.startswith(base + "."))
    for staging in found:
        if staging.is_symlink() or not staging.is_dir() or not (staging / marker).is_file():
            raise ValueError(
                f"{staging} is in the way: it has the name of {whose} staging folder but not its marker "
                f"file {marker}, so it is not deleted: move or delete it, then run again"
            )
    removed = []
    for staging in found:
        if owner_gone(_owner(staging / marker), locked):
            shutil.rmtree(staging)
            removed.append(staging)
    return removed
