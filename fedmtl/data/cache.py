"""Decoded samples kept in memory, up to a byte budget (config ``data.cache_mib``).

Decoding a batch's files (PNG, ``.npy``, ``.mat``) is a sizeable part of a training step on
the benchmark's 32x32 images (docs/performance.md, "Speed options"), and a client reads the same few images
every epoch. The cache holds what a dataset's ``_load`` returns, before the (random)
transforms, so a cached sample is augmented afresh every epoch exactly as one read from disk:
results do not change.

One cache serves every dataset of a process (the engine makes one per rank). It fills first
come, first served and never evicts: once the budget is spent, further samples are read from
disk every time, so a budget smaller than the data still saves its share and never grows
memory past the budget. Written by hand rather than with ``functools.lru_cache``: that bounds
entries, not bytes, and evicting would only trade one disk read for another.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from fedmtl.data.transforms import Sample

MIB = 2**20


class SampleCache:
    """Decoded samples by key, at most ``limit_bytes`` of array data in all."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"a sample cache needs a budget of at least 0 bytes, got {limit_bytes}")
        self.limit_bytes = int(limit_bytes)
        self.used_bytes = 0
        self._samples: dict[Hashable, Sample] = {}

    def __len__(self) -> int:
        return len(self._samples)

    def get(self, key: Hashable) -> Sample | None:
        """A copy of the cached sample (the transforms may write into their input), or None."""
        sample = self._samples.get(key)
        if sample is None:
            return None
        return _copy(sample)

    def put(self, key: Hashable, sample: Sample) -> bool:
        """Keep a copy of ``sample`` if it fits in what is left of the budget; whether it was kept."""
        if key in self._samples:
            return True
        size = sum(value.nbytes for value in sample.values() if isinstance(value, np.ndarray))
        if self.used_bytes + size > self.limit_bytes:
            return False
        self._samples[key] = _copy(sample)
        self.used_bytes += size
        return True


def _copy(sample: Sample) -> Sample:
    return {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in sample.items()}
