"""Federated methods: one file each (client behaviour + server step), registered by class name.

Importing this package imports every module in it, so each method's ``@register_method``
runs and a config's ``class_path: FedProx`` (or ``--algorithm FedProx``) resolves. Adding a
method is adding one file here (and its test); nothing else changes.
"""

import importlib
import pkgutil

from fedmtl.methods.base import (
    METHODS,
    ClientContext,
    Method,
    Penalty,
    create_method,
    register_method,
    snapshot,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def __getattr__(name: str):
    """Every registered method is an attribute: ``fedmtl.methods.FedProx``."""
    if name in METHODS:
        return METHODS.get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from fedmtl.methods.fedavg import FedAvg  # noqa: E402  (re-exported for type checkers and imports)
from fedmtl.methods.fedhca2 import FedHCA2  # noqa: E402
from fedmtl.methods.local import Local  # noqa: E402

__all__ = [
    "METHODS",
    "ClientContext",
    "FedAvg",
    "FedHCA2",
    "Local",
    "Method",
    "Penalty",
    "create_method",
    "register_method",
    "snapshot",
]
