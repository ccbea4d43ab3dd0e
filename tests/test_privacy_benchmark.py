"""benchmarks/privacy_utility.py: its arguments, the mode each method runs under, the runs it
plans, its refusals, and the table and figure it builds from (fake) finished runs. No training."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    yield load_script("benchmarks/privacy_utility", register=True)  # its dataclasses look it up
    sys.modules.pop("privacy_utility", None)


def test_the_defaults_are_the_benchmark_shape(bench, tmp_path):
    args = bench.parse_args(["--out", str(tmp_path)])
    assert args.methods == ["FedAvg", "FedPer", "FedHCA2"]
    assert args.noise == [0.01, 0.1, 1.0]
    assert args.seeds == [0, 1, 2]
    assert args.mode == "auto" and args.rounds is None and not args.dry_run
    assert args.config == REPO / "configs" / "benchmark" / "scenario1.yaml"
    assert bench.shape_notes(args, config_rounds=10) == []


def test_auto_is_central_where_the_method_allows_it(bench):
    assert bench.method_mode("FedAvg", "auto") == "central"
    assert bench.method_mode("FedPer", "auto") == "central"
    assert bench.method_mode("FedHCA2", "auto") == "local"
    assert bench.method_mode("FedAMP", "auto") == "local"
    assert bench.method_mode("FedAvg", "local") == "local"
    with pytest.raises(ValueError, match="--mode central: FedHCA2"):
        bench.method_mode("FedHCA2", "central")


def test_the_plan_has_local_once_per_seed_and_each_method_at_each_noise(bench, tmp_path):
    jobs = bench.plan(["FedAvg", "FedHCA2"], [0.3, 3.0], [0, 1], "auto")
    assert len(jobs) == 2 + 2 * 2 * 2
    local = [job for job in jobs if job.method == "Local"]
    assert [(j.mode, j.z, j.seed) for j in local] == [(None, None, 0), (None, None, 1)]
    assert bench.extra_args(local[0], 1.0, 1e-5, None) == []  # Local: no privacy, the config's rounds
    fedhca2 = next(j for j in jobs if j.method == "FedHCA2" and j.z == 3.0 and j.seed == 1)
    assert fedhca2.run_dir(tmp_path) == tmp_path / "FedHCA2_local_z3" / "seed_1"
    assert bench.extra_args(fedhca2, 0.5, 1e-6, 2) == [
        "--rounds", "2", "--privacy.mode", "local", "--privacy.noise_multiplier", "3.0",
        "--privacy.clip", "0.5", "--privacy.delta", "1e-06",
    ]  # fmt: skip


def test_the_dry_run_lists_every_run_and_writes_nothing(bench, tmp_path, capsys):
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--dry_run", "--seeds", "0", "--rounds", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    runs = [line for line in printed if line.startswith("to run: fedmtl fit")]
    assert len(runs) == 1 + 3 * 3
    assert any("--algorithm FedHCA2" in r and "--privacy.mode local" in r for r in runs)
    assert any("--algorithm FedAvg" in r and "--privacy.mode central" in r for r in runs)
    assert all("--rounds 2" in r for r in runs)
    assert "--rounds 2 instead of the config's 10" in printed[-1]
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--noise", "0.3", "-1"], "--noise must be finite numbers >= 0"),
        (["--noise", "nan"], "--noise must be finite numbers >= 0"),
        (["--clip", "0"], "--clip must be a finite number > 0"),
        (["--delta", "1"], "--delta must be in (0, 1)"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--seeds", "0", "0"], "--seeds lists a value twice"),
        (["--mode", "central"], "--mode central: FedHCA2's server step reads each client's update"),
        (["--record", "a/b"], "--record 'a/b': give a file name without a folder"),
        (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
    ],
)
def test_a_bad_argument_is_one_line_and_nothing_is_written(bench, tmp_path, capsys, extra, says):
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err
    assert not out.exists()


def test_an_unknown_choice_is_one_line_too(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.main(["--out", str(tmp_path), "--methods", "FedNope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: argument --methods")


def test_a_reduced_shape_records_under_its_own_name_and_says_so(bench, tmp_path):
    args = bench.parse_args(["--out", str(tmp_path), "--rounds", "3", "--seeds", "0"])
    notes = bench.shape_notes(args, config_rounds=10)
    assert notes == ["--rounds 3 instead of the config's 10", "--seeds 0 instead of 0 1 2"]
    body = bench.record_body([], notes, "x.png", 1.0, 1e-5)
    assert "**Reduced shape, not the benchmark's numbers:** --rounds 3 instead of the config's 10" in body
    # docs/benchmark.md includes the table's section only: the figure's link, relative to this
    # file, would not resolve from the docs
    assert body.index("[start:table]") < body.index("Reduced shape") < body.index("[end:table]")
    assert body.index("[end:table]") < body.index("](x.png)")


def test_the_placeholder_has_the_section_the_docs_include():
    text = (REPO / "benchmarks" / "results" / "privacy_utility.md").read_text()
    assert "<!-- --8<-- [start:table] -->" in text and "<!-- --8<-- [end:table] -->" in text


# ---------------------------------------------------------------------------- table and figure


def _record(method, mode, z, seed, epsilon, delta_m):
    return {"method": method, "mode": mode, "z": z, "seed": seed, "epsilon": epsilon, "delta_m": delta_m}


FAKE = [
    _record("Local", None, None, 0, 0.0, 0.0),
    _record("Local", None, None, 1, 0.0, 0.0),
    _record("FedAvg", "central", 1.0, 0, 8.0, -2.0),
    _record("FedAvg", "central", 1.0, 1, 8.0, -4.0),
    _record("FedAvg", "central", 3.0, 0, 1.5, -10.0),
    _record("FedAvg", "central", 3.0, 1, 1.5, -12.0),
    _record("FedHCA2", "local", 1.0, 0, 250.0, -1.0),
    _record("FedHCA2", "local", 1.0, 1, 250.0, -3.0),
    _record("FedHCA2", "local", 0.0, 0, math.inf, 1.0),
    _record("FedHCA2", "local", 0.0, 1, math.inf, 1.0),
]


def test_the_table_has_one_row_per_method_mode_and_noise(bench):
    table = bench.render_table(bench.summarise(FAKE)).splitlines()
    assert table[0] == "| method | mode | z | ε | Δm (%) | seeds |"
    assert table[2:] == [
        "| Local | none | — | 0 | +0.00 ± 0.00 | 0 1 |",
        "| FedAvg | central | 1 | 8 | -3.00 ± 1.41 | 0 1 |",
        "| FedAvg | central | 3 | 1.5 | -11.00 ± 1.41 | 0 1 |",
        "| FedHCA² | local | 1 | 250 | -2.00 ± 1.41 | 0 1 |",
        "| FedHCA² | local | 0 | ∞ | +1.00 ± 0.00 | 0 1 |",
    ]


def test_epsilon_is_zero_without_privacy_and_infinite_when_null(bench):
    assert bench.epsilon_of({"privacy": None}) == 0.0
    assert bench.epsilon_of({"privacy": {"mode": "local", "epsilon": None}}) == math.inf
    assert bench.epsilon_of({"privacy": {"mode": "central", "epsilon": 2.5}}) == 2.5


def test_the_figure_is_written(bench, tmp_path):
    path = bench.draw_figure(bench.summarise(FAKE), tmp_path / "figure.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_run(run_dir: Path, algorithm: str, seed: int, rmse: float, miou: float, privacy) -> None:
    run_dir.mkdir(parents=True)
    clients = {
        "c0": {"dataset": "nyud", "tasks": ["depth"], "metrics": {"depth": {"RMSE": rmse}}},
        "c1": {"dataset": "pascal_context", "tasks": ["semseg"], "metrics": {"semseg": {"mIoU": miou}}},
    }
    results = {"algorithm": algorithm, "seed": seed, "rounds": 10, "clients": clients, "privacy": privacy}
    (run_dir / "results.json").write_text(json.dumps(results))


def test_the_records_pair_each_run_with_the_local_run_of_its_seed(bench, tmp_path):
    jobs = bench.plan(["FedAvg"], [1.0], [0, 1], "auto")
    privacy = {"mode": "central", "epsilon": 4.0, "delta": 1e-5, "noise_multiplier": 1.0, "clip": 1.0}
    # Local: RMSE 0.5, mIoU 20 (seed 0) and 40 (seed 1); FedAvg: RMSE 10 % worse both seeds, mIoU
    # 30 % better at seed 0 and 10 % at seed 1: Δm = (+30 - 10) / 2 = +10 and (+10 - 10) / 2 = 0
    for job, rmse, miou in zip(jobs, [0.5, 0.5, 0.55, 0.55], [20.0, 40.0, 26.0, 44.0], strict=True):
        _fake_run(job.run_dir(tmp_path), job.method, job.seed, rmse, miou, privacy if job.mode else None)
    records = bench.run_records(jobs, tmp_path)
    by = {(r["method"], r["seed"]): r for r in records}
    assert by["Local", 0]["epsilon"] == 0.0 and by["Local", 0]["delta_m"] == 0.0
    assert by["FedAvg", 1]["epsilon"] == 4.0
    assert by["FedAvg", 0]["delta_m"] == pytest.approx(10.0)
    assert by["FedAvg", 1]["delta_m"] == pytest.approx(0.0)
    (fedavg,) = [row for row in bench.summarise(records) if row.method == "FedAvg"]
    assert fedavg.epsilon == 4.0 and fedavg.mode == "central" and fedavg.seeds == (0, 1)
    assert fedavg.delta_m.mean == pytest.approx(5.0)
