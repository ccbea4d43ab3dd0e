"""Encoders: any timm model as a 4-scale feature extractor (strides 4, 8, 16, 32).

The paper uses ImageNet-pretrained Swin-T/S/B; ``PAPER_BACKBONES`` maps its short names to
timm's. As in the public FedHCA² code (mmsegmentation's Swin), these encoders pass each of their
four stage outputs through its own LayerNorm over channels (``Encoder.norms``, mmseg's
``norm0..norm3``): 27,520,698 encoder parameters for Swin-T, timm's 27,517,818 plus
2·(96+192+384+768). Other timm models get no such norms.

Nothing can be downloaded here, so pretrained weights come from a local file: a
``.pth``/``.pt``/``.bin`` (``torch.save``) or ``.safetensors`` state dict of the timm model, or
an mmsegmentation Swin checkpoint (e.g. the UperNet Swin-T ADE20K file the public code starts
from; converted by ``fedmtl.models.mmseg_swin``), read and matched here
(:func:`read_state_dict`, :func:`load_pretrained`), never by timm, so a wrong file is one clear
error instead of a silent random init.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from fedmtl.models.mmseg_swin import (
    MMSEG_PREFIX,
    fedmtl_key_to_mmseg,
    from_mmseg_swin,
    is_mmseg_swin,
    mmseg_key_map,
)

PAPER_BACKBONES = {
    "swin_t": "swin_tiny_patch4_window7_224",
    "swin_s": "swin_small_patch4_window7_224",
    "swin_b": "swin_base_patch4_window7_224",
}
# Small enough to train a handful of clients on a laptop CPU in minutes.
DEFAULT_BACKBONE = "regnetx_002"
# How Swin's shifted windows meet a map whose sides are not multiples of the window: see
# create_encoder's ``swin_windows`` and fedmtl.models.swin_windows.
SwinWindows = Literal["mmseg", "timm"]
SWIN_WINDOWS: tuple[SwinWindows, ...] = ("mmseg", "timm")

_SAVE_HINT = "save the weights with torch.save(model.state_dict(), PATH) or safetensors.torch.save_file"
# Tensors read from weights files, by (path, mtime, size): the engine builds a model per client.
_FILES: dict[tuple[str, int, int], dict[str, torch.Tensor]] = {}
_REPORTED: set[tuple[tuple[str, int, int], str]] = set()  # (file, backbone) whose load line was printed
_CLASSIFIER_KEYS: dict[tuple[str, str], frozenset[str]] = {}


class Encoder(nn.Module):
    """Wraps a timm ``features_only`` model; returns NCHW features, finest first.

    ``stage_norms``: pass each feature map through its own ``nn.LayerNorm(channels)`` over the
    channel dimension (``self.norms[i]``; an empty ModuleList otherwise). mmsegmentation's Swin,
    which the public FedHCA² code uses, does this with its ``norm0..norm3`` before the decoders;
    timm's ``features_only`` Swin applies no norm to any stage output (its classifier's final
    ``norm`` is dropped with the head).
    """

    def __init__(self, body: nn.Module, stage_norms: bool = False) -> None:
        super().__init__()
        self.body = body
        self.channels: list[int] = list(body.feature_info.channels())
        self.reductions: list[int] = list(body.feature_info.reduction())
        # Transformers (Swin) hand out channels-last maps; the decoders take NCHW.
        self._channels_last = str(getattr(body, "output_fmt", "NCHW")).endswith("NHWC")
        self.norms = nn.ModuleList(nn.LayerNorm(c) for c in self.channels) if stage_norms else nn.ModuleList()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = list(self.body(x))
        channels_last = self._channels_last
        if self.norms:  # over channels, on channels-last maps (as mmseg, before its permute)
            if not channels_last:
                features, channels_last = [f.permute(0, 2, 3, 1) for f in features], True
            features = [norm(f) for norm, f in zip(self.norms, features, strict=True)]
        if channels_last:
            features = [f.permute(0, 3, 1, 2) for f in features]
        return features


def create_encoder(
    name: str = DEFAULT_BACKBONE,
    pretrained_file: str | Path | None = None,
    img_size: tuple[int, int] | None = None,
    pretrained_strict: bool = True,
    stage_norms: bool | None = None,
    swin_windows: SwinWindows = "mmseg",
    **timm_kwargs,
) -> Encoder:
    """Build the encoder of a client model.

    ``name`` is a timm model name or one of ``PAPER_BACKBONES``; ``img_size`` is passed to
    models that fix their input size at construction (Swin), e.g. (512, 512) or (448, 576).
    ``pretrained_file`` and ``pretrained_strict``: see :func:`load_pretrained`.
    ``stage_norms``: one LayerNorm per stage output (see :class:`Encoder`); None (default) means
    True for the paper's Swin models (``PAPER_BACKBONES``, by short or timm name), False for others.

    ``swin_windows``: the window order of a Swin's shifted-window blocks (timm's
    ``swin_transformer`` models: swin_t/s/b and the rest of that family; see
    fedmtl.models.swin_windows). ``"mmseg"`` (default): as mmsegmentation's Swin, the paper's
    encoder whatever the weights: pad to a multiple of the window, then shift; full 7×7 windows
    and shift 3 at every stage and image size, so the relative-position tables have mmseg's
    shapes at any ``img_size``. ``"timm"``: timm's order (shift, then pad), which also shrinks
    the windows (and their tables) for stages whose map is smaller than 7 (below 224 pixels a
    side) and drops the shift where the map is no larger than 7 (the last stage at 224);
    fedmtl's behaviour before the option existed. Same parameter names either way. The two
    agree on a stage whose map sides are multiples of 7 and larger than 7 (224×224: the first
    three stages); at the paper's sizes (maps 128…16, 112×144…14×18) every stage differs.
    Why mmseg's by default: the public FedHCA² encoder is mmseg's Swin and its checkpoints were
    trained with that order; its mask also matches what was shifted, while in timm's order
    tokens that wrapped around share a region with the opposite edge. Other backbones have no
    shifted windows and ignore the option (a CNN is the same model under both values).
    """
    import timm  # here, not at the top: timm (and torchvision) would slow `fedmtl fit --help` by seconds

    timm_name = PAPER_BACKBONES.get(name, name)
    if not timm.is_model(timm_name):
        raise ValueError(
            f"unknown backbone {name!r}: not a timm model name nor one of {sorted(PAPER_BACKBONES)} "
            f"(list timm names with timm.list_models('pattern*'))"
        )
    if swin_windows not in SWIN_WINDOWS:
        raise ValueError(f"swin_windows must be one of {list(SWIN_WINDOWS)}, got {swin_windows!r}")
    kwargs = dict(timm_kwargs)
    if img_size is not None and "swin" in timm_name:
        kwargs["img_size"] = tuple(img_size)
    mmseg_windows = swin_windows == "mmseg" and timm.models.is_model_in_modules(
        timm_name, ["swin_transformer"]
    )
    if mmseg_windows:  # mmseg never clips a window to a small map nor drops its shift
        kwargs.setdefault("always_partition", True)
    if pretrained_file is not None:
        path = Path(pretrained_file).expanduser()
        if path.is_dir():
            raise ValueError(
                f"model.pretrained_file {str(path)!r} is a directory, not a weights file: pass the path of "
                f"the file itself (a state dict of {timm_name!r} saved with torch.save, or an mmsegmentation "
                "Swin checkpoint)"
            )
        if not path.is_file():
            raise FileNotFoundError(
                f"pretrained weights file {str(path)!r} does not exist. Weights cannot be downloaded at "
                f"run time: save the timm state dict of {timm_name!r} to a local file and pass its path, "
                f"or set pretrained_file to null to start from random weights."
            )
    body = timm.create_model(
        timm_name, pretrained=False, features_only=True, out_indices=(-4, -3, -2, -1), **kwargs
    )
    if mmseg_windows:
        from fedmtl.models.swin_windows import use_mmseg_windows  # imports timm: see above

        use_mmseg_windows(body)
    if stage_norms is None:
        stage_norms = timm_name in PAPER_BACKBONES.values()
    encoder = Encoder(body, stage_norms=stage_norms)
    if encoder.reductions != [4, 8, 16, 32]:
        raise ValueError(
            f"backbone {name!r} gives features at strides {encoder.reductions}; the FCN decoders need "
            f"strides [4, 8, 16, 32] (most timm CNNs and Swin do)"
        )
    if pretrained_file is not None:
        load_pretrained(
            encoder, pretrained_file, timm_name, _classifier_keys(timm_name, kwargs), pretrained_strict
        )
    return encoder


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, read once per process (cached by path and mtime).

    Takes a plain state dict or one wrapped under ``"state_dict"`` or ``"model"`` (training
    checkpoints), drops a ``module.`` prefix (DataParallel/DDP); anything else is a ValueError.
    The cached tensors are only ever copied into models, never handed out to be trained.
    """
    path = Path(path).expanduser().resolve()
    key = _file_key(path)
    if key not in _FILES:
        tensors = _state_dict_of(_read(path), path)
        _FILES.clear()  # one file per run; do not hold a second copy of the weights
        _FILES[key] = tensors
    return _FILES[key]


