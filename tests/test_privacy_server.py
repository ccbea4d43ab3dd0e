"""Central DP and secure aggregation in the server step of the FedAvg family, and the client's
clipping: on stacked rounds, no engine."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
from fedmtl.methods import FedAvg, FedDEA, FedOpt
from fedmtl.privacy.run import privatise
from fedmtl.privacy.server import ServerPrivacy

P, Q = 20_000, 4_000


def _layout(numel: int) -> FlatLayout:
    return FlatLayout(names=("w",), shapes=((numel,),), dtypes=(torch.float32,), tensor_layers=("",))


def _round(zero: bool = False, seed: int = 0) -> RoundInput:
    """4 clients: 3 PASCAL semseg, 1 NYUD semseg + depth; everyone starts from the same model."""
    clients = [ClientInfo(f"pc{i}", "pascal_context", ("semseg",), 10) for i in range(3)]
    clients.append(ClientInfo("ny", "nyud", ("semseg", "depth"), 10))
    g = torch.Generator().manual_seed(seed)
    owners = decoder_owners_of(clients)
    scale = 0.0 if zero else 0.1
    return RoundInput(
        round=1,
        clients=clients,
        encoder_layout=_layout(P),
        encoders_prev=torch.randn(1, P, generator=g).repeat(4, 1),
        encoder_deltas=scale * torch.randn(4, P, generator=g),
        decoder_layout=_layout(Q),
        decoder_owners=owners,
        decoders_prev=torch.randn(1, Q, generator=g).repeat(len(owners), 1),
        decoder_deltas=scale * torch.randn(len(owners), Q, generator=g),
    )


def _step(method, inputs, privacy):
    method.set_server_privacy(privacy)
    try:
        return method.aggregate(inputs)
    finally:
        method.set_server_privacy(None)


def test_central_noise_on_a_mean_has_standard_deviation_z_c_over_m():
    z, clip = 1.3, 0.7
    inputs = _round(zero=True)
    method = FedAvg(decoder_scope="same_task")
    plain = method.aggregate(inputs)
    noisy = _step(method, inputs, ServerPrivacy(seed=5, round=1, sum_stddev=z * clip))
    encoder_noise = (noisy.encoders - plain.encoders).double()
    assert torch.equal(encoder_noise[0], encoder_noise[3])  # one noisy mean, given to every client
    assert math.isclose(float(encoder_noise[0].std()), z * clip / 4, rel_tol=0.03)
    decoder_noise = (noisy.decoders - plain.decoders).double()
    # semseg: 4 decoders (rows 0-3), depth: 1 (row 4): std z·C/4 and z·C/1
    assert math.isclose(float(decoder_noise[0].std()), z * clip / 4, rel_tol=0.05)
    assert math.isclose(float(decoder_noise[4].std()), z * clip, rel_tol=0.05)
    assert not torch.equal(decoder_noise[0], decoder_noise[4])


def test_central_noise_is_drawn_from_the_seed_and_round():
    inputs, method = _round(), FedAvg()
    a = _step(method, inputs, ServerPrivacy(seed=1, round=1, sum_stddev=1.0))
    b = _step(method, inputs, ServerPrivacy(seed=1, round=1, sum_stddev=1.0))
    c = _step(method, inputs, ServerPrivacy(seed=1, round=2, sum_stddev=1.0))
    assert torch.equal(a.encoders, b.encoders) and torch.equal(a.decoders, b.decoders)
    assert not torch.equal(a.encoders, c.encoders)


def test_no_noise_and_no_secure_aggregation_is_the_plain_step_bit_for_bit():
    inputs = _round()
    for method in (FedAvg(decoder_scope="same_task"), FedOpt(server_optimizer="adam")):
        plain = method.aggregate(inputs)
        method.load_state_dict({})
        same = _step(method, inputs, ServerPrivacy(seed=1, round=1))
        assert torch.equal(plain.encoders, same.encoders) and torch.equal(plain.decoders, same.decoders)


def test_fedopt_puts_the_noise_into_its_pseudo_gradient():
    """SGD at lr 1 without momentum is FedAvg: under the same noise, the same step."""
    inputs, privacy = _round(), ServerPrivacy(seed=3, round=1, sum_stddev=0.8)
    fedavg = _step(FedAvg(), inputs, privacy)
    fedopt = _step(FedOpt(server_optimizer="sgd", server_lr=1.0, beta1=0.0), inputs, privacy)
    assert torch.allclose(fedavg.encoders, fedopt.encoders, atol=1e-5)
    assert torch.allclose(fedavg.decoders, fedopt.decoders, atol=1e-5)


def test_feddea_scales_the_noise_to_its_rescaled_update():
    rho = 0.25
    inputs = _round(zero=True)
    method = FedDEA(rho=rho)
    plain = method.aggregate(inputs)
    noisy = _step(method, inputs, ServerPrivacy(seed=2, round=1, sum_stddev=1.0))
    noise = (noisy.encoders - plain.encoders).double()[0]
    assert math.isclose(float(noise.std()), 1.0 / rho / 4, rel_tol=0.03)


def test_secure_aggregation_gives_the_plain_mean_within_the_quantisation_bound():
    inputs = _round(seed=4)
    method = FedAvg(decoder_scope="same_task")
    plain = method.aggregate(inputs)
    secure = _step(method, inputs, ServerPrivacy(seed=9, round=1, secure=True))
    from fedmtl.privacy import secagg

    bound = secagg.quantisation_bound(4)
    assert float((plain.encoders - secure.encoders).abs().max()) <= bound + 1e-6  # + float32 rounding
    assert float((plain.decoders - secure.decoders).abs().max()) <= bound + 1e-6
    assert not torch.equal(plain.encoders, secure.encoders)  # it did go through the ring


def test_secure_aggregation_reads_the_same_sums_block_by_block():
    """The streamed rows are read a block of columns at a time: each block masked with its columns."""
    from fedmtl.aggregation.stream import StackedRows

    rows = torch.randn(3, 1000, dtype=torch.float32)
    weights = torch.tensor([[1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    privacy = ServerPrivacy(seed=1, round=2, secure=True)
    whole = privacy.weighted_sums(StackedRows("trained", rows), weights, ["all"], "encoder")
    blocks = privacy.weighted_sums(
        StackedRows("trained", rows, block_columns=64), weights, ["all"], "encoder"
    )
    assert torch.equal(whole, blocks)


# --- the client's side ------------------------------------------------------------------------


def _client_update(norm: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    starts = [torch.randn(30, generator=g), torch.randn(5, 4, generator=g)]
    delta = [torch.randn(30, generator=g), torch.randn(5, 4, generator=g)]
    scale = norm / float(torch.cat([d.flatten() for d in delta]).norm())
    params = [(s + scale * d).clone() for s, d in zip(starts, delta, strict=True)]
    return params, starts


@pytest.mark.parametrize("norm", [0.3, 4.0])
def test_a_client_update_is_clipped_to_the_clip_norm_and_no_further(norm):
    params, starts = _client_update(norm)
    before = [p.clone() for p in params]
    reported = privatise(params, starts, clip=1.0, noise_std=0.0, seed=0)
    assert math.isclose(reported, norm, rel_tol=1e-5)
    after = float(torch.cat([(p - s).flatten().double() for p, s in zip(params, starts, strict=True)]).norm())
    assert math.isclose(after, min(norm, 1.0), rel_tol=1e-5)
    if norm < 1:  # within the clip and no noise: not rewritten at all
        assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))


def test_local_noise_has_standard_deviation_z_c_and_comes_from_the_seed():
    params, starts = _client_update(1e-3)
    a = [p.clone() for p in params]
    privatise(a, starts, clip=1.0, noise_std=0.5, seed=7)
    b = [p.clone() for p in params]
    privatise(b, starts, clip=1.0, noise_std=0.5, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    big = [torch.zeros(50_000)]
    privatise(big, [torch.zeros(50_000)], clip=1.0, noise_std=0.5, seed=7)
    assert math.isclose(float(big[0].std()), 0.5, rel_tol=0.02)


def test_server_privacy_is_a_plain_value():
    privacy = ServerPrivacy(seed=1, round=3, sum_stddev=2.0)
    assert dataclasses.replace(privacy, sum_stddev=4.0).noise("encoder", "all", 10, 2) is not None
    assert ServerPrivacy(seed=1, round=3).noise("encoder", "all", 10, 2) is None
