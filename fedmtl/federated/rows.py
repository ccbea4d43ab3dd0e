"""A streamed round's encoder rows, one file per client, read a block of columns at a time.

    RUN_DIR/store/rows/client_0003.f32     P float32 numbers, raw (the row the method asked for)

Every rank writes the rows of the clients it trained and reads every client's (the run
directory is on a file system all ranks share), so each rank computes the same server step
from the same bytes in the same order, whatever the number of devices or nodes. Reads go
through ``pread`` into a buffer of one block, never ``mmap``: a process holds one block of N
rows at a time, not the file pages of all of them.

The files are scratch: written without ``fsync`` (a crash resumes from the checkpoint, not
from them), replaced every round, removed with the store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedmtl.aggregation.stream import EncoderRows, RowKind
from fedmtl.federated.store import writing

FOLDER = "rows"  # under RUN_DIR/store


def row_path(folder: Path, client: int) -> Path:
    return folder / f"client_{client:04d}.f32"


def write_row(folder: Path, client: int, row: Tensor) -> None:
    """Client ``client``'s row, whole or not at all (a temporary file renamed into place)."""
    path = row_path(folder, client)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = row.detach().to("cpu", torch.float32).contiguous().numpy()
    with writing(path, tmp, needed=data.nbytes):
        folder.mkdir(parents=True, exist_ok=True)
        data.tofile(tmp)
        os.replace(tmp, path)


def remove_rows(folder: Path, clients: Sequence[int]) -> None:
    """Forget last round's rows of ``clients`` (a client that does not train this round has none)."""
    for client in clients:
        row_path(folder, client).unlink(missing_ok=True)


def read_row(folder: Path, client: int, numel: int) -> Tensor:
    """Client ``client``'s whole row [numel]."""
    return FileRows("delta", folder, numel, num_rows=client + 1).read([client], slice(0, numel))[0]


class FileRows(EncoderRows):
    """The rows of clients 0..N-1 in ``folder``. A client without a file has a zero row (it
    did not train, or its update was dropped): that is its delta; its trained row is never
    asked for, as a method weighs only the clients that trained."""

    def __init__(
        self, kind: RowKind, folder: Path, numel: int, num_rows: int, block_columns: int | None = None
    ) -> None:
        super().__init__(kind, num_rows, numel, block_columns)
        self.folder = Path(folder)

    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        width = columns.stop - columns.start
        out = np.zeros((len(rows), width), dtype=np.float32)
        for k, client in enumerate(rows):
            path = row_path(self.folder, client)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                if self.kind == "trained":
                    raise FileNotFoundError(
                        f"{path}: the trained encoder row of client {client} is missing; a streamed "
                        "server step weighs only clients that trained this round"
                    ) from None
                continue
            try:
                got = os.preadv(fd, [memoryview(out[k])], columns.start * 4)
            finally:
                os.close(fd)
            if got != width * 4:
                raise ValueError(f"{path} ends early: it holds fewer than the {self.numel} numbers of a row")
        return torch.from_numpy(out)
