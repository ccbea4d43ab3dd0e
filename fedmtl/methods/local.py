"""Local training: no aggregation (the "Local" baseline of FedHCA², Lu et al., CVPR 2024, Table 1)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, Method, register_method


@register_method
class Local(Method):
    """Every client keeps what it trained: θ_i^(r) = θ_i^(r-1) + Δθ_i^(r), for encoders and decoders.

    The baseline of FedHCA² (Lu et al., CVPR 2024, Sec. 4.1) against which Δm is measured.
    Each client's own model is evaluated. The client keeps the bits it trained: the server's
    rows θ^(r-1) + Δθ equal them in exact arithmetic but can differ in the last float32 bit.
    """

    evaluated = "local"
    shared_parts = frozenset()  # nothing leaves a client: no cost, and a new client starts from its own draw
    individual_updates = None  # it sums nothing: nothing leaves a client

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return ()

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        return RoundOutput(
            encoders=EncoderMix.kept(inputs.num_clients, inputs.encoder_layout.numel),
            decoders=inputs.decoders_prev + inputs.decoder_deltas,
            decoders_kept=torch.ones(inputs.num_decoders, dtype=torch.bool),
        )

    def receive(self, ctx: ClientContext, encoder: Tensor, decoders: Mapping[str, Tensor]) -> None:
        """Nothing to take: the model already holds what the client trained."""

    def __repr__(self) -> str:
        return f"Local(participation={self.participation})"
