"""The multi-task model: structure, shapes at small and paper sizes, weights from a file."""

import pytest
import torch
import torch.nn.functional as F

from fedmtl.aggregation.flat import parameter_layers
from fedmtl.models import FCNDecoder, MultiTaskModel, create_encoder
from fedmtl.tasks import get_task, multi_task_loss

PASCAL = ("semseg", "human_parts", "sal", "normals", "edge")
NYUD = ("semseg", "normals", "edge", "depth")


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    return MultiTaskModel("nyud", NYUD, backbone="resnet18")


def test_parameter_groups_come_from_modules_and_cover_the_model(small_model):
    groups = [small_model.encoder, *small_model.decoders.values(), *small_model.heads.values()]
    ids = [id(p) for g in groups for p in g.parameters()]
    assert len(ids) == len(set(ids)), "a parameter belongs to two groups"
    assert set(ids) == {id(p) for p in small_model.parameters()}
    assert list(small_model.decoders) == list(NYUD) == list(small_model.heads)


def test_decoder_has_the_six_layers_that_carry_one_beta_each(small_model):
    layers = parameter_layers(small_model.decoders["semseg"])
    assert list(layers) == [
        "projections.0",
        "projections.1",
        "projections.2",
        "projections.3",
        "fuse",
        "norm",
    ]
    assert isinstance(small_model.decoders["semseg"], FCNDecoder)


@pytest.mark.parametrize("size", [(64, 64), (72, 88)])
def test_outputs_have_the_input_size_and_task_channels(small_model, size):
    small_model.eval()
    with torch.no_grad():
        out = small_model(torch.randn(2, 3, *size))
    for task in NYUD:
        assert out[task].shape == (2, get_task(task).channels("nyud"), *size)


@pytest.mark.parametrize(
    "dataset, tasks, size", [("pascal_context", PASCAL, (512, 512)), ("nyud", NYUD, (448, 576))]
)
def test_swin_t_paper_model_at_paper_sizes(dataset, tasks, size):
    model = MultiTaskModel(dataset, tasks, backbone="swin_t", img_size=size).eval()
    n_encoder = sum(p.numel() for p in model.encoder.parameters())
    assert 27.4e6 < n_encoder < 27.6e6  # Swin-T without its classifier
    assert model.decoders[tasks[0]].embed_dim == 96
    with torch.no_grad():
        out = model(torch.randn(1, 3, *size))
    assert {t: tuple(o.shape) for t, o in out.items()} == {
        t: (1, get_task(t).channels(dataset), *size) for t in tasks
    }


@pytest.mark.parametrize("size", [(512, 512), (448, 576)])
def test_swin_t_encoder_has_the_public_codes_parameter_count(size):
    """timm's Swin-T body (27,517,818) plus one LayerNorm per stage, as mmseg's norm0..norm3:
    27,520,698, the public FedHCA² code's count, at any input size with mmseg's window order
    (the default); with ``swin_windows="timm"`` from 224 pixels a side up (smaller inputs shrink
    timm's relative-position tables: 64×64, 27,504,378)."""
    encoder = create_encoder("swin_t", img_size=size)
    assert sum(p.numel() for p in encoder.parameters()) == 27_520_698
    assert sum(p.numel() for p in encoder.body.parameters()) == 27_517_818
    assert [(n.normalized_shape, n.eps) for n in encoder.norms] == [((c,), 1e-5) for c in (96, 192, 384, 768)]
    assert [k for k in encoder.state_dict() if not k.startswith("body.")] == [
        f"norms.{i}.{p}" for i in range(4) for p in ("weight", "bias")
    ]
    assert "norm.weight" not in encoder.body.state_dict()  # timm's features body has no final norm


def test_other_timm_encoders_get_no_stage_norms():
    import timm

    from fedmtl.models import DEFAULT_BACKBONE

    encoder = create_encoder()
    body = timm.create_model(DEFAULT_BACKBONE, features_only=True, out_indices=(-4, -3, -2, -1))
    assert len(encoder.norms) == 0
    assert sum(p.numel() for p in encoder.parameters()) == sum(p.numel() for p in body.parameters())
    assert list(encoder.state_dict()) == [f"body.{k}" for k in body.state_dict()]


def test_stage_norms_can_be_asked_for_on_a_cnn_and_normalise_its_nchw_maps():
    torch.manual_seed(0)
    encoder = create_encoder("resnet18", stage_norms=True).eval()
    assert [n.normalized_shape for n in encoder.norms] == [(c,) for c in encoder.channels]
    with torch.no_grad():
        features = encoder(torch.randn(1, 3, 64, 64))
    for f, c in zip(features, encoder.channels, strict=True):
        assert f.shape[1] == c
        torch.testing.assert_close(f.mean(1), torch.zeros_like(f.mean(1)), rtol=0, atol=1e-5)
        torch.testing.assert_close(f.std(1, unbiased=False), torch.ones_like(f.mean(1)), rtol=0, atol=1e-3)


