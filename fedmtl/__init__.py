"""fedmtl: simulation of hetero-client federated multi-task learning.

The Python API (docs/python-api.md): :func:`fedmtl.fit` trains a scenario as ``fedmtl fit``
does; :func:`fedmtl.compare` is ``fedmtl report``'s table. Both are imported on first use, so
``import fedmtl`` (which every ``fedmtl`` command does) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedmtl.api import compare, fit

__all__ = ["compare", "fit"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedmtl import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedmtl' has no attribute {name!r}")
