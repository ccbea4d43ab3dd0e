"""A run's differential privacy: what the clients clip and noise, what the server adds, what is spent.

:class:`RunPrivacy` is the engine's one object for ``privacy`` and ``secure_aggregation``
(docs/privacy.md). It is the same on every rank: its state (the adaptive clip norm, each
client's releases and DP-SGD steps) changes only from values every rank holds after a round's
settle, and its noise is drawn from seeds derived from the run's seed, so 1 and 2 devices, and
a resumed run, draw the same noise.

- client-level (``central``, ``local``): after local training a client's shared update (the
  parts the round sends up) is clipped to C and, for ``local``, noised with z·C
  (:func:`privatise`); the server adds z·C to each group's sum for ``central``
  (:class:`~fedmtl.privacy.server.ServerPrivacy`, FedAvg family only);
- sample-level (``sample``): DP-SGD inside local training (:mod:`fedmtl.privacy.dpsgd`).

The accountant (:mod:`fedmtl.privacy.accounting`, Opacus's) turns what was released into ε
for the configured δ after every round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedmtl.aggregation.base import ClientInfo
from fedmtl.config import PrivacyConfig, RunConfig
from fedmtl.methods.base import Method
from fedmtl.privacy import accounting, dpsgd
from fedmtl.privacy.mechanisms import (
    adaptive_clip_update,
    clip_factor,
    default_count_stddev,
    gaussian_noise,
    noisy_unclipped_fraction,
    update_noise_multiplier,
)
from fedmtl.privacy.server import ServerPrivacy
from fedmtl.seeds import derive_seed


def run_privacy(cfg: RunConfig, method: Method, clients: Any, rounds_planned: int | None) -> RunPrivacy:
    """The :class:`RunPrivacy` of a run whose federation is ``clients``
    (:class:`~fedmtl.federated.clients.Clients`): for DP-SGD, each client's sampling rate and
    steps per round (its local epochs of Poisson batches) come from its data and batch size."""
    rates, steps = [], []
    if cfg.privacy.mode == "sample":
        for info, spec in zip(clients.info, clients.specs, strict=True):
            rates.append(dpsgd.sample_rate(info.num_samples, spec.batch_size))
            steps.append(spec.local_epochs * dpsgd.batches_per_epoch(info.num_samples, spec.batch_size))
    return RunPrivacy(cfg, method, clients.info, rates, steps, rounds_planned)


def check_privacy(cfg: RunConfig) -> None:
    """Refuse, in one line each, a privacy setting the run's method or model cannot take.
    Called before anything is written."""
    privacy, method = cfg.privacy, cfg.algorithm
    name = type(method).__name__
    needs = method.individual_updates
    if cfg.secure_aggregation and needs is not None:
        raise ValueError(
            f"secure_aggregation: the server would see only the sums of updates, but {name} {needs}; "
            "set secure_aggregation false, or use a method of the FedAvg family (docs/privacy.md)"
        )
    if privacy.mode == "central" and needs is not None:
        raise ValueError(
            f"privacy.mode central adds noise to the server's sums of updates, but {name} {needs}; "
            "use privacy.mode local (each update noised on its client) or a method of the FedAvg family"
        )
    if privacy.mode == "central" and getattr(method, "weighted", False):
        raise ValueError(
            "privacy.mode central calibrates its noise to a sum of equally weighted updates, but "
            "algorithm.weighted is true: set algorithm.weighted false"
        )
    if privacy.mode == "sample" and None not in (privacy.target_epsilon, privacy.noise_multiplier):
        raise ValueError(
            "privacy.target_epsilon with a set privacy.noise_multiplier stops a client-level run (central, "
            "local) at its target; for mode sample set only one of them (target_epsilon alone derives z)"
        )
    if privacy.mode == "sample" and cfg.precision != "32-true":
        raise ValueError(
            f"privacy.mode sample (DP-SGD) trains in full precision, but precision is {cfg.precision}: set "
            "precision: 32-true (a mixed precision's scaled or rounded per-sample gradients would be clipped "
            "to the wrong norm)"
        )
    if privacy.adaptive_clip.enabled and privacy.mode == "local":
        raise ValueError(
            "privacy.adaptive_clip needs a trusted server to add noise to the count of unclipped updates, "
            "which mode local has not: use privacy.mode central, or set privacy.adaptive_clip.enabled false"
        )


def last_round_within_target(cfg: RunConfig, num_clients: int) -> int | None:
    """The last round whose ε stays within ``privacy.target_epsilon`` when z is set too, for
    client-level DP (every round that sends an update counted as released by every client:
    an upper bound); None: the run is not stopped at a target. Raises ValueError when even the
    first release passes it."""
    privacy, method = cfg.privacy, cfg.algorithm
    z, target = privacy.noise_multiplier, privacy.target_epsilon
    if privacy.mode not in ("central", "local") or z is None or target is None:
        return None
    rate = method.clients_per_round(num_clients) / num_clients if privacy.mode == "central" else 1.0
    steps, last = 0, 0
    for r in range(1, cfg.rounds + 1):
        steps += bool(shared_up(method, r))
        spent = accounting.epsilon(z, rate, steps, privacy.delta, privacy.accountant)
        if spent > target:
            if last == 0:
                raise ValueError(
                    f"privacy.target_epsilon {target} is spent by round 1 alone (ε = {spent:.4g} at noise_multiplier "
                    f"{z}): raise privacy.noise_multiplier or privacy.target_epsilon"
                )
            break
        last = r
    return last


def shared_up(method: Method, round_: int) -> set[str]:
    """The parts of a client's model that round ``round_`` sends to the server."""
    return {part for parts in method.exchange(round_).up.values() for part in parts}


