"""Small helpers on tensors and modules that the methods and the federated engine share.

Kept out of both packages so that the dependency runs one way: ``fedmtl.federated`` imports
``fedmtl.methods``, never the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


def to_host(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are detached CPU copies (never views of live tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_host(v) for v in obj)
    return obj


def parameters_of(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The parameters of ``modules``, each once, in order."""
    seen: set[int] = set()
    out = []
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out
