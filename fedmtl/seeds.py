"""Seeds derived from the run's seed, shared by the methods and the federated engine."""

from __future__ import annotations

import zlib


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed from named parts, the same in every process and on every run."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF
