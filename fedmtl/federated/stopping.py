"""SIGTERM and SIGINT: a run stops at a safe point, says how to resume, and exits 128 + n.

SLURM and Kubernetes end a job with SIGTERM (then SIGKILL after a grace period); Ctrl-C sends
SIGINT to every process of the terminal's group. Outside a training loop a signal stops the
command at once, as Ctrl-C always did, by raising :class:`Stopped`. Inside one
(:func:`deferred`) it only records the request: the loop's data loaders (:func:`checked`)
raise :class:`Abandoned` at the next batch, and the engine's ranks agree at the end of each
phase of a round whether any of them was asked to stop. So a checkpoint is never cut short
(it is written whole, or the round is not saved), every rank stops at the same point (a rank
that stopped alone would leave the others waiting in a collective), and the loggers are
closed on the way out. A second signal to the process the user started exits at once.

The process Fabric launched the other local ranks from passes its signal on to them (a
``kill PID`` reaches that process only), and once a stop is agreed it tells Lightning's
child-process observer that the children's non-zero exit is expected: the observer would
otherwise SIGKILL the launcher before it says how to resume.

A rank that dies without a word (``kill -9``, the out-of-memory killer, a lost machine) is
said in one line by a rank that survives it (:func:`peer_lost`): by the launcher when its
observer sees a local rank ended by a signal, or by any rank whose next collective fails on the
closed connection (:func:`is_peer_lost`), never as that collective's traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: The signals that stop a run at a safe point.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A run stopped on a signal; the CLI prints how to resume and exits ``exit_code``.
    Derived from BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it.

    Args:
        signum: the signal.
        round: the round in progress or just finished (None: training had not started).
        finished: whether that round finished (its checkpoint, if it has one, is complete).
    """

    def __init__(self, signum: int, round: int | None = None, finished: bool = False) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum
        self.round = round
        self.finished = finished

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Abandoned(BaseException):
    """Leave the current phase of a round now (a stop was requested); the engine catches it
    where the ranks agree to stop, never later."""


class PeerFailed(Exception):
    """Another rank failed (and said why); this rank stops with it, silently."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class _State:
    leader: bool = True  # the process the user started: it prints, and a second signal ends it
    pid: int = 0  # the process that installed the handlers (DataLoader workers inherit them)
    deferring: int = 0  # depth of deferred() blocks
    requested: int = 0  # the first signal received (0: none)
    children: list[int] = field(default_factory=list)  # local ranks this process launched
    lost_said: threading.Lock = field(default_factory=threading.Lock)  # one line for a lost rank
    farewell: Callable[[int], str] | None = None  # the line for a second signal


_state = _State()


def requested() -> int:
    """The signal a stop was requested with (0: none)."""
    return _state.requested


def _handle(signum: int, frame: Any) -> None:
    if os.getpid() != _state.pid:
        return  # a DataLoader worker (forked): the training process ends it
    if not _state.deferring:
        raise Stopped(signum)
    if _state.requested:
        if _state.leader:  # a second signal: out now, not at a safe point
            with contextlib.suppress(Exception):  # nothing may keep the process from ending
                if _state.farewell is not None:
                    print(_state.farewell(signum), file=sys.stderr, flush=True)
            for pid in _state.children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(128 + signum)
        # Another rank: the first signal already asked it to stop (Ctrl-C reaches it both from
        # the terminal and from the launcher).
        return
    _state.requested = signum
    for pid in _state.children:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


@contextlib.contextmanager
def handling(leader: bool, farewell: Callable[[int], str] | None = None) -> Iterator[None]:
    """SIGTERM and SIGINT handled as this module says while the block runs (one CLI command);
    the previous handlers come back after it. ``farewell(signum)``: the line a second signal
    prints before the process exits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (an embedding program keeps its own)
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state.leader, _state.farewell, _state.requested, _state.pid = leader, farewell, 0, os.getpid()
    for s in SIGNALS:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.farewell, _state.requested, _state.children = None, 0, []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal received in this block only requests a stop (:func:`requested`)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1


def check() -> None:
    """Raise :class:`Abandoned` when a stop was requested in a :func:`deferred` block."""
    if _state.requested and _state.deferring:
        raise Abandoned


