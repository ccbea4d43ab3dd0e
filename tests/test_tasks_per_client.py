"""``clients[].tasks_per_client``: every client of a multi-task group learns k of its tasks,
drawn from the run's seed, so one group of many replicas is a federation of overlapping task
sets; through the engine such a federation trains like any other."""

from __future__ import annotations

from fedmtl.config import ClientGroup, DataConfig, RunConfig
from fedmtl.federated.scenario import build_clients, drawn_tasks
from tests.helpers import fit, tiny_config

NYUD_TASKS = ["semseg", "normals", "edge", "depth"]


def _clients(data_root, seed: int = 0, k: int | None = 2, replicas: int = 6) -> list:
    group = ClientGroup(dataset="nyud", tasks=NYUD_TASKS, replicas=replicas, tasks_per_client=k, batch_size=2)
    cfg = RunConfig(clients=[group], data=DataConfig(root=str(data_root)), seed=seed)
    return build_clients(cfg)


def test_each_client_learns_k_of_the_tasks_in_their_order(data_root):
    clients = _clients(data_root)
    for client in clients:
        assert len(client.tasks) == 2
        assert list(client.tasks) == [t for t in NYUD_TASKS if t in client.tasks]
    assert len({c.tasks for c in clients}) > 1, "six clients all drew the same pair"
    assert len({c.name for c in clients}) == len(clients)
    assert sorted(i for c in clients for i in c.train_indices) == list(range(12))  # the split is shared out


def test_the_draw_follows_the_seed(data_root):
    first, again, other = (_clients(data_root, seed) for seed in (0, 0, 1))
    assert [c.tasks for c in first] == [c.tasks for c in again]
    assert [c.tasks for c in first] != [c.tasks for c in other]


def test_all_the_tasks_or_none_set_give_the_multi_task_clients_of_before(data_root):
    every = _clients(data_root, k=len(NYUD_TASKS))
    unset = _clients(data_root, k=None)
    assert [c.tasks for c in every] == [c.tasks for c in unset] == [tuple(NYUD_TASKS)] * 6
    assert [c.train_indices for c in every] == [c.train_indices for c in unset]


def test_a_clients_draw_depends_only_on_the_seed_its_group_and_its_replica():
    tasks = tuple(NYUD_TASKS)
    assert drawn_tasks(tasks, 2, 0, 1, 3) == drawn_tasks(tasks, 2, 0, 1, 3)
    draws = {drawn_tasks(tasks, 2, 0, 0, r) for r in range(40)}
    assert len(draws) == 6  # every pair of four tasks turns up over 40 replicas


def test_a_federation_of_overlapping_task_sets_trains(tmp_path, data_root):
    group = {"dataset": "nyud", "tasks": NYUD_TASKS, "replicas": 4, "tasks_per_client": 2, "batch_size": 2}
    config = tiny_config(tmp_path, data_root, clients=[group], rounds=2, algorithm={"class_path": "FedHCA2"})
    results = fit(config, tmp_path / "run")
    clients = _clients(data_root, replicas=4)
    assert sorted(results["clients"]) == sorted(c.name for c in clients)
    for client in clients:
        assert sorted(results["clients"][client.name]["metrics"]) == sorted(client.tasks)
