"""FedAvg adapted to hetero-client federated multi-task learning."""

from __future__ import annotations

from torch import Tensor

from fedmtl.aggregation.base import Aggregator, RoundInput, RoundOutput, register_aggregator
from fedmtl.aggregation.functional import mean_rows


@register_aggregator
class FedAvg(Aggregator):
    """FedAvg (McMahan et al., AISTATS 2017) as FedHCA² (Lu et al., CVPR 2024, Sec. 4.1,
    Table 1) applies it to HC-FMTL.

    Every one of the N client encoders becomes the average of the N locally trained encoders
    θ_i^(r-1) + Δθ_i^(r); every one of the K decoders, whatever its task, becomes the average
    of the K locally trained decoders. Heads stay local.

    Args:
        weighted: weigh each encoder by its client's ``num_samples`` and each decoder by its
            owner's, instead of equally (the paper's comparison averages equally).
    """

    def __init__(self, weighted: bool = False) -> None:
        self.weighted = weighted

    def aggregate(self, inputs: RoundInput) -> RoundOutput:
        encoder = _average(
            inputs.encoders_prev, inputs.encoder_deltas, inputs.client_num_samples if self.weighted else None
        )
        decoder = _average(
            inputs.decoders_prev, inputs.decoder_deltas, inputs.decoder_num_samples if self.weighted else None
        )
        return RoundOutput(
            encoders=encoder.repeat(inputs.num_clients, 1),
            decoders=decoder.repeat(inputs.num_decoders, 1),
        )

    def __repr__(self) -> str:
        return f"FedAvg(weighted={self.weighted})"


def _average(prev: Tensor, deltas: Tensor, weights: list[int] | None) -> Tensor:
    # mean(prev + deltas), by linearity without materialising another [M, P] stack.
    return mean_rows(prev, weights) + mean_rows(deltas, weights)
