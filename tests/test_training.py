"""Optimiser state stored by parameter name: what keeps a frozen parameter's AdamW moments
for later and lets a phase change the set of trained parameters; and clients that keep no
optimiser state at all (``clients[].optimizer.keep_state`` false)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedmtl.federated import checkpoint
from fedmtl.federated.training import load_optimizer_state, optimizer_state_by_name
from tests.helpers import TINY, client_states, fit, fit_killed_in_round, read_results, tiny_config


def _step(params: list[nn.Parameter]) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(params, lr=0.1)
    sum((p**2).sum() for p in params).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer


def test_state_is_keyed_by_name_and_frozen_names_keep_their_previous_moments():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    names = [n for n, _ in model.named_parameters()]
    everything = optimizer_state_by_name(_step(list(model.parameters())), names, None)
    assert list(everything["state"]) == names and everything["group"]["lr"] == 0.1
    assert "params" not in everything["group"]

    # A phase that freezes the first layer trains only the second: the first layer's
    # moments are carried over untouched, the second's are the new ones.
    trained = [("1.weight", model[1].weight), ("1.bias", model[1].bias)]
    first_moment = everything["state"]["1.weight"]["exp_avg"].clone()
    optimizer = torch.optim.AdamW([p for _, p in trained], lr=0.1)
    load_optimizer_state(optimizer, [n for n, _ in trained], everything)
    assert torch.equal(optimizer.state[model[1].weight]["exp_avg"], first_moment)
    sum((p**2).sum() for _, p in trained).backward()
    optimizer.step()
    later = optimizer_state_by_name(optimizer, [n for n, _ in trained], everything)
    for name in ("0.weight", "0.bias"):
        assert later["state"][name] is everything["state"][name]
    assert float(later["state"]["1.weight"]["step"]) == 2.0
    assert not torch.equal(later["state"]["1.weight"]["exp_avg"], first_moment)


def test_loading_a_name_it_has_never_seen_starts_that_parameter_fresh():
    model = nn.Linear(2, 1)
    saved = optimizer_state_by_name(_step([model.weight]), ["weight"], None)
    optimizer = torch.optim.AdamW([model.weight, model.bias], lr=0.1)
    load_optimizer_state(optimizer, ["weight", "bias"], saved)
    assert model.weight in optimizer.state and model.bias not in optimizer.state


def test_an_old_positional_state_is_refused_with_the_way_out():
    model = nn.Linear(2, 1)
    positional = _step(list(model.parameters())).state_dict()
    with pytest.raises(ValueError, match="cannot be resumed: start a new run"):
        load_optimizer_state(torch.optim.AdamW(model.parameters()), ["weight", "bias"], positional)


# ---------------------------------------------------------------------------- keep_state


class _OneBatch:
    """A stand-in dataset: every epoch is the same small regression batch."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.batch = {
            "image": torch.randn(4, 3, generator=generator),
            "depth": torch.randn(4, 1, generator=generator),
        }

    def set_epoch(self, epoch: int) -> None:
        pass


class _Client(nn.Module):
    """A stand-in ClientModule: a linear model on the depth task, recording the learning rate
    every step trains at."""

    def __init__(self, spec, lrs: list[float], optimizers: list[torch.optim.Optimizer]) -> None:
        super().__init__()
        self.spec, self.lrs, self.optimizers = spec, lrs, optimizers
        torch.manual_seed(0)
        self.model = nn.Linear(3, 1)

    def training_step(self, batch):
        self.lrs.append(self.optimizers[-1].param_groups[0]["lr"])
        loss = ((self.model(batch["image"]) - batch["depth"]) ** 2).mean()
        return {"total": loss, "depth": loss}


