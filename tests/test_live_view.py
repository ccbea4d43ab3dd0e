"""The live view of `fedmtl fit` in a terminal (issue #37, item 1): the round, the running loss
per dataset and task, the last evaluation's metrics and each phase as it starts, a few lines
at any number of clients; logs keep their one line per round."""

from __future__ import annotations

import sys

from fedmtl.federated import live
from tests.helpers import load_script, tiny_config

_SCREENSHOT = load_script("benchmarks/live_view_screenshot")
run_in_pty, screen = _SCREENSHOT.run_in_pty, _SCREENSHOT.screen

DATASETS = ("pascal_context", "nyud", "cityscapes")


def synthetic_values(clients: int) -> tuple[dict[str, float], dict[str, str]]:
    """A round's logged values at ``clients`` clients of three datasets, with keys the view
    does not know (a learning rate, the total loss, a penalty, timings)."""
    values: dict[str, float] = {"server/participants": float(clients), "time/train": 1.0}
    datasets = {}
    for i in range(clients):
        name, dataset = f"client-{i}", DATASETS[i % 3]
        datasets[name] = dataset
        values[f"train/{name}/loss"] = 2.0
        values[f"train/{name}/penalty"] = 0.1
        values[f"lr/{name}"] = 1e-4
        for k, task in enumerate(("semseg", "depth", "normals")):
            values[f"train/{name}/{task}_loss"] = 0.5 + k + i / clients
        values[f"val/{name}/semseg_mIoU"] = 30.0 + i % 7
        values[f"val/{name}/depth_RMSE"] = 0.6
        values[f"val_mean/{dataset}/semseg_mIoU"] = 33.0
    return values, datasets


def test_status_lines_stay_few_and_narrow_at_a_thousand_clients():
    values, datasets = synthetic_values(1000)
    losses = live.section_lines("loss", live.loss_groups(values, datasets), 1000, 80)
    metrics = live.section_lines("val (round 2)", live.metric_groups(values, datasets), 1000, 80)
    assert 1 <= len(losses) <= live.LINES_PER_SECTION and 1 <= len(metrics) <= live.LINES_PER_SECTION
    assert all(len(line) <= 80 for line in losses + metrics)
    wide = live.section_lines("loss", live.loss_groups(values, datasets), 1000, 500)
    expected = "semseg 0.9995 [0.5, 1.499] ×334 · depth 1.999 [1.5, 2.499] ×334 · normals 3 [2.5, 3.499] ×334"
    assert wide[0] == f"loss pascal_context: {expected}"
    assert "semseg mIoU↑" in metrics[0] and "depth RMSE↓" in metrics[0] and "×334" in metrics[0]
    assert not any("lr" in line or "penalty" in line for line in wide)


def test_more_datasets_than_lines_share_the_last_and_few_clients_show_means():
    groups = {(f"dataset{d}", "semseg"): [1.0, 2.0] for d in range(7)}
    lines = live.section_lines("loss", groups, 2, 1000)
    assert len(lines) == live.LINES_PER_SECTION
    assert lines[0] == "loss dataset0: semseg 1.5"  # a few clients: the mean alone
    assert "dataset6: semseg 1.5" in lines[-1]
    assert live.clip("x" * 10, 4) == "xxx…"


def test_fit_in_a_terminal_shows_round_loss_metrics_and_phases(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root)
    output = run_in_pty(
        [sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(tmp_path / "run")],
        timeout=300,
    )
    for phase in ["training client 3/3", "exchange", "server step (aggregation)", "write back (receipts)"]:
        assert phase in output
    for phase in ["evaluation", "checkpoint", "writing results.json"]:
        assert phase in output
    assert "round 3/3" in output and "round 2/3:" in output  # the bar's description
    assert "loss nyud: semseg " in output and "loss pascal_context: semseg " in output
    # The first evaluation is round 2's (evaluation.every 2): its metrics, from then on
    before = output.split("val (round 2)", 1)[0]
    assert "round 2/3:" in before and "evaluation" in before
    assert "val (round 2) nyud: semseg mIoU↑ " in output and "depth RMSE↓ " in output
    # The per-round log line, above the bars, stays on the final screen
    final = screen(output)
    assert sum(line.startswith("round ") and " | loss: " in line for line in final) == 3
    assert any(line.startswith("nyud-semseg+depth") for line in final)  # the final table
