"""Dataset classes on tiny hand-made PASCAL-Context and NYUD-v2 folders (32x40 images)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage
from skimage.morphology import thin

from fedmtl.data import pascal_context
from fedmtl.data.datasets import DATASETS, build_dataset, one_line
from fedmtl.data.layout import (
    NYUD_TREE,
    PASCAL_CONTEXT_TREE,
    NYUDLayout,
    PartAnnotation,
    PascalContextLayout,
    decode_normals,
    encode_normals,
)
from fedmtl.data.nyud import NYUD
from fedmtl.data.pascal_context import PascalContext, label_boundaries, seg2bmap
from fedmtl.data.transforms import IGNORE

H, W = 32, 40
CONTEXT_CLASSES = {"unknown": 0, "wall": 1, "floor": 2, "tvmonitor": 3, "sky": 4, "person": 5}
NYU_CLASSES = {"unknown": 0, "wall": 1, "floor": 2, "television": 3, "bed": 4}
NORMALS_VALID = (1, 2, 3)  # wall, floor (shared with NYU) and tvmonitor (added by hand)


def box(r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    mask = np.zeros((H, W), dtype=bool)
    mask[r0:r1, c0:c1] = True
    return mask


WALL, PERSON, TV = box(3, 10, 4, 14), box(18, 30, 22, 36), box(20, 26, 4, 10)

# person parts of image "a" (inside PERSON) and the labels they must read back as
PARTS = {
    "head": (box(18, 21, 22, 36), 1),
    "torso": (box(21, 24, 22, 36), 2),
    "luarm": (box(24, 26, 22, 29), 3),
    "rhand": (box(24, 26, 29, 36), 4),
    "ruleg": (box(26, 28, 22, 36), 5),
    "lfoot": (box(28, 30, 22, 36), 6),
}


def label_map() -> np.ndarray:
    lm = np.full((H, W), 4, dtype=np.int32)  # sky above row 14
    lm[14:] = 2  # floor
    lm[WALL], lm[PERSON], lm[TV] = 1, 5, 3
    return lm


def pascal_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normals = rng.normal(size=(H, W, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    semseg = np.zeros((H, W), dtype=np.uint8)
    semseg[PERSON], semseg[TV], semseg[WALL] = 15, 9, 255
    sal = np.full((H, W), 30, dtype=np.uint8)
    sal[PERSON] = 200
    sal[0, 0], sal[0, 1] = 128, 127  # 128/255 > 0.5 >= 127/255
    yy, xx = np.mgrid[0:H, 0:W]
    image = np.stack((yy * 7, xx * 6, (yy + xx) * 3), axis=-1).astype(np.uint8)
    return {"image": image, "semseg": semseg, "label_map": label_map(), "sal": sal, "normals": normals}


def dog() -> PartAnnotation:
    return PartAnnotation("dog", 12, WALL)


PERSON_OBJECTS = {
    "a": [dog(), PartAnnotation("person", 15, PERSON, {name: mask for name, (mask, _) in PARTS.items()})],
    "b": [dog()],  # no person
    "c": [PartAnnotation("person", 15, PERSON)],  # a person without part annotations
    "e": [
        PartAnnotation("person", 15, np.zeros((H, W), bool), {"head": np.zeros((H, W), bool)})
    ],  # empty mask
}


def make_pascal(root) -> PascalContextLayout:
    layout = PascalContextLayout(root)
    layout.write_meta({"train": ["a", "b", "c", "e"], "val": ["a", "b"]}, CONTEXT_CLASSES, NYU_CLASSES, {})
    arrays = pascal_arrays()
    for i, objects in PERSON_OBJECTS.items():
        layout.write_sample(i, parts=objects, semseg_dir="pascal-context" if i == "c" else "VOC12", **arrays)
    return layout


def nyud_arrays(k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(k)
    normals = rng.normal(size=(H, W, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    semseg = rng.integers(0, 40, size=(H, W)).astype(np.uint8)
    semseg[WALL] = 255
    depth = rng.uniform(0.5, 10.0, size=(H, W)).astype(np.float32)
    depth[TV] = 0.0  # no measurement
    return {
        "image": rng.integers(0, 256, size=(H, W, 3)).astype(np.uint8),
        "semseg": semseg,
        "edge": PERSON ^ box(19, 29, 23, 35),  # a rectangle outline
        "normals": normals,
        "depth": depth,
    }


def make_nyud(root) -> NYUDLayout:
    layout = NYUDLayout(root)
    layout.write_meta({"train": ["n0", "n1", "n2"], "val": ["n3", "n4"]})
    for k in range(5):
        layout.write_sample(f"n{k}", **nyud_arrays(k))
    return layout


@pytest.fixture(scope="module")
def pascal_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "PASCALContext"
    make_pascal(root)
    return root


@pytest.fixture(scope="module")
def nyud_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "NYUDv2"
    make_nyud(root)
    return root


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", DATASETS.names())
def test_spec_matches_its_class(name):
    spec = DATASETS.get(name)
    assert spec.name == name == spec.dataset_class.name
    assert spec.tasks == spec.dataset_class.tasks_available


def test_specs_carry_the_paper_numbers():
    pascal, nyud = DATASETS.get("pascal_context"), DATASETS.get("nyud")
    assert pascal.train_size == (512, 512)
    assert nyud.train_size == (448, 576)
    assert (pascal.root_folder, nyud.root_folder) == ("PASCALContext", "NYUDv2")
    assert pascal.tasks == ("semseg", "human_parts", "sal", "normals", "edge")
    assert nyud.tasks == ("semseg", "normals", "edge", "depth")


# --------------------------------------------------------------------------- PASCAL-Context labels


def test_pascal_raw_sample_values(pascal_root):
    ds = PascalContext(pascal_root, "train")
    sample = ds[0]
    arrays = pascal_arrays()
    assert sample["image"].dtype == np.float32 and sample["image"].shape == (H, W, 3)
    assert sample["image"].min() >= 0 and sample["image"].max() <= 255
    np.testing.assert_array_equal(sample["semseg"], arrays["semseg"].astype(np.float32))
    expected_sal = (arrays["sal"] > 127).astype(np.float32)
    assert expected_sal[0, 0] == 1 and expected_sal[0, 1] == 0
    np.testing.assert_array_equal(sample["sal"], expected_sal)
    assert sample["meta"] == {"id": "a", "index": 0, "size": (H, W)}


def test_pascal_semseg_fallback_location(pascal_root):
    ds = PascalContext(pascal_root, "train", tasks=["semseg"])
    assert not PascalContextLayout(pascal_root).semseg_candidates("c")[0].exists()
    np.testing.assert_array_equal(ds[2]["semseg"], pascal_arrays()["semseg"])


def test_pascal_human_parts_mapping(pascal_root):
    parts = PascalContext(pascal_root, "train", tasks=["semseg", "human_parts"])[0]["human_parts"]
    expected = np.zeros((H, W), dtype=np.float32)
    for mask, label in PARTS.values():
        expected[mask] = label
    np.testing.assert_array_equal(parts, expected)
    assert set(np.unique(parts)) == {0, 1, 2, 3, 4, 5, 6}


def test_part_names_fold_into_six_labels():
    assert set(pascal_context.HUMAN_PARTS.values()) == {1, 2, 3, 4, 5, 6}
    assert len(pascal_context.HUMAN_PARTS) == 24
    folds = {"hair": 1, "reye": 1, "neck": 2, "torso": 2, "ruarm": 3, "llarm": 4, "lhand": 4, "luleg": 5}
    folds |= {"rlleg": 6, "rfoot": 6}
    assert all(pascal_context.HUMAN_PARTS[name] == label for name, label in folds.items())


@pytest.mark.parametrize("index", [1, 2, 3], ids=["no-person", "person-without-parts", "empty-person-mask"])
def test_pascal_images_without_part_label_are_all_ignored(pascal_root, index):
    parts = PascalContext(pascal_root, "train", tasks=["semseg", "human_parts"])[index]["human_parts"]
    assert parts.shape == (H, W) and (parts == IGNORE).all()


def test_parts_only_dataset_drops_images_without_person(pascal_root):
    before = sorted(p for p in pascal_root.rglob("*"))
    ds = PascalContext(pascal_root, "train", tasks=["human_parts"])
    assert ds.ids == ["a", "c"]  # "b" has no person, "e" an empty person mask
    assert ds.split_indices == [0, 2]
    assert ds[1]["meta"]["index"] == 2
    assert sorted(p for p in pascal_root.rglob("*")) == before  # nothing written into the root
    # the filter applies after `indices`, and only to a parts-only dataset
    assert PascalContext(pascal_root, "train", tasks=["human_parts"], indices=[3, 1, 0]).ids == ["a"]
    assert len(PascalContext(pascal_root, "train", tasks=["human_parts", "sal"])) == 4


def test_has_person_is_cached(pascal_root, monkeypatch):
    PascalContext(pascal_root, "val", tasks=["human_parts"])
    calls = []
    monkeypatch.setattr(
        pascal_context, "read_part_annotations", lambda path: calls.append(path) or pytest.fail("re-read")
    )
    assert PascalContext(pascal_root, "val", tasks=["human_parts"]).ids == ["a"]
    assert calls == []


def test_pascal_normals_masked_by_context_class(pascal_root):
    normals = PascalContext(pascal_root, "train", tasks=["normals"])[0]["normals"]
    lm = label_map()
    valid = np.isin(lm, NORMALS_VALID)
    assert valid.any() and (~valid).any()
    expected = decode_normals(encode_normals(pascal_arrays()["normals"]))
    np.testing.assert_array_equal(normals[valid], expected[valid])
    assert (normals[~valid] == IGNORE).all()
    assert (normals[lm == 3] != IGNORE).all()  # tvmonitor: added although NYU names it otherwise


def reference_edges(lm: np.ndarray) -> np.ndarray:
    """cv2.Laplacian(ksize=1) != 0 with reflect-101 borders (numpy's "reflect"), thinned."""
    p = np.pad(lm.astype(np.int64), 1, mode="reflect")
    lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * p[1:-1, 1:-1]
    return thin(lap != 0)


def test_pascal_edges_are_thin_label_boundaries(pascal_root):
    edge = PascalContext(pascal_root, "train", tasks=["edge"])[0]["edge"]
    lm = label_map()
    assert edge.dtype == np.float32 and set(np.unique(edge)) == {0.0, 1.0}
    np.testing.assert_array_equal(edge, reference_edges(lm).astype(np.float32))
    p = np.pad(lm, 1, mode="edge")
    differs = (p[:-2, 1:-1] != lm) | (p[2:, 1:-1] != lm) | (p[1:-1, :-2] != lm) | (p[1:-1, 2:] != lm)
    assert not (edge.astype(bool) & ~differs).any()  # only at label changes
    # mirrored borders make no edge; only the sky/floor boundary reaches the side
    assert not edge[0].any() and not edge[-1].any()
    assert set(np.flatnonzero(edge[:, 0])) <= {13, 14} and edge[:, 0].sum() == 1
    # one pixel wide: across each vertical side of the wall box (columns 3|4 and 13|14)
    for row in range(5, 8):
        assert edge[row, 3:5].sum() == 1 and edge[row, 13:15].sum() == 1
        assert edge[row, 5:13].sum() == 0
    assert not (edge[:-1, :-1] * edge[1:, :-1] * edge[:-1, 1:] * edge[1:, 1:]).any()  # no 2x2 block


def matlab_seg2bmap(seg: np.ndarray) -> np.ndarray:
    """BSDS ``seg2bmap.m`` line by line (output size = input size), MATLAB's zero padding included."""
    seg = seg.astype(np.float64)
    e, s, se = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
    e[:, :-1] = seg[:, 1:]
    s[:-1, :] = seg[1:, :]
    se[:-1, :-1] = seg[1:, 1:]
    b = (seg != e) | (seg != s) | (seg != se)
    b[-1, :] = seg[-1, :] != e[-1, :]
    b[:, -1] = seg[:, -1] != s[:, -1]
    b[-1, -1] = False
    return b


def bmap(rows: str) -> np.ndarray:
    """Rows of "#" (boundary) and "." -> bool map."""
    return np.array([[c == "#" for c in row] for row in rows.split()], dtype=bool)


SEG2BMAP_CASES = {
    # label change between columns 1 and 2: the line is on the left side, down to the last row
    "vertical": (np.array([[1, 1, 2, 2]] * 4), bmap(".#.. .#.. .#.. .#..")),
    # between rows 1 and 2: on the upper side, out to the last column
    "horizontal": (np.repeat([[1], [1], [2], [2]], 4, axis=1), bmap(".... #### .... ....")),
    # a staircase: the south-east neighbour makes the corner pixels; the last row compares
    # east only and the last column south only
    "diagonal": (np.tril(np.ones((4, 4), int)), bmap("##.. .##. ..## ....")),
    # one pixel: the pixel, its west, north and north-west neighbours (a 2x2 block)
    "pixel": (np.pad([[7]], 2), bmap("..... .##.. .##.. ..... .....")),
    # one pixel in the bottom-right corner: the corner itself is never a boundary
    "corner": (np.pad([[7]], ((4, 0), (4, 0))), bmap("..... ..... ..... ...## ...#.")),
    # one pixel in the last row
    "last-row": (np.pad([[7]], ((4, 0), (2, 2))), bmap("..... ..... ..... .##.. .##..")),
    # one pixel in the last column
    "last-column": (np.pad([[7]], ((2, 2), (4, 0))), bmap("..... ...## ...## ..... .....")),
    # 0 and 255 are labels like any other
    "zero-255": (np.array([[0, 0, 255], [0, 0, 255]]), bmap(".#. .#.")),
    "uniform": (np.full((3, 5), 4), np.zeros((3, 5), bool)),
    "uniform-255": (np.full((3, 5), 255, np.uint8), np.zeros((3, 5), bool)),
    "one-row": (np.array([[1, 2, 2, 3]]), bmap("#.#.")),
    "one-column": (np.array([[1], [2], [2], [3]]), bmap("# . # .")),
    "one-pixel": (np.array([[3]]), np.zeros((1, 1), bool)),
}


@pytest.mark.parametrize("case", SEG2BMAP_CASES)
def test_seg2bmap_hand_made(case):
    labels, expected = SEG2BMAP_CASES[case]
    result = seg2bmap(labels)
    assert result.dtype == bool and result.shape == labels.shape
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(result, matlab_seg2bmap(labels))


def relabel(labels: np.ndarray) -> np.ndarray:
    """SEISM ``relabel``: 4-connected regions of equal label, numbered anew."""
    out, count = np.zeros(labels.shape, np.int64), 0
    for value in np.unique(labels):
        regions, n = ndimage.label(labels == value)  # 4-connectivity
        out[regions > 0] = regions[regions > 0] + count
        count += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_seg2bmap_matches_matlab_and_ignores_relabelling(seed):
    rng = np.random.default_rng(seed)
    h, w = rng.integers(1, 12, size=2)
    labels = rng.integers(0, 3, size=(h, w)).astype(np.uint16)  # many diagonal contacts
    result = seg2bmap(labels)
    np.testing.assert_array_equal(result, matlab_seg2bmap(labels))
    np.testing.assert_array_equal(seg2bmap(relabel(labels)), result)  # db_gt relabels first
    assert not seg2bmap(np.zeros((0, 3))).size
    with pytest.raises(ValueError, match="2-D"):
        seg2bmap(labels[None])


def test_pascal_val_edges_are_seg2bmap_train_edges_unchanged(pascal_root):
    lm = label_map()
    train = PascalContext(pascal_root, "train", tasks=["edge"])[0]["edge"]
    val = PascalContext(pascal_root, "val", tasks=["edge"])[0]["edge"]  # same image "a"
    assert val.dtype == np.float32 and set(np.unique(val)) == {0.0, 1.0}
    np.testing.assert_array_equal(val, seg2bmap(lm).astype(np.float32))
    np.testing.assert_array_equal(train, label_boundaries(lm))
    assert not np.array_equal(train, val)
    # evaluation transform: padded (centred) with 255, the original pixels untouched
    padded = build_dataset("pascal_context", pascal_root, "val", tasks=["edge"], train_size=(H + 8, W + 6))
    edge = padded[0]["edge"].numpy()
    assert edge.shape == (H + 8, W + 6)
    np.testing.assert_array_equal(edge[4 : 4 + H, 3 : 3 + W], seg2bmap(lm).astype(np.float32))
    inside = np.zeros(edge.shape, bool)
    inside[4 : 4 + H, 3 : 3 + W] = True
    assert (edge[~inside] == IGNORE).all()


# --------------------------------------------------------------------------- NYUD-v2 labels


def test_nyud_raw_sample_values(nyud_root):
    ds = NYUD(nyud_root, "val")
    sample = ds[1]
    arrays = nyud_arrays(4)
    assert sample["meta"] == {"id": "n4", "index": 1, "size": (H, W)}
    np.testing.assert_array_equal(sample["image"], arrays["image"].astype(np.float32))
    np.testing.assert_array_equal(sample["semseg"], arrays["semseg"].astype(np.float32))
    np.testing.assert_array_equal(sample["edge"], arrays["edge"].astype(np.float32))
    np.testing.assert_array_equal(sample["normals"], decode_normals(encode_normals(arrays["normals"])))
    np.testing.assert_array_equal(sample["depth"], arrays["depth"])
    assert sample["depth"].dtype == np.float32 and (sample["depth"][TV] == 0).all()


def test_nyud_semseg_is_stored_label_minus_one(nyud_root):
    stored = np.asarray(Image.open(NYUDLayout(nyud_root).semseg("n0")))
    semseg = NYUD(nyud_root, "train", tasks=["semseg"])[0]["semseg"]
    assert (stored == 0).any() and (stored == 40).any()
    np.testing.assert_array_equal(semseg[stored == 0], IGNORE)
    np.testing.assert_array_equal(semseg[stored > 0], stored[stored > 0] - 1.0)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("cls", "make", "tree"),
    [(PascalContext, make_pascal, PASCAL_CONTEXT_TREE), (NYUD, make_nyud, NYUD_TREE)],
)
def test_missing_root_and_split_file(tmp_path, cls, make, tree):
    with pytest.raises(FileNotFoundError) as err:
        cls(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value) and one_line(tree) in str(err.value)
    assert f"fedmtl data synth --dataset {cls.name} --root {tmp_path / 'nowhere'}" in str(err.value)
    layout = make(tmp_path / "ds")
    layout.split_file("val").unlink()
    with pytest.raises(FileNotFoundError) as err:
        cls(tmp_path / "ds", "val")
    assert str(layout.split_file("val")) in str(err.value) and one_line(tree) in str(err.value)


