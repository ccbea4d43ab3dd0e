"""FedDEA as a plug-in over FedAvg, FedProx and FedOpt (docs/methods.md, FedDEA): a hand case
of two clients' updates at ρ = 0.5, ρ = 1 as the host bit for bit, the hooks the host answers,
the mask's scope, the unified-model setting (heads shared per task) end to end, kill and resume,
the nested host on the command line, and one-line errors for bad options."""

from __future__ import annotations

import operator
from pathlib import Path
from unittest import mock

import pytest
import torch

from fedmtl.aggregation import (
    ClientInfo,
    FlatLayout,
    HeadGroup,
    RoundInput,
    decoder_owners_of,
    feddea_k,
    head_groups_of,
)
from fedmtl.cli import _run_parser
from fedmtl.federated import checkpoint
from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.feddea import FedDEA
from fedmtl.methods.fedprox import FedProx
from tests.helpers import (
    client_states,
    fit,
    fit_in_processes,
    fit_killed_in_round,
    fit_refused,
    round_from_trained,
    tiny_config,
)


def _layout(*numels: int) -> FlatLayout:
    """A flat layout of 1-D tensors of these sizes (one layer each)."""
    return FlatLayout(
        names=tuple(f"t{i}" for i in range(len(numels))),
        shapes=tuple((n,) for n in numels),
        dtypes=(torch.float32,) * len(numels),
        tensor_layers=tuple(f"layer{i}" for i in range(len(numels))),
    )


def _two_single_task_clients() -> list[ClientInfo]:
    return [ClientInfo("A", "nyud", ("semseg",), 10), ClientInfo("B", "nyud", ("depth",), 30)]


# ---------------------------------------------------------------------------- the hand case


def test_hand_case_masks_rescales_and_averages():
    """ρ = 0.5: Δ1 = (0.5, −2, 0.1, 1) → (0, −4, 0, 2); Δ2 = (1, 0.2, −0.3, 0) → (2, 0, −0.6, 0);
    the server's mean is (1, −2, −0.3, 1) where FedAvg's is (0.75, −0.9, −0.1, 0.5)."""
    deltas = torch.tensor([[0.5, -2.0, 0.1, 1.0], [1.0, 0.2, -0.3, 0.0]])
    inputs = round_from_trained(_two_single_task_clients(), _layout(4), deltas, deltas, deltas, deltas)
    method = FedDEA(rho=0.5)
    assert torch.equal(
        method.transform(deltas, _layout(4)), torch.tensor([[0, -4.0, 0, 2.0], [2.0, 0, -0.6, 0]])
    )
    out = method.aggregate(inputs)
    expected = torch.tensor([1.0, -2.0, -0.3, 1.0]).expand(2, 4)
    assert torch.equal(out.encoders, expected) and torch.equal(out.decoders, expected)
    torch.testing.assert_close(
        FedAvg().aggregate(inputs).encoders, torch.tensor([0.75, -0.9, -0.1, 0.5]).expand(2, 4)
    )


def test_every_transformed_update_keeps_exactly_k_entries_ties_included():
    """Tied magnitudes (a few distinct values) in every row: still exactly ⌈ρ·d⌉ non-zeros."""
    generator = torch.Generator().manual_seed(0)
    deltas = torch.randint(-3, 4, (5, 1000), generator=generator).float()
    deltas[deltas == 0] = 0.5  # no zeros, so every kept entry is a non-zero
    for rho in (0.1, 0.25, 0.3, 0.5, 0.999):
        kept = (FedDEA(rho=rho).transform(deltas, _layout(1000)) != 0).sum(dim=1)
        assert kept.tolist() == [feddea_k(rho, 1000)] * 5


