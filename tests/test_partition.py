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


# ---------------------------------------------------------------------------- skewed partitions

import zlib  # noqa: E402

import numpy as np  # noqa: E402

from fedmtl.data.dominant import NO_FOREGROUND_KEY, class_histogram, dominant_class  # noqa: E402
from fedmtl.data.partition import (  # noqa: E402
    MAX_DRAWS,
    NO_FOREGROUND,
    PARTITIONERS,
    Dirichlet,
    Quantity,
    Shards,
    Uniform,
    apportion,
)

# 10 classes of 100 images each, in a shuffled order, and 50 images without foreground
LABELS = np.random.default_rng(0).permutation(
    np.r_[np.repeat(np.arange(10), 100), np.full(50, NO_FOREGROUND)]
)


def _split(partitioner, num_parts=10, seed=0, labels=LABELS):
    parts = partitioner.split(len(labels), num_parts, labels, np.random.default_rng(seed))
    return [np.sort(p) for p in parts]


def _class_shares(part, labels=LABELS):
    classes = np.unique(labels)
    return np.array([(labels[part] == c).mean() for c in classes])


@pytest.mark.parametrize(
    "partitioner", [Uniform(), Dirichlet(0.1), Dirichlet(100.0), Quantity(), Quantity("power_law"), Shards(2)]
)
def test_every_image_is_assigned_exactly_once(partitioner):
    parts = _split(partitioner)
    assert len(parts) == 10
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))


def test_a_small_alpha_concentrates_classes_and_a_large_one_approaches_uniform():
    def mean_top_share(parts):
        return np.mean([_class_shares(p).max() for p in parts if len(p)])

    skewed, even = _split(Dirichlet(0.1)), _split(Dirichlet(1000.0))
    assert mean_top_share(skewed) > 0.5
    assert mean_top_share(even) < 0.15  # the global top share is 100 / 1050
    global_shares = _class_shares(np.arange(len(LABELS)))
    assert max(np.abs(_class_shares(p) - global_shares).max() for p in even) < 0.03
    assert max(np.abs(_class_shares(p) - global_shares).max() for p in skewed) > 0.3


def test_images_without_foreground_form_a_bucket_of_their_own():
    parts = _split(Dirichlet(0.01))
    holders = [p for p in parts if (LABELS[p] == NO_FOREGROUND).any()]
    # alpha 0.01 gives nearly a whole class to one client; the bucket is split like a class
    assert max((LABELS[p] == NO_FOREGROUND).sum() for p in holders) > 40


@pytest.mark.parametrize("partitioner", [Dirichlet(0.3), Quantity(), Shards(2)])
def test_the_same_seed_gives_the_same_split_and_another_seed_another(partitioner):
    labels = {"nyud": LABELS}
    sizes = {"nyud": len(LABELS)}

    def split(seed):
        return partition_clients(["nyud"] * 5, sizes, seed=seed, partitioner=partitioner, labels=labels)

    assert split(3) == split(3)
    assert split(3) != split(4)


def test_uniform_is_the_split_of_before_bit_for_bit():
    seed, key = 11, "nyud/st"
    before = np.array_split(np.random.default_rng([seed, zlib.crc32(key.encode())]).permutation(795), 4)
    parts = partition_clients(
        ["nyud"] * 4, {"nyud": 795}, seed=seed, groups=["st"] * 4, partitioner=Uniform()
    )
    assert parts == [sorted(p.tolist()) for p in before]
    assert parts == partition_clients(["nyud"] * 4, {"nyud": 795}, seed=seed, groups=["st"] * 4)


