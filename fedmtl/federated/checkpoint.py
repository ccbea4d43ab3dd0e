"""Run checkpoints: one folder per round, published atomically.

    RUN_DIR/checkpoints/round_0007/server.pt          round, server state, history, receipts, config
    RUN_DIR/checkpoints/round_0007/client_0003.pt     one client's state (see store.py)
    RUN_DIR/checkpoints/round_0007/client_0003.optim.pt   its optimiser state (a disk store's)
    RUN_DIR/checkpoints/round_0007/rows_r0007_client_0003.delta.f32   a row its receipt names
    RUN_DIR/checkpoints/round_0007/SHA256SUMS         every file's sha256 (integrity.py)
    RUN_DIR/checkpoints/latest                        the name of the newest complete folder

Every rank writes its own clients into ``round_0007.tmp``; rank 0 then writes the server
file and SHA256SUMS, renames the folder and rewrites ``latest`` (both atomic renames), and
removes older folders but one. A crash at any point leaves ``latest`` naming a complete
checkpoint; a file damaged later makes a resume fall back to the folder before it, and the
damaged folder is kept as ``round_0007.superseded`` when the resumed run republishes its round
(:func:`set_aside`).

``server.pt`` records the config the run computes with (:func:`recorded_config`: the
resolved config without the fields a resume may change, so its bytes do not depend on where
or how the run ran); a resume, ``validate`` and ``test`` compare it with the config they are
given before they load any state, and a resume without ``--config`` can use it.

Resuming never deletes or skips a checkpoint silently: if ``latest`` is missing or names a
folder that is gone or incomplete, :func:`resumable` falls back to the newest complete round
folder and says so; if round folders exist but none is complete, it refuses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmtl.federated import integrity, rundir
from fedmtl.federated.store import (
    ClientState,
    atomic_save,
    encoder_row_numel,
    encoder_row_of,
    join_state,
    safe_load,
    training_file,
    with_encoder,
    writing,
)

_ROUND = re.compile(r"round_\d{4,}")  # a round folder's name (not .tmp, not .superseded)
SUPERSEDED = ".superseded"  # suffix of a complete folder a rerun of its round replaced


def _root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def round_name(round_: int) -> str:
    """A round's checkpoint folder name: ``round_0001``, ``round_12345``."""
    return f"round_{round_:04d}"


def round_globs(rounds: int) -> list[str]:
    """Glob patterns matching exactly the folder names of rounds 1..``rounds`` (``round_0001``
    ...; five digits and more past 9999): a handful, however many rounds."""
    out = []
    digits = 4
    while 10 ** (digits - 1) <= rounds or digits == 4:
        low = 1 if digits == 4 else 10 ** (digits - 1)
        high = min(rounds, 10**digits - 1)
        out += [f"round_{g}" for g in _number_globs(f"{low:0{digits}d}", f"{high:0{digits}d}")]
        digits += 1
    return out


def _number_globs(low: str, high: str) -> list[str]:
    """Glob patterns matching exactly the digit strings from ``low`` to ``high`` (equal lengths)."""
    if low == high:
        return [low]
    rest = len(low) - 1
    if low[0] == high[0]:
        return [low[0] + g for g in _number_globs(low[1:], high[1:])]
    out = []
    first, last = int(low[0]), int(high[0])
    if low[1:] != "0" * rest:  # low's leading digit only from low's tail upwards
        out += [low[0] + g for g in _number_globs(low[1:], "9" * rest)]
        first += 1
    whole_last = high[1:] == "9" * rest
    if not whole_last:
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        out.append(digit + "[0-9]" * rest)
    if not whole_last:
        out += [high[0] + g for g in _number_globs("0" * rest, high[1:])]
    return out


def staging_dir(run_dir: str | Path, round_: int) -> Path:
    return _root(run_dir) / f"{round_name(round_)}.tmp"


def discard(run_dir: str | Path, round_: int) -> None:
    """Rank 0, when a rank could not write its part (a full disk): remove the round's staging
    folder; the latest checkpoint stays as it was."""
    shutil.rmtree(staging_dir(run_dir, round_), ignore_errors=True)


def run_paths(rounds: int | None) -> list[str]:
    """What this module may write, relative to the run directory, for the run's manifest: each
    round's folder and staging folder (with everything in them), the latest pointer and its
    temporary file. Rounds 1..``rounds`` as a few glob patterns (:func:`round_globs`), not a
    name per round: a run meant to go until stopped (``--rounds 100000000``) has a small
    manifest. ``rounds=None``: any round (a run without a manifest)."""
    names = round_globs(rounds) if rounds is not None else ["round_[0-9][0-9][0-9][0-9]"]
    folders = [f"checkpoints/{name}{suffix}" for name in names for suffix in ("", ".tmp", f"{SUPERSEDED}*")]
    return [*folders, "checkpoints/latest", "checkpoints/.latest.tmp"]