def test_tensor_scope_masks_each_parameter_tensor_on_its_own():
    """Two tensors (4, 3) and (0.2, 0.1), ρ = 0.5: the unit keeps its two largest, 4 and 3 →
    (8, 6, 0, 0); per tensor each keeps its largest → (8, 0, 0.4, 0). Without rescaling the
    kept entries keep their values."""
    deltas = torch.tensor([[4.0, 3.0, 0.2, 0.1]])
    layout = _layout(2, 2)
    assert torch.equal(
        FedDEA(rho=0.5, scope="unit").transform(deltas, layout), torch.tensor([[8.0, 6.0, 0, 0]])
    )
    assert torch.equal(
        FedDEA(rho=0.5, scope="tensor").transform(deltas, layout), torch.tensor([[8.0, 0, 0.4, 0]])
    )
    assert torch.equal(
        FedDEA(rho=0.5, scope="tensor", rescale=False).transform(deltas, layout),
        torch.tensor([[4.0, 0, 0.2, 0]]),
    )


# ---------------------------------------------------------------------------- ρ = 1 is the host


def _random_round(round_: int = 1, participants=None, heads: bool = False) -> RoundInput:
    """Three clients (two semseg, one depth), random float32 parameters not exact in binary;
    the clients outside ``participants`` have zero deltas."""
    clients = [
        ClientInfo("A", "nyud", ("semseg",), 10),
        ClientInfo("B", "nyud", ("semseg",), 20),
        ClientInfo("C", "nyud", ("depth",), 40),
    ]
    g = torch.Generator().manual_seed(round_)
    enc, dec = _layout(7, 5), _layout(6)
    groups = []
    if heads:
        for dataset, task, owners in head_groups_of(clients):
            prev = torch.randn(len(owners), 3, generator=g)
            groups.append(
                HeadGroup(dataset, task, _layout(3), owners, prev, torch.randn(prev.shape, generator=g) / 7)
            )
    inputs = RoundInput(
        round=round_,
        clients=clients,
        encoder_layout=enc,
        encoders_prev=torch.randn(3, 12, generator=g).mean(0).expand(3, 12).clone(),
        encoder_deltas=torch.randn(3, 12, generator=g) / 3,
        decoder_layout=dec,
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=torch.randn(3, 6, generator=g),
        decoder_deltas=torch.randn(3, 6, generator=g) / 3,
        participants=participants,
        heads=groups,
    )
    # The contract: a client that sat the round out has zero deltas.
    for i in set(range(3)) - set(inputs.participating_clients):
        inputs.encoder_deltas[i] = 0
        inputs.decoder_deltas[i] = 0  # one decoder per client
        for group in inputs.heads:
            group.deltas[[j for j, owner in enumerate(group.owners) if owner == i]] = 0
    return inputs


HOSTS = {
    "FedAvg": {"weighted": True, "decoder_scope": "same_task", "head_scope": "same_task"},
    "FedProx": {"mu": 0.1, "decoder_scope": "same_task", "head_scope": "same_task"},
    "FedOpt": {"server_optimizer": "yogi", "server_lr": 0.1, "head_scope": "same_task"},
}


@pytest.mark.parametrize("host", list(HOSTS))
def test_rho_one_is_the_host_bit_for_bit_over_rounds(host):
    """Two rounds (the second with client sampling), heads shared: FedDEA(ρ=1) returns the
    host's bits and carries the same server state."""
    options = HOSTS[host]
    feddea, plain = FedDEA(rho=1.0, host=create_method(host, **options)), create_method(host, **options)
    for round_, participants in [(1, None), (2, (0, 2))]:
        inputs = _random_round(round_, participants, heads=True)
        a, b = feddea.aggregate(inputs), plain.aggregate(inputs)
        assert torch.equal(a.encoders, b.encoders) and torch.equal(a.decoders, b.decoders)
        assert all(torch.equal(x, y) for x, y in zip(a.heads, b.heads, strict=True))
    assert repr(feddea.state_dict()) == repr(plain.state_dict())


def test_below_one_the_host_sees_masked_updates():
    inputs = _random_round()
    assert not torch.equal(FedDEA(rho=0.5).aggregate(inputs).encoders, FedAvg().aggregate(inputs).encoders)


