"""Issue #10: never lose a run, never spread a NaN, one clear line for every bad input.

Each refusal is checked the way a user meets it: through ``fedmtl.cli.main``, one ``error:``
line, a non-zero exit, and every file of the run (or dataset) byte for byte unchanged.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from fedmtl.cli import main
from fedmtl.federated import checkpoint, rundir
from fedmtl.federated.engine import progress_line
from tests.helpers import (
    TINY,
    TINY_STEM,
    client_states,
    file_hashes,
    fit,
    fit_killed_in_round,
    read_results,
    refused_keeping,
    tiny_config,
)


def _fit_args(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


def _diverging(tmp_path: Path, data_root: Path, name: str = "diverging.yaml", **changes) -> Path:
    """The tiny scenario whose NYUD client (client 2) trains at lr 1e6: NaN in its first step."""
    clients = json.loads(json.dumps(TINY["clients"]))
    clients[1]["optimizer"] = {"lr": 1.0e6, "warmup_epochs": 0}
    return tiny_config(tmp_path, data_root, name=name, clients=clients, **changes)


@pytest.fixture(scope="module")
def finished(module_dir, data_root) -> tuple[Path, Path]:
    """A finished 2-round run (config, run_dir); tests copy it before touching it."""
    tmp = module_dir
    config = tiny_config(tmp, data_root, rounds=2)
    fit(config, tmp / "run")
    return config, tmp / "run"


def _copy(finished: tuple[Path, Path], tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished[1], run_dir)
    return run_dir


# ---------------------------------------------------------------------------- data loss


def test_a_fresh_fit_into_a_finished_run_is_refused_and_names_resume_and_overwrite(
    finished, tmp_path, capsys
):
    run_dir = _copy(finished, tmp_path)
    (line,) = refused_keeping(_fit_args(finished[0], run_dir), run_dir, capsys)
    assert str(run_dir) in line and "--resume true" in line and "--overwrite true" in line


def test_overwrite_replaces_the_run_and_leaves_other_files_alone(finished, tmp_path, data_root):
    run_dir = _copy(finished, tmp_path)
    (run_dir / "notes.txt").write_text("mine")
    old_metrics = (run_dir / "metrics.csv").read_text()
    fit(tiny_config(tmp_path, data_root, rounds=1), run_dir, "--overwrite", "true")
    assert read_results(run_dir)["rounds"] == 1
    assert (run_dir / "metrics.csv").read_text() != old_metrics
    assert [p.name for p in checkpoint.round_folders(run_dir)] == ["round_0001"]
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_resuming_a_finished_run_trains_nothing_and_changes_no_file(finished, tmp_path, capsys):
    """`make demo` twice: the second call reprints the results."""
    run_dir = _copy(finished, tmp_path)
    before = file_hashes(run_dir)
    capsys.readouterr()
    assert main(_fit_args(finished[0], run_dir, "--resume", "true")) == 0
    out = capsys.readouterr()
    assert "finished its 2 rounds" in out.err and "round 1/2" not in out.err
    assert "pascal_context-sal" in out.out
    assert file_hashes(run_dir) == before


def test_a_resume_that_changes_what_the_run_computes_is_refused_listing_the_fields(
    finished, tmp_path, capsys
):
    run_dir = _copy(finished, tmp_path)
    args = _fit_args(finished[0], run_dir, "--resume", "true", "--rounds", "3", "--seed", "1")
    (line,) = refused_keeping(args, run_dir, capsys)
    assert "rounds: 2 -> 3" in line and "seed: 0 -> 1" in line and "--run_dir" in line


def test_a_resume_with_a_client_group_fewer_is_refused(finished, tmp_path, data_root, capsys):
    run_dir = _copy(finished, tmp_path)
    fewer = tiny_config(tmp_path, data_root, name="fewer.yaml", rounds=2, clients=TINY["clients"][:1])
    (line,) = refused_keeping(_fit_args(fewer, run_dir, "--resume", "true"), run_dir, capsys)
    assert "clients[1]: {'dataset': 'nyud'" in line and "} -> (absent)" in line


def test_a_resume_may_change_how_the_run_is_executed_and_keeps_its_config(tmp_path, data_root, monkeypatch):
    config = tiny_config(tmp_path, data_root, rounds=2)
    fit_killed_in_round(config, tmp_path / "run", monkeypatch, round_=2)
    saved = (tmp_path / "run" / "config.yaml").read_text()
    fit(config, tmp_path / "run", "--resume", "true", "--evaluation.every", "1", "--store", "disk")
    assert (tmp_path / "run" / "config.yaml").read_text() == saved
    assert read_results(tmp_path / "run")["rounds"] == 2


def test_a_broken_latest_pointer_resumes_from_the_newest_complete_checkpoint(
    tmp_path, data_root, monkeypatch, capsys
):
    config = tiny_config(tmp_path, data_root, rounds=2)
    reference = fit(config, tmp_path / "reference")
    run_dir = tmp_path / "run"
    fit_killed_in_round(config, run_dir, monkeypatch, round_=2)
    (run_dir / "checkpoints" / "latest").write_bytes(b"\x00garbage\xff")
    capsys.readouterr()
    resumed = fit(config, run_dir, "--resume", "true")
    err = capsys.readouterr().err
    assert "resuming from round_0001, the newest complete checkpoint" in err
    assert "starting from round 1" not in err
    assert resumed["clients"] == reference["clients"]


@pytest.mark.parametrize("damage", ["pointer to a missing folder", "no server file"])
def test_without_a_complete_checkpoint_resume_refuses_and_deletes_nothing(finished, tmp_path, capsys, damage):
    run_dir = _copy(finished, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "round_0001")  # the one a damaged round_0002 falls back to
    if damage == "pointer to a missing folder":
        (run_dir / "checkpoints" / "latest").write_text("round_0009")
        (run_dir / "checkpoints" / "round_0002" / "server.pt").rename(run_dir / "checkpoints" / "server.bak")
    else:
        (run_dir / "checkpoints" / "round_0002" / "server.pt").unlink()
    (line,) = refused_keeping(_fit_args(finished[0], run_dir, "--resume", "true"), run_dir, capsys)
    assert "no complete checkpoint" in line and "--run_dir" in line


def test_a_corrupt_client_checkpoint_is_named_on_resume_and_validate(finished, tmp_path, capsys):
    run_dir = _copy(finished, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "round_0001")  # no fallback (tests/test_integrity.py has it)
    path = run_dir / "checkpoints" / "round_0002" / "client_0001.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for command in (
        ["validate", "--run_dir", str(run_dir)],
        _fit_args(finished[0], run_dir, "--resume", "true"),
    ):
        lines = refused_keeping(command, run_dir, capsys)
        assert any(str(path) in line and line.startswith("error:") for line in lines)


def test_a_refused_fit_does_not_touch_an_existing_config(finished, tmp_path, capsys):
    """A failed fit used to rewrite config.yaml first, and `validate` then broke."""
    run_dir = _copy(finished, tmp_path)
    refused_keeping(
        _fit_args(finished[0], run_dir, "--resume", "true", "--data.root", str(tmp_path)), run_dir, capsys
    )
    assert main(["validate", "--run_dir", str(run_dir)]) == 0


def test_data_synth_over_an_existing_dataset_is_refused(data_root, capsys):
    folder = data_root / "NYUDv2"
    (line,) = refused_keeping(["data", "synth", "--dataset", "nyud", "--root", str(folder)], folder, capsys)
    assert str(folder) in line and "--overwrite true" in line


# ---------------------------------------------------------------------------- numerical faults


@pytest.mark.parametrize("algorithm", ["Local", "FedAvg", "FedHCA2", "Ditto"])
def test_a_diverging_client_is_dropped_named_and_counted(tmp_path, data_root, capsys, algorithm):
    config = _diverging(tmp_path, data_root, rounds=2, algorithm={"class_path": algorithm})
    capsys.readouterr()
    results = fit(config, tmp_path / "run")
    err = capsys.readouterr().err
    for round_ in (1, 2):
        assert f"warning: round {round_}: dropped the non-finite update (NaN/inf) of nyud-semseg+depth" in err
    rows = [line.split(",") for line in (tmp_path / "run" / "metrics.csv").read_text().splitlines()]
    assert [float(v) for _, k, v in rows if k == "server/dropped_updates"] == [1.0, 1.0]
    # The dropped client keeps the state it started with: it never finished a local epoch.
    dropped = client_states(tmp_path / "run")[2]
    assert dropped["epochs_done"] == 0 and dropped["optimizer"] is None
    assert all(torch.isfinite(t).all() for t in dropped["model"].values() if t.is_floating_point())
    # Nothing non-finite reached the other clients or the results.
    for state in client_states(tmp_path / "run")[:2]:
        assert state["epochs_done"] == 2
        assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    values = [m for c in results["clients"].values() for t in c["metrics"].values() for m in t.values()]
    assert all(v is not None and math.isfinite(v) for v in values) and "nonfinite" not in results


def test_a_dropped_client_does_not_enter_the_average(tmp_path, data_root):
    """FedAvg with a diverging client equals FedAvg in which that client sat the rounds out."""
    config = _diverging(tmp_path, data_root, rounds=1, algorithm={"class_path": "FedAvg"})
    fit(config, tmp_path / "dropped")
    dropped = client_states(tmp_path / "dropped")
    key = TINY_STEM
    assert torch.equal(dropped[0]["model"][key], dropped[1]["model"][key])
    # The two PASCAL clients' common encoder is the mean of their own trained encoders.
    local = tiny_config(tmp_path, data_root, name="local.yaml", rounds=1)
    fit(local, tmp_path / "local")
    trained = client_states(tmp_path / "local")
    torch.testing.assert_close(
        dropped[0]["model"][key], (trained[0]["model"][key] + trained[1]["model"][key]) / 2
    )


def test_two_processes_drop_the_same_client_as_one(tmp_path, data_root):
    """The masks travel between ranks with the losses: the diverging client trains on one rank
    and the PASCAL clients on the other, both ranks drop it (else the all-gathered average
    would differ between them), the warning is printed once, and the results equal a
    one-process run's."""
    import subprocess
    import sys

    config = _diverging(tmp_path, data_root, rounds=1, algorithm={"class_path": "FedAvg"})
    one = fit(config, tmp_path / "one")
    command = [sys.executable, "-m", "fedmtl", *_fit_args(config, tmp_path / "two", "--devices", "2")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("dropped the non-finite update (NaN/inf) of nyud-semseg+depth") == 1
    assert read_results(tmp_path / "two") == one


def test_nonfinite_stop_ends_the_run_with_one_line_naming_the_client(tmp_path, data_root, capsys):
    config = _diverging(tmp_path, data_root, rounds=2, algorithm={"class_path": "FedAvg"})
    capsys.readouterr()
    assert main(_fit_args(config, tmp_path / "run", "--nonfinite", "stop")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "round 1" in errors[0] and "nyud-semseg+depth (encoder, decoders, heads)" in errors[0]
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_server_step_that_creates_nan_stops_the_run_naming_the_rows(
    tmp_path, data_root, capsys, monkeypatch
):
    from fedmtl.methods import FedAvg

    step = FedAvg.server_step

    def broken(self, inputs, encoders):
        out = step(self, inputs, encoders)
        out.encoders.vectors[0, 0] = math.nan  # the shared mean every client takes
        return out

    monkeypatch.setattr(FedAvg, "server_step", broken)
    config = tiny_config(tmp_path, data_root, rounds=1, algorithm={"class_path": "FedAvg"})
    capsys.readouterr()
    assert main(_fit_args(config, tmp_path / "run")) == 1
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    clients = "pascal_context-semseg, pascal_context-sal, nyud-semseg+depth"  # every client takes the mean
    assert f"FedAvg's server step returned non-finite encoder parameters for {clients}" in error


def test_a_non_finite_evaluated_model_has_null_metrics_and_is_named_in_results(tmp_path, data_root, capsys):
    """FedBABU's fine-tuning at an absurd rate diverges after the last round: the fine-tuned
    models are NaN; their metrics are null (not numbers from NaN logits) and results.json says so."""
    config = tiny_config(
        tmp_path, data_root, rounds=1, algorithm={"class_path": "FedBABU", "init_args": {"ft_lr": 1e12}}
    )
    results = fit(config, tmp_path / "run")
    assert results["nonfinite"] == {"fine-tuned": list(results["clients"])}
    assert all(
        m is None for c in results["clients"].values() for t in c["metrics"].values() for m in t.values()
    )
    federated = results["also_evaluated"]["federated"]
    assert all(
        math.isfinite(m) for c in federated.values() for t in c["metrics"].values() for m in t.values()
    )
    assert "is not finite (NaN/inf): no metrics" in capsys.readouterr().out


def test_nan_predictions_give_a_nan_metric_not_a_number(data_root):
    """argmax over NaN logits is class 0, a plausible label map: the metric must say NaN."""
    from torch.utils.data import DataLoader

    from fedmtl.config import ModelConfig
    from fedmtl.data.datasets import build_dataset
    from fedmtl.federated.client import ClientModule, ClientSpec

    spec = ClientSpec("c", "nyud", ("semseg", "depth"), local_epochs=1, batch_size=4, train_indices=(0,))
    module = ClientModule(spec, ModelConfig(), total_epochs=1, img_size=(32, 32)).eval()
    data = build_dataset("nyud", data_root, "val", tasks=spec.tasks, train_size=(32, 32))
    batch = next(iter(DataLoader(data, batch_size=4)))
    batch.pop("meta")
    with torch.no_grad():
        module.validation_step(batch)
        finite = module.compute_metrics()
        for param in module.model.heads["semseg"].parameters():
            param.fill_(math.nan)
        module.validation_step(batch)
        broken = module.compute_metrics()
    assert all(math.isfinite(v) for v in finite.values())
    assert math.isnan(broken["semseg"]) and math.isfinite(broken["depth"])


# ---------------------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--accelerator", "gpu"], "no CUDA GPU"),
        (["--devices", str((os.cpu_count() or 1) + 1)], "cores"),
        (["--num_nodes", "2"], "launcher"),
    ],
)
def test_an_impossible_machine_setting_is_refused_before_anything_runs(
    tmp_path, data_root, capsys, extra, expected
):
    if extra[0] == "--accelerator" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    config = tiny_config(tmp_path, data_root, rounds=1)
    (line,) = refused_keeping(_fit_args(config, tmp_path / "run", *extra), tmp_path / "run", capsys)
    assert expected in line and not (tmp_path / "run").exists()


