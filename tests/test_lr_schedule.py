"""The learning-rate schedule as a pure function, and the warning a run gets before it writes
anything when it would spend most of a client group's epochs at the warm-up's start rate
(issue #37 item 2: ``--rounds 2`` on the demo trained every epoch at 1.25e-7, silently)."""

from __future__ import annotations

import pytest

from fedmtl.config import OptimizerConfig
from fedmtl.federated.training import epoch_rates, warmup_start_epochs

DEMO = OptimizerConfig(lr=1e-3, warmup_epochs=1)  # configs/demo.yaml's clients


def test_each_epoch_trains_at_the_schedules_value_for_the_epoch_before():
    rates = epoch_rates(DEMO, 8)
    assert rates[:3] == [1.25e-7, 1.25e-7, 1e-3]  # the warm-up start twice, then the peak
    assert all(a > b for a, b in zip(rates[2:], rates[3:], strict=False))  # the cosine decays
    assert rates[-1] > DEMO.min_lr
    assert epoch_rates(DEMO, 2) == [1.25e-7, 1.25e-7]  # the demo's pascal group at --rounds 2


def test_no_warm_up_starts_at_the_peak():
    rates = epoch_rates(OptimizerConfig(lr=1e-3, warmup_epochs=0), 3)
    assert rates[:2] == [1e-3, 1e-3] and rates[2] < 1e-3


@pytest.mark.parametrize(
    ("cfg", "epochs", "slow"),
    [
        (DEMO, 2, 2),
        (DEMO, 8, 2),
        (OptimizerConfig(lr=1e-3, warmup_epochs=5), 3, 2),
        (OptimizerConfig(lr=1e-3, warmup_epochs=0), 10, 0),
        # a cosine floor below the warm-up's start counts too: its last epoch reaches it
        (OptimizerConfig(lr=1e-3, warmup_epochs=1, warmup_lr=1e-5, min_lr=0.0), 40, 3),
    ],
)
def test_epochs_at_the_warm_up_start(cfg, epochs, slow):
    assert warmup_start_epochs(cfg, epochs) == slow


def _demo(*argv: str):
    from fedmtl.cli import _instantiate, _run_parser

    parser = _run_parser()
    return _instantiate(parser, parser.parse_args(["--config", "configs/demo.yaml", *argv]))


def test_the_demo_shortened_to_two_rounds_is_warned_for_its_single_task_group():
    from fedmtl.federated.preflight import warmup_warnings

    assert warmup_warnings(_demo("--rounds", "2")) == [
        "warning: clients[0] (pascal_context, single-task): 2 of its 2 local epochs (2 rounds x 1) train "
        "at the warm-up's start rate 1.25e-07 (optimizer.warmup_lr; epoch e trains at the schedule's "
        "value for e - 1), so it would barely train: use --rounds 4 or more, or no warm-up "
        "(--clients.0.optimizer.warmup_epochs 0)"
    ]
    assert warmup_warnings(_demo()) == []  # the demo itself, 10 rounds
    assert warmup_warnings(_demo("--rounds", "4")) == []  # the fewest the warning names


def test_the_readmes_shorter_demo_is_not_warned():
    import re
    from pathlib import Path

    from fedmtl.federated.preflight import warmup_warnings

    readme = Path(__file__).resolve().parents[1] / "README.md"
    shorter = re.search(r"`(--rounds \d+) --run_dir runs/demo-short`", readme.read_text())
    assert shorter, "the README's shorter demo run is gone: update this test"
    assert warmup_warnings(_demo(*shorter.group(1).split())) == []


def test_a_run_planned_forever_is_not_stepped_through_epoch_by_epoch(monkeypatch):
    """``--rounds 100000000`` (a run until stopped) took 20 minutes in the warm-up check: its
    cosine never comes back down to the warm-up's start, so no schedule is stepped."""
    from fedmtl.federated import preflight, training

    def stepped(cfg, total_epochs):
        raise AssertionError(f"the schedule was stepped through {total_epochs} epochs")

    monkeypatch.setattr(training, "epoch_rates", stepped)
    assert preflight.warmup_warnings(_demo("--rounds", "100000000")) == []