def write_client(run_dir: str | Path, round_: int, client: int, state: ClientState) -> None:
    path = staging_dir(run_dir, round_) / f"client_{client:04d}.pt"
    atomic_save(state, path)
    integrity.record(path)  # its sha256, for SHA256SUMS


def link_client(run_dir: str | Path, round_: int, client: int, stored: list[Path]) -> None:
    """The client's checkpoint files as hard links to its disk-store files (its parameters,
    and its optimiser state apart), which hold the same bytes ``write_client`` would write:
    no copy of a thousand states. The store only ever replaces its files (a new file renamed
    over the name), so the links keep this round's bytes. A file system without hard links
    gets a copy. Synced before they are recorded."""
    path = staging_dir(run_dir, round_) / f"client_{client:04d}.pt"
    for source in stored:
        link_file(source, path if source.name.endswith(f"{client:04d}.pt") else training_file(path))


def link_file(source: Path, path: Path) -> None:
    """``path`` as a hard link to (or a copy of) ``source``, synced and recorded."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a rerun of a staging folder
        try:
            os.link(source, path)
        except OSError:
            shutil.copyfile(source, path)
        with open(path, "rb") as f:  # the store writes without fsync; a checkpoint is durable
            os.fsync(f.fileno())
    integrity.record(path)


def _row_name(receipt_round: int, client: int, name: str) -> str:
    return f"rows_r{receipt_round:04d}_client_{client:04d}.{name}.f32"


def write_row(
    run_dir: str | Path,
    round_: int,
    receipt_round: int,
    client: int,
    name: str,
    source: Path | None,
    row: Any = None,
) -> None:
    """A row of ``client`` of round ``receipt_round`` that a pending receipt names or that holds
    its stored encoder: linked from its row file ``source``, or written from ``row``."""
    path = staging_dir(run_dir, round_) / _row_name(receipt_round, client, name)
    if source is not None:
        link_file(source, path)
        return
    data = row.detach().to("cpu", torch.float32).contiguous().numpy()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path, tmp, needed=data.nbytes):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    integrity.record(path)


def load_row(folder: Path, receipt_round: int, client: int, name: str, numel: int) -> Any:
    """A row of ``client`` from checkpoint ``folder`` (see :func:`write_row`): one a pending
    receipt names, or the ``"trained"`` row holding its stored encoder."""
    path = folder / _row_name(receipt_round, client, name)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {folder} has no row {name!r} of client {client}'s receipt of round {receipt_round} ({path.name})"
        )
    data = np.fromfile(path, dtype=np.float32)
    if data.size != numel:
        raise ValueError(
            f"{path} holds {data.size} numbers, not the {numel} of a row; resume from another checkpoint"
        )
    return integrity.finite(torch.from_numpy(data), path, f"client {client}'s row {name!r}")


def publish(run_dir: str | Path, round_: int, server: dict[str, Any], keep: int = 2) -> Path:
    """Rank 0, after every rank wrote its clients: make round ``round_`` the latest checkpoint,
    then delete the older round folders beyond the newest ``keep`` (``checkpoint_keep``; never a
    newer one, a ``.superseded`` one or any other file). ``keep`` 2: a checkpoint found damaged
    on resume falls back to the one before it."""
    root = _root(run_dir)
    staging = staging_dir(run_dir, round_)
    atomic_save(server, staging / "server.pt")
    integrity.seal(staging)  # SHA256SUMS, checked when the folder is read back
    final = root / round_name(round_)
    if final.exists():  # a rerun of the same round: the resume skipped this folder
        set_aside(final)
    staging.rename(final)
    tmp = root / ".latest.tmp"
    with writing(root / "latest", tmp):  # a full disk here: ``latest`` still names the previous one
        tmp.write_text(final.name)
        tmp.replace(root / "latest")
    older = [p for p in round_folders(run_dir) if p.name < final.name]  # never a newer one
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def set_aside(folder: Path) -> None:
    """Make room for a rerun of ``folder``'s round. A complete folder (one a resume skipped as
    damaged, or that ``latest`` never named) is kept as ``round_NNNN.superseded`` (numbered if
    that exists), never deleted: it is evidence, and a user may still want it; an incomplete
    one (no server.pt: a publish cut short) is removed, as it always was."""
    if not _complete(folder):
        shutil.rmtree(folder)
        return
    target = folder.with_name(f"{folder.name}{SUPERSEDED}")
    k = 1
    while target.exists():
        k += 1
        target = folder.with_name(f"{folder.name}{SUPERSEDED}-{k}")
    folder.rename(target)


def _complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / "server.pt").is_file()


def round_folders(run_dir: str | Path) -> list[Path]:
    """Every published-looking round folder (complete or not), oldest first."""
    root = _root(run_dir)
    return sorted(p for p in root.glob("round_*") if p.is_dir() and _ROUND.fullmatch(p.name))


def latest(run_dir: str | Path) -> Path | None:
    """The folder ``latest`` names, if it is complete; None otherwise (see :func:`resumable`)."""
    pointer = _root(run_dir) / "latest"
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    folder = _root(run_dir) / name
    if not name.startswith("round_") or "/" in name or not _complete(folder):
        return None
    return folder


def resumable(run_dir: str | Path) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from and, when it is not the one ``latest`` names, a note
    saying why. ``(None, None)``: the run has no checkpoint at all. Raises ValueError when
    round folders exist but none is complete (nothing to resume from, nothing to delete), or
    none whose files match their checksums (:mod:`fedmtl.federated.integrity`)."""
    folder, note = _newest_complete(run_dir)
    if folder is None:
        return None, note
    older = [f for f in round_folders(run_dir) if _complete(f) and f.name < folder.name]
    return integrity.newest_intact(folder, older, note)


