"""Client models: timm encoders, FCN decoders and heads, the multi-task model."""

from fedmtl.models.backbone import DEFAULT_BACKBONE, PAPER_BACKBONES, Encoder, create_encoder
from fedmtl.models.decoder import FCNDecoder, Head
from fedmtl.models.multitask import MultiTaskModel, reinitialise

__all__ = [
    "DEFAULT_BACKBONE",
    "PAPER_BACKBONES",
    "Encoder",
    "FCNDecoder",
    "Head",
    "MultiTaskModel",
    "create_encoder",
    "reinitialise",
]
