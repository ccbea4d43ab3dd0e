"""PCGrad on the server: the clients' projected, normalised deltas averaged into one update."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.functional import gram_matrix
from fedmtl.aggregation.pcgrad import pcgrad_coefficients, pcgrad_orders
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, Method, register_method
from fedmtl.methods.checks import one_of
from fedmtl.seeds import derive_seed

DecoderScope = Literal["same_task", "none"]
DECODER_SCOPES = ("same_task", "none")


@register_method
class PCGrad(Method):
    """PCGrad (Yu et al., "Gradient Surgery for Multi-Task Learning", NeurIPS 2020) as a server
    step over client updates, as FMTL-Bench (Yang et al., youngfish42/FMTL-Benchmark,
    ``aggregate_all.py``) applies it; docs/methods.md, PCGrad.

    Each client's delta Δ_i = θ_i' − θ_i^(r-1) is normalised; for each client i, in a seeded
    random order of the others j, the component along ĝ_j is removed from PC_i where their
    inner product is negative; U = mean_i PC_i (:mod:`fedmtl.aggregation.pcgrad`), and every
    client gets θ_i^(r-1) + U: its own previous parameters plus the one update.
    ‖U‖ ≤ 1, whatever the deltas' size. Heads and BatchNorm statistics stay local.

    The orders: client i's order of the others in a pool is drawn from
    ``derive_seed(seed, "pcgrad", pool, round, i)`` (pool ``"encoder"`` or
    ``"decoders/<task>"``, i the client's index), so one or two devices and a resumed run
    draw the same orders. The method keeps no server state.

    Participation: U is the mean over the clients that trained this round (a sampled-out,
    unavailable or dropped client has no delta and is not counted), and every client that
    sampling left out receives θ_i^(r-1) + U too (as CAGrad, and as FedAvg gives a group's
    mean to its members that sat the round out; an unavailable client or one whose update was
    dropped keeps its state, as the engine does for every method); a decoder group none of whose clients
    trained keeps its parameters. The engine therefore loads every client in every round. A
    client that trained but whose delta is exactly zero counts in the mean and adds 0 to it, as
    in the public code.

    Args:
        decoder_scope: ``same_task`` (default): the decoders of each task, across clients and
            datasets (as FedAvg's ``decoder_scope: same_task`` groups them), get one PCGrad step
            within their group: each decoder of the task gets its own previous parameters plus
            its group's U. ``none``: decoders stay as each client trained them. FMTL-Bench runs
            PCGrad with ``--decoder_agg pcgrad`` on its one task-conditioned decoder per client;
            fedmtl's decoders are one per task, whose counterpart across clients is the decoder
            of the same task (FMTL-Bench's multi-decoder code, ``aggregate_md.py``, has no
            PCGrad), hence the default.
        participation: fraction of the clients that train each round (see :class:`Method`).
    """

    def __init__(self, decoder_scope: DecoderScope = "same_task", participation: float = 1.0) -> None:
        super().__init__(participation=participation)
        one_of("decoder_scope", decoder_scope, DECODER_SCOPES)
        self.decoder_scope = decoder_scope

    @property
    def shared_parts(self) -> frozenset[str]:
        """The encoder, and the decoders unless ``decoder_scope`` is ``none``."""
        return frozenset({"encoder", *(() if self.decoder_scope == "none" else ("decoders",))})

    def orders(self, pool: str, round_: int, members: Sequence[int]) -> list[list[int]]:
        """Each member's order of the other members (positions in ``members``, client indices
        of the pool's rows), seeded by run seed, pool, round and client."""
        return pcgrad_orders([derive_seed(self.seed, "pcgrad", pool, round_, int(i)) for i in members])

    # ------------------------------------------------------------------ the server step

    #: A client that did not train still receives θ^(r-1) + U, so its rows (its round-start
    #: parameters) are read; its zero delta does not enter the step.
    reads_every_client = True
    individual_updates = "projects each client's update onto every other's (their inner products)"

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return ("delta", "prev")

    @torch.no_grad()
    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        n = inputs.num_clients
        trained = inputs.participating_clients
        gram = encoders["delta"].gram(rows=trained)  # one pass: the Gram matrix of the deltas
        w = pcgrad_coefficients(gram, self.orders("encoder", inputs.round, trained))
        weights = torch.zeros(1, n, dtype=torch.float64)
        weights[0, trained] = w
        update = encoders["delta"].weighted_sums(weights)  # a second pass: U [1, P]
        ones = torch.ones(n, dtype=torch.float64)
        mix = EncoderMix(update, mixing=ones[:, None], own={"prev": ones})  # θ^(r-1) + U
        decoders, kept = self._decoders(inputs)
        return RoundOutput(mix, decoders, decoders_kept=kept)

    def _decoders(self, inputs: RoundInput) -> tuple[Tensor, Tensor]:
        """Per task, every decoder gets its own previous parameters plus U_t, the PCGrad step
        of the task's decoders that trained; a task none of whose decoders trained is kept."""
        if self.decoder_scope == "none":
            return inputs.decoders_prev + inputs.decoder_deltas, torch.ones(
                inputs.num_decoders, dtype=torch.bool
            )

        def update(task: str, rows: list[int]) -> Tensor:
            group = inputs.decoder_deltas[rows].to(torch.float64)
            owners = [inputs.decoder_owners[k][0] for k in rows]
            orders = self.orders(f"decoders/{task}", inputs.round, owners)
            return pcgrad_coefficients(gram_matrix(group).cpu(), orders).to(group.device) @ group

        return inputs.decoders_plus_one_update_per_task(update)

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        """With ``decoder_scope: none`` the decoders keep the bits the client trained."""
        super().receive(ctx, encoder, {} if self.decoder_scope == "none" else decoders)

    def __repr__(self) -> str:
        return f"PCGrad(decoder_scope={self.decoder_scope!r}, participation={self.participation})"
