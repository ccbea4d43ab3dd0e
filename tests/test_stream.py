"""The one server step's encoders (fedmtl/aggregation/stream.py): the reductions over column
blocks, the EncoderMix, and — for every method — ``Method.aggregate`` (the step on encoder
stacks) giving what the engine forms from row blocks, client by client, with participation and
over several rounds of server state."""

from __future__ import annotations

import copy

import pytest
import torch

from fedmtl.aggregation import (
    ClientInfo,
    FlatLayout,
    HeadGroup,
    RoundInput,
    decoder_owners_of,
    head_groups_of,
)
from fedmtl.aggregation.stream import EncoderMix, EncoderRows, StackedRows
from fedmtl.methods import create_method
from fedmtl.methods.fedopt import FedOpt

P = 1000  # encoder columns: blocks of 97 leave a ragged last block


class Counting(StackedRows):
    """StackedRows that remembers which rows it read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: set[int] = set()

    def read(self, rows, columns):
        self.seen |= set(rows)
        return super().read(rows, columns)


@pytest.mark.parametrize("block", [1, 97, P, None])
def test_gram_and_weighted_sums_equal_the_stacked_products(block):
    torch.manual_seed(0)
    x = torch.randn(6, P)
    extra = torch.randn(P)
    rows = StackedRows("delta", x, block_columns=block)
    expected = torch.cat([x, extra[None]]).double()
    torch.testing.assert_close(rows.gram([extra]), expected @ expected.T, rtol=1e-12, atol=1e-9)
    some = x[[4, 1]].double()
    torch.testing.assert_close(rows.gram(rows=[4, 1]), some @ some.T, rtol=1e-12, atol=1e-9)
    weights = torch.rand(3, 6, dtype=torch.float64)
    torch.testing.assert_close(rows.weighted_sums(weights), (weights @ x.double()).float())


def test_rows_without_weight_are_never_read():
    rows = Counting("trained", torch.randn(5, P), block_columns=300)
    weights = torch.zeros(2, 5, dtype=torch.float64)
    weights[0, 1], weights[1, 3] = 1.0, 0.5
    rows.weighted_sums(weights)
    assert rows.seen == {1, 3}


def test_bad_shapes_are_refused():
    rows = StackedRows("delta", torch.zeros(3, 10))
    with pytest.raises(ValueError, match=r"shape \[G, 3\]"):
        rows.weighted_sums(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"extra row must have shape \[10\]"):
        rows.gram([torch.zeros(9)])
    with pytest.raises(ValueError, match=r"mix takes weights \[3, 3\]"):
        rows.mix(torch.zeros(2, 3), into="cloud")
    with pytest.raises(ValueError, match="does not make it"):
        create_method("FedAvg").encoder_row("masked", torch.zeros(2), torch.zeros(2), ENCODER)


def test_mix_makes_a_row_per_client():
    torch.manual_seed(1)
    x = torch.randn(4, P)
    weights = torch.rand(4, 4, dtype=torch.float64)
    rows = StackedRows("trained", x, block_columns=97)
    rows.mix(weights, into="cloud")
    torch.testing.assert_close(rows.made["cloud"], (weights @ x.double()).float())


def test_encoder_mix_row_combines_own_rows_and_vectors():
    vectors = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
    mix = EncoderMix(
        vectors=vectors,
        mixing=torch.tensor([[1.0, 0.5], [0.0, 0.0]], dtype=torch.float64),
        own={
            "trained": torch.tensor([1.0, 1.0], dtype=torch.float64),
            "delta": torch.tensor([-1.0, 0.0], dtype=torch.float64),
        },
    )
    trained, delta = torch.tensor([3.0, 4.0]), torch.tensor([1.0, 1.0])
    # 3 - 1 + 1 + 5 = 8; 4 - 1 + 2 + 10 = 15
    assert mix.needs(0) == ["trained", "delta"] and mix.needs(1) == ["trained"]
    assert mix.row(0, {"trained": trained, "delta": delta}).tolist() == [8.0, 15.0]
    assert mix.keeps(1) and mix.row(1, {"trained": trained}).tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match=r"needs its rows \['delta'\]"):
        mix.row(0, {"trained": trained})


def test_encoder_mix_rows_equal_its_row_by_row():
    torch.manual_seed(2)
    n, p = 5, 40
    own_rows = {name: torch.randn(n, p) for name in ("trained", "delta", "cloud")}
    mixing = torch.rand(n, 3, dtype=torch.float64)
    mixing[1] = 0.0  # client 1 keeps what it trained
    own = {
        "trained": torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0], dtype=torch.float64),
        "delta": torch.tensor([-1.0, 0.0, 0.0, 2.0, 0.0], dtype=torch.float64),
        "cloud": torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64),
    }
    mix = EncoderMix(torch.randn(3, p), mixing, own)
    rows = mix.rows(own_rows)
    assert rows.dtype == torch.float32 and rows.shape == (n, p)
    for i in range(n):
        torch.testing.assert_close(rows[i], mix.row(i, {k: v[i] for k, v in own_rows.items()}))
    assert torch.equal(rows[1], own_rows["trained"][1])
    with pytest.raises(ValueError, match=r"need the rows \['cloud'\]"):
        mix.rows({"trained": own_rows["trained"], "delta": own_rows["delta"]})


# ---------------------------------------------------------------------------- methods


def _layout(shapes, layers) -> FlatLayout:
    names = tuple(f"t{k}" for k in range(len(shapes)))
    return FlatLayout(names=names, shapes=shapes, dtypes=(torch.float32,) * len(shapes), tensor_layers=layers)


CLIENTS = [
    *(ClientInfo(f"pc-semseg-{k}", "pascal_context", ("semseg",), 10 + k) for k in range(3)),
    *(ClientInfo(f"pc-normals-{k}", "pascal_context", ("normals",), 7 + k) for k in range(2)),
    *(ClientInfo(f"nyud-{k}", "nyud", ("semseg", "depth"), 5 + 3 * k) for k in range(2)),
]
ENCODER = _layout(((600,), (300,), (100,)), ("a", "b", "b"))
DECODER = _layout(((8, 4), (8,), (16,)), ("conv", "conv", "fuse"))


def _round(round_: int, participants=None, heads=False, seed=0) -> tuple[RoundInput, torch.Tensor]:
    """A round whose trained rows are drawn first, as the engine measures them: Δ = trained − prev."""
    g = torch.Generator().manual_seed(seed + round_)
    n, k = len(CLIENTS), len(decoder_owners_of(CLIENTS))

    def pair(rows: int, numel: int, trained_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        prev = torch.randn(rows, numel, generator=g)
        trained = prev + 0.1 * torch.randn(rows, numel, generator=g)
        frozen = [r for r in range(rows) if r not in trained_rows]
        trained[frozen] = prev[frozen]  # a client that sat the round out: zero delta
        return prev, trained - prev

    taking_part = list(range(n)) if participants is None else list(participants)
    owners = decoder_owners_of(CLIENTS)
    enc_prev, enc_delta = pair(n, ENCODER.numel, taking_part)
    dec_prev, dec_delta = pair(k, DECODER.numel, [r for r, (i, _) in enumerate(owners) if i in taking_part])
    groups = []
    if heads:
        for dataset, task, members in head_groups_of(CLIENTS):
            layout = _layout(((3,),), ("h",))
            prev, delta = pair(len(members), 3, [j for j, i in enumerate(members) if i in taking_part])
            groups.append(HeadGroup(dataset, task, layout, members, prev, delta))
    inputs = RoundInput(
        round=round_,
        clients=CLIENTS,
        encoder_layout=ENCODER,
        encoders_prev=enc_prev,
        encoder_deltas=enc_delta,
        decoder_layout=DECODER,
        decoder_owners=owners,
        decoders_prev=dec_prev,
        decoder_deltas=dec_delta,
        participants=participants,
        heads=groups,
    )
    return inputs, enc_prev + enc_delta


def _stripped(inputs: RoundInput) -> RoundInput:
    """``inputs`` as the engine's streamed round gives them: without encoder stacks."""
    stripped = copy.copy(inputs)
    stripped.encoders_prev = stripped.encoder_deltas = None
    return stripped


