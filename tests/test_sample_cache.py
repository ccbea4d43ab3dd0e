"""data.cache_mib: decoded samples kept in memory change how fast a run reads its data, never
what it reads; the budget bounds the memory; a run with the cache ends where one without does."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fedmtl.data.cache import SampleCache
from fedmtl.data.datasets import build_dataset
from tests.helpers import fit, tiny_config

NYUD_TASKS = ("semseg", "normals", "edge", "depth")


def _nyud(root, cache=None, split="train"):
    # The paper's augmentation (random rescaling, crop, flip, photometric): a cached sample must
    # still be augmented afresh each epoch.
    return build_dataset("nyud", root, split, tasks=NYUD_TASKS, train_size=(32, 32), cache=cache)


def _epoch(dataset, epoch: int) -> list[dict]:
    dataset.set_epoch(epoch)
    return [dataset[i] for i in range(len(dataset))]


def _assert_same(samples, others) -> None:
    assert len(samples) == len(others)
    for sample, other in zip(samples, others, strict=True):
        assert sample["meta"] == other["meta"]
        for key in ("image", *NYUD_TASKS):
            assert np.array_equal(sample[key].numpy(), other[key].numpy(), equal_nan=True), key


def test_a_cached_dataset_gives_the_samples_of_an_uncached_one_every_epoch(data_root):
    cache = SampleCache(64 * 2**20)
    cached, plain = _nyud(data_root, cache), _nyud(data_root)
    epochs = [_epoch(cached, e) for e in range(3)]
    assert len(cache) == len(cached)  # filled in the first epoch, read from in the next two
    for e, samples in enumerate(epochs):
        _assert_same(samples, _epoch(plain, e))
    # and the augmentation still differs between epochs
    assert not np.array_equal(epochs[0][0]["image"].numpy(), epochs[1][0]["image"].numpy())


def test_a_cached_sample_is_not_read_from_disk_again(data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root / "NYUDv2", root / "NYUDv2")
    cached, plain = _nyud(root, SampleCache(64 * 2**20)), _nyud(root)
    first = _epoch(cached, 0)
    for image in (root / "NYUDv2" / "images").iterdir():
        image.write_bytes(b"not a png")
    _assert_same(_epoch(cached, 0), first)
    with pytest.raises(ValueError, match="cannot be read"):
        plain[0]


def test_the_budget_bounds_the_cache_and_the_rest_is_read_from_disk(data_root):
    plain = _nyud(data_root)
    one_sample = sum(a.nbytes for a in plain._load(plain.ids[0]).values())
    cache = SampleCache(2 * one_sample)
    cached = _nyud(data_root, cache)
    _assert_same(_epoch(cached, 0), _epoch(plain, 0))
    assert len(cache) == 2 and cache.used_bytes <= cache.limit_bytes
    _assert_same(_epoch(cached, 1), _epoch(plain, 1))
    assert len(cache) == 2


def test_writing_into_a_returned_sample_leaves_the_cached_one_as_it_was():
    cache = SampleCache(2**20)
    assert cache.put("a", {"image": np.zeros((2, 2, 3), np.float32), "id": "a"})
    sample = cache.get("a")
    sample["image"] += 1  # what an in-place transform would do
    assert not cache.get("a")["image"].any()
    assert cache.get("b") is None


def test_a_sample_past_the_budget_is_not_kept():
    cache = SampleCache(100)
    assert not cache.put("big", {"image": np.zeros(101, np.uint8)})
    assert cache.put("small", {"image": np.zeros(100, np.uint8)})
    assert (len(cache), cache.used_bytes) == (1, 100)
    with pytest.raises(ValueError, match="at least 0 bytes"):
        SampleCache(-1)


def test_a_run_with_the_cache_ends_where_one_without_does(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, rounds=2)
    without = fit(config, tmp_path / "plain")
    with_cache = fit(config, tmp_path / "cached", "--data.cache_mib", "16")
    assert with_cache["clients"] == without["clients"]
