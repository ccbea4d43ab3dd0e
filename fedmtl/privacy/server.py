"""What a sum-only server step does differently under central DP or secure aggregation.

The FedAvg family's server step (FedAvg and the methods built on it: FedProx, FedPer,
FedBABU, FedSTA, Ditto's global track, FedOpt, FedDEA over these) needs nothing of a client's
update but the (weighted) sum of each group's updates. That is what makes both of these
possible (docs/privacy.md):

- central DP (DP-FedAvg, McMahan et al. 2018): each client has clipped its shared update to
  the clip norm C before sending it; the server adds Gaussian noise of standard deviation
  z·C to every group's sum, so a group's mean of m updates carries noise z·C/m;
- secure aggregation: each group's sum is computed from masked, quantised inputs
  (:mod:`fedmtl.privacy.secagg`), so the server learns the sum and nothing else.

A method's step asks this object for each group's mean (:meth:`ServerPrivacy.mean`,
:meth:`ServerPrivacy.weighted_sums`); with neither on, the method keeps its own plain sums and
this object is never built, so a run without privacy is unchanged bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedmtl.aggregation.stream import EncoderRows
from fedmtl.privacy.mechanisms import gaussian_noise
from fedmtl.seeds import derive_seed


@dataclass(frozen=True)
class ServerPrivacy:
    """Central DP and secure aggregation in round ``round`` of a run seeded ``seed``.

    ``sum_stddev`` is the standard deviation of the noise on a group's sum, z·C (times the
    method's sensitivity factor: FedDEA's 1/ρ); 0: no noise (secure aggregation alone). The
    noise of group ``key`` of ``pool`` is drawn from ``derive_seed(seed, "central-noise", round,
    pool, key)``: the same on every rank, any number of devices, and after a resume.
    """

    seed: int
    round: int
    sum_stddev: float = 0.0
    secure: bool = False

    def noise(self, pool: str, key: str, numel: int, members: int) -> Tensor | None:
        """The noise of a group's mean of ``members`` updates, float32 [numel] (std z·C/m);
        None without noise."""
        if self.sum_stddev == 0:
            return None
        seed = derive_seed(self.seed, "central-noise", self.round, pool, key)
        return gaussian_noise(numel, self.sum_stddev / members, seed)

    def add_noise(self, pool: str, key: str, mean: Tensor, members: int) -> Tensor:
        """``mean`` [D] plus its group's :meth:`noise`, in the mean's dtype and on its device
        (the noise is drawn on the CPU: the same bits wherever the mean lives)."""
        noise = self.noise(pool, key, mean.numel(), members)
        return mean if noise is None else mean + noise.to(mean.device, mean.dtype)

    def mean(self, pool: str, key: str, rows: Tensor, members: Sequence[int], weights: Tensor) -> Tensor:
        """A group's weighted mean of ``rows`` [m, D] (its members' values, ``weights`` [m]
        summing to 1), as the server learns it: through secure aggregation when it is on
        (each member scales its own row by its weight before masking it), float64 [D]; no noise
        (:meth:`noise`: the caller adds it to the update's mean, not to a start's)."""
        scaled = weights.to(torch.float64)[:, None] * rows.to(torch.float64)
        if not self.secure:
            return scaled.sum(dim=0)
        from fedmtl.privacy import secagg

        return secagg.secure_sum(scaled, list(members), self.seed, self.round, f"{pool}/{key}")

    def weighted_sums(self, rows: EncoderRows, weights: Tensor, keys: Sequence[str], pool: str) -> Tensor:
        """W X for weight rows W [G, N] (group g's normalised weights; ``keys[g]`` names it),
        as :meth:`EncoderRows.weighted_sums`, each group's sum through secure aggregation when it
        is on: read a block of columns at a time, each block masked with the columns of the
        pair masks it covers. float32 [G, P]."""
        if not self.secure:
            return rows.weighted_sums(weights)
        from fedmtl.privacy import secagg

        weights = torch.as_tensor(weights, dtype=torch.float64)
        out = torch.zeros(weights.shape[0], rows.numel, dtype=torch.float32)
        for g, key in enumerate(keys):
            members = torch.nonzero(weights[g]).flatten().tolist()
            if not members:
                continue
            w = weights[g, members][:, None]
            for columns in rows.blocks():
                block = w * rows.read(members, columns).to(torch.float64)
                total = secagg.secure_sum(
                    block, members, self.seed, self.round, f"{pool}/{key}", offset=columns.start
                )
                out[g, columns] = total.to(torch.float32)
        return out
