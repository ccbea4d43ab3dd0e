"""Where client state waits between rounds, and safe, atomic files for it.

A client's state is its model's state dict (parameters and buffers), its optimiser and
scheduler state and its count of local epochs done: everything needed to continue it
exactly. Between rounds the state lives on the host, either in memory or on disk, so only
the clients being trained occupy a device and the number of clients is bounded by disk.

Files are written to a temporary name and renamed into place (a crash mid-write leaves the
previous file intact) and read with ``torch.load(weights_only=True)``: tensors, numbers and
strings only, never arbitrary pickled objects.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

ClientState = dict[str, Any]


def to_host(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are detached CPU copies (never views of live tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_host(v) for v in obj)
    return obj


def atomic_save(obj: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def safe_load(path: str | Path) -> Any:
    """Read a file :func:`atomic_save` wrote; a missing, truncated, corrupt or foreign file is
    one line naming it (FileNotFoundError / ValueError), never torch's multi-line traceback."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; resume from another checkpoint or start a new run")
    try:
        with warnings.catch_warnings():  # e.g. torch's note on pickle protocols: the error says enough
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises anything from EOFError to UnpicklingError on a bad file
        with open(path, "rb") as f:
            head = f.read(1024)
        try:
            is_text = bool(head) and b"\0" not in head and bool(head.decode("utf-8"))
        except UnicodeDecodeError:
            is_text = False
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        # torch's weights-only refusal is six lines of advice; its reason follows this marker
        marker = [i + 1 for i, line in enumerate(lines[:-1]) if line.endswith("WeightsUnpickler error:")]
        empty = "it ends early" if isinstance(err, EOFError) else type(err).__name__
        reason = lines[marker[0] if marker else 0] if lines else empty
        problem = (
            "is a text file, not a PyTorch checkpoint"
            if is_text
            else f"is corrupt, truncated or not a PyTorch checkpoint ({reason[:160]})"
        )
        raise ValueError(
            f"{path} {problem}; it cannot be loaded — resume from another checkpoint or start a new run"
        ) from err


class ClientStore:
    """Client states by client index, kept in host memory or as files under ``directory``."""

    def __init__(self, kind: str = "memory", directory: str | Path | None = None) -> None:
        if kind not in ("memory", "disk"):
            raise ValueError(f"store must be 'memory' or 'disk', got {kind!r}")
        if kind == "disk" and directory is None:
            raise ValueError("a disk store needs a directory")
        self.kind = kind
        self.directory = Path(directory) if directory is not None else None
        self._states: dict[int, ClientState] = {}

    def _path(self, client: int) -> Path:
        assert self.directory is not None
        return self.directory / f"client_{client:04d}.pt"

    def put(self, client: int, state: ClientState) -> None:
        state = to_host(state)
        if self.kind == "memory":
            self._states[client] = state
        else:
            atomic_save(state, self._path(client))

    def get(self, client: int) -> ClientState:
        if self.kind == "memory":
            return self._states[client]
        return safe_load(self._path(client))

    def clear(self) -> None:
        """Forget every state (a disk store removes its files; the checkpoint keeps a copy)."""
        self._states.clear()
        if self.kind == "disk" and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __contains__(self, client: int) -> bool:
        return client in self._states if self.kind == "memory" else self._path(client).is_file()
