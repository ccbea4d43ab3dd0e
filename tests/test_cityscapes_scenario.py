"""End to end: a Cityscapes + NYUD-v2 scenario on generated data (Cityscapes written on first
use, in the release's layout) trains, evaluates and reports both Cityscapes tasks."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from tests.helpers import fit, tiny_config

CITY_CLIENTS = {"cityscapes-semseg": ("semseg", "mIoU"), "cityscapes-depth": ("depth", "RMSE")}


@pytest.fixture(scope="module")
def run(module_dir, data_root) -> tuple[Path, dict, str]:
    """One fit: 2 single-task Cityscapes clients + 1 NYUD-v2 client, 2 rounds; its run folder,
    results.json and what the fit wrote to stderr."""
    root = module_dir / "data"
    shutil.copytree(data_root / "NYUDv2", root / "NYUDv2")  # Cityscapes/ is absent: data.synth writes it
    config = tiny_config(
        module_dir,
        root,
        clients=[
            {"dataset": "cityscapes", "tasks": ["semseg", "depth"], "single_task": True, "batch_size": 4},
            {"dataset": "nyud", "tasks": ["normals", "depth"], "batch_size": 4},
        ],
        data={
            "root": str(root),
            "train_size": [32, 64],
            "synth": {"cityscapes": {"num_train": 8, "num_val": 2, "size": [32, 64]}},
        },
        rounds=2,
    )
    run_dir = module_dir / "run"
    results = fit(config, run_dir, "--algorithm", "FedAvg")  # federated: the clients share a model
    return run_dir, results, root


def test_cityscapes_is_generated_in_the_release_layout_on_first_use(run):
    _, _, root = run
    assert sorted(p.name for p in (root / "Cityscapes").iterdir()) == ["disparity", "gtFine", "leftImg8bit"]
    assert len(list((root / "Cityscapes" / "leftImg8bit" / "val").glob("*/*_leftImg8bit.png"))) == 2


def test_both_cityscapes_tasks_are_trained_and_evaluated(run):
    _, results, _ = run
    assert results["rounds"] == 2 and results["algorithm"] == "FedAvg"
    for client, (task, metric) in CITY_CLIENTS.items():
        entry = results["clients"][client]
        assert entry["dataset"] == "cityscapes" and entry["tasks"] == [task]
        value = entry["metrics"][task][metric]
        assert value is not None and math.isfinite(value)
    assert sum(results["clients"][client]["train_images"] for client in CITY_CLIENTS) == 8  # split in two
    assert 0 <= results["clients"]["cityscapes-semseg"]["metrics"]["semseg"]["mIoU"] <= 100


def test_report_shows_the_cityscapes_columns(run, capsys):
    from fedmtl.cli import main

    run_dir, _, _ = run
    capsys.readouterr()
    assert main(["report", str(run_dir), "--baseline", str(run_dir), "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "cityscapes-semseg" in header and "cityscapes-depth" in header, header


def test_the_markdown_report_names_cityscapes_as_a_paper_does(run, capsys):
    from fedmtl.cli import main

    run_dir, _, _ = run
    capsys.readouterr()
    assert main(["report", str(run_dir), "--baseline", str(run_dir)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "Cityscapes depth RMSE ↓" in header, header
