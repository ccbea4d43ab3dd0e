"""Δm over (dataset, task) cells, the paper's 2C/4C definition, or over (client, task) columns
(``fedmtl report --delta_m``): hand cases, the 1C equality, the option's refusal."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fedmtl import report
from fedmtl.api import compare
from fedmtl.cli import main
from tests.helpers import refused_keeping

# Two PASCAL-Context semseg clients (one cell) and one NYUD-v2 normals client (lower is better).
HAND = (
    report.Column("a", "semseg", "mIoU", False, "pascal_context"),
    report.Column("b", "semseg", "mIoU", False, "pascal_context"),
    report.Column("c", "normals", "mErr", True, "nyud"),
)
RUN = {"a/semseg": 30.0, "b/semseg": 50.0, "c/normals": 18.0}
BASE = {"a/semseg": 20.0, "b/semseg": 20.0, "c/normals": 20.0}
# cells:   semseg (30 + 50)/2 = 40 against (20 + 20)/2 = 20: +100 %; normals −(18 − 20)/20 = +10 %
#          Δm = (100 + 10)/2 = 55
# columns: a +50 %, b +150 %, c +10 %: Δm = 210/3 = 70
CELLS, COLUMNS = 55.0, 70.0


def test_cells_average_the_clients_of_a_cell_first():
    assert report.delta_m_terms(HAND) == {
        ("pascal_context", "semseg"): ["a/semseg", "b/semseg"],
        ("nyud", "normals"): ["c/normals"],
    }
    assert report.run_delta_m(RUN, BASE, HAND) == pytest.approx(CELLS)
    assert report.run_delta_m(RUN, BASE, HAND, "columns") == pytest.approx(COLUMNS)


def test_cells_average_the_metric_not_the_relative_differences():
    """The paper's 2C/4C Δm is the Δm of its table's cells (each one number per (dataset,
    task)): the metric is averaged over the clients first. With unequal baselines the mean of
    the clients' relative differences would differ: (+100 % − 75 %)/2 = +12.5 %, against
    (25 − 30)/30 = −16.7 % for the cell; normals unchanged, so Δm = −16.7/2."""
    run = {"a/semseg": 40.0, "b/semseg": 10.0, "c/normals": 20.0}
    base = {"a/semseg": 20.0, "b/semseg": 40.0, "c/normals": 20.0}
    assert report.run_delta_m(run, base, HAND) == pytest.approx((-5 / 30 * 100 + 0) / 2)


def test_cells_and_columns_agree_where_each_cell_has_one_client():
    """The paper's 1C scenario 1: five single-task PASCAL-Context clients and one NYUD-v2
    multi-task client hold each (dataset, task) once: both definitions give the same Δm."""
    lower = {"normals", "depth"}
    columns = [
        report.Column(f"pascal-{t}", t, "m", t in lower, "pascal_context")
        for t in ("semseg", "human_parts", "sal", "normals", "edge")
    ] + [report.Column("nyud-mt", t, "m", t in lower, "nyud") for t in ("semseg", "normals", "edge", "depth")]
    rng = random.Random(0)
    for _ in range(5):
        run = {c.key: rng.uniform(0.5, 80) for c in columns}
        base = {c.key: rng.uniform(0.5, 80) for c in columns}
        assert len(report.delta_m_terms(columns)) == len(columns)
        assert report.run_delta_m(run, base, columns) == pytest.approx(
            report.run_delta_m(run, base, columns, "columns"), rel=1e-12
        )


def test_a_column_of_unknown_dataset_is_a_term_of_its_own():
    columns = [
        report.Column("a", "semseg", "mIoU", False, ""),
        report.Column("b", "semseg", "mIoU", False, ""),
    ]
    assert list(report.delta_m_terms(columns)) == ["a/semseg", "b/semseg"]


def test_the_curves_use_the_same_definition():
    history = {1: RUN, 2: {**RUN, "c/normals": 20.0}}
    baseline = {1: BASE, 2: BASE}
    rounds, values = report.delta_m_series(history, baseline, HAND)
    assert rounds == [1, 2] and values == pytest.approx([CELLS, 50.0])
    assert report.delta_m_series(history, baseline, HAND, "columns")[1] == pytest.approx([COLUMNS, 200 / 3])


# ---------------------------------------------------------------------------- the command


def _write(folder: Path, algorithm: str, values: dict[str, float]) -> Path:
    """A results.json as the engine writes it for the three clients of HAND."""
    clients = {
        c.client: {
            "dataset": c.dataset,
            "tasks": [c.task],
            "metrics": {c.task: {c.metric: values[c.key]}},
        }
        for c in HAND
    }
    folder.mkdir(parents=True)
    results = {"rounds": 1, "algorithm": algorithm, "seed": 0, "clients": clients, "server": {}}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


@pytest.fixture
def hand_runs(tmp_path) -> list[str]:
    return [str(_write(tmp_path / "local", "Local", BASE)), str(_write(tmp_path / "fedavg", "FedAvg", RUN))]


def _delta_m_of(csv_text: str) -> dict[str, float]:
    lines = csv_text.strip().splitlines()
    header = lines[0].split(",")
    return {row[0]: float(row[header.index("delta_m")]) for row in (line.split(",") for line in lines[1:])}


def test_report_defaults_to_cells_and_offers_columns(hand_runs, capsys):
    assert _delta_m_of(compare(hand_runs, format="csv"))["FedAvg"] == pytest.approx(CELLS)
    assert _delta_m_of(compare(hand_runs, format="csv", delta_m="columns"))["FedAvg"] == pytest.approx(
        COLUMNS
    )
    capsys.readouterr()
    assert main(["report", *hand_runs, "--format", "csv", "--delta_m", "columns"]) in (0, None)
    assert _delta_m_of(capsys.readouterr().out)["FedAvg"] == pytest.approx(COLUMNS)


def test_an_unknown_delta_m_is_refused_in_one_line(hand_runs, tmp_path, capsys):
    lines = refused_keeping(["report", *hand_runs, "--delta_m", "clients"], tmp_path, capsys)
    (line,) = [line for line in lines if line.startswith("error:")]
    assert line.startswith("error: --delta_m is 'clients': use cells")
    assert "or columns" in line
    with pytest.raises(ValueError, match="--delta_m is 'rows'"):
        compare(hand_runs, delta_m="rows")


def _baseline(metrics: dict[str, float]) -> report.RunGroup:
    run = report.Run(Path("local"), "Local", 0, {}, HAND, metrics, "k")
    return report.RunGroup("Local", (run,))


def test_a_zero_client_in_a_cell_leaves_cells_defined_but_not_columns():
    """Δm divides by each term's baseline: with cells, the semseg cell's (0 + 20)/2 = 10 is a
    divisor; with columns, client a's 0 is not."""
    base = _baseline({"a/semseg": 0.0, "b/semseg": 20.0, "c/normals": 20.0})
    report.check_baseline_defined(base, HAND, "cells")
    with pytest.raises(ValueError, match=r"local has a/semseg mIoU = 0 \(Δm is relative"):
        report.check_baseline_defined(base, HAND, "columns")
    both_zero = _baseline({"a/semseg": 0.0, "b/semseg": 0.0, "c/normals": 20.0})
    with pytest.raises(ValueError, match=r"local has a/semseg mIoU \+ b/semseg mIoU = 0"):
        report.check_baseline_defined(both_zero, HAND, "cells")


def test_the_curves_skip_a_round_only_where_a_term_of_the_baseline_is_0():
    history = {1: {"a/semseg": 30.0, "b/semseg": 50.0, "c/normals": 18.0}}
    baseline = {1: {"a/semseg": 0.0, "b/semseg": 40.0, "c/normals": 20.0}}
    # cells: semseg 40 against 20, +100 %; normals +10 %: Δm 55. columns: a's 0 leaves it undefined.
    assert report.delta_m_series(history, baseline, HAND, "cells") == ([1], [pytest.approx(55.0)])
    assert report.delta_m_series(history, baseline, HAND, "columns") == ([], [])
