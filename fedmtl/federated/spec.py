"""A client's typed description: who it is, what it learns, on which data.

Its own module, importing no Lightning, timm or metrics: the scenario and the checks that run
before anything is written (``preflight``, a finished run's reprint) need it, not a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmtl.config import OptimizerConfig


@dataclass(frozen=True)
class ClientSpec:
    """One client of a scenario: who it is, what it learns, on which data."""

    name: str
    dataset: str
    tasks: tuple[str, ...]
    local_epochs: int
    batch_size: int
    train_indices: tuple[int, ...]  # its partition of the dataset's training split
    optimizer: OptimizerConfig = OptimizerConfig()
    loss_shards: int = 1  # parts of a batch normalised on their own (ClientGroup.loss_shards)
    # A held-out client's fine-tuning epochs after the federation; None: a federated client.
    fine_tune_epochs: int | None = None
    group: int = 0  # its client group: the index of its entry in the config's ``clients`` list

    @property
    def single_task(self) -> bool:
        return len(self.tasks) == 1

    @property
    def cost(self) -> float:
        """Expected training work per round, for balancing clients across devices: images
        seen, times the share of the network those images run through (an encoder costs
        about as much as two decoders with heads)."""
        return self.local_epochs * len(self.train_indices) * (2 + len(self.tasks))