def test_client_behaviour_is_the_hosts():
    """Over FedProx the clients train with FedProx's proximal term; over FedAvg with none."""
    feddea = FedDEA(host=FedProx(mu=0.3))
    assert type(feddea.host).__name__ == "FedProx" and feddea.mu == 0.3
    assert FedDEA().penalty(None, None) is None  # FedAvg: no term (never reads its arguments)
    assert feddea.shares_heads is False and FedDEA(host=FedAvg(head_scope="same_task")).shares_heads is True
    assert FedDEA().host is not FedDEA().host  # the default FedAvg is each FedDEA's own


def test_every_hook_it_does_not_define_is_the_hosts():
    """Client hooks, the run's checks, participation, server state and logs: the host's, with
    the arguments and results passed through untouched."""
    feddea = FedDEA()
    feddea.host = mock.MagicMock()
    hooks = ["setup", "check_run", "participants", "init_client", "frozen", "penalty", "local_update"]
    hooks += ["receive", "receive_heads", "finish", "evaluated_models", "encoder_rows"]
    hooks += ["state_dict", "load_state_dict", "log_values", "log_matrices"]
    for name in hooks:
        assert getattr(feddea, name)(1, x=2) is getattr(feddea.host, name).return_value, name
        getattr(feddea.host, name).assert_called_once_with(1, x=2)
    for name in ["shares_heads", "finishes", "evaluated", "reads_every_client", "participation"]:
        assert getattr(feddea, name) is getattr(feddea.host, name), name


# ---------------------------------------------------------------------------- shared heads


def test_same_task_heads_are_averaged_among_the_clients_of_their_task():
    """Two semseg heads (1, 2, 3) and (3, 4, 5) meet at (2, 3, 4); the lone depth head keeps
    what it trained; with client sampling only trained heads count."""
    clients = [ClientInfo("A", "nyud", ("semseg",), 1), ClientInfo("B", "nyud", ("semseg",), 1)]
    clients.append(ClientInfo("C", "nyud", ("depth",), 1))
    trained = {"semseg": torch.tensor([[1.0, 2, 3], [3, 4, 5]]), "depth": torch.tensor([[7.0, 8, 9]])}
    layout = _layout(3)
    heads = [
        HeadGroup("nyud", "semseg", layout, [0, 1], trained["semseg"] - 1, torch.ones(2, 3)),
        HeadGroup("nyud", "depth", layout, [2], trained["depth"] - 1, torch.ones(1, 3)),
    ]
    zeros = torch.zeros(3, 3)
    inputs = RoundInput(
        1, clients, layout, zeros, zeros, layout, decoder_owners_of(clients), zeros, zeros, heads=heads
    )
    out = FedAvg(head_scope="same_task").aggregate(inputs)
    assert torch.equal(out.heads[0], torch.tensor([[2.0, 3, 4]] * 2))
    assert torch.equal(out.heads[1], trained["depth"])
    assert FedAvg().aggregate(inputs).heads is None  # head_scope none: heads stay local


def test_head_groups_must_follow_the_clients():
    clients = _two_single_task_clients()
    layout = _layout(3)
    wrong = [HeadGroup("nyud", "depth", layout, [1], torch.zeros(1, 3), torch.zeros(1, 3))]
    zeros = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="head_groups_of"):
        RoundInput(
            1, clients, layout, zeros, zeros, layout, decoder_owners_of(clients), zeros, zeros, heads=wrong
        )


# ---------------------------------------------------------------------------- end to end

UNIFIED = [
    {
        "dataset": "pascal_context",
        "tasks": ["semseg", "sal"],
        "single_task": True,
        "batch_size": 2,
        "replicas": 2,
    }
]
UNIFIED_HOST = {
    "class_path": "FedAvg",
    "init_args": {"decoder_scope": "same_task", "head_scope": "same_task"},
}
UNIFIED_ALGORITHM = {"class_path": "FedDEA", "init_args": {"rho": 0.25, "host": UNIFIED_HOST}}


