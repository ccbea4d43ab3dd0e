"""FedSTA (after FeSTA, Park et al., NeurIPS 2021) in HC-FMTL: a shared encoder, then a frozen one."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.communication import Exchange
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, register_method
from fedmtl.methods.checks import integer_at_least
from fedmtl.methods.fedavg import FedAvg


@register_method
class FedSTA(FedAvg):
    """FedSTA as FedHCA² compares against it (suppl. C; docs/methods.md, FedSTA), two phases:

    - phase A (rounds 1 … R − R_B): the encoder plays FeSTA's task-agnostic body and is
      averaged over all clients; decoders and heads train locally (with
      ``same_task_decoders``, decoders of the same task are averaged, as FeSTA does with
      its tails). Phase A is FedPer.
    - phase B (the last R_B rounds): the encoder is frozen — ``requires_grad=False`` and out
      of the optimiser — and nothing is aggregated; decoders and heads keep training. The
      learning-rate schedule continues unchanged (same compute as the other methods), so
      with the cosine near its floor phase B changes little: reported, not re-warmed.

    The model at the end of phase B is evaluated. (The two-stage reading of FeSTA is from
    the paper's text; no public code exists.) A frozen encoder's BatchNorm statistics, if it
    has any, still follow the client's data: they are buffers, local to the client.

    Args:
        phase_b_rounds: R_B, rounds with a frozen encoder at the end of the run; None: a
            fifth of the run, rounded (20 of the paper's 100). At most the run's rounds.
        same_task_decoders: average decoders among clients of the same task in phase A.
        weighted: weigh averages by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round.
    """

    def __init__(
        self,
        phase_b_rounds: int | None = None,
        same_task_decoders: bool = False,
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(
            encoder_scope="all",
            decoder_scope="same_task" if same_task_decoders else "none",
            weighted=weighted,
            participation=participation,
        )
        if phase_b_rounds is not None:
            integer_at_least("phase_b_rounds", phase_b_rounds, 0, " or null")
        self.phase_b_rounds = phase_b_rounds
        self.same_task_decoders = same_task_decoders

    def phase_b_length(self, rounds: int) -> int:
        """R_B for a run of ``rounds`` rounds."""
        return round(rounds / 5) if self.phase_b_rounds is None else self.phase_b_rounds

    def check_run(self, rounds: int, num_clients: int) -> None:
        if self.phase_b_length(rounds) > rounds:
            raise ValueError(
                f"algorithm.phase_b_rounds is {self.phase_b_rounds} but the run has {rounds} rounds: "
                f"set --algorithm.phase_b_rounds to at most {rounds} (or leave it unset for a fifth of the run)"
            )

    def in_phase_b(self, round_: int) -> bool:
        """Whether round ``round_`` of the run this method was :meth:`setup` for is in phase B."""
        return self.rounds > 0 and round_ > self.rounds - self.phase_b_length(self.rounds)

    def frozen(self, model: nn.Module, round_: int) -> list[nn.Module]:
        return [model.encoder] if self.in_phase_b(round_) else []

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return () if self.in_phase_b(round_) else super().encoder_rows(round_)

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        if self.in_phase_b(inputs.round):  # nothing is aggregated: every client keeps its own
            return RoundOutput(
                encoders=EncoderMix.kept(inputs.num_clients, inputs.encoder_layout.numel),
                decoders=inputs.decoders_prev + inputs.decoder_deltas,
                decoders_kept=torch.ones(inputs.num_decoders, dtype=torch.bool),
            )
        return super().server_step(inputs, encoders)

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        if not self.in_phase_b(ctx.round):  # phase B: the client keeps the bits it trained
            super().receive(ctx, encoder, decoders)

    def exchange(self, round_: int) -> Exchange:
        """Phase A: FedPer's (the encoder; with ``same_task_decoders`` the decoders too); phase B:
        nothing is sent."""
        return Exchange() if self.in_phase_b(round_) else super().exchange(round_)

    def __repr__(self) -> str:
        return (
            f"FedSTA(phase_b_rounds={self.phase_b_rounds}, same_task_decoders={self.same_task_decoders}, "
            f"weighted={self.weighted}, participation={self.participation})"
        )
