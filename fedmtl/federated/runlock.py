"""One writer per run directory: an OS file lock on ``RUN_DIR/.fedmtl.lock``.

``fedmtl fit`` (fresh, ``--resume``, ``--overwrite``) and ``fedmtl validate``/``test`` hold
the lock from before their first write until they exit; a second process on the same
``run_dir`` is refused with one line naming the holder, and writes nothing. The lock is
``flock``: the kernel drops it when its process ends, however it ends (SIGKILL, OOM, a lost
node), so a dead run never leaves a stale lock behind. Under several ranks or nodes only the
leader (the process the user started, rank 0) takes it; Fabric's children do not inherit it.

While it holds the lock, the holder writes its PID, host, start time and command line into
the lock file, which a refused process reads for its message; on release the file is emptied
again, so a command that ends without writing anything leaves every byte of the run as it was.
The lock file itself is never removed (removing a lock file that another process may just
have opened would let two processes hold "the" lock). On Linux NFS, ``flock`` is carried out
as a POSIX byte-range lock and so holds across nodes; Lustre needs its ``flock`` mount option.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".fedmtl.lock"

# errnos meaning this filesystem cannot lock at all (rather than: someone holds the lock)
NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunDirBusy(ValueError):
    """Another process holds the run directory (a ValueError: the CLI prints it as one line)."""


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOCK_FILE


def command_line() -> str:
    """This process's command line as the user typed it (``python -m fedmtl`` shown as ``fedmtl``)."""
    argv = list(sys.argv)
    if argv and (argv[0].endswith(os.path.join("fedmtl", "__main__.py")) or Path(argv[0]).name == "fedmtl"):
        argv[0] = "fedmtl"
    text = shlex.join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def holder_record() -> bytes:
    """What a holder writes into its lock file: this process's PID, host, start and command."""
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "command": command_line()}
    return (json.dumps(holder) + "\n").encode()


def describe_holder(path: Path) -> str:
    """Who holds the lock, from what it wrote into the lock file."""
    try:
        info = json.loads(path.read_text())
        return (
            f"PID {info['pid']} on {info['host']}, started {info['since']}: {info['command']}"
            if isinstance(info, dict)
            else "a process that has not written its PID yet"
        )
    except (OSError, ValueError, KeyError):
        return "a process that has not written its PID yet"


def _busy(run_dir: Path, path: Path) -> RunDirBusy:
    return RunDirBusy(
        f"run_dir {run_dir} is in use by another fedmtl process ({describe_holder(path)}); nothing was "
        "changed. Wait for it to end, or stop it and continue the run with --resume true"
    )


def check_free(run_dir: str | Path) -> None:
    """Raise :class:`RunDirBusy` if a live process holds ``run_dir``; touches nothing (no lock
    file is created). An early answer: :func:`hold` is what guarantees one writer."""
    run_dir = Path(run_dir)
    path = lock_path(run_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file (or unreadable): nobody can be holding it
    try:
        # A shared probe: it conflicts with the holder's exclusive lock, and needs only read
        # access (NFS refuses an exclusive lock on a read-only descriptor).
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise _busy(run_dir, path) from None
    finally:
        os.close(fd)  # also releases the probe's shared lock


@contextlib.contextmanager
def hold(run_dir: str | Path, command: str = "fit") -> Iterator[None]:
    """Hold ``run_dir`` (created if missing) for the ``with`` block: the only writer."""
    run_dir = Path(run_dir)
    path = lock_path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # O_RDWR without O_TRUNC: the file may be the current holder's, whose details we read.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            what = (
                f"cannot write its lock file {path}" if path.exists() else f"cannot create {path.name} there"
            )
            raise ValueError(
                f"run_dir {run_dir} is read-only for this process ({what}: {err.strerror}); "
                f"`fedmtl {command}` writes into the run directory: copy the run to a writable folder "
                "and pass that as --run_dir"
            ) from None
        raise
    try:
        for attempt in range(3):  # ride over another process's momentary probe (check_free)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno in NO_LOCKING:
                    print(
                        f"warning: the filesystem of {run_dir} cannot lock files ({err.strerror}): make sure "
                        "no other fedmtl process writes to this run directory",
                        file=sys.stderr,
                    )
                    break
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if attempt == 2:
                    raise _busy(run_dir, path) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_record(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # an idle run directory has an empty lock file
    finally:
        os.close(fd)  # releases the lock
