"""A ``data.train_size`` below the validation images' size names the field, the value, the
smallest size that works and why, and for synthetic data its own size and how to generate it
smaller (issue #37 item 3: it said "pass a larger size" and pointed at the real archives)."""

from __future__ import annotations

from fedmtl.federated.preflight import eval_size_error
from tests.helpers import TINY, fit_refused, tiny_config


def test_real_data_is_told_the_smallest_size_or_to_leave_it_unset():
    assert eval_size_error("nyud", (32, 32), (480, 640), {}) == (
        "data.train_size [32, 32]: nyud's validation images are 480x640, and evaluation pads images to "
        "data.train_size but never crops them, so it must be at least [480, 640]: use --data.train_size "
        "[480,640], or leave it unset for the dataset's own size"
    )


def test_the_demos_shrink_names_the_synthetic_sizes_and_how_to_generate_them_smaller(tmp_path, capsys):
    root = tmp_path / "data"
    synth = {d: {"num_train": 8, "num_val": 2, "size": [64, 64]} for d in ("pascal_context", "nyud")}
    config = tiny_config(tmp_path, root, data={**TINY["data"], "root": str(root), "synth": synth})
    *generating, line = fit_refused(config, tmp_path / "run", capsys)
    assert all(g.startswith("generating synthetic ") for g in generating), generating
    assert line == (
        "error: data.train_size [32, 32]: pascal_context's validation images are 64x64, and evaluation pads images "
        "to data.train_size but never crops them, so it must be at least [64, 64]: use --data.train_size "
        "[64,64]; or, as this data is synthetic (data.synth sizes: nyud [64, 64], pascal_context [64, 64]), "
        "generate it at that size: --data.synth.nyud.size [32,32] --data.synth.pascal_context.size [32,32] "
        "with a new --data.root (data already written there is not generated again)"
    )
