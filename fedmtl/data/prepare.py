"""``fedmtl data prepare ARCHIVE... [--root DIR]``: unpack the downloaded dataset archives.

The public FedHCA² README (innovator-zero/FedHCA2) links one archive for PASCAL-Context and
one for NYUD-v2; unpacked side by side they give ``PASCALContext/`` and ``NYUDv2/`` in the
layout fedmtl reads (:mod:`fedmtl.data.layout`). Nothing is downloaded: pass the files.

Where the contents of an archive go (``.tar``, ``.tar.gz`` / ``.tgz``, ``.tar.bz2``,
``.tar.xz``, ``.zip``):

* a top-level ``PASCALContext/`` or ``NYUDv2/`` goes to ``ROOT/PASCALContext`` / ``ROOT/NYUDv2``;
* otherwise, when the archive holds one folder only (a wrapper, e.g. ``data/``), the same
  rules apply inside it (one level);
* otherwise a folder that holds a dataset's split file (``ImageSets/Context/train.txt`` or
  ``val.txt``: PASCAL-Context; ``gt_sets/{train,val}.txt``: NYUD-v2) goes to ``ROOT`` under
  that dataset's folder name (e.g. ``PASCAL_MT/`` -> ``ROOT/PASCALContext``), and so does the
  archive's top level itself when it holds them (an archive of a dataset folder's contents);
* Cityscapes' archives (``leftImg8bit_trainvaltest.zip``, ``gtFine_trainvaltest.zip``,
  ``disparity_trainvaltest.zip`` from cityscapes-dataset.com) each hold one of
  ``leftImg8bit/``, ``gtFine/``, ``disparity/`` at the top: it goes to ``ROOT/Cityscapes/``
  under its own name (their README and license are not unpacked);
* anything else at that level (a README, other folders) is not unpacked, and is listed; an
  archive in which no dataset is found is refused.

Safety: a member with an absolute name, a ``..`` component, a link pointing outside the
archive's folder, or a device / fifo is refused (tar members also pass tarfile's ``data``
filter), and the archive is not unpacked.

Nothing is overwritten: every archive is first unpacked in full into a staging folder inside
the root (``ROOT/.fedmtl-prepare.partial.HOST.PID``, holding the marker file
``.fedmtl-prepare-partial``, which names its owner),
then compared with what the root holds: a file that exists with different content is an error
naming it and nothing is written; a file with the same content is skipped; only then are the
new files moved in (a dataset folder the root lacks is renamed into place whole, so it appears
complete or not at all). A failed or interrupted prepare deletes its staging folder; if it
could not (killed), a later prepare does, once its owner is gone (:mod:`fedmtl.data.rootlock`).
One prepare at a time per root: a second waits for the first. Run twice with the same archives
(one after the other or at once), the second run changes nothing and says so. At the end the datasets found in the archives are checked
(:mod:`fedmtl.data.check`) and the table printed.
"""

from __future__ import annotations

import contextlib
import filecmp
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

from tqdm import tqdm

from fedmtl.data import rootlock
from fedmtl.data.datasets import DATASETS
from fedmtl.data.layout import CITYSCAPES_PARTS

CITYSCAPES_FOLDER = "Cityscapes"

STAGING = ".fedmtl-prepare.partial"  # inside the root, while archives are unpacked
MARKER = ".fedmtl-prepare-partial"  # in the staging folder: only a folder holding it is ours to delete
_WHOSE = "fedmtl data prepare's"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
ZIP_SUFFIXES = (".zip",)
_JUNK = {"__MACOSX", ".DS_Store", MARKER}  # archive debris that is neither data nor worth listing


class RefusedMember(ValueError):
    """An archive member that would be written outside the staging folder, or is not a file."""


@dataclass
class Placed:
    """What one dataset folder of the archives did to the root."""

    folder: str  # PASCALContext / NYUDv2
    sources: list[str] = field(default_factory=list)  # archive: path inside it
    added: int = 0
    identical: int = 0