def released_rounds(method: Method, rounds: int) -> list[int]:
    """The rounds (1-based, of ``rounds``) in which a client's update leaves it."""
    return [r for r in range(1, rounds + 1) if shared_up(method, r)]


def part_modules(model: nn.Module, parts: set[str], tasks: Sequence[str]) -> list[nn.Module]:
    """The modules of ``parts`` of a client model (encoder, its decoders, its heads)."""
    modules: list[nn.Module] = []
    if "encoder" in parts:
        modules.append(model.encoder)
    for part in ("decoders", "heads"):
        if part in parts:
            modules.extend(getattr(model, part)[task] for task in tasks)
    return modules


def privatise(
    params: Sequence[torch.Tensor], starts: Sequence[torch.Tensor], clip: float, noise_std: float, seed: int
) -> float:
    """Clip the update (params − starts, all tensors as one vector) to L2 norm ``clip`` and add
    Gaussian noise of standard deviation ``noise_std`` per entry (drawn from ``seed``), in
    place. Returns the update's norm before clipping. An update left as it is (norm within
    the clip, no noise) is not rewritten, so clip inf with no noise changes no bit."""
    deltas = [(p.detach().double() - s.double()).flatten() for p, s in zip(params, starts, strict=True)]
    norm = float(torch.linalg.vector_norm(torch.cat(deltas))) if deltas else 0.0
    factor = clip_factor(norm, clip)
    if factor == 1.0 and noise_std == 0:
        return norm
    total = sum(d.numel() for d in deltas)
    # Drawn on the CPU, then moved: the same bits whatever device the client trains on.
    noise = (
        gaussian_noise(total, noise_std, seed).to(deltas[0].device, torch.float64) if noise_std > 0 else None
    )
    offset = 0
    with torch.no_grad():
        for p, s, d in zip(params, starts, deltas, strict=True):
            update = d * factor
            if noise is not None:
                update = update + noise[offset : offset + d.numel()]
            offset += d.numel()
            p.copy_((s.double().flatten() + update).view_as(p).to(p.dtype))
    return norm


