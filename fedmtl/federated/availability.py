"""Client availability (``RunConfig.availability``): who misses a round, who straggles.

Both are drawn for every client of the run from the seed and the round alone, one uniform
number per client and stream, so a client's fate depends on nothing but (seed, round, client
index): the same on any number of devices (each rank draws for all clients) and on resume. A
client is unavailable only if it would have trained this round; it straggles only if it is
available and trains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedmtl.config import AvailabilityConfig
from fedmtl.seeds import derive_seed


@dataclass(frozen=True)
class RoundAvailability:
    """One round's draw: the clients that miss it and the clients that train only part of it
    (sorted indices), and the clients that train at all (None: every client, no one missing)."""

    unavailable: tuple[int, ...]
    stragglers: tuple[int, ...]
    training: list[int] | None


def _uniforms(seed: int, stream: str, round_: int, num_clients: int) -> list[float]:
    """One number in [0, 1) per client of the run, for ``stream`` in ``round_``."""
    rng = random.Random(derive_seed(seed, "availability", stream, round_))
    return [rng.random() for _ in range(num_clients)]


def draw(
    config: AvailabilityConfig, seed: int, round_: int, num_clients: int, participants: Sequence[int] | None
) -> RoundAvailability:
    """Round ``round_``'s availability among ``participants`` (the clients the method picked to
    train; None: all). With both probabilities 0 nothing is drawn and nothing changes."""
    would_train = list(range(num_clients)) if participants is None else list(participants)
    if not config.enabled:
        return RoundAvailability((), (), None if participants is None else would_train)
    away = _uniforms(seed, "dropout", round_, num_clients)
    slow = _uniforms(seed, "stragglers", round_, num_clients)
    unavailable = tuple(i for i in would_train if away[i] < config.dropout)
    training = [i for i in would_train if i not in unavailable]
    stragglers = tuple(i for i in training if slow[i] < config.stragglers)
    if participants is None and not unavailable:
        return RoundAvailability((), stragglers, None)
    return RoundAvailability(unavailable, stragglers, training)


def batches_done(batches: int, work: float) -> int:
    """The batches of an epoch of ``batches`` a client doing ``work`` (0, 1] of it trains:
    ceil(work x batches), at least one. Rounded to 9 decimals first, so 0.7 x 10 is 7, not the
    8 that float rounding (7.000000000000001) would give."""
    return min(batches, max(1, math.ceil(round(work * batches, 9))))


def totals(
    config: AvailabilityConfig,
    seed: int,
    rounds: int,
    num_clients: int,
    participants: Callable[[int], Sequence[int] | None],
) -> dict[str, int]:
    """Unavailable and straggling client-rounds over rounds 1..``rounds``, drawn again from
    the seed (so a resumed run counts the rounds before its checkpoint too)."""
    unavailable = stragglers = 0
    for round_ in range(1, rounds + 1):
        drawn = draw(config, seed, round_, num_clients, participants(round_))
        unavailable += len(drawn.unavailable)
        stragglers += len(drawn.stragglers)
    return {"unavailable_client_rounds": unavailable, "straggling_client_rounds": stragglers}