def _streamed(method, inputs: RoundInput, trained: torch.Tensor):
    """The server step as the engine's streamed round runs it: rows only for the clients that
    trained (every client's for a method that reads them), read 97 columns at a time, and each
    client's encoder formed on its own from the EncoderMix."""
    prev, taking_part = inputs.encoders_prev, set(inputs.participating_clients)

    def row(name: str, i: int) -> torch.Tensor:
        if i in taking_part:
            return method.encoder_row(name, prev[i], trained[i], inputs.encoder_layout)
        if method.reads_every_client:
            return method.encoder_row(name, prev[i], prev[i], inputs.encoder_layout)
        return torch.zeros_like(prev[i])

    rows = {
        name: StackedRows(name, torch.stack([row(name, i) for i in range(len(prev))]), block_columns=97)
        for name in method.encoder_rows(inputs.round)
    }
    stripped = _stripped(inputs)
    output = method.server_step(stripped, rows)
    output.check_against(stripped)
    own = {name: r.stack for name, r in rows.items()}
    for r in rows.values():
        own |= r.made
    own["trained"] = trained  # the encoder the client trained (its model holds it), not its row
    encoders = torch.stack(
        [output.encoders.row(i, {name: stack[i] for name, stack in own.items()}) for i in range(len(prev))]
    )
    return encoders, output


