"""A client's multi-task model: one shared encoder, one decoder and one head per task.

Parameter groups are module attributes, never key patterns: ``model.encoder``,
``model.decoders[task]``, ``model.heads[task]``. The server aggregates encoders with each
other, decoders with each other, and leaves heads local.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedmtl.models.backbone import DEFAULT_BACKBONE, SwinWindows, create_encoder
from fedmtl.models.decoder import FCNDecoder, Head
from fedmtl.models.norms import Norm, out_of_place, replace_batch_norm
from fedmtl.tasks import check_tasks, get_task


class MultiTaskModel(nn.Module):
    """Encoder + per-task FCN decoders and heads (docs/scenarios.md, "Models").

    Args:
        dataset: the client's dataset name; fixes each head's output channels.
        tasks: the client's tasks, in order.
        backbone: a timm model name or a paper name (``swin_t``, ``swin_s``, ``swin_b``).
        pretrained_file: local file with the backbone's pretrained weights, or None.
        img_size: input size for backbones that need it at construction (Swin).
        embed_dim: decoder width; default the encoder's first-scale channels (96 for Swin-T),
            as the paper sets it.
        pretrained_strict: every encoder tensor must be in ``pretrained_file`` (else an error);
            False loads the tensors that match and reports how many.
        channels_last: keep the convolution weights, and convert the input, to the channels-last
            memory layout: the same function, computed by kernels that were faster for the small
            default encoder on one CPU thread (docs/performance.md, "Speed options"; PyTorch advises it for
            convolutional networks under mixed precision on CUDA, not measured here); the float
            rounding differs.
        swin_windows: a Swin encoder's shifted-window order, ``"mmseg"`` (default) or ``"timm"``
            (see :func:`fedmtl.models.backbone.create_encoder`); other backbones ignore it.
        norm: ``"batch"`` (default): the layers as built; ``"group"``: every BatchNorm (encoder,
            decoders) replaced by GroupNorm and activations run out of place
            (:mod:`fedmtl.models.norms`), as DP-SGD needs.
    """

    def __init__(
        self,
        dataset: str,
        tasks: Sequence[str],
        backbone: str = DEFAULT_BACKBONE,
        pretrained_file: str | Path | None = None,
        img_size: tuple[int, int] | None = None,
        embed_dim: int | None = None,
        pretrained_strict: bool = True,
        channels_last: bool = False,
        swin_windows: SwinWindows = "mmseg",
        norm: Norm = "batch",
    ) -> None:
        super().__init__()
        self.dataset = dataset
        self.tasks = check_tasks(dataset, list(tasks))
        self.encoder = create_encoder(
            backbone,
            pretrained_file=pretrained_file,
            img_size=img_size,
            pretrained_strict=pretrained_strict,
            swin_windows=swin_windows,
        )
        embed_dim = embed_dim or self.encoder.channels[0]
        self.decoders = nn.ModuleDict({t: FCNDecoder(self.encoder.channels, embed_dim) for t in self.tasks})
        self.heads = nn.ModuleDict({t: Head(embed_dim, get_task(t).channels(dataset)) for t in self.tasks})
        if norm == "group":
            replace_batch_norm(self)
            out_of_place(self)
        elif norm != "batch":
            raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")
        self.channels_last = channels_last
        if channels_last:
            # Moving the module later (.to(device)) keeps the layout; loading a state dict copies
            # values into these tensors, so it keeps it too.
            self.to(memory_format=torch.channels_last)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        features = self.encoder(images)
        size = images.shape[-2:]
        out = {}
        for task in self.tasks:
            pred = self.heads[task](self.decoders[task](features))
            # Heads return stride 1 for inputs divisible by 32; resizing covers the rest.
            if pred.shape[-2:] != size:
                pred = F.interpolate(pred, size=size, mode="bilinear", align_corners=False)
            out[task] = pred
        return out


def reinitialise(module: nn.Module, seed: int) -> None:
    """Draw ``module``'s parameters afresh, with PyTorch's default initialisation of each
    layer, from ``seed``; the global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in module.modules():
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
