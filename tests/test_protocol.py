"""The training protocol as the public FedHCA² code runs it (docs/differences.md):
the learning-rate schedule and when it is stepped, training loaders that drop the last
incomplete batch, and each client's own initial decoders and heads."""

from __future__ import annotations

import math

import pytest
import torch
from timm.scheduler import CosineLRScheduler

from fedmtl.config import OptimizerConfig
from fedmtl.federated.client import end_epoch, make_optimizer
from tests.helpers import fit, fit_refused, tiny_config

LR, WARMUP_LR, MIN_LR, WARMUP = 1e-4, 1.25e-7, 1.25e-6, 5


def _trained_lrs(scheduler_of, step, total: int) -> list[float]:
    """The lr each of ``total`` epochs trains at, for a schedule built by ``scheduler_of`` and
    stepped by ``step(scheduler, epoch)`` after each epoch (0-based)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = scheduler_of(optimizer)
    lrs = []
    for epoch in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        step(scheduler, epoch)
    return lrs


def _cosine(t: float, span: int) -> float:
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * t / span))


def _warmup(t: int) -> float:
    return WARMUP_LR + t * (LR - WARMUP_LR) / WARMUP


def test_the_schedule_is_the_public_codes_for_twelve_epochs():
    """E_tot = 12. The public code: CosineLRScheduler(t_initial = 12 − 5, warmup_t = 5,
    warmup_prefix = True) stepped with step(e) after epoch e, so epoch e trains at the value
    for max(e − 1, 0). fedmtl before: t_initial = 12, no prefix, step(e + 1)."""
    public = [_warmup(0), *(_warmup(t) for t in range(5)), *(_cosine(t, 7) for t in range(6))]
    old = [_warmup(t) for t in range(5)] + [_cosine(t, 12) for t in range(5, 12)]

    def built_as_public(optimizer):
        return CosineLRScheduler(
            optimizer,
            t_initial=12 - 5,
            lr_min=MIN_LR,
            warmup_t=5,
            warmup_lr_init=WARMUP_LR,
            warmup_prefix=True,
        )

    def built_as_before(optimizer):
        return CosineLRScheduler(optimizer, t_initial=12, lr_min=MIN_LR, warmup_t=5, warmup_lr_init=WARMUP_LR)

    public_run = _trained_lrs(built_as_public, lambda s, e: s.step(e), 12)
    assert public_run == pytest.approx(public, rel=1e-12)
    assert _trained_lrs(built_as_before, lambda s, e: s.step(e + 1), 12) == pytest.approx(old, rel=1e-12)

    here = []
    optimizer, scheduler = make_optimizer([torch.nn.Parameter(torch.zeros(1))], OptimizerConfig(), 12)
    for epoch in range(12):
        here.append(optimizer.param_groups[0]["lr"])
        end_epoch(scheduler, epoch)
    assert here == public_run  # the public code's calls: the same bits
    assert here[0] == here[1] == WARMUP_LR and here[6] == LR and here[-1] > MIN_LR
    assert here != pytest.approx(old)


def test_a_run_shorter_than_the_warm_up_still_builds_a_schedule():
    """3 epochs with 5 warm-up epochs (the tiny tests): the cosine spans at least one epoch."""
    optimizer, scheduler = make_optimizer([torch.nn.Parameter(torch.zeros(1))], OptimizerConfig(), 3)
    lrs = []
    for epoch in range(3):
        lrs.append(optimizer.param_groups[0]["lr"])
        end_epoch(scheduler, epoch)
    assert lrs == pytest.approx([_warmup(0), _warmup(0), _warmup(1)])


def test_the_optimiser_is_adamw_with_the_fused_kernel_and_its_steps():
    """make_optimizer uses the fused AdamW kernel on CPU, and ten of its steps move the
    parameters as PyTorch's per-tensor AdamW does (same lr, betas, eps, decoupled decay)."""
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(10)]
    config = OptimizerConfig(lr=1e-2, weight_decay=0.05)

    def run(build):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizer = build(params)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        return optimizer, [p.detach() for p in params]

    fused, ours = run(lambda params: make_optimizer(params, config, None)[0])
    plain, reference = run(
        lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, foreach=False, fused=False)
    )
    assert fused.param_groups[0]["fused"] and not plain.param_groups[0]["fused"]
    for a, b, first in zip(ours, reference, start, strict=True):
        assert not torch.equal(a, first)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_parameters_the_fused_kernel_cannot_take_get_the_per_tensor_adamw():
    """fused AdamW refuses integer tensors and devices it has no kernel for (here "meta");
    make_optimizer builds the per-tensor AdamW for them instead of failing."""
    for param in (
        torch.nn.Parameter(torch.zeros(2, device="meta")),
        torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False),
    ):
        optimizer, _ = make_optimizer([param], OptimizerConfig(), None)
        assert not optimizer.param_groups[0]["fused"]


