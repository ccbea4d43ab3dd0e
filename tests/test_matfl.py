"""MaT-FL (docs/methods.md, MaTFL): encoders averaged within clusters of their deviations from the mean
(cosine distance, average linkage), decoders personal; the hand case, the limits K=1 and K=N,
the zero-deviation fall-back, participation, refusals of bad input, and one tiny run."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.cluster import hierarchy

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
from fedmtl.aggregation.functional import cosine_clusters, gram_matrix, group_means_to
from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.matfl import MaTFL
from tests.helpers import (
    MATH_CASES,
    TINY_CLIENTS,
    assert_relative,
    client_states,
    fit,
    math_round,
    round_from_trained,
    tiny_config,
)

# Four clients, mixed task sets (K = 5 decoders, across three tasks).
CLIENTS = [
    ClientInfo("A", "pascal_context", ("semseg",), 100),
    ClientInfo("B", "pascal_context", ("sal",), 100),
    ClientInfo("C", "nyud", ("semseg", "depth"), 80),
    ClientInfo("D", "nyud", ("depth",), 80),
]
LAYOUT = FlatLayout(names=("w",), shapes=((2,),), dtypes=(torch.float32,), tensor_layers=("",))
# The hand case: two pairs of nearly parallel deviations from the mean (0.5, 0.5).
ENCODERS = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]
DECODERS = [[0.5, -1.0], [2.0, 3.0], [-0.25, 0.75], [4.0, 0.5], [1.5, 1.5]]


def _round(
    encoders: list[list[float]] = ENCODERS,
    clients: list[ClientInfo] = CLIENTS,
    participants: tuple[int, ...] | None = None,
) -> RoundInput:
    """Trained encoders and decoders given as prev + Δ (the engine's form); a non-participant's
    row is its current parameters with a zero Δ."""
    enc = torch.tensor(encoders)
    dec = torch.tensor(DECODERS[: len(decoder_owners_of(clients))])
    enc_deltas = torch.full_like(enc, 0.25)
    dec_deltas = torch.linspace(-0.5, 0.5, dec.numel()).reshape(dec.shape)
    if participants is not None:
        for i in set(range(len(clients))) - set(participants):
            enc_deltas[i] = 0
            for k, (owner, _) in enumerate(decoder_owners_of(clients)):
                if owner == i:
                    dec_deltas[k] = 0
    return round_from_trained(clients, LAYOUT, enc, enc_deltas, dec, dec_deltas, participants)


def _trained(inputs: RoundInput) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs.encoders_prev + inputs.encoder_deltas, inputs.decoders_prev + inputs.decoder_deltas


# ---------------------------------------------------------------------------- hand case


def test_hand_case_clusters():
    """The hand case: deviations from the mean (0.5, 0.5) are (0.5,−0.5), (0.4,−0.4), (−0.5,0.5),
    (−0.4,0.4): two pairs at cosine distance 0 and 2 between them → {1,2} and {3,4}."""
    w = torch.tensor(ENCODERS, dtype=torch.float64)
    assert cosine_clusters(gram_matrix(w), 2) == [[0, 1], [2, 3]]


def test_hand_case_new_encoders_through_aggregate():
    """Averaging within the clusters: (0.95, 0.05) ×2 and (0.05, 0.95) ×2."""
    out = MaTFL().aggregate(_round())
    expected = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.05, 0.95], [0.05, 0.95]])
    torch.testing.assert_close(out.encoders, expected, rtol=0, atol=1e-6)
    assert torch.equal(out.encoders[0], out.encoders[1]) and torch.equal(out.encoders[2], out.encoders[3])


# ---------------------------------------------------------------------------- (b), (c)


def test_one_cluster_is_fedavg_on_encoders():
    """K=1: every encoder becomes the mean (0.5, 0.5), bit for bit FedAvg's (decoders aside)."""
    inputs = _round()
    out = MaTFL(num_clusters=1).aggregate(inputs)
    fedavg = FedAvg(decoder_scope="none").aggregate(inputs)
    assert torch.equal(out.encoders, fedavg.encoders)
    torch.testing.assert_close(out.encoders, torch.full((4, 2), 0.5), rtol=0, atol=1e-7)


def test_as_many_clusters_as_clients_leaves_every_encoder_as_trained():
    inputs = _round()
    out = MaTFL(num_clusters=4).aggregate(inputs)
    assert torch.equal(out.encoders, _trained(inputs)[0])


@pytest.mark.parametrize("num_clusters", [1, 2, 3, 4])
def test_decoders_are_returned_bitwise_as_trained(num_clusters):
    """Decoders are personal, whatever the encoders do."""
    inputs = _round()
    out = MaTFL(num_clusters=num_clusters).aggregate(inputs)
    out.check_against(inputs)
    assert torch.equal(out.decoders, _trained(inputs)[1])


def test_aggregate_does_not_modify_its_input():
    inputs = _round()
    before = [t.clone() for t in (inputs.encoders_prev, inputs.encoder_deltas, inputs.decoders_prev)]
    MaTFL().aggregate(inputs)
    after = (inputs.encoders_prev, inputs.encoder_deltas, inputs.decoders_prev)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


# ---------------------------------------------------------------------------- edge cases


def test_a_zero_deviation_falls_back_to_one_cluster():
    """Encoders (1,0), (0,1), (0.5,0.5): the third is the mean, its deviation is 0 and its
    cosine undefined, so the round is FedAvg: all three become (0.5, 0.5)."""
    encoders = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    assert cosine_clusters(gram_matrix(torch.tensor(encoders, dtype=torch.float64)), 2) == [[0, 1, 2]]
    out = MaTFL(num_clusters=2).aggregate(_round(encoders, CLIENTS[:3]))
    torch.testing.assert_close(out.encoders, torch.full((3, 2), 0.5), rtol=0, atol=1e-7)


def test_two_clients_in_two_clusters_is_local():
    """The pitfall of two clients: their deviations are exact opposites, two singletons."""
    inputs = _round(ENCODERS[:2], CLIENTS[:2])
    out = MaTFL(num_clusters=2).aggregate(inputs)
    trained_encoders, trained_decoders = _trained(inputs)
    assert torch.equal(out.encoders, trained_encoders)
    assert torch.equal(out.decoders, trained_decoders)


def test_clusters_follow_the_direction_of_the_deviations_not_their_size():
    """Deviations z = (1,0), (9,0.1), (−5,0.1), (−5,−0.2): by cosine {1,2} and {3,4}. By
    Euclidean distance z1 would join {3,4} (6 away, against 8 from z2), so this checks the
    metric. Scaling every model, or shifting all by a common offset (the mean moves, the
    deviations do not), leaves the clusters alone."""
    z = torch.tensor([[1.0, 0.0], [9.0, 0.1], [-5.0, 0.1], [-5.0, -0.2]], dtype=torch.float64)
    euclidean = hierarchy.linkage(z.numpy(), method="average", metric="euclidean")
    labels = hierarchy.cut_tree(euclidean, n_clusters=2)[:, 0].tolist()
    assert labels[0] == labels[2] == labels[3] != labels[1]
    for w in (z, 1e-3 * z, 250.0 * z, z + torch.tensor([100.0, -40.0], dtype=torch.float64)):
        assert cosine_clusters(gram_matrix(w), 2) == [[0, 1], [2, 3]]


def test_non_participants_keep_their_rows_and_are_not_clustered():
    """Participants A, B, C train; D does not. Among the three (mean (0.63, 0.37)) the deviations
    are (0.37,−0.37), (0.27,−0.27), (−0.63,0.63): A and B together, C alone. So A, B → (0.95, 0.05),
    C keeps (0, 1), and D keeps its row bit for bit (clustered with all four, C and D would have
    been averaged)."""
    inputs = _round(participants=(0, 1, 2))
    out = MaTFL().aggregate(inputs)
    trained_encoders, trained_decoders = _trained(inputs)
    torch.testing.assert_close(out.encoders[:2], torch.tensor([[0.95, 0.05]] * 2), rtol=0, atol=1e-6)
    assert torch.equal(out.encoders[2], trained_encoders[2])
    assert torch.equal(out.encoders[3], inputs.encoders_prev[3])
    assert torch.equal(out.decoders, trained_decoders)


def test_participants_no_more_than_clusters_are_singletons():
    """Two participants and two clusters: each keeps its own trained encoder."""
    inputs = _round(participants=(1, 3))
    out = MaTFL().aggregate(inputs)
    assert torch.equal(out.encoders, _trained(inputs)[0])


# ---------------------------------------------------------------------------- bad input


def test_check_run_refuses_more_clusters_than_clients():
    method = MaTFL(num_clusters=4)
    with pytest.raises(ValueError, match=r"--algorithm\.num_clusters"):
        method.check_run(rounds=2, num_clients=3)
    with pytest.raises(ValueError, match=r"--algorithm\.num_clusters"):
        method.setup(2, CLIENTS[:3], seed=0)
    method.check_run(rounds=2, num_clients=4)  # as many clusters as clients is allowed


@pytest.mark.parametrize("value", [0, -1, True, False, 1.5])
def test_num_clusters_must_be_an_integer_of_at_least_one(value):
    with pytest.raises(ValueError, match=r"algorithm\.num_clusters"):
        MaTFL(num_clusters=value)
    with pytest.raises(ValueError, match=r"algorithm\.num_clusters"):
        create_method("MaTFL", num_clusters=value)


def test_matfl_is_encoder_clustering_with_personal_decoders():
    method = MaTFL(num_clusters=3)
    assert (method.encoder_scope, method.decoder_scope, method.num_clusters) == ("cluster", "none", 3)
    assert MaTFL.evaluated == "post-aggregation"


# ---------------------------------------------------------------------------- end to end


def _is_parameter(key: str) -> bool:
    """State-dict keys of parameters, not BatchNorm statistics (which are never aggregated)."""
    return "running_" not in key and "num_batches" not in key


@pytest.fixture(scope="module")
def run(module_dir, data_root):
    """The tiny scenario (three clients) under MaT-FL with two clusters, two rounds."""
    tmp = module_dir
    fit(tiny_config(tmp, data_root, algorithm={"class_path": "MaTFL"}, rounds=2), tmp / "run")
    return tmp / "run"


def test_end_to_end_decoders_stay_personal_and_encoders_pair_up(run):
    """The two PASCAL single-task clients start from equal decoders (one init seed); after two
    rounds their decoders differ (never averaged). Three encoders in two clusters: exactly one
    pair of clients shares a bitwise-equal encoder, the third keeps its own."""
    results = json.loads((run / "results.json").read_text())
    assert results["algorithm"] == "MaTFL"
    assert results["evaluated"] == "post-aggregation"
    states = [s["model"] for s in client_states(run)]
    assert len(states) == TINY_CLIENTS
    semseg, sal = states[0], states[1]
    semseg_keys = [k for k in semseg if k.startswith("decoders.semseg.") and _is_parameter(k)]
    assert semseg_keys
    for key in semseg_keys:
        assert not torch.equal(semseg[key], sal[key.replace("decoders.semseg.", "decoders.sal.")]), key

    encoder_keys = [k for k in semseg if k.startswith("encoder.") and _is_parameter(k)]

    def same_encoder(a: dict, b: dict) -> bool:
        return all(torch.equal(a[k], b[k]) for k in encoder_keys)

    pairs = [(i, j) for i in range(3) for j in range(i + 1, 3) if same_encoder(states[i], states[j])]
    assert len(pairs) == 1, pairs


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", list(MATH_CASES))
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients: the participants' trained
    encoders are clustered (at most as many clusters as participants: then singletons) and
    averaged within their cluster; everyone else, and every decoder, keeps what it trained."""
    participants = list(MATH_CASES[case])
    inputs = math_round(participants)
    out = MaTFL(num_clusters=2, participation=0.6 if case == "sampled" else 1.0).aggregate(inputs)
    out.check_against(inputs)
    trained = inputs.encoders_prev + inputs.encoder_deltas
    if len(participants) <= 2:
        clusters = [[i] for i in participants]
    else:
        local = cosine_clusters(gram_matrix(trained[participants]), 2)
        clusters = [[participants[j] for j in cluster] for cluster in local]
    encoders = group_means_to(inputs.encoders_prev, inputs.encoder_deltas, [(c, c) for c in clusters])
    assert_relative(out.encoders, encoders)
    assert_relative(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
