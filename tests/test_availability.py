"""``availability``: clients that miss a round (dropout) or train only part of it (stragglers),
drawn from the run's seed for every client, so the same on one device or two and on resume; an
unavailable client keeps its state as a client whose update was dropped does."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedmtl.config import AvailabilityConfig
from fedmtl.federated.availability import RoundAvailability, batches_done, draw, totals
from tests.helpers import (
    TINY_CLIENTS,
    client_states,
    fit,
    fit_in_processes,
    fit_killed_in_round,
    keep_checkpoints,
    run_states,
    tiny_config,
)

SOME = AvailabilityConfig(dropout=0.3, stragglers=0.4, straggler_work=0.5)
MANY = 50  # clients in the unit tests of the draw


def _pattern(config: AvailabilityConfig, seed: int, rounds: int = 20) -> list[RoundAvailability]:
    return [draw(config, seed, r, MANY, None) for r in range(1, rounds + 1)]


# ---------------------------------------------------------------------------- the draw


def test_the_same_seed_draws_the_same_pattern_and_another_seed_another():
    assert _pattern(SOME, 0) == _pattern(SOME, 0)
    assert [d.unavailable for d in _pattern(SOME, 0)] != [d.unavailable for d in _pattern(SOME, 1)]
    assert [d.stragglers for d in _pattern(SOME, 0)] != [d.stragglers for d in _pattern(SOME, 1)]
    rounds = _pattern(SOME, 0)
    assert rounds[0].unavailable != rounds[1].unavailable  # redrawn every round


def test_the_rates_are_the_configured_probabilities():
    rounds = _pattern(SOME, 0, rounds=40)
    away = sum(len(d.unavailable) for d in rounds) / (MANY * len(rounds))
    available = sum(len(d.training) for d in rounds)
    slow = sum(len(d.stragglers) for d in rounds) / available
    assert abs(away - SOME.dropout) < 0.05
    assert abs(slow - SOME.stragglers) < 0.05


def test_stragglers_are_available_training_clients_and_the_others_train_whole():
    for d in _pattern(SOME, 3):
        assert not set(d.unavailable) & set(d.stragglers)
        assert d.training == [i for i in range(MANY) if i not in d.unavailable]
        assert set(d.stragglers) <= set(d.training)
    every = AvailabilityConfig(stragglers=1.0)
    d = draw(every, 0, 1, MANY, None)
    assert d.stragglers == tuple(range(MANY)) and d.unavailable == () and d.training is None


def test_a_clients_fate_does_not_depend_on_the_sample_around_it():
    """Drawn over every client of the run, then restricted to the method's sample: a sampled
    client's fate is the one it has in the unsampled draw, and only sampled clients miss out."""
    sampled = list(range(0, MANY, 3))
    for r in range(1, 10):
        whole, part = draw(SOME, 7, r, MANY, None), draw(SOME, 7, r, MANY, sampled)
        assert part.unavailable == tuple(i for i in whole.unavailable if i in sampled)
        assert part.stragglers == tuple(i for i in whole.stragglers if i in sampled)
        assert part.training == [i for i in sampled if i not in part.unavailable]


def test_with_nothing_configured_nothing_changes():
    off = AvailabilityConfig()
    assert not off.enabled
    assert draw(off, 0, 1, MANY, None) == RoundAvailability((), (), None)
    assert draw(off, 0, 1, MANY, [2, 5]) == RoundAvailability((), (), [2, 5])


@pytest.mark.parametrize(
    "batches, work, done",
    [(10, 0.7, 7), (3, 0.5, 2), (3, 0.25, 1), (5, 0.01, 1), (4, 1.0, 4), (7, 0.999, 7), (1, 0.5, 1)],
)
def test_a_straggler_trains_ceil_work_times_the_batches_at_least_one(batches, work, done):
    assert batches_done(batches, work) == done


def test_the_totals_count_the_draws_of_the_rounds_done():
    rounds = _pattern(SOME, 0, rounds=12)
    counted = totals(SOME, 0, 12, MANY, lambda r: None)
    assert counted == {
        "unavailable_client_rounds": sum(len(d.unavailable) for d in rounds),
        "straggling_client_rounds": sum(len(d.stragglers) for d in rounds),
    }
    assert totals(SOME, 0, 5, MANY, lambda r: None) != counted


# ---------------------------------------------------------------------------- through the engine


def _seed_where(
    config: AvailabilityConfig, rounds: int, wanted: Callable[[list[RoundAvailability]], bool]
) -> int:
    """The first seed whose draw over the tiny scenario's rounds is ``wanted``."""
    for seed in range(500):
        if wanted([draw(config, seed, r, TINY_CLIENTS, None) for r in range(1, rounds + 1)]):
            return seed
    raise AssertionError("no seed below 500 draws the wanted pattern")