def _train_rounds(monkeypatch, keep_state: bool, rounds: int = 4, epochs: int = 2):
    """``rounds`` rounds of ``epochs`` local epochs of one track through the real LocalTrainer;
    returns the learning rate of every step, the track after each round."""
    import lightning as L

    from fedmtl.config import OptimizerConfig
    from fedmtl.federated import training
    from fedmtl.federated.client import ClientSpec
    from fedmtl.methods.base import new_track

    optimizers: list[torch.optim.Optimizer] = []
    make = training.make_optimizer

    def recording_make(params, config, total_epochs):
        optimizer, scheduler = make(params, config, total_epochs)
        optimizers.append(optimizer)
        return optimizer, scheduler

    monkeypatch.setattr(training, "make_optimizer", recording_make)
    config = OptimizerConfig(lr=0.1, warmup_epochs=3, warmup_lr=0.01, min_lr=0.001, keep_state=keep_state)
    spec = ClientSpec("c", "nyud", ("depth",), epochs, 4, tuple(range(4)), optimizer=config)
    lrs: list[float] = []
    module = _Client(spec, lrs, optimizers)
    dataset = _OneBatch()
    trainer = training.LocalTrainer(
        L.Fabric(accelerator="cpu", devices=1), 0, rounds, lambda d, *_: [d.batch]
    )
    track = new_track(module.model)
    tracks = []
    for _ in range(rounds):
        trainer.train(module, 0, dataset, track)
        tracks.append({k: v for k, v in track.items() if k != "model"} | {"model": dict(track["model"])})
    return lrs, tracks


def test_a_fresh_optimiser_every_round_trains_at_the_kept_schedules_rates(monkeypatch):
    """keep_state false: no AdamW state or schedule is kept, each round's fresh schedule starts
    where the client's epochs have brought it, so every epoch trains at the rate it trains at
    with keep_state true; the first round is the same bit for bit (both start fresh), later
    ones differ (AdamW's moments and step count start over)."""
    from fedmtl.config import OptimizerConfig
    from fedmtl.federated.client import end_epoch, make_optimizer

    kept_lrs, kept = _train_rounds(monkeypatch, keep_state=True)
    fresh_lrs, fresh = _train_rounds(monkeypatch, keep_state=False)
    assert fresh_lrs == kept_lrs
    # The rates are the schedule's, one epoch behind (end_epoch), over all 4 x 2 epochs.
    config = OptimizerConfig(lr=0.1, warmup_epochs=3, warmup_lr=0.01, min_lr=0.001)
    optimizer, scheduler = make_optimizer([nn.Parameter(torch.zeros(1))], config, 8)
    expected = []
    for epoch in range(8):
        expected.append(optimizer.param_groups[0]["lr"])
        end_epoch(scheduler, epoch)
    assert kept_lrs == expected and len(set(expected)) == 7  # the first two epochs share a rate
    for kept_track, fresh_track in zip(kept, fresh):
        assert fresh_track["optimizer"] is None and fresh_track["scheduler"] is None
        assert kept_track["optimizer"] is not None and kept_track["scheduler"] is not None
        assert fresh_track["epochs_done"] == kept_track["epochs_done"]
    assert all(torch.equal(kept[0]["model"][k], fresh[0]["model"][k]) for k in kept[0]["model"])
    assert not all(torch.equal(kept[1]["model"][k], fresh[1]["model"][k]) for k in kept[1]["model"])


# ---------------------------------------------------------------------------- keep_state end to end

DITTO = {"class_path": "Ditto", "init_args": {"lam": 0.1}}  # two tracks per client


def _keep_state_config(tmp: Path, data_root: Path, keep_state: bool) -> Path:
    clients = [{**group, "optimizer": {"keep_state": keep_state}} for group in TINY["clients"]]
    return tiny_config(
        tmp, data_root, name=f"keep_{keep_state}.yaml", clients=clients, algorithm=DITTO, rounds=2
    )


