"""The typed scenario config that ``fedmtl fit`` reads.

The dataclasses below *are* the schema: jsonargparse reads YAML into them, checks every
type, lets any field be overridden on the command line (``--rounds 3``,
``--evaluation.every 2``) and prints the resolved config with ``--print_config``. Config
files state only what differs from these defaults.

Each field is described in its class's ``Attributes:`` section, which jsonargparse (through
docstring_parser) prints in ``fedmtl fit --help``. Each class's ``__post_init__`` checks the
ranges jsonargparse's types cannot express and raises one ValueError naming the field by its
config path and the fix, when the config is instantiated, before anything is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from jsonargparse import lazy_instance

from fedmtl.data.partition import Partitioner, Uniform
from fedmtl.methods import Local, Method
from fedmtl.models.backbone import DEFAULT_BACKBONE, SWIN_WINDOWS

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")
MIN_TRAIN_SIZE = 32  # the encoders' output stride: the deepest feature map is 1/32 of the image
MIN_SYNTH_SIZE = 16


def render_size(size: Sequence[int], scale: float) -> tuple[int, int]:
    """The (height, width) a synthetic scene of ``size`` is rendered at with ``render_scale``
    ``scale`` (``fedmtl.synth.resample`` scales it up to ``size``)."""
    return (max(1, int(round(size[0] * scale))), max(1, int(round(size[1] * scale))))


def render_scale_problem(size: Sequence[int], scale: float) -> str | None:
    """Why ``render_scale`` ``scale`` cannot render ``size`` (the end of a message that names
    the option), or None if it can: here, not in ``fedmtl.synth``, as the config checks it."""
    if not (isinstance(scale, int | float) and 0 < scale <= 1):
        return f"must be in (0, 1], got {scale!r} (1: render at the full size)"
    small = render_size(size, scale)
    if scale < 1 and min(small) < MIN_SYNTH_SIZE:
        return (
            f"{scale} renders {small[0]} x {small[1]} pixels for size {list(size)}, under "
            f"{MIN_SYNTH_SIZE} a side: raise it (1: render at the full size)"
        )
    return None


MAX_SEED = 2**32 - 1  # numpy's (and so Lightning's seed_everything) range
# = fedmtl.data.pascal_context.HUMAN_PARTS_SELECTIONS, not imported: the config module stays light
HUMAN_PARTS_SELECTIONS = ("correct", "public")
# = fedmtl.synth.SYNTH.names(), not imported: the config module stays light
SYNTH_DATASETS = ("cityscapes", "nyud", "pascal_context")


def _at_least(name: str, value: int, low: int, fix: str = "") -> None:
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value!r}{fix}")


def _positive(name: str, value: float, fix: str = "") -> None:
    if not (math.isfinite(value) and value > 0):  # not `value <= 0`: NaN must fail too
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}{fix}")


def _non_negative(name: str, value: float, fix: str = "") -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}{fix}")


def read_yaml(text: str, path: Any) -> Any:
    """The YAML document ``text`` (config file ``path``), refusing a key repeated in one mapping,
    at any depth (a client group's too): YAML loaders keep the last one silently, so one of the
    two values the file shows would be ignored. Raises ValueError naming the key, the file and
    both lines; yaml.YAMLError for a syntax error."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, never repeats
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise ValueError(
                        f"config file {path}: key {key!r} appears twice in one mapping (lines {seen[key]} and "
                        f"{line}); YAML would keep the last silently: keep one"
                    )
                seen.setdefault(key, line)
            return super().construct_mapping(node, deep)

    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader


@dataclass(frozen=True)
class ModelConfig:
    """The client model; every client of a run uses the same encoder architecture.

    Attributes:
        backbone: encoder: a timm model name, or swin_t / swin_s / swin_b.
        pretrained_file: local weights file for the encoder, a timm state dict or an mmsegmentation
            Swin checkpoint (converted on load, fedmtl/models/mmseg_swin.py); nothing is downloaded.
        pretrained_strict: true: every encoder tensor must be in pretrained_file (else an error);
            false: load the tensors of pretrained_file whose names and shapes match and report how many.
        embed_dim: decoder width; null: the encoder's first-scale channels.
        channels_last: the channels-last memory layout for weights and inputs: the same model,
            faster kernels for a small convolutional encoder on the CPU (docs/performance.md, "Speed
            options"); float rounding differs, so
            a run with it does not repeat one without it bit for bit.
        swin_windows: how a Swin encoder's shifted windows meet a feature map whose sides are not
            multiples of 7 (every stage at the paper's 512x512 and 448x576). mmseg: as
            mmsegmentation's Swin, the public FedHCA² encoder: pad, then shift, 7x7 windows and
            shift 3 at every stage and input size (so mmseg checkpoints fit at any size). timm:
            timm's order (shift, then pad; smaller windows, no shift, for maps of 7 or less),
            fedmtl's earlier order. Same weights and names either way; the features differ
            (fedmtl/models/swin_windows.py). It applies to swin_t/s/b and timm's other
            swin_transformer models; other backbones (Swin V2 included) ignore it.
        norm: batch: the encoder's and decoders' BatchNorm layers as built. group: every
            BatchNorm (encoder, decoders) replaced by a GroupNorm over the same channels with
            gcd(channels, 32) groups and a fresh identity affine, and activations run out of
            place: what DP-SGD (privacy.mode sample) needs, since Opacus refuses BatchNorm
            (docs/privacy.md). A different model: its weights are not BatchNorm's.
    """

    backbone: str = DEFAULT_BACKBONE
    pretrained_file: str | None = None
    pretrained_strict: bool = True
    embed_dim: int | None = None
    channels_last: bool = False
    # mmseg's order by default: the paper's encoder is mmseg's Swin whatever the weights
    swin_windows: Literal["mmseg", "timm"] = "mmseg"
    norm: Literal["batch", "group"] = "batch"

    def __post_init__(self) -> None:
        if self.norm not in ("batch", "group"):
            raise ValueError(
                f"model.norm must be batch or group, got {self.norm!r} (group: GroupNorm in place of "
                "every BatchNorm, as DP-SGD needs)"
            )
        if self.embed_dim is not None:
            _at_least("model.embed_dim", self.embed_dim, 1, " (or null: the encoder's first-scale channels)")
        if self.swin_windows not in SWIN_WINDOWS:  # jsonargparse checks the Literal; Python callers too
            raise ValueError(
                f"model.swin_windows must be {' or '.join(SWIN_WINDOWS)}, got {self.swin_windows!r} "
                "(mmseg: mmsegmentation's window order, the paper's encoder; timm: timm's)"
            )


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with a per-epoch warm-up cosine schedule (paper 4.1, suppl. C).

    Attributes:
        lr: AdamW learning rate, reached at the end of the warm-up; the cosine decays it to min_lr.
        weight_decay: AdamW weight decay.
        warmup_epochs: epochs of linear warm-up from warmup_lr to lr, counted in local epochs
            (0: none).
        warmup_lr: learning rate at the first warm-up epoch.
        min_lr: floor of the cosine, at most lr.
        keep_state: keep each client's AdamW moments and schedule across rounds, as the public
            FedHCA² code does (true); false: a fresh AdamW every round, so a client stores only
            its parameters (and the method's personal state); the learning rate follows the same
            schedule over the client's epochs either way.
    """

    lr: float = 1e-4
    weight_decay: float = 1e-4
    warmup_epochs: int = 5
    warmup_lr: float = 1.25e-7
    min_lr: float = 1.25e-6
    keep_state: bool = True

    def __post_init__(self) -> None:
        # A client group's optimizer cannot know the group's index: "clients[]" stands for it.
        name = "clients[].optimizer"
        _positive(f"{name}.lr", self.lr)
        _non_negative(f"{name}.weight_decay", self.weight_decay, " (0: no weight decay)")
        _at_least(f"{name}.warmup_epochs", self.warmup_epochs, 0, " (0: no warm-up)")
        _non_negative(f"{name}.warmup_lr", self.warmup_lr)
        _non_negative(f"{name}.min_lr", self.min_lr)
        if not isinstance(self.keep_state, bool):
            raise ValueError(
                f"{name}.keep_state must be true or false, got {self.keep_state!r}: true keeps each "
                "client's AdamW state across rounds (the default), false starts a fresh AdamW every round"
            )
        # min_lr <= lr is checked by ClientGroup, where the schedule is used: FedBABU's fine-tuning
        # copies this config (dataclasses.replace, which runs this method) with its own constant
        # ft_lr, which may lie below min_lr.


@dataclass
class ClientGroup:
    """Clients on one dataset that share a task list and a training recipe.

    ``single_task: true`` makes one client per task (the paper's "ST" clients); otherwise one
    client learns all the tasks ("MT"). ``replicas`` splits every client into that many
    (the paper's 2C / 4C runs): the dataset's training set is then shared by more clients.
    ``tasks_per_client: k`` gives each multi-task client k of the tasks, drawn with the run's
    seed, so many replicas make a federation of overlapping task sets in one line.
    ``held_out: true`` keeps the group's clients out of the federation: after the last round
    each starts from the federated model, fine-tunes on its own data and is evaluated (the test
    of how a method serves a new client), reported apart.

    Attributes:
        dataset: pascal_context or nyud.
        tasks: the tasks the group's clients learn (at least one).
        single_task: one client per task (true) or one client for all the tasks (false).
        replicas: copies of every client of the group, each with its own part of the training set.
        tasks_per_client: each client of a multi-task group learns this many of ``tasks``, drawn
            at random per client from the run's seed (kept in the order of ``tasks``); between
            1 and the number of tasks. null: every client learns all of them.
        local_epochs: epochs each client trains per round (the paper: 1 for PASCAL-Context, 4 for
            NYUD-v2).
        batch_size: training batch size of each client.
        loss_shards: split each training batch into this many equal parts, each normalising its
            losses by its own valid pixels (and saliency's class weight by its own pixels), and
            average the parts' losses: the arithmetic of the public run, which trains a client
            data-parallel on 2 GPUs, batch 8 as two halves of 4 (2 reproduces it; BatchNorm still
            sees the whole batch, as the public SyncBatchNorm does). 1: one normalisation over
            the whole batch. Must divide batch_size.
        optimizer: each client's optimizer and learning-rate schedule.
        held_out: the group's clients never train in the federation; after the last round each
            starts from the federated model (the mean of the federated clients' evaluated models
            over what the method shares; its own first draw for what stays personal), fine-tunes
            for fine_tune_epochs with a fresh AdamW at optimizer.lr, constant, and is evaluated;
            results.json and the report give them apart (held_out).
        fine_tune_epochs: a held-out group's fine-tuning epochs on its own data (0: evaluate the
            federated model as it is); null: its local_epochs. Only for held_out groups.
    """

    dataset: str
    tasks: list[str]
    single_task: bool = False
    replicas: int = 1
    tasks_per_client: int | None = None
    local_epochs: int = 1
    batch_size: int = 8
    loss_shards: int = 1
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    held_out: bool = False
    fine_tune_epochs: int | None = None

    def __post_init__(self) -> None:
        # A list item cannot know its index; the dataset tells the groups apart in most configs.
        where = f" (the {self.dataset!r} client group)"
        if not self.tasks:
            raise ValueError(f"clients[].tasks is empty{where}: list at least one task")
        for name in ("replicas", "local_epochs", "batch_size", "loss_shards"):
            _at_least(f"clients[].{name}", getattr(self, name), 1, where)
        if self.tasks_per_client is not None:
            k, n = self.tasks_per_client, len(self.tasks)
            if self.single_task:
                raise ValueError(
                    f"clients[].tasks_per_client ({k}) needs single_task: false{where}: a single-task "
                    "group already gives each client one task; remove tasks_per_client or set single_task false"
                )
            if not 1 <= k <= n:
                raise ValueError(
                    f"clients[].tasks_per_client must be between 1 and the group's {n} tasks, got {k}{where} "
                    "(or null: every client learns all of them)"
                )
        if self.fine_tune_epochs is not None:
            if not self.held_out:
                raise ValueError(
                    f"clients[].fine_tune_epochs ({self.fine_tune_epochs}) needs held_out: true{where}: only "
                    "held-out clients fine-tune after the federation; set held_out true or remove fine_tune_epochs"
                )
            _at_least("clients[].fine_tune_epochs", self.fine_tune_epochs, 0, f"{where} (0: no fine-tuning)")
        if self.batch_size % self.loss_shards:
            raise ValueError(
                f"clients[].loss_shards ({self.loss_shards}) must divide clients[].batch_size "
                f"({self.batch_size}){where}: the public run's 2 GPUs are loss_shards 2 with an even "
                "batch size; 1 normalises over the whole batch"
            )
        lr, min_lr = self.optimizer.lr, self.optimizer.min_lr
        if min_lr > lr:
            raise ValueError(
                f"clients[].optimizer.min_lr ({min_lr!r}) must be at most clients[].optimizer.lr "
                f"({lr!r}){where}: the cosine schedule decays lr down to min_lr; lower min_lr or raise lr"
            )


@dataclass
class SynthConfig:
    """A synthetic dataset to write on first use when the data root lacks it (the demo).

    Attributes:
        num_train: training images.
        num_val: validation images.
        size: image height and width, each at least 16 (Cityscapes' own aspect is 1:2, e.g.
            [64, 128], as configs/cityscapes.yaml sets it).
        seed: the same seed writes the same images.
        render_scale: in (0, 1]: render each scene at this fraction of size, then scale the
            rendering up to size (labels by nearest, depth and normals bilinear within an
            object) and read the labels off it; about 1 / render_scale**2 times faster, with
            less detail (thin objects and parts can vanish). 1: render at size. The rendered
            size must be at least 16 a side. A data root already holding the dataset is used
            as it is, whatever render_scale wrote it.
    """

    num_train: int = 500
    num_val: int = 200
    size: tuple[int, int] = (96, 96)
    seed: int = 0
    render_scale: float = 1.0

    def check(self, name: str) -> None:
        """Raise ValueError if a value is out of range; ``name`` is the entry's config path."""
        _at_least(f"{name}.num_train", self.num_train, 1)
        _at_least(f"{name}.num_val", self.num_val, 1, " (every client is evaluated on the validation split)")
        if min(self.size) < MIN_SYNTH_SIZE:
            raise ValueError(
                f"{name}.size must be at least {MIN_SYNTH_SIZE} x {MIN_SYNTH_SIZE} pixels, "
                f"got {list(self.size)}"
            )
        _at_least(f"{name}.seed", self.seed, 0)
        if (problem := render_scale_problem(self.size, self.render_scale)) is not None:
            raise ValueError(f"{name}.render_scale {problem}")


@dataclass
class DataConfig:
    """Where the datasets are and how they are loaded.

    Attributes:
        root: folder holding PASCALContext/, NYUDv2/ and Cityscapes/; null: $FEDMTL_DATA, else
            ./data.
        train_size: training crop and evaluation padding [height, width], each at least 32 (the
            encoder downsamples by 32); null: the paper's sizes (512x512 PASCAL-Context,
            448x576 NYUD-v2) and FMTL-Bench's 768x1536 for Cityscapes.
        num_workers: DataLoader worker processes per client (0: load in the training process).
        cache_mib: MiB of decoded samples (training and validation, before augmentation) each
            process keeps in memory, so later epochs skip reading and decoding the files; samples
            past the budget are read from disk every time. 0: no cache. Needs num_workers 0 (the
            workers would each fill and lose their own). Results do not depend on it.
        synth: dataset name -> synthetic data to generate when that dataset is missing (instead of
            failing), e.g. {nyud: {num_train: 100, size: [96, 96]}}.
        scale_range: [min, max] of the training augmentation's random rescaling, 0 < min <= max;
            the public code's [0.5, 2.0] by default. [1.0, 1.0] turns it off, as the benchmark
            does: on 32x32 images depth / factor asks a from-scratch model for a zoom it cannot
            see, and depth stayed worse than the mean (docs/benchmark.md, "The recipe and why").
        human_parts_selection: which PASCAL-Context training images a human_parts client keeps and
            labels. correct: a parts-only client keeps exactly its images with a person; every
            image is labelled from its own annotation. public: the public FedHCA² loader's
            selection, for the paper's human-parts numbers: the has-a-person flags of the whole
            split are read by position in the client's image list, so a parts-only client keeps
            the images at the positions k whose split image k has a person, and a multi-task
            client's image at such a position k keeps its label, the others get none (all 255).
            Validation sets (the whole split) are the same in both (fedmtl/data/pascal_context.py).
        partition: how the clients of a dataset split its training images, by name
            (--data.partition Dirichlet --data.partition.alpha 0.1) or as class_path / init_args,
            drawn with the run's seed: Uniform (equal random parts, the public code's), Dirichlet
            (label skew over each image's dominant class; alpha), Quantity (size skew; distribution
            dirichlet with alpha, or power_law with exponent), Shards (a few classes per client;
            shards_per_client). Every client must keep a batch of images (docs/scenarios.md,
            "Partitions").
    """

    root: str | None = None
    train_size: tuple[int, int] | None = None
    num_workers: int = 0
    cache_mib: int = 0
    synth: dict[str, SynthConfig] | None = None
    # = fedmtl.data.transforms.PAPER_SCALE_RANGE, not imported: the config module stays light
    scale_range: tuple[float, float] = (0.5, 2.0)
    # str, checked below, not a Literal: jsonargparse's Literal error names no fix
    human_parts_selection: str = "correct"
    partition: Partitioner = field(default_factory=lambda: lazy_instance(Uniform))

    def __post_init__(self) -> None:
        if self.train_size is not None and min(self.train_size) < MIN_TRAIN_SIZE:
            raise ValueError(
                f"data.train_size must be at least {MIN_TRAIN_SIZE} x {MIN_TRAIN_SIZE} (the encoder "
                f"downsamples by 32), got {list(self.train_size)}; or null for the paper's sizes"
            )
        _at_least("data.num_workers", self.num_workers, 0, " (0: load in the training process)")
        _at_least("data.cache_mib", self.cache_mib, 0, " (0: no cache)")
        if self.cache_mib > 0 and self.num_workers > 0:
            raise ValueError(
                f"data.cache_mib {self.cache_mib} needs data.num_workers 0, got {self.num_workers}: the "
                "cache lives in the training process and loader workers would each fill and lose their "
                "own; set data.num_workers to 0 (the cache saves the decoding the workers would do) or "
                "data.cache_mib to 0"
            )
        low, high = self.scale_range
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
            raise ValueError(
                f"data.scale_range must be [min, max] with 0 < min <= max, got {list(self.scale_range)}; "
                "[0.5, 2.0] is the public code's, [1.0, 1.0] turns the rescaling off"
            )
        if self.human_parts_selection not in HUMAN_PARTS_SELECTIONS:
            raise ValueError(
                f"data.human_parts_selection must be {' or '.join(HUMAN_PARTS_SELECTIONS)}, "
                f"got {self.human_parts_selection!r}: correct (the default) keeps and labels the images "
                "that show a person; public reproduces the public FedHCA² loader's misaligned selection "
                "(for the paper's human-parts numbers)"
            )
        # Checked here, not in SynthConfig.__post_init__: jsonargparse would wrap an error raised
        # inside the `dict | None` type in a multi-line union report, and here the key is known.
        for dataset, synth in (self.synth or {}).items():
            if dataset not in SYNTH_DATASETS:  # a misspelt key would leave its dataset missing, silently
                raise ValueError(
                    f"data.synth has no dataset {dataset!r}: its keys are the datasets to generate, "
                    f"{', '.join(SYNTH_DATASETS[:-1])} or {SYNTH_DATASETS[-1]}; correct or remove that key"
                )
            synth.check(f"data.synth.{dataset}")

    def resolved_root(self) -> str:
        return self.root or os.environ.get("FEDMTL_DATA", "data")


@dataclass
class EvaluationConfig:
    """When and how every client is evaluated on its dataset's validation split.

    Attributes:
        every: rounds between evaluations on the full validation set; the last round is always
            evaluated (0: only the last round).
        batch_size: evaluation batch size.
        edge_thin_gt: edge odsF matches against the thinned ground-truth boundary, as the
            authors' SEISM evaluation does (true); false: against the boundary map as the data
            gives it, fedmtl's earlier scoring (lower where boundaries are 2 px wide).
        clients: how many clients the evaluations before the last one cover: a sample drawn
            once with the run's seed, so curves follow the same clients (null: every client).
            The last round's evaluation, which results.json reports, covers every client.
    """

    every: int = 4
    batch_size: int = 8
    edge_thin_gt: bool = True
    clients: int | None = None

    def __post_init__(self) -> None:
        _at_least("evaluation.every", self.every, 0, " (0: evaluate after the last round only)")
        _at_least("evaluation.batch_size", self.batch_size, 1)
        if self.clients is not None:
            _at_least("evaluation.clients", self.clients, 1, " (or null: every client)")


@dataclass
class LoggerConfig:
    """Where the metrics go.

    Attributes:
        wandb: log to Weights & Biases too; RUN_DIR/metrics.csv is always written.
        mode: wandb mode; offline needs no account or network.
        project: wandb project.
        name: wandb run name; null: the run directory's name.
        group: wandb group, which gathers runs in the dashboard (up to 128 characters); null:
            the method's name and a hash of the config without its seed, run_dir, resume and
            logger (``FedHCA2-1a2b3c4d``), so the seeds of one setting share a group.
        tags: wandb tags of the run, each 1 to 64 characters (``[nyud, ablation]``).
        entity: the wandb user or team the run is logged under; null: the account's default.
    """

    wandb: bool = True
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "fedmtl"
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    entity: str | None = None

    def __post_init__(self) -> None:
        # wandb's own limits: a longer group or tag is refused by its server after the run started
        if self.group is not None and not (isinstance(self.group, str) and 0 < len(self.group) <= 128):
            raise ValueError(
                f"logger.group must be 1 to 128 characters, got {self.group!r}; or null for one group "
                "per setting (the method and a hash of the config without its seed)"
            )
        if isinstance(self.tags, str) or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in self.tags):
            raise ValueError(
                f"logger.tags must be a list of tags of 1 to 64 characters each, got {self.tags!r}; "
                "e.g. --logger.tags '[nyud, ablation]'"
            )
        entity = self.entity
        if entity is not None and not (
            isinstance(entity, str) and entity and not set(entity) & set("/ \t\n")
        ):
            raise ValueError(
                f"logger.entity must be a wandb user or team name (no spaces or '/'), got {entity!r}; "
                "or null for the account's default"
            )


@dataclass
class AvailabilityConfig:
    """Clients that miss rounds or finish only part of their local work, drawn per client and
    round from the run's seed (the same draw on any number of devices and on resume).

    Attributes:
        dropout: probability that a client that would train in a round (all of them, or the
            method's sample under participation < 1) is unavailable: it does not train, sends
            nothing and receives nothing, and keeps its state, as a client whose update
            nonfinite dropped (a method that mixes every client, FedHCA² or FedAMP, sees its
            round-start parameters with a zero update). In [0, 1); 0: always available.
        stragglers: probability that an available training client straggles in a round, each
            client drawn on its own: it trains only straggler_work of every local epoch. In
            [0, 1]; 0: none, 1: every training client.
        straggler_work: the part of each local epoch a straggler trains: ceil(straggler_work x
            the epoch's batches), at least one batch; the epoch still counts for the schedule.
            In (0, 1].
    """

    dropout: float = 0.0
    stragglers: float = 0.0
    straggler_work: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise ValueError(
                f"availability.dropout must be in [0, 1), got {self.dropout!r}: the probability that a "
                "training client misses a round (0: every client is always available; below 1, so a "
                "round can have clients)"
            )
        if not (math.isfinite(self.stragglers) and 0 <= self.stragglers <= 1):
            raise ValueError(
                f"availability.stragglers must be in [0, 1], got {self.stragglers!r}: the probability "
                "that an available training client straggles in a round (0: none, 1: every one)"
            )
        if not (math.isfinite(self.straggler_work) and 0 < self.straggler_work <= 1):
            raise ValueError(
                f"availability.straggler_work must be in (0, 1], got {self.straggler_work!r}: the part of "
                "each local epoch a straggler trains (1: the whole epoch)"
            )

    @property
    def enabled(self) -> bool:
        """Whether any client can be unavailable or straggle (off: the run is exactly as without)."""
        return self.dropout > 0 or self.stragglers > 0


PRIVACY_MODES = ("central", "local", "sample")
ACCOUNTANTS = ("rdp", "prv")


@dataclass(frozen=True)
class AdaptiveClipConfig:
    """Adaptive clipping (Andrew et al., NeurIPS 2021) of client-level DP: the clip norm
    follows a quantile of the clients' update norms, learned from a noisy count of the
    clients whose update was not clipped (docs/privacy.md).

    Attributes:
        enabled: adapt privacy.clip after every round (privacy.clip is the starting value).
        target_quantile: γ, the fraction of the clients' updates meant to fit under the clip
            norm, in [0, 1] (0.5: the median, the paper's default).
        clip_lr: η, the geometric step: C ← C·exp(−η(b̄ − γ)), b̄ the noisy fraction of
            unclipped updates; > 0 (0.2, the paper's).
        count_stddev: σ_b, the standard deviation of the noise added to the count of unclipped
            updates; > 0; null: the expected number of clients per round / 20 (the paper's
            choice). The update's noise multiplier is then (z⁻² − (2σ_b)⁻²)^(-1/2), so the
            pair spends what z alone would (needs 2σ_b > z).
    """

    enabled: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    count_stddev: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_quantile) and 0 <= self.target_quantile <= 1):
            raise ValueError(
                f"privacy.adaptive_clip.target_quantile must be in [0, 1], got {self.target_quantile!r}: "
                "the fraction of client updates meant to fit under the clip norm (0.5: the median)"
            )
        _positive(
            "privacy.adaptive_clip.clip_lr",
            self.clip_lr,
            " (the clip norm's geometric step; 0.2 is the paper's)",
        )
        if self.count_stddev is not None:
            _positive(
                "privacy.adaptive_clip.count_stddev",
                self.count_stddev,
                " (the noise on the count of unclipped updates; null: the expected clients per round / 20)",
            )


@dataclass(frozen=True)
class PrivacyConfig:
    """Differential privacy of the run (docs/privacy.md). Off by default.

    Attributes:
        mode: what is protected and where the noise is added. central: client-level DP by a
            trusted server: each client's shared update is clipped to clip, the server adds
            Gaussian noise of standard deviation noise_multiplier·clip to every group's sum
            (the FedAvg family only). local: client-level DP on the client: each update is
            clipped and noised before it leaves, so any server step sees only privatised
            updates (every method). sample: sample-level DP-SGD inside local training with
            Opacus (per-sample clipping, Poisson sampling). null: no privacy.
        noise_multiplier: z >= 0, the noise's standard deviation in units of clip; null: derived
            from target_epsilon before training.
        clip: C > 0, the L2 norm a client's update (central, local) or a sample's gradient
            (sample) is clipped to; inf (YAML: .inf): no clipping (then z must be 0).
        delta: δ of the (ε, δ) guarantee, in (0, 1); below 1 / the number of clients (central,
            local) or of a client's samples (sample).
        target_epsilon: ε > 0. With noise_multiplier null, z is the smallest that keeps the
            whole run within it; with noise_multiplier set, the run stops after the last round
            that keeps ε within it.
        accountant: rdp (Rényi DP, Mironov et al.) or prv (privacy random variables, Gopi et
            al.), both Opacus's.
        adaptive_clip: adaptive clipping of client-level DP (central, local).
    """

    mode: Literal["central", "local", "sample"] | None = None
    noise_multiplier: float | None = None
    clip: float | Literal["inf"] = 1.0
    delta: float = 1e-5
    target_epsilon: float | None = None
    accountant: Literal["rdp", "prv"] = "rdp"
    adaptive_clip: AdaptiveClipConfig = field(default_factory=AdaptiveClipConfig)

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in PRIVACY_MODES:
            raise ValueError(
                f"privacy.mode must be one of {', '.join(PRIVACY_MODES)} or null, got {self.mode!r} "
                "(central: noise on the server's sum; local: on each client's update; sample: DP-SGD)"
            )
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"privacy.accountant must be rdp or prv, got {self.accountant!r}")
        z = self.noise_multiplier
        if z is not None and not (math.isfinite(z) and z >= 0):
            raise ValueError(
                f"privacy.noise_multiplier must be a finite number >= 0, got {z!r} (the noise's standard "
                "deviation in units of privacy.clip; null: derived from privacy.target_epsilon)"
            )
        if self.clip == "inf":  # what a command line gives; YAML's .inf is a float already
            object.__setattr__(self, "clip", math.inf)
        if not (self.clip > 0):  # inf allowed; NaN fails
            raise ValueError(
                f"privacy.clip must be > 0 (inf: no clipping), got {self.clip!r}: the L2 norm an update "
                "or a sample's gradient is clipped to"
            )
        if not (math.isfinite(self.delta) and 0 < self.delta < 1):
            raise ValueError(
                f"privacy.delta must be in (0, 1), got {self.delta!r}: the δ of the (ε, δ) guarantee, "
                "below 1 / the number of clients (or of a client's samples for mode sample)"
            )
        if self.target_epsilon is not None:
            _positive("privacy.target_epsilon", self.target_epsilon, " (the ε the run may spend)")
        if self.mode is None:
            return
        if z is None and self.target_epsilon is None:
            raise ValueError(
                f"privacy.mode is {self.mode} but neither privacy.noise_multiplier nor privacy.target_epsilon "
                "is set: set one (e.g. --privacy.noise_multiplier 1.0)"
            )
        if math.isinf(self.clip) and (z is None or z > 0):
            raise ValueError(
                f"privacy.clip is inf but the noise multiplier is {'derived from target_epsilon' if z is None else z}: "
                "the noise z·C would be infinite; set a finite privacy.clip (or noise_multiplier 0)"
            )
        if self.adaptive_clip.enabled and self.mode == "sample":
            raise ValueError(
                "privacy.adaptive_clip is for client-level DP (mode central or local); mode sample clips "
                "each sample's gradient to privacy.clip: set privacy.adaptive_clip.enabled false"
            )
        if self.adaptive_clip.enabled and math.isinf(self.clip):
            raise ValueError(
                "privacy.adaptive_clip starts from privacy.clip, which is inf: set a finite privacy.clip"
            )

    @property
    def enabled(self) -> bool:
        return self.mode is not None


