"""data.human_parts_selection: the correct human-parts selection (default) and the public one.

A hand-made 10-image PASCAL-Context split in the real layout (every image has its
``human_parts/<id>.mat``; five of them hold a person with parts, the others only a dog), and
clients holding a part of it. The expected images are derived by hand from the public loader
(innovator-zero/FedHCA2 ``datasets/pascal_context.py`` at 9e3c9b3):

- lines 160-167: ``has_human_parts[k]`` is computed for every image k of the WHOLE split list;
- line 169 / lines 184-192: ``__build_truncated_dataset__`` replaces ``im_ids``/``images``/``parts``
  by ``[x[idx] for idx in dataidxs]`` and leaves ``has_human_parts`` untouched;
- lines 171-182 (parts-only dataset): ``for i in range(len(self.parts) - 1, -1, -1): if
  self.has_human_parts[i] == 0: del ...[i]``: position i of the CLIENT's list is dropped when
  flag i of the SPLIT is 0 (the flag is deleted with it, so what is kept reads flag 1);
- lines 251-284 (``_load_human_parts``): ``if self.has_human_parts[index]`` the image's own
  annotation (zeros without a person with parts, lines 277-279), else zeros (line 284); an
  all-zero map becomes all 255 in ``AddIgnoreRegions`` (``datasets/custom_transforms.py``).

So the image at position k of the client's list reads ``FLAGS[k]``, the flag of split image k.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fedmtl.config import HUMAN_PARTS_SELECTIONS as CONFIG_SELECTIONS
from fedmtl.config import DataConfig
from fedmtl.data import pascal_context
from fedmtl.data.datasets import build_dataset
from fedmtl.data.layout import PartAnnotation, PascalContextLayout
from fedmtl.data.pascal_context import HUMAN_PARTS_SELECTIONS, PascalContext
from fedmtl.data.transforms import IGNORE

H, W = 16, 16
IDS = [f"i{k}" for k in range(10)]
FLAGS = [1, 0, 0, 1, 1, 0, 1, 0, 0, 1]  # has a person, by position in the split
PEOPLE = {i for i, flag in zip(IDS, FLAGS) if flag}  # i0, i3, i4, i6, i9

# A client's part (sorted, as fedmtl's partitions are): ids i2, i3, i5, i6, i8, i9.
CLIENT = [2, 3, 5, 6, 8, 9]
# position k:           0    1    2    3    4    5
# image:               i2   i3   i5   i6   i8   i9
# its own person:       0    1    0    1    0    1
# public reads FLAGS[k]: 1    0    0    1    1    0
#
# parts-only, public: keep the positions with FLAGS[k] = 1 -> k 0, 3, 4 -> i2, i6, i8 (i3 and i9,
#   which show people, are dropped); kept images read flag 1 again after the deletions
#   (lines 175-180), so each is labelled from its own file: i2, i8 (no person) all 255, i6 parts.
# multi-task, public: keep all six; position k labelled only if FLAGS[k] = 1 -> i2 (no person:
#   all 255 anyway), i6 (parts), i8 (no person: all 255); FLAGS[k] = 0 -> all 255 for i3, i5,
#   i9: i3's and i9's people lose their labels. Only i6 carries a label.
PUBLIC_PARTS_ONLY = ["i2", "i6", "i8"]
PUBLIC_LABELLED = {"i6"}
# The correct selection: the images that show a person, each labelled.
CORRECT_PARTS_ONLY = ["i3", "i6", "i9"]

# The public code's partitions are in permutation order (utils.get_st_config), not sorted; the
# flags are still read by position: client list i8, i3, i9, i0 reads FLAGS[0..3] = 1, 0, 0, 1:
# parts-only keeps i8 (no person: all 255) and i0; i3 and i9 (people) are dropped.
SHUFFLED = [8, 3, 9, 0]
SHUFFLED_PUBLIC_PARTS_ONLY = ["i8", "i0"]


def box(r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    mask = np.zeros((H, W), dtype=bool)
    mask[r0:r1, c0:c1] = True
    return mask


PERSON = box(4, 14, 6, 12)
PARTS = {"head": (box(4, 7, 6, 12), 1), "torso": (box(7, 10, 6, 12), 2), "lfoot": (box(10, 14, 6, 12), 6)}


def person_label() -> np.ndarray:
    label = np.zeros((H, W), dtype=np.float32)
    for mask, value in PARTS.values():
        label[mask] = value
    return label


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "PASCALContext"
    layout = PascalContextLayout(root)
    classes = {"unknown": 0, "wall": 1, "person": 2}
    # val lists the same images in another order: no indices there, so both modes agree.
    layout.write_meta({"train": IDS, "val": IDS[::-1]}, classes, {"unknown": 0, "wall": 1}, {})
    rng = np.random.default_rng(0)
    normals = rng.normal(size=(H, W, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    for i in IDS:
        objects = [PartAnnotation("dog", 12, box(0, 3, 0, 4))]
        if i in PEOPLE:
            objects.append(PartAnnotation("person", 15, PERSON, {n: m for n, (m, _) in PARTS.items()}))
        layout.write_sample(
            i,
            image=rng.integers(0, 256, size=(H, W, 3)).astype(np.uint8),
            semseg=np.zeros((H, W), dtype=np.uint8),
            label_map=np.ones((H, W), dtype=np.int32),
            parts=objects,
            sal=np.zeros((H, W), dtype=np.uint8),
            normals=normals,
        )
    return root


def labelled(dataset: PascalContext) -> dict[str, bool]:
    """Per image of the dataset: whether its raw human_parts label carries parts (else all 255)."""
    result = {}
    for k, i in enumerate(dataset.ids):
        parts = dataset[k]["human_parts"]
        if (parts == IGNORE).all():
            result[i] = False
        else:
            np.testing.assert_array_equal(parts, person_label())  # its own label, untouched
            result[i] = True
    return result


def test_the_hand_made_split_is_as_described(root):
    correct = PascalContext(root, "train", tasks=["human_parts"])
    assert correct.ids == sorted(PEOPLE, key=IDS.index) == ["i0", "i3", "i4", "i6", "i9"]


@pytest.mark.parametrize("selection", [None, "correct"], ids=["default", "correct"])
def test_correct_keeps_exactly_the_images_with_a_person_and_labels_them(root, selection):
    options = {} if selection is None else {"human_parts_selection": selection}
    parts_only = PascalContext(root, "train", tasks=["human_parts"], indices=CLIENT, **options)
    assert parts_only.ids == CORRECT_PARTS_ONLY
    assert parts_only.split_indices == [3, 6, 9]
    assert labelled(parts_only) == dict.fromkeys(CORRECT_PARTS_ONLY, True)
    multi = PascalContext(root, "train", tasks=["semseg", "human_parts"], indices=CLIENT, **options)
    assert multi.ids == [IDS[k] for k in CLIENT]
    assert labelled(multi) == {i: i in PEOPLE for i in multi.ids}
    shuffled = PascalContext(root, "train", tasks=["human_parts"], indices=SHUFFLED, **options)
    assert shuffled.ids == ["i3", "i9", "i0"]  # the order of indices, the images with people


def test_public_parts_only_client_keeps_the_images_at_the_flagged_positions(root):
    ds = PascalContext(root, "train", tasks=["human_parts"], indices=CLIENT, human_parts_selection="public")
    assert ds.ids == PUBLIC_PARTS_ONLY
    assert ds.split_indices == [2, 6, 8]
    assert labelled(ds) == {"i2": False, "i6": True, "i8": False}
    assert [ds[k]["meta"]["id"] for k in range(len(ds))] == PUBLIC_PARTS_ONLY
    # the number kept is sum(FLAGS[:n]) whatever the part; which images, the order of indices
    shuffled = PascalContext(
        root, "train", tasks=["human_parts"], indices=SHUFFLED, human_parts_selection="public"
    )
    assert shuffled.ids == SHUFFLED_PUBLIC_PARTS_ONLY
    assert labelled(shuffled) == {"i8": False, "i0": True}


@pytest.mark.parametrize("tasks", [["semseg", "human_parts"], ["human_parts", "sal", "normals", "edge"]])
def test_public_multi_task_client_keeps_every_image_and_labels_the_flagged_positions(root, tasks):
    ds = PascalContext(root, "train", tasks=tasks, indices=CLIENT, human_parts_selection="public")
    assert ds.ids == [IDS[k] for k in CLIENT]
    assert labelled(ds) == {i: i in PUBLIC_LABELLED for i in ds.ids}
    # the other tasks are untouched
    correct = PascalContext(root, "train", tasks=tasks, indices=CLIENT)
    for k in range(len(ds)):
        for task in (t for t in tasks if t != "human_parts"):
            np.testing.assert_array_equal(ds[k][task], correct[k][task])


def test_public_relabelling_never_changes_a_shared_cached_sample(root):
    """The label is replaced by position, after the cache: a correct dataset reading the same
    cache still sees i3's own parts."""
    from fedmtl.data.cache import SampleCache

    cache = SampleCache(1 << 24)
    tasks = ["semseg", "human_parts"]
    public = PascalContext(root, "train", tasks, indices=CLIENT, human_parts_selection="public", cache=cache)
    correct = PascalContext(root, "train", tasks, indices=CLIENT, cache=cache)
    assert (public[1]["human_parts"] == IGNORE).all()  # i3, position 1, FLAGS[1] = 0
    np.testing.assert_array_equal(correct[1]["human_parts"], person_label())
    assert (public[1]["human_parts"] == IGNORE).all()


