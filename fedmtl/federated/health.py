"""Diverged client updates: found before aggregation, named, and kept out of the server step.

One client diverging (a learning rate far too high, a corrupt batch) must not average NaN
into every other client's model. After local training the round loop asks
:func:`nonfinite_pools` which parts of the client's state hold NaN/inf; the answer is a bit
mask, so it travels between ranks as one number per client (:func:`describe` turns it back
into words). What happens next is the run's ``nonfinite`` policy (see the engine).

A finite update can be as harmful: one client at lr 1e5 passed the NaN check and, averaged
in, sent the NYUD depth RMSE to 205.9; at lr 1e30 for every group the PASCAL-Context
clients' round-1 updates were finite but 1e30 in size (the NYUD client's was NaN, and dropped),
so the round-1 checkpoint held those parameters and round 2 was NaN everywhere. So an update
is also *exploding* when :func:`growth`, the norm of the update of a part of the model
(the encoder; each task's decoder with its head) over the norm of the parameters it started
the round from, exceeds ``update_norm_limit``; the policy treats it as a NaN update (bits
:data:`EXPLODING_BIT` and up of the same mask, its growth travelling beside it).

Why the parameters it started from, not the median update of the round's clients: a median
needs three updates of a pool to mean anything, says nothing when every client explodes at
once (lr 1e30), and the clients of a healthy round differ by more than any useful multiple
whenever their learning-rate schedules differ. With the paper's recipe (warm-up over 5 local
epochs; PASCAL-Context clients train 1 a round, the NYUD client 4) the PASCAL-Context clients
are still warming up while the NYUD client trains at full lr: its encoder update was 1,360,
14,600, 59 and 12 times the round's median in rounds 1-4 (``configs/scenario1.yaml`` with the
small backbone on the benchmark's 32x32 data, measured here), the demo's 47,400 times in round
1. Against its own parameters, the largest growth in healthy runs was 1.30 and 1.32 in full
runs of the benchmark's two scenarios (FedHCA², seed 0, as ``make benchmark`` runs them: the
from-scratch decoders of round 1 at lr 1e-2), about 0.02 with the paper's recipe and 0.12 with
the demo's (their first rounds, as above): the default limit of 10 leaves a margin of 7. The
tiny test scenario's NYUD client at lr 1e3 grew 3e4 times, at lr 1e30 the others 1.5e31.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn


class RunStopped(ValueError):
    """A run stops on every rank at once, for the same reason (only the first rank reports it)."""


#: The parts of a client's state that are checked, one bit each.
POOLS = ("encoder", "decoders", "heads", "personal state")


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds only finite numbers. One host sync per device
    and dtype, not one per tensor: this runs for every client every round."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point():
            groups.setdefault((t.device, t.dtype), []).append(t.detach())
    # x * 0 is 0 for a finite x and NaN for NaN or inf, and a norm of zeros cannot overflow: a
    # batched product and norm per group instead of two operations per tensor.
    return all(
        bool(torch.stack(torch._foreach_norm(torch._foreach_mul(group, 0.0))).isfinite().all())
        for group in groups.values()
    )


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


#: Bits from here on mark exploding parts: this one the encoder, the next ones the decoder
#: (with its head) of each of the client's tasks, in the client's task order.
EXPLODING_BIT = len(POOLS)


def growth(prev: Sequence[torch.Tensor], delta: Sequence[torch.Tensor]) -> float:
    """How far a part of a model moved in a round, in units of its own size: the norm of its
    update ``delta`` over the norm of the parameters ``prev`` it started from (each a list of
    tensors taken together). A part that starts at zero has no size to compare with: 0."""
    size = math.hypot(*map(_norm, prev))
    step = math.hypot(*map(_norm, delta))
    return step / size if size > 0 else 0.0


def _norm(t: torch.Tensor) -> float:
    # In the tensor's own precision (no float64 copy of an encoder), again in float64 where
    # the squares overflow (an update of 1e30 is a number, not inf)
    norm = float(torch.linalg.vector_norm(t))
    return norm if math.isfinite(norm) else float(torch.linalg.vector_norm(t, dtype=torch.float64))


def exploding_parts(growths: Sequence[float], limit: float) -> int:
    """The mask bits (from :data:`EXPLODING_BIT`) of the parts whose growth exceeds ``limit``;
    ``growths``: the encoder's, then each task's decoder and head."""
    return sum(1 << (EXPLODING_BIT + k) for k, g in enumerate(growths) if g > limit)


def describe_update(mask: int, grown: float, tasks: Sequence[str]) -> str:
    """Why a client's update was refused, in words: ``"encoder, decoders, heads"`` (NaN/inf
    there) or ``"exploding: encoder, depth decoder+head grew 3.2e+06x"`` (the largest growth)."""
    if not exploding(mask):
        return describe(mask)
    parts = ["encoder", *(f"{t} decoder+head" for t in tasks)]
    named = [name for k, name in enumerate(parts) if mask & (1 << (EXPLODING_BIT + k))]
    return f"exploding: {', '.join(named)} grew {grown:.2g}x"


def exploding(mask: int) -> bool:
    """Whether a mask marks an exploding update (finite), not NaN/inf."""
    return not mask & ((1 << EXPLODING_BIT) - 1) and mask >= 1 << EXPLODING_BIT


def client_groups(groups: Sequence[Any]) -> list[int]:
    """The config's client group (index into ``clients``) of every client, in client order:
    a single-task group makes one client per task, a multi-task group one, times replicas;
    held-out groups are not in the federation (``fedmtl.federated.scenario.build_clients``)."""
    return [
        g
        for g, group in enumerate(groups)
        if not group.held_out
        for _ in range((len(group.tasks) if group.single_task else 1) * group.replicas)
    ]
