"""MaT-FL (Cai et al., 2022) in HC-FMTL: encoders averaged within clusters of similar clients."""

from __future__ import annotations

from fedmtl.methods.base import register_method
from fedmtl.methods.fedavg import FedAvg


@register_method
class MaTFL(FedAvg):
    """MaT-FL as FedHCA² compares against it (suppl. C; docs/methods.md, MaTFL).

    Every round the server clusters the trained encoders by their deviations from the mean
    encoder, z_i = θ_i − mean_j θ_j (the official code's ``get_grouping_score``: deviations,
    not round deltas), with cosine distance and average linkage into ``num_clusters``
    clusters, and averages the encoders within each cluster. No cluster memory is kept.
    Decoders and heads stay local. If some z_i is zero the cosine is undefined and the round
    falls back to one cluster (FedAvg). With two clients, two clusters are two singletons:
    MaT-FL is then Local.

    Args:
        num_clusters: clusters per round (paper and official code: 2); at most the number of clients.
        weighted: weigh the averages by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round (clustered among themselves).
    """

    def __init__(self, num_clusters: int = 2, weighted: bool = False, participation: float = 1.0) -> None:
        super().__init__(
            encoder_scope="cluster",
            decoder_scope="none",
            weighted=weighted,
            num_clusters=num_clusters,
            participation=participation,
        )

    def __repr__(self) -> str:
        return f"MaTFL(num_clusters={self.num_clusters}, weighted={self.weighted}, participation={self.participation})"
