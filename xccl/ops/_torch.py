"""The torch releases xccl runs on, and what differs between them: the one place that knows.

xccl supports torch 2.7 to 2.14 (:data:`FLOOR`, :data:`NEWEST`): Sophgo's torch_tpu is built for 2.8.0, MindSpeed
pins 2.7.1, and torch_npu pairs one release with each torch. Every difference between those releases that xccl
meets is one :class:`Change` below: the first release that has it, what it is, and where it was read. The layers ask
``TORCH.has(change)`` (the installed release) instead of probing torch themselves, so each difference is written
once, ``xccl doctor`` and ``xccl caps`` list them (:meth:`Torch.missing`), and ``tests/test_torch_versions.py``
checks every one against the installed torch on each CI leg (``make test-torch TORCH=<version>``).

Nothing here imports torch: ``import xccl`` checks the floor (:func:`require_floor`) before any layer imports it,
because on torch 2.1 the first layer fails at ``torch.uint16`` with no word of why.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Final, NamedTuple, final

from ..errors import UnsupportedTorch

__all__ = [
    "ASYNC_OP",
    "CHANGES",
    "DYNAMO_PYBIND",
    "FAKE_PG_INTERNAL",
    "FLOOR",
    "FUNCOL_AUTOGRAD",
    "GLOO_ALL_TO_ALL",
    "GLOO_AVG",
    "GLOO_GROUP_OPTIONS",
    "GLOO_REDUCE_SCATTER",
    "GLOO_REDUCE_SCATTER_OPS",
    "NEWEST",
    "SHRINK_GROUP",
    "TORCH",
    "Change",
    "Torch",
    "require_floor",
]

#: The oldest torch xccl runs on, and why not older: xccl's groups are Python subclasses of c10d's ``ProcessGroup``
#: that register a backend on themselves (``_register_backend``, ``_set_default_backend``), over functional
#: collectives and ``torch.library.custom_op``; torch 2.1 has none of these, 2.7 has them all.
FLOOR: Final = (2, 7)
WHY_FLOOR: Final = ("xccl's process groups subclass c10d's ProcessGroup in Python (_register_backend, "
                    "_set_default_backend) and its graph ops are torch.library custom ops, which torch below 2.7 "
                    "lacks or has in another form")
#: The newest torch xccl was tested on.
NEWEST: Final = (2, 14)


class Change(NamedTuple):
    """One difference between the torch releases xccl supports (a named tuple: ``import xccl`` reads these before
    anything imports ``dataclasses``, 6 ms)."""

    #: The first release (major, minor) that has it.
    since: tuple[int, int]
    #: What it is, in a sentence: what a release from ``since`` on has.
    what: str
    #: What xccl does on a release before ``since``.
    before: str
    #: Where it was read: the upstream change, or the check that found it.
    source: str
    #: The feature of xccl refused before ``since`` (:meth:`Torch.require`); "" when xccl works around it.
    feature: str = ""

    @property
    def needs(self) -> str:
        """``since`` as a version: ``"2.10"``."""
        return f"{self.since[0]}.{self.since[1]}"

    def said(self) -> str:
        """What changed and what xccl does before it, in a sentence (``xccl doctor``, ``xccl caps``)."""
        return f"from torch {self.needs}, {self.what}; before, {self.before}"


ASYNC_OP: Final = Change(
    (2, 8), "every c10d options struct carries asyncOp, and torch's wrappers accept None from a blocking call",
    "xccl's kernels set no asyncOp, and xccl's process group hands blocking callers a completed Work (2.7's "
    "wrappers call work.wait() on whatever they get)", "pytorch/pytorch#150398; 4 of 10 structs have it on 2.7.1")
GLOO_GROUP_OPTIONS: Final = Change(
    (2, 8), "gloo's backend options carry global_ranks_in_group and group_name", "left unset",
    "ProcessGroupGloo._Options on 2.7.1 and 2.8.0")
GLOO_REDUCE_SCATTER: Final = Change(
    (2, 8), "gloo has the list reduce_scatter", "it is composed of the tensor reduce_scatter",
    "'ProcessGroupGloo does not support reduce_scatter' on 2.7.1")
GLOO_AVG: Final = Change(
    (2, 8), "gloo reduces with ReduceOp.AVG", "AVG runs as SUM then a divide",
    "'Cannot use ReduceOp.AVG with Gloo' on 2.7.1")
GLOO_REDUCE_SCATTER_OPS: Final = Change(
    (2, 9), "gloo's reduce_scatter (tensor and list) applies the reduce op it is given",
    "gloo sums whatever op it is given: the cpu plugin composes reduce_scatter of all_to_all_single and a local "
    "reduction, and a simulated vendor computes it with gloo's all_reduce", "plain torch.distributed, 2 ranks "
    "holding 1 and 2, MAX: 3 on 2.7.1 and 2.8.0, 2 from 2.9.1")
SHRINK_GROUP: Final = Change(
    (2, 10), "torch.distributed.shrink_group and its validators (_validate_shrink_inputs & co.), on which xccl's "
    "in-place shrink stands", "dist.shrink_group raises UnsupportedTorch: restart and resume instead "
    "(docs/elastic.md)", "pytorch/pytorch#164518; absent from 2.9.1, present in 2.10.0", "dist.shrink_group")
FAKE_PG_INTERNAL: Final = Change(
    (2, 10), "c10d's FakeProcessGroup is built by FakeProcessGroup._create_internal(rank, size)",
    "FakeProcessGroup(rank, size)", "absent from 2.9.1, present in 2.10.0")
GLOO_ALL_TO_ALL: Final = Change(
    (2, 12), "gloo has the list all_to_all", "it is composed of all_to_all_single with split sizes",
    "'Backend gloo does not support alltoall' from 2.7.1 to 2.11.0")
FUNCOL_AUTOGRAD: Final = Change(
    (2, 11), "torch registers autograd formulas for the _c10d_functional ops", "xccl.functional registers torch "
    "2.11's for the ops it emits (its three collectives and wait_tensor)",
    "torch/distributed/_functional_collectives.py; no Autograd kernel for _c10d_functional::all_reduce in 2.10.0")
DYNAMO_PYBIND: Final = Change(
    (2, 13), "Dynamo folds c10d's pybind objects (ReduceOp.SUM; a ReduceOp carrying PREMUL_SUM's factor) into "
    "constants", "xccl's graph forms read a reduce op's name in traced code (.name, .op.name) and hand the name to "
    "their constant functions", "pytorch/pytorch#180631; 'RedOpType is not a constant' from 2.7.1 to 2.12.1")

#: Every change, oldest first.
CHANGES: Final = (ASYNC_OP, GLOO_GROUP_OPTIONS, GLOO_REDUCE_SCATTER, GLOO_AVG, GLOO_REDUCE_SCATTER_OPS, SHRINK_GROUP,
                  FAKE_PG_INTERNAL, FUNCOL_AUTOGRAD, GLOO_ALL_TO_ALL, DYNAMO_PYBIND)

_RELEASE: Final = re.compile(r"(\d+)\.(\d+)")


@final
class Torch:
    """A torch release: its version string and what it has."""

    __slots__ = ("version",)

    def __init__(self, version: str) -> None:
        #: As torch reports it: ``"2.8.0+cu128"``; ``""`` when torch is not installed.
        self.version: Final = version

    def __repr__(self) -> str:
        return f"Torch({self.version!r})"

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor); (0, 0) when unknown, which counts as having every change (a source build says
        ``2.15.0a0+git...`` and parses)."""
        m = _RELEASE.match(self.version)
        return (int(m[1]), int(m[2])) if m else (0, 0)

    def has(self, change: Change) -> bool:
        """Whether this release has ``change``."""
        return self.release >= change.since or self.release == (0, 0)

    def missing(self) -> tuple[Change, ...]:
        """The changes this release lacks (what xccl does otherwise on it: ``Change.before``)."""
        return tuple(c for c in CHANGES if not self.has(c))

    def require(self, change: Change) -> None:
        """Raise :class:`~xccl.errors.UnsupportedTorch` naming ``change.feature`` when this release lacks it."""
        if not self.has(change):
            raise UnsupportedTorch(change.feature, change.needs, self.version, change.what)


def _installed() -> str:
    """The installed torch's version, without importing torch when it is not imported yet (``torch/version.py``
    is written by torch's build: ``__version__ = '2.8.0+cu128'``)."""
    module = sys.modules.get("torch")
    if module is not None:
        return str(module.__version__)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8") as f:
        m = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)""", f.read(), re.M)
    return m[1] if m else ""


#: The installed torch.
TORCH: Final = Torch(_installed())


def require_floor(torch: Torch = TORCH) -> None:
    """Raise :class:`~xccl.errors.UnsupportedTorch` when ``torch`` is older than :data:`FLOOR`."""
    if torch.release != (0, 0) and torch.release < FLOOR:
        raise UnsupportedTorch("xccl", f"{FLOOR[0]}.{FLOOR[1]}", torch.version, WHY_FLOOR)
