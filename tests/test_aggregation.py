"""The aggregation API and its first aggregators, against small hand-computed cases."""

import dataclasses

import pytest
import torch
from jsonargparse import ArgumentParser

import fedmtl.methods as methods
from fedmtl.aggregation import (
    Aggregator,
    ClientInfo,
    FlatLayout,
    RoundInput,
    RoundOutput,
    decoder_owners_of,
    mean_rows,
)
from fedmtl.methods import (
    METHODS,
    FedAvg,
    Local,
    Method,
    create_method,
    register_method,
)
from fedmtl.models import MultiTaskModel

DTYPES = [torch.float32, torch.float64]

# Three clients, four decoders of three different tasks:
# c0 PASCAL (semseg), c1 PASCAL (human_parts), c2 NYUD (semseg, depth); 1:2:3 samples.
CLIENTS = [
    ClientInfo("c0", "pascal_context", ("semseg",), 1),
    ClientInfo("c1", "pascal_context", ("human_parts",), 2),
    ClientInfo("c2", "nyud", ("semseg", "depth"), 3),
]
OWNERS = [(0, "semseg"), (1, "human_parts"), (2, "semseg"), (2, "depth")]
ENCODER_LAYOUT = FlatLayout(names=("w",), shapes=((2,),), dtypes=(torch.float32,), tensor_layers=("",))
DECODER_LAYOUT = FlatLayout(
    names=("a", "b"), shapes=((1,), (1,)), dtypes=(torch.float32,) * 2, tensor_layers=("la", "lb")
)
ENCODERS_PREV = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
ENCODER_DELTAS = [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]  # trained: [2, 2], [3, 5], [7, 8]
DECODERS_PREV = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 4.0]]
DECODER_DELTAS = [[1.0, 1.0], [0.0, 0.0], [-1.0, 1.0], [1.0, -1.0]]  # trained: [1,1] [1,1] [1,3] [4,3]


def _round(dtype=torch.float32, device="cpu", **overrides) -> RoundInput:
    fields = dict(
        round=1,
        clients=CLIENTS,
        encoder_layout=ENCODER_LAYOUT,
        encoders_prev=torch.tensor(ENCODERS_PREV, dtype=dtype, device=device),
        encoder_deltas=torch.tensor(ENCODER_DELTAS, dtype=dtype, device=device),
        decoder_layout=DECODER_LAYOUT,
        decoder_owners=OWNERS,
        decoders_prev=torch.tensor(DECODERS_PREV, dtype=dtype, device=device),
        decoder_deltas=torch.tensor(DECODER_DELTAS, dtype=dtype, device=device),
    )
    fields.update(overrides)
    return RoundInput(**fields)


# --- functional -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_rows_unweighted_and_weighted(dtype):
    x = torch.tensor([[2.0, 2.0], [3.0, 5.0], [7.0, 8.0]], dtype=dtype)
    torch.testing.assert_close(mean_rows(x), torch.tensor([4.0, 5.0], dtype=dtype))
    expected = torch.tensor([29 / 6, 6.0], dtype=dtype)  # (2 + 2*3 + 3*7) / 6, (2 + 2*5 + 3*8) / 6
    torch.testing.assert_close(mean_rows(x, [1, 2, 3]), expected)
    torch.testing.assert_close(mean_rows(x, torch.tensor([10.0, 20.0, 30.0])), expected)  # normalised
    torch.testing.assert_close(mean_rows(x, [0, 1, 0]), x[1])
    assert mean_rows(x, [1, 2, 3]).dtype == dtype


def test_mean_rows_rejects_bad_weights_and_shapes():
    x = torch.ones(3, 2)
    with pytest.raises(ValueError, match="non-negative"):
        mean_rows(x, [1, -1, 1])
    with pytest.raises(ValueError, match="positive sum"):
        mean_rows(x, [0, 0, 0])
    with pytest.raises(ValueError, match=r"shape \[3\]"):
        mean_rows(x, [1, 2])
    with pytest.raises(ValueError, match=r"\[M, P\]"):
        mean_rows(torch.ones(3))


