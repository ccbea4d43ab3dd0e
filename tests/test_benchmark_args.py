"""probes/learnability.py, probes/edge_ceiling.py, benchmarks/optimizer.py, client_speed.py,
edge_rescore.py, keep_state.py and scale.py refuse bad options with one ``error:`` line naming the
option, exit 2, before they generate or train anything; learnability.py's --train_size trains on
crops and scores whole images; scale.py plans the issue's rows, sizes the tiny clients' data,
measures the bytes a process writes and reports each target as a ratio. The scripts record their
tables through benchmarks/results_file.py, into ``$FEDMTL_RESULTS_DIR`` when it is set (here, each
test's own folder), as tiny runs of the cheap ones show."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]


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
        load_script(script).main(argv)
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
    code = load_script("probes/learnability").main(
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
    results_file = load_script("benchmarks/results_file")
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


def test_a_changed_record_does_not_make_the_commit_read_as_changed(tmp_path, monkeypatch):
    """A script that writes its figure before its table (privacy_utility.py) recorded
    '+ uncommitted changes' for its own figure: only changed code counts."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "probes" / "results").mkdir(parents=True)
    files = ("benchmarks/script.py", "benchmarks/results/a.md", "probes/results/b.md")
    for name in files:
        (tmp_path / name).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    results_file = load_script("benchmarks/results_file")
    monkeypatch.setattr(results_file, "RESULTS", tmp_path / "benchmarks" / "results")
    monkeypatch.setattr(results_file, "PROBES", tmp_path / "probes" / "results")
    (tmp_path / files[1]).write_text("2\n")
    (tmp_path / files[2]).write_text("2\n")
    assert not results_file.commit().endswith("uncommitted changes")
    (tmp_path / files[0]).write_text("2\n")
    assert results_file.commit().endswith(" + uncommitted changes")


def test_the_recorded_commit_is_this_checkout_s_head():
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert load_script("benchmarks/results_file").commit().split()[0] == head.stdout.strip()


def test_the_results_folder_is_the_one_given_unless_the_variable_names_another(tmp_path, monkeypatch):
    """A probe gives its own folder; FEDMTL_RESULTS_DIR (a trial run, a test) overrides any."""
    results_file = load_script("benchmarks/results_file")
    monkeypatch.setattr(results_file, "commit", lambda: "abc1234")
    monkeypatch.delenv("FEDMTL_RESULTS_DIR")
    probe = tmp_path / "probes" / "results"
    assert results_file.write("a", "A", "x", argv=["a.py"], folder=probe) == probe / "a.md"
    monkeypatch.setenv("FEDMTL_RESULTS_DIR", str(tmp_path / "trial"))
    assert results_file.write("a", "A", "x", argv=["a.py"], folder=probe) == tmp_path / "trial" / "a.md"
    assert results_file.write("b", "B", "x", argv=["b.py"]) == tmp_path / "trial" / "b.md"


def test_a_table_head_aligns_the_labels_left_and_the_figures_right():
    results_file = load_script("benchmarks/results_file")
    assert (
        results_file.table_head("size", "nms", "ms", labels=2) == "| size | nms | ms |\n| --- | --- | ---: |"
    )
    assert results_file.row("a", 1, "2.0") == "| a | 1 | 2.0 |"


def _recorded(tmp_path: Path, name: str) -> list[str]:
    """The lines of the results file NAME.md that a script run in the test wrote."""
    return (tmp_path / "results" / f"{name}.md").read_text().splitlines()


def test_optimizer_records_its_ratio_table(tmp_path):
    assert load_script("benchmarks/optimizer").main(["--size", "32", "--repeats", "1", "--steps", "1"]) == 0
    lines = _recorded(tmp_path, "optimizer")
    assert lines[0] == "# Training step: fused AdamW against per-tensor AdamW"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ")][2:] == [
        "| pascal_context semseg",
        "| nyud semseg+normals+edge+depth",
    ]