def test_an_unwritable_run_dir_is_refused(tmp_path, data_root, capsys, monkeypatch):
    # Tests may run as root, for whom permissions do not apply: the check asks os.access.
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path / "ro" else real(p, mode))
    (tmp_path / "ro").mkdir()
    config = tiny_config(tmp_path, data_root, rounds=1)
    (line,) = refused_keeping(_fit_args(config, tmp_path / "ro" / "run"), tmp_path / "ro", capsys)
    assert "permission denied" in line and "--run_dir" in line


def test_wandb_online_without_an_account_logs_offline_with_one_warning(
    tmp_path, data_root, capsys, monkeypatch
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    config = tiny_config(tmp_path, data_root, rounds=1, logger={"wandb": True, "mode": "online"})
    capsys.readouterr()
    fit(config, tmp_path / "run")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "wandb" in line]
    assert len(warnings) == 1 and "logging offline" in warnings[0]
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    assert [p.name.endswith(run_id) for p in (tmp_path / "run" / "wandb").glob("offline-run-*")] == [True]


def test_every_resume_logs_to_the_same_wandb_run(tmp_path, data_root, monkeypatch):
    config = tiny_config(tmp_path, data_root, rounds=2, logger={"wandb": True, "mode": "offline"})
    fit_killed_in_round(config, tmp_path / "run", monkeypatch, round_=2)
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    fit(config, tmp_path / "run", "--resume", "true")
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    # offline-run-DATE_TIME-ID, and "-1" after it when both started in the same second
    assert len(runs) == 2 and all(p.name.split("-")[3] == run_id for p in runs)


