"""``fedmtl report``: the table's numbers against hand computations, its three formats, its
errors, and the command, the curves and notebooks/compare_methods.ipynb on two tiny real runs."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from fedmtl import report
from fedmtl.cli import main
from tests.helpers import file_hashes, fit, refused_keeping, tiny_config

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "compare_methods.ipynb"
COLUMNS = ["A/semseg", "B/semseg", "B/depth"]


# ---------------------------------------------------------------------------- hand-written runs


def write_run(
    folder: Path,
    algorithm: str,
    a_semseg: float | None,
    b_semseg: float,
    b_depth: float,
    seed: int | None = 0,
    config: dict | None = None,
) -> Path:
    """A results.json as the engine writes it, for two clients: A (pascal_context: semseg) and
    B (nyud: semseg + depth, depth lower-is-better); ``seed`` None leaves the field out."""
    results = {
        "rounds": 10,
        "algorithm": algorithm,
        "evaluated": "post-aggregation",
        "clients": {
            "A": {
                "dataset": "pascal_context",
                "tasks": ["semseg"],
                "metrics": {"semseg": {"mIoU": a_semseg}},
            },
            "B": {
                "dataset": "nyud",
                "tasks": ["semseg", "depth"],
                "metrics": {"semseg": {"mIoU": b_semseg}, "depth": {"RMSE": b_depth}},
            },
        },
        "server": {},
    }
    if seed is not None:
        results["seed"] = seed
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))
    if config is not None:
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def table_of(*paths: Path, baseline: str | None = None) -> dict[str, report.Row]:
    built = report.build_report(paths, baseline=baseline)
    return {row.label: row for row in report.compute_table(built).rows}


@pytest.fixture
def two_methods(tmp_path) -> list[Path]:
    return [
        write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5),
        write_run(tmp_path / "fedavg", "FedAvg", 55.0, 38.0, 0.4),
    ]


# ---------------------------------------------------------------------------- (a) Δm by hand


def test_delta_m_matches_the_hand_computation(two_methods):
    # Δm = 1/3 · [ (55 − 50)/50 + (38 − 40)/40 − (0.4 − 0.5)/0.5 ] · 100
    #    = 1/3 · [ 0.10 − 0.05 + 0.20 ] · 100 = 25/3 = 8.333…  (depth: lower is better, so −)
    rows = table_of(*two_methods)
    assert list(rows) == ["Local", "FedAvg"]  # one run each: labelled by its method, baseline first
    assert rows["FedAvg"].delta_m == report.Stat(pytest.approx(25 / 3), None, 1)
    assert rows["Local"].delta_m.mean == 0.0 and rows["Local"].separated == "baseline"
    assert rows["FedAvg"].separated == "n/a"  # one seed: no spread to compare with
    assert rows["FedAvg"].metrics["B/depth"] == report.Stat(0.4, None, 1)


def test_the_baseline_can_be_any_run_by_directory_or_label(two_methods):
    # Against FedAvg, Local's Δm = 1/3 · [ (50 − 55)/55 + (40 − 38)/38 − (0.5 − 0.4)/0.4 ] · 100
    expected = (-5 / 55 + 2 / 38 - 0.1 / 0.4) / 3 * 100  # = −9.626…
    for baseline in (str(two_methods[1]), "FedAvg"):
        rows = table_of(*two_methods, baseline=baseline)
        assert list(rows) == ["FedAvg", "Local"]
        assert rows["Local"].delta_m.mean == pytest.approx(expected)
    # A baseline directory not among the runs joins them.
    assert list(table_of(two_methods[1], baseline=str(two_methods[0]))) == ["Local", "FedAvg"]


# ---------------------------------------------------------------------------- (b) seeds


@pytest.fixture
def three_seeds(tmp_path) -> list[Path]:
    """Local and FedAvg with seeds 0, 1, 2, given in a scrambled order. Local is the same for
    every seed except A/semseg = 40 in seed 1 (so pairing by seed matters)."""
    fedavg = {0: (55.0, 38.0, 0.4), 1: (60.0, 40.0, 0.5), 2: (65.0, 42.0, 0.6)}
    local = {0: (50.0, 40.0, 0.5), 1: (40.0, 40.0, 0.5), 2: (50.0, 40.0, 0.5)}
    return [
        write_run(tmp_path / f"{name}-s{seed}", algorithm, *values[seed], seed=seed)
        for seed in (2, 0, 1)
        for name, algorithm, values in (("fedavg", "FedAvg", fedavg), ("local", "Local", local))
    ]


def test_seeds_give_mean_and_sample_std(three_seeds):
    rows = table_of(*three_seeds)
    assert list(rows) == ["Local", "FedAvg"]  # grouped seeds: labelled by the algorithm
    fedavg = rows["FedAvg"]
    assert fedavg.seeds == (0, 1, 2)
    # A/semseg 55, 60, 65: mean 60, sample std sqrt((25 + 0 + 25)/2) = 5
    assert fedavg.metrics["A/semseg"] == report.Stat(60.0, pytest.approx(5.0), 3)
    # B/depth 0.4, 0.5, 0.6: mean 0.5, std 0.1
    assert fedavg.metrics["B/depth"].mean == pytest.approx(0.5)
    assert fedavg.metrics["B/depth"].std == pytest.approx(0.1)
    # Paired Δm (%): seed 0 vs Local seed 0: (0.10 − 0.05 + 0.20)/3 = 25/3
    #                seed 1 vs Local seed 1 (A = 40): ((60 − 40)/40 + 0 + 0)/3 = 50/3
    #                seed 2 vs Local seed 2: (0.30 + 0.05 − 0.20)/3 = 15/3 = 5
    # mean (25/3 + 50/3 + 15/3)/3 = 10; deviations −5/3, 20/3, −5: std sqrt((25 + 400 + 225)/9/2) = sqrt(325/9)
    assert fedavg.delta_m.mean == pytest.approx(10.0)
    assert fedavg.delta_m.std == pytest.approx((325 / 9) ** 0.5)  # 6.009
    assert fedavg.separated == "yes"  # |10| > 6.009
    # Local's own metric spread: A/semseg 50, 40, 50 -> mean 46.67, std sqrt((11.1 + 44.4 + 11.1)/2) = 5.77
    assert rows["Local"].metrics["A/semseg"].std == pytest.approx((100 / 3) ** 0.5)
    text = report.render_markdown(report.compute_table(report.build_report(three_seeds)))
    # No communication in these results.json (as written before fedmtl counted it): empty cost cells
    assert "| FedAvg | 3 | 60.00 ± 5.00 | 40.00 ± 2.00 | 0.5000 ± 0.1000 | 10.00 ± 6.01 |  |  | yes |" in text


def test_separated_is_mean_against_spread():
    assert report.separated(report.Stat(3.0, 2.0, 3)) == "yes"
    assert report.separated(report.Stat(-3.0, 2.0, 3)) == "yes"
    assert report.separated(report.Stat(1.0, 2.0, 3)) == "no"
    assert report.separated(report.Stat(3.0, None, 1)) == "n/a"


def test_seeds_come_from_config_yaml_and_configs_decide_the_groups(tmp_path):
    def config(seed: int, lr: float, devices: int = 1) -> dict:
        # What differs only in where a run ran (devices, run_dir) does not split a group.
        return {
            "algorithm": {"class_path": "FedAvg"},
            "lr": lr,
            "seed": seed,
            "devices": devices,
            "run_dir": "x",
        }

    local = write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5, seed=None, config={"seed": 0})
    same = [
        write_run(
            tmp_path / f"a{s}", "FedAvg", 55.0, 38.0, 0.4, seed=None, config=config(s, 0.1, devices=s + 1)
        )
        for s in (0, 1)
    ]
    other = write_run(tmp_path / "b0", "FedAvg", 55.0, 38.0, 0.4, seed=None, config=config(0, 0.2))
    local1 = write_run(tmp_path / "local1", "Local", 50.0, 40.0, 0.5, seed=None, config={"seed": 1})
    rows = table_of(local, local1, *same, other)
    # The two Local configs differ only in the seed (a group); FedAvg lr 0.1 with seeds 0, 1 is a
    # group; lr 0.2 is a run of its own: the two FedAvg rows are told apart by their lr.
    assert list(rows) == ["Local", "FedAvg (lr=0.1)", "FedAvg (lr=0.2)"]
    assert rows["FedAvg (lr=0.1)"].seeds == (0, 1) and rows["Local"].seeds == (0, 1)
    # --baseline takes a label, and an algorithm's name where one row has it
    for name in ("FedAvg (lr=0.2)", str(other)):
        assert report.build_report([local, *same, other], baseline=name).baseline.label == "FedAvg (lr=0.2)"
    assert report.build_report([local, other], baseline="FedAvg").baseline.label == "FedAvg"


def test_two_runs_of_one_seed_are_separate_rows_with_unique_labels(tmp_path):
    local = write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5)
    first = write_run(tmp_path / "x" / "fedavg", "FedAvg", 55.0, 38.0, 0.4)
    second = write_run(tmp_path / "y" / "fedavg", "FedAvg", 60.0, 38.0, 0.4)
    # Nothing but the directory tells them apart: not its name (both "fedavg"), so the path.
    assert list(table_of(local, first, second)) == ["Local", f"FedAvg ({first})", f"FedAvg ({second})"]
    third = write_run(tmp_path / "fedavg-b", "FedAvg", 60.0, 38.0, 0.4)
    assert list(table_of(local, first, third))[1:] == ["FedAvg (fedavg)", "FedAvg (fedavg-b)"]


# ---------------------------------------------------------------------------- (c) formats


def test_csv_markdown_and_latex_have_one_cell_per_column(three_seeds):
    table = report.compute_table(report.build_report(three_seeds))
    cells = 2 + len(COLUMNS) + 4  # method, seeds, the metrics, Δm, MB/round, GB total, separated

    rows = list(csv.DictReader(io.StringIO(report.render(table, "csv"))))
    assert [r["method"] for r in rows] == ["Local", "FedAvg"]
    assert float(rows[1]["delta_m"]) == pytest.approx(10.0)
    assert float(rows[1]["delta_m_std"]) == pytest.approx((325 / 9) ** 0.5)
    assert rows[1]["n_seeds"] == "3" and rows[1]["separated"] == "yes"
    assert float(rows[1]["B/depth_RMSE"]) == pytest.approx(0.5)
    assert float(rows[1]["A/semseg_mIoU_std"]) == pytest.approx(5.0)

    markdown = report.render(table, "markdown").splitlines()
    assert len(markdown) == 2 + len(table.rows)
    assert all(line.startswith("| ") and line.endswith(" |") for line in markdown)
    assert {len(line.split(" | ")) for line in markdown} == {cells}
    # Short labels: the dataset as a paper names it, the task, its metric and the arrow
    assert (
        "| PASCAL-Context semseg mIoU ↑ | NYUD semseg mIoU ↑ | NYUD depth RMSE ↓ | Δm (%) ↑ |" in markdown[0]
    )

    latex = report.render(table, "latex")
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert latex.count(rule) == 1
    lines = [line for line in latex.splitlines() if line.endswith(r"\\")]
    assert len(lines) == 2 + len(table.rows)  # a two-level header
    # Every cell but "separated" (a screen, no result for a paper)
    assert {len(re.findall(r"(?<!\\)&", line)) for line in lines[1:]} == {cells - 2}
    assert r"depth RMSE $\downarrow$" in latex and r"\textbf{60.00} $\pm$ 5.00" in latex


def with_cost(run: Path, up: int, down: int, rounds: int = 10) -> Path:
    """``run``'s results.json with a communication cost: ``up`` and ``down`` bytes over ``rounds``."""
    results = json.loads((run / "results.json").read_text())
    results["communication"] = {
        "rounds": rounds,
        "up_bytes": up,
        "down_bytes": down,
        "pools": {},
        "clients": {},
    }
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_cost_columns_are_megabytes_per_round_and_gigabytes_in_all(tmp_path):
    local = with_cost(write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5), 0, 0)
    config = {"algorithm": "FedAvg"}
    runs = [
        with_cost(
            write_run(tmp_path / f"fedavg-s{seed}", "FedAvg", 55.0, 38.0, 0.4, seed=seed, config=config),
            up,
            down,
        )
        for seed, (up, down) in enumerate([(3_000_000, 1_000_000), (5_000_000, 3_000_000)])
    ]
    local1 = with_cost(write_run(tmp_path / "local1", "Local", 50.0, 40.0, 0.5, seed=1), 0, 0)
    table = report.compute_table(report.build_report([local, local1, *runs], baseline=str(local)))
    fedavg = next(row for row in table.rows if row.algorithm == "FedAvg")
    # seeds: 4 MB and 8 MB over 10 rounds: 0.4 and 0.8 MB a round, mean 0.6; 0.004 and 0.008 GB, mean 0.006
    assert fedavg.mb_per_round == pytest.approx(0.6) and fedavg.gb_total == pytest.approx(0.006)
    assert table.rows[0].mb_per_round == 0.0 and table.rows[0].gb_total == 0.0
    rows = {r["method"]: r for r in csv.DictReader(io.StringIO(report.render(table, "csv")))}
    assert float(rows["FedAvg"]["mb_per_round"]) == pytest.approx(0.6)
    assert float(rows["FedAvg"]["gb_total"]) == pytest.approx(0.006)
    assert "| 8.33 ± 0.00 | 0.6 | 0.01 | yes |" in report.render(table, "markdown")
    latex = report.render(table, "latex")
    assert r"MB/round & GB total \\" in latex and r"& 0.6 & 0.01 \\" in latex


