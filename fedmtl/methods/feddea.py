"""FedDEA (arXiv 2505.24185) as a plug-in: mask and rescale each update, then the host aggregates."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from torch import Tensor, nn

from fedmtl.aggregation.base import ClientInfo, RoundInput, RoundOutput
from fedmtl.aggregation.feddea import check_rho, feddea_mask
from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.stream import EncoderRows
from fedmtl.methods.base import ClientContext, Method, Penalty, create_method, register_method
from fedmtl.methods.fedavg import HeadScope, Scope

HOSTS = ("FedAvg", "FedProx", "FedOpt")
# Methods whose server step is not an average of updates: FedDEA is not defined over them.
_NOT_AVERAGING = {
    "FedHCA2": "aggregates by conflict-averse and cross-attention weights, not by an average of updates",
    "FedAMP": "gives each client its own attention-weighted model, not an average of updates",
}


@register_method
class FedDEA(Method):
    """FedDEA's update decoupling (BASELINES.md §3.10 and appendix B) in front of a host.

    Every slot's update (a client's encoder, each decoder, and each head when heads are
    shared) keeps its k = ⌈ρ·d⌉ entries of largest |Δ| and is multiplied by 1/ρ; the rest
    becomes 0 (:func:`fedmtl.aggregation.feddea_mask`: exactly k entries, ties to the lowest
    index). The host then aggregates the transformed updates as its own: FedAvg's mean,
    FedProx's (whose clients also train with the proximal term), or FedOpt's server
    optimiser. The transform belongs to the client; the simulation applies it to the stacked
    deltas at the start of the server step, which gives the same numbers. ρ = 1 is the host,
    bit for bit.

    What the paper leaves open and what is chosen here (README, "FedDEA"): the mask is taken
    per aggregation unit (``scope: unit``, the whole flattened encoder or decoder, as the
    paper's "flattened update vector"; ``scope: tensor`` masks each parameter tensor on its
    own); k rounds up; the mean is uniform over the slots of a group, zeros included; heads
    and BatchNorm statistics stay local in HC-FMTL; in the unified-model setting
    (``decoder_scope: same_task``, ``head_scope: same_task``) heads are averaged among the
    clients of their task, BatchNorm statistics still stay local; ρ is fixed.

    Args:
        rho: the fraction of each update kept, in (0, 1]; the paper's best range is 0.2–0.3.
        scope: ``unit`` (one mask per aggregation unit) or ``tensor`` (one per parameter tensor).
        rescale: multiply what is kept by 1/ρ (False: the paper's ablation, masking only).
        host: ``FedAvg`` (the default), ``FedProx`` or ``FedOpt``.
        mu: FedProx's proximal coefficient (host FedProx only; default its 0.01).
        server_optimizer, server_lr, beta1, beta2, tau: FedOpt's server optimiser (host FedOpt
            only; defaults FedOpt's: adam, 1e-2, 0.9, 0.99, 1e-3).
        encoder_scope, decoder_scope, head_scope: among whom the host averages (see
            :class:`~fedmtl.methods.FedAvg`).
        weighted: weigh the host's averages by sample counts.
        participation: fraction of the clients that train each round.
    """

    def __init__(
        self,
        rho: float = 0.25,
        scope: Literal["unit", "tensor"] = "unit",
        rescale: bool = True,
        host: str = "FedAvg",
        mu: float | None = None,
        server_optimizer: str | None = None,
        server_lr: float | None = None,
        beta1: float | None = None,
        beta2: float | None = None,
        tau: float | None = None,
        encoder_scope: Scope = "all",
        decoder_scope: Scope = "all",
        head_scope: HeadScope = "none",
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation=participation)
        check_rho(rho)
        if scope not in ("unit", "tensor"):
            raise ValueError(
                f"algorithm.scope must be 'unit' or 'tensor' (where FedDEA masks), got {scope!r}"
            )
        if not isinstance(rescale, bool):
            raise ValueError(f"algorithm.rescale must be true or false, got {rescale!r}")
        if host in _NOT_AVERAGING:
            raise ValueError(
                f"algorithm.host: FedDEA is not defined over {host}, which {_NOT_AVERAGING[host]}; "
                f"use one of {list(HOSTS)}"
            )
        if host not in HOSTS:
            raise ValueError(f"algorithm.host must be one of {list(HOSTS)} (FedDEA's hosts), got {host!r}")
        fedopt = {
            "server_optimizer": server_optimizer,
            "server_lr": server_lr,
            "beta1": beta1,
            "beta2": beta2,
            "tau": tau,
        }
        own = {"FedAvg": {}, "FedProx": {"mu": mu}, "FedOpt": fedopt}[host]
        for name, value in {"mu": mu, **fedopt}.items():
            if value is not None and name not in own:
                users = "FedProx" if name == "mu" else "FedOpt"
                raise ValueError(
                    f"algorithm.{name} is an option of host {users}, but algorithm.host is {host}; "
                    f"set --algorithm.host {users} or drop algorithm.{name}"
                )
        self.rho = float(rho)
        self.scope = scope
        self.rescale = rescale
        self.host: Method = create_method(
            host,
            encoder_scope=encoder_scope,
            decoder_scope=decoder_scope,
            head_scope=head_scope,
            weighted=weighted,
            participation=participation,
            **{k: v for k, v in own.items() if v is not None},
        )
        self.evaluated = self.host.evaluated  # post-aggregation for every host

    # ------------------------------------------------------------------ the server step

    def aggregate(self, inputs: RoundInput) -> RoundOutput:
        return self.host.aggregate(self._masked(inputs))

    def _masked(self, inputs: RoundInput) -> RoundInput:
        """``inputs`` with every update masked (the encoders' only where they are stacked)."""
        encoders = inputs.encoder_deltas
        return dataclasses.replace(
            inputs,
            encoder_deltas=None if encoders is None else self.transform(encoders, inputs.encoder_layout),
            decoder_deltas=self.transform(inputs.decoder_deltas, inputs.decoder_layout),
            heads=[dataclasses.replace(g, deltas=self.transform(g.deltas, g.layout)) for g in inputs.heads],
        )

    # ------------------------------------------------------------------ streamed

    @property
    def streams(self) -> bool:
        return self.host.streams

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return self.host.encoder_rows(round_)

    def encoder_row(self, name: str, prev: Tensor, trained: Tensor, layout: FlatLayout) -> Tensor:
        """The host's rows of the masked update: Δ' = mask(Δ), "trained" = prev + Δ'. A client
        the host leaves as it is (``encoder_scope: none``) keeps its own, unmasked encoder at
        write-back, whatever this row (the host's ``receive`` ignores that row)."""
        if name not in ("trained", "delta"):
            return self.host.encoder_row(name, prev, trained, layout)
        masked = self.transform((trained - prev)[None], layout)[0]
        return prev + masked if name == "trained" else masked

    def aggregate_streamed(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        return self.host.aggregate_streamed(self._masked(inputs), encoders)  # rows masked as written

    def transform(self, deltas: Tensor, layout: FlatLayout) -> Tensor:
        """FedDEA's transform of a stack of updates [M, D]: per row (``unit``) or per parameter
        tensor of each row (``tensor``)."""
        if self.scope == "unit" or self.rho == 1:
            return feddea_mask(deltas, self.rho, self.rescale)
        out = deltas.new_empty(deltas.shape)
        for offset, numel in zip(layout.offsets, layout.numels, strict=True):
            part = slice(offset, offset + numel)
            out[:, part] = feddea_mask(deltas[:, part].contiguous(), self.rho, self.rescale)
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.host.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.host.load_state_dict(state)

    def log_values(self) -> dict[str, float]:
        return self.host.log_values()

    def log_matrices(self) -> dict[str, tuple[list[str], list[str], Tensor]]:
        return self.host.log_matrices()

    # ------------------------------------------------------------------ the rest is the host's

    @property
    def shares_heads(self) -> bool:
        return self.host.shares_heads

    def setup(self, rounds: int, clients: Sequence[ClientInfo], seed: int) -> None:
        super().setup(rounds, clients, seed)
        self.host.setup(rounds, clients, seed)

    def check_run(self, rounds: int, num_clients: int) -> None:
        self.host.check_run(rounds, num_clients)

    def participants(self, round_: int) -> list[int] | None:
        return self.host.participants(round_)

    def init_client(self, model: nn.Module, client: ClientInfo, seed: int) -> dict[str, Any]:
        return self.host.init_client(model, client, seed)

    def frozen(self, model: nn.Module, round_: int) -> list[nn.Module]:
        return self.host.frozen(model, round_)

    def penalty(self, ctx: ClientContext, model: nn.Module) -> Penalty | None:
        return self.host.penalty(ctx, model)

    def local_update(self, ctx: ClientContext) -> Tensor:
        return self.host.local_update(ctx)

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        self.host.receive(ctx, encoder, decoders)

    def receive_heads(self, ctx: ClientContext, heads: Mapping[str, Tensor]) -> None:
        self.host.receive_heads(ctx, heads)

    @property
    def finishes(self) -> bool:
        return self.host.finishes

    def finish(self, ctx: ClientContext) -> None:
        self.host.finish(ctx)

    def evaluated_models(self, state: Mapping[str, Any]) -> dict[str, Mapping[str, Tensor]]:
        return self.host.evaluated_models(state)

    def __repr__(self) -> str:
        return f"FedDEA(rho={self.rho}, scope={self.scope!r}, rescale={self.rescale}, host={self.host!r})"
