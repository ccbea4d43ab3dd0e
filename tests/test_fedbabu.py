"""FedBABU (docs/methods.md, FedBABU): heads frozen at their task-seeded initialisation for all R rounds
(out of the optimiser, so not even AdamW's weight decay moves them), encoders averaged,
decoders personal, and a fine-tuned copy evaluated after the last round without touching the
federated state. The AdamW pitfall by hand, the hooks on toy models, the server on a hand
round, the real engine and trainer end to end, and bad hyper-parameters named by their field."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedmtl.aggregation import ClientInfo
from fedmtl.config import OptimizerConfig
from fedmtl.federated import checkpoint
from fedmtl.federated.client import make_optimizer
from fedmtl.methods import FedAvg, create_method
from fedmtl.methods.fedbabu import FedBABU
from fedmtl.models import MultiTaskModel
from fedmtl.models.decoder import Head
from fedmtl.seeds import derive_seed
from fedmtl.tasks import get_task
from fedmtl.tensors import parameters_of
from tests.helpers import (
    TINY_BACKBONE,
    TINY_STEM,
    client_states,
    fit,
    fit_refused,
    hand_round,
    recording_training,
    tiny_config,
)

ROUNDS = 2
FT_EPOCHS = 2
SEED = 0  # the tiny scenario's run seed (the config default)
# The tiny scenario's clients (see tests/helpers.py), as the engine describes them.
TINY_CLIENTS = [
    ("pascal_context", ("semseg",)),
    ("pascal_context", ("sal",)),
    ("nyud", ("semseg", "depth")),
]


class _Toy(nn.Module):
    """A client model's three parts by module structure: encoder, decoders, heads (the heads
    start at 1.0, the hand case's p)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(3, 2)
        self.decoders = nn.ModuleDict({"semseg": nn.Linear(2, 2)})
        self.heads = nn.ModuleDict({"semseg": nn.Linear(2, 2)})
        with torch.no_grad():
            for p in self.heads.parameters():
                p.fill_(1.0)


def _loss(model: _Toy) -> torch.Tensor:
    x = torch.tensor([[1.0, -2.0, 0.5]])
    return model.heads["semseg"](model.decoders["semseg"](model.encoder(x))).square().sum()


# ---------------------------------------------------------------------------- hand case


def test_a_zeroed_gradient_under_adamw_still_moves_the_parameter():
    """The freezing pitfall: FL-bench "freezes" with ``grad.zero_()``, but AdamW skips a
    parameter only when its grad is None. One step (lr 1e-3, wd 1e-2) on p = 1.0 with grad 0
    applies the decoupled weight decay p·(1 − lr·wd) = 0.99999000 (Adam's own step is
    0/(√0 + ε) = 0)."""
    p = nn.Parameter(torch.tensor([1.0]))
    optimizer = torch.optim.AdamW([p], lr=1e-3, weight_decay=1e-2)
    p.grad = torch.zeros_like(p)
    optimizer.step()
    assert p.item() == pytest.approx(0.99999000, abs=1e-7)
    assert p.item() != 1.0


def test_fedbabu_freeze_leaves_the_heads_at_exactly_one():
    """The same step on a model whose heads FedBABU freezes, done the project's way: the
    modules of ``FedBABU().frozen`` are left out of ``make_optimizer`` and get
    requires_grad=False. Heads stay at exactly 1.0 (no grad, no decay) while encoder and
    decoder move; the zeroed-gradient way on the same model moves the heads to 0.99999."""
    config = OptimizerConfig(lr=1e-3, weight_decay=1e-2)

    model = _Toy()
    frozen = parameters_of(FedBABU().frozen(model, 1))
    trained = [p for p in model.parameters() if all(p is not f for f in frozen)]
    optimizer, scheduler = make_optimizer(trained, config, None)
    assert scheduler is None
    in_groups = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_groups.isdisjoint(id(p) for p in model.heads.parameters())
    for p in frozen:
        p.requires_grad_(False)
    encoder_before = model.encoder.weight.detach().clone()
    _loss(model).backward()
    optimizer.step()
    for p in model.heads.parameters():
        assert p.grad is None
        assert torch.equal(p, torch.ones_like(p))
    assert not torch.equal(model.encoder.weight, encoder_before)

    pitfall = _Toy()
    optimizer, _ = make_optimizer(list(pitfall.parameters()), config, None)
    _loss(pitfall).backward()
    for p in pitfall.heads.parameters():
        p.grad.zero_()
    optimizer.step()
    for p in pitfall.heads.parameters():
        torch.testing.assert_close(p.detach(), torch.full_like(p, 0.99999), rtol=0, atol=1e-7)