def test_a_run_without_the_full_cost_leaves_its_cells_empty(tmp_path):
    local = with_cost(write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5), 0, 0)
    old = write_run(tmp_path / "old", "FedAvg", 55.0, 38.0, 0.4)  # results.json of an earlier fedmtl
    # Resumed from a checkpoint that predates the count: 4 of its 10 rounds counted
    resumed = with_cost(
        write_run(tmp_path / "resumed", "FedProx", 55.0, 38.0, 0.4), 2_000_000, 2_000_000, rounds=4
    )
    rows = table_of(local, old, resumed)
    assert rows["FedAvg"].mb_per_round is None and rows["FedAvg"].gb_total is None
    assert rows["FedProx"].mb_per_round == pytest.approx(1.0) and rows["FedProx"].gb_total is None
    csv_rows = {
        r["method"]: r
        for r in csv.DictReader(
            io.StringIO(
                report.render(report.compute_table(report.build_report([local, old, resumed])), "csv")
            )
        )
    }
    assert csv_rows["FedAvg"]["mb_per_round"] == "" and csv_rows["FedProx"]["gb_total"] == ""
    assert csv_rows["FedAvg"]["runs"] == str(old)  # the CSV names the directories behind a row


def test_a_changed_cost_is_refused(tmp_path, two_methods, capsys):
    with_cost(two_methods[1], -5, 0)
    error = refused([str(p) for p in two_methods], tmp_path, capsys)
    assert "results.json: its communication has no whole up_bytes, down_bytes and rounds >= 0" in error


