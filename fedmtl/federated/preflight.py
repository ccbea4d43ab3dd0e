"""Checks a fit runs before it writes anything: the machine, the data and the model.

Each failure is one ValueError / FileNotFoundError naming the problem and the fix; the CLI
prints it as one ``error:`` line. Everything here is cheap next to a round: one sample per
split and client architecture is read, the label files of a seeded sample of
:data:`CONTENT_SAMPLE` images per split and dataset are decoded as the loaders read them
(forms, class values, sizes: :func:`fedmtl.data.check.check_sample`), and one forward pass of
each architecture runs at the training size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fedmtl.config import RunConfig
from fedmtl.data.check import check_hint, check_sample
from fedmtl.data.datasets import DATASETS, build_dataset, folder_problem
from fedmtl.data.layout import link_problem
from fedmtl.data.transforms import LargerThanEvalSize
from fedmtl.federated.scenario import build_scenario
from fedmtl.federated.spec import ClientSpec

_LAUNCHERS = ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
CONTENT_SAMPLE = 32  # images per split and dataset whose labels fit decodes before writing


def check_data_links(cfg: RunConfig, broken: bool = True) -> None:
    """The data root and the folders of the datasets the clients use are not symbolic links
    that lead nowhere: a loop (``Symlink loop``), or with ``broken`` a link to nothing (which
    would read as a missing dataset, or a data root without the dataset's folder)."""
    root = Path(cfg.data.resolved_root())
    problem = link_problem(root)
    if problem and (broken or "loop" in problem):
        raise FileNotFoundError(f"data root {root} (data.root or $FEDMTL_DATA) is {problem}")
    for name in sorted({group.dataset for group in cfg.clients}):
        problem = folder_problem(DATASETS.get(name), root)
        if problem and (broken or "loop" in problem):
            raise FileNotFoundError(f"{problem}; {check_hint(root)}")


def check_environment(cfg: RunConfig) -> None:
    """The accelerator exists, CPU processes fit the cores, several nodes have a launcher, the
    data root holds no symbolic link loop (checked here: before synthetic data is generated)."""
    check_data_links(cfg, broken=False)
    accelerator = cfg.accelerator.lower()
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"accelerator {cfg.accelerator}: no CUDA GPU is visible to torch on this machine; "
                "use --accelerator cpu (or auto)"
            )
        if cfg.devices > torch.cuda.device_count():
            raise ValueError(
                f"devices {cfg.devices}: this machine has {torch.cuda.device_count()} GPU(s); "
                f"use --devices {torch.cuda.device_count()} or fewer"
            )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ValueError("accelerator mps: MPS is not available on this machine; use --accelerator cpu")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    cores = os.cpu_count() or 1
    if on_cpu and cfg.devices > cores:
        raise ValueError(
            f"devices {cfg.devices}: on CPU each device is a process and this machine has {cores} cores; "
            f"use --devices {cores} or fewer"
        )
    if cfg.num_nodes > 1 and not any(v in os.environ for v in _LAUNCHERS):
        raise ValueError(
            f"num_nodes {cfg.num_nodes} needs one process per device on every node, started by a launcher "
            "(torchrun --nnodes ... or srun under SLURM, see docs/performance.md); without one the run would wait "
            "forever for the other nodes. For one machine, use --num_nodes 1"
        )


#: The warm-up check steps a group's schedule through its epochs up to this many; a longer run
#: whose cosine floor lies below its warm-up's start is not checked.
WARMUP_CHECKED_UP_TO = 100_000