def _read(path: Path) -> object:
    if path.suffix == ".safetensors":
        try:
            from safetensors import SafetensorError
            from safetensors.torch import load_file
        except ImportError:
            raise ValueError(
                f"pretrained weights file {path} is a .safetensors file but the safetensors package is "
                f"not installed: pip install safetensors, or save the weights with torch.save"
            ) from None
        try:
            return load_file(path, device="cpu")
        except SafetensorError as err:
            raise ValueError(_not_a_state_dict(path, f"safetensors cannot read it: {err}")) from err
    try:
        with warnings.catch_warnings():  # e.g. torch's note on pickle protocols: the error says enough
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises anything from EOFError to UnpicklingError on a bad file
        what = (
            "it looks like text (YAML/JSON?)"
            if _looks_like_text(path)
            else f"torch cannot read it: {_reason(err)}"
        )
        raise ValueError(_not_a_state_dict(path, what)) from err


def _state_dict_of(obj: object, path: Path) -> dict[str, torch.Tensor]:
    def is_state_dict(x: object) -> bool:
        return isinstance(x, Mapping) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in x.items())

    if isinstance(obj, Mapping) and not is_state_dict(obj):
        obj = next((obj[k] for k in ("state_dict", "model") if is_state_dict(obj.get(k))), obj)
    if not isinstance(obj, Mapping):
        raise ValueError(_not_a_state_dict(path, f"it holds a {type(obj).__name__}, not a dict of tensors"))
    if not is_state_dict(obj):
        bad = next(k for k, v in obj.items() if not (isinstance(k, str) and torch.is_tensor(v)))
        raise ValueError(
            _not_a_state_dict(
                path,
                f"it holds a dict whose entry {bad!r} is a {type(obj[bad]).__name__}, not a tensor, and no "
                f"state dict under 'state_dict' or 'model'",
            )
        )
    if not obj:
        raise ValueError(_not_a_state_dict(path, "it holds an empty dict"))
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _not_a_state_dict(path: Path, what: str) -> str:
    return f"pretrained weights file {path} is not a PyTorch/safetensors state dict ({what}); {_SAVE_HINT}"


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(1024)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(head) and b"\0" not in head