def test_latex_escapes_names(tmp_path):
    local = write_run(tmp_path / "local_run", "Local", 50.0, 40.0, 0.5)
    other = write_run(tmp_path / "local_b", "Local", 50.0, 40.0, 0.5)
    latex = report.render(
        report.compute_table(report.build_report([local, other], baseline=str(local))), "latex"
    )
    assert r"Local (local\_run) &" in latex


def test_the_output_suffix_picks_the_format():
    assert report.format_for("t.csv") == "csv" and report.format_for("t.tex") == "latex"
    assert report.format_for("t.md") == "markdown" and report.format_for(None) == "markdown"


# ---------------------------------------------------------------------------- (d) errors


def refused(command: list[str], folder: Path, capsys) -> str:
    """The one ``error:`` line of a refused ``fedmtl report ...``, nothing under ``folder`` changed."""
    lines = refused_keeping(["report", *command], folder, capsys)
    return next(line for line in lines if line.startswith("error:"))


def test_runs_of_different_scenarios_are_refused(tmp_path, two_methods, capsys):
    other = tmp_path / "other"
    write_run(other, "FedAvg", 55.0, 38.0, 0.4)
    results = json.loads((other / "results.json").read_text())
    results["clients"]["B"]["tasks"] = ["semseg"]
    del results["clients"]["B"]["metrics"]["depth"]
    (other / "results.json").write_text(json.dumps(results))
    error = refused([*map(str, two_methods), str(other)], tmp_path, capsys)
    assert "different scenarios" in error and "only in" in error and "B/depth (nyud)" in error


