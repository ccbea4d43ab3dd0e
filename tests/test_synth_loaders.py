"""Generated data is read back by the real loaders, every task, and agrees with what was rendered."""

import numpy as np
import pytest
import torch

from fedmtl.data.datasets import DATASETS, build_dataset
from fedmtl.data.layout import read_label_map
from fedmtl.data.pascal_context import label_boundaries, seg2bmap
from fedmtl.synth import generate, nyud_sample, pascal_sample, sample_rng

SIZE = (48, 64)
TASKS = {"pascal_context": DATASETS.get("pascal_context").tasks, "nyud": DATASETS.get("nyud").tasks}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(
        "pascal_context", root / "PASCALContext", num_train=10, num_val=8, size=SIZE, seed=3, progress=False
    )
    generate("nyud", root / "NYUDv2", num_train=6, num_val=4, size=SIZE, seed=3, progress=False)
    return root


@pytest.mark.parametrize("dataset", ["pascal_context", "nyud"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_every_task_loads_and_batches(data_root, dataset, split):
    ds = build_dataset(
        dataset, data_root, split, tasks=TASKS[dataset], train_size=(32, 32) if split == "train" else SIZE
    )
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=len(ds))))
    h, w = (32, 32) if split == "train" else SIZE
    assert batch["image"].shape == (len(ds), 3, h, w)
    for task in TASKS[dataset]:
        expected = (len(ds), 3, h, w) if task == "normals" else (len(ds), h, w)
        assert batch[task].shape == expected, task
        assert (batch[task] != 255).any(), f"{task} has no valid pixel in the whole split"


def test_nyud_labels_read_back_as_rendered(data_root):
    ds = build_dataset("nyud", data_root, "val", tasks=TASKS["nyud"], train_size=SIZE)
    sample = ds[0]
    rendered = nyud_sample(sample_rng("nyud", 3, "val", 0), SIZE)
    np.testing.assert_array_equal(sample["semseg"].numpy(), rendered.semseg)
    np.testing.assert_array_equal(sample["edge"].numpy(), rendered.edge.astype(np.float32))
    missing = rendered.depth == 0  # no Kinect measurement: ignored
    np.testing.assert_allclose(sample["depth"].numpy(), np.where(missing, 255.0, rendered.depth), rtol=1e-6)
    normals = sample["normals"].permute(1, 2, 0).numpy()
    assert np.abs(normals - rendered.rendering.normals).max() < 2 / 255 + 1e-6  # 8-bit storage


def test_pascal_labels_read_back_as_rendered(data_root):
    ds = build_dataset("pascal_context", data_root, "val", tasks=TASKS["pascal_context"], train_size=SIZE)
    for index in range(len(ds)):
        sample = ds[index]
        rendered = pascal_sample(sample_rng("pascal_context", 3, "val", index), SIZE)
        np.testing.assert_array_equal(sample["semseg"].numpy(), rendered.semseg)
        np.testing.assert_array_equal(sample["sal"].numpy(), (rendered.sal > 127).astype(np.int64))
        people = [p for p in rendered.parts if p.class_ind == 15 and p.mask.any()]
        parts = sample["human_parts"].numpy()
        if people:
            person = np.logical_or.reduce([p.mask for p in people])
            assert (parts[~person] == 0).all() and (parts[person] > 0).any()
        else:
            assert (parts == 255).all()  # no person: no human-parts label
        edge = sample["edge"].numpy()
        assert edge.any() and set(np.unique(edge)) <= {0.0, 1.0}


@pytest.mark.parametrize("split", ["train", "val"])
def test_pascal_edges_of_each_split_from_the_label_map(data_root, split):
    """val: BSDS seg2bmap of the LabelMap on disk (the evaluation ground truth); train: the
    thinned Laplacian (the training label); both equal to what was rendered."""
    ds = build_dataset("pascal_context", data_root, split, tasks=["edge"], train_size=SIZE, augment=False)
    expected = seg2bmap if split == "val" else label_boundaries
    for index in range(len(ds)):
        sample = ds[index]
        label_map = read_label_map(ds.layout.label_map(sample["meta"]["id"]))
        rendered = pascal_sample(sample_rng("pascal_context", 3, split, index), SIZE)
        np.testing.assert_array_equal(label_map, rendered.label_map)
        edge = sample["edge"].numpy()
        assert edge.any()
        np.testing.assert_array_equal(edge, np.asarray(expected(label_map), dtype=np.float32))
