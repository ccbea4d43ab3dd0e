"""Regenerate docs/images/report-table.png and docs/images/report-curves.png, the pictures of
``fedmtl report``'s LaTeX table and ``--curves`` on docs/cli.md.

    python docs/images/make_report_figures.py      # needs pdflatex and pdftoppm for the table

The runs are made up, not trained: scenario 1's client tasks (five single-task PASCAL-Context
clients, one NYUD-v2 client of four tasks), Local, FedAvg and FedHCA² with three seeds each,
their results.json and metrics.csv written as the engine writes them into a temporary folder,
with smooth curves and seeded noise. The figures show the report's layout; their numbers are
no result. The table goes through the real path: ``fedmtl.report`` builds and renders it,
pdflatex compiles it inside a minimal document, pdftoppm rasterises it at 150 dpi and the
page's white margin is cropped (Pillow; pdfcrop and the standalone class are often absent).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # this checkout's fedmtl

from fedmtl import report  # noqa: E402

ROUNDS = 20
EVERY = 4  # evaluation every 4 rounds, as the paper's recipe
# (client, dataset, task, metric, final Local value, how much better each method ends)
TASKS = [
    ("pascal_context-semseg", "pascal_context", "semseg", "mIoU", 62.0, 3.0),
    ("pascal_context-human_parts", "pascal_context", "human_parts", "mIoU", 58.0, 2.0),
    ("pascal_context-sal", "pascal_context", "sal", "maxF", 82.0, 1.0),
    ("pascal_context-normals", "pascal_context", "normals", "mErr", 14.5, -0.3),
    ("pascal_context-edge", "pascal_context", "edge", "odsF", 67.0, 0.8),
    ("nyud-semseg+normals+edge+depth", "nyud", "semseg", "mIoU", 36.0, 4.0),
    ("nyud-semseg+normals+edge+depth", "nyud", "normals", "mErr", 24.0, -0.8),
    ("nyud-semseg+normals+edge+depth", "nyud", "edge", "odsF", 71.0, 1.0),
    ("nyud-semseg+normals+edge+depth", "nyud", "depth", "RMSE", 0.66, -0.04),
]
METHODS = {"Local": 0.0, "FedAvg": 0.4, "FedHCA2": 1.0}  # share of the gain each reaches
SEEDS = (0, 1, 2)


def write_run(folder: Path, algorithm: str, seed: int) -> None:
    rng = random.Random(f"{algorithm}-{seed}")
    clients: dict[str, dict] = {}
    lines = ["round,key,value"]
    for r in range(1, ROUNDS + 1):
        progress = (1 - 0.8**r) / (1 - 0.8**ROUNDS)  # rises fast, flattens, reaches the final value
        for client in dict.fromkeys(t[0] for t in TASKS):
            loss = 2.5 * 0.9**r + 0.4 - 0.1 * METHODS[algorithm] * r / ROUNDS + rng.gauss(0, 0.02)
            lines.append(f"{r},train/{client}/loss,{loss}")
        if r % EVERY and r != ROUNDS:
            continue
        for client, dataset, task, metric, local, gain in TASKS:
            final = local + METHODS[algorithm] * gain + rng.gauss(0, abs(gain) * 0.25 + 1e-3)
            lower = metric in ("mErr", "RMSE")
            start = final * (1.6 if lower else 0.4)
            value = start + (final - start) * progress
            lines.append(f"{r},val/{client}/{task}_{metric},{value}")
            if r == ROUNDS:
                entry = clients.setdefault(client, {"dataset": dataset, "tasks": [], "metrics": {}})
                entry["tasks"].append(task)
                entry["metrics"][task] = {metric: final}
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    sent = 0 if algorithm == "Local" else int(ROUNDS * 6 * 2 * 28e6 * (1.3 if algorithm == "FedHCA2" else 1))
    communication = {"rounds": ROUNDS, "up_bytes": sent // 2, "down_bytes": sent // 2}
    results = {"rounds": ROUNDS, "algorithm": algorithm, "seed": seed, "clients": clients}
    results["communication"] = communication
    (folder / "results.json").write_text(json.dumps(results))


def table_png(table: report.Table, target: Path, work: Path) -> None:
    geometry = r"\usepackage[paperwidth=45cm,paperheight=12cm,margin=1cm]{geometry}"  # the table's width
    document = report.latex_document(report.render(table, "latex"), geometry)
    (work / "table.tex").write_text(document, encoding="utf-8")
    command = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"]
    subprocess.run(command, cwd=work, check=True, capture_output=True)
    subprocess.run(
        ["pdftoppm", "-png", "-r", "150", "-singlefile", "table.pdf", "table"], cwd=work, check=True
    )
    from PIL import Image, ImageChops

    page = Image.open(work / "table.png").convert("RGB")
    box = ImageChops.difference(page, Image.new("RGB", page.size, "white")).getbbox()
    margin = 20
    left, top, right, bottom = box
    crop = (max(left - margin, 0), max(top - margin, 0), right + margin, bottom + margin)
    page.crop(crop).save(target)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = []
        for algorithm in METHODS:
            for seed in SEEDS:
                runs.append(tmp / f"{algorithm.lower()}-s{seed}")
                write_run(runs[-1], algorithm, seed)
        built = report.build_report(runs)
        table = report.compute_table(built)
        print(report.render(table, "markdown"))
        figure = report.draw_curves(built)
        figure.savefig(HERE / "report-curves.png", dpi=110)
        print(f"wrote {HERE / 'report-curves.png'}")
        if shutil.which("pdflatex") is None or shutil.which("pdftoppm") is None:
            print("pdflatex or pdftoppm is not installed: report-table.png left as it was")
            return
        table_png(table, HERE / "report-table.png", tmp)
        print(f"wrote {HERE / 'report-table.png'}")


if __name__ == "__main__":
    main()