def _unified_config(tmp_path: Path, data_root: Path, algorithm=None, **changes) -> Path:
    return tiny_config(
        tmp_path, data_root, clients=UNIFIED, algorithm=algorithm or UNIFIED_ALGORITHM, **changes
    )


def test_unified_model_shares_encoder_and_each_tasks_decoder_and_head(tmp_path, data_root):
    """Four one-task clients (two semseg, two sal): after the run every encoder is the same,
    and the two clients of a task hold the same decoder and head; results report the
    unified model per task."""
    results = fit(_unified_config(tmp_path, data_root, rounds=2), tmp_path / "run")
    states = [s["model"] for s in client_states(tmp_path / "run", clients=4)]
    names = list(results["clients"])
    assert names == [
        "pascal_context-semseg-0",
        "pascal_context-semseg-1",
        "pascal_context-sal-0",
        "pascal_context-sal-1",
    ]
    params = [k for k in states[0] if "running" not in k and "num_batches" not in k]
    for key in (k for k in params if k.startswith("encoder.")):
        assert all(torch.equal(states[0][key], s[key]) for s in states), key
    for a, b, task in [(0, 1, "semseg"), (2, 3, "sal")]:
        for key in (k for k in params if k.startswith((f"decoders.{task}.", f"heads.{task}."))):
            assert torch.equal(states[a][key], states[b][key]), key
    assert not torch.equal(
        states[0]["decoders.semseg.norm.running_mean"], states[1]["decoders.semseg.norm.running_mean"]
    )
    unified = results["unified"]
    assert list(unified) == ["pascal_context/semseg", "pascal_context/sal"]
    assert unified["pascal_context/semseg"]["clients"] == names[:2]
    values = [results["clients"][n]["metrics"]["semseg"]["mIoU"] for n in names[:2]]
    assert unified["pascal_context/semseg"]["mIoU"] == pytest.approx(sum(values) / 2)


def test_rho_one_over_fedavg_is_fedavg_end_to_end(tmp_path, data_root):
    """Through the engine, heads shared: the same results and the same checkpoint tensors."""
    dea = fit(
        _unified_config(
            tmp_path,
            data_root,
            {"class_path": "FedDEA", "init_args": {"rho": 1.0, "host": UNIFIED_HOST}},
            name="d.yaml",
            rounds=2,
        ),
        tmp_path / "dea",
    )
    avg = fit(_unified_config(tmp_path, data_root, UNIFIED_HOST, name="a.yaml", rounds=2), tmp_path / "avg")
    assert dea["clients"] == avg["clients"] and dea["unified"] == avg["unified"]
    for a, b in zip(client_states(tmp_path / "dea", 4), client_states(tmp_path / "avg", 4), strict=True):
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_feddea_over_fedopt_killed_and_resumed_gives_the_same_run(tmp_path, data_root, monkeypatch):
    """FedOpt's moments are server state in the checkpoint: a run killed in round 3 and
    resumed ends with the results and client states of an uninterrupted run."""
    fedopt = {"class_path": "FedOpt", "init_args": {"server_lr": 0.05}}
    algorithm = {"class_path": "FedDEA", "init_args": {"rho": 0.3, "host": fedopt}}
    config = tiny_config(tmp_path, data_root, algorithm=algorithm)
    straight = fit(config, tmp_path / "straight")
    fit_killed_in_round(config, tmp_path / "resumed", monkeypatch, 3)
    assert checkpoint.latest(tmp_path / "resumed").name == "round_0002"
    server = checkpoint.load_server(checkpoint.latest(tmp_path / "resumed"))
    assert set(server["aggregator"]["moments"]) == {"encoders/all", "decoders/all"}
    resumed = fit(config, tmp_path / "resumed", "--resume", "true")
    assert resumed == straight
    for a, b in zip(client_states(tmp_path / "straight"), client_states(tmp_path / "resumed"), strict=True):
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_two_processes_exchange_shared_heads_as_one(tmp_path, data_root):
    """Heads of one task sit on different ranks: gathered, they aggregate as in one process."""
    config = _unified_config(tmp_path, data_root, rounds=2)
    one = fit(config, tmp_path / "one")
    assert fit_in_processes(config, tmp_path / "two") == one


