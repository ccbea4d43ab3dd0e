"""The Python API (docs/python-api.md): ``fedmtl.fit`` runs what ``fedmtl fit`` runs, with the
same checks and the same config.yaml; ``fedmtl.compare`` returns ``fedmtl report``'s table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import file_hashes, refused_keeping, run_cli, tiny_config


@pytest.fixture(scope="module")
def api_run(module_dir, data_root) -> tuple[Path, Path, dict]:
    """One tiny run through ``fedmtl.fit``: its config file, run directory and return value."""
    import fedmtl

    config = tiny_config(module_dir, data_root)
    run_dir = module_dir / "run"
    summary = fedmtl.fit(str(config), run_dir=str(run_dir), rounds=2, **{"evaluation.every": 1})
    return config, run_dir, summary


def fit_argv(config: Path, run_dir: Path) -> list[str]:
    """``fedmtl fit``'s arguments for the run ``api_run`` makes through ``fedmtl.fit``."""
    return [
        "fit",
        "--config",
        str(config),
        "--run_dir",
        str(run_dir),
        "--rounds",
        "2",
        "--evaluation.every",
        "1",
    ]


def test_fit_writes_config_yaml_and_results_that_validate_reads(api_run, capsys):
    config, run_dir, summary = api_run
    assert summary == json.loads((run_dir / "results.json").read_text())
    assert summary["rounds"] == 2
    assert summary["versions"]["fedmtl"] and summary["versions"]["torch"]  # what computed it
    written = (run_dir / "config.yaml").read_text()
    assert "rounds: 2" in written.splitlines()
    code, err = run_cli(["validate", "--run_dir", str(run_dir)], capsys)
    assert code == 0, err
    assert (run_dir / "validate_results.json").is_file()


def test_fit_refuses_a_run_dir_holding_a_run_as_the_cli_does(api_run, capsys):
    import fedmtl

    config, run_dir, _ = api_run
    before = file_hashes(run_dir)
    with pytest.raises(ValueError) as refused:
        fedmtl.fit(str(config), run_dir=str(run_dir), rounds=2, **{"evaluation.every": 1})
    assert file_hashes(run_dir) == before
    cli = refused_keeping(fit_argv(config, run_dir), run_dir, capsys)
    assert cli == [f"error: {refused.value}"]


def test_compare_returns_the_table_report_prints_and_writes_it(tmp_path, capsys):
    from test_report import write_run

    import fedmtl

    runs = [
        str(write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5)),
        str(write_run(tmp_path / "fedavg", "FedAvg", 55.0, 38.0, 0.4)),
    ]
    table = fedmtl.compare(runs, output=tmp_path / "table.csv", format="csv")
    assert table.splitlines()[0].startswith("method,")
    assert (tmp_path / "table.csv").read_text() == table
    from fedmtl.cli import main

    capsys.readouterr()
    assert main(["report", *runs, "--format", "csv"]) == 0
    assert capsys.readouterr().out == table
    with pytest.raises(ValueError, match="exists"):  # never overwritten unless asked
        fedmtl.compare(runs, output=tmp_path / "table.csv")


def test_a_bad_value_raises_before_anything_is_written(tmp_path, data_root):
    import fedmtl

    config = tiny_config(tmp_path, data_root)
    with pytest.raises(ValueError, match='Parser key "rounds"'):
        fedmtl.fit(config, run_dir=str(tmp_path / "run"), rounds="many")
    with pytest.raises(ValueError, match="no method named 'Nope'"):
        fedmtl.fit(config, run_dir=str(tmp_path / "run"), algorithm="Nope")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "layers", [["configs/scenario1.yaml"], ["configs/scenario1.yaml", "configs/methods/fedhca2.yaml"]]
)
def test_the_config_is_the_one_the_cli_parses(layers):
    """config.yaml is the parser's dump of this namespace: the same as the CLI's."""
    from fedmtl.api import _namespace, _parser
    from fedmtl.cli import _parser as cli_parser
    from fedmtl.cli import _run_parser

    parser = _parser()
    api = _namespace(parser, layers, {"run_dir": "runs/x", "evaluation": {"every": 2}, "rounds": 3})
    argv = ["fit", *(a for layer in layers for a in ("--config", layer))]
    cli = cli_parser().parse_args([*argv, "--run_dir", "runs/x", "--evaluation.every", "2", "--rounds", "3"])
    cli_ns = cli.fit.clone()
    cli_ns.pop("config")
    assert parser.dump(api, skip_none=False) == _run_parser().dump(cli_ns, skip_none=False)


def test_import_fedmtl_stays_light():
    import subprocess
    import sys

    code = "import sys, fedmtl; print(sorted(m for m in ('torch', 'jsonargparse', 'fedmtl.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_finished_run_is_reprinted_without_the_simulation(api_run, capsys, monkeypatch):
    """``fit --resume true`` on a finished run (make demo's second time) prints results.json
    without building the data, the models or Fabric; fedmtl.fit returns it."""
    import fedmtl
    from fedmtl.cli import format_results, main
    from fedmtl.federated import engine

    config, run_dir, summary = api_run

    def built(*args, **kwargs):
        raise AssertionError("a finished run built the Simulation")

    monkeypatch.setattr(engine, "Simulation", built)
    monkeypatch.setattr(engine, "run", built)
    before = file_hashes(run_dir)
    capsys.readouterr()
    argv = fit_argv(config, run_dir)
    assert main([*argv, "--resume", "true"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(format_results(summary) + f"\nresults: {run_dir / 'results.json'}\n")
    assert "resume: the run finished its 2 rounds; its results:" in err
    assert (
        fedmtl.fit(str(config), run_dir=str(run_dir), rounds=2, resume=True, **{"evaluation.every": 1})
        == summary
    )
    assert file_hashes(run_dir) == before
    # The resume's checks still run: a config that computes another run is refused
    lines = refused_keeping([*argv, "--resume", "true", "--seed", "7"], run_dir, capsys)
    assert lines[-1].startswith("error: resume: ") and "seed" in lines[-1]
