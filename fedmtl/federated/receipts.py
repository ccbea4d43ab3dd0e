"""The server's output for a client, kept as a receipt and applied when the client is next loaded.

A round's server step returns every client's new encoder as a recipe
(:class:`~fedmtl.aggregation.stream.EncoderMix`: a few shared vectors, per-client coefficients
and rows of the client's own) and its new decoder and head rows. Writing that into every
client at once would load and store every client a second time each round, also those that
sat the round out; instead each receiving client gets a *receipt* of the round, and the
receipt is applied (the method's ``receive`` hooks, as before) when the client is next loaded:
to train, to be evaluated, to finish, or to give its rows to a server step that reads every
client. A client that neither trains nor is evaluated costs nothing.

- A client may hold receipts of several rounds (it was not loaded in between): they are applied
  oldest first, each on top of the last. A receipt that replaces every part the older ones
  touched (its encoder does not start from the client's own, no row is kept) supersedes them.
- The own rows a receipt names (FedHCA²'s ``"delta"``, FedAMP's ``"cloud"``) stay in the
  round's :class:`RowStore` until every client that needs them has taken its receipt.
- A receipt is consumed when the client's state is stored again (after training or finishing):
  a client whose update is dropped is not stored, so it keeps its receipts, and its state is
  the one it started the round with.
- A checkpoint records the pending receipts and the own rows they need, rather than applying
  them, so that a resume continues bit for bit.
- Where the server step reads the trained encoders from files and the clients are on disk, a
  client's stored state leaves its encoder in its ``"trained"`` row (``store.without_encoder``):
  that row stays until the client is stored again, and a checkpoint holds it.

The rows of a server step live in memory or in files of the run directory (``rows.py``),
chosen as the run's ``aggregation`` setting says.
"""

from __future__ import annotations

import abc
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from fedmtl.aggregation import RoundOutput
from fedmtl.aggregation.stream import EncoderMix, EncoderRows, StackedRows
from fedmtl.federated import rows as row_files