# --- FedAvg and Local -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_fedavg_unweighted_averages_trained_encoders_and_all_decoders_of_all_tasks(dtype):
    out = FedAvg().aggregate(_round(dtype))
    encoder = torch.tensor([4.0, 5.0], dtype=dtype)  # mean of [2, 2], [3, 5], [7, 8]
    decoder = torch.tensor([7 / 4, 2.0], dtype=dtype)  # mean of [1, 1], [1, 1], [1, 3], [4, 3]
    torch.testing.assert_close(out.encoders, encoder.expand(3, 2))
    torch.testing.assert_close(out.decoders, decoder.expand(4, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fedavg_weighted_by_sample_counts(dtype):
    out = FedAvg(weighted=True).aggregate(_round(dtype))
    encoder = torch.tensor([29 / 6, 6.0], dtype=dtype)  # weights 1:2:3
    # Decoders weigh their client's count: 1, 2, 3, 3 (sum 9).
    decoder = torch.tensor([(1 + 2 + 3 + 12) / 9, (1 + 2 + 9 + 9) / 9], dtype=dtype)
    torch.testing.assert_close(out.encoders, encoder.expand(3, 2))
    torch.testing.assert_close(out.decoders, decoder.expand(4, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_local_keeps_each_clients_trained_parameters(dtype):
    inputs = _round(dtype)
    out = Local().aggregate(inputs)
    torch.testing.assert_close(out.encoders, torch.tensor([[2.0, 2.0], [3.0, 5.0], [7.0, 8.0]], dtype=dtype))
    torch.testing.assert_close(
        out.decoders, torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 3.0], [4.0, 3.0]], dtype=dtype)
    )


@pytest.mark.parametrize("aggregator", [FedAvg(), FedAvg(weighted=True), Local()], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_aggregators_return_new_tensors_on_the_input_dtype_and_leave_inputs_alone(aggregator, dtype):
    inputs = _round(dtype)
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in tensors.items()}
    out = aggregator.aggregate(inputs)
    out.check_against(inputs)
    assert out.encoders.dtype == out.decoders.dtype == dtype
    for name, tensor in tensors.items():
        assert torch.equal(tensor, before[name]), f"{name} was modified"
    input_storage = {t.untyped_storage().data_ptr() for t in tensors.values()}
    assert out.encoders.untyped_storage().data_ptr() not in input_storage
    assert out.decoders.untyped_storage().data_ptr() not in input_storage
    # Rows are independent tensors: writing one client's result does not change another's.
    out.encoders[0].fill_(-1.0)
    assert out.encoders[1].ne(-1.0).all()


@pytest.mark.parametrize(
    "aggregator",
    [FedAvg(encoder_scope="none"), FedAvg(encoder_scope="none", weighted=True), Local()],
    ids=repr,
)
def test_aggregators_stay_on_the_input_device(aggregator):
    # The meta device has no data, so any hidden .cpu()/.cuda() or host sync would fail here.
    # The decoders are aggregated where they are; encoder rows the server step reads come to
    # the host a block at a time by design, so the aggregators here read none.
    inputs = _round(device="meta")
    out = aggregator.aggregate(inputs)
    assert out.encoders.device.type == out.decoders.device.type == "meta"
    out.check_against(inputs)


def test_output_check_catches_a_wrong_shape():
    inputs = _round()
    with pytest.raises(ValueError, match="output decoders"):
        RoundOutput(encoders=inputs.encoders_prev, decoders=inputs.decoders_prev[:3]).check_against(inputs)


# --- RoundInput -----------------------------------------------------------------------


def test_round_input_helpers():
    inputs = _round()
    assert inputs.num_clients == 3 and inputs.num_decoders == 4
    assert decoder_owners_of(CLIENTS) == OWNERS
    assert inputs.client_num_samples == [1, 2, 3]
    assert inputs.decoder_num_samples == [1, 2, 3, 3]


def test_homogeneous_groups_share_dataset_and_task_set():
    clients = [
        ClientInfo("a", "pascal_context", ("semseg",), 5),
        ClientInfo("b", "nyud", ("semseg",), 5),
        ClientInfo("c", "pascal_context", ("semseg", "sal"), 5),
        ClientInfo("d", "pascal_context", ("semseg",), 7),
        ClientInfo("e", "pascal_context", ("sal", "semseg"), 5),  # same set as c, other order
        ClientInfo("f", "pascal_context", ("sal",), 5),
    ]
    k = sum(len(c.tasks) for c in clients)
    inputs = _round(
        clients=clients,
        encoders_prev=torch.zeros(6, 2),
        encoder_deltas=torch.zeros(6, 2),
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=torch.zeros(k, 2),
        decoder_deltas=torch.zeros(k, 2),
    )
    assert inputs.homogeneous_groups() == [[0, 3], [1], [2, 4], [5]]


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"encoder_deltas": torch.zeros(3, 3)}, ValueError, r"encoder_deltas has shape \(3, 3\)"),
        ({"encoders_prev": torch.zeros(2, 2)}, ValueError, r"encoders_prev has shape \(2, 2\); expected \[3"),
        (
            {"decoders_prev": torch.zeros(4, 3)},
            ValueError,
            r"decoders_prev .* expected \[4 \(K decoders\), 2",
        ),
        ({"decoder_deltas": torch.zeros(4, 2, dtype=torch.float64)}, ValueError, "float64"),
        ({"encoder_deltas": torch.zeros(3, 2, dtype=torch.long)}, TypeError, "floating point"),
        (
            {"decoder_owners": [(0, "semseg"), (1, "depth"), (2, "semseg"), (2, "depth")]},
            ValueError,
            r"client 1 \('c1'\) has no task 'depth'; its tasks are \['human_parts'\]",
        ),
        ({"decoder_owners": [(0, "semseg"), (1, "human_parts"), (3, "semseg")]}, ValueError, "there are 3"),
        (
            {"decoder_owners": [(0, "semseg"), (1, "human_parts"), (2, "depth"), (2, "semseg")]},
            ValueError,
            "by client, then the client's task order",
        ),
        ({"decoder_owners": OWNERS[:3]}, ValueError, "every"),
        ({"round": 0}, ValueError, "1-based"),
        ({"clients": [CLIENTS[0], CLIENTS[0], CLIENTS[2]]}, ValueError, "unique"),
    ],
)
def test_round_input_validation_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        _round(**overrides)


