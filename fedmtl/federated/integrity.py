"""Checkpoint checksums: that the files of a round folder are the ones written.

Every file of a round folder is listed with its sha256 in ``SHA256SUMS``
(``sha256sum -c SHA256SUMS`` checks it by hand), written before the folder is published:
each rank records the digest of the client files it wrote (:func:`record`, a small file next
to each), rank 0 collects them (:func:`seal`). sha256 rather than blake2b: OpenSSL's sha256
uses the CPU's SHA instructions (1.07 GB/s here against 0.64 GB/s for hashlib's blake2b), and
the standard tool verifies it. A resume or a validate hashes the folder it would read
(:func:`newest_intact`); a folder that does not match falls back to the newest older one that
does, and the note names the file and the skipped folder. A folder without ``SHA256SUMS``
(an older run's, or one whose list was lost) is checked by loading each ``.pt`` file: one that
does not load is skipped the same way. Loaded states are checked finite
(:func:`finite`): a NaN a checksum cannot catch (the file was rewritten whole) is refused.

The checks a resume or a validate makes of its inputs (the checkpoint it reads, the data it
trains on) are in :mod:`fedmtl.federated.resume_checks`, which builds on these.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import torch

from fedmtl.federated.health import all_finite, tensors_in
from fedmtl.federated.store import atomic_write_text, safe_load  # atomic: a full disk leaves nothing

CHECKSUMS = "SHA256SUMS"
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
    if not sums.is_file():  # written before fedmtl recorded checksums, or the list was lost
        return _unloadable(folder)
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


def _unloadable(folder: Path) -> str | None:
    """A folder without ``SHA256SUMS``: the first ``.pt`` file that does not load (truncated,
    overwritten), as a problem, so the folder is skipped like one whose checksums fail rather
    than refused when the engine reads it; None when every file loads (tensors mapped, not
    read). Changed bytes that still load cannot be told without the list."""
    for path in sorted(folder.glob("*.pt")):
        try:
            safe_load(path, mmap=True)
        except (ValueError, OSError) as err:
            reason = str(err).split("; it cannot be loaded")[0].removeprefix(f"{path} ")
            return f"{path} {reason}, and the folder has no {CHECKSUMS} to check it against"
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
    if isinstance(tree, torch.Tensor):
        yield prefix or "tensor", tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _named_tensors(value, f"{prefix}[{i}]")
