"""Local training of one client: a *track* (model, optimiser, schedule) for some epochs.

A track is a dict ``{"model": state dict, "optimizer": ..., "scheduler": ..., "epochs_done": n}``;
a client's stored state is its federated track plus the method's personal state, and Ditto
keeps a second track in there. :meth:`LocalTrainer.train` loads a track into the client's
device model, trains it, and writes it back. With the client's ``optimizer.keep_state`` false a
track keeps no optimiser or schedule (both None): every call starts a fresh AdamW, its schedule
positioned at the track's ``epochs_done``, so the rates are those a kept schedule gives.

Freezing is ``requires_grad=False`` *and* leaving the parameters out of the optimiser, so
AdamW's weight decay and moments cannot move them (zeroed gradients would not stop either).
The optimiser's state is therefore stored by parameter name, not by position: a phase that
freezes the encoder keeps the encoder's AdamW moments untouched for later.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from fedmtl.config import OptimizerConfig
from fedmtl.data.datasets import DenseDataset
from fedmtl.federated import stopping
from fedmtl.federated.availability import batches_done
from fedmtl.federated.client import ClientModule, end_epoch, make_optimizer
from fedmtl.methods.base import Penalty, Track
from fedmtl.privacy.dpsgd import (
    PerSampleGradients,
    SampleDP,
    add_gradients,
    dp_optimizer,
    generators,
    poisson_loader,
    sample_rate,
)
from fedmtl.seeds import derive_seed
from fedmtl.tasks import TASKS
from fedmtl.tensors import host_state, load_into, parameters_of

TASK_SLOTS = {name: i for i, name in enumerate(TASKS)}  # fixed columns for exchanging per-task scalars
PENALTY_SLOT, TOTAL_SLOT, LR_SLOT = len(TASK_SLOTS), len(TASK_SLOTS) + 1, len(TASK_SLOTS) + 2
LOSS_COLUMNS = len(TASK_SLOTS) + 3  # per task, the penalty, the total objective, the learning rate


def epoch_rates(cfg: OptimizerConfig, total_epochs: int) -> list[float]:
    """The learning rate each of a track's ``total_epochs`` epochs trains at, under the warm-up
    cosine schedule of ``cfg``: computed by the very calls training makes (:func:`make_optimizer`,
    :func:`end_epoch`) on a one-number parameter, so it cannot drift from what a run does."""
    optimizer, scheduler = make_optimizer([nn.Parameter(torch.zeros(1))], cfg, total_epochs)
    rates = []
    for epoch in range(total_epochs):
        rates.append(float(optimizer.param_groups[0]["lr"]))
        if scheduler is not None:
            end_epoch(scheduler, epoch)
    return rates


def warmup_start_epochs(cfg: OptimizerConfig, total_epochs: int) -> int:
    """How many of a track's ``total_epochs`` epochs train at or below the warm-up's start
    (``cfg.warmup_lr``): the first two always do when there is a warm-up (epoch e trains at the
    schedule's value for e - 1, :func:`end_epoch`); a cosine whose floor lies below it adds more."""
    return sum(rate <= cfg.warmup_lr for rate in epoch_rates(cfg, total_epochs))


def optimizer_state_by_name(
    optimizer: torch.optim.Optimizer, names: Sequence[str], previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The optimiser's state keyed by parameter name; names it does not hold (frozen this
    time) keep their ``previous`` state."""
    state = optimizer.state_dict()
    (group,) = state["param_groups"]
    by_name = dict(previous["state"]) if previous else {}
    by_name.update({names[i]: s for i, s in state["state"].items()})
    return {"state": by_name, "group": {k: v for k, v in group.items() if k != "params"}}


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, names: Sequence[str], saved: Mapping[str, Any] | None
) -> None:
    """Load a state from :func:`optimizer_state_by_name` into an optimiser over ``names``."""
    if not saved:
        return
    if "group" not in saved:
        raise ValueError(
            "the checkpoint's optimiser state is stored by position (written before fedmtl stored it by "
            "parameter name), so this run cannot be resumed: start a new run (`fedmtl validate` still "
            "evaluates the checkpoint)"
        )
    optimizer.load_state_dict(
        {
            "state": {i: saved["state"][n] for i, n in enumerate(names) if n in saved["state"]},
            "param_groups": [{**saved["group"], "params": list(range(len(names)))}],
        }
    )


class LocalTrainer:
    """Trains tracks of a client on its device model; one per simulation rank."""

    def __init__(
        self,
        fabric: L.Fabric,
        seed: int,
        rounds: int,
        loader: Callable[[DenseDataset, int, int | None], DataLoader],
        dp: SampleDP | None = None,
    ) -> None:
        """``dp``: train with sample-level DP-SGD (:mod:`fedmtl.privacy.dpsgd`); None: plainly."""
        self.fabric = fabric
        self.seed = seed
        self.rounds = rounds
        self.loader = loader
        self.dp = dp
        self.dp_steps = 0  # DP-SGD steps this rank's clients took so far (privacy.mode sample)

    def batches(self, loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
        for batch in loader:
            if batch is None:  # an empty Poisson batch (DP-SGD)
                yield batch
                continue
            batch.pop("meta", None)
            yield self.fabric.to_device(batch)

    def train(
        self,
        module: ClientModule,
        client: int,
        dataset: DenseDataset,
        track: Track,
        *,
        frozen: Sequence[nn.Module] = (),
        penalty: Callable[[nn.Module], Penalty | None] | None = None,
        epochs: int | None = None,
        order: str = "order",
        fine_tune: OptimizerConfig | None = None,
        work: float = 1.0,
    ) -> torch.Tensor:
        """Load ``track`` into ``module``, train it, write it back; return the means over the
        steps [LOSS_COLUMNS] of the losses (per task, the penalty, the total) and of the
        learning rate (``LR_SLOT``).

        Args:
            frozen: modules that do not train (out of the optimiser, ``requires_grad=False``).
            penalty: called once the track is loaded; its term is added to every step's loss.
            epochs: local epochs (default: the client's).
            order: names the data-order stream: two tracks with the same ``order`` see the
                same batches (Ditto's two tracks, so each matches FedAvg / Local).
            fine_tune: a fresh AdamW at this config's lr and weight decay with a constant
                rate, whose state is not kept (FedBABU's fine-tuning); default: the track's
                own optimiser and schedule, continued, or with the client's
                ``optimizer.keep_state`` false, a fresh AdamW whose schedule starts at the
                track's ``epochs_done`` (the same rates) and is not kept either.
            work: the part of each epoch trained, (0, 1]: a straggler's epoch stops after
                ceil(work x its batches) batches (``availability.straggler_work``) and still
                counts as an epoch (``epochs_done``, the schedule). 1: every batch.

        With the trainer's ``dp`` set, each epoch's batches are Poisson-sampled, and each step
        clips every sample's gradient and adds noise (Opacus's hooks on ``module.model`` for
        this call only); the penalty's gradient, which reads no sample, is added after the noise.
        The returned loss means are over the steps whose batch was not empty.
        """
        spec = module.spec
        epochs = spec.local_epochs if epochs is None else epochs
        model = module.model
        load_into(model, track["model"])
        frozen_ids = {id(p) for p in parameters_of(frozen)}
        named = [(n, p) for n, p in model.named_parameters() if id(p) not in frozen_ids]
        names = [n for n, _ in named]
        total_epochs = None if fine_tune else self.rounds * epochs
        optimizer, scheduler = make_optimizer(
            [p for _, p in named], fine_tune or spec.optimizer, total_epochs
        )
        keep = not fine_tune and spec.optimizer.keep_state
        if keep:
            load_optimizer_state(optimizer, names, track["optimizer"])
        if keep and track["scheduler"] is not None:
            scheduler.load_state_dict(track["scheduler"])
        elif not fine_tune and track["epochs_done"] > 0:
            # A fresh schedule (keep_state false, or nothing stored yet) taken to where the
            # client's epochs have brought it: the rate end_epoch set after its last epoch.
            end_epoch(scheduler, track["epochs_done"] - 1)
        sums = torch.zeros(LOSS_COLUMNS, dtype=torch.float64, device=self.fabric.device)
        slots = [TASK_SLOTS[task] for task in spec.tasks]
        steps, rate_sum = 0, 0.0
        dp = self.dp
        private, dp_steps = None, None
        if dp is None:
            fabric_optimizer = self.fabric.setup_optimizers(optimizer)
        else:  # Opacus's optimiser steps the AdamW itself; full precision, one device: nothing to wrap
            dp_steps = dp_optimizer(optimizer, dp, expected_batch_size=spec.batch_size)
        try:
            for p in parameters_of(frozen):
                p.requires_grad_(False)
            if dp is not None:  # after freezing: only the layers that train get hooks
                private = PerSampleGradients(model)
            term = penalty(model) if penalty is not None else None  # sees what is frozen
            module.train()
            for _ in range(epochs):
                epoch = track["epochs_done"]
                dataset.set_epoch(epoch)
                torch.manual_seed(derive_seed(self.seed, "train", client, epoch))
                loader = self.loader(dataset, spec.batch_size, derive_seed(self.seed, order, client, epoch))
                if dp is not None:
                    sampling, dp_steps.generator = generators(
                        dp.seed, order, client, epoch, self.fabric.device
                    )
                    plain = getattr(loader, "batches", loader)  # inside stopping's check, if any
                    rate = sample_rate(len(dataset), spec.batch_size)
                    poisson = poisson_loader(dataset, rate, sampling, getattr(plain, "num_workers", 0))
                    loader = stopping.checked(poisson) if plain is not loader else poisson
                # islice stops before fetching a batch past the straggler's share (None: all).
                limit = batches_done(len(loader), work) if work < 1 else None
                for batch in itertools.islice(self.batches(loader), limit):
                    if dp_steps is not None:
                        self.dp_steps += (
                            1  # every step adds noise, an empty batch's too: the accountant's step
                        )
                        steps += self._private_step(module, batch, term, private, dp_steps, sums, slots)
                        rate_sum += optimizer.param_groups[0]["lr"]
                        continue
                    with self.fabric.autocast():
                        losses = module.training_step(batch)
                    total = losses["total"]
                    if term is not None:
                        # In the loss, outside autocast (parameters and anchors are fp32).
                        value = term()
                        total = total + value
                        sums[PENALTY_SLOT] += value.detach()
                    self.fabric.backward(total)
                    fabric_optimizer.step()
                    fabric_optimizer.zero_grad(set_to_none=True)
                    # Summed on the device: reading a loss with .item() every step would stall a GPU.
                    sums[TOTAL_SLOT] += losses["total"].detach()
                    sums[slots] += torch.stack([losses[t].detach() for t in spec.tasks]).to(sums.dtype)
                    rate_sum += optimizer.param_groups[0]["lr"]  # a Python float: no device sync
                    steps += 1
                track["epochs_done"] = epoch + 1
                if scheduler is not None:
                    end_epoch(scheduler, epoch)
        finally:
            if private is not None:
                private.close()
            for p in parameters_of(frozen):
                p.requires_grad_(True)
        # Copies: the device model is reused for the client's next track and for other clients.
        track["model"] = host_state(model)
        if keep:
            track["optimizer"] = optimizer_state_by_name(optimizer, names, track["optimizer"])
            track["scheduler"] = scheduler.state_dict()
        elif not fine_tune:  # keep_state false: the next round starts a fresh AdamW and schedule
            track["optimizer"] = track["scheduler"] = None
        sums[LR_SLOT] = rate_sum
        return (sums / max(steps, 1)).cpu()

    def _private_step(
        self,
        module: ClientModule,
        batch: dict[str, torch.Tensor] | None,
        term: Penalty | None,
        private: PerSampleGradients,
        optimizer: Any,
        sums: torch.Tensor,
        slots: list[int],
    ) -> int:
        """One DP-SGD step; returns 1 when its batch held samples (its losses are summed), 0
        for an empty batch, whose step still adds the noise (and the penalty's gradient)."""
        if batch is None:
            private.empty_batch()
        else:
            losses = module.training_step(batch)
            with warnings.catch_warnings():  # the first layer's input needs no gradient: true, harmless
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                self.fabric.backward(losses["total"])  # the hooks store each sample's gradient
            sums[TOTAL_SLOT] += losses["total"].detach()
            sums[slots] += torch.stack([losses[t].detach() for t in module.spec.tasks]).to(sums.dtype)
        penalty_grads = None
        if term is not None:
            value = term()
            if batch is not None:
                sums[PENALTY_SLOT] += value.detach()
            if value.requires_grad:
                penalty_grads = torch.autograd.grad(value, optimizer.params, allow_unused=True)
        if optimizer.pre_step():  # clip each sample's gradient, sum, add noise, divide
            if penalty_grads is not None:
                add_gradients(optimizer.params, penalty_grads)
            optimizer.original_optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0 if batch is None else 1