def _scenario(
    tmp_path: Path, data_root: Path, method: str, config: AvailabilityConfig, rounds: int, seed: int = 0
) -> Path:
    """The tiny scenario under ``method`` with ``config`` as its ``availability``."""
    return tiny_config(
        tmp_path,
        data_root,
        name=f"{method}-{seed}-{config.stragglers}.yaml",
        algorithm={"class_path": method},
        rounds=rounds,
        seed=seed,
        availability=dataclasses.asdict(config),
    )


def _logged(run_dir: Path, key: str) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["round"]): float(r["value"]) for r in csv.DictReader(f) if r["key"] == key}


def _states(run_dir: Path, round_: int) -> list[dict]:
    """The clients as round ``round_``'s checkpoint leaves them: stored, their receipts
    applied, or drawn again if never stored."""
    folder = run_dir / "checkpoints" / f"round_{round_:04d}"  # the two latest rounds are kept
    return run_states(run_dir, folder)[:TINY_CLIENTS]


def _names(results: dict) -> list[str]:
    """The clients' names in client order (results.json lists them so)."""
    return list(results["clients"])


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_unavailable_client_keeps_its_state_the_others_change_and_a_resume_counts_alike(
    tmp_path, data_root, monkeypatch
):
    dropout = AvailabilityConfig(dropout=0.4)
    seed = _seed_where(dropout, 2, lambda d: not d[0].unavailable and len(d[1].unavailable) == 1)
    (away,) = draw(dropout, seed, 2, TINY_CLIENTS, None).unavailable
    config = _scenario(tmp_path, data_root, "FedAvg", dropout, 2, seed)
    straight = fit(config, tmp_path / "straight")

    before, after = _states(tmp_path / "straight", 1), _states(tmp_path / "straight", 2)
    for i in range(TINY_CLIENTS):
        kept = (
            _same(before[i]["model"], after[i]["model"])
            and before[i]["epochs_done"] == after[i]["epochs_done"]
        )
        assert kept == (i == away), i
    assert _logged(tmp_path / "straight", "server/unavailable") == {1: 0.0, 2: 1.0}
    assert _logged(tmp_path / "straight", "server/participants") == {2: 2.0}
    assert straight["availability"] == {
        **dataclasses.asdict(dropout),
        **totals(dropout, seed, 2, TINY_CLIENTS, lambda r: None),
    }
    assert straight["availability"]["unavailable_client_rounds"] == 1
    # It sends nothing and receives nothing in the round it is away; the others do both.
    name = _names(straight)[away]
    assert _logged(tmp_path / "straight", f"comm/{name}/up_bytes")[2] == 0
    assert _logged(tmp_path / "straight", f"comm/{name}/down_bytes")[2] == 0
    for other in set(_names(straight)) - {name}:
        assert _logged(tmp_path / "straight", f"comm/{other}/up_bytes")[2] > 0
        assert _logged(tmp_path / "straight", f"comm/{other}/down_bytes")[2] > 0

    fit_killed_in_round(config, tmp_path / "resumed", monkeypatch, 2)
    assert fit(config, tmp_path / "resumed", "--resume", "true") == straight


def test_fedhca2_with_dropout_and_stragglers_is_the_same_on_two_devices(
    tmp_path, data_root, monkeypatch, capsys
):
    """FedHCA² mixes every client: an unavailable one enters its step as a dropped update does,
    its round-start encoder with a zero delta, and is said to once."""
    from fedmtl.methods.fedhca2 import FedHCA2

    config_ = AvailabilityConfig(dropout=0.4, stragglers=0.5, straggler_work=0.5)
    seed = _seed_where(
        config_,
        2,
        lambda d: all(0 < len(r.unavailable) < TINY_CLIENTS and r.stragglers for r in d),
    )
    config = _scenario(tmp_path, data_root, "FedHCA2", config_, 2, seed)
    zero_rows: dict[int, list[int]] = {}
    step = FedHCA2.server_step

    def recording(self, inputs, encoders):
        rows = encoders["delta"]
        deltas = rows.read(range(inputs.num_clients), slice(0, rows.numel)).abs().sum(dim=1)
        zero_rows[inputs.round] = [i for i in range(inputs.num_clients) if float(deltas[i]) == 0]
        return step(self, inputs, encoders)

    monkeypatch.setattr(FedHCA2, "server_step", recording)
    one = fit(config, tmp_path / "one")
    err = capsys.readouterr().err
    assert err.count("note: availability.dropout 0.4: FedHCA2 mixes every client's update") == 1
    for r in (1, 2):
        assert zero_rows[r] == list(draw(config_, seed, r, TINY_CLIENTS, None).unavailable)
    assert one["availability"]["straggling_client_rounds"] >= 2

    two = fit_in_processes(config, tmp_path / "two")
    assert two == one
    for a, b in zip(client_states(tmp_path / "one"), client_states(tmp_path / "two"), strict=True):
        assert _same(a["model"], b["model"])
    assert _logged(tmp_path / "two", "server/stragglers") == _logged(tmp_path / "one", "server/stragglers")


