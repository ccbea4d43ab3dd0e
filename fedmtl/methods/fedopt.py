"""FedOpt (Reddi et al., ICLR 2021) in HC-FMTL: FedAvg-HC's groups, a server optimiser per group."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from fedmtl.aggregation.base import RoundInput
from fedmtl.aggregation.fedopt import (
    DEFAULT_BETA1,
    DEFAULT_BETA2,
    DEFAULT_SERVER_LR,
    DEFAULT_TAU,
    ServerOptimizer,
    ServerOptimizerKind,
)
from fedmtl.aggregation.functional import mean_rows
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import register_method
from fedmtl.methods.fedavg import FedAvg, Groups, HeadScope, Scope

Moments = dict[str, Tensor]


@register_method
class FedOpt(FedAvg):
    """FedAdam, FedYogi and FedAdagrad (Reddi et al., Algorithm 2) over FedAvg-HC's pools.

    Each group FedAvg would average (the encoders of all N clients; the decoders of all K, or
    of one task with ``decoder_scope: same_task``; the heads of one task in the unified
    model) is one global model x of a FedOpt run: its pseudo-gradient is the mean of the
    group's deltas, Δ = mean(θ' − x), and the server optimiser moves x by
    η·m / (√v + τ) (see :mod:`fedmtl.aggregation.fedopt` for the update rules and the choices
    the paper leaves open). Every member of the group receives the new x. Each group keeps
    its own moments m and v, as long as its parameters (two encoder-sized vectors for the
    encoder pool); they are server state, checkpointed, so a resumed run continues them bit
    for bit. Heads stay local unless ``head_scope: same_task``.

    ``server_optimizer: sgd`` with ``server_lr: 1`` and ``beta1: 0`` is FedAvg bit for bit.

    Args:
        server_optimizer: ``adam`` (FedAdam), ``yogi`` (FedYogi), ``adagrad`` (FedAdagrad)
            or ``sgd`` (server momentum, FedAvgM-style).
        server_lr: the server learning rate η > 0, the option to tune. Default 1e-2, chosen
            for this project's AdamW clients (see :mod:`fedmtl.aggregation.fedopt`).
        beta1: momentum of the pseudo-gradient, in [0, 1) (paper: 0.9).
        beta2: second-moment decay, in [0, 1) (paper: 0.99; FedAdagrad ignores it).
        tau: adaptivity τ > 0 (paper: 1e-3); the second moment starts at τ².
        encoder_scope: ``all``, ``same_task`` or ``none`` (see :class:`FedAvg`; ``cluster`` is
            refused: its groups change every round, so no moments could follow them).
        decoder_scope: the same choices for the decoders.
        head_scope: ``none`` or ``same_task`` (the unified model).
        weighted: weigh the mean delta (and the mean of the group's start) by sample counts.
        participation: fraction of the clients that train each round.
    """

    def __init__(
        self,
        server_optimizer: ServerOptimizerKind = "adam",
        server_lr: float = DEFAULT_SERVER_LR,
        beta1: float = DEFAULT_BETA1,
        beta2: float = DEFAULT_BETA2,
        tau: float = DEFAULT_TAU,
        encoder_scope: Scope = "all",
        decoder_scope: Scope = "all",
        head_scope: HeadScope = "none",
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(
            encoder_scope=encoder_scope,
            decoder_scope=decoder_scope,
            weighted=weighted,
            participation=participation,
            head_scope=head_scope,
        )
        for name, scope in [("encoder_scope", encoder_scope), ("decoder_scope", decoder_scope)]:
            if scope == "cluster":
                raise ValueError(
                    f"algorithm.{name}: FedOpt keeps server moments per group, and 'cluster' groups change "
                    "every round; use 'all', 'same_task' or 'none'"
                )
        self.optimizer = ServerOptimizer(server_optimizer, server_lr, beta1, beta2, tau)
        self.moments: dict[str, Moments] = {}  # group key -> {"m", "v"}

    def _combine(
        self, pool: str, prev: Tensor, deltas: Tensor, groups: Groups, num_samples: list[int]
    ) -> Tensor:
        """One server-optimiser step per group with a member that trained; the other rows keep
        what they trained (scope ``none``) or their start (a group nobody trained in)."""
        out = prev + deltas
        for key, (sources, targets) in groups.items():
            if not sources:
                continue
            index = torch.tensor(sources, device=prev.device)
            weights = [num_samples[i] for i in sources] if self.weighted else None
            # x as FedAvg takes it (mean of the starts, equal rows in practice), so that sgd at
            # lr 1, beta1 0 gives FedAvg's bits: mean(prev) + mean(deltas).
            x = mean_rows(prev.index_select(0, index), weights)
            delta = mean_rows(deltas.index_select(0, index), weights)
            if self.server_privacy is not None:  # the pseudo-gradient's sum carries the noise
                x = self._private_mean(pool, key, prev[sources], sources, num_samples, x, noisy=False)
                delta = self._private_mean(pool, key, deltas[sources], sources, num_samples, delta)
            name = f"{pool}/{key}"
            new, self.moments[name] = self.optimizer.step(x, delta, self.moments.get(name))
            out[targets] = new
        return out

    # ------------------------------------------------------------------ the encoders

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return () if self.encoder_scope == "none" else ("prev", "delta")

    def _stream_groups(
        self, groups: Groups, encoders: Mapping[str, EncoderRows], inputs: RoundInput
    ) -> EncoderMix:
        """:meth:`_combine` of the encoders, on their rows: per group with a member that trained,
        x and Δ as weighted sums of the prev and delta rows, one optimiser step, the result to
        the group's targets; the other clients keep what they trained."""
        live = [(key, sources, targets) for key, (sources, targets) in groups.items() if sources]
        if not live:
            return EncoderMix.kept(inputs.num_clients, inputs.encoder_layout.numel)
        weights, mixing, trained = self._group_weights([(s, t) for _, s, t in live], inputs)
        privacy = self.server_privacy
        if privacy is None:
            x, delta = encoders["prev"].weighted_sums(weights), encoders["delta"].weighted_sums(weights)
        else:
            keys = [key for key, _, _ in live]
            x = privacy.weighted_sums(encoders["prev"], weights, keys, "encoder-start")
            delta = privacy.weighted_sums(encoders["delta"], weights, keys, "encoder")
            for g, (key, sources, _) in enumerate(live):
                delta[g] = privacy.add_noise("encoder", key, delta[g], len(sources))
        stepped = []
        for g, (key, _, _) in enumerate(live):
            name = f"encoders/{key}"  # as the stacked step named it: earlier checkpoints resume
            new, self.moments[name] = self.optimizer.step(x[g], delta[g], self.moments.get(name))
            stepped.append(new)
        return EncoderMix(torch.stack(stepped), mixing, own={"trained": trained})

    # ------------------------------------------------------------------ server state

    def state_dict(self) -> dict[str, dict[str, dict[str, Tensor]]]:
        return {
            "moments": {name: {k: t.detach().cpu() for k, t in m.items()} for name, m in self.moments.items()}
        }

    def load_state_dict(self, state) -> None:  # type: ignore[no-untyped-def]
        if not state:
            self.moments = {}
            return
        if set(state) != {"moments"}:
            raise ValueError(f"FedOpt's server state holds 'moments', got keys {sorted(state)}")
        self.moments = {name: dict(m) for name, m in state["moments"].items()}

    def __repr__(self) -> str:
        o = self.optimizer
        return (
            f"FedOpt(server_optimizer={o.kind!r}, server_lr={o.lr}, beta1={o.beta1}, beta2={o.beta2}, "
            f"tau={o.tau}, encoder_scope={self.encoder_scope!r}, decoder_scope={self.decoder_scope!r}, "
            f"head_scope={self.head_scope!r}, weighted={self.weighted}, participation={self.participation})"
        )
