"""benchmarks/learnability.py, edge_ceiling.py, optimizer.py, client_speed.py and edge_rescore.py refuse bad options with one
``error:`` line naming the option, exit 2, before they generate or train anything; learnability.py's
--train_size trains on crops and scores whole images."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("script", "argv", "named"),
    [
        ("learnability", ["--tasks", "semseg", "--images", "0"], "--images must be at least 1, got 0"),
        ("learnability", ["--tasks", "semseg", "--images", "400"], "--images 400 is more than the 300"),
        ("learnability", ["--tasks", "semseg", "--epochs", "0"], "--epochs must be at least 1"),
        (
            "learnability",
            ["--tasks", "semseg", "--train_size", "64"],
            "--train_size must be between 1 and --size 32, got 64",
        ),
        (
            "learnability",
            ["--tasks", "semseg", "--train_size", "0"],
            "--train_size must be between 1 and --size 32, got 0",
        ),
        ("learnability", ["--tasks", "semseg", "--lr", "0"], "--lr positive"),
        (
            "learnability",
            ["--tasks", "semseg", "--scale_range", "2", "1"],
            "--scale_range needs 0 < min <= max",
        ),
        ("learnability", ["--dataset", "nyud", "--tasks", "sal"], "sal"),
        ("edge_ceiling", ["--sizes", "16"], "--sizes must be at least 32"),
        ("edge_ceiling", ["--num_val", "0"], "--num_val at least 1"),
        ("optimizer", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
        ("optimizer", ["--size", "-32"], "--size must be at least 1"),
        ("client_speed", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
        ("client_speed", ["--local_epochs", "-1"], "--local_epochs must be at least 1"),
        ("edge_rescore", ["--out", "nowhere"], "--out nowhere: no finished run"),
    ],
)
def test_a_bad_option_is_one_error_line(script, argv, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # learnability's default data folder is relative
    with pytest.raises(SystemExit) as done:
        _script(script).main(argv)
    assert done.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and named in errors[0]
    assert not any(tmp_path.iterdir())  # nothing generated


def test_learnability_trains_on_crops_and_scores_whole_images(tmp_path, monkeypatch, capsys):
    """--train_size: the training split is read at the crop side, the validation split at --size."""
    import fedmtl.data.datasets as datasets

    built = []
    build = datasets.build_dataset

    def recording(dataset, root, split, tasks, size, **kwargs):
        built.append((split, tuple(size)))
        return build(dataset, root, split, tasks, size, **kwargs)

    monkeypatch.setattr(datasets, "build_dataset", recording)
    # The trivial predictor reads the data too, through whichever build_dataset fedmtl.trivial
    # bound at its import (before or after the patch, by test order): keep it out of the record.
    monkeypatch.setattr("fedmtl.trivial.trivial_metrics", lambda *args: {"sal": 20.0})
    monkeypatch.chdir(tmp_path)
    argv = ["--tasks", "sal", "--size", "32", "--train_size", "16", "--num_train", "8", "--num_val", "4"]
    code = _script("learnability").main(
        [*argv, "--images", "8", "--epochs", "1", "--lr", "0.01", "--seeds", "0"]
    )
    assert code == 0
    assert built == [("train", (16, 16)), ("val", (32, 32))]
    out = capsys.readouterr().out
    assert "32x32 (training crops 16x16)" in out
    row = next(line for line in out.splitlines() if line.startswith("| sal |"))
    assert row.split("|")[4].strip() == "1"  # 8 images, batch 8: one step


def test_a_results_file_names_the_command_commit_date_and_machine(tmp_path, monkeypatch):
    """benchmarks/results/NAME.md starts with what produced its figures, then the figures."""
    results_file = _script("results_file")
    monkeypatch.setattr(results_file, "RESULTS", tmp_path)
    monkeypatch.setattr(results_file, "commit", lambda: "abc1234 + uncommitted changes")
    path = results_file.write("demo", "A title", "| a | b |\n", argv=["benchmarks/x.py", "--out", "my dir"])
    assert path == tmp_path / "demo.md"
    lines = path.read_text().splitlines()
    assert lines[:3] == ["# A title", "", "- command: `python benchmarks/x.py --out 'my dir'`"]
    assert lines[3] == "- commit: abc1234 + uncommitted changes"
    assert lines[4].startswith("- date: 20") and lines[4].endswith(" UTC")
    assert lines[5].startswith("- machine: ") and " cores, " in lines[5]
    assert lines[-1] == "| a | b |"


def test_the_recorded_commit_is_this_checkout_s_head():
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert _script("results_file").commit().split()[0] == head.stdout.strip()