# ---------------------------------------------------------------------------- data


def test_a_corrupt_image_is_named_before_the_run_starts(tmp_path, data_root, capsys):
    data = tmp_path / "data"
    shutil.copytree(data_root, data)
    first_val = (data / "NYUDv2" / "gt_sets" / "val.txt").read_text().split()[0]
    image = data / "NYUDv2" / "images" / f"{first_val}.png"
    assert image.is_file()
    image.write_bytes(b"not a png")
    config = tiny_config(tmp_path, data)
    (line,) = refused_keeping(_fit_args(config, tmp_path / "run"), tmp_path, capsys)
    assert str(image) in line and "cannot be read" in line
    assert f"check it with: fedmtl data check --root {data}" in line


def test_too_few_training_images_for_the_clients_is_refused(tmp_path, data_root, capsys):
    clients = [{"dataset": "nyud", "tasks": ["semseg"], "replicas": 13}]
    config = tiny_config(tmp_path, data_root, clients=clients)
    (line,) = refused_keeping(_fit_args(config, tmp_path / "run"), tmp_path / "run", capsys)
    assert "nyud has 12 training images for 13 clients" in line


# ---------------------------------------------------------------------------- logs


def test_the_round_line_carries_losses_metrics_and_timings():
    values = {
        "train/a/loss": 1.23456,
        "train/a/semseg_loss": 1.23456,
        "val/a/semseg_mIoU": 42.0,
        "server/dropped_updates": 1.0,
        "time/train": 2.5,
    }
    line = progress_line(3, 10, values)
    assert (
        line == "round 3/10 | loss: a 1.235 | val: a/semseg_mIoU 42 | dropped updates: 1 | time: train 2.5s"
    )