def checked(batches: Iterable[T]) -> Iterable[T]:
    """``batches`` (a DataLoader) that checks for a stop request before each batch."""
    return _Checked(batches)


class _Checked:
    def __init__(self, batches: Iterable[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            check()
            yield batch

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


def watch_children(fabric: Any, run_dir: Any = None) -> None:
    """Pass this process's signals on to the local ranks its Fabric launched (if any), and
    forward a stop requested before they existed. ``run_dir``: a local rank ended by a signal
    (``kill -9``) is said in one line (:func:`peer_lost`) before this process exits, where
    Lightning's observer would SIGKILL it without a word."""
    launcher = getattr(fabric.strategy, "launcher", None)
    procs = list(getattr(launcher, "procs", []))
    _state.children = [p.pid for p in procs]
    if _state.requested:
        for pid in _state.children:
            with contextlib.suppress(OSError):
                os.kill(pid, _state.requested)
    if run_dir is None or not procs:
        return
    for thread in threading.enumerate():
        if type(thread).__name__ == "_ChildProcessObserver":
            thread._run = functools.partial(_observe, procs, thread._run, run_dir)  # type: ignore[attr-defined]


def _observe(procs: list[Any], observe: Callable[[], bool], run_dir: Any) -> bool:
    """One look of Lightning's child-process observer (``observe``: its own, which SIGKILLs this
    process without a word when a local rank exits non-zero): a rank ended by a signal is said
    in one line, the other ranks are killed as Lightning would, and this process exits 1. A rank
    that exited with an error of its own said why: Lightning's way."""
    dead = [(rank, p.poll()) for rank, p in enumerate(procs, start=1)]
    dead = [(rank, code) for rank, code in dead if code is not None and code < 0]
    if not dead:
        return observe()
    for p in procs:
        with contextlib.suppress(OSError):
            p.kill()  # a rank waiting in a collective with the dead one would hang
    rank, code = dead[0]
    with contextlib.suppress(PeerFailed):
        peer_lost(f"the process of rank {rank}", f"ended by {signal_name(-code)}", run_dir)
    os._exit(1)


#: How gloo and NCCL report a collective whose peer is gone (its process killed, its machine lost).
_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|Socket closed|remote process exited|"
    r"communicator was aborted|ECONNRESET|EPIPE",
    re.IGNORECASE,
)


def is_peer_lost(err: BaseException) -> bool:
    """Whether ``err`` (raised by a collective) says that another rank's process is gone."""
    return isinstance(err, RuntimeError) and bool(_PEER_LOST.search(str(err)))


def lost_line(who: str, how: str, run_dir: Any) -> str:
    """The line said when ``who`` (another rank's process) ended unexpectedly (``how``): the
    latest complete checkpoint of ``run_dir`` and how to continue from it."""
    from fedmtl.federated import checkpoint  # here: this module is imported by every command

    folder = checkpoint.latest(run_dir)
    if folder is None:
        with contextlib.suppress(ValueError, OSError):
            folder, _ = checkpoint.resumable(run_dir)
    state = (
        f"the latest complete checkpoint is {folder.name}: continue the run with --resume true"
        if folder is not None
        else "no checkpoint was written: start the run again with --overwrite true"
    )
    return f"error: {who} ended unexpectedly ({how}: killed, out of memory, or its machine failed); {state}"


def peer_lost(who: str, how: str, run_dir: Any) -> None:
    """Say once, on this process's stderr, that another rank's process is gone (:func:`lost_line`),
    and stop this rank silently (:class:`PeerFailed`)."""
    if _state.lost_said.acquire(blocking=False):
        with contextlib.suppress(Exception):  # nothing may keep the rank from stopping
            print(lost_line(who, how, run_dir), file=sys.stderr, flush=True)
    raise PeerFailed(f"{who} ended unexpectedly")


def expect_children_exit() -> None:
    """The ranks agreed to stop: the children will exit non-zero on purpose. Lightning's
    observer thread SIGKILLs the launcher when a child does; end its watch (its loop stops
    when its check returns True)."""
    for thread in threading.enumerate():
        if type(thread).__name__ == "_ChildProcessObserver":
            thread._run = lambda: True  # type: ignore[attr-defined]
