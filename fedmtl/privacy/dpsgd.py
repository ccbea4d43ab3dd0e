"""Sample-level DP-SGD inside a client's local training (``privacy.mode: sample``), with Opacus.

Each step: a Poisson-sampled batch (every sample in with probability q = batch_size / n, so a
batch's size varies), per-sample gradients from Opacus's hooks, each clipped to L2 norm C,
summed, Gaussian noise of standard deviation z·C added, divided by the expected batch size,
then the client's AdamW step (Abadi et al. 2016; Opacus's ``DPOptimizer``). The pieces here are
pure or self-contained; :class:`fedmtl.federated.training.LocalTrainer` runs them.

Every random draw (which samples a batch holds, the noise) comes from generators seeded by
(seed, client, epoch), so a run repeats bit for bit and a resume from a checkpoint (taken
between rounds, so between epochs) draws what the uninterrupted run drew.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Dataset, default_collate

from fedmtl.seeds import derive_seed


@dataclass(frozen=True)
class SampleDP:
    """DP-SGD's settings for local training.

    Attributes:
        noise_multiplier: z >= 0, the noise's standard deviation in units of clip.
        clip: C > 0, the L2 norm each sample's gradient is clipped to (inf: no clipping, z 0).
        seed: the run's seed; every draw's generator is derived from it (:func:`generators`).
    """

    noise_multiplier: float
    clip: float
    seed: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise ValueError(
                f"DP-SGD's noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}"
            )
        if not self.clip > 0:
            raise ValueError(f"DP-SGD's clip must be > 0 (inf: no clipping), got {self.clip!r}")
        if math.isinf(self.clip) and self.noise_multiplier > 0:
            raise ValueError(
                "DP-SGD's clip is inf but the noise multiplier is not 0: the noise would be infinite"
            )


def sample_rate(num_samples: int, batch_size: int) -> float:
    """q, the probability that a step's Poisson-sampled batch holds a given sample: the
    client's batch_size over its number of training samples (at most 1)."""
    if num_samples < 1 or batch_size < 1:
        raise ValueError(
            f"DP-SGD needs at least one sample and a batch size >= 1, got {num_samples} and {batch_size}"
        )
    return min(1.0, batch_size / num_samples)


def batches_per_epoch(num_samples: int, batch_size: int) -> int:
    """Steps in one epoch of Poisson sampling: int(1 / q), as Opacus's sampler counts them."""
    return int(1 / sample_rate(num_samples, batch_size))


def steps(epochs_done: int, batches_per_epoch: int) -> int:
    """DP-SGD steps a client has taken after ``epochs_done`` full epochs: what its accountant
    composes (each step is one subsampled Gaussian mechanism at the client's sample rate)."""
    if epochs_done < 0 or batches_per_epoch < 0:
        raise ValueError(f"epochs and batches must be >= 0, got {epochs_done} and {batches_per_epoch}")
    return epochs_done * batches_per_epoch


def generators(
    seed: int, order: str, client: int, epoch: int, device: torch.device
) -> tuple[torch.Generator, torch.Generator]:
    """(sampling, noise) generators of one epoch of one client's track: the sampling one on
    the CPU (the sampler draws there), the noise one on ``device`` (where the noise is drawn).
    ``order`` as in ``LocalTrainer.train``: two tracks with the same order draw the same."""
    sampling = torch.Generator().manual_seed(derive_seed(seed, "dp-sgd", order, "sampling", client, epoch))
    noise = torch.Generator(device=device).manual_seed(
        derive_seed(seed, "dp-sgd", order, "noise", client, epoch)
    )
    return sampling, noise


def _collate_or_none(items: list[Any]) -> Any:
    # An empty Poisson batch (probability (1 − q)^n) still makes a step: noise only.
    return default_collate(items) if items else None


