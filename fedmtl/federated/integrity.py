"""Integrity of what a run reads back: its checkpoints and its data.

Checkpoints. Every file of a round folder is listed with its sha256 in ``SHA256SUMS``
(``sha256sum -c SHA256SUMS`` checks it by hand), written before the folder is published:
each rank records the digest of the client files it wrote (:func:`record`, a small file next
to each), rank 0 collects them (:func:`seal`). sha256 rather than blake2b: OpenSSL's sha256
uses the CPU's SHA instructions (1.07 GB/s here against 0.64 GB/s for hashlib's blake2b), and
the standard tool verifies it. A resume or a validate hashes the folder it would read
(:func:`newest_intact`); a folder that does not match falls back to the newest older one that
does, and the note names the file and the skipped folder. Loaded states are checked finite
(:func:`finite`): a NaN a checksum cannot catch (the file was rewritten whole) is refused.

Data. A fresh fit records ``RUN_DIR/data_fingerprint.json``: per dataset, the split files'
sha256, their image counts and the size of every file the loaders read, by path relative to
the dataset folder (the same data under another root matches). A resume or a validate
compares the data under its ``data.root`` with it and refuses a difference, naming it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from fedmtl.federated import rundir
from fedmtl.federated.health import all_finite, tensors_in
from fedmtl.federated.store import atomic_write_text  # a full disk: one line, no temporary file left

CHECKSUMS = "SHA256SUMS"
FINGERPRINT = "data_fingerprint.json"
SHOWN = 3  # differences named per kind in a message

# Folder -> (stat of each file, problem): a resume hashes the folder it reads in the CLI and
# again in the engine; the second look costs a stat per file, not a read.
_verified: dict[Path, tuple[tuple, str | None]] = {}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- checkpoints


def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def record(path: Path) -> None:
    """The rank that wrote checkpoint file ``path`` records its digest (it is in that rank's
    page cache; rank 0 would read it over the network on several nodes). Not synced: the
    sidecar lives only until ``seal``, which writes SHA256SUMS durably."""
    atomic_write_text(_sidecar(path), f"{sha256_file(path)}  {path.name}\n", durable=False)


def seal(staging: Path) -> None:
    """Rank 0, once every file of a round is written: ``SHA256SUMS`` lists each ``.pt`` file
    and each receipt's row (``.f32``)."""
    lines = []
    for path in _checkpointed(staging):
        sidecar = _sidecar(path)
        digest = sidecar.read_text().split()[0] if sidecar.is_file() else sha256_file(path)
        lines.append(f"{digest}  {path.name}\n")
    atomic_write_text(staging / CHECKSUMS, "".join(lines))
    for path in [*staging.glob(".*.pt.sha256"), *staging.glob(".*.f32.sha256")]:
        path.unlink()


def _checkpointed(folder: Path) -> list[Path]:
    """The files of a checkpoint folder that SHA256SUMS lists."""
    return sorted([*folder.glob("*.pt"), *folder.glob("*.f32")])


def _listed(sums: Path) -> dict[str, str] | None:
    """File name -> sha256 as ``SHA256SUMS`` lists them; None when it is not such a list."""
    listed = {}
    try:
        lines = sums.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in filter(str.strip, lines):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)", line.strip())
        if match is None:
            return None
        listed[match.group(2)] = match.group(1)
    return listed


def _verify(folder: Path) -> str | None:
    sums = folder / CHECKSUMS
    if not sums.is_file():
        return None  # a checkpoint written before fedmtl recorded checksums: nothing to compare
    listed = _listed(sums)
    if listed is None:
        return f"{sums} is damaged (it is not the list of sha256 sums written with the checkpoint)"
    for name, digest in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing (it is listed in {sums.name})"
        if sha256_file(path) != digest:
            return f"{path} does not match the sha256 recorded in {sums.name} when it was written (it changed on disk)"
    unlisted = [p.name for p in _checkpointed(folder) if p.name not in listed]
    if unlisted:
        return f"{folder / unlisted[0]} is not listed in {sums.name} (it was not written with the checkpoint)"
    return None


def verify(folder: Path) -> str | None:
    """None when every file of round folder ``folder`` matches its ``SHA256SUMS``; else the
    problem, naming the file."""
    stats = tuple((p.name, *_stat(p)) for p in sorted(folder.iterdir()))
    key = folder.resolve()
    if key in _verified and _verified[key][0] == stats:
        return _verified[key][1]
    problem = _verify(folder)
    _verified[key] = (stats, problem)
    return problem


def _stat(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def newest_intact(folder: Path, older: list[Path], note: str | None) -> tuple[Path, str | None]:
    """``folder`` (the checkpoint a resume would read) if its files match their checksums;
    otherwise the newest of ``older`` (oldest first) that does, with a note naming the file and
    the folder skipped. Raises ValueError when none does."""
    problem = verify(folder)
    if problem is None:
        return folder, note
    for candidate in reversed(older):
        if verify(candidate) is None:
            skipped = (
                f"checkpoint {folder.name} skipped: {problem}; falling back to {candidate.name}, the newest "
                "intact checkpoint"
            )
            return candidate, f"{note}; {skipped}" if note else skipped
    raise ValueError(
        f"{problem}, and no earlier checkpoint is intact to fall back to; nothing was changed. Restore "
        "the file from a copy, or start a new run with another --run_dir"
    )


def finite(state: Any, path: Path, what: str) -> Any:
    """``state`` read from ``path``, if every tensor in it is finite; else ValueError naming it."""
    if all_finite(tensors_in(state)):
        return state
    bad = [name for name, t in _named_tensors(state) if t.is_floating_point() and not t.isfinite().all()]
    shown = ", ".join(bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
    raise ValueError(
        f"{path}: {what} holds NaN/inf ({shown}), so it cannot be resumed or evaluated; nothing was "
        f"changed. Move {path.parent.name} out of {path.parent.parent} to resume from the checkpoint "
        "before it, or start a new run with another --run_dir"
    )


def _named_tensors(tree: Any, prefix: str = "") -> Any:
    import torch

    if isinstance(tree, torch.Tensor):
        yield prefix or "tensor", tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _named_tensors(value, f"{prefix}[{i}]")


# --------------------------------------------------------------------------- data


def _relative(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def data_fingerprint(cfg: Any) -> dict[str, Any]:
    """Per dataset the run reads: its split files (sha256, image count) and the size of every
    file the loaders read for the run's tasks, by path relative to the dataset folder."""
    from fedmtl.data.datasets import DATASETS, dataset_root
    from fedmtl.data.layout import SPLITS, read_split

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
            if not path.is_file():
                continue
            ids = read_split(path)
            splits[split] = {"file": _relative(path, folder), "sha256": sha256_file(path), "images": len(ids)}
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


def check_inputs(cfg: Any, resume: bool, doing: str = "resume") -> dict[str, Any]:
    """The leader, before any process starts or anything is written: a resumed (or validated)
    run's checkpoint holds finite states only, and its data is the run's. Returns the data's
    fingerprint, for :func:`record_inputs`."""
    from fedmtl.federated import checkpoint
    from fedmtl.federated.scenario import count_clients

    run_dir = Path(cfg.run_dir)
    fingerprint = data_fingerprint(cfg)
    if not resume:
        return fingerprint
    folder, _ = checkpoint.resumable(run_dir)
    if folder is not None:  # the engine reads them again: a NaN found there would stop one rank only
        checkpoint.load_server(folder)
        for client in range(count_clients(cfg)):
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
    from fedmtl.config import DataConfig

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