def test_a_missing_baseline_is_refused(tmp_path, two_methods, capsys):
    fedavg = str(two_methods[1])
    assert "none of the runs is Local" in refused([fedavg], tmp_path, capsys)
    assert "--baseline nope: not a run directory" in refused([fedavg, "--baseline", "nope"], tmp_path, capsys)


def test_a_baseline_without_the_paired_seed_is_refused(tmp_path, capsys):
    write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5, seed=0)
    for seed in (0, 1):
        write_run(tmp_path / f"fedavg{seed}", "FedAvg", 55.0, 38.0, 0.4, seed=seed)
    error = refused([str(tmp_path / n) for n in ("local", "fedavg0", "fedavg1")], tmp_path, capsys)
    assert "baseline Local has no run with seed 1" in error and "paired by seed" in error


def test_unfinished_and_missing_runs_are_refused(tmp_path, two_methods, capsys):
    local = str(two_methods[0])
    running = tmp_path / "running"
    running.mkdir()
    (running / "config.yaml").write_text("seed: 0\n")
    assert "has no results.json: the run has not finished" in refused([local, str(running)], tmp_path, capsys)
    diverged = write_run(tmp_path / "diverged", "FedAvg", None, 38.0, 0.4)
    assert "null metrics (A/semseg)" in refused([local, str(diverged)], tmp_path, capsys)
    assert f"{tmp_path / 'absent'}: no such run directory" in refused(
        [local, str(tmp_path / "absent")], tmp_path, capsys
    )


