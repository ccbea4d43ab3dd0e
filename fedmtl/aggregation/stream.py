"""The streamed server step: encoders read a block of columns at a time, never stacked whole.

A round's encoder rows are N × P numbers (N clients, P encoder parameters: 2.3 M for the
default backbone, 28 M for Swin-T); stacked, with their deltas and the output, they are what
limits how many clients fit in memory. A method that *streams* (``Method.streams``) takes them
as :class:`EncoderRows` — one kind of row, ``"trained"`` (θ^(r-1) + Δ) or ``"delta"`` (Δ),
whichever its math needs — through two reductions, each one pass over the rows, a block of
columns at a time:

- :meth:`EncoderRows.gram`: G = X Xᵀ in float64 (FedHCA²'s conflict-averse step);
- :meth:`EncoderRows.weighted_sums`: W X for a few weight rows W [G, N] (group means, Ũ).

and returns an :class:`EncoderMix`: each client's new encoder as a combination of its own
rows and those few vectors, formed client by client when the engine writes it back. Memory is
then G × P for the vectors plus one block of N rows, whatever N. Decoders and heads (Q and
heads ≪ P) stay stacked: the method's usual code aggregates them.

:class:`StackedRows` serves rows held as one tensor (tests, and the stacked step's equal);
the engine reads them from files (``fedmtl.federated.rows``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

RowKind = Literal["trained", "delta"]
ROW_KINDS = ("trained", "delta")

#: Bytes of one float64 block of rows: N × columns × 8 stays about this size.
BLOCK_BYTES = 256 * 2**20


class EncoderRows(abc.ABC):
    """The round's encoder rows of one kind, [N, P] in client order, read by column blocks.

    Args:
        kind: ``"trained"`` (θ^(r-1) + Δ) or ``"delta"`` (Δ).
        num_rows: N.
        numel: P.
        block_columns: columns per block; None: about :data:`BLOCK_BYTES` of float64 per block.
    """

    def __init__(self, kind: RowKind, num_rows: int, numel: int, block_columns: int | None = None) -> None:
        if kind not in ROW_KINDS:
            raise ValueError(f"kind must be one of {list(ROW_KINDS)}, got {kind!r}")
        if num_rows < 1 or numel < 1:
            raise ValueError(f"EncoderRows needs rows and columns, got [{num_rows}, {numel}]")
        if block_columns is None:
            block_columns = max(1, BLOCK_BYTES // (8 * num_rows))
        if block_columns < 1:
            raise ValueError(f"block_columns must be >= 1, got {block_columns}")
        self.kind, self.num_rows, self.numel, self.block_columns = kind, num_rows, numel, block_columns

    @abc.abstractmethod
    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        """Rows ``rows``, columns ``columns``: a new float32 CPU tensor [len(rows), c]."""

    def blocks(self) -> Iterator[slice]:
        """The column blocks, in order."""
        for start in range(0, self.numel, self.block_columns):
            yield slice(start, min(start + self.block_columns, self.numel))

    def gram(self, extra: Sequence[Tensor] = ()) -> Tensor:
        """G = X Xᵀ in float64 [N + E, N + E] on the CPU, X the N rows followed by the ``extra``
        vectors [P] (e.g. last round's Ũ, whose products with the rows FedHCA² needs)."""
        for vector in extra:
            if tuple(vector.shape) != (self.numel,):
                raise ValueError(f"an extra row must have shape [{self.numel}], got {tuple(vector.shape)}")
        everyone = list(range(self.num_rows))
        size = self.num_rows + len(extra)
        out = torch.zeros(size, size, dtype=torch.float64)
        for columns in self.blocks():
            block = self.read(everyone, columns).to(torch.float64)
            if extra:
                tails = [v[columns].to("cpu", torch.float64)[None] for v in extra]
                block = torch.cat([block, *tails])
            out.addmm_(block, block.T)
        return out

    def weighted_sums(self, weights: Tensor) -> Tensor:
        """W X: [G, P] float32 on the CPU for ``weights`` W [G, N] (float64 sums). Rows whose
        weight is zero in every W row are never read (a client that did not train)."""
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if weights.ndim != 2 or weights.shape[1] != self.num_rows:
            raise ValueError(f"weights must have shape [G, {self.num_rows}], got {tuple(weights.shape)}")
        if not bool(torch.isfinite(weights).all()):
            raise ValueError("weights must be finite")
        used = torch.nonzero(weights.abs().sum(dim=0) > 0).flatten().tolist()
        out = torch.zeros(weights.shape[0], self.numel, dtype=torch.float32)
        if not used:
            return out
        w = weights[:, used]
        for columns in self.blocks():
            out[:, columns] = (w @ self.read(used, columns).to(torch.float64)).to(torch.float32)
        return out


class StackedRows(EncoderRows):
    """Rows held as one [N, P] tensor."""

    def __init__(self, kind: RowKind, stack: Tensor, block_columns: int | None = None) -> None:
        if stack.ndim != 2:
            raise ValueError(f"a stack of rows is [N, P], got shape {tuple(stack.shape)}")
        super().__init__(kind, stack.shape[0], stack.shape[1], block_columns)
        self.stack = stack

    def read(self, rows: Sequence[int], columns: slice) -> Tensor:
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.stack.device)
        return self.stack[:, columns].index_select(0, index).to("cpu", torch.float32)


