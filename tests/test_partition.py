"""Random equal partitions of a training set among clients."""

from __future__ import annotations

import pytest

from fedmtl.data.partition import partition_clients, partition_indices


@pytest.mark.parametrize(("num_samples", "num_parts"), [(795, 4), (4998, 5), (10, 10), (7, 1), (4998, 20)])
def test_parts_are_disjoint_balanced_and_cover_everything(num_samples, num_parts):
    parts = partition_indices(num_samples, num_parts, seed=0)
    assert len(parts) == num_parts
    flat = [i for part in parts for i in part]
    assert sorted(flat) == list(range(num_samples))  # disjoint, nothing dropped (as np.array_split)
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the first parts
    assert all(part == sorted(part) for part in parts)


def test_partition_is_random_and_deterministic():
    assert partition_indices(100, 4, seed=1) == partition_indices(100, 4, seed=1)
    assert partition_indices(100, 4, seed=1) != partition_indices(100, 4, seed=2)
    first = partition_indices(100, 4, seed=1)[0]
    assert first != list(range(25))  # shuffled, not consecutive blocks


def test_partition_rejects_impossible_splits():
    with pytest.raises(ValueError, match="at least 1"):
        partition_indices(10, 0, seed=0)
    with pytest.raises(ValueError, match="non-empty"):
        partition_indices(3, 4, seed=0)


def test_clients_of_a_dataset_split_it():
    datasets = ["pascal_context"] * 5 + ["nyud"]
    parts = partition_clients(datasets, {"pascal_context": 4998, "nyud": 795}, seed=0)
    assert len(parts) == 6
    assert parts[5] == list(range(795))  # the only NYUD client keeps the whole set
    pascal = [i for part in parts[:5] for i in part]
    assert sorted(pascal) == list(range(4998))
    assert {len(part) for part in parts[:5]} == {999, 1000}


def test_clients_interleaved_across_datasets():
    datasets = ["nyud", "pascal_context", "nyud", "pascal_context", "nyud"]
    parts = partition_clients(datasets, {"pascal_context": 10, "nyud": 9}, seed=3)
    assert sorted(parts[0] + parts[2] + parts[4]) == list(range(9))
    assert [len(parts[i]) for i in (0, 2, 4)] == [3, 3, 3]
    assert sorted(parts[1] + parts[3]) == list(range(10))


def test_client_partition_is_deterministic_and_independent_of_other_datasets():
    sizes = {"pascal_context": 50, "nyud": 30}
    alone = partition_clients(["nyud", "nyud"], sizes, seed=7)
    mixed = partition_clients(["pascal_context", "nyud", "pascal_context", "nyud"], sizes, seed=7)
    assert alone == [mixed[1], mixed[3]]
    assert partition_clients(["nyud", "nyud"], sizes, seed=8) != alone


def test_groups_split_a_dataset_separately():
    # the public code: the ST clients and the MT clients of a dataset each split all of it
    parts = partition_clients(["nyud"] * 3, {"nyud": 30}, seed=0, groups=["st", "st", "mt"])
    assert sorted(parts[0] + parts[1]) == list(range(30))
    assert parts[2] == list(range(30))
    with pytest.raises(ValueError, match="groups"):
        partition_clients(["nyud"], {"nyud": 30}, seed=0, groups=["st", "mt"])
    with pytest.raises(KeyError, match="no training size"):
        partition_clients(["pascal_context"], {"nyud": 30}, seed=0)
