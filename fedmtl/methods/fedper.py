"""FedPer (Arivazhagan et al., 2019) in HC-FMTL: shared encoders, personal decoders and heads."""

from __future__ import annotations

from fedmtl.methods.base import register_method
from fedmtl.methods.fedavg import FedAvg


@register_method
class FedPer(FedAvg):
    """FedPer as FedHCA² adapts it (suppl. C; docs/methods.md, FedPer): the encoders are averaged
    over all N clients; decoders and heads are the personal layers and never leave the client
    (not PFLlib's FedPer, which personalises only the classifier). The evaluated model is the
    freshly averaged encoder with the client's own decoders and heads.

    Args:
        weighted: weigh the encoder average by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round.
    """

    def __init__(self, weighted: bool = False, participation: float = 1.0) -> None:
        super().__init__(
            encoder_scope="all", decoder_scope="none", weighted=weighted, participation=participation
        )

    def __repr__(self) -> str:
        return f"FedPer(weighted={self.weighted}, participation={self.participation})"