def _newest_complete(run_dir: str | Path) -> tuple[Path | None, str | None]:
    folder = latest(run_dir)
    if folder is not None:
        return folder, None
    complete = [f for f in round_folders(run_dir) if _complete(f)]
    pointer = _root(run_dir) / "latest"
    if complete:
        problem = (
            "is missing" if not pointer.exists() else "is unreadable or does not name a complete checkpoint"
        )
        return complete[-1], (
            f"the latest pointer ({pointer}) {problem}; resuming from {complete[-1].name}, the newest "
            "complete checkpoint"
        )
    if round_folders(run_dir) or pointer.exists():
        raise ValueError(
            f"{_root(run_dir)} holds no complete checkpoint (no round_*/server.pt), so the run cannot be "
            "resumed; nothing was changed. Start a new run with another --run_dir"
        )
    return None, None


#: The key of ``server.pt`` that records the run's config (:func:`config_record`).
CONFIG = "config"


def computing(tree: Any, prefix: str = "") -> Any:
    """A resolved config (``Namespace.as_dict()``) without the fields a resume may change
    (``rundir.RESUMABLE_FIELDS``) and jsonargparse's bookkeeping: what the run computes."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if str(key).startswith("__") or rundir.is_resumable(name):
            continue
        out[str(key)] = computing(value, name)
    return out


def config_record(config: dict[str, Any]) -> str:
    """What ``server.pt`` records of the resolved config ``config``: :func:`computing` as JSON
    text, in the parser's order (as config.yaml lists it), the same on every machine and after
    a resume."""
    return json.dumps(computing(config), default=str)


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as :func:`recorded_config` reads a record back (tuples as lists, paths as
    text), for ``rundir.config_changes``."""
    return json.loads(config_record(config))


def recorded_config(folder: Path) -> dict[str, Any] | None:
    """The config checkpoint ``folder`` was written under (:func:`computing`); None for a
    checkpoint written before fedmtl recorded it. Its tensors are mapped, not read."""
    server = safe_load(folder / "server.pt", mmap=True)
    text = server.get(CONFIG) if isinstance(server, dict) else None
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(
            f"{folder / 'server.pt'}: its record of the run's config is not JSON; resume from another "
            "checkpoint or start a new run"
        ) from None


def load_server(folder: Path) -> dict[str, Any]:
    return integrity.finite(safe_load(folder / "server.pt"), folder / "server.pt", "the server state")


def load_client(folder: Path, client: int, params_only: bool = False, whole: bool = True) -> ClientState:
    """Client ``client``'s state in checkpoint ``folder`` (``params_only``: without the optimiser
    and schedule state a disk store keeps apart). ``whole``: with its encoder read back from
    the checkpoint's row when the state left it there (``store.without_encoder``); false: as
    stored (a resume puts the row back into the run's row store)."""
    path = folder / f"client_{client:04d}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {folder} has no state for client {client} ({path.name})")
    state = integrity.finite(safe_load(path), path, f"client {client}'s state")
    row_round = encoder_row_of(state)
    if whole and row_round is not None:
        row = load_row(folder, row_round, client, "trained", encoder_row_numel(state))
        state = with_encoder(state, row)
    training = training_file(path)
    if params_only or not training.is_file():
        return state
    return join_state(
        state, integrity.finite(safe_load(training), training, f"client {client}'s optimiser state")
    )