def test_the_round_line_summarises_replicas_above_eight_clients():
    """At 1000 clients a line per client would be unreadable: each group of replicas (names
    that differ only in the replica number) is one entry, ×n mean [min, max]."""
    values = {f"train/pascal_context-semseg-{i}/loss": 1.0 + i for i in range(6)}
    values |= {f"train/nyud-semseg+depth-{i}/loss": 10.0 * (i + 1) for i in range(3)}
    values |= {f"val/nyud-semseg+depth-{i}/depth_RMSE": 0.5 + i for i in range(3)}
    values["time/train"] = 4.0
    line = progress_line(1, 2, values)
    assert line == (
        "round 1/2 | loss: pascal_context-semseg ×6 3.5 [1, 6], nyud-semseg+depth ×3 20 [10, 30] | "
        "val: nyud-semseg+depth/depth_RMSE ×3 1.5 [0.5, 2.5] | time: train 4.0s"
    )
    few = {k: v for k, v in values.items() if "-semseg-" not in k}  # 3 clients: each named
    assert "nyud-semseg+depth-2 30" in progress_line(1, 2, few)
    sampled = progress_line(1, 2, {**values, "server/participants": 4.0})
    assert sampled.startswith("round 1/2 | participants 4 | loss: ")


def test_config_changes_ignore_where_the_run_executes():
    saved = {"rounds": 2, "devices": 1, "evaluation": {"every": 4}, "clients": [{"dataset": "nyud"}]}
    now = {"rounds": 2, "devices": 2, "evaluation": {"every": 1}, "clients": [{"dataset": "nyud"}]}
    assert rundir.config_changes(saved, now) == []
    assert rundir.config_changes({**saved, "aggregation": "auto"}, {**now, "aggregation": "streamed"}) == []
    now["clients"] = [{"dataset": "pascal_context"}]
    assert rundir.config_changes(saved, now) == ["clients[0].dataset: 'nyud' -> 'pascal_context'"]


