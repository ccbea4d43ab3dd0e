"""Evaluating the clients: each on its dataset's validation split, and the held-out clients.

An evaluation loads a client's parameters alone (not its optimiser state), applies its pending
receipts in memory (nothing is stored) and validates every model the method evaluates. Every
rank evaluates its own clients; the ranks sum one table, so they all return the same results.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch

from fedmtl.federated import held_out, stopping
from fedmtl.federated.client import ClientModule
from fedmtl.federated.health import all_finite
from fedmtl.federated.training import TASK_SLOTS
from fedmtl.methods.base import new_track
from fedmtl.tensors import load_into

if TYPE_CHECKING:
    from fedmtl.federated.rounds import Federation

Results = dict[str, dict[str, dict[str, float]]]  # {label: {client: {task: value}}}


class Evaluator:
    """Validates a federation's clients on this rank (construct once per run)."""

    def __init__(self, federation: Federation) -> None:
        self.fed = federation
        method = federation.method
        # The models a method evaluates, its paper's one first (e.g. Ditto: personal, global).
        self.labels = [method.evaluated, *getattr(method, "also_evaluated", ())]

    @torch.no_grad()
    def evaluate(self, only: list[int] | None = None) -> Results:
        """Task metrics of every client (or the clients ``only``) on its dataset's full
        validation split, for each model the method evaluates: {label: {client: {task: value}}},
        its paper's label first. A label some client does not have yet (FedBABU's fine-tuned
        copy before the end) is left out."""
        fed, clients = self.fed, self.fed.clients
        evaluated = list(range(len(clients))) if only is None else sorted(only)
        device = fed.ranks.device
        table = torch.zeros(
            len(self.labels), len(clients), len(TASK_SLOTS), dtype=torch.float64, device=device
        )
        present = torch.zeros(len(self.labels), dtype=torch.float64, device=device)
        # On a stop request the ranks still meet in the sums below, then stop together (Ranks.agree).
        with contextlib.suppress(stopping.Abandoned):
            chosen = set(evaluated)
            for i in [i for i in clients.mine if i in chosen]:
                module, state = fed.load(i, params_only=True)  # the models, not the optimiser state
                held = state["model"]  # what the module holds now
                for label, model_state in fed.method.evaluated_models(state).items():
                    present[self.labels.index(label)] += 1
                    if not all_finite(model_state.values()):  # NaN metrics, not numbers from NaN logits
                        table[self.labels.index(label), i] = math.nan
                        continue
                    if model_state is not held:
                        load_into(module.model, model_state)
                        held = model_state
                    for task, value in self.validate(i, module).items():
                        table[self.labels.index(label), i, TASK_SLOTS[task]] = value
        table = fed.ranks.sum(table).cpu()
        present = fed.ranks.sum(present).cpu()
        return {
            label: {
                clients.specs[i].name: {t: float(table[k, i, TASK_SLOTS[t]]) for t in clients.specs[i].tasks}
                for i in evaluated
            }
            for k, label in enumerate(self.labels)
            if int(present[k]) == len(evaluated)
        }

    def validate(self, i: int, module: ClientModule) -> dict[str, float]:
        """The task metrics of the model in ``module`` on client ``i``'s validation split."""
        fed = self.fed
        module.eval()
        loader = fed.clients.loader(fed.clients.dataset(i, "val"), fed.cfg.evaluation.batch_size, None)
        for batch in fed.trainer.batches(loader):
            with fed.ranks.fabric.autocast():
                module.validation_step(batch)
        return module.compute_metrics()

    # ------------------------------------------------------------------ held-out clients

    @torch.no_grad()
    def federated_parts(self) -> dict[held_out.Part, torch.Tensor]:
        """The parts of the federated model the held-out clients take: each shared part's mean
        over the federated clients' evaluated models that hold it (module held_out)."""
        fed, clients = self.fed, self.fed.clients
        shared = fed.method.shared_parts
        first = len(clients)
        owner = {}  # a held-out client of each part's architecture: sizes every rank agrees on
        for h, spec in enumerate(clients.held_out):
            for part in held_out.parts_of(spec.dataset, spec.tasks, shared):
                owner.setdefault(part, first + h)
        size = {
            part: held_out.flat_state(part.module(clients.module(i).model)).numel()
            for part, i in owner.items()
        }
        sums = held_out.PartSums(list(owner), size)
        for i in clients.mine:
            spec = clients.specs[i]
            module, state = fed.load(i, params_only=True)
            model_state = fed.method.evaluated_models(state)[self.labels[0]]
            if not all_finite(model_state.values()):  # a diverged client gives the new ones nothing
                continue
            load_into(module.model, model_state)
            sums.add(module.model, held_out.parts_of(spec.dataset, spec.tasks, shared))
        sums.sums = fed.ranks.sum(sums.sums.to(fed.ranks.device)).cpu()
        sums.counts = fed.ranks.sum(sums.counts.to(fed.ranks.device)).cpu()
        return sums.means()

    def held_out_results(self) -> dict[str, dict[str, float]]:
        """Every held-out client after the last round: the federated model's shared parts on
        its first draw, fine-tuned on its own data, evaluated: {client: {task: value}}."""
        fed, clients = self.fed, self.fed.clients
        parts = self.federated_parts()
        shared = fed.method.shared_parts
        first = len(clients)
        table = torch.zeros(
            len(clients.held_out), len(TASK_SLOTS), dtype=torch.float64, device=fed.ranks.device
        )
        with contextlib.suppress(stopping.Abandoned):  # the ranks still meet in the sum below
            for h in clients.mine_held_out:
                i, spec = first + h, clients.held_out[h]
                module = clients.module(i)
                load_into(module.model, clients.drawn_model(i).model.state_dict())
                for part in held_out.parts_of(spec.dataset, spec.tasks, shared):
                    if part in parts:
                        held_out.load_flat_state(part.module(module.model), parts[part])
                track = new_track(module.model)
                epochs = spec.fine_tune_epochs
                if epochs:
                    data = clients.dataset(i, "train")
                    fed.trainer.train(
                        module, i, data, track, epochs=epochs, order="held-out", fine_tune=spec.optimizer
                    )
                load_into(module.model, track["model"])
                if not all_finite(track["model"].values()):
                    table[h] = math.nan
                    continue
                with torch.no_grad():
                    for task, value in self.validate(i, module).items():
                        table[h, TASK_SLOTS[task]] = value
        table = fed.ranks.sum(table).cpu()
        return {
            spec.name: {t: float(table[h, TASK_SLOTS[t]]) for t in spec.tasks}
            for h, spec in enumerate(clients.held_out)
        }
