"""Settings read from the environment: a number of seconds, checked once, with the variable named when it is wrong."""

from __future__ import annotations

import math
import os

from ..errors import InitError

__all__ = ["seconds"]


def seconds(name: str, default: float, *, zero: str = "") -> float:
    """The environment variable ``name`` as a finite number of seconds; ``default`` when unset or empty.

    Args:
        name: the variable.
        default: its value when unset.
        zero: what 0 means, where 0 is allowed ("turns the health watch off"); "" where it must be positive.

    Raises:
        InitError: the value is not such a number (callers ask at ``xccl.init``, so a bad value fails there).
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and (value > 0 or (value == 0 and zero)):
        return value
    allowed = f"a number of seconds >= 0 (0 {zero})" if zero else "a positive number of seconds"
    raise InitError(f"environment variable {name}={raw!r} is not {allowed}; fix or unset it")
