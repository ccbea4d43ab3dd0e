"""``fedmtl report`` and ``fedmtl.compare`` with private runs: the ε (δ) column beside Δm in the
markdown, CSV and LaTeX tables, its values (the largest over a row's seeds, ∞ for noise
multiplier 0, — without privacy), the table unchanged when no run has privacy, and a privacy
block the engine could not have written refused. Hand-written results.json files; no training."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

import fedmtl
from fedmtl import report
from fedmtl.cli import main
from tests.helpers import run_cli
from tests.test_report import write_run

EPS = 3.2149  # a run's ε as the accountant wrote it: full precision in the CSV, 3.21 shown


def with_privacy(run: Path, mode: str = "central", epsilon: float | None = EPS, delta: float = 1e-5) -> Path:
    """The run's results.json with a privacy block as the engine writes it (epsilon null: z = 0)."""
    results = json.loads((run / "results.json").read_text())
    results["privacy"] = {
        "mode": mode,
        "epsilon": epsilon,
        "delta": delta,
        "noise_multiplier": 0.0 if epsilon is None else 1.1,
        "clip": 1.0,
        "accountant": "rdp",
        "rounds_accounted": 10,
        "secure_aggregation": False,
        "target_epsilon": None,
        "stopped_at_target": False,
    }
    (run / "results.json").write_text(json.dumps(results))
    return run


@pytest.fixture
def mixed(tmp_path) -> list[Path]:
    """Local without privacy, FedAvg with ε = 3.2149, FedAvg with z = 0 (ε null)."""
    return [
        write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5),
        with_privacy(write_run(tmp_path / "dp", "FedAvg", 52.0, 37.0, 0.45)),
        with_privacy(write_run(tmp_path / "z0", "FedAvg", 55.0, 38.0, 0.4), epsilon=None),
    ]


