"""Files replaced whole, and the operating system's refusals as one line.

Every file a command replaces is written to a hidden temporary name in its folder
(``.NAME.tmp-PID``) and renamed over it (:func:`replace_file`): a write that cannot finish (a
full disk, a file-size limit, a kill) leaves the previous file byte for byte, and a failing
write removes its temporary file. The failures that come from outside the run
(:data:`OS_FIXES`: a full disk, permissions, a read-only file system, a file-size or open-file
limit, a symbolic-link loop, a file in a path where a folder must be) are found behind any
error (:func:`os_failure`) and said with the file, the cause and the fix
(:func:`describe_write_error`, :func:`os_fix`). No torch here: ``fedmtl report`` uses it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

#: Failures of the operating system that come from outside the run, each with what fixes it:
#: a full disk, a quota, an I/O error, a read-only file system, permissions, a file-size or
#: open-file limit (``ulimit -f``, ``ulimit -n``), a symbolic-link loop, a file where a folder
#: must be. They are one line naming the file, the cause and the fix, never a traceback.
OS_FIXES = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space (quota)",
    errno.EIO: "check the disk",
    errno.EROFS: "make the file system writable (it is mounted read-only)",
    errno.EACCES: "give this user access to it (ls -ld shows its owner and mode)",
    errno.EPERM: "give this user access to it (ls -ld shows its owner and mode)",
    errno.EFBIG: "raise the file-size limit (ulimit -f)",
    errno.EMFILE: "raise the open-file limit (ulimit -n)",
    errno.ENFILE: "close other programs' files (the system's table of open files is full)",
    errno.ELOOP: "fix the symbolic link in that path that leads back to itself",
    errno.ENOTDIR: "move away the file that stands in that path where a folder must be",
    errno.EEXIST: "move away what is at that path (a file where a folder must be made)",
    errno.ENAMETOOLONG: "use a shorter path",
}

#: The errnos of :data:`OS_FIXES`: a write failing with one is :class:`WriteFailed`.
WRITE_ERRNOS = frozenset(OS_FIXES)


class WriteFailed(OSError):
    """Writing ``filename`` failed with one of :data:`WRITE_ERRNOS`; nothing partial was kept.
    ``needed``: the bytes the file needed, when known."""

    def __init__(self, err: OSError, path: Path, needed: int | None = None) -> None:
        super().__init__(err.errno, err.strerror or os.strerror(err.errno or 0), str(path))
        self.needed = needed
        self.free = _free_bytes(path)  # now: what is freed after the failure would not explain it

    def __str__(self) -> str:
        return describe_write_error(self)


#: How Python 3.11's ``Path.resolve`` reports a symbolic-link loop: a RuntimeError, no errno.
_SYMLINK_LOOP = re.compile(r"Symlink loop from '(.*)'$")


def os_failure(err: BaseException | None) -> OSError | None:
    """The operating-system failure of :data:`OS_FIXES` behind ``err`` (itself, or in its
    ``__cause__`` / ``__context__`` chain): torch.save reports a full disk or a file-size limit
    as a RuntimeError of its zip writer, raised while handling the OSError; pathlib reports a
    symbolic-link loop as a RuntimeError naming the path. None: ``err`` is something else."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno in OS_FIXES:
            return err
        if isinstance(err, RuntimeError) and (loop := _SYMLINK_LOOP.match(str(err))):
            return OSError(errno.ELOOP, os.strerror(errno.ELOOP), loop.group(1))
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def describe_write_error(err: OSError, where: Path | None = None) -> str:
    """``err`` (of :data:`OS_FIXES`) as words: what failed and the file (or ``where``, when the
    error does not name one) — "writing" it for a :class:`WriteFailed` — and for a full disk
    the space needed and free."""
    path = Path(err.filename) if err.filename else where
    what = (err.strerror or os.strerror(err.errno or 0)).rstrip(".").lower()
    if path is None:
        text = what
    elif not err.filename:
        text = f"{what} writing into {path}"
    elif isinstance(err, WriteFailed):
        text = f"{what} writing {path}"
    else:  # an open, a folder made, a rename: the path (and the second one, a rename's target)
        text = f"{what}: {path}" + (f" -> {err.filename2}" if err.filename2 else "")
    if err.errno in (errno.ENOSPC, errno.EDQUOT) and path is not None:
        needed = getattr(err, "needed", None)
        free = err.free if isinstance(err, WriteFailed) else _free_bytes(path)
        space = [f"it needs about {_mib(needed)}"] if needed else []
        space += [f"{_mib(free)} free there"] if free is not None else []
        if space:
            text += f" ({'; '.join(space)})"
    return text


def os_fix(err: OSError) -> str:
    """What removes the cause of ``err`` (of :data:`OS_FIXES`), in words."""
    return OS_FIXES.get(err.errno, "check the disk")  # type: ignore[arg-type]


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


@contextlib.contextmanager
def writing(path: Path, tmp: Path | None = None, needed: int | None = None) -> Iterator[None]:
    """Write ``path`` (through ``tmp``) in this block: on any failure ``tmp`` is removed, and
    a failure of :data:`WRITE_ERRNOS` becomes :class:`WriteFailed` naming ``path``."""
    try:
        yield
    except BaseException as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        cause = os_failure(err)
        if cause is None or isinstance(err, WriteFailed):
            raise
        raise WriteFailed(cause, path, needed) from err


def temporary_name(path: Path) -> Path:
    """The hidden name ``path`` is written under before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def remove_stale(path: Path) -> None:
    """Remove the temporary files of ``path`` that killed processes (SIGKILL) left: those whose
    PID no process of this machine has."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        except OSError:  # alive, another user's
            pass


def replace_file(
    path: str | Path, write: Callable[[BinaryIO], None], durable: bool = True, overwrite: bool = True
) -> None:
    """``path`` holds what ``write`` writes to the file object it is given, whole, or is as it
    was: written to :func:`temporary_name` and renamed (see :func:`writing`). ``overwrite``
    false: a file that is at ``path`` by then (one that appeared after a command's checks) is
    never replaced (FileExistsError)."""
    path = Path(path)
    tmp = temporary_name(path)
    remove_stale(path)
    with writing(path, tmp):
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)  # fails if the name is taken: atomic, and never replacing
        except FileExistsError:
            raise ValueError(f"{path} appeared while this command ran and was left as it is") from None
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if path.exists():  # a file system without hard links: checked, then renamed
                raise ValueError(f"{path} appeared while this command ran and was left as it is") from None
            os.replace(tmp, path)
        tmp.unlink(missing_ok=True)
