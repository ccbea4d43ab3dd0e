"""Ditto (Li et al., ICML 2021) in HC-FMTL: a FedAvg-HC global track and a personal model per client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from fedmtl.aggregation.base import ClientInfo
from fedmtl.methods.base import ClientContext, Penalty, new_track, register_method
from fedmtl.methods.checks import integer_at_least, non_negative
from fedmtl.methods.fedavg import FedAvg


@register_method
class Ditto(FedAvg):
    """Ditto as FedHCA² compares against it (suppl. C; docs/methods.md, Ditto).

    Two tracks per client, both starting every round from what the server sent, w̄ (global
    encoder and decoders, plus the client's global-track heads):

    (a) the global track trains on the plain task loss and is uploaded; the server runs
        FedAvg-HC on it, so this track is exactly a FedAvg run;
    (b) the personal model v_i (encoder, decoders, heads) is never uploaded; it trains for
        ``personal_epochs`` on L_i(v) + (λ/2)·‖v − w̄‖² with its own AdamW and schedule,
        w̄ frozen at the round start (gradient λ(v − w̄), in the loss, never in ``.grad``).

    Both tracks see the same batches in the same order as a FedAvg / Local client would
    (each has its own loader generator, seeded alike), so λ = 0 makes the personal track a
    Local run. v_i starts from the client's initial model. The personal model is evaluated
    (the paper's numbers); the global track is evaluated too (``also_evaluated``). It costs
    about twice a FedAvg round.

    Args:
        lam: λ ≥ 0, the pull of the personal model towards the global one (paper: 0.1).
            The public FMTL-Benchmark and PFLlib read it from ``mu`` by mistake.
        personal_epochs: E_p per round; None: the client's local epochs (as FMTL-Benchmark).
        weighted: weigh the global averages by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round.
    """

    evaluated = "personal"
    also_evaluated = ("global",)

    def __init__(
        self,
        lam: float = 0.1,
        personal_epochs: int | None = None,
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(weighted=weighted, participation=participation)
        non_negative("lam", lam, " (Ditto's λ)")
        if personal_epochs is not None:
            integer_at_least("personal_epochs", personal_epochs, 1, " or null")
        self.lam = float(lam)
        self.personal_epochs = personal_epochs

    def init_client(self, model: nn.Module, client: ClientInfo, seed: int) -> dict[str, Any]:
        return {"track": new_track(model)}

    def local_update(self, ctx: ClientContext) -> Tensor:
        anchor = ctx.state["model"]  # w̄: train() replaces the track's model, never modifies it
        losses = ctx.train(ctx.state)

        def pull_to_global(model: nn.Module) -> Penalty | None:
            if self.lam == 0:
                return None
            pairs = [
                (p, anchor[name].to(p.device)) for name, p in model.named_parameters() if p.requires_grad
            ]
            return Penalty(self.lam, pairs)

        ctx.train(ctx.personal["track"], epochs=self.personal_epochs, penalty=pull_to_global)
        return losses

    def evaluated_models(self, state: Mapping[str, Any]) -> dict[str, Mapping[str, Tensor]]:
        return {"personal": state["personal"]["track"]["model"], "global": state["model"]}

    def __repr__(self) -> str:
        return (
            f"Ditto(lam={self.lam}, personal_epochs={self.personal_epochs}, weighted={self.weighted}, "
            f"participation={self.participation})"
        )