def test_keep_state_records_both_client_state_sizes(tmp_path):
    assert load_script("benchmarks/keep_state").main(["--size", "32"]) == 0
    lines = _recorded(tmp_path, "keep_state")
    assert lines[0] == "# Client state with optimizer.keep_state true and false"
    rows = [line.split(" | ") for line in lines if line.startswith("| ")][2:]
    assert [row[0] for row in rows] == ["| pascal_context semseg", "| nyud semseg+normals+edge+depth"]
    assert all(float(row[2]) < float(row[1]) and float(row[3].rstrip(" |")) < 0.5 for row in rows)


def test_feddea_mask_records_each_call_against_the_clone(tmp_path, monkeypatch):
    script = load_script("benchmarks/feddea_mask")
    monkeypatch.setattr(script, "SHAPES", {"tiny 2 x 1,000": (2, 1000)})
    script.main(["--repeats", "1"])
    rows = [line for line in _recorded(tmp_path, "feddea_mask") if line.startswith("| tiny")]
    assert [row.split(" | ")[1] for row in rows] == ["clone", "topk reference", "feddea_mask"]
    assert rows[0].endswith(" | 1.0 |")  # the clone against itself


def test_edge_eval_times_the_reference_kept_with_the_tests(tmp_path, monkeypatch):
    # The script sets OMP_NUM_THREADS for itself when unset; keep that out of later tests.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    load_script("benchmarks/edge_eval").main(["--sizes", "32x32", "--repeats", "1", "--nms", "on"])
    rows = [line for line in _recorded(tmp_path, "edge_eval") if line.startswith("| 32x32 ")]
    assert [row.split(" | ")[1:3] for row in rows] == [["blurry", "on"], ["sharp", "on"]]