def test_quantity_sizes_skew():
    sizes = sorted(len(p) for p in _split(Quantity(alpha=0.2)))
    assert sizes[-1] > 4 * sizes[len(sizes) // 2]  # the largest client dwarfs the median one
    even = [len(p) for p in _split(Quantity(alpha=1000.0))]
    assert max(even) - min(even) < 0.2 * len(LABELS) / 10
    power = sorted((len(p) for p in _split(Quantity("power_law", exponent=1.0), num_parts=4)), reverse=True)
    assert power == apportion(np.array([1, 1 / 2, 1 / 3, 1 / 4]), len(LABELS)).tolist()


def test_quantity_assigns_images_regardless_of_class():
    parts = _split(Quantity(alpha=1000.0))
    global_shares = _class_shares(np.arange(len(LABELS)))
    assert max(np.abs(_class_shares(p) - global_shares).max() for p in parts) < 0.1


def test_apportion_sums_to_the_total():
    sizes = apportion(np.array([0.5, 0.3, 0.2]), 7)
    assert sizes.sum() == 7 and sizes.tolist() == [4, 2, 1]  # 3.5 2.1 1.4: floors 3 2 1, then 0.5 wins


@pytest.mark.parametrize("shards_per_client", [1, 2, 3])
def test_shards_give_each_client_at_most_its_number_of_classes(shards_per_client):
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 60))  # 10 classes of 60
    num_parts = 10 * 60 // (20 * shards_per_client)  # shards of 20 images: one class each
    parts = _split(Shards(shards_per_client), num_parts=num_parts, labels=labels)
    assert all(len(np.unique(labels[p])) <= shards_per_client for p in parts)
    assert {len(p) for p in parts} == {20 * shards_per_client}


def test_a_draw_too_small_for_a_client_is_drawn_again_a_bounded_number_of_times():
    sizes = {"nyud": 100}
    first = partition_clients(["nyud"] * 5, sizes, seed=0, partitioner=Quantity(alpha=5.0))
    assert min(len(p) for p in first) < 14  # (for this seed) the first draw leaves a client short
    parts = partition_clients(
        ["nyud"] * 5, sizes, seed=0, partitioner=Quantity(alpha=5.0), too_small=lambda c, p: len(p) < 14
    )
    assert min(len(p) for p in parts) >= 14
    never = partition_clients(
        ["nyud"] * 2, sizes, seed=0, partitioner=Quantity(alpha=1.0), too_small=lambda c, p: True
    )
    assert sorted(never[0] + never[1]) == list(range(100))  # the last draw, returned
    counted = []
    partition_clients(
        ["nyud"] * 2, sizes, seed=0, partitioner=Quantity(), too_small=lambda c, p: counted.append(c)
    )
    assert len(counted) == 2  # accepted at the first draw: each client asked once
    drawn = []
    partition_clients(
        ["nyud"] * 2, sizes, seed=0, partitioner=Quantity(), too_small=lambda c, p: drawn.append(c) or True
    )
    assert len(drawn) == MAX_DRAWS  # the first client refused in every draw
    uniform = []
    partition_clients(["nyud"] * 2, sizes, seed=0, too_small=lambda c, p: uniform.append(c) or True)
    assert len(uniform) == 1  # Uniform's sizes do not depend on the draw: drawn once


def test_dominant_class_ignores_background_and_255():
    label = np.array([[0, 0, 0, 0], [3, 3, 255, 255], [5, 255, 255, 255]])
    assert dominant_class(label, background=0) == 3
    assert dominant_class(label, background=None) == 0
    assert dominant_class(np.array([[0, 255], [0, 0]]), background=0) == NO_FOREGROUND
    assert dominant_class(np.array([[4, 2], [2, 4]]), background=0) == 2  # a tie: the lowest class


def test_class_histogram_names_classes_and_the_no_foreground_bucket():
    histogram = class_histogram("pascal_context", [NO_FOREGROUND, 15, 1, 15])
    assert histogram == {"aeroplane": 1, "person": 2, NO_FOREGROUND_KEY: 1}
    assert list(histogram) == ["aeroplane", "person", NO_FOREGROUND_KEY]
    assert class_histogram("nyud", [0, 0, 39]) == {"wall": 2, "otherprop": 1}


def test_partitioners_are_registered_by_class_name():
    assert PARTITIONERS.names() == ["Dirichlet", "Quantity", "Shards", "Uniform"]
    with pytest.raises(KeyError, match="known: Dirichlet, Quantity, Shards, Uniform"):
        PARTITIONERS.get("Pathological")