def warmup_warnings(cfg: RunConfig) -> list[str]:
    """One ``warning:`` line per federated client group that would spend more than half of its
    local epochs (``rounds`` x ``local_epochs``) at or below its warm-up's start rate
    (``optimizer.warmup_lr``), i.e. would barely train: a shortened run (``--rounds 2`` on a
    config with a warm-up) does so without any other sign. Held-out groups fine-tune at a
    constant rate, so they are not checked; Ditto's personal track follows the same schedule
    over the same epochs unless ``personal_epochs`` is set."""
    from fedmtl.federated.training import warmup_start_epochs  # timm's scheduler: when asked

    lines = []
    for g, group in enumerate(cfg.clients):
        opt = group.optimizer
        if group.held_out or opt.warmup_epochs == 0 or opt.warmup_lr >= opt.lr:
            continue
        total = cfg.rounds * group.local_epochs
        if opt.min_lr > opt.warmup_lr and 2 * (opt.warmup_epochs + 1) <= total:
            # the cosine never comes back down to the warm-up's start: at most the warm-up and the
            # epoch after it train that slowly, not most epochs (and a run planned for 10^8
            # rounds is never stepped through epoch by epoch here)
            continue
        if total > WARMUP_CHECKED_UP_TO:  # a cosine floor below the start: too long to step through
            continue
        slow = warmup_start_epochs(opt, total)
        if 2 * slow <= total:
            continue
        enough = next(  # the fewest rounds that train at most half of the epochs that slowly
            (
                r
                for r in range(cfg.rounds + 1, cfg.rounds + 200)
                if 2 * warmup_start_epochs(opt, r * group.local_epochs) <= r * group.local_epochs
            ),
            None,
        )
        kind = "single-task" if group.single_task else "multi-task"
        more = f"--rounds {enough} or more" if enough else "more rounds"
        lines.append(
            f"warning: clients[{g}] ({group.dataset}, {kind}): {slow} of its {total} local epochs "
            f"({cfg.rounds} rounds x {group.local_epochs}) train at the warm-up's start rate "
            f"{opt.warmup_lr:g} (optimizer.warmup_lr; epoch e trains at the schedule's value for e - 1), "
            f"so it would barely train: use {more}, or no warm-up "
            f"(--clients.{g}.optimizer.warmup_epochs 0)"
        )
    return lines


def check_scenario(cfg: RunConfig) -> list[ClientSpec]:
    """The clients build (tasks, data splits, partitions, a batch for every client: see
    ``build_scenario``), every split they use is readable and not empty, and every client
    architecture runs at the training size (held-out clients too); returns the federation's
    clients."""
    check_data_links(cfg)  # before build_scenario: a broken link would read as a missing split
    federated, held_out = build_scenario(cfg)
    specs = [*federated, *held_out]
    root = cfg.data.resolved_root()
    for name in sorted({s.dataset for s in specs}):
        val = DATASETS.get(name).split_file(root, "val")
        if not DATASETS.get(name).has_split(root, "val"):
            raise FileNotFoundError(
                f"{name} validation split not found: {val} (every client is evaluated on it); {check_hint(root)}"
            )
        if not DATASETS.get(name).split_ids(root, "val"):
            raise ValueError(
                f"{name} validation split {val} lists no image: every client is evaluated on it; {check_hint(root)}"
            )
    size = cfg.data.train_size
    state_bytes = {}
    for spec in {(s.dataset, s.tasks): s for s in specs}.values():
        img_size = tuple(size or DATASETS.get(spec.dataset).train_size)
        for split in ("train", "val"):
            try:
                dataset = build_dataset(
                    spec.dataset, root, split, tasks=spec.tasks, train_size=img_size,
                    indices=spec.train_indices if split == "train" else None,
                    human_parts_selection=cfg.data.human_parts_selection,
                )  # fmt: skip
            except FileNotFoundError as err:  # a file of the split is missing (named)
                raise FileNotFoundError(f"{err}; {check_hint(root)}") from None
            if len(dataset) == 0:
                raise ValueError(
                    f"client {spec.name}: its {split} part of {spec.dataset} has no image with labels for "
                    f"{', '.join(spec.tasks)}; use fewer clients or a larger dataset"
                )
            try:
                dataset[0]  # the first sample reads (errors name the file)
            except LargerThanEvalSize as err:
                if size is None:
                    raise ValueError(f"{err}; {check_hint(root)}") from None
                # data.train_size is the problem, not the data
                used = {s.dataset for s in specs}
                synth = {d: c.size for d, c in (cfg.data.synth or {}).items() if d in used and c}
                raise ValueError(eval_size_error(spec.dataset, size, err.image, synth)) from None
            except ValueError as err:
                raise ValueError(f"{err}; {check_hint(root)}") from None
        state_bytes[(spec.dataset, spec.tasks)] = _check_model(cfg, spec, img_size)
    check_content(cfg, specs)  # after the reads above, which name a missing file as "not found"
    check_memory_store(cfg, [state_bytes[(s.dataset, s.tasks)] for s in federated])
    return federated


