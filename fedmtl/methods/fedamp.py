"""FedAMP (Huang et al., AAAI 2021) in HC-FMTL: a personal cloud model per encoder and per decoder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.communication import Exchange
from fedmtl.aggregation.functional import fedamp_weights, gram_matrix, heuristic_fedamp_weights, mix_rows
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, Method, Penalty, register_method, snapshot
from fedmtl.methods.checks import either, positive, within


@register_method
class FedAMP(Method):
    """FedAMP as FedHCA² compares against it (suppl. C; docs/methods.md, FedAMP), on both pools.

    Server: for a pool of M slots (N encoders, or K decoders across tasks) with trained
    weights w_1..w_M, every slot i gets its own cloud model u_i = Σ_j ξ_ij w_j, with
    ξ_ij = α_k·e^{−‖w_i − w_j‖²/σ}/σ (j ≠ i) and ξ_ii = 1 − Σ_{j≠i} ξ_ij — squared distances
    in float64, entries not clipped (ξ_ii < 0 extrapolates, as early rounds do when the
    models are nearly equal). ``kernel="heuristic"`` is HeurFedAMP (fixed ξ_ii =
    ``self_weight``, a softmax of σ·cosine similarities for the rest).

    Client: the cloud model is never loaded into the model; the client continues from its
    own weights w_i (``init_from_cloud`` starts from u_i instead) and minimises
    L_i(θ) + λ/(2α_k)·Σ_slots ‖θ_s − u_s‖² over its encoder and decoders (heads are not
    slots). In round 1, u_i is the client's initial model. The client's own model is
    evaluated (``personal``).

    Over ~28 M Swin-T weights, d_ij grows fast once clients diverge (about 28 at 1e-3 per
    weight, e^{−28} ≈ 7e-13): ξ_ij → 0 and FedAMP becomes Local. That is the method as
    specified, not a bug; a normalised distance would be a variant. ``xi_self/<slot>``
    (ξ_ii per encoder) is logged every round to show it.

    Args:
        lam: λ > 0, the pull towards the cloud model (paper: 1).
        alpha_k: α_k > 0, the message-passing step (paper: 1, held constant).
        sigma: σ > 0, the kernel's scale (paper: 1).
        kernel: ``exp`` (FedAMP's A(x) = 1 − e^{−x/σ}) or ``heuristic`` (HeurFedAMP).
        self_weight: HeurFedAMP's fixed ξ_ii in [0, 1].
        init_from_cloud: start each round from u_i instead of w_i.
        participation: fraction of the clients that train each round; the others' last
            uploaded weights take part in the message passing.
    """

    evaluated = "personal"

    def __init__(
        self,
        lam: float = 1.0,
        alpha_k: float = 1.0,
        sigma: float = 1.0,
        kernel: Literal["exp", "heuristic"] = "exp",
        self_weight: float = 0.5,
        init_from_cloud: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation=participation)
        positive("lam", lam)
        positive("alpha_k", alpha_k)
        positive("sigma", sigma)
        either("kernel", kernel, "exp", "heuristic")
        within("self_weight", self_weight, "[0, 1]")
        self.lam, self.alpha_k, self.sigma = float(lam), float(alpha_k), float(sigma)
        self.kernel = kernel
        self.self_weight = float(self_weight)
        self.init_from_cloud = init_from_cloud
        self._xi_self: dict[str, float] = {}

    # ------------------------------------------------------------------ server

    def weights(self, gram: Tensor) -> Tensor:
        """ξ [M, M] (float64) of a pool from the Gram matrix of its trained weights."""
        if self.kernel == "exp":
            return fedamp_weights(gram, self.alpha_k, self.sigma)
        return heuristic_fedamp_weights(gram, self.sigma, self.self_weight)

    def clouds(self, prev: Tensor, deltas: Tensor) -> tuple[Tensor, Tensor]:
        """(ξ [M, M], u [M, D]) of a stacked pool (the decoders), trained weights w = prev + deltas."""
        m = prev.shape[0]
        blocks = gram_matrix([prev, deltas]).cpu()  # [2M, 2M]: Gram of w without forming w
        gram = blocks[:m, :m] + blocks[:m, m:] + blocks[m:, :m] + blocks[m:, m:]
        xi = self.weights(gram)
        return xi, mix_rows(xi, prev, deltas)

    def log_values(self) -> dict[str, float]:
        return {f"xi_self/{name}": value for name, value in self._xi_self.items()}

    def exchange(self, round_: int) -> Exchange:
        """Up: the client's trained encoder and decoders (w_i); down: its personal cloud models
        u_i, one per encoder and decoder slot (``clouds``). The server keeps every client's last
        upload, so a client that sits a round out sends nothing and still gets its cloud."""
        return Exchange(
            up={"encoder": ("encoder",), "decoders": ("decoders",)}, down={"clouds": ("encoder", "decoders")}
        )

    # ------------------------------------------------------------------ the server step

    reads_every_client = True  # the clients that sit a round out take part with their last weights
    individual_updates = (
        "weighs every pair of clients by the distance between their individual models (attention)"
    )

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return ("trained",)

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        """Encoders: ξ from the Gram matrix of the trained rows, then each client's cloud
        u_i = Σ_j ξ_ij w_j written as its row ``"cloud"``; decoders: :meth:`clouds` of the
        stacked pool."""
        trained = encoders["trained"]
        xi = self.weights(trained.gram())
        trained.mix(xi, into="cloud")
        n = inputs.num_clients
        clouds = {"cloud": torch.ones(n, dtype=torch.float64)}
        mix = EncoderMix(torch.zeros(0, trained.numel), torch.zeros(n, 0, dtype=torch.float64), own=clouds)
        _, decoders = self.clouds(inputs.decoders_prev, inputs.decoder_deltas)
        self._xi_self = {
            c.name: float(x) for c, x in zip(inputs.clients, xi.diagonal().tolist(), strict=True)
        }
        return RoundOutput(encoders=mix, decoders=decoders)

    # ------------------------------------------------------------------ client

    def receive(self, ctx: ClientContext, encoder: Tensor, decoders: Mapping[str, Tensor]) -> None:
        """The cloud models become the client's anchors (personal state), not its weights."""
        ctx.personal["cloud"] = {
            "encoder": encoder.detach().to("cpu", copy=True),
            "decoders": {task: row.detach().to("cpu", copy=True) for task, row in decoders.items()},
        }
        if self.init_from_cloud:
            super().receive(ctx, encoder, decoders)

    def penalty(self, ctx: ClientContext, model: nn.Module) -> Penalty | None:
        coefficient = self.lam / self.alpha_k
        cloud = ctx.personal.get("cloud")
        if cloud is None:  # round 1: u_i = θ_i^(0), the model the client starts from
            return Penalty(coefficient, snapshot([p for p in _slot_parameters(model) if p.requires_grad]))
        pairs: list[tuple[Tensor, Tensor]] = []
        modules = [(model.encoder, ctx.encoder_layout, cloud["encoder"])]
        modules += [(model.decoders[t], ctx.decoder_layout, row) for t, row in cloud["decoders"].items()]
        for module, layout, row in modules:
            anchors = layout.unflatten(row.to(next(module.parameters()).device))
            pairs += [(p, anchors[name]) for name, p in module.named_parameters() if p.requires_grad]
        return Penalty(coefficient, pairs)

    def evaluated_models(self, state: Mapping[str, Any]) -> dict[str, Mapping[str, Tensor]]:
        return {"personal": state["model"]}

    def __repr__(self) -> str:
        return (
            f"FedAMP(lam={self.lam}, alpha_k={self.alpha_k}, sigma={self.sigma}, kernel={self.kernel!r}, "
            f"self_weight={self.self_weight}, init_from_cloud={self.init_from_cloud}, "
            f"participation={self.participation})"
        )


def _slot_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the server pools: the encoder's and every decoder's (not the heads')."""
    return [*model.encoder.parameters(), *model.decoders.parameters()]