@dataclass
class PrepareResult:
    root: Path
    placed: dict[str, Placed]  # folder name -> what happened
    ignored: list[str]  # "archive: entry" not unpacked
    removed_leftover: bool

    @property
    def datasets(self) -> list[str]:
        by_folder = {DATASETS.get(n).root_folder: n for n in DATASETS.names()}
        # a Cityscapes part is placed as "Cityscapes/<part>"
        return list(dict.fromkeys(by_folder[f.split("/")[0]] for f in self.placed))

    @property
    def changed(self) -> bool:
        return any(p.added for p in self.placed.values())


# --------------------------------------------------------------------------- unpacking


def _archive_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(ZIP_SUFFIXES):
        return "zip"
    if name.endswith(TAR_SUFFIXES):
        return "tar"
    if zipfile.is_zipfile(path):
        return "zip"
    if tarfile.is_tarfile(path):
        return "tar"
    raise ValueError(
        f"{path} is not a tar or zip archive (by its name or content); fedmtl data prepare unpacks "
        f"{', '.join(TAR_SUFFIXES + ZIP_SUFFIXES)} files"
    )


def _safe_parts(archive: Path, name: str) -> tuple[str, ...]:
    """The path components of a member name; refuses names that would leave the folder."""
    unix = name.replace("\\", "/")
    if unix.startswith("/") or PureWindowsPath(name).drive:
        raise RefusedMember(f"{archive}: member {name!r} has an absolute path")
    parts = tuple(p for p in PurePosixPath(unix).parts if p not in ("", "."))
    if ".." in parts:
        raise RefusedMember(f"{archive}: member {name!r} has a '..' component")
    return parts


def _tar_filter(archive: Path, on_member: Callable[[], None]) -> Callable:
    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        on_member()
        parts = _safe_parts(archive, member.name)
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise RefusedMember(f"{archive}: member {member.name!r} is not a file, folder or link")
        if member.issym() or member.islnk():
            link = member.linkname.replace("\\", "/")
            base = parts[:-1] if member.issym() else ()  # a symlink is relative to its folder
            resolved = os.path.normpath(os.path.join(*base, link)) if (base or link) else ""
            if link.startswith("/") or PureWindowsPath(link).drive or resolved.split("/")[0] == "..":
                raise RefusedMember(f"{archive}: link {member.name!r} points outside the archive ({link!r})")
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+ / 3.11.4+
            try:
                return tarfile.data_filter(member, dest)
            except tarfile.FilterError as err:
                raise RefusedMember(f"{archive}: member {member.name!r} refused ({err})") from None
        return member

    return check


def _unpack_tar(archive: Path, dest: Path, bar: tqdm) -> None:
    with open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r:*") as tar:
        tar.extractall(dest, filter=_tar_filter(archive, lambda: bar.update(raw.tell() - bar.n)))
        bar.update(bar.total - bar.n)


