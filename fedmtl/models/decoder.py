"""The paper's task-specific FCN decoder and prediction head.

Decoder: each of the 4 encoder scales is projected to ``embed_dim`` channels by a linear
layer, upsampled to the stride-4 grid, concatenated, and fused by a 1x1 convolution with
BatchNorm and LeakyReLU. Its six parameterised layers (4 projections, fuse conv, BN) are
the "layers" that FedHCA² gives one hyper aggregation weight β each.

Head: two stride-2 transposed convolutions (back to full resolution, halving channels
each time) and a 1x1 convolution to the task's output channels. Heads are not
aggregated in HC-FMTL (their shapes depend on the task and dataset); FedDEA's unified-model
setting averages them among the clients of one task on one dataset.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FCNDecoder(nn.Module):
    def __init__(self, in_channels: list[int], embed_dim: int) -> None:
        super().__init__()
        if len(in_channels) != 4:
            raise ValueError(f"the FCN decoder takes 4 feature scales, got {len(in_channels)}")
        self.embed_dim = embed_dim
        self.projections = nn.ModuleList(nn.Linear(c, embed_dim) for c in in_channels)
        self.fuse = nn.Conv2d(4 * embed_dim, embed_dim, kernel_size=1)
        self.norm = nn.BatchNorm2d(embed_dim)
        self.act = nn.LeakyReLU(inplace=True)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        size = features[0].shape[-2:]
        projected = []
        for projection, feature in zip(self.projections, features, strict=True):
            # A per-pixel linear layer on channels-last, as the paper's decoder is written.
            x = projection(feature.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            if x.shape[-2:] != size:
                x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
            projected.append(x)
        return self.act(self.norm(self.fuse(torch.cat(projected, dim=1))))


class Head(nn.Module):
    def __init__(self, dim: int, out_channels: int) -> None:
        super().__init__()
        self.upsample1 = nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2)
        self.upsample2 = nn.ConvTranspose2d(dim // 2, dim // 4, kernel_size=2, stride=2)
        self.classifier = nn.Conv2d(dim // 4, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.upsample2(self.upsample1(x)))
