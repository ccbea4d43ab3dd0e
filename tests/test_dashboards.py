"""FedHCA²'s α/β dashboards: every round in metrics.csv and an offline wandb run (α as one
chart, the β heatmap), drawn by notebooks/hyper_weights.ipynb from a run directory."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml
from nbclient import NotebookClient

from fedmtl.cli import main
from fedmtl.federated.runlog import heatmap_image

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "hyper_weights.ipynb"
CLIENTS = ["pascal_context-semseg", "pascal_context-normals", "nyud-semseg+depth"]
LAYERS = ["projections.0", "projections.1", "projections.2", "projections.3", "fuse", "norm"]


@pytest.fixture(scope="module")
def run_dir(module_dir) -> Path:
    from fedmtl.synth import generate

    tmp = module_dir
    generate(
        "pascal_context",
        tmp / "data" / "PASCALContext",
        num_train=8,
        num_val=4,
        size=(32, 32),
        progress=False,
    )
    generate("nyud", tmp / "data" / "NYUDv2", num_train=8, num_val=4, size=(32, 32), progress=False)
    config = {
        "clients": [
            {
                "dataset": "pascal_context",
                "tasks": ["semseg", "normals"],
                "single_task": True,
                "batch_size": 4,
            },
            {"dataset": "nyud", "tasks": ["semseg", "depth"], "batch_size": 4},
        ],
        "algorithm": {"class_path": "FedHCA2"},
        "data": {"root": str(tmp / "data"), "train_size": [32, 32]},
        "evaluation": {"every": 2},
        "rounds": 3,
        "accelerator": "cpu",
        "logger": {"wandb": True, "mode": "offline"},
        "run_dir": str(tmp / "run"),
    }
    (tmp / "fedhca2.yaml").write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", str(tmp / "fedhca2.yaml")]) == 0
    return tmp / "run"


def _server_values(run_dir: Path) -> dict[tuple[int, str], float]:
    with open(run_dir / "metrics.csv") as f:
        return {
            (int(r["round"]), r["key"]): float(r["value"])
            for r in csv.DictReader(f)
            if r["key"].startswith("aggregation/")
        }


def test_alpha_and_beta_are_logged_every_round(run_dir):
    values = _server_values(run_dir)
    for r in (1, 2, 3):
        for client in CLIENTS:
            assert (r, f"aggregation/alpha/{client}") in values
        decoders = [
            (CLIENTS[0], "semseg"),
            (CLIENTS[1], "normals"),
            (CLIENTS[2], "semseg"),
            (CLIENTS[2], "depth"),
        ]
        for client, task in decoders:
            for layer in LAYERS:
                assert (r, f"aggregation/beta/{client}/{task}/{layer}") in values
    # The first update of the hyper weights happens in round 2, once the next deltas exist.
    assert all(values[(1, f"aggregation/alpha/{c}")] == pytest.approx(0.1) for c in CLIENTS)
    assert any(values[(2, f"aggregation/alpha/{c}")] != pytest.approx(0.1, abs=1e-12) for c in CLIENTS)
    assert all(0.0 <= v <= 1.0 for (_, k), v in values.items() if "/alpha/" in k or "/beta/" in k)


def test_results_end_with_the_hyper_weights(run_dir):
    server = json.loads((run_dir / "results.json").read_text())["server"]
    assert set(server) >= {f"alpha/{c}" for c in CLIENTS}
    assert server[f"alpha/{CLIENTS[0]}"] == _server_values(run_dir)[(3, f"aggregation/alpha/{CLIENTS[0]}")]


def test_the_offline_wandb_run_holds_the_beta_heatmap(run_dir):
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    heatmaps = list(runs[0].glob("files/media/images/aggregation/beta_*.png"))
    assert len(heatmaps) == 2  # evaluation rounds 2 and 3


def test_the_offline_wandb_run_holds_alpha_as_one_chart_over_the_rounds(run_dir):
    """α is one line chart per run (a table of round, client, value), not a panel per client."""
    (run,) = (run_dir / "wandb").glob("offline-run-*")
    tables = sorted(run.glob("files/media/table/aggregation/alpha_table_*.table.json"), key=os.path.getmtime)
    assert len(tables) == 2  # evaluation rounds 2 and 3
    table = json.loads(tables[-1].read_text())
    assert table["columns"] == ["step", "lineKey", "lineVal"]
    logged = _server_values(run_dir)
    expected = [[r, c, logged[(r, f"aggregation/alpha/{c}")]] for c in CLIENTS for r in (1, 2, 3)]
    assert table["data"] == expected
    # the per-client scalars stay in metrics.csv only
    assert b"aggregation/alpha/" not in next(run.glob("run-*.wandb")).read_bytes()


def test_heatmap_image_is_an_rgb_picture():
    image = heatmap_image(["a / semseg", "b / depth"], LAYERS, np.array([[0.1] * 6, [0.5] * 6]), "beta")
    assert image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8
    assert image.std() > 0


def test_the_notebook_draws_alpha_and_beta_from_a_run(run_dir):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env = {"FEDMTL_RUN_DIR": str(run_dir), "FEDMTL_NOTEBOOK_HEADLESS": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment
    try:
        NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert (run_dir / "alpha.png").stat().st_size > 0
    assert (run_dir / "beta.png").stat().st_size > 0
    printed = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "3 clients with alpha, 4 decoders with beta (round 3)" in printed