@pytest.mark.parametrize("round_", [1, 2, 100])
def test_frozen_is_the_heads_in_every_round(round_):
    model = _Toy()
    (frozen,) = FedBABU().frozen(model, round_)
    assert frozen is model.heads


# ---------------------------------------------------------------------------- task-seeded heads


def _heads_after_init(dataset: str, tasks: tuple[str, ...], global_seed: int, name: str, run_seed: int = 0):
    """A model of the real head structure built under ``global_seed``, after FedBABU's init_client."""
    torch.manual_seed(global_seed)
    model = nn.Module()
    model.heads = nn.ModuleDict({t: Head(96, get_task(t).channels(dataset)) for t in tasks})
    FedBABU().init_client(model, ClientInfo(name, dataset, tasks, 6), run_seed)
    return model.heads


def test_clients_sharing_a_task_share_the_frozen_head():
    """Two clients with the same (dataset, task), built from different random states, end up
    with bitwise equal heads: FedBABU's single server-side initialisation."""
    a = _heads_after_init("pascal_context", ("semseg",), global_seed=1, name="a")
    b = _heads_after_init("pascal_context", ("semseg", "sal"), global_seed=2, name="b")
    for (name, p), q in zip(a["semseg"].named_parameters(), b["semseg"].parameters(), strict=True):
        assert torch.equal(p, q), name


def test_the_head_seed_depends_on_task_dataset_and_run_seed():
    """The upsampling layers have the same shape in every head; their values differ with the
    task, with the dataset and with the run's seed."""
    base = _heads_after_init("pascal_context", ("semseg", "sal"), 0, "a")["semseg"].upsample1.weight
    other_task = _heads_after_init("pascal_context", ("semseg", "sal"), 0, "a")["sal"].upsample1.weight
    other_dataset = _heads_after_init("nyud", ("semseg",), 0, "a")["semseg"].upsample1.weight
    other_run = _heads_after_init("pascal_context", ("semseg",), 0, "a", run_seed=1)[
        "semseg"
    ].upsample1.weight
    assert base.shape == other_task.shape == other_dataset.shape == other_run.shape
    for other in (other_task, other_dataset, other_run):
        assert not torch.equal(base, other)


def test_init_client_leaves_the_global_random_state_and_the_rest_of_the_model_alone():
    """The head re-initialisation draws from a forked generator: what the client draws next
    (data order, dropout) and its encoder and decoders are as without FedBABU."""
    model = _Toy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    assert FedBABU().init_client(model, ClientInfo("a", "pascal_context", ("semseg",), 6), 0) == {}
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        if key.startswith("heads."):
            assert not torch.equal(value, before[key]), key
        else:
            assert torch.equal(value, before[key]), key


# ---------------------------------------------------------------------------- fine-tuning hooks