def _reason(err: Exception) -> str:
    """One line from torch.load's error (its weights-only message is six lines of advice)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.endswith("WeightsUnpickler error:"):
            return lines[i + 1]
    text = (
        lines[0] if lines else {"EOFError": "the file ends early"}.get(type(err).__name__, type(err).__name__)
    )
    return text if len(text) <= 160 else text[:157] + "..."


def _classifier_keys(timm_name: str, kwargs: dict) -> frozenset[str]:
    """State-dict names of the full timm model (with its classifier), to tell the parts a
    ``features_only`` body drops (``head.fc``, Swin's final ``norm``) from foreign tensors.
    Built on the meta device: names and no memory."""
    import timm  # see create_encoder

    key = (timm_name, repr(sorted(kwargs.items())))
    if key not in _CLASSIFIER_KEYS:
        try:
            with torch.device("meta"):
                model = timm.create_model(timm_name, pretrained=False, **kwargs)
        except Exception:  # a model whose constructor needs real tensors (e.g. calls .tolist())
            model = timm.create_model(timm_name, pretrained=False, **kwargs)
        _CLASSIFIER_KEYS[key] = frozenset(model.state_dict())
    return _CLASSIFIER_KEYS[key]


def load_pretrained(
    encoder: Encoder,
    path: str | Path,
    backbone: str,
    model_keys: frozenset[str] = frozenset(),
    strict: bool = True,
) -> None:
    """Copy the tensors of weights file ``path`` into ``encoder`` (its ``features_only`` body
    and, for mmseg files, its stage norms).

    A timm-format file is the state dict of timm's classification model ``backbone`` or of the
    body itself: the two name a tensor the same way up to ``.`` vs ``_`` (timm's feature wrapper
    flattens Swin's ``layers.0`` into ``layers_0``). Tensors only the full model has
    (``model_keys`` minus the body: classifier, final norm) are expected and ignored. Such a file
    has no stage norms (``encoder.norms``): they keep their init (weight 1, bias 0), as mmseg's
    do when it starts its Swin from an ImageNet checkpoint, and are not counted.

    An mmsegmentation Swin file (``[backbone.]stages.<i>.blocks.`` keys, e.g. the UperNet
    checkpoint of the public FedHCA² code, weights possibly under ``state_dict``) is converted by
    ``fedmtl.models.mmseg_swin.from_mmseg_swin`` (key map, patch-merging reorder; heads and the
    ``relative_position_index`` buffers are ignored); its ``norm0..3`` fill ``encoder.norms``
    and count like every other tensor. Errors name the file's own (mmseg) keys.

    ``strict``: every encoder tensor (the stage norms only for mmseg files) must be in the file
    with its shape, else ValueError naming the missing, mismatched and unexpected keys.
    Not ``strict``: the tensors that match are loaded and one line on stderr says how many.
    Either way a file of which nothing matches is a ValueError.
    """
    path = Path(path).expanduser().resolve()
    tensors = read_state_dict(path)
    own = encoder.state_dict()
    file_tensors, file_name, prefix = tensors, {}, ""  # file_name: converted name -> the file's
    mmseg = is_mmseg_swin(tensors)
    if mmseg:
        prefix = MMSEG_PREFIX if any(k.startswith(MMSEG_PREFIX + "stages.") for k in tensors) else ""
        converted = from_mmseg_swin(file_tensors)
        file_name = {new.removeprefix("body."): old for old, new in mmseg_key_map(file_tensors).items()}
        tensors = {name.removeprefix("body."): tensor for name, tensor in converted.items()}
        optional: set[str] = set()
        layout, hint = " (mmsegmentation Swin layout)", f"an mmsegmentation checkpoint of {backbone!r}'s Swin"
    else:
        optional = {k for k in own if k.startswith("norms.")}
        layout, hint = "", f"the state dict of timm's {backbone!r}"

    def relative(name: str) -> str:  # body tensors by the body's own names, as files have them
        return name.removeprefix("body.")

    def shown(name: str) -> str:  # an encoder tensor as the file would name it
        return prefix + fedmtl_key_to_mmseg(name) if mmseg else relative(name)

    def canonical(name: str) -> str:
        return name.replace(".", "_")

    by_name = {canonical(relative(k)): k for k in own}
    if len(by_name) != len(own):  # two names differ only by "." vs "_": match exact names only
        by_name, canonical = {relative(k): k for k in own}, str
    ignored = {canonical(k) for k in model_keys} - by_name.keys()
    matched: dict[str, torch.Tensor] = {}
    unexpected, mismatched = [], []
    for name, tensor in tensors.items():
        target = by_name.get(canonical(name))
        if target is None:
            if canonical(name) not in ignored:
                unexpected.append(file_name.get(name, name))
        elif tensor.shape != own[target].shape:
            mismatched.append(
                (target, f"{file_name.get(name, name)} {tuple(tensor.shape)} vs {tuple(own[target].shape)}")
            )
        else:
            matched[target] = tensor
    shape_names = {target for target, _ in mismatched}
    # BatchNorm's step counter is not a weight: files converted from elsewhere often lack it.
    missing = [
        shown(k)
        for k in own
        if k not in matched
        and k not in shape_names
        and k not in optional
        and not k.endswith("num_batches_tracked")
    ]
    total = len(matched) + len(missing) + len(mismatched)
    counts = f"{len(missing)} missing, {len(unexpected)} unexpected, {len(mismatched)} shape mismatches"
    if not matched:
        examples = list(file_tensors)
        raise ValueError(
            f"pretrained weights file {path}{layout}: none of its {len(examples)} tensors fits backbone "
            f"{backbone!r} (it has e.g. {_examples(examples)}; the backbone has e.g. "
            f"{_examples([shown(k) for k in own])}); it holds another model's weights: pass {hint}, or "
            f"set pretrained_file to null"
        )
    if strict and (missing or mismatched):
        details = "; ".join(
            f"{label}: {_examples(names)}"
            for label, names in (
                ("missing", missing),
                ("shape mismatches", [text for _, text in mismatched]),
                ("unexpected", unexpected),
            )
            if names
        )
        raise ValueError(
            f"pretrained weights file {path}{layout} does not fit backbone {backbone!r}: {len(matched)} of "
            f"{total} tensors match ({counts}; {details}). Pass {hint}, or set "
            f"model.pretrained_strict: false to load only the matching tensors"
        )
    encoder.load_state_dict(matched, strict=False)  # what is not in `matched` was counted above
    report = (_file_key(path), backbone)
    if not strict and report not in _REPORTED:
        _REPORTED.add(report)
        print(
            f"pretrained weights: loaded {len(matched)} of {total} tensors of {backbone} from {path}{layout} "
            f"({counts})",
            file=sys.stderr,
        )


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)


def _examples(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
