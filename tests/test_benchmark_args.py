"""probes/learnability.py, probes/edge_ceiling.py, benchmarks/optimizer.py, client_speed.py,
edge_rescore.py and keep_state.py refuse bad options with one ``error:`` line naming the option,
exit 2, before they generate or train anything; learnability.py's --train_size trains on crops
and scores whole images.
The scripts record their tables through benchmarks/results_file.py, into ``$FEDMTL_RESULTS_DIR``
when it is set (here, each test's own folder), as tiny runs of the cheap ones show."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(path: str):
    """The script ``REPO/PATH.py`` (``benchmarks/NAME`` or ``probes/NAME``) loaded as a module."""
    spec = importlib.util.spec_from_file_location(Path(path).name, REPO / f"{path}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _as_run_from_benchmarks(monkeypatch, tmp_path):
    """What ``python benchmarks/NAME.py`` gives a script: its folder on sys.path (``import
    results_file``); and a results folder of the test's own, never benchmarks/results/."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setenv("FEDMTL_RESULTS_DIR", str(tmp_path / "results"))


@pytest.mark.parametrize(
    ("script", "argv", "named"),
    [
        ("probes/learnability", ["--tasks", "semseg", "--images", "0"], "--images must be at least 1, got 0"),
        (
            "probes/learnability",
            ["--tasks", "semseg", "--images", "400"],
            "--images 400 is more than the 300",
        ),
        ("probes/learnability", ["--tasks", "semseg", "--epochs", "0"], "--epochs must be at least 1"),
        (
            "probes/learnability",
            ["--tasks", "semseg", "--train_size", "64"],
            "--train_size must be between 1 and --size 32, got 64",
        ),
        (
            "probes/learnability",
            ["--tasks", "semseg", "--train_size", "0"],
            "--train_size must be between 1 and --size 32, got 0",
        ),
        ("probes/learnability", ["--tasks", "semseg", "--lr", "0"], "--lr positive"),
        (
            "probes/learnability",
            ["--tasks", "semseg", "--scale_range", "2", "1"],
            "--scale_range needs 0 < min <= max",
        ),
        ("probes/learnability", ["--dataset", "nyud", "--tasks", "sal"], "sal"),
        ("probes/edge_ceiling", ["--sizes", "16"], "--sizes must be at least 32"),
        ("probes/edge_ceiling", ["--num_val", "0"], "--num_val at least 1"),
        ("benchmarks/optimizer", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
        ("benchmarks/optimizer", ["--size", "-32"], "--size must be at least 1"),
        ("benchmarks/client_speed", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
        ("benchmarks/client_speed", ["--local_epochs", "-1"], "--local_epochs must be at least 1"),
        ("benchmarks/edge_rescore", ["--out", "nowhere"], "--out nowhere: no finished run"),
        ("benchmarks/keep_state", ["--size", "16"], "--size must be at least 32"),
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
    code = _script("probes/learnability").main(
        [*argv, "--images", "8", "--epochs", "1", "--lr", "0.01", "--seeds", "0"]
    )
    assert code == 0
    assert built == [("train", (16, 16)), ("val", (32, 32))]
    out = capsys.readouterr().out
    assert "32x32 (training crops 16x16)" in out
    row = next(line for line in out.splitlines() if line.startswith("| sal |"))
    assert row.split("|")[4].strip() == "1"  # 8 images, batch 8: one step
    assert row in _recorded(tmp_path, "learnability")


def test_a_results_file_names_the_command_commit_date_and_machine(tmp_path, monkeypatch):
    """benchmarks/results/NAME.md starts with what produced its figures, then the figures."""
    monkeypatch.delenv("FEDMTL_RESULTS_DIR")  # the default folder, pointed at tmp_path below
    results_file = _script("benchmarks/results_file")
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
    assert _script("benchmarks/results_file").commit().split()[0] == head.stdout.strip()


def test_the_results_folder_is_the_one_given_unless_the_variable_names_another(tmp_path, monkeypatch):
    """A probe gives its own folder; FEDMTL_RESULTS_DIR (a trial run, a test) overrides any."""
    results_file = _script("benchmarks/results_file")
    monkeypatch.setattr(results_file, "commit", lambda: "abc1234")
    monkeypatch.delenv("FEDMTL_RESULTS_DIR")
    probe = tmp_path / "probes" / "results"
    assert results_file.write("a", "A", "x", argv=["a.py"], folder=probe) == probe / "a.md"
    monkeypatch.setenv("FEDMTL_RESULTS_DIR", str(tmp_path / "trial"))
    assert results_file.write("a", "A", "x", argv=["a.py"], folder=probe) == tmp_path / "trial" / "a.md"
    assert results_file.write("b", "B", "x", argv=["b.py"]) == tmp_path / "trial" / "b.md"


def test_a_table_head_aligns_the_labels_left_and_the_figures_right():
    results_file = _script("benchmarks/results_file")
    assert (
        results_file.table_head("size", "nms", "ms", labels=2) == "| size | nms | ms |\n| --- | --- | ---: |"
    )
    assert results_file.row("a", 1, "2.0") == "| a | 1 | 2.0 |"


def _recorded(tmp_path: Path, name: str) -> list[str]:
    """The lines of the results file NAME.md that a script run in the test wrote."""
    return (tmp_path / "results" / f"{name}.md").read_text().splitlines()


def test_optimizer_records_its_ratio_table(tmp_path):
    assert _script("benchmarks/optimizer").main(["--size", "32", "--repeats", "1", "--steps", "1"]) == 0
    lines = _recorded(tmp_path, "optimizer")
    assert lines[0] == "# Training step: fused AdamW against per-tensor AdamW"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ")][2:] == [
        "| pascal_context semseg",
        "| nyud semseg+normals+edge+depth",
    ]


def test_keep_state_records_both_client_state_sizes(tmp_path):
    assert _script("benchmarks/keep_state").main(["--size", "32"]) == 0
    lines = _recorded(tmp_path, "keep_state")
    assert lines[0] == "# Client state with optimizer.keep_state true and false"
    rows = [line.split(" | ") for line in lines if line.startswith("| ")][2:]
    assert [row[0] for row in rows] == ["| pascal_context semseg", "| nyud semseg+normals+edge+depth"]
    assert all(float(row[2]) < float(row[1]) and float(row[3].rstrip(" |")) < 0.5 for row in rows)


def test_feddea_mask_records_each_call_against_the_clone(tmp_path, monkeypatch):
    script = _script("benchmarks/feddea_mask")
    monkeypatch.setattr(script, "SHAPES", {"tiny 2 x 1,000": (2, 1000)})
    script.main(["--repeats", "1"])
    rows = [line for line in _recorded(tmp_path, "feddea_mask") if line.startswith("| tiny")]
    assert [row.split(" | ")[1] for row in rows] == ["clone", "topk reference", "feddea_mask"]
    assert rows[0].endswith(" | 1.0 |")  # the clone against itself


def test_edge_eval_times_the_reference_kept_with_the_tests(tmp_path, monkeypatch):
    # The script sets OMP_NUM_THREADS for itself when unset; keep that out of later tests.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    _script("benchmarks/edge_eval").main(["--sizes", "32x32", "--repeats", "1", "--nms", "on"])
    rows = [line for line in _recorded(tmp_path, "edge_eval") if line.startswith("| 32x32 ")]
    assert [row.split(" | ")[1:3] for row in rows] == [["blurry", "on"], ["sharp", "on"]]


def test_eval_ratio_records_each_evaluating_round(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = ["round,key,value", "1,time/train,10.0", "2,time/train,8.0", "2,time/eval,2.0"]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    assert _script("benchmarks/eval_ratio").main([str(run)]) == 0
    lines = _recorded(tmp_path, "eval_ratio")
    assert lines[-1] == "| 2 | 8.0 | 2.0 | 0.25 |"
    assert "Highest: 0.25." in "\n".join(lines)


def test_methods_records_one_file_per_part(tmp_path):
    methods = _script("benchmarks/methods")
    phases = {"train": 10.0, "exchange": 0.1, "aggregate": 1.0, "write_back": 0.5}
    times = {
        "FedAvg": [{**phases, "round": 11.6, "finish": 0.0}],
        "FedBABU": [{**phases, "train": 11.0, "round": 12.6, "finish": 23.2}],
    }
    methods.record("rounds", "Rounds", methods.rounds_table(times, Path("demo.yaml"), 2, 1, 10))
    lines = _recorded(tmp_path, "methods_rounds")
    assert "| FedAvg | 10.00 | 0.100 | 1.00 | 0.50 | 11.60 | 1.00 (1.00) | 1.00 (1.00) | reference |" in lines
    assert (
        "| FedBABU | 11.00 | 0.100 | 1.00 | 0.50 | 12.60 | 1.10 (1.10) | 1.09 (1.09) | ≤ 1.15× ok |" in lines
    )
    assert "| FedBABU | 23.2 | 2.0 | 18.4% | 1.8% |" in lines  # its fine-tuning: 2 FedAvg rounds
    assert not (tmp_path / "results" / "methods_server.md").exists()


def test_edge_ceiling_records_its_table(tmp_path):
    assert _script("probes/edge_ceiling").main(["--sizes", "32", "--num_val", "1"]) == 0
    assert _recorded(tmp_path, "edge_ceiling")[-1].startswith("| 32 | 0.34 | ")
