"""Pretrained weights and checkpoint files: the right file loads, a wrong one is one clear line.

Weights files are built here with ``torch.save`` from timm models of DEFAULT_BACKBONE (fast),
plus one Swin-T file, whose features body names its tensors differently from the timm
classification model the file comes from.
"""

import json
import pickle

import pytest
import safetensors.torch
import timm
import torch
import yaml

from fedmtl.federated.store import atomic_save, safe_load
from fedmtl.models import DEFAULT_BACKBONE, MultiTaskModel, create_encoder


def _classifier_state_dict(seed: int = 0, name: str = DEFAULT_BACKBONE) -> dict[str, torch.Tensor]:
    """What a user downloads: the timm classification model's state dict (with head.fc)."""
    torch.manual_seed(seed)
    return timm.create_model(name).state_dict()


def _assert_loaded(encoder, source: dict[str, torch.Tensor]) -> None:
    body = encoder.body.state_dict()
    assert set(body) <= set(source)
    for key, value in body.items():
        assert torch.equal(value, source[key]), key


def test_a_classifier_state_dict_loads_strictly_and_fills_every_encoder_tensor(tmp_path, capsys):
    """The classifier head in the file is an expected extra for a features-only body, not a
    mismatch; every encoder tensor must then be the file's, and a strict load says nothing."""
    source = _classifier_state_dict()
    assert "head.fc.weight" in source
    path = tmp_path / "regnet.pth"
    torch.save(source, path)
    _assert_loaded(create_encoder(pretrained_file=path), source)
    assert capsys.readouterr() == ("", "")


def test_the_encoder_body_state_dict_loads_too(tmp_path):
    """A file saved from ``encoder.body.state_dict()`` (no head) is a complete state dict."""
    source = create_encoder().body.state_dict()
    path = tmp_path / "body.pt"
    torch.save(source, path)
    _assert_loaded(create_encoder(pretrained_file=path), source)


@pytest.mark.parametrize("wrapper", ["state_dict", "model"])
def test_a_training_checkpoint_wrapping_a_ddp_state_dict_loads(tmp_path, wrapper):
    """Checkpoints keep the weights under "state_dict" or "model" next to other entries, and
    DataParallel/DDP prefix every name with "module."."""
    source = _classifier_state_dict()
    path = tmp_path / "checkpoint.bin"
    torch.save({"epoch": 90, wrapper: {f"module.{k}": v for k, v in source.items()}}, path)
    _assert_loaded(create_encoder(pretrained_file=path), source)


def test_a_safetensors_file_loads(tmp_path):
    source = _classifier_state_dict()
    path = tmp_path / "regnet.safetensors"
    safetensors.torch.save_file(source, path)
    _assert_loaded(create_encoder(pretrained_file=path), source)


def test_swin_classifier_weights_load_into_its_features_body_at_paper_size(tmp_path):
    """timm's features-only Swin names its stages layers_0..3 where the classification model
    (and so any downloaded file) says layers.0..3, and drops the final norm and the head."""
    source = _classifier_state_dict(name="swin_tiny_patch4_window7_224")
    path = tmp_path / "swin_t.pth"
    torch.save(source, path)
    body = create_encoder("swin_t", pretrained_file=path, img_size=(512, 512)).body.state_dict()
    assert len(body) == len(source) - 4  # norm.weight/bias, head.fc.weight/bias
    for key, value in body.items():
        assert torch.equal(value, source[key.replace("layers_", "layers.", 1)]), key


def _partial_file(tmp_path) -> tuple:
    """A regnet file with 2 tensors missing, 1 of the wrong shape and 1 from another model."""
    source = _classifier_state_dict()
    missing = ["stem.conv.weight", "s4.b1.conv1.conv.weight"]
    for key in missing:
        del source[key]
    source["s1.b1.conv2.conv.weight"] = torch.zeros(3, 3)
    source["decoder.proj.weight"] = torch.zeros(4)
    path = tmp_path / "partial.pth"
    torch.save(source, path)
    return path, source, missing


