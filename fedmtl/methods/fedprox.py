"""FedProx (Li et al., MLSys 2020) in HC-FMTL: FedAvg-HC plus a proximal term on the client."""

from __future__ import annotations

from typing import Literal

from torch import nn

from fedmtl.methods.base import ClientContext, Penalty, register_method, snapshot
from fedmtl.methods.checks import either, non_negative
from fedmtl.methods.fedavg import FedAvg, HeadScope, Scope
from fedmtl.tensors import parameters_of


@register_method
class FedProx(FedAvg):
    """FedProx as FedHCA² compares against it (suppl. C; docs/methods.md, FedProx).

    The server is FedAvg-HC (encoders over N clients, decoders over all K). Each client
    minimises L_i(θ) + (μ/2)·‖θ − θ̂‖², θ̂ the round-start snapshot (what the server sent
    plus the client's own heads). The term is part of the loss, built from the live
    parameters, so its gradient μ(θ − θ̂) is real (the public FMTL-Benchmark builds it from
    ``.data`` and gets none) and autocast / gradient scaling apply to it. Under AdamW the
    proximal gradient goes through Adam's per-coordinate normalisation, unlike the SGD
    analysis of the FedProx paper; the paper's protocol implies this.

    Args:
        mu: proximal coefficient μ ≥ 0 (paper: 0.01). 0 skips the term: plain FedAvg.
        prox_scope: ``all`` trainable parameters (as the public codes), or ``shared_only``
            (encoder and decoders, not the heads).
        weighted: weigh averages by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round.
        encoder_scope: among whom the server averages the encoders (see :class:`FedAvg`; the
            paper's FedProx: all).
        decoder_scope: the same for the decoders (the paper's FedProx: all).
        head_scope: the same for the heads (the paper's FedProx: none).
    """

    def __init__(
        self,
        mu: float = 0.01,
        prox_scope: Literal["all", "shared_only"] = "all",
        weighted: bool = False,
        participation: float = 1.0,
        encoder_scope: Scope = "all",
        decoder_scope: Scope = "all",
        head_scope: HeadScope = "none",
    ) -> None:
        super().__init__(
            encoder_scope=encoder_scope,
            decoder_scope=decoder_scope,
            weighted=weighted,
            participation=participation,
            head_scope=head_scope,
        )
        non_negative("mu", mu, " (the proximal coefficient)")
        either("prox_scope", prox_scope, "all", "shared_only")
        self.mu = float(mu)
        self.prox_scope = prox_scope

    def penalty(self, ctx: ClientContext, model: nn.Module) -> Penalty | None:
        if self.mu == 0:
            return None
        modules = [model] if self.prox_scope == "all" else [model.encoder, model.decoders]
        return Penalty(self.mu, snapshot([p for p in parameters_of(modules) if p.requires_grad]))

    def __repr__(self) -> str:
        return (
            f"FedProx(mu={self.mu}, prox_scope={self.prox_scope!r}, weighted={self.weighted}, "
            f"participation={self.participation}, encoder_scope={self.encoder_scope!r}, "
            f"decoder_scope={self.decoder_scope!r}, head_scope={self.head_scope!r})"
        )