METHODS_UNDER_TEST = {
    "FedAvg": {},
    "FedAvg-same-task-weighted": {"class_path": "FedAvg", "encoder_scope": "same_task", "weighted": True},
    "FedAvg-encoders-local": {"class_path": "FedAvg", "encoder_scope": "none"},
    "FedAvg-unified": {"class_path": "FedAvg", "decoder_scope": "same_task", "head_scope": "same_task"},
    "FedAvg-sampled": {"class_path": "FedAvg", "participation": 0.5},
    "FedAvg-clustered-sampled": {"class_path": "FedAvg", "encoder_scope": "cluster", "participation": 0.72},
    "MaTFL": {},
    "MaTFL-3": {"class_path": "MaTFL", "num_clusters": 3},
    "FedProx": {},
    "FedPer": {},
    "FedBABU": {},
    "Ditto": {},
    "FedSTA": {},
    "Local": {},
    "FedOpt": {},
    "FedOpt-yogi-same-task-sampled": {
        "class_path": "FedOpt",
        "server_optimizer": "yogi",
        "encoder_scope": "same_task",
        "participation": 0.6,
    },
    "FedDEA": {},
    "FedDEA-tensor-fedopt": {"class_path": "FedDEA", "scope": "tensor", "host": FedOpt()},
    "FedAMP": {"sigma": 1000.0, "alpha_k": 500.0},
    "FedAMP-heuristic-sampled": {"class_path": "FedAMP", "kernel": "heuristic", "participation": 0.5},
    "FedHCA2": {},
    "FedHCA2-fedavg-encoders": {"class_path": "FedHCA2", "encoder": "fedavg"},
    "FedHCA2-local-encoders": {"class_path": "FedHCA2", "encoder": "none"},
}


