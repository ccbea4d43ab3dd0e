"""FedPer (docs/methods.md, FedPer): encoders averaged over all clients, decoders and heads personal."""

from __future__ import annotations

import pytest
import torch

from fedmtl.methods import create_method
from fedmtl.models import MultiTaskModel
from fedmtl.seeds import derive_seed
from tests.helpers import HAND_DECODERS_TRAINED, TINY_BACKBONE, client_states, fit, hand_round, tiny_config


def test_server_averages_encoders_and_returns_every_decoder_as_trained():
    """Encoders 1, 2, 6 → 3 everywhere; every decoder comes back bitwise as prev + Δ, even
    the two semseg decoders, which FedAvg-HC would have averaged."""
    inputs = hand_round()
    out = create_method("FedPer").aggregate(inputs)
    assert torch.equal(out.encoders, torch.full((3, 1), 3.0))
    assert torch.equal(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
    assert torch.equal(out.decoders, torch.tensor(HAND_DECODERS_TRAINED))


def test_weighted_fedper_weighs_encoders_by_sample_counts_and_still_keeps_decoders():
    """FedAvg's weighting pitfall: shards 1000/1000/795 and encoders 1, 2, 6 give 7770/2795 = 2.78, not 3."""
    out = create_method("FedPer", weighted=True).aggregate(hand_round())
    assert out.encoders[:, 0].tolist() == pytest.approx([7770 / 2795] * 3, rel=1e-6)
    assert round(7770 / 2795, 2) == 2.78
    assert torch.equal(out.decoders, torch.tensor(HAND_DECODERS_TRAINED))


def _parameter_keys(module: torch.nn.Module, prefix: str) -> list[str]:
    return [f"{prefix}.{name}" for name, _ in module.named_parameters()]


def test_after_three_rounds_encoders_are_shared_and_single_task_decoders_personal(tmp_path, data_root):
    """The tiny scenario's two PASCAL single-task clients (semseg, sal) start from bitwise
    equal decoders (the engine builds every client from one seed): after three FedPer rounds
    their decoders differ, while every client's encoder parameters are bitwise equal."""
    fit(tiny_config(tmp_path, data_root, algorithm={"class_path": "FedPer"}), tmp_path / "run")
    semseg, sal, mt = (state["model"] for state in client_states(tmp_path / "run"))

    with torch.random.fork_rng(devices=[]):  # the engine's initial models (engine._initial_state)
        torch.manual_seed(derive_seed(0, "init"))
        initial_semseg = MultiTaskModel(
            "pascal_context", ("semseg",), img_size=(32, 32), backbone=TINY_BACKBONE
        )
        torch.manual_seed(derive_seed(0, "init"))
        initial_sal = MultiTaskModel("pascal_context", ("sal",), img_size=(32, 32), backbone=TINY_BACKBONE)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            initial_semseg.decoders["semseg"].parameters(),
            initial_sal.decoders["sal"].parameters(),
            strict=True,
        )
    )

    encoder_keys = _parameter_keys(initial_semseg.encoder, "encoder")
    for key in encoder_keys:
        assert torch.equal(semseg[key], sal[key]), key
        assert torch.equal(semseg[key], mt[key]), key
    assert not torch.equal(semseg[encoder_keys[0]], initial_semseg.state_dict()[encoder_keys[0]])

    semseg_keys = _parameter_keys(initial_semseg.decoders["semseg"], "decoders.semseg")
    sal_keys = _parameter_keys(initial_sal.decoders["sal"], "decoders.sal")
    for semseg_key, sal_key in zip(semseg_keys, sal_keys, strict=True):
        assert not torch.equal(semseg[semseg_key], sal[sal_key]), (semseg_key, sal_key)
    # Same task, other client: not averaged either.
    assert not torch.equal(semseg["decoders.semseg.fuse.weight"], mt["decoders.semseg.fuse.weight"])