@dataclass
class Receipt:
    """One round's server output: every client's encoder recipe, decoder rows [K, Q] and head
    rows (one stack per head group, or None: heads stay as the clients hold them). ``kept``
    decoder and head rows (None: none) are left as the client holds them."""

    round: int
    encoders: EncoderMix
    decoders: Tensor
    heads: list[Tensor] | None = None
    decoders_kept: Tensor | None = None  # [K] bool
    heads_kept: list[Tensor] | None = None  # per head group, [owners] bool

    @classmethod
    def of(cls, round_: int, output: RoundOutput) -> Receipt:
        return cls(
            round_,
            output.encoders,  # type: ignore[arg-type] - the engine's step always gives a mix
            output.decoders.cpu(),
            None if output.heads is None else [h.cpu() for h in output.heads],
            output.decoders_kept,
            output.heads_kept,
        )

    def own_rows(self, client: int) -> list[str]:
        """The names of the rows of its own that ``client``'s encoder is made of, besides the
        encoder it holds (``"trained"``)."""
        return [name for name in self.encoders.needs(client) if name != "trained"]

    def supersedes(
        self, client: int, decoder_rows: Sequence[int], head_rows: Sequence[tuple[int, int]]
    ) -> bool:
        """Whether this receipt replaces everything older receipts gave ``client``: its encoder
        does not start from the client's own, and it keeps none of its decoder (and head) rows."""
        mix = self.encoders
        if "trained" in mix.own and float(mix.own["trained"][client]) != 0:
            return False
        if self.decoders_kept is not None and any(bool(self.decoders_kept[k]) for k in decoder_rows):
            return False
        if self.heads is None:
            return True  # heads are not shared: an older receipt never gave any
        kept = self.heads_kept
        return kept is None or not any(bool(kept[g][j]) for g, j in head_rows)

    def state_dict(self) -> dict[str, Any]:
        mix = self.encoders
        return {
            "round": self.round,
            "vectors": mix.vectors,
            "mixing": mix.mixing,
            "own": dict(mix.own),
            "decoders": self.decoders,
            "heads": self.heads,
            "decoders_kept": self.decoders_kept,
            "heads_kept": self.heads_kept,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Receipt:
        mix = EncoderMix(state["vectors"], state["mixing"], dict(state["own"]))
        return cls(
            int(state["round"]),
            mix,
            state["decoders"],
            state["heads"],
            state["decoders_kept"],
            state["heads_kept"],
        )


# ---------------------------------------------------------------------------- rows


class RowStore(abc.ABC):
    """A round's encoder rows of this rank's clients, by (round, client, name): written as
    clients train, read by every rank's server step, and kept for the receipts that name
    them."""

    @abc.abstractmethod
    def write(self, round_: int, client: int, name: str, row: Tensor) -> None: ...

    @abc.abstractmethod
    def read(self, round_: int, client: int, name: str, numel: int) -> Tensor:
        """Client ``client``'s whole row (zeros if it has none)."""

    @abc.abstractmethod
    def server_rows(
        self, round_: int, names: Sequence[str], num_rows: int, numel: int, mine: Sequence[int]
    ) -> dict[str, EncoderRows]:
        """Every client's rows of round ``round_`` for the server step (on every rank; a
        collective in memory). Rows the step makes (:meth:`EncoderRows.mix`) are kept for
        this rank's clients ``mine``."""

    @abc.abstractmethod
    def has(self, round_: int, client: int, name: str) -> bool: ...

    def read_kept(self, round_: int, client: int, name: str, numel: int) -> Tensor:
        """A row that must be there (a stored state's encoder): an error, never zeros, if not."""
        if not self.has(round_, client, name):
            raise FileNotFoundError(
                f"client {client}'s encoder row of round {round_} ({name!r}) is gone from the run's "
                "store; resume from the last checkpoint (fedmtl fit --resume true)"
            )
        return self.read(round_, client, name, numel)

    @abc.abstractmethod
    def drop(self, round_: int, client: int, name: str) -> None:
        """Forget a row no receipt needs any more."""

    @abc.abstractmethod
    def files(self, round_: int, client: int, name: str) -> Path | None:
        """The file holding the row, if rows are files (a checkpoint links it)."""

    @abc.abstractmethod
    def clear(self) -> None: ...


class MemoryRowStore(RowStore):
    """Rows in this process's memory; the server step gathers every rank's."""

    def __init__(self, fabric: L.Fabric) -> None:
        self.fabric = fabric
        self._rows: dict[tuple[int, int, str], Tensor] = {}

    def write(self, round_: int, client: int, name: str, row: Tensor) -> None:
        self._rows[(round_, client, name)] = row.detach().to("cpu", torch.float32).clone()

    def read(self, round_: int, client: int, name: str, numel: int) -> Tensor:
        row = self._rows.get((round_, client, name))
        return torch.zeros(numel) if row is None else row

    def server_rows(
        self, round_: int, names: Sequence[str], num_rows: int, numel: int, mine: Sequence[int]
    ) -> dict[str, EncoderRows]:
        out: dict[str, EncoderRows] = {}
        for name in names:
            stack = torch.zeros(num_rows, numel)
            for i in mine:
                if (round_, i, name) in self._rows:
                    stack[i] = self._rows[(round_, i, name)]
            if self.fabric.world_size > 1:  # each rank holds its own clients' rows, zeros elsewhere
                stack = self.fabric.all_reduce(stack.to(self.fabric.device), reduce_op="sum").cpu()
            out[name] = _KeepingRows(name, stack, self, round_, mine)
        return out

    def write_columns(
        self, round_: int, client: int, name: str, numel: int, columns: slice, part: Tensor
    ) -> None:
        """Columns ``columns`` of a row (of ``numel``) the server step makes, a block at a time."""
        row = self._rows.setdefault((round_, client, name), torch.zeros(numel))
        row[columns] = part

    def has(self, round_: int, client: int, name: str) -> bool:
        return (round_, client, name) in self._rows

    def drop(self, round_: int, client: int, name: str) -> None:
        self._rows.pop((round_, client, name), None)

    def files(self, round_: int, client: int, name: str) -> Path | None:
        return None

    def clear(self) -> None:
        self._rows.clear()


class _KeepingRows(StackedRows):
    """Stacked rows whose made rows (:meth:`EncoderRows.mix`) are kept in the row store for
    this rank's clients, as a file store writes them."""

    def __init__(
        self, name: str, stack: Tensor, store: MemoryRowStore, round_: int, mine: Sequence[int]
    ) -> None:
        super().__init__(name, stack)
        self._store, self._round, self._mine = store, round_, list(mine)

    def write(self, name: str, columns: slice, block: Tensor) -> None:
        for i in self._mine:
            self._store.write_columns(self._round, i, name, self.numel, columns, block[i])


class FileRowStore(RowStore):
    """Rows as files of the run directory, which every rank reads (``rows.py``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _folder(self, round_: int) -> Path:
        return row_files.round_folder(self.directory, round_)

    def write(self, round_: int, client: int, name: str, row: Tensor) -> None:
        row_files.write_row(self._folder(round_), client, name, row)

    def read(self, round_: int, client: int, name: str, numel: int) -> Tensor:
        return row_files.read_row(self._folder(round_), client, name, numel)

    def server_rows(
        self, round_: int, names: Sequence[str], num_rows: int, numel: int, mine: Sequence[int]
    ) -> dict[str, EncoderRows]:
        folder = self._folder(round_)
        return {name: row_files.FileRows(name, folder, numel, num_rows, owned=mine) for name in names}

    def has(self, round_: int, client: int, name: str) -> bool:
        return row_files.row_path(self._folder(round_), client, name).is_file()

    def drop(self, round_: int, client: int, name: str) -> None:
        row_files.row_path(self._folder(round_), client, name).unlink(missing_ok=True)

    def files(self, round_: int, client: int, name: str) -> Path | None:
        path = row_files.row_path(self._folder(round_), client, name)
        return path if path.is_file() else None

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


# ---------------------------------------------------------------------------- this rank's receipts


class Receipts:
    """This rank's pending receipts: the rounds' outputs still to be applied, and per client
    the rounds it has not taken yet (oldest first)."""

    def __init__(self, rows: RowStore, mine: Sequence[int]) -> None:
        self.rows = rows
        self.mine = list(mine)
        self.by_round: dict[int, Receipt] = {}
        self.pending: dict[int, list[int]] = {}
        # Client -> the round whose "trained" row holds the encoder of its stored state.
        self.encoder_rows: dict[int, int] = {}

    def of(self, client: int) -> list[Receipt]:
        """``client``'s receipts, oldest first."""
        return [self.by_round[r] for r in self.pending.get(client, [])]

    def issue(
        self,
        receipt: Receipt,
        receivers: Iterable[int],
        decoder_rows: Mapping[int, Sequence[int]],
        head_rows: Mapping[int, Sequence[tuple[int, int]]],
    ) -> None:
        """Give ``receipt`` to this rank's ``receivers``; a client that keeps exactly what it
        holds (an identity recipe, every row kept) gets none."""
        self.by_round[receipt.round] = receipt
        for i in receivers:
            if _identity(receipt, i, decoder_rows[i], head_rows.get(i, ())):
                continue
            older = self.pending.get(i, [])
            if older and receipt.supersedes(i, decoder_rows[i], head_rows.get(i, ())):
                for r in older:
                    self._release(r, i)
                older = []
            self.pending[i] = [*older, receipt.round]

    def drop_unneeded(self, round_: int, names: Sequence[str]) -> None:
        """Drop round ``round_``'s rows ``names`` of this rank's clients that no receipt needs
        (called once every rank's server step has read them)."""
        receipt = self.by_round.get(round_)
        for i in self.mine:
            needed = (
                set(receipt.own_rows(i))
                if receipt is not None and round_ in self.pending.get(i, ())
                else set()
            )
            if self.encoder_rows.get(i) == round_:
                needed.add("trained")
            for name in names:
                if name not in needed:
                    self.rows.drop(round_, i, name)

    def stored(self, client: int, encoder_row: int | None) -> None:
        """``client``'s state was stored, its encoder in round ``encoder_row``'s ``"trained"``
        row (None: in its own file): the row an older state named goes, and its receipts are
        done."""
        old = self.encoder_rows.pop(client, None)
        if encoder_row is not None:
            self.encoder_rows[client] = encoder_row
        if old is not None and old != encoder_row:
            self.rows.drop(old, client, "trained")
        self.consumed(client)

    def consumed(self, client: int) -> None:
        """``client`` was stored with its receipts applied: they are done."""
        for r in self.pending.pop(client, []):
            self._release(r, client)

    def _release(self, round_: int, client: int) -> None:
        """``client`` no longer needs round ``round_``'s receipt: its own rows go."""
        receipt = self.by_round.get(round_)
        if receipt is not None:
            for name in receipt.own_rows(client):
                self.rows.drop(round_, client, name)

    def held_rounds(self) -> set[int]:
        """The rounds whose receipts a client of this rank still holds."""
        return {r for rounds in self.pending.values() for r in rounds}

    def prune(self, held_anywhere: set[int]) -> None:
        """Forget the receipts no client of any rank holds (every rank keeps the receipts of
        every rank's clients: rank 0 checkpoints them)."""
        for r in [r for r in self.by_round if r not in held_anywhere]:
            del self.by_round[r]

    def clear(self) -> None:
        self.by_round.clear()
        self.pending.clear()
        self.encoder_rows.clear()
        self.rows.clear()


def _identity(
    receipt: Receipt, client: int, decoder_rows: Sequence[int], head_rows: Sequence[tuple[int, int]]
) -> bool:
    """Whether ``receipt`` leaves ``client`` exactly as it is."""
    if not receipt.encoders.keeps(client):
        return False
    kept = receipt.decoders_kept
    if kept is None or not all(bool(kept[k]) for k in decoder_rows):
        return False
    if receipt.heads is None:
        return True
    hk = receipt.heads_kept
    return hk is not None and all(bool(hk[g][j]) for g, j in head_rows)