def test_local_training_steps_the_schedule_after_each_global_epoch(tmp_path, data_root, monkeypatch):
    """Through the engine: every client's schedule is stepped with its 0-based global epoch
    (rounds × local epochs: 0, 1, 2 for PASCAL clients; 0 … 5 for the 2-epoch NYUD client)."""
    from fedmtl.federated import preflight, training

    calls = []
    real = training.end_epoch
    monkeypatch.setattr(
        training, "end_epoch", lambda scheduler, epoch: (calls.append(epoch), real(scheduler, epoch))
    )
    # fit's warm-up check steps a throwaway schedule of its own (training.epoch_rates): not training's
    monkeypatch.setattr(preflight, "warmup_warnings", lambda cfg: [])
    fit(tiny_config(tmp_path, data_root), tmp_path / "run")
    assert sorted(calls) == sorted([0, 1, 2] * 2 + [0, 1, 2, 3, 4, 5])


def test_training_drops_the_last_incomplete_batch_and_evaluation_does_not(tmp_path, data_root, monkeypatch):
    """6 training images per PASCAL client at batch 4: one step per epoch, of 4 images;
    12 NYUD images at batch 4: three per epoch. Evaluation at batch 3 sees all 4 validation
    images of each client: a batch of 3 and the last one of 1."""
    from fedmtl.federated.client import ClientModule

    train_batches, val_images = [], []
    step, validate = ClientModule.training_step, ClientModule.validation_step

    def training_step(self, batch, batch_idx=0):
        train_batches.append((self.spec.name, len(batch["image"])))
        return step(self, batch, batch_idx)

    def validation_step(self, batch, batch_idx=0):
        val_images.append(len(batch["image"]))
        return validate(self, batch, batch_idx)

    monkeypatch.setattr(ClientModule, "training_step", training_step)
    monkeypatch.setattr(ClientModule, "validation_step", validation_step)
    fit(tiny_config(tmp_path, data_root, rounds=1, evaluation={"batch_size": 3}), tmp_path / "run")
    assert sorted(train_batches) == sorted(
        [("pascal_context-semseg", 4), ("pascal_context-sal", 4)] + [("nyud-semseg+depth", 4)] * 6
    )
    assert sorted(val_images) == [1, 1, 1, 3, 3, 3]


def test_clients_start_from_one_encoder_and_their_own_decoders_and_heads(tmp_path, data_root, monkeypatch):
    from fedmtl.federated.clients import Clients

    starts = {}
    initial = Clients.initial_state

    def recording(self, i):
        state = initial(self, i)
        starts[i] = state["model"]
        return state

    monkeypatch.setattr(Clients, "initial_state", recording)
    fit(tiny_config(tmp_path, data_root, rounds=1), tmp_path / "run")
    a, b, mt = starts[0], starts[1], starts[2]
    encoder = [k for k in a if k.startswith("encoder.")]
    assert encoder and all(torch.equal(a[k], b[k]) and torch.equal(a[k], mt[k]) for k in encoder)
    assert not torch.equal(a["decoders.semseg.fuse.weight"], b["decoders.sal.fuse.weight"])
    assert not torch.equal(a["decoders.semseg.fuse.weight"], mt["decoders.semseg.fuse.weight"])
    assert not torch.equal(a["heads.semseg.upsample1.weight"], mt["heads.semseg.upsample1.weight"])


def test_a_client_with_fewer_images_than_its_batch_is_refused(tmp_path, data_root, capsys):
    clients = [
        {"dataset": "pascal_context", "tasks": ["semseg", "sal"], "single_task": True, "batch_size": 8}
    ]
    lines = fit_refused(tiny_config(tmp_path, data_root, clients=clients), tmp_path / "run", capsys)
    assert len(lines) == 1
    assert lines[0].startswith(
        "error: client pascal_context-semseg has 6 training images, fewer than its batch size 8"
    )
