"""A streamed round's encoder rows, one file per client and row, read a block of columns at a time.

    RUN_DIR/store/rows/round_0003/client_0007.trained.f32     P float32 numbers, raw

Every rank writes the rows of its own clients (the names the method asks for) and reads every
client's: the run directory is on a file system all ranks share, so each rank computes the same
server step from the same bytes in the same order, whatever the number of devices or nodes.
Reads go through ``pread`` into a buffer of one block, never ``mmap``: a process holds one
block of N rows at a time, not the file pages of all of them.

The files are scratch: written without ``fsync`` (a crash resumes from the checkpoint, not
from them), one folder per round; a row goes once the server step has read it and no pending
receipt names it (``receipts.py``), and all of them with the store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedmtl.aggregation.stream import EncoderRows
from fedmtl.federated.store import writing

FOLDER = "rows"  # under RUN_DIR/store


def round_folder(rows_dir: Path, round_: int) -> Path:
    return rows_dir / f"round_{round_:04d}"


def row_path(folder: Path, client: int, name: str) -> Path:
    return folder / f"client_{client:04d}.{name}.f32"


def write_row(folder: Path, client: int, name: str, row: Tensor) -> None:
    """Client ``client``'s row ``name``, whole or not at all (a temporary file renamed into place)."""
    path = row_path(folder, client, name)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = row.detach().to("cpu", torch.float32).contiguous().numpy()
    with writing(path, tmp, needed=data.nbytes):
        folder.mkdir(parents=True, exist_ok=True)
        data.tofile(tmp)
        os.replace(tmp, path)


def read_row(folder: Path, client: int, name: str, numel: int) -> Tensor:
    """Client ``client``'s whole row ``name`` [numel] (zeros if it has none)."""
    return FileRows(name, folder, numel, num_rows=client + 1).read([client], slice(0, numel))[0]


def start_round(rows_dir: Path, round_: int, clients: Sequence[int], names: Sequence[str]) -> None:
    """Before a round's training: each rank removes what a killed attempt at this round may
    have left of its own clients' rows, so a client that does not train has none. (Rows of
    earlier rounds go when no receipt names them any more: ``receipts.py``.)"""
    folder = round_folder(rows_dir, round_)
    if folder.is_dir():
        for client in clients:
            for name in names:
                row_path(folder, client, name).unlink(missing_ok=True)


class FileRows(EncoderRows):
    """Row ``name`` of clients 0..N-1 in ``folder``. A client without a file reads as zeros (it
    did not train this round; a method weighs only those that did, unless it asks for every
    client's rows). Rows it makes (:meth:`EncoderRows.mix`) are written for the clients
    ``owned`` (this rank's: each rank computes every row, and writes back only its own)."""

    def __init__(
        self,
        name: str,
        folder: Path,
        numel: int,
        num_rows: int,
        owned: Sequence[int] | None = None,
        block_columns: int | None = None,
    ) -> None:
        super().__init__(name, num_rows, numel, block_columns)
        self.folder = Path(folder)
        self.owned = list(range(num_rows)) if owned is None else list(owned)

    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        width = columns.stop - columns.start
        out = np.zeros((len(rows), width), dtype=np.float32)
        for k, client in enumerate(rows):
            path = row_path(self.folder, client, self.name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                got = os.preadv(fd, [memoryview(out[k])], columns.start * 4)
            finally:
                os.close(fd)
            if got != width * 4:
                raise ValueError(f"{path} ends early: it holds fewer than the {self.numel} numbers of a row")
        return torch.from_numpy(out)

    def write(self, name: str, columns: slice, block: Tensor) -> None:
        data = block.detach().to("cpu", torch.float32).contiguous().numpy()
        for client in self.owned:
            path = row_path(self.folder, client, name)
            with writing(path, needed=data[client].nbytes):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.pwrite(fd, data[client].tobytes(), columns.start * 4)
                finally:
                    os.close(fd)
