"""FlatLayout: modules to flat vectors and back, parameters only, layers from module structure."""

import pytest
import torch
from torch import nn

from fedmtl.aggregation import FlatLayout
from fedmtl.models import FCNDecoder

DTYPES = [torch.float32, torch.float64]
FCN_LAYERS = ["projections.0", "projections.1", "projections.2", "projections.3", "fuse", "norm"]


def _tiny(dtype=torch.float32) -> nn.Sequential:
    """Linear(2 -> 1) then BatchNorm1d(1): 5 parameters in 2 layers, plus BN buffers."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1)).to(dtype)


def _set(module: nn.Module, values: dict[str, list]) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.tensor(values[name]))


TINY_VALUES = {"0.weight": [[1.0, 2.0]], "0.bias": [3.0], "1.weight": [4.0], "1.bias": [5.0]}


def test_layout_of_a_tiny_module_is_parameters_in_named_parameters_order():
    layout = FlatLayout.from_module(_tiny())
    assert layout.names == ("0.weight", "0.bias", "1.weight", "1.bias")
    assert layout.shapes == ((1, 2), (1,), (1,), (1,))
    assert layout.numels == (2, 1, 1, 1)
    assert layout.offsets == (0, 2, 3, 4)
    assert layout.numel == 5
    assert layout.dtypes == (torch.float32,) * 4
    assert layout.tensor_layers == ("0", "0", "1", "1")
    assert layout.layers == ("0", "1")


@pytest.mark.parametrize("dtype", DTYPES)
def test_flatten_concatenates_in_order_and_unflatten_inverts_it(dtype):
    module = _tiny(dtype)
    _set(module, TINY_VALUES)
    layout = FlatLayout.from_module(module)
    flat = layout.flatten(module)
    assert flat.dtype == dtype and flat.shape == (5,)
    assert flat.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert not flat.requires_grad
    back = layout.unflatten(flat)
    assert list(back) == list(layout.names)
    for name, p in module.named_parameters():
        assert back[name].shape == p.shape
        torch.testing.assert_close(back[name], p.detach(), rtol=0, atol=0)


def test_unflatten_returns_views_and_keeps_leading_dimensions():
    layout = FlatLayout.from_module(_tiny())
    stack = torch.arange(10.0).reshape(2, 5)
    views = layout.unflatten(stack)
    assert views["0.weight"].tolist() == [[[0.0, 1.0]], [[5.0, 6.0]]]
    assert views["1.bias"].tolist() == [[4.0], [9.0]]
    views["0.bias"].fill_(-1.0)
    assert stack[:, 2].tolist() == [-1.0, -1.0]
    assert [s.tolist() for s in layout.split(stack[0])] == [[0.0, 1.0], [-1.0], [3.0], [4.0]]


def test_flatten_of_a_mapping_ignores_buffers_and_other_extra_keys():
    module = _tiny()
    _set(module, TINY_VALUES)
    layout = FlatLayout.from_module(module)
    state = module.state_dict()
    assert "1.running_mean" in state
    assert layout.flatten(state).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert layout.flatten(state, dtype=torch.float64).dtype == torch.float64


def test_buffers_are_not_in_the_layout():
    decoder = FCNDecoder([8, 16, 32, 64], 8)
    layout = FlatLayout.from_module(decoder)
    buffers = {name for name, _ in decoder.named_buffers()}
    assert "norm.running_mean" in buffers
    assert not buffers & set(layout.names)
    assert layout.numel == sum(p.numel() for p in decoder.parameters())


def test_layers_of_an_fcn_decoder_are_its_six_parameterised_modules():
    decoder = FCNDecoder([8, 16, 32, 64], 8)
    layout = FlatLayout.from_module(decoder)
    assert list(layout.layers) == FCN_LAYERS
    owner = dict(zip(layout.names, layout.tensor_layers))
    assert owner["projections.0.weight"] == owner["projections.0.bias"] == "projections.0"
    assert owner["projections.3.weight"] == "projections.3"
    assert owner["fuse.weight"] == owner["fuse.bias"] == "fuse"
    assert owner["norm.weight"] == owner["norm.bias"] == "norm"
    # Per-layer element counts and sums agree with the modules themselves.
    modules = dict(decoder.named_modules())
    counts = layout.layer_sum(torch.ones(layout.numel, dtype=torch.float64))
    assert counts.tolist() == [sum(p.numel() for p in modules[name].parameters()) for name in FCN_LAYERS]
    flat = layout.flatten(decoder).double()
    expected = [sum(p.detach().double().sum() for p in modules[name].parameters()) for name in FCN_LAYERS]
    torch.testing.assert_close(layout.layer_sum(flat), torch.stack(expected))


def test_layer_and_tensor_reductions_batch_over_rows():
    layout = FlatLayout.from_module(_tiny())
    assert layout.tensor_index().tolist() == [0, 0, 1, 2, 3]
    assert layout.layer_index().tolist() == [0, 0, 0, 1, 1]
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0]])
    assert layout.layer_sum(x).tolist() == [[6.0, 9.0], [60.0, 90.0]]
    assert layout.tensor_sum(x).tolist() == [[3.0, 3.0, 4.0, 5.0], [30.0, 30.0, 40.0, 50.0]]
    # Per-layer dot products of every pair of rows in one op: [2, 2, layers].
    dots = layout.layer_sum(x[:, None, :] * x[None, :, :])
    assert dots[0, 1].tolist() == [1 * 10 + 2 * 20 + 3 * 30, 4 * 40 + 5 * 50]


def test_a_shared_parameter_is_laid_out_once_under_its_first_owner():
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    second.weight = first.weight
    layout = FlatLayout.from_module(nn.Sequential(first, second))
    assert layout.names == ("0.weight", "0.bias", "1.bias")
    assert layout.tensor_layers == ("0", "0", "1")


@pytest.mark.parametrize("dtype", DTYPES)
def test_assign_copies_into_parameters_in_place_and_leaves_buffers(dtype):
    module = _tiny(dtype)
    layout = FlatLayout.from_module(module)
    params_before = {name: p for name, p in module.named_parameters()}
    pointers = {name: p.data_ptr() for name, p in params_before.items()}
    module.get_submodule("1").running_mean.fill_(7.0)
    vector = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    layout.assign(module, vector)
    for name, p in module.named_parameters():
        assert p is params_before[name] and p.data_ptr() == pointers[name]
        assert p.dtype == dtype and p.requires_grad and p.grad_fn is None
    assert layout.flatten(module).tolist() == vector.tolist()
    assert module.get_submodule("1").running_mean.tolist() == [7.0]
    vector.fill_(0.0)  # the module holds copies, not views of the vector
    assert layout.flatten(module).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_stack_and_layout_equality_across_modules_of_one_structure():
    a, b = FCNDecoder([8, 16, 32, 64], 8), FCNDecoder([8, 16, 32, 64], 8)
    layout = FlatLayout.from_module(a)
    assert FlatLayout.from_module(b) == layout
    assert FlatLayout.from_module(FCNDecoder([8, 16, 32, 64], 4)) != layout
    stack = layout.stack([a, b])
    assert stack.shape == (2, layout.numel)
    torch.testing.assert_close(stack[1], layout.flatten(b))


def test_mismatches_are_clear_errors():
    module = _tiny()
    layout = FlatLayout.from_module(module)
    with pytest.raises(KeyError, match=r"missing tensors of the layout: \['1.bias'\]"):
        layout.flatten({k: v for k, v in module.state_dict().items() if k != "1.bias"})
    with pytest.raises(KeyError, match="parameters the layout does not"):
        layout.flatten(nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1), nn.Linear(1, 1)))
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(1, 3\); the layout says \(1, 2\)"):
        layout.flatten(nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1)))
    with pytest.raises(ValueError, match=r"\[\.\.\., 5\]"):
        layout.unflatten(torch.zeros(6))
    with pytest.raises(ValueError, match="one flat vector"):
        layout.assign(module, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="no parameters"):
        FlatLayout.from_module(nn.ReLU())
    with pytest.raises(ValueError, match="unique"):
        FlatLayout(names=("a", "a"), shapes=((1,), (1,)), dtypes=(torch.float32,) * 2, tensor_layers=("", ""))
