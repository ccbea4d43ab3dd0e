"""Test helpers: the tiny scenario as a config file and a one-call run of the engine.

A tiny scenario (2 PASCAL-Context single-task clients + 1 NYUD-v2 multi-task client, 32×32
images, 12 training images per dataset, timm's 82k-parameter ``test_efficientnet`` encoder)
runs a round in about a second, so end-to-end tests of every method go through the real
engine, CLI, store and checkpoints. The tiny encoder keeps a client's checkpoint near 1 MiB:
with the default regnetx_002 (27 MiB) the suite's runs peaked at 9 GB of disk and once filled
CI's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import yaml

TINY_BACKBONE = "test_efficientnet"  # BatchNorm, strides 4-32 like the default, 28x fewer weights
TINY_STEM = "encoder.body.conv_stem.weight"  # its first convolution: an encoder weight every client has
TINY = {
    "clients": [
        {"dataset": "pascal_context", "tasks": ["semseg", "sal"], "single_task": True, "batch_size": 4},
        {"dataset": "nyud", "tasks": ["semseg", "depth"], "local_epochs": 2, "batch_size": 4},
    ],
    "data": {"train_size": [32, 32]},
    "model": {"backbone": TINY_BACKBONE},
    "evaluation": {"every": 2},
    "rounds": 3,
    "accelerator": "cpu",
    "cpu_threads": 1,
    "logger": {"wandb": False},
}
TINY_CLIENTS = 3  # pascal_context-semseg, pascal_context-sal, nyud-semseg+depth
REPO = Path(__file__).resolve().parents[1]


def load_script(path: str, register: bool = False) -> ModuleType:
    """The script ``REPO/PATH.py`` (``benchmarks/NAME``, ``probes/NAME``) loaded as a module
    named NAME: by its file, since Opacus installs a top-level ``benchmarks`` package that
    shadows ours. ``register``: also as ``sys.modules[NAME]``, which a script's dataclasses
    need while it loads (the caller removes it when done)."""
    spec = importlib.util.spec_from_file_location(Path(path).name, REPO / f"{path}.py")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def tiny_config(tmp_path: Path, data_root: Path, name: str = "scenario.yaml", **changes) -> Path:
    """The tiny scenario as a YAML file, with top-level fields replaced by ``changes``."""
    cfg = json.loads(json.dumps(TINY))
    cfg["data"]["root"] = str(data_root)
    cfg.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit(config: Path, run_dir: Path, *extra: str) -> dict:
    """``fedmtl fit`` in-process; returns results.json."""
    from fedmtl.cli import main

    assert main(["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]) == 0
    return read_results(run_dir)


def fit_in_processes(config: Path, run_dir: Path, devices: int = 2) -> dict:
    """``fedmtl fit --devices N`` in a subprocess (Fabric launches N CPU processes); returns
    results.json."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(run_dir)]
    done = subprocess.run(
        [*command, "--devices", str(devices)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return read_results(run_dir)


def fit_refused(config: Path, run_dir: Path, capsys, *extra: str) -> list[str]:
    """``fedmtl fit`` that must be refused: asserts a non-zero exit and an empty or absent
    ``run_dir``; returns the non-blank lines it wrote to stderr."""
    from fedmtl.cli import main

    try:
        code = main(["fit", "--config", str(config), "--run_dir", str(run_dir), *extra])
    except SystemExit as done:  # jsonargparse's own type errors exit through the parser
        code = done.code
    assert code not in (0, None)
    assert not run_dir.exists() or not any(run_dir.iterdir())
    return stderr_lines(capsys.readouterr().err)


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path (empty if it does not exist)."""
    import hashlib

    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def stderr_lines(err: str) -> list[str]:
    """The non-blank lines of a command's stderr, less fit's warning that a client group trains
    mostly at its warm-up's start rate: the tiny scenario does, on purpose (it is a check of
    the machinery, not of learning), and tests/test_lr_schedule.py tests that warning."""
    return [line for line in err.splitlines() if line.strip() and not _warm_up_warning(line)]


def _warm_up_warning(line: str) -> bool:
    return line.startswith("warning: clients[") and "at the warm-up's start rate" in line


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``fedmtl ARGV`` in-process: its exit code and the non-blank stderr lines (less the
    warm-up warning: :func:`stderr_lines`)."""
    from fedmtl.cli import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    return code, stderr_lines(capsys.readouterr().err)


def refused_keeping(command: list[str], folder: Path, capsys, stdout: list[str] | None = None) -> list[str]:
    """``fedmtl COMMAND`` that must be refused without changing any file under ``folder``:
    asserts a non-zero exit, exactly one ``error:`` line and unchanged hashes; returns the
    non-blank stderr lines (and appends what it printed on stdout to ``stdout``, if given)."""
    from fedmtl.cli import main

    before = file_hashes(folder)
    capsys.readouterr()
    try:
        code = main(command)
    except SystemExit as done:
        code = done.code
    assert code not in (0, None)
    assert file_hashes(folder) == before
    captured = capsys.readouterr()
    if stdout is not None:
        stdout.append(captured.out)
    lines = stderr_lines(captured.err)
    assert sum(line.startswith("error:") for line in lines) == 1, lines
    return lines


def fit_killed_in_round(config: Path, run_dir: Path, monkeypatch, round_: int, fit_run=None) -> None:
    """``fit`` (or ``fit_run``) killed as round ``round_`` starts training a client, as by
    Ctrl-C: the checkpoints of the rounds before it stay in ``run_dir``."""
    import pytest

    from fedmtl.federated.rounds import Round

    original = Round.train_client

    def killed(self, *args):
        if self.number == round_:
            raise KeyboardInterrupt("killed")
        return original(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(Round, "train_client", killed)
        with pytest.raises(KeyboardInterrupt):
            (fit_run or fit)(config, run_dir)


def fit_each(tmp: Path, data_root: Path, algorithms: dict[str, dict], **changes) -> dict[str, Path]:
    """The tiny scenario (with ``changes``) under each named algorithm (``class_path`` /
    ``init_args``), same seed; returns each run's directory."""
    out = {}
    for name, algorithm in algorithms.items():
        config = tiny_config(tmp, data_root, name=f"{name}.yaml", algorithm=algorithm, **changes)
        fit(config, tmp / name)
        out[name] = tmp / name
    return out


def read_results(run_dir: Path) -> dict:
    """A finished run's results.json."""
    return json.loads((run_dir / "results.json").read_text())


def client_states(run_dir: Path, clients: int = TINY_CLIENTS) -> list[dict]:
    """Every client's state (federated track and ``personal``) as the run's latest checkpoint
    leaves it: its stored state with its pending receipts applied."""
    return run_states(run_dir)[:clients]


def stored_states(run_dir: Path, clients: int = TINY_CLIENTS) -> list[dict]:
    """Every client's stored state in the latest checkpoint, its pending receipts not applied."""
    from fedmtl.federated import checkpoint

    folder = checkpoint.latest(run_dir)
    return [checkpoint.load_client(folder, i) for i in range(clients)]


def run_states(run_dir: Path, folder: Path | None = None) -> list[dict]:
    """:func:`fedmtl.federated.engine.checkpoint_states` of a run's directory (its latest
    checkpoint, or ``folder``)."""
    from fedmtl.cli import _instantiate, _run_parser
    from fedmtl.federated import rundir
    from fedmtl.federated.engine import checkpoint_states

    parser = _run_parser()
    cfg_ns = rundir.read_config(parser, run_dir / "config.yaml")
    cfg_ns.run_dir = str(run_dir)
    cfg_ns.logger.wandb = False
    return checkpoint_states(_instantiate(parser, cfg_ns), folder)


# ---------------------------------------------------------------------------- a hand round

# FedAvg's hand case: clients A:semseg, B:depth, C:semseg+normals (shards 1000, 1000,
# 795); trained encoders 1, 2, 6 and decoders A:semseg (1,1), B:depth (3,3), C:semseg (0,0),
# C:normals (4,0), each given as start + Δ with both parts exact in float32.
HAND_ENCODERS_PREV, HAND_ENCODER_DELTAS = [[0.5], [1.5], [4.0]], [[0.5], [0.5], [2.0]]
HAND_ENCODERS_TRAINED = [[1.0], [2.0], [6.0]]
HAND_DECODERS_PREV = [[0.5, 1.0], [2.0, 3.5], [0.25, -1.0], [4.0, 0.5]]
HAND_DECODER_DELTAS = [[0.5, 0.0], [1.0, -0.5], [-0.25, 1.0], [0.0, -0.5]]
HAND_DECODERS_TRAINED = [[1.0, 1.0], [3.0, 3.0], [0.0, 0.0], [4.0, 0.0]]


def hand_clients():
    from fedmtl.aggregation import ClientInfo

    return [
        ClientInfo("A", "pascal_context", ("semseg",), 1000),
        ClientInfo("B", "nyud", ("depth",), 1000),
        ClientInfo("C", "nyud", ("semseg", "normals"), 795),
    ]


def round_from_trained(
    clients, layout, encoders, encoder_deltas, decoders, decoder_deltas, participants=None
):
    """A round-1 :class:`~fedmtl.aggregation.RoundInput` whose trained rows are ``encoders`` /
    ``decoders`` (same layout for both), given with their deltas: prev = trained − Δ."""
    from fedmtl.aggregation import RoundInput, decoder_owners_of

    return RoundInput(
        round=1,
        clients=clients,
        encoder_layout=layout,
        encoders_prev=encoders - encoder_deltas,
        encoder_deltas=encoder_deltas,
        decoder_layout=layout,
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=decoders - decoder_deltas,
        decoder_deltas=decoder_deltas,
        participants=participants,
    )


def hand_round(round_: int = 1, participants: tuple[int, ...] | None = None):
    """FedAvg's hand case (above) as a server's :class:`~fedmtl.aggregation.RoundInput`."""
    import torch

    from fedmtl.aggregation import FlatLayout, RoundInput, decoder_owners_of

    def layout(numel: int) -> FlatLayout:
        return FlatLayout(names=("w",), shapes=((numel,),), dtypes=(torch.float32,), tensor_layers=("",))

    clients = hand_clients()
    return RoundInput(
        round=round_,
        clients=clients,
        encoder_layout=layout(1),
        encoders_prev=torch.tensor(HAND_ENCODERS_PREV),
        encoder_deltas=torch.tensor(HAND_ENCODER_DELTAS),
        decoder_layout=layout(2),
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=torch.tensor(HAND_DECODERS_PREV),
        decoder_deltas=torch.tensor(HAND_DECODER_DELTAS),
        participants=participants,
    )


# ---------------------------------------------------------------------------- recording local training


@contextlib.contextmanager
def recording_training(calls: list[dict], keep_rounds: int) -> Iterator[None]:
    """For every ``LocalTrainer.train`` call, record the parameter names in the optimiser it
    builds (through the project's ``make_optimizer``), its learning rate and weight decay,
    and the names with requires_grad=False during its steps (the client, its round and
    whether it fine-tunes, too). The last ``keep_rounds`` rounds' checkpoints are kept."""
    import pytest

    from fedmtl.federated import training
    from fedmtl.federated.client import ClientModule
    from fedmtl.federated.training import LocalTrainer

    train, make, step = LocalTrainer.train, training.make_optimizer, ClientModule.training_step

    def recording_train(self, module, client, dataset, track, **kwargs):
        names = {id(p): n for n, p in module.model.named_parameters()}
        epochs = module.spec.local_epochs
        calls.append(
            {
                "client": client,
                "fine_tune": kwargs.get("fine_tune") is not None,
                "round": track["epochs_done"] // epochs + 1,
                "names": names,
                "no_grad": set(),
            }
        )
        return train(self, module, client, dataset, track, **kwargs)

    def recording_make(params, config, total_epochs):
        optimizer, scheduler = make(params, config, total_epochs)
        if not calls:  # fit's warm-up check, before any training (preflight.warmup_warnings)
            return optimizer, scheduler
        call = calls[-1]
        (group,) = optimizer.param_groups
        call["optimised"] = {call["names"][id(p)] for p in group["params"]}
        call["lr"], call["weight_decay"], call["scheduled"] = group["lr"], group["weight_decay"], scheduler
        return optimizer, scheduler

    def recording_step(self, batch, batch_idx=0):
        calls[-1]["no_grad"] |= {n for n, p in self.model.named_parameters() if not p.requires_grad}
        return step(self, batch, batch_idx)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalTrainer, "train", recording_train)
        mp.setattr(training, "make_optimizer", recording_make)
        mp.setattr(ClientModule, "training_step", recording_step)
        keep_checkpoints(mp, keep_rounds)
        yield


def keep_checkpoints(monkeypatch, rounds: int) -> None:
    """Every run keeps its last ``rounds`` checkpoints whatever its ``checkpoint_keep`` (the
    tests read the states of rounds a run has moved past)."""
    from fedmtl.federated import checkpoint

    publish = checkpoint.publish
    monkeypatch.setattr(
        checkpoint,
        "publish",
        lambda run_dir, round_, server, keep=2: publish(run_dir, round_, server, keep=rounds),
    )


# A small hand round for checking a method's server step against the math of
# fedmtl/aggregation/functional.py: five clients in three homogeneous groups (seven decoders),
# with the clients that did not train as the engine gives them, non-participants with their
# round-start rows and zero deltas: sampled out (``participation`` < 1), their update dropped
# (``nonfinite: drop``), or unavailable (``availability.dropout``).
MATH_CASES = {"sampled": (0, 2, 3), "dropped": (0, 1, 2, 4), "unavailable": (1, 2)}


def math_clients():
    from fedmtl.aggregation import ClientInfo

    return [
        ClientInfo("pc-semseg-0", "pascal_context", ("semseg",), 10),
        ClientInfo("pc-semseg-1", "pascal_context", ("semseg",), 12),
        ClientInfo("pc-normals", "pascal_context", ("normals",), 7),
        ClientInfo("nyud-0", "nyud", ("semseg", "depth"), 5),
        ClientInfo("nyud-1", "nyud", ("semseg", "depth"), 8),
    ]


def math_round(participants, round_: int = 1, seed: int = 0):
    """The hand round: encoders P = 6, decoders Q = 6 in two layers; rows of clients outside
    ``participants`` have zero deltas."""
    import torch

    from fedmtl.aggregation import FlatLayout, RoundInput, decoder_owners_of

    clients = math_clients()
    g = torch.Generator().manual_seed(1000 * seed + round_)
    owners = decoder_owners_of(clients)
    taking_part = set(participants)

    def pair(rows: int, numel: int, trained_rows: list[int]):
        prev = torch.randn(rows, numel, generator=g)
        delta = 0.3 * torch.randn(rows, numel, generator=g)
        delta[[r for r in range(rows) if r not in trained_rows]] = 0.0
        return prev, delta

    enc_prev, enc_delta = pair(len(clients), 6, sorted(taking_part))
    dec_prev, dec_delta = pair(len(owners), 6, [k for k, (i, _) in enumerate(owners) if i in taking_part])
    f32 = (torch.float32,) * 2
    return RoundInput(
        round=round_,
        clients=clients,
        encoder_layout=FlatLayout(names=("a", "b"), shapes=((4,), (2,)), dtypes=f32, tensor_layers=("", "")),
        encoders_prev=enc_prev,
        encoder_deltas=enc_delta,
        decoder_layout=FlatLayout(
            names=("w", "b"), shapes=((4,), (2,)), dtypes=f32, tensor_layers=("0", "1")
        ),
        decoder_owners=owners,
        decoders_prev=dec_prev,
        decoder_deltas=dec_delta,
        participants=tuple(participants),
    )


def assert_relative(got, want, tol: float = 1e-6) -> None:
    """‖got − want‖ ≤ tol · ‖want‖ (float64), with equal shapes."""
    assert tuple(got.shape) == tuple(want.shape), (tuple(got.shape), tuple(want.shape))
    error = float((got.double() - want.double()).norm())
    assert error <= tol * float(want.double().norm()), (error, float(want.double().norm()))
