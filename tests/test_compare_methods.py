"""benchmarks/compare_methods.py refuses finished runs made with another config, before it
generates data or runs anything (their results would enter the report under the new config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedmtl.cli import _run_parser
from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "benchmark" / "scenario1.yaml"


@pytest.fixture(scope="module")
def compare_methods():
    return load_script("benchmarks/compare_methods")


def _finished_run(compare_methods, run_dir: Path, method: str, seed: int, *extra: str) -> None:
    """A run directory as a finished ``fedmtl fit`` leaves it: its config.yaml and results.json."""
    parser = _run_parser()
    args = parser.parse_args(compare_methods.fit_args(CONFIG, method, seed, run_dir) + list(extra))
    args.pop("config", None)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(parser.dump(args, skip_none=False))
    (run_dir / "results.json").write_text(json.dumps({"rounds": 10}))


def _jobs(out: Path, method: str, seed: int) -> dict:
    return {(method, seed): (out / method / f"seed_{seed}", out / "logs" / f"{method}_seed_{seed}.log")}


def test_a_finished_run_of_the_same_config_is_kept(compare_methods, tmp_path):
    _finished_run(compare_methods, tmp_path / "Local" / "seed_0", "Local", 0)
    assert compare_methods.stale_runs(CONFIG, _jobs(tmp_path, "Local", 0)) == []


def test_a_finished_run_of_another_config_is_named_with_what_differs(compare_methods, tmp_path):
    _finished_run(compare_methods, tmp_path / "FedAvg" / "seed_1", "FedAvg", 1, "--rounds", "3")
    stale = compare_methods.stale_runs(CONFIG, _jobs(tmp_path, "FedAvg", 1))
    assert len(stale) == 1
    assert str(tmp_path / "FedAvg" / "seed_1") in stale[0]
    assert "rounds: 3 -> 10" in stale[0]


def test_where_and_how_a_run_ran_may_differ(compare_methods, tmp_path):
    # evaluation and logging are resumable fields: they do not change what the run computed
    _finished_run(compare_methods, tmp_path / "Local" / "seed_0", "Local", 0, "--evaluation.every", "2")
    assert compare_methods.stale_runs(CONFIG, _jobs(tmp_path, "Local", 0)) == []


def test_a_finished_run_without_its_config_is_stale(compare_methods, tmp_path):
    _finished_run(compare_methods, tmp_path / "Local" / "seed_0", "Local", 0)
    (tmp_path / "Local" / "seed_0" / "config.yaml").unlink()
    (stale,) = compare_methods.stale_runs(CONFIG, _jobs(tmp_path, "Local", 0))
    assert "config.yaml is missing" in stale


def test_the_command_stops_before_writing_anything(compare_methods, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's data root is relative: it must not be generated
    out = tmp_path / "out"
    _finished_run(compare_methods, out / "Local" / "seed_0", "Local", 0, "--seed", "7")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code = compare_methods.main(
        ["--config", str(CONFIG), "--out", str(out), "--seeds", "0", "--methods", "Local"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "seed: 7 -> 0" in err and "Nothing was run or changed" in err and "--out" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