@contextlib.contextmanager
def _recording_lrs(lrs: list[float]) -> Iterator[None]:
    """Record the learning rate of every training step (each track of each client, in order)."""
    from fedmtl.federated import training
    from fedmtl.federated.client import ClientModule

    optimizers: list[torch.optim.Optimizer] = []
    make, step = training.make_optimizer, ClientModule.training_step

    def recording_make(params, config, total_epochs):
        optimizer, scheduler = make(params, config, total_epochs)
        optimizers.append(optimizer)
        return optimizer, scheduler

    def recording_step(self, batch, batch_idx=0):
        lrs.append(optimizers[-1].param_groups[0]["lr"])
        return step(self, batch, batch_idx)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "make_optimizer", recording_make)
        patch.setattr(ClientModule, "training_step", recording_step)
        yield


@pytest.fixture(scope="module")
def keep_state_runs(module_dir, data_root) -> dict[str, dict[Any, Any]]:
    """Ditto on the tiny scenario with keep_state true and false (each recording its rates),
    false again, and false killed in round 2 and resumed: each run's rates (``lrs``),
    ``results``, client ``states`` and checkpoint ``bytes`` (its client files)."""
    runs: dict[str, dict[Any, Any]] = {"lrs": {}, "results": {}, "states": {}, "bytes": {}}
    for keep in (True, False):
        lrs: list[float] = []
        with _recording_lrs(lrs):
            fit(_keep_state_config(module_dir, data_root, keep), module_dir / f"keep_{keep}")
        runs["lrs"][f"keep_{keep}"] = lrs
    config = _keep_state_config(module_dir, data_root, False)
    fit(config, module_dir / "again")
    with pytest.MonkeyPatch.context() as patch:
        fit_killed_in_round(config, module_dir / "resumed", patch, 2)
    fit(config, module_dir / "resumed", "--resume", "true")
    for run in ("keep_True", "keep_False", "again", "resumed"):
        runs["results"][run] = read_results(module_dir / run)
        runs["states"][run] = client_states(module_dir / run)
        files = checkpoint.latest(module_dir / run).glob("client_*.pt")
        runs["bytes"][run] = sum(p.stat().st_size for p in files)
    return runs


def _same_states(a: list[dict], b: list[dict]) -> bool:
    """Both tracks' parameters (Ditto's global and personal) equal bit for bit, client by client."""

    def tensors(state: dict) -> dict[str, torch.Tensor]:
        out = {f"model.{k}": v for k, v in state["model"].items()}
        return out | {f"personal.{k}": v for k, v in state["personal"]["track"]["model"].items()}

    pairs = [(tensors(x), tensors(y)) for x, y in zip(a, b, strict=True)]
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in pairs)


def test_without_kept_state_a_client_stores_its_parameters_alone(keep_state_runs):
    """Both of Ditto's tracks keep no optimiser or schedule; the checkpoint files shrink to
    about a third (AdamW's two moments per parameter are gone)."""
    for keep in (True, False):
        for state in keep_state_runs["states"][f"keep_{keep}"]:
            for track in (state, state["personal"]["track"]):
                assert (track["optimizer"] is not None) == keep
                assert (track["scheduler"] is not None) == keep
                assert track["epochs_done"] > 0
    sizes = keep_state_runs["bytes"]
    assert sizes["keep_False"] < 0.5 * sizes["keep_True"]


def test_without_kept_state_every_step_trains_at_the_same_rate(keep_state_runs):
    lrs = keep_state_runs["lrs"]
    assert lrs["keep_False"] == lrs["keep_True"]
    assert len(set(lrs["keep_True"])) > 2  # the warm-up moves it


def test_without_kept_state_results_differ_and_repeat_bit_for_bit(keep_state_runs):
    results, states = keep_state_runs["results"], keep_state_runs["states"]
    assert results["keep_False"] != results["keep_True"]
    assert not _same_states(states["keep_False"], states["keep_True"])
    assert results["again"] == results["keep_False"]
    assert _same_states(states["again"], states["keep_False"])


def test_without_kept_state_a_resumed_run_is_the_uninterrupted_one(keep_state_runs):
    results, states = keep_state_runs["results"], keep_state_runs["states"]
    assert results["resumed"] == results["keep_False"]
    assert _same_states(states["resumed"], states["keep_False"])
