"""Griffe extension for the API reference: Sphinx roles in docstrings as links.

fedmtl's docstrings are Google style with Sphinx cross-reference roles (``:func:`thin```,
``:class:`~fedmtl.aggregation.FlatLayout```), which Markdown would print as they are. This
extension rewrites each role, once a package is loaded, into an *optional* autorefs reference:
a link where the target is rendered on the site, plain code where it is not (a private
function, an object without a docstring). Names are resolved as Sphinx would: as written,
then relative to the object, its class and its module. ``~`` shows the last component only.

Loaded by mkdocs.yml (``plugins.mkdocstrings.handlers.python.options.extensions``); the
docstrings in the code are not changed.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?P<kind>func|meth|class|mod|data|attr|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`"
)


def _resolve(loader: griffe.GriffeLoader, obj: griffe.Object, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``, or None when nothing of that name exists."""
    scopes = [""]
    scope: griffe.Object | None = obj
    while scope is not None:
        scopes.append(scope.path + ".")
        scope = scope.parent
    for prefix in scopes:
        path = prefix + target
        try:
            found = loader.modules_collection[path]
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        try:
            return found.path if not found.is_alias else found.final_target.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return found.path
    return None


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is None or ":" not in obj.docstring.value:
                continue

            def replace(match: re.Match[str], obj: griffe.Object = obj) -> str:
                target = match["target"].strip()
                shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
                path = _resolve(loader, obj, target)
                code = f"<code>{html.escape(shown)}</code>"
                if path is None:
                    return code
                return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

            obj.docstring.value = ROLE.sub(replace, obj.docstring.value)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)