@pytest.mark.parametrize("name", list(METHODS_UNDER_TEST))
def test_aggregate_gives_what_the_engine_forms_from_row_blocks(name):
    options = copy.deepcopy(METHODS_UNDER_TEST[name])  # a host in it is a method, with server state
    method = create_method(options.pop("class_path", name), **options)
    rounds = 5  # FedSTA's phase B is the last round; FedHCA²'s α and β learn from round 2 on
    method.setup(rounds, CLIENTS, seed=0)
    stacked, streamed = method, copy.deepcopy(method)
    for round_ in range(1, rounds + 1):
        participants = tuple(stacked.participants(round_) or ()) or None
        inputs, trained = _round(round_, participants, heads=stacked.shares_heads)
        expected = stacked.aggregate(inputs)
        expected.check_against(inputs)
        encoders, output = _streamed(streamed, inputs, trained)
        # Up to float rounding (other column blocks; all at once against client by client)
        error = (encoders - expected.encoders).norm(dim=1) / expected.encoders.norm(dim=1)
        assert float(error.max()) <= 1e-6, (name, round_, error.tolist())
        assert torch.equal(output.decoders, expected.decoders)
        for got, want in zip(output.heads or [], expected.heads or [], strict=True):
            assert torch.equal(got, want)
        assert streamed.log_values() == pytest.approx(stacked.log_values(), rel=1e-6, abs=1e-9)


def test_a_mix_keeps_what_each_client_trained_where_nothing_is_averaged():
    method = create_method("FedAvg", encoder_scope="none")
    inputs, trained = _round(1)
    encoders, _ = _streamed(method, inputs, trained)
    assert torch.equal(encoders, trained)
    assert torch.equal(method.aggregate(inputs).encoders, trained)


def test_every_registered_method_has_one_server_step():
    from fedmtl.methods import METHODS
    from fedmtl.methods.base import Method

    for name in METHODS.names():
        method = create_method(name)
        assert not hasattr(method, "streams") and not hasattr(method, "aggregate_streamed"), name
        assert type(method).aggregate is Method.aggregate, f"{name} overrides aggregate"
        assert type(method).server_step is not Method.server_step, f"{name} has no server_step"


def test_a_method_without_a_server_step_says_so():
    from fedmtl.methods.base import Method

    class Nothing(Method):
        pass

    with pytest.raises(NotImplementedError, match="Nothing has no server step"):
        Nothing().aggregate(_round(1)[0])


def test_aggregate_needs_the_encoder_stacks():
    with pytest.raises(ValueError, match=r"FedAvg.aggregate needs the encoder stacks .*call server_step"):
        create_method("FedAvg").aggregate(_stripped(_round(1)[0]))


def test_aggregate_keeps_the_inputs_dtype_and_device_and_leaves_them_as_they_were():
    inputs, _ = _round(1)
    inputs = copy.copy(inputs)
    inputs.encoders_prev, inputs.encoder_deltas = (
        inputs.encoders_prev.double(),
        inputs.encoder_deltas.double(),
    )
    before = inputs.encoders_prev.clone(), inputs.encoder_deltas.clone()
    output = create_method("FedHCA2").aggregate(inputs)
    output.check_against(inputs)
    assert output.encoders.dtype == torch.float64
    assert torch.equal(inputs.encoders_prev, before[0]) and torch.equal(inputs.encoder_deltas, before[1])


def test_a_server_step_output_must_be_a_mix_of_every_client():
    inputs, trained = _round(1)
    stripped = _stripped(inputs)
    output = create_method("FedAvg").aggregate(inputs)
    with pytest.raises(ValueError, match="must be an EncoderMix of one row per client"):
        output.check_against(stripped)


def test_rows_the_method_did_not_name_are_not_there():
    inputs, trained = _round(1)
    stripped = _stripped(inputs)
    with pytest.raises(KeyError, match="trained"):
        create_method("FedAvg").server_step(stripped, {"delta": StackedRows("delta", inputs.encoder_deltas)})


def test_encoder_rows_is_an_abstract_reader():
    with pytest.raises(TypeError):
        EncoderRows("delta", 2, 3)  # read() and write() are what a row source must say