def test_client_info_validation():
    assert ClientInfo("c", "nyud", ["depth"], 3).tasks == ("depth",)
    with pytest.raises(ValueError, match="no tasks"):
        ClientInfo("c", "nyud", (), 3)
    with pytest.raises(ValueError, match="twice"):
        ClientInfo("c", "nyud", ("depth", "depth"), 3)
    with pytest.raises(ValueError, match="num_samples"):
        ClientInfo("c", "nyud", ("depth",), -1)


# --- registry, configs, state ---------------------------------------------------------


def test_registry_holds_the_methods_by_class_name():
    assert {"FedAvg", "Local"} <= set(METHODS.names())
    assert METHODS.get("FedAvg") is FedAvg
    agg = create_method("FedAvg", weighted=True)
    assert isinstance(agg, FedAvg) and agg.weighted
    with pytest.raises(KeyError, match=r"unknown method 'FedAvgg'; known: .*FedAvg, .*Local"):
        METHODS.get("FedAvgg")


def test_the_package_exports_each_name_once_and_every_name_exists():
    import fedmtl.aggregation as aggregation

    assert len(aggregation.__all__) == len(set(aggregation.__all__))
    assert [name for name in aggregation.__all__ if not hasattr(aggregation, name)] == []


def test_register_rejects_non_methods_and_duplicates():
    with pytest.raises(TypeError, match="only Method subclasses"):
        register_method(dict)
    with pytest.raises(KeyError, match="method 'Local' is registered twice"):
        register_method(Local)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_registered_method_is_exported_and_resolves_as_a_class_path(name):
    assert getattr(methods, name) is METHODS.get(name)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--algorithm", type=Method)
    config = parser.parse_args(["--algorithm", f'{{"class_path": "{name}"}}'])
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    assert type(instantiate(config).algorithm) is METHODS.get(name)


def test_fedavg_init_args_come_from_a_config():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--algorithm", type=Method)
    config = parser.parse_args(["--algorithm", '{"class_path": "FedAvg", "init_args": {"weighted": true}}'])
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    algorithm = instantiate(config).algorithm
    assert isinstance(algorithm, FedAvg) and algorithm.weighted is True


@pytest.mark.parametrize("name", METHODS.names())
def test_every_registered_method_state_survives_a_weights_only_checkpoint(name, tmp_path):
    aggregator = create_method(name)
    aggregator.aggregate(_round())
    path = tmp_path / "server.pt"
    torch.save(aggregator.state_dict(), path)
    state = torch.load(path, weights_only=True)
    fresh = create_method(name)
    fresh.load_state_dict(state)
    assert repr(fresh.state_dict()) == repr(aggregator.state_dict())
    assert all(isinstance(v, float) for v in aggregator.log_values().values())


class _Counter(Aggregator):
    """A stateful toy: the contract a stateful aggregator (FedHCA²) follows."""

    def __init__(self) -> None:
        self.rounds = 0
        self.alpha = torch.full((3,), 0.1)

    def aggregate(self, inputs):
        self.rounds += 1
        self.alpha = self.alpha + 0.1
        return Local().aggregate(inputs)

    def state_dict(self):
        return {"rounds": self.rounds, "alpha": self.alpha.clone(), "names": ["c0", "c1", "c2"]}

    def load_state_dict(self, state):
        self.rounds, self.alpha = state["rounds"], state["alpha"].clone()

    def log_values(self):
        return {f"alpha/{i}": float(a) for i, a in enumerate(self.alpha)}


