"""Where client state waits between rounds, and safe, atomic files for it.

A client's state is its model's state dict (parameters and buffers), its optimiser and
scheduler state and its count of local epochs done: everything needed to continue it
exactly. Between rounds the state lives on the host, either in memory or on disk, so only
the clients being trained occupy a device and the number of clients is bounded by disk.

Files are written to a temporary name and renamed into place (a crash mid-write leaves the
previous file intact; the client store skips the fsync, as a crash resumes from the
checkpoint) and read with ``torch.load(weights_only=True)``: tensors, numbers and
strings only, never arbitrary pickled objects. A write that fails for a reason outside the
run (a full disk, a quota, an I/O error, a read-only file system, permissions, a file-size
limit: :data:`OS_FIXES`) removes its temporary file and raises :class:`WriteFailed`, which
names the file and, for a full disk, the space it needs and the space free
(:func:`describe_write_error`): the CLI prints it as one line with the fix (:func:`os_fix`).
torch.save writes through a Python file object, so that a failing write's OSError (a
file-size limit's EFBIG) reaches the chain of torch's RuntimeError instead of being lost
inside its C++ writer.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedmtl.federated import packing
from fedmtl.files import (  # noqa: F401 - the run's writers and the CLI find them here too
    OS_FIXES,
    WRITE_ERRNOS,
    WriteFailed,
    describe_write_error,
    os_failure,
    os_fix,
    writing,
)
from fedmtl.tensors import to_host

ClientState = dict[str, Any]


def payload_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (about what :func:`atomic_save` writes)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(payload_bytes(v) for v in obj)
    return 0


def atomic_save(obj: Any, path: str | Path, durable: bool = True) -> None:
    """``path`` holds ``obj`` whole, or is as it was (see :func:`writing`). ``durable``: on disk
    before this returns (fsync); scratch files skip it and the kernel writes them back while
    the run goes on."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path, tmp, needed=payload_bytes(obj)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str, durable: bool = True) -> None:
    """``path`` holds ``text`` whole, or is as it was (see :func:`writing`); ``durable`` as
    :func:`atomic_save`'s."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = text.encode()
    with writing(path, tmp, needed=len(data)):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)


def safe_load(path: str | Path, mmap: bool = False) -> Any:
    """Read a file :func:`atomic_save` wrote; a missing, truncated, corrupt or foreign file is
    one line naming it (FileNotFoundError / ValueError), never torch's multi-line traceback.
    ``mmap``: tensors map the file and are read when used (a reader that needs a part of it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; resume from another checkpoint or start a new run")
    try:
        with warnings.catch_warnings():  # e.g. torch's note on pickle protocols: the error says enough
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        return packing.unpack(obj) if packing.is_packed(obj) else obj
    except Exception as err:  # torch raises anything from EOFError to UnpicklingError on a bad file
        if os_failure(err) is not None:  # unreadable (permissions, a limit), not damaged: the CLI says so
            raise
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


#: The parts of a training track (``methods.base.Track``) that are optimiser and schedule state,
#: stored apart from the parameters so that evaluation reads the parameters alone.
TRAINING_KEYS = ("optimizer", "scheduler")


def split_state(state: ClientState) -> tuple[ClientState, dict[str, Any]]:
    """``state`` as (its parameters and everything else, its tracks' optimiser and schedule
    state by path): a track is any dict with a ``"model"``, at any depth (Ditto keeps a second
    track in its personal state)."""
    training: dict[str, Any] = {}

    def walk(tree: Any, path: str) -> Any:
        if not isinstance(tree, dict):
            return tree
        track = "model" in tree
        out = {}
        for key, value in tree.items():
            if track and key in TRAINING_KEYS:
                training[f"{path}{key}"] = value
                out[key] = None
            else:
                out[key] = walk(value, f"{path}{key}/")
        return out

    return walk(state, ""), training


def join_state(params: ClientState, training: dict[str, Any]) -> ClientState:
    """The inverse of :func:`split_state` (in place on ``params``)."""
    for path, value in training.items():
        *parents, key = path.split("/")
        node = params
        for name in parents:
            node = node[name]
        node[key] = value
    return params


#: The key of a stored state whose encoder parameters live in the round's ``"trained"`` row
#: file (rows.py) instead of the state's own file: a run whose server step reads the trained
#: encoders from files then writes each encoder once a round, not twice. Its value says which
#: round's row, and where each parameter goes.
ENCODER_ROW = "encoder_row"


def without_encoder(state: ClientState, keys: Sequence[str], round_: int) -> ClientState:
    """``state`` without the encoder parameters ``keys`` (laid out in this order in round
    ``round_``'s ``"trained"`` row), naming that row under :data:`ENCODER_ROW`."""
    model = state["model"]
    info = {
        "round": round_,
        "keys": list(keys),
        "shapes": [list(model[k].shape) for k in keys],
        "order": list(model),
    }
    dropped = set(keys)
    return {**state, "model": {k: v for k, v in model.items() if k not in dropped}, ENCODER_ROW: info}


def encoder_row_of(state: ClientState) -> int | None:
    """The round whose ``"trained"`` row holds ``state``'s encoder (None: its own file does)."""
    info = state.get(ENCODER_ROW)
    return None if info is None else int(info["round"])


def encoder_row_numel(state: ClientState) -> int:
    """The numbers in the row that holds ``state``'s encoder."""
    return sum(math.prod(shape) for shape in state[ENCODER_ROW]["shapes"])


def with_encoder(state: ClientState, row: torch.Tensor) -> ClientState:
    """The inverse of :func:`without_encoder`, given the row it names."""
    info = state[ENCODER_ROW]
    numels = [math.prod(shape) for shape in info["shapes"]]
    if sum(numels) != row.numel():
        raise ValueError(
            f"an encoder row of {row.numel()} numbers cannot hold this client's encoder of {sum(numels)}"
        )
    encoder = {
        key: part.view(shape)
        for key, shape, part in zip(info["keys"], info["shapes"], row.split(numels), strict=True)
    }
    model = state["model"]
    out = {k: v for k, v in state.items() if k != ENCODER_ROW}
    out["model"] = {k: encoder[k] if k in encoder else model[k] for k in info["order"]}
    return out


class ClientStore:
    """Client states by client index, kept in host memory or as files under ``directory``.

    A disk store keeps a client's parameters (and the method's personal state) apart from its
    optimiser and schedule state, ``client_0007.pt`` and ``client_0007.optim.pt``, so that an
    evaluation reads the first alone."""

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

    def _training_path(self, client: int) -> Path:
        return training_file(self._path(client))

    def put(self, client: int, state: ClientState) -> None:
        if self.kind == "memory":
            self._states[client] = to_host(state)
            return
        # Scratch (a crash resumes from the checkpoint), so no fsync: the disk catches up
        # while the next client trains. A checkpoint that links the files syncs them.
        # Packed (packing.py): a few buffers to write and read, not a few hundred tensors.
        params, training = split_state(state)
        if any(value is not None for value in training.values()):
            atomic_save(packing.pack(training), self._training_path(client), durable=False)
        else:
            self._training_path(client).unlink(missing_ok=True)
        atomic_save(packing.pack(params), self._path(client), durable=False)

    def get(self, client: int, params_only: bool = False) -> ClientState:
        """``client``'s state; ``params_only``: without its optimiser and schedule state (an
        evaluation), which a disk store then does not read."""
        if self.kind == "memory":
            return self._states[client]
        state = safe_load(self._path(client))
        training = self._training_path(client)
        if params_only or not training.is_file():
            return state
        return join_state(state, safe_load(training))

    def files_of(self, client: int) -> list[Path]:
        """The files holding ``client``'s state (a disk store that has them), else []."""
        if self.kind != "disk":
            return []
        return [p for p in (self._path(client), self._training_path(client)) if p.is_file()]

    def clear(self) -> None:
        """Forget every state (a disk store removes its files; the checkpoint keeps a copy)."""
        self._states.clear()
        if self.kind == "disk" and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __contains__(self, client: int) -> bool:
        return client in self._states if self.kind == "memory" else self._path(client).is_file()


def training_file(path: Path) -> Path:
    """The file beside a client's state file that holds its optimiser and schedule state."""
    return path.with_name(path.name.replace(".pt", ".optim.pt"))