def table_of(*paths: Path) -> report.Table:
    return report.compute_table(report.build_report(paths))


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The markdown table as one dict per row, header -> cell."""
    lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()]
    return [dict(zip(lines[0], cells, strict=True)) for cells in lines[2:]]


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_markdown_shows_epsilon_and_delta_beside_delta_m(mixed):
    text = report.render(table_of(*mixed), "markdown")
    header = text.splitlines()[0].strip("|").split("|")
    names = [cell.strip() for cell in header]
    assert names[names.index("Δm (%) ↑") + 1] == "ε (δ)"  # right after Δm
    cells = {row["method"]: row["ε (δ)"] for row in markdown_rows(text)}
    assert cells == {"Local": "—", "FedAvg (dp)": "3.21 (1e-05)", "FedAvg (z0)": "∞"}


def test_without_privacy_the_tables_are_as_before(tmp_path):
    # results.json with "privacy": null (a run with privacy.mode unset) reads as one without the
    # key (a run written before fedmtl had privacy): every format byte for byte the same.
    runs = [
        write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5),
        write_run(tmp_path / "fedavg", "FedAvg", 55.0, 38.0, 0.4),
    ]
    before = {fmt: report.render(table_of(*runs), fmt) for fmt in report.FORMATS}
    for run in runs:
        results = json.loads((run / "results.json").read_text())
        (run / "results.json").write_text(json.dumps({**results, "privacy": None}))
    table = table_of(*runs)
    assert not table.private and all(row.privacy is None for row in table.rows)
    after = {fmt: report.render(table, fmt) for fmt in report.FORMATS}
    assert after == before
    assert not any(word in text for text in after.values() for word in ("ε", "epsilon", "varepsilon"))


def test_a_row_of_seeds_shows_its_largest_epsilon_and_delta(tmp_path):
    runs = [write_run(tmp_path / f"local-s{s}", "Local", 50.0, 40.0, 0.5, seed=s) for s in (0, 1, 2)]
    spent = {0: (2.0, 1e-6), 1: (3.5, 1e-6), 2: (3.0, 1e-5)}  # the max of each, from different seeds
    runs += [
        with_privacy(write_run(tmp_path / f"dp-s{s}", "FedAvg", 52.0, 37.0, 0.45, seed=s), "local", *spent[s])
        for s in (0, 1, 2)
    ]
    (row,) = [row for row in table_of(*runs).rows if row.algorithm == "FedAvg"]
    assert len(row.seeds) == 3
    assert row.privacy == report.Privacy("local", 3.5, 1e-5)
    assert report.privacy_cell(row.privacy) == "3.50 (1e-05)"


def test_row_privacy_by_hand():
    def run(privacy: report.Privacy | None) -> report.Run:
        return report.Run(Path("r"), "FedAvg", 0, {}, (), {}, "k", privacy=privacy)

    central = report.Privacy("central", 1.5, 1e-5)
    assert report.row_privacy([run(None), run(None)]) is None
    assert (
        report.row_privacy([run(central), run(report.Privacy("central", math.inf, 1e-5))]).epsilon == math.inf
    )
    # A run without privacy among private seeds gives the row no guarantee: ∞.
    assert report.row_privacy([run(central), run(None)]) == report.Privacy("central", math.inf, 1e-5)
    assert report.row_privacy([run(central), run(report.Privacy("sample", 1.0, 1e-6))]).mode == "mixed"


def test_rows_of_different_modes_name_their_mode(tmp_path):
    runs = [
        write_run(tmp_path / "local", "Local", 50.0, 40.0, 0.5),
        with_privacy(write_run(tmp_path / "central", "FedAvg", 52.0, 37.0, 0.45), "central", 2.0),
        with_privacy(write_run(tmp_path / "sample", "FedAvg", 51.0, 37.0, 0.45), "sample", 8.0, 1e-6),
    ]
    cells = {row["method"]: row["ε (δ)"] for row in markdown_rows(report.render(table_of(*runs), "markdown"))}
    assert cells == {
        "Local": "—",
        "FedAvg (central)": "2.00 (1e-05), central",
        "FedAvg (sample)": "8.00 (1e-06), sample",
    }


def test_csv_has_the_raw_epsilon_delta_and_mode(mixed):
    text = report.render(table_of(*mixed), "csv")
    header = text.splitlines()[0].split(",")
    assert header[header.index("gb_total") + 1 : header.index("separated")] == [
        "epsilon",
        "delta",
        "privacy_mode",
    ]
    rows = {row["method"]: row for row in csv_rows(text)}
    assert float(rows["FedAvg (dp)"]["epsilon"]) == EPS  # not rounded
    assert float(rows["FedAvg (dp)"]["delta"]) == 1e-5 and rows["FedAvg (dp)"]["privacy_mode"] == "central"
    assert float(rows["FedAvg (z0)"]["epsilon"]) == math.inf
    assert [rows["Local"][k] for k in ("epsilon", "delta", "privacy_mode")] == ["", "", ""]


def test_latex_has_the_column_and_its_caption(mixed):
    text = report.render(table_of(*mixed), "latex")
    assert r"\begin{tabular}{lrrrrrrrr}" in text  # 2 + 3 metrics + Δm, ε (δ), MB/round, GB total
    assert r"$\Delta_m$ (\%) $\uparrow$ & $\varepsilon$ ($\delta$) & MB/round" in text
    assert r"& 2.17 & 3.21 ($10^{-5}$) &" in text
    assert r"& $\infty$ &" in text and r"& 0.00 & --- &" in text
    assert r"$\varepsilon$ ($\delta$) the differential privacy spent" in text  # the default caption
    for line in text.splitlines():
        if line.endswith(r"\\") and "&" in line and "multicolumn" not in line:
            assert line.count("&") == 8  # every row as wide as the header
    assert (
        report.privacy_cell(report.Privacy("sample", 1.0, 2.5e-6), latex=True)
        == r"1.00 ($2.5 \times 10^{-6}$)"
    )


def test_compare_and_the_command_show_the_column(mixed, capsys):
    text = fedmtl.compare([str(p) for p in mixed])
    assert "| ε (δ) |" in text.splitlines()[0] and "| 3.21 (1e-05) |" in text
    rows = {row["method"]: row for row in csv_rows(fedmtl.compare([str(p) for p in mixed], format="csv"))}
    assert float(rows["FedAvg (dp)"]["epsilon"]) == EPS
    capsys.readouterr()
    main(["report", *map(str, mixed)])  # returns normally on success
    assert capsys.readouterr().out == text  # the command prints what compare returns


@pytest.mark.parametrize(
    "block",
    [
        {"mode": "central", "epsilon": "3.2", "delta": 1e-5},  # a string
        {"mode": "central", "epsilon": -1.0, "delta": 1e-5},
        {"mode": "central", "epsilon": 3.2, "delta": 0.0},
        {"mode": "central", "epsilon": 3.2},  # no delta
        {"mode": "global", "epsilon": 3.2, "delta": 1e-5},
        "central",
    ],
)
def test_a_privacy_block_fedmtl_did_not_write_is_one_error_line(mixed, block, capsys):
    results = json.loads((mixed[1] / "results.json").read_text())
    (mixed[1] / "results.json").write_text(json.dumps({**results, "privacy": block}))
    code, errors = run_cli(["report", *map(str, mixed)], capsys)
    assert code != 0
    assert errors == [
        f"error: {mixed[1] / 'results.json'}: its privacy has no mode (central, local or sample), epsilon "
        "(a number >= 0, or null) and delta in (0, 1): the file was changed after the run wrote it; "
        "restore it, or leave the run out"
    ]