def test_missing_label_file_only_matters_for_its_task(tmp_path):
    layout = make_pascal(tmp_path / "PASCALContext")
    layout.sal("c").unlink()
    PascalContext(layout.root, "train", tasks=["semseg", "edge"])  # sal not requested: fine
    with pytest.raises(FileNotFoundError) as err:
        PascalContext(layout.root, "train", tasks=["semseg", "sal"], indices=[0])  # checked for all
    assert f"PASCAL-Context train sal label not found: {layout.sal('c')}" in str(err.value)
    assert one_line(PASCAL_CONTEXT_TREE) in str(err.value)
    layout.json("context_classes").unlink()
    PascalContext(layout.root, "val", tasks=["semseg"])  # only normals need the class lists
    with pytest.raises(FileNotFoundError, match="metadata file not found: .*context_classes.json"):
        PascalContext(layout.root, "val", tasks=["normals"])
    layout.image("b").unlink()
    with pytest.raises(FileNotFoundError, match="train image not found: .*JPEGImages/b.jpg"):
        PascalContext(layout.root, "train", tasks=["semseg"])


def test_missing_semseg_in_both_locations(tmp_path):
    layout = make_pascal(tmp_path / "PASCALContext")
    layout.semseg_candidates("c")[1].unlink()
    with pytest.raises(FileNotFoundError, match="semseg"):
        PascalContext(layout.root, "train", tasks=["semseg"])


