"""The scenario configs that ship with fedmtl, so ``--config scenario1.yaml`` works from any directory.

They live in the repository's ``configs/`` (the only copy), which pyproject.toml installs as the
package ``fedmtl.configs``: a wheel holds them as ``fedmtl/configs/...``, an editable install
reads the folder in place. ``fedmtl configs`` lists them, ``fedmtl configs show NAME`` prints one.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_SUFFIXES = (".yaml", ".yml")
_extracted = contextlib.ExitStack()  # bundled files extracted from a zip import, kept to the end
atexit.register(_extracted.close)


def root() -> Traversable:
    """The folder of the bundled configs: the ``configs/`` beside this package when it runs from
    a source tree (which may shadow an installed fedmtl), else the installed ``fedmtl.configs``."""
    source = Path(__file__).resolve().parent.parent
    if (source / "pyproject.toml").is_file() and (source / "configs" / "__init__.py").is_file():
        return source / "configs"
    return importlib.resources.files("fedmtl.configs")


def names() -> list[str]:
    """Every bundled config by its relative name (``scenario1.yaml``, ``methods/fedprox.yaml``)."""

    def walk(folder: Traversable, prefix: str) -> list[str]:
        found = []
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith((".", "_")):
                found += walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(_SUFFIXES):
                found.append(prefix + entry.name)
        return found

    return sorted(walk(root(), ""), key=lambda name: (name.count("/"), name))


def _file(name: str) -> Traversable:
    entry = root()
    for part in name.split("/"):
        entry = entry / part
    return entry


def find(name: str) -> str | None:
    """The bundled config that ``name`` means: the one of that relative name (a leading
    ``configs/`` is the repository's folder, so the documented commands work anywhere), else the only
    one of that base name. None when none has it; ValueError when several share the base name."""
    key = name.replace("\\", "/").removeprefix("./")
    known = names()
    matches = [n for n in (key, key.removeprefix("configs/")) if n in known]
    if not matches and "/" not in key:
        matches = [n for n in known if n.rsplit("/", 1)[-1] == key]
        if len(matches) > 1:
            raise ValueError(
                f"config {name} is ambiguous: the bundled configs {', '.join(matches)} all have that "
                "name; give one of them"
            )
    return matches[0] if matches else None


def path(name: str) -> str:
    """A file-system path to the bundled config ``name`` (a relative name from ``names()``)."""
    entry = _file(name)
    if isinstance(entry, Path):
        return str(entry)
    return str(_extracted.enter_context(importlib.resources.as_file(entry)))


def text(name: str) -> str:
    return _file(name).read_text(encoding="utf-8")


def description(name: str) -> str:
    """The first sentence of a bundled config's opening comment, without the ``#``: its
    comment lines joined until one ends a sentence (configs wrap their first sentence)."""
    words: list[str] = []
    for line in text(name).splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if words:
                break
            continue
        comment = stripped.lstrip("#").strip()
        if not comment:
            break
        words.append(comment)
        if comment.endswith((".", ":")):
            break
    return " ".join(words).rstrip(":")