def test_a_zero_in_the_baseline_is_refused(tmp_path, capsys):
    local = write_run(tmp_path / "local", "Local", 0.0, 40.0, 0.5)
    fedavg = write_run(tmp_path / "fedavg", "FedAvg", 55.0, 38.0, 0.4)
    error = refused([str(local), str(fedavg)], tmp_path, capsys)
    assert "Δm is undefined against baseline Local" in error and "A/semseg mIoU = 0" in error


def test_an_unknown_format_is_refused(tmp_path, two_methods, capsys):
    error = refused([*map(str, two_methods), "--format", "html"], tmp_path, capsys)
    assert error == "error: --format html: unknown table format; choose one of markdown, csv, latex"


def test_an_existing_output_is_never_overwritten_unless_asked(tmp_path, two_methods, capsys):
    runs = list(map(str, two_methods))
    output = tmp_path / "table.md"
    output.write_text("my notes\n")
    assert "exists and was left as it is" in refused([*runs, "--output", str(output)], tmp_path, capsys)
    assert "--curves" in refused([*runs, "--curves", str(output)], tmp_path, capsys)  # not .png/.svg
    figure = tmp_path / "curves.png"
    figure.write_bytes(b"mine")
    assert "exists" in refused([*runs, "--curves", str(figure)], tmp_path, capsys)
    assert output.read_text() == "my notes\n" and figure.read_bytes() == b"mine"
    assert main(["report", *runs, "--output", str(output), "--overwrite", "true"]) == 0
    assert output.read_text().startswith("| method | seeds |")