def test_swin_stage_outputs_are_normalised_over_channels_at_every_position():
    """With the norms at their init (weight 1, bias 0) every stage output has mean 0 and std 1
    over channels at every position, and is layer_norm of the body's raw (unnormalised) map."""
    torch.manual_seed(0)
    encoder = create_encoder("swin_t", img_size=(64, 64)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = encoder(x)
        raw = encoder.body(x)
    assert [tuple(f.shape) for f in features] == [
        (2, 96, 16, 16),
        (2, 192, 8, 8),
        (2, 384, 4, 4),
        (2, 768, 2, 2),
    ]
    for f, r in zip(features, raw, strict=True):
        torch.testing.assert_close(f.mean(1), torch.zeros_like(f.mean(1)), rtol=0, atol=1e-5)
        torch.testing.assert_close(f.std(1, unbiased=False), torch.ones_like(f.mean(1)), rtol=0, atol=1e-3)
        expected = F.layer_norm(r, r.shape[-1:]).permute(0, 3, 1, 2)  # r is channels-last
        torch.testing.assert_close(f, expected)
    assert (raw[1].std(-1) - 1).abs().max() > 0.1  # the body alone does not normalise


def test_pretrained_weights_load_from_a_local_file(tmp_path):
    source = create_encoder("resnet18")
    path = tmp_path / "resnet18.pth"
    torch.save(source.body.state_dict(), path)
    loaded = create_encoder("resnet18", pretrained_file=path)
    fresh = create_encoder("resnet18")
    key = "conv1.weight"
    assert torch.equal(loaded.body.state_dict()[key], source.body.state_dict()[key])
    assert not torch.equal(fresh.body.state_dict()[key], source.body.state_dict()[key])


def test_missing_weights_file_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.pth"
    with pytest.raises(FileNotFoundError, match="nope.pth.*cannot be downloaded"):
        create_encoder("resnet18", pretrained_file=missing)


def test_unknown_backbone_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backbone 'resnet_9000'"):
        create_encoder("resnet_9000")


def test_a_few_training_steps_reduce_the_multi_task_loss():
    torch.manual_seed(0)
    model = MultiTaskModel("pascal_context", ("semseg", "sal"), backbone="resnet18")
    images = torch.randn(2, 3, 64, 64)
    targets = {"semseg": torch.randint(0, 21, (2, 64, 64)), "sal": torch.randint(0, 2, (2, 64, 64))}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    values = []
    for _ in range(5):
        loss = multi_task_loss(model(images), targets, model.tasks)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        values.append(loss.item())
    assert values[-1] < values[0]


def test_a_channels_last_model_computes_what_the_contiguous_one_does():
    """Same weights, same outputs and gradients; only the memory layout (and so the float
    rounding of the kernels) differs. The layout survives moving and loading a state dict."""
    torch.manual_seed(0)
    plain = MultiTaskModel("nyud", NYUD)
    fast = MultiTaskModel("nyud", NYUD, channels_last=True)
    fast.load_state_dict(plain.state_dict())
    fast = fast.to("cpu")
    convs = [p for p in fast.parameters() if p.ndim == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    assert not all(p.is_contiguous() for p in convs)  # the layout really changed

    images = torch.randn(8, 3, 32, 32)
    with torch.no_grad():  # in eval mode: the batch-norm statistics of both models stay equal
        targets = {t: p for t, p in plain.eval()(images).items()}
    targets["semseg"] = targets["semseg"].argmax(1)
    targets["edge"] = (targets["edge"][:, 0] > 0).float()
    targets["depth"] = targets["depth"][:, 0].abs() + 0.5
    targets["normals"] = F.normalize(targets["normals"], dim=1)
    for model in (plain, fast):
        model.train()
        multi_task_loss(model(images), targets, NYUD)["total"].backward()
    plain.eval(), fast.eval()
    for task, out in plain(images).items():
        torch.testing.assert_close(fast(images)[task], out, atol=1e-5, rtol=1e-4)
    # All gradients together: a batch norm over the 1x1 maps of the last stage amplifies rounding
    # in its own few entries, the vector as a whole is the same.
    grads = [torch.cat([p.grad.flatten() for p in m.parameters()]) for m in (plain, fast)]
    assert (grads[1] - grads[0]).norm() <= 1e-4 * grads[0].norm()


def test_a_channels_last_model_flattens_and_is_assigned_as_the_contiguous_one():
    """The aggregators see the flat vector in the logical order whatever the layout, and the
    engine's write-back puts each value where it belongs."""
    from fedmtl.aggregation.flat import FlatLayout

    torch.manual_seed(0)
    plain = MultiTaskModel("nyud", NYUD)
    fast = MultiTaskModel("nyud", NYUD, channels_last=True)
    fast.load_state_dict(plain.state_dict())
    layout = FlatLayout.from_module(plain.encoder)
    assert FlatLayout.from_module(fast.encoder) == layout
    vector = layout.flatten(plain.encoder)
    torch.testing.assert_close(layout.flatten(fast.encoder), vector, atol=0, rtol=0)
    shifted = vector + torch.arange(vector.numel(), dtype=vector.dtype)
    layout.assign(plain.encoder, shifted)
    layout.assign(fast.encoder, shifted)
    for p, q in zip(plain.encoder.parameters(), fast.encoder.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=0, rtol=0)
    assert all(q.is_contiguous(memory_format=torch.channels_last) for q in fast.parameters() if q.ndim == 4)