def test_strict_load_of_a_partial_file_names_the_file_the_counts_and_the_fix(tmp_path):
    path, _, _ = _partial_file(tmp_path)
    with pytest.raises(ValueError) as err:
        create_encoder(pretrained_file=path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and DEFAULT_BACKBONE in message
    total = len(create_encoder().body.state_dict())
    assert f"{total - 3} of {total} tensors match" in message
    assert "2 missing, 1 unexpected, 1 shape mismatches" in message
    assert "stem.conv.weight" in message and "s1.b1.conv2.conv.weight (3, 3)" in message
    assert "pretrained_strict: false" in message


def test_non_strict_load_takes_exactly_the_matching_tensors_and_reports_once(tmp_path, capsys):
    """The tensors that match are the file's, the others keep their random init, and one line
    (not timm's key dump) says so, once per process although every client builds a model."""
    path, source, missing = _partial_file(tmp_path)
    first = create_encoder(pretrained_file=path, pretrained_strict=False)
    second = create_encoder(pretrained_file=path, pretrained_strict=False)
    out, err = capsys.readouterr()
    total = len(first.body.state_dict())
    assert out == ""
    assert err.splitlines() == [
        f"pretrained weights: loaded {total - 3} of {total} tensors of {DEFAULT_BACKBONE} from {path} "
        f"(2 missing, 1 unexpected, 1 shape mismatches)"
    ]
    reference = _classifier_state_dict()  # the same seed: the values the file was made from
    not_loaded = [*missing, "s1.b1.conv2.conv.weight"]
    for encoder in (first, second):
        for key, value in encoder.body.state_dict().items():
            if key in not_loaded:
                assert not torch.equal(value, reference[key]), key
            else:
                assert torch.equal(value, source[key]), key


def test_the_multi_task_model_passes_pretrained_strict_to_its_encoder(tmp_path):
    path, source, _ = _partial_file(tmp_path)
    with pytest.raises(ValueError, match="pretrained_strict"):
        MultiTaskModel("nyud", ["depth"], pretrained_file=path)
    model = MultiTaskModel("nyud", ["depth"], pretrained_file=path, pretrained_strict=False)
    assert torch.equal(
        model.encoder.body.state_dict()["s2.b1.conv1.conv.weight"], source["s2.b1.conv1.conv.weight"]
    )


def test_weights_are_read_from_disk_once_per_file(tmp_path, monkeypatch):
    path = tmp_path / "regnet.pth"
    torch.save(_classifier_state_dict(), path)
    reads = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: reads.append(args) or load(*args, **kwargs))
    for _ in range(3):
        create_encoder(pretrained_file=path)
    assert len(reads) == 1


@pytest.mark.parametrize("strict", [True, False])
def test_another_models_weights_are_an_error_even_non_strict(tmp_path, strict):
    """Nothing matching is certainly the wrong file, never a silent random init."""
    path = tmp_path / "resnet18.pth"
    torch.save(_classifier_state_dict(name="resnet18"), path)
    with pytest.raises(
        ValueError, match=f"{path}: none of its 122 tensors fits backbone '{DEFAULT_BACKBONE}'"
    ):
        create_encoder(pretrained_file=path, pretrained_strict=strict)


def _write_yaml(path):
    path.write_text(yaml.safe_dump({"model": {"backbone": DEFAULT_BACKBONE}, "rounds": 3}))


def _write_json(path):
    path.write_text(json.dumps({"model": {"backbone": DEFAULT_BACKBONE}}))


@pytest.mark.parametrize(
    "name, write, problem",
    [
        ("config.yaml", _write_yaml, "it looks like text"),
        ("weights.pth", _write_yaml, "it looks like text"),
        ("config.json", _write_json, "it looks like text"),
        ("tensors.pth", lambda p: torch.save([torch.zeros(2)], p), "it holds a list"),
        ("list.pkl", lambda p: p.write_bytes(pickle.dumps([1, 2])), "torch cannot read it"),
        (
            "settings.pt",
            lambda p: torch.save({"lr": 0.1, "epochs": 3}, p),
            "it holds a dict whose entry 'lr' is a float",
        ),
        ("empty.pt", lambda p: torch.save({}, p), "it holds an empty dict"),
        ("text.safetensors", _write_json, "safetensors cannot read it"),
    ],
)
def test_a_file_that_is_not_a_state_dict_is_a_one_line_error(tmp_path, name, write, problem):
    path = tmp_path / name
    write(path)
    before = path.read_bytes()
    with pytest.raises(ValueError) as err:
        create_encoder(pretrained_file=path)
    message = str(err.value)
    assert "\n" not in message
    assert f"{path} is not a PyTorch/safetensors state dict ({problem}" in message
    assert "torch.save(model.state_dict(), PATH)" in message
    assert path.read_bytes() == before


def test_a_missing_weights_file_keeps_its_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pth.*cannot be downloaded"):
        create_encoder(pretrained_file=tmp_path / "nope.pth")


def test_safe_load_reads_back_what_atomic_save_wrote(tmp_path):
    state = {"round": 3, "weights": torch.arange(6.0)}
    atomic_save(state, tmp_path / "server.pt")
    loaded = safe_load(tmp_path / "server.pt")
    assert loaded["round"] == 3 and torch.equal(loaded["weights"], state["weights"])


def test_safe_load_of_a_truncated_checkpoint_names_it_and_leaves_it(tmp_path):
    path = tmp_path / "client_0001.pt"
    atomic_save({"model": {"w": torch.randn(1000)}, "epochs": 2}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = path.read_bytes()
    with pytest.raises(ValueError) as err:
        safe_load(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is corrupt, truncated or not a PyTorch checkpoint (")
    assert "start a new run" in message
    assert path.read_bytes() == before


def test_safe_load_of_a_text_file_names_it(tmp_path):
    path = tmp_path / "server.pt"
    _write_yaml(path)
    with pytest.raises(
        ValueError, match=f"^{path} is a text file, not a PyTorch checkpoint; it cannot be loaded"
    ):
        safe_load(path)


def test_safe_load_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'server.pt'} does not exist"):
        safe_load(tmp_path / "server.pt")