def poisson_loader(
    dataset: Dataset, rate: float, generator: torch.Generator, num_workers: int = 0
) -> DataLoader:
    """A loader whose batches are Poisson-sampled at ``rate`` (Opacus's
    ``UniformWithReplacementSampler``), int(1 / rate) of them; an empty batch comes as None."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    sampler = UniformWithReplacementSampler(num_samples=len(dataset), sample_rate=rate, generator=generator)  # type: ignore[arg-type]
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=_collate_or_none, num_workers=num_workers)


def private_model_problem(model: nn.Module) -> str | None:
    """Why Opacus cannot train ``model`` with per-sample gradients, in one line naming the
    module kinds and the fix; None when it can.

    BatchNorm is found by type (any ``_BatchNorm``, timm's BatchNormAct2d included, which
    Opacus's validator does not know); the rest is Opacus's ``ModuleValidator.validate``.
    A layer with trainable parameters of its own that Opacus has no per-sample rule for gets
    its per-sample gradients from functorch (Opacus's automatic fallback, used for such layers
    only: fedmtl does not force functorch on the whole model), which Opacus refuses for a layer
    holding buffers: Swin's window attention (its relative position bias table beside the
    index buffer) is such a layer, so Swin encoders cannot be trained with DP-SGD."""
    from opacus.grad_sample.grad_sample_module import GradSampleHooks
    from opacus.validators import ModuleValidator

    batch_norms = Counter(type(m).__name__ for m in model.modules() if isinstance(m, _BatchNorm))
    if batch_norms:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(batch_norms.items()))
        return (
            f"DP-SGD (privacy.mode sample) cannot train this model: it has BatchNorm layers ({kinds}), "
            "which mix the samples of a batch, so per-sample gradients do not exist: set model.norm: group"
        )
    no_rule = Counter(
        type(m).__name__
        for m in model.modules()
        if any(p.requires_grad for p in m.parameters(recurse=False))
        and type(m) not in GradSampleHooks.GRAD_SAMPLERS
        and any(True for _ in m.buffers())
    )
    if no_rule:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(no_rule.items()))
        return (
            f"DP-SGD (privacy.mode sample) cannot train this model: Opacus has no per-sample gradient rule "
            f"for its layers {kinds}, and its functorch fallback refuses layers holding buffers (Swin's "
            "relative position index): use a convolutional backbone with model.norm: group"
        )
    errors = [
        e
        for e in ModuleValidator.validate(model, strict=False)
        if "training mode" not in str(e)  # checked on a model in eval mode too: training sets it
    ]
    if errors:
        kinds = sorted({str(e).splitlines()[0].strip()[:120] for e in errors})
        return f"DP-SGD (privacy.mode sample) cannot train this model: Opacus refuses {'; '.join(kinds)}"
    return None


class PerSampleGradients:
    """Opacus's per-sample gradient hooks on ``model``'s trainable layers (those whose
    parameters require a gradient when it is made), for one ``LocalTrainer.train`` call: the
    device model is reused for other clients, so :meth:`close` removes every hook and every
    attribute Opacus put on the parameters. Losses must be means over the batch
    (``loss_reduction="mean"``): Opacus multiplies each per-sample gradient by the batch size."""

    def __init__(self, model: nn.Module) -> None:
        from opacus.grad_sample.grad_sample_module import GradSampleHooks

        problem = private_model_problem(model)
        if problem:
            raise ValueError(problem)
        # strict=False: Opacus's strict check refuses any trainable layer holding a buffer, which
        # would refuse Swin's constant index tables too; BatchNorm, whose buffers are running
        # statistics, is refused above.
        self.hooks = GradSampleHooks(model, loss_reduction="mean", strict=False)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def empty_batch(self) -> None:
        """Zero per-sample gradients for a step whose Poisson batch is empty: the step then
        adds noise alone, as the accountant assumes every step does."""
        for p in self.params:
            p.grad_sample = p.new_zeros((0, *p.shape))

    def close(self) -> None:
        self.hooks.cleanup()
        for p in self.params:  # what DPOptimizer leaves on a parameter (Opacus's cleanup does not)
            for name in ("summed_grad", "_processed"):
                if hasattr(p, name):
                    delattr(p, name)


def dp_optimizer(optimizer: torch.optim.Optimizer, dp: SampleDP, expected_batch_size: int) -> Any:
    """Opacus's ``DPOptimizer`` around ``optimizer``: per-sample clipping to ``dp.clip``, noise
    z·C on the sum, the sum divided by ``expected_batch_size`` (mean losses). Set its
    ``generator`` before each epoch."""
    from opacus.optimizers import DPOptimizer

    return DPOptimizer(
        optimizer,
        noise_multiplier=dp.noise_multiplier,
        # No clipping as the largest float: Opacus's noise std z·C would be 0·inf = NaN.
        max_grad_norm=sys.float_info.max if math.isinf(dp.clip) else dp.clip,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
    )


def add_gradients(
    params: Sequence[torch.Tensor], grads: Iterator[torch.Tensor | None] | Sequence[torch.Tensor | None]
) -> None:
    """Add ``grads`` (None: nothing) to the parameters' ``.grad``: a penalty's gradient, which
    depends on no sample, joins the privatised gradient after the noise."""
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        p.grad = g.detach().clone() if p.grad is None else p.grad + g.detach()