def test_missing_nyud_depth(tmp_path):
    layout = make_nyud(tmp_path / "NYUDv2")
    layout.depth("n1").unlink()
    NYUD(layout.root, "train", tasks=["semseg", "normals", "edge"])
    with pytest.raises(FileNotFoundError) as err:
        NYUD(layout.root, "train", tasks=["depth"])
    assert str(layout.depth("n1")) in str(err.value) and one_line(NYUD_TREE) in str(err.value)


@pytest.mark.parametrize(
    ("cls", "task", "message"),
    [
        (PascalContext, "depth", "pascal_context has no task 'depth'"),
        (NYUD, "human_parts", "nyud has no task 'human_parts'"),
        (NYUD, "sal", "nyud has no task 'sal'"),
        (NYUD, "segmentation", "unknown task 'segmentation'"),
    ],
)
def test_tasks_the_dataset_does_not_have(pascal_root, nyud_root, cls, task, message):
    root = pascal_root if cls is PascalContext else nyud_root
    with pytest.raises(ValueError, match=message) as err:
        cls(root, "train", tasks=["semseg", task])
    assert ", ".join(cls.tasks_available) in str(err.value)


def test_indices_select_a_subset(nyud_root):
    ds = NYUD(nyud_root, "train", tasks=["depth"], indices=np.array([2, 0]))
    assert len(ds) == 2 and ds.ids == ["n2", "n0"]
    np.testing.assert_array_equal(ds[0]["depth"], nyud_arrays(2)["depth"])
    assert ds[1]["meta"]["index"] == 0
    with pytest.raises(IndexError, match="out of range"):
        NYUD(nyud_root, "train", indices=[3])