# ---------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "options, host, attribute, value",
    [
        ([], "FedAvg", "decoder_scope", "all"),
        (["--algorithm.host", "FedProx", "--algorithm.host.mu", "0.3"], "FedProx", "mu", 0.3),
        (["--algorithm.host", "FedOpt", "--algorithm.host.server_lr", "0.1"], "FedOpt", "optimizer.lr", 0.1),
        (["--algorithm.host.head_scope", "same_task"], "FedAvg", "head_scope", "same_task"),
    ],
)
def test_the_host_and_its_options_on_the_command_line(tmp_path, data_root, options, host, attribute, value):
    config = tiny_config(tmp_path, data_root)
    parser = _run_parser()
    cfg = parser.instantiate(parser.parse_args(["--config", str(config), "--algorithm", "FedDEA", *options]))
    assert type(cfg.algorithm).__name__ == "FedDEA" and type(cfg.algorithm.host).__name__ == host
    assert operator.attrgetter(attribute)(cfg.algorithm.host) == value


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "options, field",
    [
        (["--algorithm.rho", "0"], "algorithm.rho"),
        (["--algorithm.rho", "1.5"], "algorithm.rho"),
        (["--algorithm.host", "FedHCA2"], "algorithm.host: FedDEA is not defined over FedHCA2"),
        (["--algorithm.host", "FedAMP"], "algorithm.host: FedDEA is not defined over FedAMP"),
        (
            ["--algorithm.host", "Scaffold"],
            "Parser key \"algorithm.host\": no method named 'Scaffold'; FedDEA's hosts: FedAvg, FedProx, FedOpt",
        ),
        (["--algorithm.host", "FedPer"], "algorithm.host must be one of ['FedAvg', 'FedProx', 'FedOpt']"),
        (
            ["--algorithm.host", "FedOpt", "--algorithm.host.server_lr", "0"],
            "algorithm.host.server_lr must be",
        ),
        (
            ["--algorithm.host", "FedOpt", "--algorithm.host.server_lr", "-1"],
            "algorithm.host.server_lr must be",
        ),
        (["--algorithm.rho", "2"], "algorithm.rho must be"),
        (
            ["--algorithm.host.mu", "0.01"],
            "Parser key \"host\": Problem with given class_path 'fedmtl.methods.FedAvg': Option 'mu' is not accepted",
        ),
        (["--algorithm.mu", "0.01"], "Option 'mu' is not accepted"),
        (["--algorithm.scope", "layer"], "Parser key \"scope\": Expected a typing.Literal['unit', 'tensor']"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_field_and_nothing_is_written(
    tmp_path, data_root, capsys, options, field
):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedDEA"})
    lines = fit_refused(config, tmp_path / "run", capsys, *options)
    assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], lines


@pytest.mark.parametrize(
    "algorithm, options, field",
    [
        ("FedDEA", ["--algorithm.rescale", "maybe"], 'Parser key "rescale"'),
        ("FedDEA", ["--algorithm.host.head_scope", "everyone"], 'Parser key "head_scope"'),
        ("FedAvg", ["--algorithm.head_scope", "all"], 'Parser key "head_scope"'),
    ],
)
def test_a_bad_rescale_or_head_scope_is_one_line_naming_it(
    tmp_path, data_root, capsys, algorithm, options, field
):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": algorithm})
    lines = fit_refused(config, tmp_path / "run", capsys, *options)
    assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], lines


