"""FedAvg adapted to hetero-client federated multi-task learning, with a scope per pool."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor

from fedmtl.aggregation.base import RoundInput, RoundOutput
from fedmtl.aggregation.functional import cosine_clusters, gram_matrix, group_means_to
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import ClientContext, Method, register_method
from fedmtl.methods.checks import integer_at_least, one_of

Scope = Literal["all", "same_task", "cluster", "none"]
SCOPES = ("all", "same_task", "cluster", "none")
HeadScope = Literal["none", "same_task"]
HEAD_SCOPES = ("none", "same_task")
Groups = dict[str, tuple[list[int], list[int]]]  # group key -> (rows that trained, rows that receive)


@register_method
class FedAvg(Method):
    """FedAvg (McMahan et al., AISTATS 2017) as FedHCA² (Lu et al., CVPR 2024, Sec. 4.1,
    Table 1) applies it to HC-FMTL ("FedAvg-HC"; docs/methods.md, FedAvg).

    By default every one of the N client encoders becomes the average of the N locally
    trained encoders θ_i^(r-1) + Δθ_i^(r), and every one of the K decoders, whatever its
    task, the average of the K locally trained decoders. Heads and BatchNorm statistics stay
    local. Each pool's *scope* says among whom parameters are averaged:

    - ``all``: the whole pool (encoders over N clients; decoders over all K, across tasks);
    - ``same_task``: encoders of clients with the same task set; decoders of the same task;
    - ``cluster``: MaT-FL's grouping, re-clustered every round (``num_clusters``, cosine
      distance of deviations from the mean, average linkage);
    - ``none``: nothing is averaged (the pool stays personal).

    Heads stay local unless ``head_scope`` is ``same_task``: then the heads of one task on one
    dataset are averaged among the clients that have it. With ``decoder_scope: same_task``
    this is the unified-model setting of FedDEA (``configs/feddea/``): one shared encoder and,
    per task, one decoder and head.

    With client sampling (``participation`` < 1) a group's mean is taken over its members
    that trained this round and given to all its members (for ``cluster``: to those that
    trained); a group with no member training is left as it is.

    Args:
        encoder_scope: among whom encoders are averaged.
        decoder_scope: among whom decoders are averaged.
        weighted: weigh each encoder by its client's ``num_samples`` and each decoder by its
            owner's, instead of equally (the paper's comparison averages equally).
        num_clusters: clusters for a ``cluster`` scope (MaT-FL: 2).
        head_scope: ``none`` (heads stay local, HC-FMTL) or ``same_task`` (averaged among the
            clients with the same task on the same dataset: the unified model).
        participation: fraction of the clients that train each round (see :class:`Method`).
    """

    def __init__(
        self,
        encoder_scope: Scope = "all",
        decoder_scope: Scope = "all",
        weighted: bool = False,
        num_clusters: int = 2,
        participation: float = 1.0,
        head_scope: HeadScope = "none",
    ) -> None:
        super().__init__(participation=participation)
        one_of("encoder_scope", encoder_scope, SCOPES)
        one_of("decoder_scope", decoder_scope, SCOPES)
        one_of("head_scope", head_scope, HEAD_SCOPES)
        integer_at_least("num_clusters", num_clusters, 1)
        self.head_scope = head_scope
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

    @staticmethod
    def _encoder_keys(inputs: RoundInput) -> list[str]:
        return ["+".join(sorted(c.tasks)) for c in inputs.clients]  # a task set

    @property
    def individual_updates(self) -> str | None:  # type: ignore[override]
        """Only a ``cluster`` scope (MaT-FL's) reads each update on its own."""
        if "cluster" in (self.encoder_scope, self.decoder_scope):
            return "clusters the clients by the cosine distances of their individual updates (scope cluster)"
        return None

    def _decoders(self, inputs: RoundInput) -> tuple[Tensor, Tensor]:
        return self._pool(
            "decoders",
            self.decoder_scope,
            inputs.decoders_prev,
            inputs.decoder_deltas,
            [task for _, task in inputs.decoder_owners],
            inputs.participating_decoders,
            inputs.decoder_num_samples,
        )

    # ------------------------------------------------------------------ the server step

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return () if self.encoder_scope == "none" else ("trained",)

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        participating = inputs.participating_clients
        groups = self._scope_groups(
            self.encoder_scope,
            self._encoder_keys(inputs),
            participating,
            lambda: encoders["trained"].gram(rows=participating),  # clusters on the trained rows
        )
        mix = self._stream_groups(groups, encoders, inputs)
        decoders, decoders_kept = self._decoders(inputs)
        heads, heads_kept = self._heads(inputs)
        return RoundOutput(mix, decoders, heads, decoders_kept=decoders_kept, heads_kept=heads_kept)

    def _stream_groups(
        self, groups: Groups, encoders: Mapping[str, EncoderRows], inputs: RoundInput
    ) -> EncoderMix:
        """The encoders' groups combined: each group's (weighted) mean of its sources' trained
        rows goes to its targets; the other clients keep what they trained."""
        live = {key: group for key, group in groups.items() if group[0] and group[1]}
        n = inputs.num_clients
        if not live:
            return EncoderMix.kept(n, inputs.encoder_layout.numel)
        weights, mixing, trained = self._group_weights(list(live.values()), inputs)
        privacy = self.server_privacy
        if privacy is None:
            return EncoderMix(encoders["trained"].weighted_sums(weights), mixing, own={"trained": trained})
        means = privacy.weighted_sums(encoders["trained"], weights, list(live), "encoder")
        for g, (key, (sources, _)) in enumerate(live.items()):
            means[g] = privacy.add_noise("encoder", key, means[g], len(sources))
        return EncoderMix(means, mixing, own={"trained": trained})

    def _group_weights(
        self, groups: Sequence[tuple[list[int], list[int]]], inputs: RoundInput
    ) -> tuple[Tensor, Tensor, Tensor]:
        """For (sources, targets) groups: their sources' normalised weights [G, N] (equal, or
        by sample count), the targets' mixing [N, G] and the own-row coefficients [N] (0 for a
        target, 1 for a client that keeps what it trained)."""
        n = inputs.num_clients
        counts = inputs.client_num_samples
        weights = torch.zeros(len(groups), n, dtype=torch.float64)
        mixing = torch.zeros(n, len(groups), dtype=torch.float64)
        trained = torch.ones(n, dtype=torch.float64)
        for g, (sources, targets) in enumerate(groups):
            w = torch.tensor(
                [float(counts[i]) if self.weighted else 1.0 for i in sources], dtype=torch.float64
            )
            if not w.sum() > 0:
                raise ValueError(f"weights must have a positive sum, got {w.tolist()}")
            weights[g, sources] = w / w.sum()
            mixing[targets, g] = 1.0
            trained[targets] = 0.0
        return weights, mixing, trained

    @property
    def shared_parts(self) -> frozenset[str]:
        """Every pool whose scope is not ``none``: a personal pool never leaves the client
        (FedPer, MaT-FL and FedBABU share only their encoders)."""
        scopes = {"encoder": self.encoder_scope, "decoders": self.decoder_scope, "heads": self.head_scope}
        return frozenset(part for part, scope in scopes.items() if scope != "none")

    @property
    def shares_heads(self) -> bool:
        return self.head_scope != "none"

    def _heads(self, inputs: RoundInput) -> tuple[list[Tensor] | None, list[Tensor] | None]:
        """Each head group combined over its owners that trained (``head_scope: same_task``),
        and the rows it keeps (a group nobody trained in)."""
        if not self.shares_heads:
            return None, None
        taking_part = set(inputs.participating_clients)
        out, kept = [], []
        for group in inputs.heads:
            rows = list(range(len(group.owners)))
            trained = [j for j in rows if group.owners[j] in taking_part]
            counts = [inputs.clients[i].num_samples for i in group.owners]
            groups = {group.key: (trained, rows)}
            out.append(self._combine("heads", group.prev, group.deltas, groups, counts))
            kept.append(kept_rows(groups, len(rows)))
        return out, kept

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
        pool: str,
        scope: Scope,
        prev: Tensor,
        deltas: Tensor,
        keys: Sequence[str],
        participating: list[int],
        num_samples: list[int],
    ) -> tuple[Tensor, Tensor]:
        """One stacked pool's new rows (decoders; the encoders go through :meth:`server_step`):
        the scope's groups of rows, combined by :meth:`_combine`; and the rows it keeps."""

        def gram() -> Tensor:  # of the participating rows' trained parameters
            return gram_matrix(prev[participating] + deltas[participating]).cpu()

        groups = self._scope_groups(scope, keys, participating, gram)
        return self._combine(pool, prev, deltas, groups, num_samples), kept_rows(groups, len(keys))

    def _scope_groups(
        self, scope: Scope, keys: Sequence[str], participating: list[int], gram: Callable[[], Tensor]
    ) -> Groups:
        """The groups of a scope over rows with ``keys``; a ``cluster`` scope clusters the
        participating rows on ``gram()``, the Gram matrix of their trained parameters (asked for
        only when there is something to cluster)."""
        groups: Groups = {}
        if scope == "cluster":
            for j, cluster in enumerate(self._clusters(gram, participating)):
                groups[f"cluster{j}"] = (cluster, cluster)
        elif scope == "all":
            groups["all"] = (list(participating), list(range(len(keys))))
        elif scope == "same_task":
            taking_part = set(participating)
            for row, key in enumerate(keys):
                sources, targets = groups.setdefault(key, ([], []))
                targets.append(row)
                if row in taking_part:
                    sources.append(row)
        return groups

    def _combine(
        self, pool: str, prev: Tensor, deltas: Tensor, groups: Groups, num_samples: list[int]
    ) -> Tensor:
        """A pool's new rows from its groups (key -> (rows that trained, rows that receive)):
        each group's mean goes to its receivers; the other rows keep what they trained.
        FedOpt overrides this with a server optimiser per group."""
        weights = num_samples if self.weighted else None
        out = group_means_to(prev, deltas, list(groups.values()), weights)
        if self.server_privacy is None:
            return out
        for key, (sources, targets) in groups.items():
            if sources and targets:
                trained = prev[sources] + deltas[sources]
                out[targets] = self._private_mean(pool, key, trained, sources, num_samples, out[targets[0]])
        return out

    def _private_mean(
        self,
        pool: str,
        key: str,
        rows: Tensor,
        sources: Sequence[int],
        num_samples: Sequence[int],
        plain: Tensor | None = None,
        noisy: bool = True,
    ) -> Tensor:
        """Group ``key``'s mean of ``rows`` (its ``sources``' values, [m, D]) as the server learns
        it under :attr:`server_privacy`: through secure aggregation when it is on (else
        ``plain``, the mean computed as without privacy, when given), plus the group's central
        noise when ``noisy``. In the rows' dtype and device."""
        privacy = self.server_privacy
        assert privacy is not None
        if plain is None or privacy.secure:
            w = [float(num_samples[i]) if self.weighted else 1.0 for i in sources]
            weights = torch.tensor(w, dtype=torch.float64) / sum(w)
            mean = privacy.mean(pool, key, rows.cpu(), sources, weights).to(rows.device, rows.dtype)
        else:
            mean = plain.clone()
        return privacy.add_noise(pool, key, mean, len(sources)) if noisy else mean

    def _clusters(self, gram: Callable[[], Tensor], participating: list[int]) -> list[list[int]]:
        """MaT-FL's clusters of the participating rows, as row indices, from ``gram()``."""
        k = min(self.num_clusters, len(participating))
        if k == len(participating):
            return [[r] for r in participating]
        clusters = cosine_clusters(gram(), k)
        return [[participating[j] for j in cluster] for cluster in clusters]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(encoder_scope={self.encoder_scope!r}, decoder_scope={self.decoder_scope!r}, "
            f"weighted={self.weighted}, num_clusters={self.num_clusters}, participation={self.participation}, "
            f"head_scope={self.head_scope!r})"
        )


def kept_rows(groups: Groups, num_rows: int) -> Tensor:
    """[num_rows] bool: the rows no group with a member that trained writes (they keep what the
    client holds: ``RoundOutput.decoders_kept``)."""
    kept = torch.ones(num_rows, dtype=torch.bool)
    for sources, targets in groups.values():
        if sources and targets:
            kept[targets] = False
    return kept