# --------------------------------------------------------------------------- factory and loading


def test_build_dataset_transforms_and_root_resolution(pascal_root):
    train = build_dataset("pascal_context", pascal_root.parent, "train", train_size=24)
    assert train.root == pascal_root and len(train) == 4
    sample = train[0]
    assert sample["image"].shape == (3, 24, 24) and sample["image"].dtype == torch.float32
    for task in ("semseg", "human_parts", "sal"):
        assert sample[task].shape == (24, 24) and sample[task].dtype == torch.int64
    assert sample["normals"].shape == (3, 24, 24) and sample["edge"].shape == (24, 24)
    val = build_dataset("pascal_context", pascal_root, "val", tasks=["semseg"], train_size=(36, 48))
    assert val.root == pascal_root and val[0]["image"].shape == (3, 36, 48)
    with pytest.raises(KeyError, match="unknown dataset 'pascal'"):
        build_dataset("pascal", pascal_root)


def test_paper_size_is_the_default(nyud_root):
    val = build_dataset("nyud", nyud_root, "val")
    sample = val[0]
    assert sample["image"].shape == (3, 448, 576) and sample["depth"].shape == (448, 576)
    assert sample["meta"]["size"] == (H, W)


def test_augmentation_is_reproducible_per_seed_and_epoch(nyud_root):
    def first(seed, epoch=0):
        ds = build_dataset("nyud", nyud_root, "train", train_size=24, seed=seed)
        ds.set_epoch(epoch)
        return ds[0]

    a, b = first(0), first(0)
    for key in ("image", "semseg", "normals", "edge", "depth"):
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a["image"], first(1)["image"])
    assert not torch.equal(a["image"], first(0, epoch=1)["image"])