@dataclass
class EncoderMix:
    """Every client's new encoder, formed when it is needed:

        θ_i = trained[i]·(θ_i^(r-1) + Δ_i) + delta[i]·Δ_i + Σ_g mixing[i, g]·vectors[g]

    ``vectors`` [G, P] are the few shared vectors (group means, Ũ), ``mixing`` [N, G] and the
    own-row coefficients ``trained``, ``delta`` [N] float64. A client whose coefficients are
    (1, 0, 0) keeps what it trained.
    """

    vectors: Tensor  # [G, P] float32
    mixing: Tensor  # [N, G] float64
    trained: Tensor  # [N] float64
    delta: Tensor  # [N] float64

    def __post_init__(self) -> None:
        n = self.trained.shape[0]
        if self.vectors.ndim != 2 or tuple(self.mixing.shape) != (n, self.vectors.shape[0]):
            raise ValueError(
                f"mixing must be [N, G] for vectors [G, P] and N = {n} clients; got mixing "
                f"{tuple(self.mixing.shape)}, vectors {tuple(self.vectors.shape)}"
            )
        if tuple(self.delta.shape) != (n,):
            raise ValueError(f"delta coefficients must be [{n}], got {tuple(self.delta.shape)}")

    @classmethod
    def kept(cls, num_rows: int, numel: int) -> EncoderMix:
        """Every client keeps what it trained."""
        return cls(
            vectors=torch.zeros(0, numel),
            mixing=torch.zeros(num_rows, 0, dtype=torch.float64),
            trained=torch.ones(num_rows, dtype=torch.float64),
            delta=torch.zeros(num_rows, dtype=torch.float64),
        )

    def needs_delta(self, i: int) -> bool:
        return bool(self.delta[i] != 0)

    def keeps(self, i: int) -> bool:
        """Whether client ``i``'s new encoder is exactly what it trained."""
        return bool(self.trained[i] == 1 and self.delta[i] == 0 and not self.mixing[i].any())

    def row(self, i: int, trained: Tensor, delta: Tensor | None = None) -> Tensor:
        """Client ``i``'s new encoder [P] (float32, on ``trained``'s device) from its trained
        row and, where its coefficient is not zero, its delta."""
        if self.keeps(i):
            return trained.clone()
        out = torch.zeros(trained.shape, dtype=torch.float64, device=trained.device)
        used = torch.nonzero(self.mixing[i]).flatten().tolist()
        if used:
            coefficients = self.mixing[i, used].to(trained.device)
            out += coefficients @ self.vectors[used].to(trained.device, torch.float64)
        if self.trained[i] != 0:
            out += float(self.trained[i]) * trained.to(torch.float64)
        if self.delta[i] != 0:
            if delta is None:
                raise ValueError(f"client {i}'s new encoder needs its delta")
            out += float(self.delta[i]) * delta.to(trained.device, torch.float64)
        return out.to(trained.dtype)

    def all_finite(self) -> bool:
        return bool(torch.isfinite(self.vectors).all())