class _RecordingContext(SimpleNamespace):
    """A stand-in for ClientContext whose ``train`` records its calls and, like LocalTrainer,
    writes a trained model (here: every value + 1) and the epochs into the track."""

    def __init__(self, model: nn.Module, epochs_done: int) -> None:
        state = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "epochs_done": epochs_done}
        state["personal"] = {}
        super().__init__(model=model, state=state, personal=state["personal"], calls=[])
        self.optimizer = OptimizerConfig(lr=1e-4, weight_decay=1e-4, warmup_epochs=5)

    def train(self, track, **kwargs):
        self.calls.append((track, kwargs))
        track["model"] = {k: v + 1 for k, v in track["model"].items()}
        track["epochs_done"] += kwargs["epochs"]


def test_finish_fine_tunes_a_copy_with_a_fresh_constant_rate_adamw():
    """After round R: τ epochs on a *copy* (its own track, a fresh optimiser: ``fine_tune``
    set, so no schedule and no stored state), at the client's lr and weight decay by default,
    with its own data order; the copy is stored as ``fine_tuned`` and the federated track
    (model, epochs) is untouched."""
    ctx = _RecordingContext(_Toy(), epochs_done=6)
    federated = {k: v.clone() for k, v in ctx.state["model"].items()}
    FedBABU(ft_epochs=3).finish(ctx)
    ((track, kwargs),) = ctx.calls
    assert track is not ctx.state and track["optimizer"] is None and track["scheduler"] is None
    assert kwargs["epochs"] == 3 and kwargs["order"] == "fine-tune"
    assert kwargs["fine_tune"] == ctx.optimizer  # the client's lr 1e-4, wd 1e-4
    assert ctx.state["epochs_done"] == 6 and track["epochs_done"] == 9
    for key, value in ctx.state["model"].items():
        assert torch.equal(value, federated[key]), key
        assert torch.equal(ctx.personal["fine_tuned"][key], federated[key] + 1), key


def test_finish_uses_ft_lr_and_ft_weight_decay_when_given():
    ctx = _RecordingContext(_Toy(), epochs_done=2)
    FedBABU(ft_epochs=1, ft_lr=1e-3, ft_weight_decay=0.0).finish(ctx)
    ((_, kwargs),) = ctx.calls
    assert kwargs["fine_tune"] == OptimizerConfig(lr=1e-3, weight_decay=0.0, warmup_epochs=5)


def test_zero_fine_tuning_epochs_evaluate_the_federated_model():
    ctx = _RecordingContext(_Toy(), epochs_done=2)
    FedBABU(ft_epochs=0).finish(ctx)
    assert ctx.calls == []
    for key, value in ctx.state["model"].items():
        assert torch.equal(ctx.personal["fine_tuned"][key], value), key


def test_evaluated_models_are_the_fine_tuned_copy_first_then_the_federated_model():
    """The engine's labels are ``[evaluated, *also_evaluated]``; before the fine-tuning (the
    evaluations of earlier rounds) only the federated model exists."""
    method = FedBABU()
    assert [method.evaluated, *method.also_evaluated] == ["fine-tuned", "federated"]
    model, copy = {"w": torch.zeros(1)}, {"w": torch.ones(1)}
    assert list(method.evaluated_models({"model": model, "personal": {}}).items()) == [("federated", model)]
    assert list(method.evaluated_models({"model": model, "personal": {"fine_tuned": copy}}).items()) == [
        ("fine-tuned", copy),
        ("federated", model),
    ]


# ---------------------------------------------------------------------------- the server


def test_server_averages_encoders_and_returns_every_decoder_as_trained():
    """Encoders 1, 2, 6 → 3 everywhere; decoders (1,1), (3,3), (0,0), (4,0) come back bitwise
    as prev + Δ, even the two semseg decoders FedAvg-HC would average."""
    inputs = hand_round()
    out = FedBABU().aggregate(inputs)
    assert torch.equal(out.encoders, torch.full((3, 1), 3.0))
    assert torch.equal(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
    assert torch.equal(out.decoders, torch.tensor([[1.0, 1.0], [3.0, 3.0], [0.0, 0.0], [4.0, 0.0]]))
    assert isinstance(FedBABU(), FedAvg)


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, dict]:
    """The tiny scenario (2 rounds) under FedBABU with τ = 2 and τ = 0 (same seed), every
    round's checkpoint kept and every local training recorded."""
    tmp = module_dir
    out = {}
    for name, ft_epochs in [("babu", FT_EPOCHS), ("babu0", 0)]:
        algorithm = {"class_path": "FedBABU", "init_args": {"ft_epochs": ft_epochs}}
        config = tiny_config(tmp, data_root, name=f"{name}.yaml", algorithm=algorithm, rounds=ROUNDS)
        calls: list[dict] = []
        with recording_training(calls, keep_rounds=ROUNDS):
            fit(config, tmp / name)
        out[name] = {"dir": tmp / name, "calls": calls}
    return out


