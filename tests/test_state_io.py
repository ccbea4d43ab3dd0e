"""What every client costs a round, done in few operations: a state packed into a few buffers
reads back as it was; the batched module load and copy equal torch's own; the batched finite
check finds what the per-tensor one found."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedmtl.federated import packing
from fedmtl.federated.store import ClientStore, atomic_save, safe_load
from fedmtl.tensors import host_state, load_into


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(3, 4, generator=g), "bn.num_batches_tracked": torch.tensor(7)},
        "optimizer": {
            "state": {"w": {"exp_avg": torch.randn(3, 4, generator=g), "step": torch.tensor(2.0)}},
            "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": ["w"], "amsgrad": False}],
        },
        "scheduler": None,
        "epochs_done": 3,
        "personal": {
            "mask": torch.tensor([True, False]),
            "empty": torch.zeros(0, 5),
            4: "int key",
            "@odd": float("inf"),
            "half": torch.ones(2, dtype=torch.bfloat16),
            "nan": float("nan"),
        },
    }


def _same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_a_packed_state_reads_back_equal_with_its_types_keys_and_dtypes(tmp_path):
    state = _state()
    packed = packing.pack(state)
    assert set(packed["buffers"]) == {"float32", "int64", "bool", "bfloat16"}  # one buffer per dtype
    atomic_save(packed, tmp_path / "client_0000.pt")
    _same(safe_load(tmp_path / "client_0000.pt"), state)  # tuples stay tuples, 4 stays an int key


def test_a_disk_store_writes_packed_files_and_reads_them_back(tmp_path):
    store = ClientStore("disk", tmp_path)
    state = _state()
    store.put(3, state)
    raw = torch.load(tmp_path / "client_0003.pt", weights_only=True)
    assert packing.is_packed(raw)
    _same(store.get(3), state)
    assert "optimizer" in store.get(3) and store.get(3, params_only=True)["optimizer"] is None


def test_unpacked_tensors_are_disjoint_views(tmp_path):
    out = packing.unpack(packing.pack({"a": torch.zeros(3), "b": torch.zeros(2)}))
    out["a"].add_(1)
    assert torch.equal(out["b"], torch.zeros(2))


def test_a_state_holding_something_else_is_refused():
    with pytest.raises(TypeError, match="tensors and plain values only, not object"):
        packing.pack({"x": object()})


def test_an_unpacked_file_written_before_packing_still_loads(tmp_path):
    state = {"model": {"w": torch.ones(2)}}
    torch.save(state, tmp_path / "old.pt")
    _same(safe_load(tmp_path / "old.pt"), state)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)


def test_load_into_equals_load_state_dict_and_host_state_copies():
    torch.manual_seed(0)
    source, a, b = _Net(), _Net(), _Net()
    source.bn.running_mean.fill_(0.5)
    source.bn.num_batches_tracked.fill_(9)
    state = host_state(source)
    a.load_state_dict(state)
    load_into(b, state)
    _same(host_state(a), host_state(b))
    state["conv.weight"].zero_()  # a copy: the source is untouched
    assert source.conv.weight.abs().sum() > 0


def test_load_into_a_mismatched_state_raises_torchs_error():
    state = host_state(_Net())
    del state["bn.running_var"]
    with pytest.raises(RuntimeError, match="Missing key"):
        load_into(_Net(), state)
    state = host_state(_Net())
    state["conv.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_into(_Net(), state)


def test_the_models_have_no_load_hooks_that_load_into_would_skip():
    """load_into copies tensors; a module with its own load hooks would need load_state_dict."""
    from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel

    for backbone in (DEFAULT_BACKBONE, "swin_t"):
        model = MultiTaskModel("nyud", ("semseg", "depth"), backbone=backbone, img_size=(64, 64))
        for module in model.modules():
            assert not module._load_state_dict_pre_hooks and not module._load_state_dict_post_hooks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_a_nan_or_inf_in_any_dtype_and_passes_huge_finite_values(dtype, bad):
    from fedmtl.federated.health import all_finite

    big = torch.finfo(dtype).max
    tensors = [torch.full((3, 3), big, dtype=dtype), torch.tensor(5), torch.ones(2, dtype=torch.float64)]
    assert all_finite(tensors) and all_finite([])  # max² overflows; max · 0 does not
    broken = torch.ones(4, dtype=dtype)
    broken[2] = bad
    assert not all_finite([*tensors, broken])