@pytest.mark.parametrize("tasks", [["human_parts"], ["semseg", "human_parts"]])
def test_without_indices_both_selections_agree_as_the_public_validation_sets_do(root, tasks):
    """The public code builds validation sets without dataidxs: position k is split image k."""
    for split in ("train", "val"):
        public = PascalContext(root, split, tasks=tasks, human_parts_selection="public")
        correct = PascalContext(root, split, tasks=tasks)
        assert public.ids == correct.ids
        assert labelled(public) == labelled(correct)
    assert PascalContext(root, "val", tasks=["human_parts"], human_parts_selection="public").ids == [
        "i9", "i6", "i4", "i3", "i0"
    ]  # fmt: skip


def test_build_dataset_passes_the_selection_to_a_dataset_with_human_parts(root, data_root):
    ds = build_dataset(
        "pascal_context", root, "train", tasks=["human_parts"], indices=CLIENT, human_parts_selection="public"
    )
    assert ds.ids == PUBLIC_PARTS_ONLY
    assert build_dataset("pascal_context", root, "train", tasks=["human_parts"], indices=CLIENT).ids == (
        CORRECT_PARTS_ONLY
    )
    # NYUD-v2 has no human_parts: the option does not reach it
    assert len(build_dataset("nyud", data_root, "val", human_parts_selection="public")) == 4