AGGREGATIONS = ("auto", "stacked", "streamed")


@dataclass
class RunConfig:
    """One federated run: who the clients are, how they learn, how the server aggregates.

    Attributes:
        clients: the client groups; each makes one or more clients.
        model: the client model.
        algorithm: the federated method, by name (--algorithm FedHCA2) or as class_path /
            init_args; --algorithm.help NAME lists its options.
        data: where the datasets are and how they are loaded.
        evaluation: when and how the clients are evaluated.
        logger: where the metrics go.
        availability: clients that miss rounds (dropout) or finish only part of their local
            work (stragglers); by default every client is always available and does all its work.
        rounds: federated rounds (at least 1).
        accelerator: cpu, gpu (= cuda), mps or auto.
        devices: processes per node; the clients are sharded across them.
        num_nodes: machines, launched with torchrun or SLURM.
        precision: 32-true, or a mixed precision (autocast on GPUs).
        cpu_threads: torch threads per process on CPU; null: the cores divided among the local
            processes. Threaded kernels sum in a thread-count-dependent order: a fixed value gives
            bit-identical results whatever the number of devices, and 1 degrades least on shared
            cores.
        seed: the random seed of the data partition, the models' initialisation and the training
            order (0 to 2**32 - 1).
        run_dir: folder of the run's checkpoints, metrics.csv, results.json and config.yaml.
        resume: continue from run_dir's latest checkpoint.
        overwrite: a fresh fit (resume false) replaces the run already in run_dir.
        nonfinite: a client update with NaN/inf: drop it (the client keeps its previous state;
            warned and counted in metrics.csv as server/dropped_updates), or stop the run with an
            error.
        update_norm_limit: a client update that moves a part of its model (the encoder; a task's
            decoder with its head) by more than this many times the norm that part had at the
            start of the round is exploding, and nonfinite handles it as a NaN update (healthy
            updates stay far below the default). Above 1; null: no check.
        checkpoint_every: rounds between checkpoints; the last round always has one (0: only the
            last round).
        checkpoint_keep: complete checkpoints kept in run_dir/checkpoints, the newest; an older
            one is deleted only once a newer one is published. 2: a resume that finds the newest
            damaged falls back to the one before it; 1: the least disk, and no fallback.
        store: where client state waits between rounds: memory, or disk (run_dir/store) for more
            clients than fit in memory.
        aggregation: where the server step's encoder rows live (the rows the method names, of
            the clients that trained). stacked: in memory, gathered as [N, P] stacks on every
            process; streamed: one file per client and row in run_dir/store/rows, read a block
            of columns at a time, so memory does not grow with N × P; auto: streamed once the
            stacks would pass 1 GiB. Both run the method's one server step and give the
            same parameters up to float rounding.
        privacy: differential privacy (docs/privacy.md); off by default.
        secure_aggregation: the server reads only the masked sum of each group's updates, as
            secure aggregation gives it (pairwise masks in an integer ring; docs/privacy.md):
            only for methods whose server step needs nothing but those sums (the FedAvg family).
    """

    clients: list[ClientGroup]
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: Method = field(default_factory=lambda: lazy_instance(Local))
    data: DataConfig = field(default_factory=DataConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)
    rounds: int = 100
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "32-true"
    cpu_threads: int | None = 1
    seed: int = 0
    run_dir: str = "runs/default"
    resume: bool = False
    overwrite: bool = False
    nonfinite: Literal["drop", "stop"] = "drop"
    update_norm_limit: float | None = 10.0
    checkpoint_every: int = 1
    checkpoint_keep: int = 2
    store: Literal["memory", "disk"] = "memory"
    aggregation: Literal["auto", "stacked", "streamed"] = "auto"
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    secure_aggregation: bool = False

    @classmethod
    def from_namespace(cls, namespace: Any) -> RunConfig:
        """The RunConfig of a namespace that ``parser.instantiate`` returned.

        jsonargparse instantiates the nested configs (which check themselves in
        ``__post_init__``) but leaves the top level a namespace, so the checks below would not
        run; keys that are not fields (``config``, the config files read) are left out."""
        return cls(**{f.name: namespace[f.name] for f in fields(cls) if f.name in namespace})

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError("clients is empty: the scenario needs at least one client group")
        if all(group.held_out for group in self.clients):
            raise ValueError(
                "clients are all held_out, so no client trains in the federation; set held_out "
                "false on at least one group"
            )
        _at_least("rounds", self.rounds, 1)
        if self.accelerator.lower() not in ACCELERATORS:
            raise ValueError(
                f"accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}"
            )
        _at_least("devices", self.devices, 1, " (processes per node)")
        _at_least("num_nodes", self.num_nodes, 1, " (machines)")
        if self.cpu_threads is not None:
            _at_least("cpu_threads", self.cpu_threads, 1, " (or null: the cores divided among the processes)")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}] (numpy's seed range), got {self.seed!r}")
        _at_least(
            "checkpoint_every", self.checkpoint_every, 0, " (0: a checkpoint after the last round only)"
        )
        _at_least(
            "checkpoint_keep",
            self.checkpoint_keep,
            1,
            " (the newest checkpoint is what a resume needs; 2 keeps one to fall back on)",
        )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}"
            )
        limit = self.update_norm_limit
        if limit is not None and not (math.isfinite(limit) and limit > 1):  # not `<= 1`: NaN must fail
            raise ValueError(
                f"update_norm_limit must be a number > 1, got {limit!r}: an update larger than this many "
                "times the parameters it started from is exploding (10 by default; null: no check)"
            )
