"""wandb as a dashboard (issue #37, item 7): the round is the x-axis of every series, a method's
per-client weights (FedHCA²'s α) are one chart per run and its matrices (β) a heatmap, both in
an ``aggregation/`` section, and ``logger.group`` / ``tags`` / ``entity`` reach ``wandb.init``.

wandb.init is replaced by a recorder here: no wandb run is started. The offline run of a real
FedHCA² fit is checked in tests/test_dashboards.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wandb

from fedmtl.config import LoggerConfig
from fedmtl.federated.runlog import (
    CSVScalarLogger,
    RoundWandbLogger,
    aggregation_series,
    create_loggers,
    default_group,
    is_charted,
    log_charts,
)


class FakeRun:
    """What the logger asks of a wandb run: its metric definitions and logged rows."""

    def __init__(self) -> None:
        self.defined: list[tuple[str, dict[str, Any]]] = []
        self.rows: list[dict[str, Any]] = []

    def define_metric(self, name: str, **kwargs: Any) -> None:
        self.defined.append((name, kwargs))

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


@pytest.fixture
def wandb_init(monkeypatch):
    """wandb.init recording its keyword arguments and returning a FakeRun."""
    calls: list[dict[str, Any]] = []

    def init(**kwargs: Any) -> FakeRun:
        calls.append(kwargs)
        return FakeRun()

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "run", None)
    monkeypatch.setenv("WANDB_MODE", "offline")  # Lightning sets it for an offline run: restored after
    return calls


def _loggers(tmp_path: Path, **fields: Any) -> tuple[CSVScalarLogger, RoundWandbLogger]:
    config = {"algorithm": {"class_path": "FedHCA2"}, "rounds": 3, "seed": 0, "run_dir": str(tmp_path)}
    csv_logger, wandb_logger = create_loggers(LoggerConfig(mode="offline", **fields), tmp_path, config)
    assert isinstance(wandb_logger, RoundWandbLogger)
    return csv_logger, wandb_logger


def test_every_series_is_plotted_against_the_round(tmp_path, wandb_init):
    _, logger = _loggers(tmp_path)
    logger.log_metrics({"loss/nyud-semseg": 1.5, "server/participants": 3.0}, step=4)
    run = logger.experiment
    assert ("round", {}) in run.defined
    star = [kwargs for name, kwargs in run.defined if name == "*"]
    assert star and star[-1]["step_metric"] == "round" and star[-1]["overwrite"] is True
    assert run.rows == [{"loss/nyud-semseg": 1.5, "server/participants": 3.0, "round": 4}]
    assert "trainer/global_step" not in run.rows[0]


def test_group_tags_and_entity_reach_wandb_init(tmp_path, wandb_init):
    _, logger = _loggers(tmp_path, group="nyud-sweep", tags=["nyud", "ablation"], entity="my-lab")
    assert isinstance(logger.experiment, FakeRun)  # starts the run: wandb.init
    assert len(wandb_init) == 1
    assert wandb_init[0]["group"] == "nyud-sweep"
    assert wandb_init[0]["tags"] == ["nyud", "ablation"]
    assert wandb_init[0]["entity"] == "my-lab"
    assert wandb_init[0]["project"] == "fedmtl"


def test_the_default_group_gathers_the_seeds_of_one_setting(tmp_path, wandb_init):
    _, logger = _loggers(tmp_path)
    assert isinstance(logger.experiment, FakeRun)  # starts the run: wandb.init
    config = {"algorithm": {"class_path": "fedmtl.methods.FedHCA2"}, "rounds": 3, "seed": 0}
    group = default_group(config)
    assert wandb_init[0]["group"].startswith("FedHCA2-") and group.startswith("FedHCA2-")
    assert default_group({**config, "seed": 1, "run_dir": "runs/seed1", "logger": {"tags": ["x"]}}) == group
    assert default_group({**config, "rounds": 4}) != group
    assert default_group({}) is None


def test_alpha_is_one_chart_per_run_and_beta_a_heatmap(tmp_path, wandb_init, monkeypatch):
    csv_logger, logger = _loggers(tmp_path)
    clients = ["pascal-semseg", "nyud-semseg+depth"]
    for step, alphas in [(1, [0.1, 0.1]), (2, [0.2, 0.05])]:
        values = {"loss/pascal-semseg": 1.0, "server/participants": 2.0}
        values |= {f"aggregation/alpha/{c}": a for c, a in zip(clients, alphas)}
        values |= {f"aggregation/beta/{c}/semseg/fuse": 0.1 for c in clients}
        for lg in (csv_logger, logger):
            lg.log_metrics(values, step=step)
    charts: list[dict[str, Any]] = []

    def line_series(**kwargs: Any) -> str:
        charts.append(kwargs)
        return "chart"

    monkeypatch.setattr(wandb.plot, "line_series", line_series)
    beta = ([f"{c} / semseg" for c in clients], ["fuse"], np.array([[0.1], [0.3]]))
    log_charts([csv_logger, logger], {"beta": beta}, step=2)

    rows = logger.experiment.rows
    # per-client members stay in metrics.csv, out of wandb: no panel per client
    assert not [k for row in rows for k in row if k.startswith(("aggregation/alpha/", "aggregation/beta/"))]
    assert [row["round"] for row in rows] == [1, 2, 2]
    assert set(rows[-1]) == {"aggregation/alpha", "aggregation/beta", "round"}
    assert rows[-1]["aggregation/alpha"] == "chart"
    assert isinstance(rows[-1]["aggregation/beta"], wandb.Image)
    assert len(charts) == 1
    assert charts[0]["keys"] == clients and charts[0]["xname"] == "round"
    assert charts[0]["xs"] == [[1, 2], [1, 2]]
    assert charts[0]["ys"] == [[0.1, 0.2], [0.1, 0.05]]


def test_aggregation_series_reads_the_per_client_families_of_metrics_csv(tmp_path):
    logger = CSVScalarLogger(tmp_path / "metrics.csv")
    logger.log_metrics({"aggregation/xi_self/a": 0.5, "aggregation/beta/a/semseg/fuse": 0.1}, step=1)
    logger.log_metrics({"aggregation/xi_self/a": 0.4, "aggregation/xi_self/b": 0.3}, step=2)
    assert aggregation_series(tmp_path / "metrics.csv") == {
        "xi_self": {"a": ([1, 2], [0.5, 0.4]), "b": ([2], [0.3])}
    }
    assert aggregation_series(tmp_path / "missing.csv") == {}
    assert is_charted("aggregation/alpha/a") and is_charted("aggregation/beta/a/semseg/fuse")
    assert not is_charted("aggregation/alpha") and not is_charted("server/participants")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"group": ""}, "logger.group must be 1 to 128 characters, got ''"),
        ({"group": "g" * 129}, "logger.group must be 1 to 128 characters"),
        ({"tags": "nyud"}, "logger.tags must be a list of tags of 1 to 64 characters each, got 'nyud'"),
        ({"tags": ["ok", ""]}, "logger.tags must be a list of tags of 1 to 64 characters each"),
        ({"tags": ["t" * 65]}, "logger.tags must be a list of tags of 1 to 64 characters each"),
        (
            {"entity": "my lab"},
            "logger.entity must be a wandb user or team name (no spaces or '/'), got 'my lab'",
        ),
        ({"entity": ""}, "logger.entity must be a wandb user or team name"),
    ],
)
def test_bad_logger_fields_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        LoggerConfig(**fields)


def test_a_bad_tag_is_one_error_line_from_the_cli(tmp_path, data_root, capsys):
    from fedmtl.cli import main
    from tests.helpers import tiny_config

    config = tiny_config(tmp_path, data_root, rounds=1, run_dir=str(tmp_path / "run"))
    assert main(["fit", "--config", str(config), "--logger.tags", "[ok, '']"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: ") and "logger.tags must be a list" in err[0]
    assert not (tmp_path / "run").exists()
