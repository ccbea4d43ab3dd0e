"""Small helpers on tensors and modules that the methods and the federated engine share.

Kept out of both packages so that the dependency runs one way: ``fedmtl.federated`` imports
``fedmtl.methods``, never the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """``module.load_state_dict(state)`` for a ``state`` with exactly the module's keys, in one
    batched copy: the per-module walk of ``load_state_dict`` costs more than the copy itself
    for a small model, and the engine loads several per client a round. Any other ``state``
    goes through ``load_state_dict`` (and its error)."""
    targets = module.state_dict(keep_vars=True)
    if targets.keys() != state.keys() or any(
        t.shape != s.shape for t, s in zip(targets.values(), (state[k] for k in targets), strict=True)
    ):
        module.load_state_dict(state)
        return
    with torch.no_grad():
        torch._foreach_copy_(list(targets.values()), [state[k] for k in targets])


def host_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``to_host(module.state_dict())``, without the walk over every tensor's type."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict(keep_vars=True).items()}


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