def test_fedopt_refuses_a_non_positive_server_lr_and_cluster_scopes(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedOpt"})
    for options, field in [
        (["--algorithm.server_lr", "0"], "algorithm.server_lr must be a number > 0"),
        (["--algorithm.encoder_scope", "cluster"], "algorithm.encoder_scope"),
        (["--algorithm.server_optimizer", "lamb"], "server_optimizer"),
    ]:
        lines = fit_refused(config, tmp_path / "run", capsys, *options)
        assert len(lines) == 1 and field in lines[0], lines


def _flat_feddea(host: str, **host_options) -> dict:
    """FedDEA's saved config as runs wrote it before the host became a nested method."""
    flat = dict.fromkeys(("mu", "server_optimizer", "server_lr", "beta1", "beta2", "tau"))
    flat.update(
        encoder_scope="all", decoder_scope="all", head_scope="none", weighted=False, participation=1.0
    )
    flat.update(host_options)
    return {
        "class_path": "fedmtl.methods.FedDEA",
        "init_args": {"rho": 0.3, "scope": "unit", "rescale": True, "host": host, **flat},
    }


def test_a_run_saved_with_the_flat_host_resumes_and_validates(tmp_path, data_root, monkeypatch, capsys):
    """A run whose config.yaml has the earlier flat form (``host: FedProx``, ``mu`` beside ``rho``)
    is read with the host nested: the nested config resumes it to the uninterrupted run's results,
    `fedmtl validate` evaluates it, and another host is still refused as a change."""
    import yaml

    from fedmtl.cli import main

    algorithm = {
        "class_path": "FedDEA",
        "init_args": {"rho": 0.3, "host": {"class_path": "FedProx", "init_args": {"mu": 0.05}}},
    }
    config = tiny_config(tmp_path, data_root, algorithm=algorithm, rounds=2)
    straight = fit(config, tmp_path / "straight")
    run = tmp_path / "resumed"
    fit_killed_in_round(config, run, monkeypatch, 2)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["algorithm"] = _flat_feddea("FedProx", mu=0.05)
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    other = tiny_config(
        tmp_path,
        data_root,
        name="other.yaml",
        rounds=2,
        algorithm={"class_path": "FedDEA", "init_args": {"rho": 0.3}},
    )
    assert main(["fit", "--config", str(other), "--run_dir", str(run), "--resume", "true"]) != 0
    assert "host.class_path: 'fedmtl.methods.FedProx' -> 'fedmtl.methods.FedAvg'" in capsys.readouterr().err
    assert fit(config, run, "--resume", "true") == straight
    assert main(["validate", "--run_dir", str(run)]) == 0


# ---------------------------------------------------------------------------- the one server step


@pytest.mark.parametrize("case", ["sampled", "dropped", "unavailable"])
def test_aggregate_is_the_functional_math_with_clients_that_did_not_train(case):
    """(a) sampled, (b) a dropped update, (c) unavailable clients: every update masked to its
    ⌈ρ·d⌉ largest entries and scaled by 1/ρ, then FedAvg's mean over the participants to all."""
    from fedmtl.aggregation import feddea_mask
    from fedmtl.aggregation.functional import group_means_to
    from fedmtl.methods import FedAvg
    from tests.helpers import MATH_CASES, assert_relative, math_round

    participants = list(MATH_CASES[case])
    inputs = math_round(participants)
    host = FedAvg(participation=0.6 if case == "sampled" else 1.0)
    out = FedDEA(rho=0.25, host=host).aggregate(inputs)
    out.check_against(inputs)
    dec_sources = [k for k, (i, _) in enumerate(inputs.decoder_owners) if i in participants]
    for got, prev, deltas, sources in [
        (out.encoders, inputs.encoders_prev, inputs.encoder_deltas, participants),
        (out.decoders, inputs.decoders_prev, inputs.decoder_deltas, dec_sources),
    ]:
        masked = feddea_mask(deltas, 0.25, True)
        assert int((masked != 0).sum(dim=1).max()) == 2  # ⌈0.25 · 6⌉
        assert_relative(got, group_means_to(prev, masked, [(sources, list(range(len(prev))))]))