class RunPrivacy:
    """The privacy of one run: the clients' clipping and noise, the server's, the accounting.

    Args:
        cfg: the run's config (``privacy``, ``secure_aggregation``, rounds, seed).
        method: the run's method (its exchange says what leaves a client in a round).
        clients: the federation's clients.
        sample_rates: each client's DP-SGD sampling rate (mode ``sample``), in client order.
        steps_per_round: each client's DP-SGD steps in a round it trains (mode ``sample``), to
            derive z from ``target_epsilon`` before training.
        rounds_planned: the config's rounds, where the run stops earlier at its target ε
            (:func:`last_round_within_target`); None: ``cfg.rounds``.
    """

    def __init__(
        self,
        cfg: RunConfig,
        method: Method,
        clients: Sequence[ClientInfo],
        sample_rates: Sequence[float] = (),
        steps_per_round: Sequence[int] = (),
        rounds_planned: int | None = None,
    ) -> None:
        self.config: PrivacyConfig = cfg.privacy
        self.mode = cfg.privacy.mode
        self.secure = cfg.secure_aggregation
        self.seed, self.rounds, self.method = cfg.seed, cfg.rounds, method
        self.rounds_planned = cfg.rounds if rounds_planned is None else rounds_planned
        self.num_clients = len(clients)
        self.sample_rates = list(sample_rates)
        self.steps_per_round = list(steps_per_round)
        self.expected_clients = expected = method.clients_per_round(self.num_clients)
        # Client-level DP samples clients: each round's are a draw of this share of them.
        self.client_rate = expected / self.num_clients
        adaptive = self.config.adaptive_clip
        self.count_stddev = (
            (adaptive.count_stddev or default_count_stddev(expected)) if adaptive.enabled else None
        )
        self.derived = self.config.noise_multiplier is None and self.mode is not None
        self.noise_multiplier = self._noise_multiplier() if self.mode is not None else 0.0
        # Andrew et al.: the update's noise leaves room for the count's, the pair costing z.
        self.update_noise = (
            update_noise_multiplier(self.noise_multiplier, self.count_stddev)
            if self.count_stddev is not None
            else self.noise_multiplier
        )
        self.clip = self.config.clip
        self.releases = [0] * self.num_clients  # rounds each client's update left it (local)
        self.rounds_released = 0  # rounds with a server step on released updates (central)
        self.dp_steps = [0] * self.num_clients  # DP-SGD steps each client took (sample)
        self.unclipped_fraction: float | None = None

    # ------------------------------------------------------------------ set-up

    def _noise_multiplier(self) -> float:
        """z as configured, or the smallest that keeps the whole run within target_epsilon."""
        cfg = self.config
        if cfg.noise_multiplier is not None:
            return float(cfg.noise_multiplier)
        assert cfg.target_epsilon is not None
        if self.mode == "sample":
            return max(
                accounting.noise_multiplier_for(
                    cfg.target_epsilon, cfg.delta, q, s * self.rounds, cfg.accountant
                )
                for q, s in zip(self.sample_rates, self.steps_per_round, strict=True)
            )
        rate = self.client_rate if self.mode == "central" else 1.0
        steps = len(released_rounds(self.method, self.rounds))
        return accounting.noise_multiplier_for(cfg.target_epsilon, cfg.delta, rate, steps, cfg.accountant)

    @property
    def client_level(self) -> bool:
        return self.mode in ("central", "local")

    # ------------------------------------------------------------------ a round

    def privatise_client(
        self, model: nn.Module, starts: list[torch.Tensor], parts: set[str], tasks, round_: int, client: int
    ) -> float:
        """Clip (and for ``local``, noise) client ``client``'s update of ``parts`` in place;
        returns its norm before clipping."""
        modules = part_modules(model, parts, tasks)
        params = [p for m in modules for p in m.parameters()]
        std = self.noise_stddev if self.mode == "local" else 0.0
        seed = derive_seed(self.seed, "local-noise", round_, client)
        return privatise(params, starts, self.clip, std, seed)

    @staticmethod
    def starts(model: nn.Module, parts: set[str], tasks: Sequence[str]) -> list[torch.Tensor]:
        """Copies of the parameters of ``parts`` before training (what the update is against)."""
        return [p.detach().clone() for m in part_modules(model, parts, tasks) for p in m.parameters()]

    @property
    def noise_stddev(self) -> float:
        """z·C of an update this round (0 without noise: z = 0 with no clip is no noise, not NaN)."""
        return self.update_noise * self.clip if self.update_noise > 0 else 0.0

    def server_privacy(self, round_: int) -> ServerPrivacy | None:
        """What the server step of round ``round_`` does differently; None: nothing."""
        central = self.mode == "central"
        if not (central or self.secure):
            return None
        stddev = self.noise_stddev if central else 0.0
        return ServerPrivacy(self.seed, round_, stddev, self.secure)

    def after_round(
        self, round_: int, norms: torch.Tensor, steps: torch.Tensor, senders: Sequence[int]
    ) -> None:
        """Count what round ``round_`` released (``senders``: the clients whose update reached
        the server step; ``norms``, ``steps``: every client's update norm before clipping and
        DP-SGD steps, the same on every rank) and adapt the clip norm."""
        for i in range(self.num_clients):
            self.dp_steps[i] += int(steps[i])
        if not (self.client_level and senders and shared_up(self.method, round_)):
            return
        self.rounds_released += 1
        for i in senders:
            self.releases[i] += 1
        if self.count_stddev is not None:
            unclipped = sum(1 for i in senders if float(norms[i]) <= self.clip)
            seed = derive_seed(self.seed, "clip-count", round_)
            self.unclipped_fraction = noisy_unclipped_fraction(
                unclipped, self.expected_clients, self.count_stddev, seed
            )
            adaptive = self.config.adaptive_clip
            self.clip = adaptive_clip_update(
                self.clip, self.unclipped_fraction, adaptive.target_quantile, adaptive.clip_lr
            )

    # ------------------------------------------------------------------ accounting

    def epsilon(self) -> float:
        """ε spent so far for the configured δ (0 before anything is released)."""
        cfg = self.config
        if self.mode == "central":
            return accounting.epsilon(
                self.noise_multiplier, self.client_rate, self.rounds_released, cfg.delta, cfg.accountant
            )
        if self.mode is None:
            return 0.0
        if self.mode == "local":
            return accounting.epsilon(
                self.noise_multiplier, 1.0, max(self.releases), cfg.delta, cfg.accountant
            )
        return max(
            (
                accounting.epsilon(self.noise_multiplier, q, s, cfg.delta, cfg.accountant)
                for q, s in zip(self.sample_rates, self.dp_steps, strict=True)
            ),
            default=0.0,
        )

    def values(self) -> dict[str, float]:
        """The round's logged scalars: ``privacy/epsilon``, the clip norm, the noisy unclipped
        fraction (adaptive clipping)."""
        if self.mode is None:  # secure aggregation alone: nothing is spent
            return {}
        values = {"privacy/epsilon": self.epsilon(), "privacy/clip": float(self.clip)}
        if self.unclipped_fraction is not None:
            values["privacy/unclipped_fraction"] = self.unclipped_fraction
        return values

    def summary(self) -> dict[str, Any]:
        """results.json's ``privacy`` block."""
        epsilon = self.epsilon()
        cfg = self.config
        return {
            "mode": self.mode,
            "epsilon": epsilon if math.isfinite(epsilon) else None,
            "delta": cfg.delta,
            "noise_multiplier": self.noise_multiplier,
            "noise_multiplier_derived": self.derived,
            "clip": self.config.clip if math.isfinite(self.config.clip) else None,
            "final_clip": self.clip if math.isfinite(self.clip) else None,
            "adaptive_clip": cfg.adaptive_clip.enabled,
            "accountant": cfg.accountant,
            "sample_rate": self.client_rate if self.client_level else max(self.sample_rates, default=0.0),
            "rounds_accounted": self.rounds_released if self.mode == "central" else max(self.releases),
            "secure_aggregation": self.secure,
            "target_epsilon": cfg.target_epsilon,
            "rounds_planned": self.rounds_planned,
            "stopped_at_target": self.rounds_planned > self.rounds,
        }

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {
            "clip": float(self.clip),
            "releases": list(self.releases),
            "rounds_released": self.rounds_released,
            "dp_steps": list(self.dp_steps),
            "unclipped_fraction": self.unclipped_fraction,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip = float(state["clip"])
        self.releases = [int(r) for r in state["releases"]]
        self.rounds_released = int(state["rounds_released"])
        self.dp_steps = [int(s) for s in state["dp_steps"]]
        self.unclipped_fraction = state["unclipped_fraction"]
