"""Issue #26, item 7: ``fedmtl report`` refuses numbers it cannot trust, in one line.

A metric in results.json that is not a finite number (a string, NaN, Infinity, a bool) names
the run and the key instead of printing ``nan`` or a Δm of thousands of per cent; a
metrics.csv that cannot be read to the run's last round (cut mid-line, cut at a line, a bad
number) is one line for ``--curves`` instead of a run silently missing from the figure. A
``nan`` the engine itself wrote (a model that was not finite at an evaluation round) is
not an error: that round is left out of the curves. Nothing is written when the report fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedmtl import report
from fedmtl.cli import main
from tests.helpers import file_hashes, fit, refused_keeping, tiny_config

# Two clients, 2 rounds evaluated each: no semseg, whose mIoU after a tiny round can be 0.
CLIENTS = [
    {"dataset": "pascal_context", "tasks": ["sal"], "batch_size": 4},
    {"dataset": "nyud", "tasks": ["normals", "depth"], "batch_size": 4},
]
DEPTH = "nyud-normals+depth/depth"


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    out = {}
    for algorithm in ("Local", "FedAvg"):
        config = tiny_config(
            module_dir,
            data_root,
            name=f"{algorithm}.yaml",
            algorithm={"class_path": algorithm},
            rounds=2,
            evaluation={"every": 1},
            clients=CLIENTS,
        )
        fit(config, module_dir / algorithm.lower())
        out[algorithm] = module_dir / algorithm.lower()
    return out


@pytest.fixture
def copies(runs, tmp_path) -> tuple[Path, Path]:
    """Copies of the two runs (Local, FedAvg) that a test may damage."""
    return tuple(shutil.copytree(runs[name], tmp_path / name.lower()) for name in ("Local", "FedAvg"))


def _set_depth(run: Path, text: str) -> None:
    """results.json with the depth RMSE written as ``text`` (raw JSON: NaN, "abc", true)."""
    results = json.loads((run / "results.json").read_text())
    results["clients"]["nyud-normals+depth"]["metrics"]["depth"]["RMSE"] = "@@"
    (run / "results.json").write_text(json.dumps(results).replace('"@@"', text))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", '"0.8"', '"abc"', "true"])
def test_a_metric_that_is_not_a_finite_number_is_one_line_naming_the_run_and_key(
    copies, tmp_path, capsys, text
):
    local, fedavg = copies
    _set_depth(fedavg, text)
    printed: list[str] = []
    (line,) = refused_keeping(["report", str(local), str(fedavg)], tmp_path, capsys, stdout=printed)
    assert line.startswith(f"error: run {fedavg}: results.json has {DEPTH} RMSE = "), line
    assert "not a finite number" in line and "restore it, or leave the run out" in line
    assert printed == [""]  # no table with nan or inf in it


def test_a_null_metric_stays_the_refusal_of_a_run_whose_model_was_not_finite(copies, tmp_path, capsys):
    """null is what the engine writes for a non-finite evaluated model: refused, as before."""
    local, fedavg = copies
    _set_depth(fedavg, "null")
    (line,) = refused_keeping(["report", str(local), str(fedavg)], tmp_path, capsys)
    assert f"has null metrics ({DEPTH})" in line and "was not finite" in line


def _curves(local: Path, fedavg: Path, tmp_path: Path) -> list[str]:
    return ["report", str(local), str(fedavg), "--curves", str(tmp_path / "curves.png")]


def test_a_metrics_csv_cut_in_the_middle_of_a_line_is_one_line(copies, tmp_path, capsys):
    local, fedavg = copies
    csv = fedavg / "metrics.csv"
    csv.write_bytes(csv.read_bytes()[:-7])  # as a full disk or an interrupted copy leaves it
    (line,) = refused_keeping(_curves(local, fedavg, tmp_path), tmp_path, capsys)
    assert line.startswith(f"error: run {fedavg}: {csv} is truncated: its last line, "), line
    assert "leave the run out, or leave --curves out" in line
    assert not (tmp_path / "curves.png").exists()


def test_a_metrics_csv_cut_at_a_line_end_before_the_last_round_is_one_line(copies, tmp_path, capsys):
    """The silent case: whole lines, but round 2 (the run's last) is gone."""
    local, fedavg = copies
    csv = fedavg / "metrics.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(line for line in lines if not line.startswith("2,")))
    (line,) = refused_keeping(_curves(local, fedavg, tmp_path), tmp_path, capsys)
    assert f"{csv} lacks the metrics of round 2, the run's last (its last evaluation is round 1)" in line


@pytest.mark.parametrize("bad", ["1,val/x,abc", "one,val/x,0.5", "1,val/x", "1,val/x,0.5,extra"])
def test_a_metrics_csv_line_that_does_not_read_is_named(copies, tmp_path, capsys, bad):
    local, fedavg = copies
    csv = fedavg / "metrics.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join([*lines[:3], bad + "\r\n", *lines[3:]]))
    (line,) = refused_keeping(_curves(local, fedavg, tmp_path), tmp_path, capsys)
    assert f"{csv} line 4, {bad!r}, is not round,key,value" in line


def test_a_nan_the_engine_wrote_leaves_that_round_out_of_the_curves(copies, tmp_path, capsys):
    """A model not finite at round 1 but finite at the end: the report and the curves are
    drawn; round 1 has no point for that metric and no Δm."""
    local, fedavg = copies
    csv = fedavg / "metrics.csv"
    key = f"val/{DEPTH}_RMSE"
    rows = [line.split(",") for line in csv.read_text().splitlines()]
    csv.write_text("".join(f"{r},{k},{'nan' if (r, k) == ('1', key) else v}\r\n" for r, k, v in rows))
    assert main(_curves(local, fedavg, tmp_path)) == 0
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    built = report.build_report([local, fedavg])
    history = report.read_history(built.methods[1].runs[0], built.columns)
    assert report.metric_series(history, DEPTH)[0] == [2]
    baseline = report.read_history(built.methods[0].runs[0], built.columns)
    assert report.delta_m_series(history, baseline, built.columns)[0] == [2]


def test_the_intact_runs_report_and_draw(runs, tmp_path, capsys):
    before = {name: file_hashes(path) for name, path in runs.items()}
    assert main(_curves(runs["Local"], runs["FedAvg"], tmp_path)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"curves: {tmp_path / 'curves.png'}"
    assert before == {name: file_hashes(path) for name, path in runs.items()}
