"""Range checks of the methods' options, one line each in a constructor.

Each check raises one ValueError that names the option by its config path and the range it
must lie in: ``algorithm.NAME must be REQUIREMENT, got VALUE`` (``note`` follows the
requirement, ``after`` the value: what the option is, the paper's value, the fix; NAME may
carry what the option is too). Every comparison is written so that NaN fails it. An option
that may be null is checked only when it is not, with ``note=" or null"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn


def refuse(name: str, requirement: str, value: Any, after: str = "") -> NoReturn:
    raise ValueError(f"algorithm.{name} must be {requirement}, got {value!r}{after}")


def within(name: str, value: float, interval: str, note: str = "", after: str = "") -> None:
    """``value`` in ``interval``, written as in mathematics: ``"(0, 1]"``, ``"[0, 1)"``."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    above_low = low <= value if interval[0] == "[" else low < value
    below_high = value <= high if interval[-1] == "]" else value < high
    if not (above_low and below_high):
        refuse(name, f"in {interval}{note}", value, after)


def positive(name: str, value: float, note: str = "", after: str = "", finite: bool = False) -> None:
    """``value`` > 0 (and not infinite, when ``finite``)."""
    if not (value > 0 and (not finite or math.isfinite(value))):
        refuse(name, f"> 0{note}", value, after)


def non_negative(name: str, value: float, note: str = "", after: str = "", finite: bool = False) -> None:
    """``value`` >= 0 (and not infinite, when ``finite``)."""
    if not (value >= 0 and (not finite or math.isfinite(value))):
        refuse(name, f">= 0{note}", value, after)


def integer_at_least(name: str, value: int, low: int, note: str = "") -> None:
    """``value`` an integer (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        refuse(name, f"an integer >= {low}{note}", value)


def one_of(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        refuse(name, f"one of {list(choices)}", value)


def either(name: str, value: str, first: str, second: str, note: str = "") -> None:
    """``value`` is ``first`` or ``second``."""
    if value not in (first, second):
        refuse(name, f"{first!r} or {second!r}{note}", value)


def boolean(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        refuse(name, "true or false", value)
