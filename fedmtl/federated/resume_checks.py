"""The checks a resume, ``validate`` or ``test`` makes of its inputs before anything runs.

``fedmtl fit --resume true``, ``fedmtl validate`` and ``fedmtl test`` read back what an earlier
fit left: a checkpoint and the data it trained on. Before any process starts or any file is written, the
leader checks both (:func:`check_inputs`): the checkpoint it would read is intact (its
checksums, :mod:`fedmtl.federated.integrity`) and holds finite states only, and the data under
``data.root`` is the data the run was trained on. A difference is refused, naming it, so that a
resumed run cannot silently continue on other data.

The config is compared too (:func:`check_config`): every checkpoint records the config the
run computes with (``checkpoint.recorded_config``), so a run whose ``config.yaml`` was lost
or edited still refuses a resume or an evaluation under another seed, other clients or another
architecture, naming the first field that differs.

The data is compared through a fingerprint a fresh fit records in ``RUN_DIR/data_fingerprint.json``
(:func:`record_inputs`): per dataset, the split files' sha256, their image counts and the size of
every file the loaders read, by path relative to the dataset folder, so the same data under
another root matches (:func:`data_fingerprint`, :func:`data_differences`). A resume from another
root whose data matched records that root in ``config.yaml``, which ``validate`` reads.

The CLI imports this module inside the commands that use it, next to the engine, so its imports
(the data and scenario modules) cost nothing at ``fedmtl --help``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from fedmtl.config import DataConfig
from fedmtl.data.datasets import DATASETS, dataset_root
from fedmtl.data.layout import SPLITS
from fedmtl.federated import checkpoint, rundir
from fedmtl.federated.integrity import SHOWN, sha256_file
from fedmtl.federated.scenario import count_clients
from fedmtl.federated.store import atomic_write_text  # a full disk: one line, no temporary file left

FINGERPRINT = "data_fingerprint.json"


def _relative(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def data_fingerprint(cfg: Any) -> dict[str, Any]:
    """Per dataset the run reads: its split files (sha256, image count) and the size of every
    file the loaders read for the run's tasks, by path relative to the dataset folder."""
    out: dict[str, Any] = {}
    for name in sorted({g.dataset for g in cfg.clients}):
        spec = DATASETS.get(name)
        tasks = [t for t in spec.tasks if any(t in g.tasks for g in cfg.clients if g.dataset == name)]
        folder = dataset_root(spec, cfg.data.resolved_root())
        # A dataset object that only names its files: building a real one reads labels.
        namer = spec.dataset_class.__new__(spec.dataset_class)
        namer.root, namer.tasks, namer.layout = folder, tuple(tasks), spec.dataset_class.layout_class(folder)
        splits: dict[str, Any] = {}
        sizes: dict[str, int | None] = {}
        for split in SPLITS:
            path = namer.layout.split_file(split)
            if not namer.layout.has_split(split):
                continue
            ids = namer.layout.split_ids(split)
            namer.split = split  # Cityscapes' paths depend on the split
            # Cityscapes' split is a folder of images: its sorted id list stands for the file.
            digest = (
                sha256_file(path) if path.is_file() else hashlib.sha256("\n".join(ids).encode()).hexdigest()
            )
            splits[split] = {"file": _relative(path, folder), "sha256": digest, "images": len(ids)}
            for image_id in ids:
                for _, candidates in namer._files(image_id):
                    found = next((p for p in candidates if p.is_file()), None)
                    sizes[_relative(found or candidates[0], folder)] = found.stat().st_size if found else None
        for path in namer._meta_files():
            sizes[_relative(path, folder)] = path.stat().st_size if path.is_file() else None
        out[name] = {
            "folder": folder.name,
            "tasks": tasks,
            "splits": splits,
            "files": dict(sorted(sizes.items())),
        }
    return {"version": 1, "datasets": out}


def _named(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" and {len(items) - SHOWN:,} more" if len(items) > SHOWN else "")