def eval_size_error(
    dataset: str, size: Sequence[int], image: tuple[int, int], synth: Mapping[str, Sequence[int]]
) -> str:
    """The refusal of a ``data.train_size`` smaller than ``dataset``'s validation images
    (``image``, height x width): evaluation pads to that size but never crops (the public code
    does not resize), so it must be at least the images' size. When ``dataset`` is synthetic
    (``synth``: the ``data.synth`` size of each synthetic dataset the clients use), the other
    fix is to generate every one of them at ``size``."""
    least = [max(int(size[0]), image[0]), max(int(size[1]), image[1])]
    text = (
        f"data.train_size {list(size)}: {dataset}'s validation images are {image[0]}x{image[1]}, and "
        "evaluation pads images to data.train_size but never crops them, so it must be at least "
        f"{least}: use --data.train_size {_arg(least)}"
    )
    if dataset not in synth:
        return f"{text}, or leave it unset for the dataset's own size"
    sizes = ", ".join(f"{d} {list(v)}" for d, v in sorted(synth.items()))
    options = " ".join(f"--data.synth.{d}.size {_arg(size)}" for d in sorted(synth))
    return (
        f"{text}; or, as this data is synthetic (data.synth sizes: {sizes}), generate it at that size: "
        f"{options} with a new --data.root (data already written there is not generated again)"
    )


def _arg(size: Sequence[int]) -> str:
    """A size as one command-line word: [32,32]."""
    return f"[{int(size[0])},{int(size[1])}]"


def check_content(cfg: RunConfig, specs: list[ClientSpec]) -> None:
    """The label files of a seeded sample of each dataset's images the clients train on (and of
    its val split) read as the loaders read them: a class value past the classes, a label in a
    form read wrong, a size that is not its image's is one error naming the file. The files not
    in the sample are checked as they are read (DenseDataset raises naming the file)."""
    root = cfg.data.resolved_root()
    for name in sorted({s.dataset for s in specs}):
        spec = DATASETS.get(name)
        mine = [s for s in specs if s.dataset == name]
        train = spec.split_ids(root, "train")
        positions = sorted({int(k) for s in mine for k in (s.train_indices or ())})
        ids = {
            "train": [train[k] for k in positions if 0 <= k < len(train)],
            "val": spec.split_ids(root, "val"),
        }
        tasks = sorted({t for s in mine for t in s.tasks})
        problems = check_sample(name, root, tasks, ids, CONTENT_SAMPLE)
        if problems:
            more = f" (and {len(problems) - 1} more in the sample)" if len(problems) > 1 else ""
            raise ValueError(f"{spec.dataset_class.title} {problems[0]}{more}; {check_hint(root)}")


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable); None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory_store(cfg: RunConfig, state_bytes: list[int]) -> None:
    """``store: memory`` keeps every client's state (model, AdamW moments) in RAM: refuse a
    scenario whose states would not fit in what this machine has available, before anything
    is written (``state_bytes``: each client's)."""
    if cfg.store != "memory":
        return
    needed = sum(state_bytes) / cfg.num_nodes  # the clients are split among the nodes
    available = available_memory()
    if available is None or needed <= 0.8 * available:
        return
    gib = 2**30
    raise ValueError(
        f"store memory: the {len(state_bytes)} clients' states (parameters and AdamW moments, "
        f"{max(state_bytes) / 2**20:.0f} MiB for the largest client) need about {needed / gib:.1f} GiB "
        f"of RAM{' per node' if cfg.num_nodes > 1 else ''}, and this machine has {available / gib:.1f} GiB "
        "available: use --store disk (states in run_dir/store), or fewer clients"
    )


def _check_model(cfg: RunConfig, spec: ClientSpec, img_size: tuple[int, ...]) -> int:
    """Build the client's model (backbone name, pretrained file) and run it once at ``img_size``;
    returns the bytes of a client state of it once trained: its state dict and two AdamW
    moments of each parameter."""
    from fedmtl.federated.client import ClientModule  # Lightning and timm: only to check a model

    module = ClientModule(spec, cfg.model, total_epochs=1, img_size=(int(img_size[0]), int(img_size[1])))
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(1, 3, int(img_size[0]), int(img_size[1])))
    except (RuntimeError, AssertionError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"data.train_size {list(img_size)}: backbone {cfg.model.backbone} cannot run on "
            f"{img_size[0]}x{img_size[1]} images ({detail}); use a size both backbone and decoders accept, "
            "e.g. a multiple of 32 (Swin: of 32 x its window size)"
        ) from None
    model = module.model
    if cfg.privacy.mode == "sample":  # Opacus's per-sample gradients: no BatchNorm, no Swin
        from fedmtl.privacy.dpsgd import private_model_problem

        problem = private_model_problem(model)
        if problem:
            raise ValueError(problem)
    tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return tensors + 2 * sum(p.numel() * p.element_size() for p in model.parameters())
