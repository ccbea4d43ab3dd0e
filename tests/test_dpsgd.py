"""Sample-level DP-SGD (fedmtl.privacy.dpsgd) and the ``model.norm: group`` option: the pieces
on small models, and LocalTrainer's private path on a stand-in client (no engine run)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedmtl.config import ModelConfig, OptimizerConfig
from fedmtl.federated import training
from fedmtl.federated.spec import ClientSpec
from fedmtl.methods.base import new_track
from fedmtl.models.norms import group_count
from fedmtl.privacy.dpsgd import (
    PerSampleGradients,
    SampleDP,
    batches_per_epoch,
    dp_optimizer,
    private_model_problem,
    sample_rate,
    steps,
)

# ---------------------------------------------------------------------------- model.norm


@pytest.fixture(scope="module")
def models():
    from fedmtl.models import MultiTaskModel

    torch.manual_seed(0)
    batch = MultiTaskModel("nyud", ["semseg", "depth"])
    group = MultiTaskModel("nyud", ["semseg", "depth"], norm="group")
    return batch, group


def test_group_norm_replaces_every_batch_norm_of_encoder_and_decoders(models):
    batch, group = models
    batch_norms = [m for m in batch.modules() if isinstance(m, _BatchNorm)]
    group_norms = [m for m in group.modules() if isinstance(m, nn.GroupNorm)]
    assert len(batch_norms) == len(group_norms) == 46  # 44 in regnetx_002, one per decoder
    assert not any(isinstance(m, _BatchNorm) for m in group.modules())
    assert sorted(n.num_channels for n in group_norms) == sorted(b.num_features for b in batch_norms)
    assert all(n.num_groups == group_count(n.num_channels) for n in group_norms)
    assert not any(getattr(m, "inplace", False) for m in group.modules())
    out = group(torch.randn(2, 3, 32, 32))
    assert out["depth"].shape == (2, 1, 32, 32)


def test_group_count_divides_the_channels():
    assert [group_count(c) for c in (24, 32, 56, 64, 152, 368)] == [8, 32, 8, 32, 8, 16]


def test_model_norm_is_refused_outside_its_values():
    with pytest.raises(
        ValueError, match=r"^model.norm must be batch or group, got 'layer' \(group: GroupNorm"
    ):
        ModelConfig(norm="layer")


def test_a_batch_norm_model_is_one_line_naming_the_fix(models):
    batch, group = models
    problem = private_model_problem(batch)
    assert problem is not None and "\n" not in problem
    assert "(2 BatchNorm2d, 44 BatchNormAct2d)" in problem and problem.endswith("set model.norm: group")
    assert private_model_problem(group) is None
    with pytest.raises(ValueError, match="set model.norm: group"):
        PerSampleGradients(batch)


def test_swin_cannot_be_private_and_the_line_says_why():
    import timm

    swin = timm.create_model(
        "swin_tiny_patch4_window7_224", features_only=True, img_size=(32, 32), embed_dim=8,
        depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1), window_size=2,
    )  # fmt: skip
    problem = private_model_problem(swin)
    assert (
        problem is not None and "4 WindowAttention" in problem and "refuses layers holding buffers" in problem
    )


# ---------------------------------------------------------------------------- pure pieces


def test_sample_rate_and_steps():
    assert sample_rate(100, 4) == 0.04 and sample_rate(3, 4) == 1.0
    assert batches_per_epoch(100, 4) == 25 and batches_per_epoch(10, 3) == 3
    assert steps(3, 25) == 75
    with pytest.raises(ValueError, match="at least one sample"):
        sample_rate(0, 4)


@pytest.mark.parametrize(
    ("z", "clip", "message"),
    [(-1.0, 1.0, "noise_multiplier must be a finite number >= 0"), (1.0, 0.0, "clip must be > 0"),
     (1.0, math.inf, "noise would be infinite")],
)  # fmt: skip
def test_sample_dp_range(z, clip, message):
    with pytest.raises(ValueError, match=message):
        SampleDP(z, clip, 0)


def _privatised_grad(model: nn.Module, x: torch.Tensor, dp: SampleDP, expected: int) -> list[torch.Tensor]:
    """The gradient DP-SGD hands AdamW for the mean loss over ``x``."""
    private = PerSampleGradients(model)
    optimizer = dp_optimizer(torch.optim.AdamW(model.parameters()), dp, expected)
    try:
        (model(x) ** 2).mean().mul(1000).backward()  # large: every sample's gradient is clipped
        assert optimizer.pre_step()
        return [p.grad.clone() for p in model.parameters()]
    finally:
        private.close()


def test_each_sample_gradient_is_clipped_to_c():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.GroupNorm(2, 4), nn.Linear(4, 1))
    x = torch.randn(6, 5) * 10
    for i in range(6):  # a batch of one: the step's gradient is that sample's clipped gradient
        grad = _privatised_grad(model, x[i : i + 1], SampleDP(0.0, 0.5, 0), expected=1)
        norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grad]))
        assert 0.49 < norm <= 0.5 + 1e-6
    grad = _privatised_grad(model, x, SampleDP(0.0, 0.5, 0), expected=6)  # mean of 6 clipped
    assert torch.linalg.vector_norm(torch.cat([g.flatten() for g in grad])) <= 0.5 + 1e-6


def test_no_noise_and_no_clip_give_the_plain_mean_gradient():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.GroupNorm(2, 4), nn.Linear(4, 1))
    x = torch.randn(6, 5)
    private = _privatised_grad(model, x, SampleDP(0.0, math.inf, 0), expected=6)
    model.zero_grad()
    (model(x) ** 2).mean().mul(1000).backward()
    for p, g in zip(model.parameters(), private, strict=True):
        torch.testing.assert_close(g, p.grad)


# ---------------------------------------------------------------------------- LocalTrainer


class _Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(12, 3, 4, 4, generator=generator)
        self.y = torch.randn(12, 1, 4, 4, generator=generator)

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.x[i], "depth": self.y[i]}

    def set_epoch(self, epoch: int) -> None:
        pass


class _Client(nn.Module):
    """A stand-in ClientModule: an encoder-like conv + GroupNorm and a head, on depth."""

    def __init__(self, spec: ClientSpec) -> None:
        super().__init__()
        self.spec = spec
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv2d(4, 1, 1))

    def training_step(self, batch):
        loss = ((self.model(batch["image"]) - batch["depth"]) ** 2).mean()
        return {"total": loss, "depth": loss}


def _spec(epochs: int = 2) -> ClientSpec:
    return ClientSpec(
        "c", "nyud", ("depth",), epochs, 3, tuple(range(12)), optimizer=OptimizerConfig(lr=0.05)
    )


def _trainer(dp: SampleDP | None, rounds: int = 1) -> training.LocalTrainer:
    def loader(dataset, batch_size, seed):
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, drop_last=True)

    return training.LocalTrainer(L.Fabric(accelerator="cpu", devices=1), 0, rounds, loader, dp=dp)


def _train(dp: SampleDP, epochs_per_call: tuple[int, ...] = (2,), **kwargs) -> tuple[_Client, dict]:
    client = _Client(_spec(sum(epochs_per_call)))
    track = new_track(client.model)
    trainer = _trainer(dp)
    for epochs in epochs_per_call:
        trainer.train(client, 0, _Data(), track, epochs=epochs, **kwargs)
    return client, track


def test_private_training_repeats_bit_for_bit_and_resumes_identically():
    dp = SampleDP(1.0, 1.0, seed=7)
    _, once = _train(dp)
    _, again = _train(dp)
    _, resumed = _train(dp, epochs_per_call=(1, 1))  # stopped after an epoch, then continued
    _, other = _train(SampleDP(1.0, 1.0, seed=8))
    for key in once["model"]:
        assert torch.equal(once["model"][key], again["model"][key])
        assert torch.equal(once["model"][key], resumed["model"][key])
    assert not all(torch.equal(once["model"][k], other["model"][k]) for k in once["model"])


def test_hooks_are_removed_after_training_and_frozen_layers_stay():
    client = _Client(_spec())
    first = client.model[0]
    before = {k: v.clone() for k, v in first.state_dict().items()}
    trainer = _trainer(SampleDP(1.0, 1.0, seed=0))
    trainer.train(client, 0, _Data(), new_track(client.model), frozen=[first])
    assert all(torch.equal(v, first.state_dict()[k]) for k, v in before.items())
    for module in client.model.modules():
        assert not module._forward_hooks and not module._backward_hooks
    assert not hasattr(client.model, "autograd_grad_sample_hooks")
    assert not any(hasattr(p, "grad_sample") or hasattr(p, "summed_grad") for p in client.model.parameters())
    assert all(p.requires_grad for p in client.model.parameters())