# ---------------------------------------------------------------------------- (e, f) real runs

# Two clients, 1 round: lower-is-better tasks (normals, depth) next to saliency; no semseg,
# whose mIoU after one tiny round can be 0 (Δm undefined).
CLIENTS = [
    {"dataset": "pascal_context", "tasks": ["sal"], "batch_size": 4},
    {"dataset": "nyud", "tasks": ["normals", "depth"], "batch_size": 4},
]


@pytest.fixture(scope="module")
def real_runs(module_dir, data_root) -> dict[str, Path]:
    runs = {}
    for algorithm in ("Local", "FedAvg"):
        config = tiny_config(
            module_dir,
            data_root,
            name=f"{algorithm}.yaml",
            algorithm={"class_path": algorithm},
            rounds=1,
            clients=CLIENTS,
        )
        fit(config, module_dir / algorithm.lower())
        runs[algorithm] = module_dir / algorithm.lower()
    return runs


def test_results_json_records_the_seed(real_runs):
    assert json.loads((real_runs["FedAvg"] / "results.json").read_text())["seed"] == 0


def test_the_command_reports_two_real_runs(real_runs, capsys):
    capsys.readouterr()
    assert main(["report", str(real_runs["FedAvg"]), str(real_runs["Local"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "| method | seeds | PASCAL-Context sal maxF ↑ | NYUD normals mErr ↓ "
        "| NYUD depth RMSE ↓ | Δm (%) ↑ | MB/round | GB total | separated |"
    )
    # Local sends nothing; FedAvg's one round costs what its results.json counted.
    assert lines[2].startswith("| Local | 1 |") and lines[2].endswith("| 0.00 | 0.0 | 0.00 | baseline |")
    counted = json.loads((real_runs["FedAvg"] / "results.json").read_text())["communication"]
    sent = counted["up_bytes"] + counted["down_bytes"]
    assert sent > 0 and counted["rounds"] == 1
    assert lines[3].startswith("| FedAvg | 1 |") and lines[3].endswith(
        f"| {sent / 1e6:.1f} | {sent / 1e9:.2f} | n/a |"
    )
    assert len(lines) == 4


def test_the_command_writes_csv_and_curves(real_runs, tmp_path, capsys):
    table, curves = tmp_path / "table.csv", tmp_path / "curves.png"
    runs = [str(real_runs["Local"]), str(real_runs["FedAvg"])]
    before = {name: file_hashes(path) for name, path in real_runs.items()}
    assert main(["report", *runs, "--output", str(table), "--curves", str(curves)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"table: {table}", f"curves: {curves}"]
    rows = list(csv.DictReader(table.open()))
    assert [r["method"] for r in rows] == ["Local", "FedAvg"] and float(rows[0]["delta_m"]) == 0.0
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and curves.stat().st_size > 10_000
    assert before == {name: file_hashes(path) for name, path in real_runs.items()}  # runs untouched


def test_curves_read_the_validation_keys_of_metrics_csv(real_runs):
    built = report.build_report([real_runs["Local"], real_runs["FedAvg"]])
    local, fedavg = (report.read_history(m.runs[0], built.columns) for m in built.methods)
    assert set(local) == {1} and set(local[1]) == {c.key for c in built.columns}
    rounds, deltas = report.delta_m_series(fedavg, local, built.columns)
    row = report.compute_table(built).rows[1]
    assert rounds == [1] and deltas == [pytest.approx(row.delta_m.mean)]  # the last round is the final one


def test_the_notebook_shows_the_table_and_the_curves(real_runs):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        "FEDMTL_RUNS": f"{real_runs['Local']} {real_runs['FedAvg']}",
        # The kernel imports this checkout's fedmtl (an editable install may point elsewhere).
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
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
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    printed = "".join(o.get("text", "") for o in outputs)
    assert "2 methods, 3 client tasks, baseline Local" in printed
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "| FedAvg | 1 |" in markdown and "Δm (%) ↑" in markdown
    assert any("image/png" in o.get("data", {}) for o in outputs)
