"""FedAvg adapted to hetero-client federated multi-task learning, with a scope per pool."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from torch import Tensor

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.functional import cosine_clusters, gram_matrix, group_means_to
from fedmtl.methods.base import ClientContext, Method, register_method

Scope = Literal["all", "same_task", "cluster", "none"]
SCOPES = ("all", "same_task", "cluster", "none")


@register_method
class FedAvg(Method):
    """FedAvg (McMahan et al., AISTATS 2017) as FedHCA² (Lu et al., CVPR 2024, Sec. 4.1,
    Table 1) applies it to HC-FMTL ("FedAvg-HC", BASELINES.md §3.2).

    By default every one of the N client encoders becomes the average of the N locally
    trained encoders θ_i^(r-1) + Δθ_i^(r), and every one of the K decoders, whatever its
    task, the average of the K locally trained decoders. Heads and BatchNorm statistics stay
    local. Each pool's *scope* says among whom parameters are averaged:

    - ``all``: the whole pool (encoders over N clients; decoders over all K, across tasks);
    - ``same_task``: encoders of clients with the same task set; decoders of the same task;
    - ``cluster``: MaT-FL's grouping, re-clustered every round (``num_clusters``, cosine
      distance of deviations from the mean, average linkage);
    - ``none``: nothing is averaged (the pool stays personal).

    With client sampling (``participation`` < 1) a group's mean is taken over its members
    that trained this round and given to all its members (for ``cluster``: to those that
    trained); a group with no member training is left as it is.

    Args:
        encoder_scope: among whom encoders are averaged.
        decoder_scope: among whom decoders are averaged.
        weighted: weigh each encoder by its client's ``num_samples`` and each decoder by its
            owner's, instead of equally (the paper's comparison averages equally).
        num_clusters: clusters for a ``cluster`` scope (MaT-FL: 2).
        participation: fraction of the clients that train each round (see :class:`Method`).
    """

    def __init__(
        self,
        encoder_scope: Scope = "all",
        decoder_scope: Scope = "all",
        weighted: bool = False,
        num_clusters: int = 2,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation=participation)
        for name, scope in [("encoder_scope", encoder_scope), ("decoder_scope", decoder_scope)]:
            if scope not in SCOPES:
                raise ValueError(f"algorithm.{name} must be one of {list(SCOPES)}, got {scope!r}")
        if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
            raise ValueError(f"algorithm.num_clusters must be an integer >= 1, got {num_clusters!r}")
        self.encoder_scope = encoder_scope
        self.decoder_scope = decoder_scope
        self.weighted = weighted
        self.num_clusters = num_clusters

    def check_run(self, rounds: int, num_clients: int) -> None:
        if "cluster" in (self.encoder_scope, self.decoder_scope) and self.num_clusters > num_clients:
            raise ValueError(
                f"algorithm.num_clusters is {self.num_clusters} but the scenario has {num_clients} clients: "
                f"set --algorithm.num_clusters to at most {num_clients}"
            )

    def aggregate(self, inputs: RoundInput) -> RoundOutput:
        encoder_keys = [frozenset(c.tasks) for c in inputs.clients]
        decoder_keys = [task for _, task in inputs.decoder_owners]
        encoders = self._pool(
            self.encoder_scope,
            inputs.encoders_prev,
            inputs.encoder_deltas,
            encoder_keys,
            inputs.participating_clients,
            inputs.client_num_samples,
        )
        decoders = self._pool(
            self.decoder_scope,
            inputs.decoders_prev,
            inputs.decoder_deltas,
            decoder_keys,
            inputs.participating_decoders,
            inputs.decoder_num_samples,
        )
        return RoundOutput(encoders=encoders, decoders=decoders)

    def receive(self, ctx: ClientContext, encoder: Tensor | None, decoders: Mapping[str, Tensor]) -> None:
        """A pool with scope ``none`` keeps the bits the client trained (the server's row,
        θ^(r-1) + Δθ, can differ from them in the last float32 bit); the others are loaded."""
        super().receive(
            ctx,
            None if self.encoder_scope == "none" else encoder,
            {} if self.decoder_scope == "none" else decoders,
        )

    def _pool(
        self,
        scope: Scope,
        prev: Tensor,
        deltas: Tensor,
        keys: Sequence[object],
        participating: list[int],
        num_samples: list[int],
    ) -> Tensor:
        """One pool's new rows: means within the scope's groups of trained rows."""
        rows = range(prev.shape[0])
        if scope == "all":
            groups = [(participating, list(rows))]
        elif scope == "same_task":
            members: dict[object, list[int]] = {}
            for row in rows:
                members.setdefault(keys[row], []).append(row)
            taking_part = set(participating)
            groups = [([r for r in group if r in taking_part], group) for group in members.values()]
        elif scope == "cluster":
            groups = [(c, c) for c in self._clusters(prev, deltas, participating)]
        else:
            groups = []
        return group_means_to(prev, deltas, groups, num_samples if self.weighted else None)

    def _clusters(self, prev: Tensor, deltas: Tensor, participating: list[int]) -> list[list[int]]:
        """MaT-FL's clusters of the participating rows, as row indices."""
        k = min(self.num_clusters, len(participating))
        if k == len(participating):
            return [[r] for r in participating]
        trained = prev[participating] + deltas[participating]
        clusters = cosine_clusters(gram_matrix(trained).cpu(), k)
        return [[participating[j] for j in cluster] for cluster in clusters]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(encoder_scope={self.encoder_scope!r}, decoder_scope={self.decoder_scope!r}, "
            f"weighted={self.weighted}, num_clusters={self.num_clusters}, participation={self.participation})"
        )
