"""Optimiser state stored by parameter name: what keeps a frozen parameter's AdamW moments
for later and lets a phase change the set of trained parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedmtl.federated.training import load_optimizer_state, optimizer_state_by_name


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
