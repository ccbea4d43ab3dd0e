"""Encoders: any timm model as a 4-scale feature extractor (strides 4, 8, 16, 32).

The paper uses ImageNet-pretrained Swin-T/S/B; ``PAPER_BACKBONES`` maps its short names to
timm's. Nothing can be downloaded here, so pretrained weights come from a local file
(timm's ``pretrained_cfg_overlay=dict(file=...)``): a ``.pth``/``.bin``/``.safetensors``
state dict of the timm model.
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from torch import nn

PAPER_BACKBONES = {
    "swin_t": "swin_tiny_patch4_window7_224",
    "swin_s": "swin_small_patch4_window7_224",
    "swin_b": "swin_base_patch4_window7_224",
}
# Small enough to train a handful of clients on a laptop CPU in minutes.
DEFAULT_BACKBONE = "regnetx_002"


class Encoder(nn.Module):
    """Wraps a timm ``features_only`` model; returns NCHW features, finest first."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.channels: list[int] = list(body.feature_info.channels())
        self.reductions: list[int] = list(body.feature_info.reduction())
        # Transformers (Swin) hand out channels-last maps; the decoders take NCHW.
        self._channels_last = str(getattr(body, "output_fmt", "NCHW")).endswith("NHWC")

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = self.body(x)
        if self._channels_last:
            features = [f.permute(0, 3, 1, 2) for f in features]
        return list(features)


def create_encoder(
    name: str = DEFAULT_BACKBONE,
    pretrained_file: str | Path | None = None,
    img_size: tuple[int, int] | None = None,
    **timm_kwargs,
) -> Encoder:
    """Build the encoder of a client model.

    ``name`` is a timm model name or one of ``PAPER_BACKBONES``; ``img_size`` is passed to
    models that fix their input size at construction (Swin), e.g. (512, 512) or (448, 576).
    """
    timm_name = PAPER_BACKBONES.get(name, name)
    if not timm.is_model(timm_name):
        raise ValueError(
            f"unknown backbone {name!r}: not a timm model name nor one of {sorted(PAPER_BACKBONES)} "
            f"(list timm names with timm.list_models('pattern*'))"
        )
    kwargs = dict(timm_kwargs)
    if img_size is not None and "swin" in timm_name:
        kwargs["img_size"] = tuple(img_size)
    if pretrained_file is not None:
        path = Path(pretrained_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"pretrained weights file {str(path)!r} does not exist. Weights cannot be downloaded at "
                f"run time: save the timm state dict of {timm_name!r} to a local file and pass its path, "
                f"or set pretrained_file to null to start from random weights."
            )
        kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    body = timm.create_model(timm_name, features_only=True, out_indices=(-4, -3, -2, -1), **kwargs)
    encoder = Encoder(body)
    if encoder.reductions != [4, 8, 16, 32]:
        raise ValueError(
            f"backbone {name!r} gives features at strides {encoder.reductions}; the FCN decoders need "
            f"strides [4, 8, 16, 32] (most timm CNNs and Swin do)"
        )
    return encoder