def test_eval_ratio_records_each_evaluating_round(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = ["round,key,value", "1,time/train,10.0", "2,time/train,8.0", "2,time/eval,2.0"]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    assert load_script("benchmarks/eval_ratio").main([str(run)]) == 0
    lines = _recorded(tmp_path, "eval_ratio")
    assert lines[-1] == "| 2 | 8.0 | 2.0 | 0.25 |"
    assert "Highest: 0.25." in "\n".join(lines)


def test_methods_records_one_file_per_part(tmp_path):
    methods = load_script("benchmarks/methods")
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
    assert load_script("probes/edge_ceiling").main(["--sizes", "32", "--num_val", "1"]) == 0
    assert _recorded(tmp_path, "edge_ceiling")[-1].startswith("| 32 | 0.34 | ")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--replicas", "0"], "--replicas must be at least 1"),
        (["--tiny-replicas", "0", "2"], "--tiny-replicas must be at least 1"),
        (["--participation", "0"], "--participation must be in (0, 1]"),
        (["--tiny-participation", "1.5"], "--tiny-participation must be in (0, 1]"),
        (["--tiny-images", "0"], "--tiny-images must be at least 1, got 0"),
        (["--tiny-batch", "3"], "--tiny-batch must be between 1 and --tiny-images 2, got 3"),
        (["--replicas", "--tiny-replicas"], "nothing to run"),
    ],
)
def test_scale_refuses_a_bad_option_before_it_measures_anything(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        load_script("benchmarks/scale").main([*argv, "--tmp", str(tmp_path), "--data", str(tmp_path / "d")])
    assert done.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and named in errors[0]
    assert not any(tmp_path.iterdir())  # no disk test, no data


def test_scale_plans_the_issue_s_rows():
    """The default runs: the 12/102/1,002-client rows as before, then the tiny FedAvg rows (2
    images a client, batch 2): 102 clients at participation 1, 10,002 at 0.01."""
    scale = load_script("benchmarks/scale")
    runs = scale.plan(scale.parse_args([]))
    assert runs[:5] == [
        (4, "FedAvg", 1.0, "disk", None, 8),
        (34, "FedAvg", 1.0, "disk", None, 8),
        (34, "FedAvg", 0.1, "disk", None, 8),
        (334, "FedAvg", 1.0, "disk", None, 8),
        (334, "FedAvg", 0.1, "disk", None, 8),
    ]
    assert [run[1:3] for run in runs[5:8]] == [("FedHCA2", 1.0)] * 3
    assert runs[8:] == [(34, "FedAvg", 1.0, "disk", 2, 2), (3334, "FedAvg", 0.01, "disk", 2, 2)]
    assert scale.plan(scale.parse_args(["--tiny-replicas"]))[-1][4] is None
    assert scale.plan(scale.parse_args(["--replicas", "--tiny-replicas", "2"])) == [
        (2, "FedAvg", 1.0, "disk", 2, 2)
    ]


def test_scale_sizes_the_tiny_data_two_images_a_client():
    """2R single-task PASCAL-Context clients and R NYUD-v2 clients, 2 images each."""
    scale = load_script("benchmarks/scale")
    config = scale.probe_config(Path("d"), 3334, "FedAvg", 0.01, images_per_client=2, batch=2)
    synth = config["data"]["synth"]
    assert (synth["pascal_context"]["num_train"], synth["nyud"]["num_train"]) == (13336, 6668)
    assert [group["batch_size"] for group in config["clients"]] == [2, 2]
    assert config["algorithm"] == {"class_path": "FedAvg", "init_args": {"participation": 0.01}}
    fixed = scale.probe_config(Path("d"), 334, "FedAvg", 1.0)["data"]["synth"]
    assert (fixed["pascal_context"]["num_train"], fixed["nyud"]["num_train"]) == (5344, 2672)


def test_scale_measures_the_bytes_a_process_writes(tmp_path):
    """The wrapper reads /proc/PID/io of the process it runs, after it exits."""
    if not Path("/proc/self/io").is_file():
        pytest.skip("no /proc/PID/io")
    import json
    import subprocess
    import sys

    scale = load_script("benchmarks/scale")
    target = tmp_path / "out.bin"
    writer = f"open({str(target)!r}, 'wb').write(b'x' * 3_000_000)"
    done = subprocess.run(
        [sys.executable, "-c", scale._MEASURE, sys.executable, "-c", writer],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    measured = json.loads(done.stdout.splitlines()[-1])
    assert measured["returncode"] == 0 and measured["maxrss_kib"] > 0
    assert 3_000_000 <= measured["wchar"] < 3_100_000


def _scale_run(scale, method, clients, participation, wall, eval_, tiny=False, state=1e6, **extra):
    replicas = clients // 3
    trained = max(1, round(participation * clients)) if participation < 1 else clients
    times = {"train": wall - eval_ - 1, "aggregate": 0.5, "eval": eval_, **extra}
    return {
        "method": method, "replicas": replicas, "tiny": tiny, "clients": clients,
        "images_per_client": 2 if tiny else 8016 / clients, "batch": 2 if tiny else 8,
        "participation": participation, "store": "disk", "rss_bytes": 2e9, "rss_gib": 2e9 / 2**30,
        "wall": wall, "round": wall - eval_, "eval_per_client": eval_ / clients, "ms_per_sample": 5.0,
        "times": times, "state_bytes": state * clients, "trained": trained,
        "trained_state_bytes": state * trained, "wchar": 2 * state * trained, "write_bytes": None,
    }  # fmt: skip


def test_scale_reports_each_target_as_a_ratio():
    """The targets are lines of the results file with their ratios, met or not (never asserted
    on a real run); the phase times are whichever ``time/*`` the runs logged, in a fixed order."""
    scale = load_script("benchmarks/scale")
    results = [
        _scale_run(scale, "FedAvg", 12, 1.0, 60, 1.2),
        _scale_run(scale, "FedAvg", 1002, 1.0, 200, 100.2, read_states=3.0),
        _scale_run(scale, "FedAvg", 1002, 0.1, 130, 100.2),
        _scale_run(scale, "FedAvg", 102, 1.0, 30, 10.2, tiny=True),
        _scale_run(scale, "FedAvg", 10002, 0.01, 1040.2, 1000.2, tiny=True),
    ]
    body = scale.table(results, write=100e6, read=1000e6)
    head = next(line for line in body.splitlines() if line.startswith("| method |"))
    assert "| train / aggregate / eval / read_states (s) |" in head
    rows = [line for line in body.splitlines() if line.startswith("| FedAvg |")]
    assert rows[0].endswith("| 57.8 / 0.5 / 1.2 / – | 22.9 / n/a MiB | 2.00, not met |")
    assert rows[1].endswith("| 98.8 / 0.5 / 100.2 / 3.0 | 1911.2 / n/a MiB | 2.00, not met |")
    targets = [line for line in body.splitlines() if line.startswith("- ")]
    io = 1002e6 / 100e6 + 1002e6 / 1000e6  # the 1,002 states written and read once: 11 s
    assert targets[0].startswith(
        "- FedAvg, 1002 clients (8 images each, batch 8), participation 1, store disk:"
    )
    assert targets[0].endswith(f"= 87 s: {99.8 / (1.3 * 58.8 + io):.2f}, not met")
    assert targets[1].endswith(f": {0.1 / 0.13:.2f}, met")  # eval per client: 0.1 s against 1.3 × 0.1 s
    assert targets[2].endswith("peak RSS 2.00 GB ≤ 4 GB: 0.50, met")
    assert targets[3].endswith(f"≤ 0.25 × participation 1's 100 s = 25 s: {29.8 / 24.95:.2f}, not met")
    assert "- FedAvg, 10002 clients (2 images each, batch 2), participation 0.01" in targets[4]
    assert targets[4].endswith("peak RSS 2.00 GB ≤ 4 GB: 0.50, met")
    assert targets[5].endswith(f"≤ 1.5 × 102 clients' 20 s = 30 s: {40 / 29.7:.2f}, not met")
    assert targets[6].endswith(f": {(1000.2 / 10002) / (1.3 * 10.2 / 102):.2f}, met")
    assert targets[7].startswith("- every run: bytes written per round ≤ 1.1 × ") and targets[7].endswith(
        "met by 0 of 5 runs; the highest, 2.00 × (FedAvg, 12 clients (668 images each, batch 8), "
        "participation 1, store disk): 1.82, not met"
    )
    assert len(targets) == 8


def test_scale_counts_a_clients_state_files_and_the_row_holding_its_encoder(tmp_path):
    """A client's state: client_N.pt, client_N.optim.pt and, where its encoder was left in its
    trained row, rows_rNNNN_client_N.trained.f32; a pending receipt's other rows are not state."""
    scale = load_script("benchmarks/scale")
    folder = tmp_path / "checkpoints" / "round_0002"
    folder.mkdir(parents=True)
    for name, size in [
        ("client_0000.pt", 10),
        ("client_0000.optim.pt", 20),
        ("rows_r0001_client_0000.trained.f32", 40),
        ("rows_r0002_client_0001.delta.f32", 80),
        ("client_0001.pt", 5),
        ("SHA256SUMS", 7),
    ]:
        (folder / name).write_bytes(b"x" * size)
    assert scale.client_state_bytes(tmp_path / "checkpoints") == {"client_0000": 70, "client_0001": 5}


@pytest.mark.parametrize("out", ["scale", "demo_vs_main/x", "", "../demo_vs_main"])
def test_demo_vs_main_refuses_an_out_name_that_could_replace_another_results_file(out, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("benchmarks/demo_vs_main").main(
            ["--baseline", str(tmp_path), "--tmp", str(tmp_path), "--out", out]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        f"error: --out must be demo_vs_main or start with it (letters, digits, - or _), got {out!r}"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written
