"""The report as a paper uses it: short labels, a booktabs LaTeX table with caption, label,
two-level header and the best values in bold (checked as text, and compiled where pdflatex is
installed), curves whose every panel reads alone (artists checked, no image compared), and
``--partition`` of one run without a baseline."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from fedmtl import report

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
    document = "\n".join(
        [
            r"\documentclass{article}",
            r"\usepackage{booktabs}",
            r"\begin{document}",
            report.render(TABLE, "latex"),
            r"\end{document}",
        ]
    )
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
