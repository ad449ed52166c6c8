"""The torch_npu release xccl works with, and what differs between releases.

torch_npu pairs one release with each torch (torch_npu X.Y.Z pins ``torch==X.Y.Z.*``), so a user on torch 2.8 runs
torch_npu 2.8.0 and meets that release's behaviour, not 2.13's. :func:`release` says which: ``XCCL_SIM_TORCH_NPU``
where set, else the torch_npu installed (its package metadata: no import), else the release paired with the
installed torch, which is what a simulation on a laptop stands for. :class:`Release` holds the facts xccl relies on
that differ between releases; the capability table (``AscendRuntime.capabilities``), the simulated group
(``_simprofile.hccl_profile``) and the run time (``_vendor.ascend_runtime``) read them.

Read in Ascend/pytorch at the tags that built the wheels (COMPATIBILITY.en.md @9e73e70 :24-33): 2.7.1 and 2.8.0 at
``v7.2.0-pytorch2.7.1`` (9ae698c) and ``v7.2.0-pytorch2.8.0`` (def4860), their ``.post2``/``.post3`` at the 7.3.0
tags (3be71f4, 729dda3), ``.post4`` on at the 26.0.0 tags (d99d6cd, f3ecfe4); 2.13.0 at 462f4e1. Releases 2.9 to
2.12 were not read: they are simulated as 2.13.0 (docs/fidelity.md says so).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

__all__ = ["SIM_TORCH_NPU_ENV", "Release", "paired", "release"]

#: The torch_npu release to simulate: a release wheel's version (``2.8.0``, ``2.8.0.post4``) or the branch it was
#: built from (``v2.12.0`` development, ``v2.12.0-26.1.0`` release).
SIM_TORCH_NPU_ENV: Final = "XCCL_SIM_TORCH_NPU"
_NEWEST: Final = "2.13.0"
_V72: Final = "Ascend/pytorch@9ae698c (2.7.1) and @def4860 (2.8.0) torch_npu/"


@final
@dataclass(frozen=True, slots=True)
class Release:
    """What one torch_npu release does, where releases differ."""

    #: As given: ``2.8.0``, ``2.8.0.post4``, ``v2.12.0``.
    version: str
    #: The variable torch_npu reads for its watchdog's mode first, its older names, and the modes it accepts.
    mode_env: str = "TORCH_HCCL_ASYNC_ERROR_HANDLING"
    mode_aliases: tuple[str, ...] = ("HCCL_ASYNC_ERROR_HANDLING",)
    modes: frozenset[int] = frozenset({0, 1, 2, 3})
    #: Whether HCCL's reduce op map has PREMUL_SUM (without: "Unhandled ReduceOp").
    premul_sum: bool = True
    #: Whether HCCL's dtype map has uint16/32/64 and the float8 types.
    wide_dtypes: bool = True
    #: Whether ``import torch_npu`` replaces ``_AllGatherBase.backward`` (torch's own refuses HCCL groups).
    all_gather_backward: bool = True
    #: Where the differences from 2.13.0 were read ("" for 2.13.0 itself).
    source: str = ""
    #: The CANN release Ascend pairs with it (COMPATIBILITY.en.md @b48e648, which pairs none with 2.13.0: 9.0.0,
    #: the 26.0.0 line's, is taken there), the simulation's default CANN.
    cann: str = "9.0.0"


def _line(version: str) -> Release:
    """The facts of ``version`` (2.7.1 and 2.8.0 up to their 26.0.0 line differ from 2.13.0; the rest is 2.13.0's)."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?.*", version.strip())
    if m is None or (int(m[1]), int(m[2])) not in ((2, 7), (2, 8)):
        return Release(version)
    post = int(m[4] or 0)
    if post >= 4:  # the 26.0.0 line: premul_sum, the wide dtypes and the backward patch, as 2.13.0
        return Release(version, "HCCL_ASYNC_ERROR_HANDLING", (), source="Ascend/pytorch@d99d6cd, @f3ecfe4 "
                       "csrc/core/npu/register/OptionsManager.cpp (no TORCH_HCCL_ASYNC_ERROR_HANDLING)",
                       cann="9.1.0" if post >= 8 else "9.0.0")
    return Release(
        version, "HCCL_ASYNC_ERROR_HANDLING", (), frozenset({0, 1}) if post < 2 else frozenset({0, 1, 2, 3}),
        premul_sum=False, wide_dtypes=False, all_gather_backward=False, cann="8.3.RC1" if post < 2 else "8.5.0",
        source=(f"{_V72}csrc/core/npu/register/OptionsManager.cpp:203-213 (HCCL_ASYNC_ERROR_HANDLING only; 'should "
                "be 0 or 1.' up to .post1, 0-3 from .post2 at 3be71f4/729dda3), csrc/distributed/"
                "ProcessGroupHCCL.cpp:131-154 (no PREMUL_SUM: 'Unhandled ReduceOp'), csrc/distributed/HCCLUtils.cpp:"
                "71-82 (no uint16/32/64, no float8), __init__.py:184-197 (no _AllGatherBase.backward patch)"),
    )


def paired(torch_version: str) -> str:
    """The torch_npu release paired with ``torch_version``: 2.7 -> 2.7.1, 2.8 -> 2.8.0 ..., 2.13 and newer -> the
    newest read (2.13.0)."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if m is None or (int(m[1]), int(m[2])) >= (2, 13):
        return _NEWEST
    return f"{m[1]}.{m[2]}.{1 if (int(m[1]), int(m[2])) == (2, 7) else 0}"


@functools.cache
def _release(version: str) -> Release:
    return _line(version)


@functools.cache
def _installed() -> str:
    """The installed torch_npu's version, else the release paired with the installed torch (read once: package
    metadata costs milliseconds)."""
    try:
        return importlib.metadata.version("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return paired(torch.__version__)


def release(env: Mapping[str, str] | None = None) -> Release:
    """The torch_npu release in force (see the module docstring)."""
    return _release((os.environ if env is None else env).get(SIM_TORCH_NPU_ENV, "").strip() or _installed())
