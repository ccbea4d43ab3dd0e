"""Non-finite client updates: found before aggregation, named, and kept out of the server step.

One client diverging (a learning rate far too high, a corrupt batch) must not average NaN
into every other client's model. After local training the round loop asks
:func:`nonfinite_pools` which parts of the client's state hold NaN/inf; the answer is a bit
mask, so it travels between ranks as one number per client (:func:`describe` turns it back
into words). What happens next is the run's ``nonfinite`` policy (see the engine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn


class RunStopped(ValueError):
    """A run stops on every rank at once, for the same reason (only the first rank reports it)."""


#: The parts of a client's state that are checked, one bit each.
POOLS = ("encoder", "decoders", "heads", "personal state")


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds only finite numbers. One host sync for all of
    them (per device), not one per tensor: this runs for every client every round."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point():
            flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(found).all()) for found in flags.values())


def tensors_in(tree: Any) -> Iterable[torch.Tensor]:
    """Every tensor in nested dicts / lists / tuples (a method's personal state)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from tensors_in(value)
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from tensors_in(value)


def _module_tensors(modules: Iterable[nn.Module]) -> Iterable[torch.Tensor]:
    for module in modules:
        yield from module.parameters()
        yield from module.buffers()  # BatchNorm statistics go bad with the weights


def nonfinite_pools(model: nn.Module, tasks: Sequence[str], personal: Any) -> int:
    """Bit mask (bit k: ``POOLS[k]``) of the parts of a client that hold NaN/inf: its model's
    encoder, decoders and heads (by module structure), and the method's personal state."""
    parts = (
        [model.encoder],
        [model.decoders[t] for t in tasks],
        [model.heads[t] for t in tasks],
    )
    mask = 0
    for bit, modules in enumerate(parts):
        if not all_finite(_module_tensors(modules)):
            mask |= 1 << bit
    if not all_finite(tensors_in(personal)):
        mask |= 1 << POOLS.index("personal state")
    return mask


def describe(mask: int) -> str:
    """The pools of a :func:`nonfinite_pools` mask in words, e.g. ``"encoder, heads"``."""
    return ", ".join(name for bit, name in enumerate(POOLS) if mask & (1 << bit))