def _unpack_zip(archive: Path, dest: Path, bar: tqdm) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        for info in members:  # every name is checked before anything is written
            _safe_parts(archive, info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise RefusedMember(f"{archive}: member {info.filename!r} is a symbolic link")
        for info in members:
            target = dest.joinpath(*_safe_parts(archive, info.filename))
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                raise RefusedMember(f"{archive}: member {info.filename!r} is listed twice")
            with zf.open(info) as src, open(target, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            bar.update(info.compress_size)


def unpack(archive: Path, dest: Path, progress: bool = False) -> None:
    """Unpack ``archive`` into the empty folder ``dest``, refusing unsafe members; ValueError
    when the archive is corrupt or truncated."""
    kind = _archive_kind(archive)
    size = archive.stat().st_size
    with tqdm(
        total=size, desc=f"unpack {archive.name}", unit="B", unit_scale=True, disable=not progress
    ) as bar:
        try:
            (_unpack_zip if kind == "zip" else _unpack_tar)(archive, dest, bar)
        except RefusedMember:
            raise
        except (
            tarfile.TarError,
            zipfile.BadZipFile,
            EOFError,
            ValueError,
            OSError,
            zlib.error,
            lzma.LZMAError,
        ) as err:
            if isinstance(err, OSError) and err.filename is not None:  # writing, not reading, failed
                raise ValueError(
                    f"cannot write {err.filename} ({err.strerror}) while unpacking {archive}"
                ) from None
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(
                f"{archive} cannot be unpacked ({type(err).__name__}: {detail}): it is corrupt or "
                "incomplete (an interrupted download?); download it again"
            ) from None


# --------------------------------------------------------------------------- where it goes


def _dataset_of(folder: Path) -> str | None:
    """The dataset folder name (PASCALContext / NYUDv2) whose split file ``folder`` holds."""
    for name in DATASETS.names():
        spec = DATASETS.get(name)
        layout = spec.dataset_class.layout_class(folder)
        if any(layout.split_file(split).is_file() for split in ("train", "val")):
            return spec.root_folder
    return None


def locate(top: Path, wrapped: bool = False) -> tuple[dict[str, Path], list[str]]:
    """The dataset folders in an unpacked archive (folder name -> where it is) and the entries
    that are not unpacked (paths relative to ``top``); see the module docstring for the rules."""
    folders = {DATASETS.get(n).root_folder for n in DATASETS.names()}
    entries = sorted((e for e in top.iterdir() if e.name not in _JUNK), key=lambda e: e.name)
    dirs = [e for e in entries if e.is_dir() and not e.is_symlink()]
    found = {e.name: e for e in dirs if e.name in folders}
    if not found:  # a part of the Cityscapes release: its folder goes into Cityscapes/
        found = {f"{CITYSCAPES_FOLDER}/{e.name}": e for e in dirs if e.name in CITYSCAPES_PARTS}
    if not found:
        for e in dirs:
            name = _dataset_of(e)
            if name is not None and name not in found:
                found[name] = e
    if not found and (name := _dataset_of(top)) is not None:
        return {name: top}, []
    if not found and not wrapped and len(entries) == 1 and dirs:
        inner, ignored = locate(dirs[0], wrapped=True)
        return inner, [f"{dirs[0].name}/{i}" for i in ignored]
    used = set(found.values())
    return found, [e.name + ("/" if e.is_dir() else "") for e in entries if e not in used]


def _files(folder: Path) -> list[Path]:
    """Every file (and link) under ``folder``, relative to it, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        out += [(base / f).relative_to(folder) for f in filenames]
        out += [(base / d).relative_to(folder) for d in dirnames if (base / d).is_symlink()]
    return sorted(out)


def _same(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    return a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)


# --------------------------------------------------------------------------- prepare


def prepare(archives: Sequence[str | Path], root: str | Path, progress: bool = False) -> PrepareResult:
    """Unpack ``archives`` into ``root`` (see the module docstring); nothing is overwritten and
    a failure leaves the root as it was (ValueError / FileNotFoundError naming the problem)."""
    root = Path(root)
    paths = [Path(a) for a in archives]
    if not paths:
        raise ValueError("no archive given: fedmtl data prepare ARCHIVE... --root DIR")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"archive {path} not found")
        _archive_kind(path)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--root {root} is a file, not a folder: choose another --root")
    folders = {DATASETS.get(n).root_folder for n in DATASETS.names()}
    if root.name in folders and not (root / root.name).exists():
        raise ValueError(
            f"--root {root} is a dataset folder; --root is the data root that holds PASCALContext/ and "
            f"NYUDv2/ (here: --root {root.parent})"
        )
    created = not root.exists()
    try:
        # One writer per data root (rootlock): a second prepare waits, then finds the files there.
        with rootlock.hold(root, "--root") as held:
            removed = bool(rootlock.clear_leftovers(root, STAGING, MARKER, _WHOSE, held.locked))
            return _prepare_held(paths, root, removed, progress)
    finally:
        if created:  # a failed prepare leaves no empty root (unless another process wrote there)
            with contextlib.suppress(OSError):
                root.rmdir()


def _prepare_held(paths: list[Path], root: Path, removed: bool, progress: bool) -> PrepareResult:
    """:func:`prepare` while this process holds ``root``: stage, compare, move into place."""
    staging = rootlock.staging_path(root, STAGING)
    try:
        try:
            staging.mkdir()
        except PermissionError as err:
            raise ValueError(
                f"cannot create {err.filename or staging} ({err.strerror}): choose another --root"
            ) from None
        rootlock.write_marker(
            staging, MARKER, "fedmtl data prepare is unpacking archives here; removed when done"
        )

        # 1. unpack every archive in full, each into its own folder
        found: list[tuple[Path, str, Path]] = []  # archive, dataset folder name, unpacked folder
        ignored: list[str] = []
        for k, path in enumerate(paths):
            dest = staging / str(k)
            dest.mkdir()
            unpack(path, dest, progress)
            located, rest = locate(dest)
            if not located:
                top = ", ".join(rest[:8]) or "nothing"
                raise ValueError(
                    f"{path} holds no PASCALContext/ or NYUDv2/ dataset (it holds: {top}) and no Cityscapes "
                    f"part ({', '.join(p + '/' for p in CITYSCAPES_PARTS)}); expected "
                    "the archives linked from the public FedHCA² README (innovator-zero/FedHCA2) or "
                    "Cityscapes' *_trainvaltest.zip"
                )
            found += [(path, name, folder) for name, folder in located.items()]
            ignored += [f"{path}: {entry}" for entry in rest]

        # 2. compare with the root (and the archives with each other): nothing is written yet
        placed: dict[str, Placed] = {}
        new: dict[Path, Path] = {}  # target file -> unpacked file
        conflicts: list[str] = []
        for path, name, folder in found:
            entry = placed.setdefault(name, Placed(name))
            entry.sources.append(f"{path}: {folder.relative_to(staging).as_posix().partition('/')[2] or '.'}")
            target_folder = root / name
            if (target_folder.exists() or target_folder.is_symlink()) and not target_folder.is_dir():
                conflicts.append(f"{target_folder} exists and is not a folder")
                continue
            for rel in _files(folder):
                source, target = folder / rel, target_folder / rel
                if target in new:
                    if _same(new[target], source):
                        entry.identical += 1
                    else:
                        conflicts.append(f"{target} differs between the archives")
                elif target.exists() or target.is_symlink():
                    if _same(target, source):
                        entry.identical += 1
                    else:
                        conflicts.append(f"{target} already exists with other content than in {path}")
                else:
                    new[target] = source
                    entry.added += 1
        if conflicts:
            more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
            raise ValueError(
                f"{conflicts[0]}{more}; fedmtl data prepare never overwrites a file, so nothing was written: "
                f"move the existing files away (or choose another --root) and run again"
            )

        # 3. move into place: a missing dataset folder whole, else file by file
        for _, name, folder in found:
            target_folder = root / name
            if not target_folder.exists() and not target_folder.is_symlink():
                target_folder.parent.mkdir(parents=True, exist_ok=True)  # Cityscapes/ of a part
                os.replace(folder, target_folder)
                continue
            for rel in _files(folder):
                source, target = folder / rel, target_folder / rel
                if new.get(target) == source and not (target.exists() or target.is_symlink()):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(source, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PrepareResult(root, placed, ignored, removed)


def format_result(result: PrepareResult) -> str:
    lines = []
    if result.removed_leftover:
        lines.append(f"removed the staging folder an interrupted prepare left in {result.root}")
    for p in result.placed.values():
        target = result.root / p.folder
        if p.added and p.identical:
            lines.append(f"{target}: added {p.added:,} files, {p.identical:,} already there (identical)")
        elif p.added:
            lines.append(f"{target}: unpacked {p.added:,} files from {'; '.join(p.sources)}")
        else:
            lines.append(
                f"{target}: nothing changed, its {p.identical:,} files are already there (identical)"
            )
    lines += [f"not unpacked (not part of a dataset): {entry}" for entry in result.ignored]
    if not result.changed:
        lines.append("nothing changed: every file of the archives is already in the root")
    return "\n".join(lines)


def prepare_command(archives: Sequence[str], root: str | None, progress: bool) -> None:
    """``fedmtl data prepare``: unpack, print what changed, check and print the table."""
    from fedmtl.data.check import check_data, format_report, raise_on_problems

    if root is None:
        from fedmtl.config import DataConfig

        root = DataConfig().resolved_root()
    result = prepare(archives, root, progress=progress)
    print(format_result(result))
    reports = check_data(root, result.datasets, progress=progress)
    print()
    print(format_report(reports))
    raise_on_problems(reports, root, doing="data prepare: unpacked, but the check found")