def test_augmentation_depends_on_the_image_not_on_the_subset(nyud_root):
    full = build_dataset("nyud", nyud_root, "train", train_size=24)
    part = build_dataset("nyud", nyud_root, "train", train_size=24, indices=[2])
    assert torch.equal(full[2]["image"], part[0]["image"])


@pytest.mark.parametrize("split", ["train", "val"])
def test_dataloader_stacks_a_batch(pascal_root, split):
    ds = build_dataset("pascal_context", pascal_root, split, train_size=(40, 48))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=0)))
    assert batch["image"].shape == (2, 3, 40, 48)
    assert batch["semseg"].shape == batch["human_parts"].shape == batch["edge"].shape == (2, 40, 48)
    assert batch["normals"].shape == (2, 3, 40, 48)
    assert batch["meta"]["id"] == ["a", "b"]


def test_same_batches_whatever_the_number_of_workers(nyud_root):
    ds = build_dataset("nyud", nyud_root, "train", train_size=24, seed=3)

    def epoch(workers):
        loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers)
        return [batch["image"] for batch in loader]

    serial, parallel = epoch(0), epoch(2)
    assert len(serial) == len(parallel) == 2
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))


def test_a_file_the_system_will_not_open_is_named_as_such_not_as_corrupt(nyud_root, monkeypatch):
    """A permission or open-file refusal is the system's, not a damaged file: the error says so,
    and it is a ValueError, whose words survive a DataLoader worker (an OSError's errno does not)."""
    import errno

    from fedmtl.data import nyud

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(nyud, "read_image", denied)
    with pytest.raises(ValueError) as caught:
        NYUD(nyud_root, "val")[1]
    message = str(caught.value)
    assert "permission denied" in message and "corrupt" not in message
    assert "give this user access" in message
