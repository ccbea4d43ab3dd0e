"""Whether the user watches a terminal: progress bars there; in logs (CI) they would be noise.

A module of its own, importing nothing heavy, so the command line and the engine share it.
"""

from __future__ import annotations

import sys


def interactive() -> bool:
    """Whether standard error, where progress goes, is a terminal."""
    return sys.stderr.isatty()