def test_the_engine_builds_client_datasets_with_the_configured_selection(root):
    from fedmtl.federated.clients import Clients

    spec = SimpleNamespace(dataset="pascal_context", tasks=("human_parts",), train_indices=CLIENT)
    for selection, expected in (("public", PUBLIC_PARTS_ONLY), ("correct", CORRECT_PARTS_ONLY)):
        cfg = SimpleNamespace(data=DataConfig(root=str(root), human_parts_selection=selection), seed=0)
        clients = SimpleNamespace(
            cfg=cfg, spec=lambda i: spec, img_size=lambda i: (H, W), _samples=None, _datasets={}
        )
        assert Clients.dataset(clients, 0, "train").ids == expected
        assert Clients.dataset(clients, 0, "val").ids == ["i9", "i6", "i4", "i3", "i0"]


def test_a_bad_selection_is_refused_naming_the_field_the_values_and_the_fix(root):
    assert CONFIG_SELECTIONS == HUMAN_PARTS_SELECTIONS == ("correct", "public")
    assert DataConfig().human_parts_selection == "correct"
    with pytest.raises(ValueError) as err:
        DataConfig(human_parts_selection="paper")
    message = str(err.value)
    assert message.startswith("data.human_parts_selection must be correct or public, got 'paper': ")
    assert "public reproduces the public FedHCA² loader's" in message and "\n" not in message
    with pytest.raises(ValueError, match="human_parts_selection must be one of correct, public, got 'paper'"):
        PascalContext(root, "train", tasks=["human_parts"], human_parts_selection="paper")


def test_public_refuses_more_indices_than_the_split_has_flags(root):
    with pytest.raises(ValueError, match="the train split has only 10; list each image once"):
        PascalContext(root, "train", tasks=["human_parts"], indices=[0] * 11, human_parts_selection="public")


def test_fit_help_describes_the_option(capsys):
    from fedmtl.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--data.human_parts_selection HUMAN_PARTS_SELECTION which PASCAL-Context training images" in help_text
    )
    assert "(type: str, default: correct)" in help_text


def test_the_module_docstring_no_longer_claims_the_public_code_does_it_correctly():
    doc = " ".join(pascal_context.__doc__.split())
    assert "as the public code does" not in doc
    assert '"public": the public loader\'s selection' in doc