def _round_states(run_dir: Path, round_: int) -> list[dict]:
    folder = run_dir / "checkpoints" / f"round_{round_:04d}"
    return [checkpoint.load_client(folder, i) for i in range(len(TINY_CLIENTS))]


def _initial_models() -> list[MultiTaskModel]:
    """The clients' initial models as the engine builds them (engine._initial_state), heads
    re-initialised by FedBABU.init_client."""
    models = []
    for i, (dataset, tasks) in enumerate(TINY_CLIENTS):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(SEED, "init"))
            model = MultiTaskModel(dataset, tasks, img_size=(32, 32), backbone=TINY_BACKBONE)
        FedBABU().init_client(model, ClientInfo(f"client{i}", dataset, tasks, 6), SEED)
        models.append(model)
    return models


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_heads_stay_at_their_initial_values_in_every_round(runs):
    """After each of the R rounds, every client's federated heads are bitwise
    their task-seeded initial values; encoders and decoders did train."""
    initial = [model.state_dict() for model in _initial_models()]
    for round_ in range(1, ROUNDS + 1):
        for i, state in enumerate(_round_states(runs["babu"]["dir"], round_)):
            heads = [k for k in initial[i] if k.startswith("heads.")]
            assert heads
            for key in heads:
                assert torch.equal(state["model"][key], initial[i][key]), (round_, i, key)
            task = TINY_CLIENTS[i][1][0]
            for key in (TINY_STEM, f"decoders.{task}.fuse.weight"):
                assert not torch.equal(state["model"][key], initial[i][key]), (round_, i, key)


def test_the_trainer_leaves_heads_out_of_the_optimiser_and_frozen_in_every_round(runs):
    """Through the real LocalTrainer: in every round's local training the optimiser holds
    exactly the encoder and decoder parameters (no head in any param group) and the heads
    have requires_grad=False during the steps; the fine-tuning optimiser holds every
    parameter at the client's lr and weight decay, with no schedule."""
    calls = runs["babu"]["calls"]
    federated = [c for c in calls if not c["fine_tune"]]
    assert sorted((c["round"], c["client"]) for c in federated) == [
        (r, i) for r in range(1, ROUNDS + 1) for i in range(len(TINY_CLIENTS))
    ]
    for call in federated:
        heads = {n for n in call["names"].values() if n.startswith("heads.")}
        assert heads and call["optimised"] == set(call["names"].values()) - heads, call["client"]
        assert call["no_grad"] == heads, call["client"]
        assert call["scheduled"] is not None
    fine_tune = [c for c in calls if c["fine_tune"]]
    assert sorted(c["client"] for c in fine_tune) == list(range(len(TINY_CLIENTS)))
    for call in fine_tune:
        assert call["optimised"] == set(call["names"].values()) and call["no_grad"] == set()
        assert (call["lr"], call["weight_decay"], call["scheduled"]) == (1e-4, 1e-4, None)
    assert not any(c["fine_tune"] for c in runs["babu0"]["calls"])