def data_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two :func:`data_fingerprint`\\ s, in words."""
    out = []
    for name in sorted(set(saved["datasets"]) | set(now["datasets"])):
        old, new = saved["datasets"].get(name), now["datasets"].get(name)
        if old is None or new is None:
            out.append(f"{name} is {'not read now' if new is None else 'read now'}, unlike in the run")
            continue
        for split in sorted(set(old["splits"]) | set(new["splits"])):
            a, b = old["splits"].get(split), new["splits"].get(split)
            if b is None:
                out.append(f"{name} has no {split} split file ({a['file']}), the run's data had one")
            elif a is None:
                out.append(f"{name} has a {split} split file ({b['file']}), the run's data had none")
            elif a["images"] != b["images"]:
                out.append(
                    f"{name} {split} split ({b['file']}) lists {b['images']:,} images, the run's {a['images']:,}"
                )
            elif a["sha256"] != b["sha256"]:
                out.append(f"{name} {split} split ({b['file']}) lists other images than the run's (as many)")
        folder = new["folder"]
        files_old, files_new = old["files"], new["files"]
        resized = [
            f"{folder}/{k} ({files_old[k]} -> {files_new[k]} bytes)"
            for k in files_old
            if k in files_new and files_old[k] != files_new[k]
        ]
        gone = [f"{folder}/{k}" for k in files_old if k not in files_new]
        added = [f"{folder}/{k}" for k in files_new if k not in files_old]
        if resized:
            out.append(f"{len(resized):,} file(s) differ in size: {_named(resized)}")
        if gone:
            out.append(f"{len(gone):,} file(s) the run read are not read now: {_named(gone)}")
        if added:
            out.append(f"{len(added):,} file(s) are read now that the run did not read: {_named(added)}")
    return out


def with_defaults(recorded: Any, defaults: Any) -> Any:
    """``recorded`` with every field it lacks and ``defaults`` has, at its default: a record
    written before fedmtl had a field (``privacy``, ``model.norm``) ran as its default does."""
    if not (isinstance(recorded, dict) and isinstance(defaults, dict)):
        return recorded
    filled = {key: with_defaults(value, defaults.get(key)) for key, value in recorded.items()}
    for key, value in defaults.items():
        filled.setdefault(key, value)
    return filled


def check_config(
    folder: Path, config: dict[str, Any], doing: str, given: str, defaults: dict[str, Any] | None = None
) -> None:
    """Refuse ``config`` (a resolved config, ``Namespace.as_dict()``; ``given``: where it comes
    from, in words) when it differs from the one checkpoint ``folder`` was written under in a
    field a resume may not change, naming the differing fields. Read before any state is
    loaded: another client order or architecture is named here, never as a state that does not
    fit its model. A checkpoint written before fedmtl recorded its config is not compared; a
    field the record lacks (added since) is compared at its value in ``defaults`` (the
    parser's defaults, resolved)."""
    recorded = checkpoint.recorded_config(folder)
    if recorded is None:
        return
    if defaults is not None:
        # Not inside `algorithm`: its defaults are the parser's default method's, not the run's.
        fields = {k: v for k, v in checkpoint.comparable(defaults).items() if k != "algorithm"}
        recorded = with_defaults(recorded, fields)
    changes = rundir.config_changes(recorded, checkpoint.comparable(config))
    if not changes:
        return
    if doing == "resume":
        fix = (
            "Resume with the run's values, or start a new run with another --run_dir (a resume may change "
            f"only: {', '.join(rundir.RESUMABLE_FIELDS)})"
        )
    else:
        fix = f"Restore the run's own config.yaml, or {doing} the checkpoint with the config it was written under"
    raise ValueError(
        f"{doing}: {given} differs from the config checkpoint {folder} was written under (recorded in its "
        f"server.pt) in what the run computes: {'; '.join(changes)}. {fix}; nothing was changed"
    )


def check_inputs(cfg: Any, resume: bool, doing: str = "resume") -> dict[str, Any]:
    """The leader, before any process starts or anything is written: a resumed (or validated)
    run's checkpoint holds finite states only, and its data is the run's. Returns the data's
    fingerprint, for :func:`record_inputs`."""
    run_dir = Path(cfg.run_dir)
    fingerprint = data_fingerprint(cfg)
    if not resume:
        return fingerprint
    folder, _ = checkpoint.resumable(run_dir)
    if folder is not None:  # the engine reads them again: a NaN found there would stop one rank only
        drawn = set(checkpoint.load_server(folder).get("drawn", ()))  # never stored: no file
        for client in range(count_clients(cfg)):
            if client not in drawn:
                checkpoint.load_client(folder, client)
    saved_path = run_dir / FINGERPRINT
    if not saved_path.is_file():
        print(
            f"{doing}: {run_dir} has no {FINGERPRINT} (the run is older than fedmtl's data check): the data "
            f"under {cfg.data.resolved_root()} is not compared with the run's",
            file=sys.stderr,
        )
        return fingerprint
    try:
        saved = json.loads(saved_path.read_text())
        differences = data_differences(saved, fingerprint)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{saved_path} is damaged (it records the data the run was trained on); nothing was changed. "
            "Restore it, or start a new run with another --run_dir"
        ) from None
    if differences:
        where = "--data.root" if doing == "resume" else f"data.root in {run_dir / 'config.yaml'}"
        raise ValueError(
            f"{doing}: the data under data.root {cfg.data.resolved_root()} differs from the data this run "
            f"was trained on ({saved_path}): {'; '.join(differences)}. Point {where} at the run's data, "
            "or start a new run with another --run_dir; nothing was changed"
        )
    return fingerprint


def record_inputs(cfg: Any, fingerprint: dict[str, Any], fresh: bool, parser: Any) -> None:
    """A fresh run records its data's fingerprint; a resume from another data root (whose data
    matched) records that root in config.yaml, which ``fedmtl validate`` reads."""
    run_dir = Path(cfg.run_dir)
    if fresh:
        atomic_write_text(run_dir / FINGERPRINT, json.dumps(fingerprint, indent=1) + "\n")
        return
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    ns = rundir.read_config(parser, saved)
    used = cfg.data.resolved_root()
    if Path(DataConfig(root=ns.data.root).resolved_root()).resolve() == Path(used).resolve():
        return
    ns.data.root = used
    atomic_write_text(saved, parser.dump(ns, skip_none=False))
