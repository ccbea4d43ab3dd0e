"""``data.partition`` through the command line and the engine: a skewed split of the tiny
scenario trains, records its partition in config.yaml and each client's ``train_images`` and
``class_histogram`` in results.json, a client left without a batch is one ``error:`` line, an
old config.yaml without the field still resumes and validates, and ``fedmtl report
--partition`` draws the histograms."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from fedmtl.config import ClientGroup, DataConfig, RunConfig
from fedmtl.data.datasets import build_dataset
from fedmtl.data.dominant import class_histogram, dominant_classes
from fedmtl.data.partition import Dirichlet
from fedmtl.federated.scenario import build_clients
from tests.helpers import TINY, fit, fit_in_processes, fit_refused, refused_keeping, tiny_config


def _data(data_root, partition: dict) -> dict:
    return {**TINY["data"], "root": str(data_root), "partition": partition}


@pytest.fixture(scope="module")
def skewed_run(module_dir, data_root):
    """The NYUD-v2 client of the tiny scenario, split by --data.partition Dirichlet (one client:
    the whole split, whatever the draw)."""
    # normals and depth: a report's Δm needs baseline metrics that are not 0 (a tiny semseg's can be)
    client = {"dataset": "nyud", "tasks": ["normals", "depth"], "batch_size": 2}
    config = tiny_config(module_dir, data_root, rounds=1, clients=[client])
    run_dir = module_dir / "dirichlet"
    return run_dir, fit(config, run_dir, "--data.partition", "Dirichlet", "--data.partition.alpha", "0.5")


def test_the_partition_is_recorded_in_config_yaml(skewed_run):
    run_dir, _ = skewed_run
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["partition"]
    assert saved["class_path"].endswith("Dirichlet") and saved["init_args"] == {"alpha": 0.5}


def test_results_json_records_each_clients_images_and_dominant_classes(skewed_run, data_root):
    _, results = skewed_run
    ((name, entry),) = results["clients"].items()  # one NYUD client: the whole split
    assert entry["train_images"] == 12
    assert sum(entry["class_histogram"].values()) == entry["train_images"]
    assert entry["class_histogram"] == class_histogram("nyud", dominant_classes("nyud", data_root))


def test_results_json_counts_the_images_a_human_parts_client_trains_on(tmp_path, data_root):
    clients = [{"dataset": "pascal_context", "tasks": ["human_parts"], "batch_size": 2}]  # all 12 images
    results = fit(tiny_config(tmp_path, data_root, rounds=1, clients=clients), tmp_path / "run")
    parts = results["clients"]["pascal_context-human_parts"]
    with_people = len(build_dataset("pascal_context", data_root, "train", tasks=("human_parts",)))
    assert with_people < 12, "the test needs a split with an image without a person"
    assert parts["train_images"] == with_people
    assert sum(parts["class_histogram"].values()) == with_people


def _clients(data_root, partition, replicas=3, tasks=("semseg",), seed=0):
    group = ClientGroup(dataset="nyud", tasks=list(tasks), replicas=replicas, batch_size=1)
    return build_clients(
        RunConfig(clients=[group], data=DataConfig(root=str(data_root), partition=partition), seed=seed)
    )


def test_a_skewed_partition_follows_the_seed_and_shares_out_the_split(data_root):
    first, again, other = (_clients(data_root, Dirichlet(0.3), seed=s) for s in (0, 0, 1))
    assert [c.train_indices for c in first] == [c.train_indices for c in again]
    assert [c.train_indices for c in first] != [c.train_indices for c in other]
    assert sorted(i for c in first for i in c.train_indices) == list(range(12))


def test_a_client_without_a_batch_is_one_error_line_naming_it_and_the_fix(tmp_path, data_root, capsys):
    # sizes in proportion 1 : 1/8 of 12 images: 11 and 1, below a batch of 6 in every draw
    partition = {"class_path": "Quantity", "init_args": {"distribution": "power_law", "exponent": 3.0}}
    clients = [
        {"dataset": "pascal_context", "tasks": ["semseg", "sal"], "single_task": True, "batch_size": 6}
    ]
    config = tiny_config(tmp_path, data_root, clients=clients, data=_data(data_root, partition))
    (line,) = fit_refused(config, tmp_path / "run", capsys)
    assert re.fullmatch(
        r"error: client pascal_context-(semseg|sal) has 1 training images, fewer than its batch size 6 in each "
        r"of 10 draws of data.partition Quantity: it would never take a step .*; lower data.partition.exponent, "
        r"use fewer clients \(replicas\) or lower clients\[\].batch_size",
        line,
    ), line


def test_a_human_parts_client_counts_only_the_images_it_trains_on(tmp_path, data_root, capsys):
    people = len(build_dataset("pascal_context", data_root, "train", tasks=("human_parts",)))
    clients = [{"dataset": "pascal_context", "tasks": ["human_parts"], "batch_size": people + 1}]
    (line,) = fit_refused(tiny_config(tmp_path, data_root, clients=clients), tmp_path / "run", capsys)
    assert line.startswith(
        f"error: client pascal_context-human_parts has {people} training images (of its 12, the ones its tasks "
        f"have labels for), fewer than its batch size {people + 1}:"
    ), line


def test_an_unknown_partition_is_one_line_listing_the_known_ones(tmp_path, data_root, capsys):
    (line,) = fit_refused(
        tiny_config(tmp_path, data_root), tmp_path / "run", capsys, "--data.partition", "Iid"
    )
    assert "no partition named 'Iid'; known partitions: Dirichlet, Quantity, Shards, Uniform" in line


def test_an_old_config_without_a_partition_still_resumes_and_validates(
    skewed_run, tmp_path, data_root, capsys
):
    from fedmtl.cli import main

    config = tiny_config(tmp_path, data_root, rounds=1)
    run_dir = tmp_path / "old"
    fit(config, run_dir)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    del saved["data"]["partition"]  # as fedmtl wrote it before data.partition existed
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["fit", "--config", str(config), "--run_dir", str(run_dir), "--resume", "true"]) == 0
    assert main(["validate", "--run_dir", str(run_dir)]) == 0
    validated = json.loads((run_dir / "validate_results.json").read_text())
    assert all("class_histogram" in entry for entry in validated["clients"].values())


def test_report_draws_the_partition(skewed_run, tmp_path, capsys):
    from fedmtl.cli import main

    run_dir, _ = skewed_run
    figure = tmp_path / "partition.png"
    assert main(["report", str(run_dir), "--baseline", str(run_dir), "--partition", str(figure)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"partition: {figure}"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for refused, why in ((figure, "exists"), (tmp_path / "partition.pdf", "must end in .png or .svg")):
        lines = refused_keeping(["report", str(run_dir), "--partition", str(refused)], tmp_path, capsys)
        assert why in lines[-1], lines


def test_a_skewed_federation_is_the_same_on_one_and_two_devices(tmp_path, data_root):
    """The draw is made for every client from the run's seed in each process: two processes
    split, train and record exactly as one does."""
    client = {"dataset": "nyud", "tasks": ["normals", "depth"], "replicas": 3, "batch_size": 2}
    config = tiny_config(
        tmp_path, data_root, rounds=1, clients=[client], data=_data(data_root, {"class_path": "Dirichlet"})
    )
    one = fit(config, tmp_path / "one")
    two = fit_in_processes(config, tmp_path / "two")
    assert one == two
    sizes = [entry["train_images"] for entry in one["clients"].values()]
    assert sum(sizes) == 12 and len(set(sizes)) > 1  # skewed, every image once
