"""CAGrad as a server step (FMTL-Bench's ``cagrad`` aggregation): one conflict-averse update
of the clients' deltas, added by every client to its own previous parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.functional import conflict_averse_coefficients, conflict_averse_update
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, Method, register_method
from fedmtl.methods.checks import boolean, one_of, within

DecoderScope = Literal["same_task", "none"]
DECODER_SCOPES = ("same_task", "none")


@register_method
class CAGrad(Method):
    """CAGrad (Liu et al., "Conflict-Averse Gradient Descent for Multi-task Learning",
    NeurIPS 2021) applied on the server to the clients' updates, as FMTL-Bench (Yang et al.,
    "Federated Multi-Task Learning on Non-IID Data Silos"; public code
    youngfish42/FMTL-Benchmark, ``aggregate_all.py``) aggregates with ``agg='cagrad'``;
    docs/methods.md, CAGrad.

    Encoders: from the deltas Δ_i = θ_i' − θ_i^(r-1) of the clients that trained, one update
    U = (ḡ + c'/‖g_w‖ · g_w) / (1 + c²) is solved: ḡ the mean delta, c' = c‖ḡ‖, g_w = Σ w*_i Δ_i
    with w* on the simplex minimising ⟨g_w, ḡ⟩ + c'‖g_w‖ — the same problem as FedHCA²'s
    encoder step (:func:`~fedmtl.aggregation.functional.conflict_averse_coefficients`), without
    the division when ``rescale`` is false. Every client's new encoder is θ_i^(r-1) + U: its own
    previous parameters plus the one update (not its own delta plus U, as FedHCA² does), and
    there are no hyper weights. Clients that start a round equal therefore stay equal.

    Decoders (``decoder_scope``):

    - ``same_task`` (default): the decoders of one task, across the clients that have it (as
      FedAvg's ``decoder_scope: same_task`` groups them), get their own CAGrad step within the
      group: decoder k of task t becomes θ_k^(r-1) + U_t. FMTL-Bench's ``main.py`` takes
      ``--decoder_agg`` with the same choices as ``--encoder_agg`` and applies it to the
      decoder, which there is one task-conditioned module every client holds; fedmtl's
      decoders are one per task, so the counterpart is one step per task. A task only one
      client has gets (1 + c)/(1 + c²) times that client's delta (1.21× at c = 0.4).
    - ``none``: every decoder keeps what its client trained (only the encoders are shared).

    Heads stay local.

    With client sampling (``participation`` < 1), an unavailable client or a dropped update,
    U is solved from the clients that trained only, and every client that sampling left out
    receives θ_i^(r-1) + U too (as FedAvg gives a group's mean to its members that sat the
    round out), so the encoders stay in step; an unavailable client or one whose update was
    dropped keeps its state, as the engine does for every method. A decoder group none of whose clients trained
    keeps its parameters. The engine therefore loads every client in every round.

    The server keeps no state between rounds: a resumed run continues bit for bit.

    Args:
        c: the conflict-averse radius, c ∈ [0, 1) (FMTL-Bench: 0.4). c = 0 gives the mean
            delta: every client then adds FedAvg's update to its own parameters.
        rescale: divide U by (1 + c²) (CAGrad's and FMTL-Bench's default, its ``rescale=1``).
        decoder_scope: ``same_task`` (a CAGrad step per task) or ``none`` (decoders local).
        participation: fraction of the clients that train each round (see :class:`Method`).
    """

    #: A client that did not train this round still receives θ^(r-1) + U, so its rows (its
    #: round-start parameters) are read; its zero delta does not enter the solve.
    reads_every_client = True
    individual_updates = "solves its conflict-averse step on the Gram matrix of the individual updates"
    needs_every_client = False

    def __init__(
        self,
        c: float = 0.4,
        rescale: bool = True,
        decoder_scope: DecoderScope = "same_task",
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation=participation)
        within("c", c, "[0, 1)", " (the conflict-averse radius)", "; FMTL-Bench uses 0.4")
        boolean("rescale", rescale)
        one_of("decoder_scope", decoder_scope, DECODER_SCOPES)
        self.c = float(c)
        self.rescale = rescale
        self.decoder_scope = decoder_scope

    @property
    def shared_parts(self) -> frozenset[str]:
        """The encoder, and the decoders unless ``decoder_scope`` is ``none``."""
        return frozenset({"encoder", *(("decoders",) if self.decoder_scope != "none" else ())})

    # ------------------------------------------------------------------ the server step

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return ("delta", "prev")

    @torch.no_grad()
    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        decoders, kept = self._decoders(inputs)
        return RoundOutput(self._encoders(inputs, encoders), decoders, decoders_kept=kept)

    def _encoders(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> EncoderMix:
        """θ_i^(r-1) + U for every client: U = vᵀ D over the deltas of the clients that trained,
        v from their Gram matrix (one pass for G, one for U)."""
        n, trained = inputs.num_clients, inputs.participating_clients
        if not trained:
            return EncoderMix.kept(n, inputs.encoder_layout.numel)
        deltas = encoders["delta"]
        coefficients = conflict_averse_coefficients(deltas.gram(rows=trained), self.c, self.rescale)
        weights = torch.zeros(1, n, dtype=torch.float64)
        weights[0, trained] = coefficients
        update = deltas.weighted_sums(weights)  # U [1, P]
        ones = torch.ones(n, dtype=torch.float64)
        return EncoderMix(update, mixing=ones[:, None], own={"prev": ones})

    def _decoders(self, inputs: RoundInput) -> tuple[Tensor, Tensor]:
        """The decoders [K, Q] and the rows kept as their clients hold them [K]: per task,
        θ_k^(r-1) + U_t for every decoder of the task, U_t from the decoders that trained."""
        if self.decoder_scope == "none":
            return inputs.decoders_prev + inputs.decoder_deltas, torch.ones(
                inputs.num_decoders, dtype=torch.bool
            )
        return inputs.decoders_plus_one_update_per_task(
            lambda task, rows: conflict_averse_update(inputs.decoder_deltas[rows], self.c, self.rescale)
        )

    # ------------------------------------------------------------------ the client

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        """With ``decoder_scope: none`` the decoders keep the bits the client trained (the
        server's row θ^(r-1) + Δ can differ from them in the last float32 bit)."""
        super().receive(ctx, encoder, {} if self.decoder_scope == "none" else decoders)

    def __repr__(self) -> str:
        return (
            f"CAGrad(c={self.c}, rescale={self.rescale}, decoder_scope={self.decoder_scope!r}, "
            f"participation={self.participation})"
        )