def test_stateful_aggregator_round_trip_and_stateless_defaults(tmp_path):
    counter = _Counter()
    counter.aggregate(_round())
    counter.aggregate(_round())
    torch.save(counter.state_dict(), tmp_path / "s.pt")
    fresh = _Counter()
    fresh.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert fresh.rounds == 2
    torch.testing.assert_close(fresh.alpha, torch.full((3,), 0.3))
    assert fresh.log_values() == pytest.approx({"alpha/0": 0.3, "alpha/1": 0.3, "alpha/2": 0.3})
    assert FedAvg().state_dict() == {} and FedAvg().log_values() == {}
    with pytest.raises(ValueError, match="FedAvg has no server state"):
        FedAvg().load_state_dict({"alpha": torch.zeros(3)})


# --- end to end with real models ------------------------------------------------------


def _perturb(module: torch.nn.Module, scale: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)


def test_fedavg_end_to_end_on_real_models():
    """Flatten three clients' models, average, write back: encoders and decoders agree, heads
    and BatchNorm statistics stay local."""
    clients = [
        ClientInfo("pascal_semseg", "pascal_context", ("semseg",), 10),
        ClientInfo("pascal_normals", "pascal_context", ("normals",), 10),
        ClientInfo("nyud_mt", "nyud", ("semseg", "depth"), 20),
    ]
    models = []
    for seed, client in enumerate(clients):
        torch.manual_seed(seed)
        model = MultiTaskModel(client.dataset, client.tasks, backbone="resnet10t", embed_dim=8)
        for buffer in model.buffers():  # distinct "local" BN statistics
            if buffer.is_floating_point():
                buffer.fill_(float(seed + 1))
        models.append(model)
    encoders = [m.encoder for m in models]
    decoders = [m.decoders[task] for i, task in decoder_owners_of(clients) for m in [models[i]]]
    encoder_layout = FlatLayout.from_module(encoders[0])
    decoder_layout = FlatLayout.from_module(decoders[0])
    assert all(FlatLayout.from_module(d) == decoder_layout for d in decoders)
    assert decoder_layout.layers == (
        "projections.0",
        "projections.1",
        "projections.2",
        "projections.3",
        "fuse",
        "norm",
    )

    encoders_prev, decoders_prev = encoder_layout.stack(encoders), decoder_layout.stack(decoders)
    for model in models:  # stands in for local training
        _perturb(model, 0.01)
    trained_encoders, trained_decoders = encoder_layout.stack(encoders), decoder_layout.stack(decoders)
    heads_before = [{k: v.clone() for k, v in m.heads.state_dict().items()} for m in models]
    buffers_before = [{k: v.clone() for k, v in m.named_buffers()} for m in models]

    inputs = RoundInput(
        round=1,
        clients=clients,
        encoder_layout=encoder_layout,
        encoders_prev=encoders_prev,
        encoder_deltas=trained_encoders - encoders_prev,
        decoder_layout=decoder_layout,
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=decoders_prev,
        decoder_deltas=trained_decoders - decoders_prev,
    )
    out = FedAvg().aggregate(inputs)
    out.check_against(inputs)
    for i, encoder in enumerate(encoders):
        encoder_layout.assign(encoder, out.encoders[i])
    for k, decoder in enumerate(decoders):
        decoder_layout.assign(decoder, out.decoders[k])

    after = encoder_layout.stack(encoders)
    assert torch.equal(after[0], after[1]) and torch.equal(after[0], after[2])
    torch.testing.assert_close(after[0], trained_encoders.mean(0))
    assert not torch.equal(after[0], trained_encoders[0])
    after_decoders = decoder_layout.stack(decoders)
    assert all(torch.equal(after_decoders[0], row) for row in after_decoders)
    torch.testing.assert_close(after_decoders[0], trained_decoders.mean(0))
    for model, heads, buffers in zip(models, heads_before, buffers_before):
        for key, value in model.heads.state_dict().items():
            assert torch.equal(value, heads[key]), f"head {key} changed"
        for key, value in model.named_buffers():
            assert torch.equal(value, buffers[key]), f"buffer {key} changed"
    assert not torch.equal(
        models[0].heads["semseg"].classifier.weight, models[2].heads["semseg"].classifier.weight
    )
