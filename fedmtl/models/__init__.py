"""Client models: timm encoders, FCN decoders and heads, the multi-task model."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedmtl.models.backbone import DEFAULT_BACKBONE, PAPER_BACKBONES, Encoder, create_encoder
    from fedmtl.models.decoder import FCNDecoder, Head
    from fedmtl.models.multitask import MultiTaskModel, reinitialise

# Imported on first use, not here: `fedmtl.config` reads `fedmtl.models.backbone`, and importing
# the multi-task model here (tasks -> torchmetrics, scipy) would slow `fedmtl fit --help`.
_MODULE_OF = {
    "DEFAULT_BACKBONE": "backbone",
    "PAPER_BACKBONES": "backbone",
    "Encoder": "backbone",
    "create_encoder": "backbone",
    "FCNDecoder": "decoder",
    "Head": "decoder",
    "MultiTaskModel": "multitask",
    "reinitialise": "multitask",
}


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
