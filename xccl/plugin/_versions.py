"""Vendor SDK versions and the order xccl compares them in (``Support.min_sdk``, ``Runtime.sdk_versions``).

Vendors number releases with pre-release tags between the numbers: CANN goes ``8.0.RC1 < 8.0.RC2 < 8.0.0 <
8.1.RC1.alpha001 < 8.1.RC1 < 8.6.0 < 9.0.0``. :func:`version_key` orders such strings: each dot-separated part is
a number (a release part) or letters then an optional number (a pre-release of the release part at that place,
alpha < beta < rc < any other tag); a missing part counts as ``0``; the first part is a number.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["version_below", "version_key"]

_PART: Final = re.compile(r"(?:(\d+)|([A-Za-z]+)(\d*))")
_TAGS: Final = {"alpha": 0, "beta": 1, "rc": 2}
_RELEASE: Final = 9  # sorts after every pre-release tag
_WIDTH: Final = 8  # keys are padded to this many parts, so that a missing part compares as 0


def version_key(version: str) -> tuple[tuple[int, int], ...] | None:
    """A sortable key for ``version``, or None when it is not of the form described in the module docstring."""
    key = []
    for part in version.strip().split("."):
        m = _PART.fullmatch(part)
        if m is None:
            return None
        number, tag, tag_number = m.groups()
        if number is not None:
            key.append((_RELEASE, int(number)))
        else:
            key.append((_TAGS.get(tag.lower(), len(_TAGS)), int(tag_number or 0)))
    if not key or key[0][0] != _RELEASE or len(key) > _WIDTH:  # a version starts with a number
        return None
    return tuple(key) + ((_RELEASE, 0),) * (_WIDTH - len(key))


def version_below(version: str, floor: str) -> bool:
    """Whether ``version`` is older than ``floor``; False when either cannot be read (an unknown version blocks
    nothing: the vendor's own check still runs)."""
    have, need = version_key(version), version_key(floor)
    return have is not None and need is not None and have < need
