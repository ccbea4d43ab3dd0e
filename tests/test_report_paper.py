"""The report as a paper uses it: short labels, a booktabs LaTeX table with caption, label,
two-level header and the best values in bold (checked as text, and compiled where pdflatex is
installed), curves whose every panel reads alone (artists checked, no image compared), and
``--partition`` of one run without a baseline."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fedmtl import report
from tests.helpers import run_cli

S = report.Stat
PASCAL = report.Column("pascal_context-semseg", "semseg", "mIoU", False, "pascal_context")
PARTS = report.Column("pascal_context-human_parts", "human_parts", "mIoU", False, "pascal_context")
NORMALS = report.Column("nyud-normals+depth", "normals", "mErr", True, "nyud")
DEPTH = report.Column("nyud-normals+depth", "depth", "RMSE", True, "nyud")
COLUMNS = (PASCAL, PARTS, NORMALS, DEPTH)


def row(
    label: str, algorithm: str, values: tuple[float, ...], delta: float, std: float | None = 1.0
) -> report.Row:
    n = 1 if std is None else 2
    return report.Row(
        label=label,
        algorithm=algorithm,
        seeds=tuple(range(n)),
        metrics={c.key: S(v, None if std is None else std, n) for c, v in zip(COLUMNS, values, strict=True)},
        delta_m=S(delta, None if std is None else std, n),
        separated="n/a",
        mb_per_round=1.5,
        gb_total=0.25,
    )


# Best per column: semseg FedHCA² (55), human_parts FedAvg (41), normals (↓) FedHCA² (19),
# depth (↓) FedAvg (0.45), Δm FedHCA² (3.00); FedAvg's Δm is negative (a minus sign).
TABLE = report.Table(
    COLUMNS,
    (
        row("Local", "Local", (50.0, 40.0, 20.0, 0.5), 0.0),
        row("FedHCA²", "FedHCA2", (55.0, 38.0, 19.0, 0.6), 3.0),
        row("FedAvg (lr=0.1) & 50%_x", "FedAvg", (52.0, 41.0, 21.0, 0.45), -1.0),
    ),
    "Local",
)


def test_labels_are_the_dataset_task_metric_and_arrow():
    assert report.column_labels(COLUMNS) == [
        "PASCAL-Context semseg mIoU ↑",
        "PASCAL-Context human_parts mIoU ↑",
        "NYUD normals mErr ↓",
        "NYUD depth RMSE ↓",
    ]
    # Two clients of one dataset with one task: the dataset alone does not tell them apart
    twins = (
        report.Column("nyud-a", "depth", "RMSE", True, "nyud"),
        report.Column("nyud-b", "depth", "RMSE", True, "nyud"),
        PASCAL,
    )
    assert report.column_labels(twins) == [
        "nyud-a depth RMSE ↓",
        "nyud-b depth RMSE ↓",
        "PASCAL-Context semseg mIoU ↑",
    ]
    header = report.render_markdown(TABLE).splitlines()[0]
    assert header.startswith("| method | seeds | PASCAL-Context semseg mIoU ↑ |")
    assert max(len(cell) for cell in header.split(" | ")) <= 33  # was 45: nyud-semseg+normals+edge+depth/…


def test_best_rows_follow_each_columns_arrow():
    best = report.best_rows(TABLE)
    assert best == {PASCAL.key: {1}, PARTS.key: {2}, NORMALS.key: {1}, DEPTH.key: {2}, "Δm": {1}}


def test_latex_is_a_booktabs_table_with_caption_label_two_level_header_and_bold_best():
    latex = report.render_latex(TABLE, caption=r"Scenario 1, $\Delta_m$ vs Local.", label="tab:s1")
    lines = latex.splitlines()
    assert lines[0] == r"% fedmtl report; needs \usepackage{booktabs} in the preamble"
    assert lines[1] == r"\begin{table}[t]" and lines[-1] == r"\end{table}"
    assert r"\caption{Scenario 1, $\Delta_m$ vs Local.}" in lines and r"\label{tab:s1}" in lines
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert latex.count(rule) == 1
    upper = next(line for line in lines if r"\multicolumn" in line)
    assert r"\multicolumn{2}{c}{PASCAL-Context} & \multicolumn{2}{c}{NYUD}" in upper
    assert r"\cmidrule(lr){3-4} \cmidrule(lr){5-6}" in lines
    assert (
        r"Method & Seeds & semseg mIoU $\uparrow$ & human\_parts mIoU $\uparrow$ & normals mErr $\downarrow$ "
        r"& depth RMSE $\downarrow$ & $\Delta_m$ (\%) $\uparrow$ & MB/round & GB total \\"
    ) in lines
    body = {
        line.split(" & ")[0]: line.split(" & ") for line in lines if line.endswith(r"\\") and "$\\pm$" in line
    }
    hca, avg, local = body[r"FedHCA\textsuperscript{2}"], body[r"FedAvg (lr=0.1) \& 50\%\_x"], body["Local"]
    assert hca[2] == r"\textbf{55.00} $\pm$ 1.00" and hca[4] == r"\textbf{19.00} $\pm$ 1.00"  # ↑ and ↓
    assert hca[6] == r"\textbf{3.00} $\pm$ 1.00"  # Δm: higher is better
    assert avg[3] == r"\textbf{41.00} $\pm$ 1.00" and avg[5] == r"\textbf{0.4500} $\pm$ 1.0000"
    assert avg[6] == r"$-$1.00 $\pm$ 1.00"
    assert not any(r"\textbf" in cell for cell in local)
    assert all(len(cells) == 9 for cells in body.values())


def test_latex_defaults_name_the_baseline_and_seeds():
    latex = report.render(TABLE, "latex")
    assert r"\label{tab:fedmtl-report}" in latex
    assert r"(mean $\pm$ standard deviation over 2 seeds) and $\Delta_m$ (\%) against Local" in latex
    one_seed = report.Table(COLUMNS, (row("Local", "Local", (1.0, 1.0, 1.0, 1.0), 0.0, std=None),), "Local")
    single = report.render(one_seed, "latex")
    assert "standard deviation" not in single and r"$\pm$" not in single.split(r"\midrule")[1]


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_the_latex_table_compiles(tmp_path):
    document = report.latex_document(report.render(TABLE, "latex"))
    (tmp_path / "table.tex").write_text(document, encoding="utf-8")
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "table.pdf").stat().st_size > 1000
    assert not re.search(r"^! ", done.stdout, re.MULTILINE)


# ---------------------------------------------------------------------------- curves

ROUNDS = (1, 2, 3)


def write_curve_run(folder: Path, algorithm: str, seed: int, offset: float) -> Path:
    """A finished run as the engine writes it: results.json (two clients, A: PASCAL-Context
    semseg, B: NYUD depth) and metrics.csv with each round's validation metrics and each
    client's training loss (and keys the report does not draw: lr, a task's loss)."""
    folder.mkdir(parents=True)
    final = {"A": {"semseg": {"mIoU": 50.0 + offset}}, "B": {"depth": {"RMSE": 0.5 - offset / 100}}}
    results = {
        "rounds": ROUNDS[-1],
        "algorithm": algorithm,
        "seed": seed,
        "evaluated": "post-aggregation",
        "clients": {
            "A": {"dataset": "pascal_context", "tasks": ["semseg"], "metrics": final["A"]},
            "B": {"dataset": "nyud", "tasks": ["depth"], "metrics": final["B"]},
        },
    }
    (folder / "results.json").write_text(json.dumps(results))
    lines = ["round,key,value"]
    for r in ROUNDS:
        scale = r / ROUNDS[-1]
        lines += [
            f"{r},train/A/loss,{2.0 - r * 0.3 + offset / 10}",
            f"{r},train/B/loss,{1.0 - r * 0.2}",
            f"{r},train/B/depth_loss,{0.5}",
            f"{r},lr/0,0.0001",
            f"{r},val/A/semseg_mIoU,{(50.0 + offset) * scale}",
            f"{r},val/B/depth_RMSE,{(0.5 - offset / 100) / scale}",
        ]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def curve_runs(tmp_path) -> list[Path]:
    """Local and FedAvg with seeds 0 and 1 (FedAvg better by a seed-dependent margin), and
    FedProx with seed 0 alone."""
    runs = [
        write_curve_run(tmp_path / f"{name}-s{seed}", algorithm, seed, offset)
        for seed in (0, 1)
        for name, algorithm, offset in (("local", "Local", 0.0), ("fedavg", "FedAvg", 2.0 + 3 * seed))
    ]
    return [*runs, write_curve_run(tmp_path / "fedprox-s0", "FedProx", 0, 1.0)]


def test_curves_have_units_one_legend_a_dashed_baseline_bands_and_a_loss_panel(curve_runs):
    from matplotlib.collections import PolyCollection

    built = report.build_report(curve_runs)
    figure = report.draw_curves(built)
    axes = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_ylabel() for ax in axes] == ["mIoU (%)", "RMSE (m)", "Δm (%)", "loss"]
    assert {ax.get_xlabel() for ax in axes} == {"round"}
    assert [ax.get_title() for ax in axes] == [
        "PASCAL-Context semseg mIoU ↑",
        "NYUD depth RMSE ↓",
        "Δm ↑ vs Local",
        "training loss (mean over clients)",
    ]
    # One legend, the figure's, naming each method once; the baseline dashed there too
    assert not any(ax.get_legend() for ax in axes) and len(figure.legends) == 1
    entries = {
        t.get_text(): h
        for t, h in zip(figure.legends[0].texts, figure.legends[0].legend_handles, strict=True)
    }
    assert list(entries) == ["Local (baseline)", "FedAvg", "FedProx"]
    assert entries["Local (baseline)"].get_linestyle() == "--" and entries["FedAvg"].get_linestyle() == "-"
    baseline_colour = entries["Local (baseline)"].get_color()
    for ax in axes:  # the baseline's line in every panel (Δm: the line at 0) is dashed
        mine = [line for line in ax.get_lines() if line.get_color() == baseline_colour]
        assert mine and {line.get_linestyle() for line in mine} == {"--"}, ax.get_title()
    # Mean over seeds: one line per method and panel, a band for the methods with two seeds
    for ax in axes[:2] + axes[3:]:
        assert len(ax.get_lines()) == 3
        assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2  # Local, FedAvg
    delta = axes[2]
    assert len([c for c in delta.collections if isinstance(c, PolyCollection)]) == 1  # FedAvg
    # FedAvg's semseg line is the mean of its seeds (offsets 2 and 5): 53.5 · r/3
    fedavg = next(line for line in axes[0].get_lines() if line.get_color() == entries["FedAvg"].get_color())
    assert list(fedavg.get_xdata()) == list(ROUNDS)
    assert list(fedavg.get_ydata()) == pytest.approx([53.5 * r / 3 for r in ROUNDS])
    # The loss panel: the mean over clients, then over seeds; Local's round 1: (1.7 + 0.8) / 2
    local_loss = next(line for line in axes[3].get_lines() if line.get_color() == baseline_colour)
    assert local_loss.get_ydata()[0] == pytest.approx(1.25)


def test_mean_band_keeps_the_rounds_every_seed_has():
    rounds, means, stds = report.mean_band([([1, 2, 3], [1.0, 2.0, 3.0]), ([1, 3], [3.0, 5.0])])
    assert rounds == [1, 3] and means == [2.0, 4.0] and stds == pytest.approx([2**0.5, 2**0.5])
    assert report.mean_band([([1], [1.0])]) == ([1], [1.0], None)


# ---------------------------------------------------------------------------- --partition alone


def test_the_partition_of_one_run_needs_no_baseline(tmp_path, capsys):
    run = tmp_path / "fedavg"
    write_curve_run(run, "FedAvg", 0, 0.0)
    results = json.loads((run / "results.json").read_text())
    results["clients"]["A"]["class_histogram"] = {"person": 3, "sky": 1}
    results["clients"]["B"]["class_histogram"] = {"wall": 2}
    (run / "results.json").write_text(json.dumps(results))
    figure = tmp_path / "partition.png"
    code, errors = run_cli(["report", str(run), "--partition", str(figure)], capsys)
    assert code == 0, errors
    assert errors == [
        "no table: no baseline among the runs (none is Local, or several are); add --baseline RUN_DIR for one"
    ]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A table asked for still needs its baseline: one error line, nothing written
    table = tmp_path / "table.md"
    code, errors = run_cli(
        ["report", str(run), "--partition", str(tmp_path / "p2.png"), "--output", str(table)], capsys
    )
    assert code != 0 and errors[-1].startswith("error: no baseline: none of the runs is Local")
    assert not table.exists() and not (tmp_path / "p2.png").exists()
