"""`fedmtl fit`'s final table (issue #37, items 9 and 5): a per dataset/task summary past a few
clients instead of hundreds of lines, each metric with its arrow, the held-out clients in a
section of their own."""

from __future__ import annotations

from fedmtl.cli import format_results
from fedmtl.federated.live import PER_CLIENT_UP_TO


def client(dataset: str, metrics: dict[str, dict[str, float | None]]) -> dict:
    return {"dataset": dataset, "tasks": list(metrics), "metrics": metrics}


def summary_of(clients: int, held_out: int = 0) -> dict:
    """A results.json summary of ``clients`` clients: single-task PASCAL-Context ones and
    multi-task NYUD-v2 ones, one with a null (non-finite) metric."""
    table = {}
    for i in range(clients):
        if i % 2:
            table[f"nyud-semseg+depth-{i}"] = client(
                "nyud", {"semseg": {"mIoU": 20.0 + i}, "depth": {"RMSE": 0.5 + i / 1000}}
            )
        else:
            table[f"pascal_context-sal-{i}"] = client(
                "pascal_context", {"sal": {"maxF": None if i == 0 else 60.0}}
            )
    summary = {"rounds": 3, "clients": table, "server": {"lr/nyud": 1e-4}, "tasks": {}}
    if held_out:
        summary["held_out"] = {
            "clients": {
                f"new-nyud-{i}": client("nyud", {"semseg": {"mIoU": 10.0 + i}, "depth": {"RMSE": 0.7}})
                for i in range(held_out)
            },
            "tasks": {},
        }
    return summary


def test_a_hundred_clients_print_a_row_per_dataset_and_task():
    text = format_results(summary_of(104), "runs/x/results.json")
    lines = text.splitlines()
    assert len(lines) <= 8  # header, rule, three tasks, the note (343 lines before)
    assert lines[0].split() == ["dataset", "task", "metric", "clients", "mean", "min", "max"]
    rows = {tuple(line.split()[:4]): line.split()[4:] for line in lines[2:5]}
    assert rows[("nyud", "semseg", "mIoU", "↑")] == ["52", "72.00", "21.00", "123.00"]
    assert rows[("nyud", "depth", "RMSE", "↓")] == ["52", "0.5520", "0.5010", "0.6030"]
    assert rows[("pascal_context", "sal", "maxF", "↑")] == ["51", "(1", "n/a)", "60.00", "60.00", "60.00"]
    assert (
        lines[-1] == "104 clients: per dataset and task over them; each client's metrics: runs/x/results.json"
    )


def test_a_few_clients_print_a_row_each_with_the_metric_arrow():
    lines = format_results(summary_of(PER_CLIENT_UP_TO)).splitlines()
    assert len(lines) == 2 + 4 * 2 + 4 * 1  # header, rule; 4 NYUD-v2 clients × 2 tasks, 4 PASCAL × 1
    assert lines[0].split() == ["client", "task", "metric", "value"]
    assert lines[2].split() == ["pascal_context-sal-0", "sal", "maxF", "↑", "n/a"]
    assert lines[3].split() == ["nyud-semseg+depth-1", "semseg", "mIoU", "↑", "21.00"]
    assert lines[4].split() == ["nyud-semseg+depth-1", "depth", "RMSE", "↓", "0.5010"]


def test_held_out_clients_get_a_section_of_their_own():
    sections = format_results(summary_of(3, held_out=2)).split("\n\n")
    assert len(sections) == 2 and "new-nyud" not in sections[0]
    held = sections[1].splitlines()
    assert held[0].startswith("held-out clients (2:")
    assert held[3].split() == ["new-nyud-0", "semseg", "mIoU", "↑", "10.00"]
    assert held[4].split() == ["new-nyud-0", "depth", "RMSE", "↓", "0.7000"]
