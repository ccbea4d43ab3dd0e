"""FedAvg-HC (docs/methods.md, FedAvg) and its aggregation scopes: the hand cases, every scope of
each pool, client sampling, and the write-back that leaves heads and BatchNorm statistics alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
from fedmtl.aggregation.functional import group_means, group_means_to
from fedmtl.methods import FedAvg, create_method
from fedmtl.models import MultiTaskModel
from tests.helpers import (
    HAND_DECODER_DELTAS,
    HAND_DECODERS_PREV,
    HAND_DECODERS_TRAINED,
    HAND_ENCODERS_TRAINED,
    MATH_CASES,
    TINY_BACKBONE,
    assert_relative,
    hand_clients,
    hand_round,
    math_round,
)

# ---------------------------------------------------------------------------- hand cases


def test_hand_case_encoders_three_and_every_decoder_two_one():
    """Hand case: encoders 1, 2, 6 → 3 everywhere; the four decoders of three different tasks
    → (2, 1) in every slot (the paper's FedAvg pools decoders across tasks)."""
    out = FedAvg().aggregate(hand_round())
    assert torch.equal(out.encoders, torch.full((3, 1), 3.0))
    assert torch.equal(out.decoders, torch.tensor([[2.0, 1.0]] * 4))


def test_after_aggregation_all_encoders_and_all_decoders_are_bitwise_equal():
    """On rows whose mean is not exact in binary, every slot gets the same bits."""
    inputs = hand_round()
    inputs.encoder_deltas += torch.tensor([[0.1], [0.2], [0.3]])
    inputs.decoder_deltas += 0.1
    out = FedAvg().aggregate(inputs)
    assert all(torch.equal(row, out.encoders[0]) for row in out.encoders)
    assert all(torch.equal(row, out.decoders[0]) for row in out.decoders)


def test_sample_weighted_average_is_a_different_algorithm():
    """The weighting pitfall: shard sizes 1000/1000/795 and encoders 1, 2, 6 give 7770/2795 ≈ 2.78, not 3."""
    out = FedAvg(weighted=True).aggregate(hand_round())
    assert out.encoders[:, 0].tolist() == pytest.approx([7770 / 2795] * 3, rel=1e-6)
    assert round(out.encoders[0, 0].item(), 2) == 2.78


def test_group_means_to_is_the_plain_mean_for_one_group_of_all_rows():
    """The all-rows group is computed as mean(prev) + mean(Δ); it must equal the mean of
    the trained rows (exactly here: every value is a dyadic fraction)."""
    prev, deltas = torch.tensor(HAND_DECODERS_PREV), torch.tensor(HAND_DECODER_DELTAS)
    out = group_means(prev, deltas, [[0, 1, 2, 3]])
    assert torch.equal(out, torch.tensor(HAND_DECODERS_TRAINED).mean(0).expand(4, 2))


def test_group_means_to_writes_a_groups_mean_into_its_targets_only():
    prev, deltas = torch.tensor(HAND_DECODERS_PREV), torch.tensor(HAND_DECODER_DELTAS)
    out = group_means_to(prev, deltas, [([0, 2], [0, 1, 2])])
    assert torch.equal(out[:3], torch.tensor([[0.5, 0.5]] * 3))  # mean of (1,1) and (0,0)
    assert torch.equal(out[3], torch.tensor([4.0, 0.0]))  # no target: trained as is
    with pytest.raises(ValueError, match="targets of two groups"):
        group_means_to(prev, deltas, [([0], [0, 1]), ([2], [1])])
    with pytest.raises(ValueError, match="outside 0..3"):
        group_means_to(prev, deltas, [([0, 4], [0])])


# ---------------------------------------------------------------------------- scopes


def test_same_task_scope_averages_decoders_of_one_task_and_encoders_of_one_task_set():
    """The two semseg decoders (A's (1,1) and C's (0,0)) meet at (0.5, 0.5); depth and normals
    have one decoder each and keep it. Every client has its own task set: encoders unchanged."""
    out = FedAvg(encoder_scope="same_task", decoder_scope="same_task").aggregate(hand_round())
    assert torch.equal(out.encoders, torch.tensor(HAND_ENCODERS_TRAINED))
    assert torch.equal(out.decoders, torch.tensor([[0.5, 0.5], [3.0, 3.0], [0.5, 0.5], [4.0, 0.0]]))


def test_same_task_encoders_group_clients_with_equal_task_sets():
    clients = [hand_clients()[0], ClientInfo("A2", "pascal_context", ("semseg",), 10), hand_clients()[2]]
    inputs = hand_round()
    inputs = RoundInput(
        **{**inputs.__dict__, "clients": clients, "decoder_owners": decoder_owners_of(clients)}
    )
    out = FedAvg(encoder_scope="same_task").aggregate(inputs)
    assert out.encoders[:, 0].tolist() == [1.5, 1.5, 6.0]


def test_none_scope_returns_the_trained_rows_bitwise():
    inputs = hand_round()
    out = FedAvg(encoder_scope="none", decoder_scope="none").aggregate(inputs)
    assert torch.equal(out.encoders, inputs.encoders_prev + inputs.encoder_deltas)
    assert torch.equal(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)


def test_cluster_scope_averages_decoders_within_cosine_clusters():
    """Deviations from the mean decoder (2, 1): A (−1, 0), B (1, 2), C (−2, −1), C′ (2, −1).
    Cosine distances: A–C 0.106 (merged first), B–C′ 1.0, and from {A, C} the average
    linkage to B is 1.62 and to C′ 1.75, so B joins C′: semseg meets semseg, depth meets normals."""
    out = FedAvg(encoder_scope="none", decoder_scope="cluster", num_clusters=2).aggregate(hand_round())
    assert torch.equal(out.decoders, torch.tensor([[0.5, 0.5], [3.5, 1.5], [0.5, 0.5], [3.5, 1.5]]))


@pytest.mark.parametrize("scope", ["encoder_scope", "decoder_scope"])
def test_an_unknown_scope_names_the_field(scope):
    with pytest.raises(ValueError, match=rf"algorithm\.{scope} must be one of"):
        create_method("FedAvg", **{scope: "tasks"})


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_cluster_counts_name_the_field(bad):
    with pytest.raises(ValueError, match=r"algorithm\.num_clusters"):
        FedAvg(num_clusters=bad)


def test_more_clusters_than_clients_is_refused_before_the_run():
    FedAvg(num_clusters=9).check_run(rounds=2, num_clients=3)  # no cluster scope: irrelevant
    with pytest.raises(ValueError, match=r"set --algorithm.num_clusters to at most 3"):
        FedAvg(decoder_scope="cluster", num_clusters=4).check_run(rounds=2, num_clients=3)


# ---------------------------------------------------------------------------- client sampling


def test_with_sampling_the_mean_is_over_participants_and_reaches_everyone():
    """Clients A and C trained: encoders mean(1, 6) = 3.5 for all three; decoders the mean of
    A's and C's three decoders, (4/3, 1/3), also written into B's depth decoder."""
    out = FedAvg().aggregate(hand_round(participants=(0, 2)))
    assert torch.equal(out.encoders, torch.full((3, 1), 3.5))
    expected = torch.tensor(HAND_DECODERS_TRAINED)[[0, 2, 3]].mean(0)
    torch.testing.assert_close(out.decoders, expected.expand(4, 2), rtol=1e-6, atol=0)


def test_with_sampling_a_same_task_group_without_participants_is_left_alone():
    """B (depth) sat out: its decoder is the only depth decoder and keeps its values."""
    out = FedAvg(decoder_scope="same_task").aggregate(hand_round(participants=(0, 2)))
    assert torch.equal(out.decoders[1], torch.tensor(HAND_DECODERS_TRAINED[1]))
    assert torch.equal(out.decoders[0], torch.tensor([0.5, 0.5]))


# ---------------------------------------------------------------------------- the write-back


def test_receive_overwrites_encoder_and_decoders_and_leaves_heads_and_bn_statistics():
    """Heads and BatchNorm buffers are bitwise unchanged by the server's output;
    encoder and decoder parameters become exactly the rows received."""
    torch.manual_seed(0)
    model = MultiTaskModel("nyud", ("semseg", "depth"), img_size=(32, 32), backbone=TINY_BACKBONE)
    for module in model.modules():  # make the BN statistics non-trivial
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    encoder_layout = FlatLayout.from_module(model.encoder)
    decoder_layout = FlatLayout.from_module(model.decoders["semseg"])
    encoder_row = torch.full((encoder_layout.numel,), 0.25)
    decoder_rows = {t: torch.full((decoder_layout.numel,), 0.5) for t in ("semseg", "depth")}
    ctx = SimpleNamespace(model=model, encoder_layout=encoder_layout, decoder_layout=decoder_layout)
    FedAvg().receive(ctx, encoder_row, decoder_rows)

    assert all(bool((p == 0.25).all()) for p in model.encoder.parameters())
    assert all(bool((p == 0.5).all()) for p in model.decoders.parameters())
    after = model.state_dict()
    written = {id(p) for p in [*model.encoder.parameters(), *model.decoders.parameters()]}
    untouched = [k for k, v in model.state_dict(keep_vars=True).items() if id(v) not in written]
    assert any(k.startswith("heads.") for k in untouched) and any("running_mean" in k for k in untouched)
    for key in untouched:
        assert torch.equal(after[key], before[key]), key


# ---------------------------------------------------------------------------- the one server step


def _math_groups(scope: str, keys: list[str], sources: list[int]) -> list[tuple[list[int], list[int]]]:
    """A scope's (sources, targets) groups, written out for the functional math."""
    if scope == "all":
        return [(sources, list(range(len(keys))))]
    if scope == "none":
        return []
    members = {key: [r for r, k in enumerate(keys) if k == key] for key in keys}
    return [([r for r in rows if r in sources], rows) for rows in members.values()]


@pytest.mark.parametrize("case", list(MATH_CASES))
@pytest.mark.parametrize("scope", ["all", "same_task", "none"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(scope, case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients: non-participants with zero
    deltas; each group's mean over its members that trained goes to all its members."""
    participants = list(MATH_CASES[case])
    inputs = math_round(participants)
    method = FedAvg(encoder_scope=scope, decoder_scope=scope, participation=0.6 if case == "sampled" else 1.0)
    out = method.aggregate(inputs)
    out.check_against(inputs)
    enc_keys = ["+".join(sorted(c.tasks)) for c in inputs.clients]
    dec_keys = [task for _, task in inputs.decoder_owners]
    dec_sources = [k for k, (i, _) in enumerate(inputs.decoder_owners) if i in participants]
    encoders = group_means_to(
        inputs.encoders_prev, inputs.encoder_deltas, _math_groups(scope, enc_keys, participants)
    )
    decoders = group_means_to(
        inputs.decoders_prev, inputs.decoder_deltas, _math_groups(scope, dec_keys, dec_sources)
    )
    assert_relative(out.encoders, encoders)
    assert_relative(out.decoders, decoders)
