"""Held-out clients: new clients served by the finished federation (``clients[].held_out``).

A held-out client never trains in the federation, and nothing of it is stored before the
end. After the last round it starts from the *federated model*: for every part the method
shares (the encoder, a task's decoder, a task's head on a dataset), the mean of that part in
the federated clients' evaluated models (the model each method reports; for FedAvg every
client holds the same one, so the mean is it); a part the method keeps personal (FedPer's
decoders and heads, every part of Local) is the client's own first draw, as a new client of
that method would start it. It then fine-tunes for ``fine_tune_epochs`` on its own training
images with a fresh AdamW at its group's learning rate, constant, and is evaluated on its
dataset's validation split. Its metrics are reported apart from the federation's.

The mean is over a part's whole state (parameters and BatchNorm statistics) and over every
federated client that holds the part, in float64, summed across ranks; the parts come from the
model's structure (``model.encoder``, ``model.decoders[task]``, ``model.heads[task]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedmtl.aggregation.communication import PARTS

#: The held-out clients' metrics in an evaluation's results (beside the methods' model labels).
LABEL = "held_out"

#: The parts of a client model a method may share, by module: ``model.encoder``,
#: ``model.decoders[task]`` (one per task), ``model.heads[task]`` (one per dataset and task).
ENCODER, DECODERS, HEADS = PARTS


@dataclass(frozen=True)
class Part:
    """One part of the federated model a held-out client can take: which module, and the
    clients' key (a task for decoders; dataset and task for heads)."""

    pool: str
    key: tuple[str, ...] = ()

    def module(self, model: nn.Module) -> nn.Module:
        if self.pool == ENCODER:
            return model.encoder
        task = self.key[-1]
        return model.decoders[task] if self.pool == DECODERS else model.heads[task]


def parts_of(dataset: str, tasks: Iterable[str], shared: frozenset[str]) -> list[Part]:
    """The shared parts a client on ``dataset`` with ``tasks`` holds, in a fixed order."""
    parts = [Part(ENCODER)] if ENCODER in shared else []
    for task in tasks:
        if DECODERS in shared:
            parts.append(Part(DECODERS, (task,)))
        if HEADS in shared:
            parts.append(Part(HEADS, (dataset, task)))
    return parts


def flat_state(module: nn.Module) -> torch.Tensor:
    """A module's floating-point state (parameters and statistics) as one float64 vector."""
    return torch.cat(
        [t.detach().flatten().double().cpu() for t in module.state_dict().values() if t.is_floating_point()]
    )


def load_flat_state(module: nn.Module, vector: torch.Tensor) -> None:
    """Write :func:`flat_state`'s vector back into ``module`` (other entries are left as they are)."""
    state = module.state_dict()
    offset = 0
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            continue
        n = tensor.numel()
        state[name] = vector[offset : offset + n].view_as(tensor).to(tensor.dtype)
        offset += n
    if offset != vector.numel():
        raise ValueError(f"a state of {vector.numel()} values for a module of {offset}")
    module.load_state_dict(state)


class PartSums:
    """Sums and counts of the parts the held-out clients need, over the federated clients
    of one rank; :meth:`means` once :attr:`sums` and :attr:`counts` are summed across ranks."""

    def __init__(self, wanted: Sequence[Part], size: Mapping[Part, int]) -> None:
        self.spans: dict[Part, tuple[int, int]] = {}
        end = 0
        for part in wanted:
            self.spans[part] = (end, end + size[part])
            end += size[part]
        self.sums = torch.zeros(end, dtype=torch.float64)
        self.counts = torch.zeros(len(self.spans), dtype=torch.float64)

    def add(self, model: nn.Module, held: Iterable[Part]) -> None:
        """Add a federated client's model (loaded into ``model``) to the ``held`` parts."""
        held = set(held)
        for k, (part, (start, end)) in enumerate(self.spans.items()):
            if part in held:
                self.sums[start:end] += flat_state(part.module(model))
                self.counts[k] += 1

    def means(self) -> dict[Part, torch.Tensor]:
        """Each part's mean over the clients that hold it (a part nobody holds is left out)."""
        return {
            part: self.sums[start:end] / self.counts[k]
            for k, (part, (start, end)) in enumerate(self.spans.items())
            if self.counts[k] > 0
        }