def _steps(track: dict) -> int:
    """AdamW's step count of a track (every trained parameter has the same)."""
    return int(next(iter(track["optimizer"]["state"].values()))["step"])


def test_a_straggler_takes_fewer_steps_in_each_of_its_tracks_and_its_epochs_still_count(tmp_path, data_root):
    """Ditto trains two tracks: both straggle alike. The NYUD-v2 client has 3 batches an epoch."""
    slow = AvailabilityConfig(stragglers=1.0, straggler_work=0.25)
    runs = {}
    for name, config in {"whole": AvailabilityConfig(), "straggling": slow}.items():
        runs[name] = fit(_scenario(tmp_path, data_root, "Ditto", config, 2), tmp_path / name)
    whole, straggling = client_states(tmp_path / "whole")[2], client_states(tmp_path / "straggling")[2]
    epochs = whole["epochs_done"]
    per_epoch = _steps(whole) // epochs
    assert per_epoch > 1
    for track in (lambda s: s, lambda s: s["personal"]["track"]):
        assert _steps(track(whole)) == epochs * per_epoch
        assert _steps(track(straggling)) == epochs * batches_done(per_epoch, slow.straggler_work)
        assert track(straggling)["epochs_done"] == track(whole)["epochs_done"] == epochs
        # The schedule advanced by whole epochs: the same learning rate now.
        assert track(straggling)["optimizer"]["group"]["lr"] == track(whole)["optimizer"]["group"]["lr"]
    assert _logged(tmp_path / "straggling", "server/stragglers") == {1: 3.0, 2: 3.0}
    assert runs["straggling"]["availability"]["straggling_client_rounds"] == 2 * TINY_CLIENTS
    # Without availability, nothing new is logged or reported.
    assert "availability" not in runs["whole"]
    assert not _logged(tmp_path / "whole", "server/unavailable")


def test_a_round_with_every_client_unavailable_has_no_server_step_and_fedhca2_goes_on(
    tmp_path, data_root, monkeypatch, capsys
):
    dropout = AvailabilityConfig(dropout=0.6)
    everyone = TINY_CLIENTS

    def pattern(d: list[RoundAvailability]) -> bool:
        return len(d[0].unavailable) == everyone and d[1].training and len(d[2].unavailable) == everyone

    seed = _seed_where(dropout, 3, pattern)
    config = _scenario(tmp_path, data_root, "FedHCA2", dropout, 3, seed)
    keep_checkpoints(monkeypatch, 3)
    straight = fit(config, tmp_path / "straight")
    err = capsys.readouterr().err
    for r in (1, 3):
        assert f"warning: round {r}: all 3 clients that would train are unavailable" in err
    assert "round 2: all" not in err
    assert _logged(tmp_path / "straight", "server/unavailable")[1] == everyone
    assert _logged(tmp_path / "straight", "server/participants")[1] == 0
    assert (
        _logged(tmp_path / "straight", "comm/up_bytes")[1]
        == _logged(tmp_path / "straight", "comm/down_bytes")[1]
        == 0
    )
    first = _states(tmp_path / "straight", 1)
    assert all(s["epochs_done"] == 0 and s["optimizer"] is None for s in first)  # nothing trained or received
    last_two = _states(tmp_path / "straight", 2), _states(tmp_path / "straight", 3)
    assert all(_same(a["model"], b["model"]) for a, b in zip(*last_two, strict=True))

    # The skipped first round is server state too: a resume after it goes on alike.
    fit_killed_in_round(config, tmp_path / "resumed", monkeypatch, 2)
    assert fit(config, tmp_path / "resumed", "--resume", "true") == straight


def test_the_progress_line_names_unavailable_clients_and_stragglers_only_when_there_are_some():
    from fedmtl.federated.engine import progress_line

    line = progress_line(2, 5, {"server/unavailable": 2.0, "server/stragglers": 0.0, "time/train": 1.0})
    assert "unavailable: 2" in line and "stragglers" not in line
    line = progress_line(2, 5, {"server/unavailable": 0.0, "server/stragglers": 1.0, "time/train": 1.0})
    assert "stragglers: 1" in line and "unavailable" not in line


def test_fedbabus_fine_tuning_after_the_last_round_is_never_cut_short(tmp_path, data_root, monkeypatch):
    from fedmtl.federated.training import LocalTrainer

    calls: list[tuple[bool, float]] = []
    train = LocalTrainer.train

    def recording(self, module, client, dataset, track, **kwargs):
        calls.append((kwargs.get("fine_tune") is not None, kwargs.get("work", 1.0)))
        return train(self, module, client, dataset, track, **kwargs)

    monkeypatch.setattr(LocalTrainer, "train", recording)
    slow = AvailabilityConfig(stragglers=1.0, straggler_work=0.5)
    fit(_scenario(tmp_path, data_root, "FedBABU", slow, 1), tmp_path / "run")
    assert sorted(set(calls)) == [(False, 0.5), (True, 1.0)]
