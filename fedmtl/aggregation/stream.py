"""The server step's encoders: rows read a block of columns at a time, never stacked whole.

A round's encoder rows are N × P numbers (N clients, P encoder parameters: 2.3 M for the
default backbone, 28 M for Swin-T); stacked, with their deltas and the output, they are what
limits how many clients fit in memory. So every method's server step
(``Method.server_step``, the one form a method writes) names the rows of each client's encoder
it needs (``Method.encoder_rows``: ``"trained"`` θ^(r-1) + Δ, ``"delta"`` Δ, ``"prev"``
θ^(r-1); FedDEA gives the first two of its masked update) and takes them as
:class:`EncoderRows`, through reductions that each make one pass over the rows, a block of
columns at a time:

- :meth:`EncoderRows.gram`: G = X Xᵀ in float64 (FedHCA²'s conflict-averse step, MaT-FL's
  clusters, FedAMP's distances);
- :meth:`EncoderRows.weighted_sums`: W X for a few weight rows W [G, N] (group means, Ũ,
  FedOpt's pseudo-gradients);
- :meth:`EncoderRows.mix`: W X for W [N, N], kept as a new row per client (FedAMP's clouds),
  the one reduction whose result has N rows: they go where the rows are, block by block.

and returns an :class:`EncoderMix`: each client's new encoder as a combination of its own
rows and a few shared vectors, formed client by client when the engine writes it back
(:meth:`EncoderMix.row`), or all at once on stacks (:meth:`EncoderMix.rows`). Memory is a block
of N rows plus the shared vectors, whatever N. Decoders and heads (Q and heads ≪ P) stay
stacked: the step aggregates them as tensors.

:class:`StackedRows` serves rows held as one tensor (``Method.aggregate``, the step on encoder
stacks, and tests); the engine's streamed rounds read them from files
(``fedmtl.federated.rows``). A client without a row (it did not train this round) reads as
zeros: a method weighs only the clients that trained, unless it asks for every client's rows
(``Method.reads_every_client``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: Bytes of one float64 block of rows: N × columns × 8 stays about this size.
BLOCK_BYTES = 256 * 2**20


class EncoderRows(abc.ABC):
    """One named row of every client's encoder, [N, P] in client order, read by column blocks.

    Args:
        name: which row (``"trained"``, ``"delta"``, ...).
        num_rows: N.
        numel: P.
        block_columns: columns per block; None: about :data:`BLOCK_BYTES` of float64 per block.
    """

    def __init__(self, name: str, num_rows: int, numel: int, block_columns: int | None = None) -> None:
        if num_rows < 1 or numel < 1:
            raise ValueError(f"EncoderRows needs rows and columns, got [{num_rows}, {numel}]")
        if block_columns is None:
            block_columns = max(1, BLOCK_BYTES // (8 * num_rows))
        if block_columns < 1:
            raise ValueError(f"block_columns must be >= 1, got {block_columns}")
        self.name, self.num_rows, self.numel, self.block_columns = name, num_rows, numel, block_columns

    @abc.abstractmethod
    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        """Rows ``rows``, columns ``columns``: a new float32 CPU tensor [len(rows), c]."""

    @abc.abstractmethod
    def write(self, name: str, columns: slice, block: Tensor) -> None:
        """Columns ``columns`` of every client's row ``name``: ``block`` [N, c] (see :meth:`mix`)."""

    def blocks(self) -> Iterator[slice]:
        """The column blocks, in order."""
        for start in range(0, self.numel, self.block_columns):
            yield slice(start, min(start + self.block_columns, self.numel))

    def gram(self, extra: Sequence[Tensor] = (), rows: Sequence[int] | None = None) -> Tensor:
        """G = X Xᵀ in float64 [M + E, M + E] on the CPU, X the rows ``rows`` (default all N, in
        order) followed by the ``extra`` vectors [P] (e.g. last round's Ũ, whose products with
        the rows FedHCA² needs)."""
        for vector in extra:
            if tuple(vector.shape) != (self.numel,):
                raise ValueError(f"an extra row must have shape [{self.numel}], got {tuple(vector.shape)}")
        chosen = list(range(self.num_rows)) if rows is None else [int(r) for r in rows]
        size = len(chosen) + len(extra)
        out = torch.zeros(size, size, dtype=torch.float64)
        for columns in self.blocks():
            block = self.read(chosen, columns).to(torch.float64)
            if extra:
                tails = [v[columns].to("cpu", torch.float64)[None] for v in extra]
                block = torch.cat([block, *tails])
            out.addmm_(block, block.T)
        return out

    def weighted_sums(self, weights: Tensor) -> Tensor:
        """W X: [G, P] float32 on the CPU for ``weights`` W [G, N] (float64 sums). Rows whose
        weight is zero in every W row are never read (a client that did not train)."""
        weights = self._weights(weights)
        used = torch.nonzero(weights.abs().sum(dim=0) > 0).flatten().tolist()
        out = torch.zeros(weights.shape[0], self.numel, dtype=torch.float32)
        if not used:
            return out
        w = weights[:, used]
        for columns in self.blocks():
            out[:, columns] = (w @ self.read(used, columns).to(torch.float64)).to(torch.float32)
        return out

    def mix(self, weights: Tensor, into: str) -> None:
        """Y = W X for W [N, N] (float64 sums), row i of Y becoming client i's row ``into``."""
        weights = self._weights(weights)
        if weights.shape[0] != self.num_rows:
            raise ValueError(
                f"mix takes weights [{self.num_rows}, {self.num_rows}], got {tuple(weights.shape)}"
            )
        everyone = list(range(self.num_rows))
        for columns in self.blocks():
            mixed = weights @ self.read(everyone, columns).to(torch.float64)
            self.write(into, columns, mixed.to(torch.float32))

    def _weights(self, weights: Tensor) -> Tensor:
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if weights.ndim != 2 or weights.shape[1] != self.num_rows:
            raise ValueError(f"weights must have shape [G, {self.num_rows}], got {tuple(weights.shape)}")
        if not bool(torch.isfinite(weights).all()):
            raise ValueError("weights must be finite")
        return weights