def test_fine_tuning_changes_the_heads_and_not_the_federated_state(runs):
    """The fine-tuned copy differs from the federated model in every head
    tensor (and in encoder and decoders: everything is unfrozen), while the federated track
    — model, optimiser moments, epochs — is bitwise that of the same run with τ = 0."""
    for i, (tuned, plain) in enumerate(
        zip(client_states(runs["babu"]["dir"]), client_states(runs["babu0"]["dir"]), strict=True)
    ):
        assert tuned["model"].keys() == plain["model"].keys()
        for key in tuned["model"]:
            assert torch.equal(tuned["model"][key], plain["model"][key]), (i, key)
        assert tuned["epochs_done"] == plain["epochs_done"]
        assert tuned["optimizer"]["state"].keys() == plain["optimizer"]["state"].keys()
        for name, moments in tuned["optimizer"]["state"].items():
            assert torch.equal(moments["exp_avg"], plain["optimizer"]["state"][name]["exp_avg"]), (i, name)

        copy, federated = tuned["personal"]["fine_tuned"], tuned["model"]
        heads = [k for k in federated if k.startswith("heads.")]
        assert heads and all(not torch.equal(copy[k], federated[k]) for k in heads), i
        for part in ("encoder.", "decoders."):
            assert any(not torch.equal(copy[k], federated[k]) for k in federated if k.startswith(part)), (
                i,
                part,
            )
        # τ = 0: the "fine-tuned" model is the federated one.
        for key, value in plain["model"].items():
            assert torch.equal(plain["personal"]["fine_tuned"][key], value), (i, key)


def test_results_report_the_fine_tuned_copy_and_also_the_federated_model(runs):
    """results.json: ``evaluated`` is "fine-tuned" and its numbers are the copy's;
    ``also_evaluated.federated`` holds the federated model's, the same as the τ = 0 run's,
    whose two tables agree. metrics.csv has ``val/`` and ``val_federated/`` rows for every
    client and task in the last round."""
    babu, babu0 = _results(runs["babu"]["dir"]), _results(runs["babu0"]["dir"])
    for results in (babu, babu0):
        assert results["algorithm"] == "FedBABU" and results["evaluated"] == "fine-tuned"
        assert list(results["also_evaluated"]) == ["federated"]
    assert babu["also_evaluated"]["federated"] == babu0["also_evaluated"]["federated"]
    assert babu0["clients"] == babu0["also_evaluated"]["federated"]
    assert babu["clients"] != babu["also_evaluated"]["federated"]

    with open(runs["babu"]["dir"] / "metrics.csv") as f:
        keys = {r["key"] for r in csv.DictReader(f) if int(r["round"]) == ROUNDS}
    for name, client in babu["clients"].items():
        for task, metrics in client["metrics"].items():
            (metric,) = metrics
            assert f"val/{name}/{task}_{metric}" in keys
            assert f"val_federated/{name}/{task}_{metric}" in keys


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"ft_epochs": -1}, "ft_epochs"),
        ({"ft_epochs": 1.5}, "ft_epochs"),
        ({"ft_epochs": True}, "ft_epochs"),
        ({"ft_lr": 0}, "ft_lr"),
        ({"ft_lr": -1e-4}, "ft_lr"),
        ({"ft_lr": float("nan")}, "ft_lr"),
        ({"ft_weight_decay": -1e-4}, "ft_weight_decay"),
        ({"ft_weight_decay": float("nan")}, "ft_weight_decay"),
        ({"participation": 0}, "participation"),
    ],
)
def test_bad_hyper_parameters_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"algorithm\.{field}\b"):
        FedBABU(**kwargs)
    with pytest.raises(ValueError, match=rf"algorithm\.{field}\b"):
        create_method("FedBABU", **kwargs)


def test_cli_rejects_a_zero_fine_tuning_lr_before_writing_anything(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root, rounds=1)
    err_lines = fit_refused(
        config, tmp_path / "run", capsys, "--algorithm", "FedBABU", "--algorithm.ft_lr", "0"
    )
    assert len(err_lines) == 1 and "algorithm.ft_lr" in err_lines[0], err_lines