# ---------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--rounds", "abc"], "Parser key \"rounds\": Expected a <class 'int'>. Got value: abc"),
        (["--algorithm", "Nope"], "no method named 'Nope'; known methods: CAGrad, Ditto, FedAMP"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--nonfinite", "maybe"], 'Parser key "nonfinite": Expected a typing.Literal'),
        (["--overwrite", "sure"], "Parser key \"overwrite\": Expected a <class 'bool'>"),
        (["--model.pretrained_strict", "2"], 'Parser key "model.pretrained_strict": Expected a <class'),
        (["--model.channels_last", "3"], "Parser key \"model.channels_last\": Expected a <class 'bool'>"),
    ],
)
def test_a_parser_error_is_one_line_without_a_usage_dump(tmp_path, data_root, capsys, extra, expected):
    config = tiny_config(tmp_path, data_root)
    (line,) = refused_keeping(_fit_args(config, tmp_path / "run", *extra), tmp_path, capsys)
    assert line.startswith("error: ") and expected in line and "fedmtl fit --help" in line


def test_a_config_file_with_a_yaml_error_is_named_with_its_line(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text("clients: [{dataset: nyud\nrounds: 2\n")
    (line,) = refused_keeping(_fit_args(config, tmp_path / "run"), tmp_path, capsys)
    assert f"config file {config}: YAML syntax error at line 2" in line