class StackedRows(EncoderRows):
    """Rows held as one [N, P] tensor; rows it is asked to write (:meth:`mix`) go to ``made``."""

    def __init__(self, name: str, stack: Tensor, block_columns: int | None = None) -> None:
        if stack.ndim != 2:
            raise ValueError(f"a stack of rows is [N, P], got shape {tuple(stack.shape)}")
        super().__init__(name, stack.shape[0], stack.shape[1], block_columns)
        self.stack = stack
        self.made: dict[str, Tensor] = {}

    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.stack.device)
        return self.stack[:, columns].index_select(0, index).to("cpu", torch.float32)

    def write(self, name: str, columns: slice, block: Tensor) -> None:
        target = self.made.setdefault(name, torch.zeros(self.num_rows, self.numel))
        target[:, columns] = block


@dataclass
class EncoderMix:
    """Every client's new encoder, formed when it is needed:

        θ_i = Σ_name own[name][i]·row_name(i) + Σ_g mixing[i, g]·vectors[g]

    ``vectors`` [G, P] are the few shared vectors (group means, Ũ), ``mixing`` [N, G] float64;
    ``own`` maps a row name to each client's coefficient of its own row of that name, [N]
    float64: ``"trained"`` is the encoder the client trained (its model holds it, not a row
    file: for FedDEA, unmasked), other names are rows of the round (``"delta"``, or one
    :meth:`EncoderRows.mix` made, FedAMP's ``"cloud"``). A client whose
    only coefficient is 1 on ``"trained"`` keeps what it trained.
    """

    vectors: Tensor  # [G, P] float32
    mixing: Tensor  # [N, G] float64
    own: dict[str, Tensor]  # name -> [N] float64

    def __post_init__(self) -> None:
        n = self.mixing.shape[0]
        if self.vectors.ndim != 2 or tuple(self.mixing.shape) != (n, self.vectors.shape[0]):
            raise ValueError(
                f"mixing must be [N, G] for vectors [G, P]; got mixing {tuple(self.mixing.shape)}, "
                f"vectors {tuple(self.vectors.shape)}"
            )
        for name, coefficients in self.own.items():
            if tuple(coefficients.shape) != (n,):
                raise ValueError(
                    f"own coefficients of {name!r} must be [{n}], got {tuple(coefficients.shape)}"
                )

    @property
    def num_rows(self) -> int:
        return self.mixing.shape[0]

    @classmethod
    def kept(cls, num_rows: int, numel: int) -> EncoderMix:
        """Every client keeps what it trained."""
        return cls(
            vectors=torch.zeros(0, numel),
            mixing=torch.zeros(num_rows, 0, dtype=torch.float64),
            own={"trained": torch.ones(num_rows, dtype=torch.float64)},
        )

    def needs(self, i: int) -> list[str]:
        """The names of client ``i``'s own rows its new encoder is made of."""
        return [name for name, coefficients in self.own.items() if coefficients[i] != 0]

    def keeps(self, i: int) -> bool:
        """Whether client ``i``'s new encoder is exactly what it trained."""
        own = {name: float(c[i]) for name, c in self.own.items() if c[i] != 0}
        return own == {"trained": 1.0} and not self.mixing[i].any()

    def row(self, i: int, rows: Mapping[str, Tensor]) -> Tensor:
        """Client ``i``'s new encoder [P] (float32, on the device of its ``"trained"`` row) from
        its own rows by name (at least those :meth:`needs` names)."""
        missing = [name for name in self.needs(i) if name not in rows]
        if missing:
            raise ValueError(f"client {i}'s new encoder needs its rows {missing}")
        like = rows["trained"] if "trained" in rows else next(iter(rows.values()))
        if self.keeps(i):
            return rows["trained"].clone()
        out = torch.zeros(self.vectors.shape[1], dtype=torch.float64, device=like.device)
        used = torch.nonzero(self.mixing[i]).flatten().tolist()
        if used:
            coefficients = self.mixing[i, used].to(like.device)
            out += coefficients @ self.vectors[used].to(like.device, torch.float64)
        for name in self.needs(i):
            out += float(self.own[name][i]) * rows[name].to(like.device, torch.float64)
        return out.to(torch.float32)

    def rows(self, own_rows: Mapping[str, Tensor]) -> Tensor:
        """Every client's new encoder [N, P] (float32, on the device of the ``"trained"`` stack):
        :meth:`row` for all clients at once, from their own rows stacked by name (``own_rows``
        maps a name to [N, P]; at least the names some client :meth:`needs`)."""
        needed = [name for name, coefficients in self.own.items() if bool(coefficients.any())]
        missing = [name for name in needed if name not in own_rows]
        if missing:
            raise ValueError(f"the new encoders need the rows {missing}")
        n, numel = self.num_rows, self.vectors.shape[1]
        for name in needed:
            if tuple(own_rows[name].shape) != (n, numel):
                raise ValueError(
                    f"own rows {name!r} must be [{n}, {numel}], got {tuple(own_rows[name].shape)}"
                )
        like = own_rows["trained"] if "trained" in own_rows else next(iter(own_rows.values()))
        device = like.device
        out = self.mixing.to(device) @ self.vectors.to(device, torch.float64)
        for name in needed:
            out += self.own[name].to(device)[:, None] * own_rows[name].to(device, torch.float64)
        out = out.to(torch.float32)
        kept = [i for i in range(n) if self.keeps(i)]
        if kept:
            out[kept] = own_rows["trained"][kept].to(device, torch.float32)
        return out
