"""Issue #36: ``fedmtl report`` compares only runs scored the same way.

Two tiny real runs (Local and FedAvg, with an edge task) record their scoring in results.json.
A copy of one is made to look scored another way, by its results.json (what the report reads)
or, for a run written before results.json recorded the scoring, by its config.yaml and
data_fingerprint.json: the report is one ``error:`` line naming the option, the two values and
the two runs, and writes nothing. An option that changes no number (``evaluation.every``,
``evaluation.batch_size``, ``evaluation.clients``) never refuses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedmtl.cli import main
from fedmtl.federated import scoring
from fedmtl.federated.rundir import flatten
from tests.helpers import fit_each, refused_keeping

# Edge (the option that matters most) beside depth; no semseg, whose mIoU can be 0 after a round.
CLIENTS = [
    {"dataset": "pascal_context", "tasks": ["edge", "sal"], "batch_size": 4},
    {"dataset": "nyud", "tasks": ["normals", "depth"], "batch_size": 4},
]


@pytest.fixture(scope="module")
def runs(module_dir, data_root) -> dict[str, Path]:
    algorithms = {"local": {"class_path": "Local"}, "fedavg": {"class_path": "FedAvg"}}
    out = fit_each(module_dir, data_root, algorithms, rounds=1, clients=CLIENTS)
    return {"Local": out["local"], "FedAvg": out["fedavg"]}


@pytest.fixture
def local(runs) -> Path:
    return runs["Local"]


@pytest.fixture
def fedavg(runs, tmp_path) -> Path:
    """A copy of the FedAvg run that a test may change."""
    return shutil.copytree(runs["FedAvg"], tmp_path / "fedavg")


def _edit(path: Path, change) -> None:
    """Rewrite a JSON or YAML file of a run through ``change(content)``."""
    if path.suffix == ".json":
        content = json.loads(path.read_text())
        change(content)
        path.write_text(json.dumps(content))
    else:
        content = yaml.safe_load(path.read_text())
        change(content)
        path.write_text(yaml.safe_dump(content))


def _as_written_before_scoring(run: Path) -> None:
    """The run as fedmtl wrote it before results.json recorded the scoring."""
    _edit(run / "results.json", lambda results: results.pop("scoring"))


def _refused(local: Path, other: Path, tmp_path: Path, capsys) -> str:
    lines = refused_keeping(["report", str(local), str(other)], tmp_path, capsys)
    assert len(lines) == 1, lines
    return lines[0]


def test_results_json_records_how_the_run_was_scored(runs, data_root):
    recorded = json.loads((runs["FedAvg"] / "results.json").read_text())["scoring"]
    assert recorded["evaluation"] == {"edge_thin_gt": True, "edge_max_dist": {"pascal_context": 0.0075}}
    assert recorded["data"]["train_size"] == {"nyud": [32, 32], "pascal_context": [32, 32]}
    assert (
        recorded["validation"]["nyud"]["images"] > 0 and len(recorded["validation"]["nyud"]["sha256"]) == 64
    )
    # Runs written before the block read the same from config.yaml and data_fingerprint.json.
    config = yaml.safe_load((runs["FedAvg"] / "config.yaml").read_text())
    results = json.loads((runs["FedAvg"] / "results.json").read_text())
    scenario = [(c["dataset"], c["tasks"]) for c in results["clients"].values()]
    from_files = scoring.from_run_files(config, scenario, scoring.read_fingerprint(runs["FedAvg"]))
    assert scoring.first_difference(recorded, from_files) is None
    assert set(flatten(from_files)) == set(flatten(recorded)) - {"evaluation.edge_max_dist.pascal_context"}


def test_runs_scored_alike_report(runs, capsys):
    capsys.readouterr()
    assert main(["report", str(runs["Local"]), str(runs["FedAvg"])]) == 0
    assert "| FedAvg |" in capsys.readouterr().out


def test_an_edge_scoring_recorded_otherwise_is_refused_naming_it(local, fedavg, tmp_path, capsys):
    _edit(fedavg / "results.json", lambda r: r["scoring"]["evaluation"].update(edge_thin_gt=False))
    assert _refused(local, fedavg, tmp_path, capsys) == (
        f"error: {local} and {fedavg} were scored differently: evaluation.edge_thin_gt true vs false; "
        "compare runs scored the same way"
    )


def test_a_run_written_before_the_record_is_read_from_its_config(local, fedavg, tmp_path, capsys):
    _as_written_before_scoring(fedavg)
    _edit(fedavg / "config.yaml", lambda c: c["evaluation"].update(edge_thin_gt=False))
    assert "evaluation.edge_thin_gt true vs false;" in _refused(local, fedavg, tmp_path, capsys)
    # A config from before the option existed has none: edges were scored unthinned then.
    _edit(fedavg / "config.yaml", lambda c: c["evaluation"].pop("edge_thin_gt"))
    assert "evaluation.edge_thin_gt true vs false;" in _refused(local, fedavg, tmp_path, capsys)


def test_another_padding_size_is_refused(local, fedavg, tmp_path, capsys):
    _as_written_before_scoring(fedavg)
    _edit(fedavg / "config.yaml", lambda c: c["data"].update(train_size=[64, 64]))
    assert "were scored differently: data.train_size.nyud [32, 32] vs [64, 64];" in _refused(
        local, fedavg, tmp_path, capsys
    )


def test_another_validation_split_is_refused(runs, local, fedavg, tmp_path, capsys):
    def fewer(results):
        results["scoring"]["validation"]["nyud"]["images"] -= 1

    _edit(fedavg / "results.json", fewer)
    images = json.loads((local / "results.json").read_text())["scoring"]["validation"]["nyud"]["images"]
    assert f"validation.nyud.images {images} vs {images - 1};" in _refused(local, fedavg, tmp_path, capsys)
    # The same from the data fingerprint of a run written before the record.
    shutil.rmtree(fedavg)
    shutil.copytree(runs["FedAvg"], fedavg)
    _as_written_before_scoring(fedavg)
    _edit(
        fedavg / scoring.FINGERPRINT, lambda f: f["datasets"]["nyud"]["splits"]["val"].update(sha256="0" * 64)
    )
    assert "were scored differently: validation.nyud.sha256 " in _refused(local, fedavg, tmp_path, capsys)


def test_options_that_change_no_number_never_refuse(local, fedavg, capsys):
    # Recorded in config.yaml only (results.json's block does not list them): read from there
    # for a run written before the block, they still do not count.
    _as_written_before_scoring(fedavg)
    _edit(fedavg / "config.yaml", lambda c: c["evaluation"].update(every=1, batch_size=2, clients=1))
    capsys.readouterr()
    assert main(["report", str(local), str(fedavg)]) == 0
    assert capsys.readouterr().err == ""


def test_a_run_without_config_or_record_is_compared_on_what_it_says(local, fedavg, capsys):
    _as_written_before_scoring(fedavg)
    (fedavg / "config.yaml").unlink()
    (fedavg / scoring.FINGERPRINT).unlink()
    capsys.readouterr()
    assert main(["report", str(local), str(fedavg)]) == 0
