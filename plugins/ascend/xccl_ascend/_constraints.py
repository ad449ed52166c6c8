"""The documented constraints of torch_npu's fused matmul + collective (MC2) kernels, checked before any call.

The real and the simulated runtime run exactly these checks, so a script that passes them in simulation passes
them on the hardware. Each violated constraint raises :class:`~xccl.ConstraintViolation` naming it; xccl's fused
API then falls back to its portable version (with a warning naming the constraint) or re-raises, per the fallback
policy.

:data:`RULES` lists every constraint as data, with the documents it rests on: the capability table's notes,
``xccl caps`` and ``docs/fidelity.md`` render it, and a test keeps it and the checks below in step. The sources
are seed 004 (``torch_npu.npu_mm_reduce_scatter_base``) and op-plugin's documentation and kernels
(Ascend/op-plugin master @ 517f2e7): both give Atlas A3 world sizes 2, 4, 8, 16 and 32 for
``npu_mm_reduce_scatter_base`` and ``npu_all_gather_base_mm``, and the kernels check
``world_size in [2, 4, 8, 16, 32]`` whatever the chip (``MatmulReduceScatterBaseKernelNpuOpApi.cpp:33-37``,
``AllGatherBaseMatmulKernelNpuOpApi.cpp:53-58``). The docstring in op-plugin's ``_op_plugin_docs.py`` (which the
wheel's help text comes from) still says "2, 4, 8, 16" for A3; it predates 32 and is not followed.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

import torch

from xccl.plugin import ConstraintViolation, InvalidArgument

__all__ = [
    "MIN_CANN",
    "RULES",
    "DomainTracker",
    "FusedCall",
    "ProductLine",
    "Rule",
    "check_all_gather_mm",
    "check_mm_all_reduce",
    "check_mm_reduce_scatter",
    "product_line",
]

BACKEND: Final = "ascend"
#: MC2 kernels need firmware and CANN 8.0.RC2 or newer ("otherwise BUS ERROR and the like", seed 004).
MIN_CANN: Final = "8.0.RC2"
_HALF: Final = frozenset({torch.float16, torch.bfloat16})
_K_MIN, _K_END = 256, 65535
_INT32_MAX: Final = 2**31 - 1


class ProductLine(str, enum.Enum):
    """Atlas product line, from the chip name ``torch_npu.npu.get_device_name()`` returns."""

    A2 = "A2"
    A3 = "A3"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


@functools.cache
def product_line(device_name: str) -> ProductLine:
    """``"Ascend910B1"`` -> A2, ``"Ascend910_9391"`` -> A3, anything else (910A, 310P...) -> OTHER."""
    name = device_name.strip()
    if name.startswith("Ascend910B"):
        return ProductLine.A2
    if name.startswith("Ascend910_93"):
        return ProductLine.A3
    return ProductLine.OTHER


_WORLD_SIZES: Final[Mapping[str, Mapping[ProductLine, frozenset[int]]]] = {
    "npu_mm_reduce_scatter_base": {ProductLine.A2: frozenset({2, 4, 8}), ProductLine.A3: frozenset({2, 4, 8, 16, 32})},
    "npu_all_gather_base_mm": {ProductLine.A2: frozenset({2, 4, 8}), ProductLine.A3: frozenset({2, 4, 8, 16, 32})},
    "npu_mm_all_reduce_base": {ProductLine.A2: frozenset({1, 2, 4, 8})},
}


#: The kernels, by xccl's op name.
KERNELS: Final = {
    "mm_reduce_scatter": "npu_mm_reduce_scatter_base",
    "all_gather_mm": "npu_all_gather_base_mm",
    "mm_all_reduce": "npu_mm_all_reduce_base",
}


@final
@dataclass(frozen=True, slots=True)
class Rule:
    """One documented constraint of the MC2 kernels, as data."""

    #: The constraint's name, as a :class:`~xccl.ConstraintViolation` carries it.
    name: str
    #: The rule for each kernel it applies to (kernel name -> what the kernel takes).
    rule: Mapping[str, str]
    #: Where it is written: ``seed 004:<line>`` or ``Ascend/op-plugin@<commit> <path>:<lines>``.
    sources: tuple[str, ...]


_RS, _AG, _AR = KERNELS["mm_reduce_scatter"], KERNELS["all_gather_mm"], KERNELS["mm_all_reduce"]
_OP: Final = "Ascend/op-plugin@517f2e7 "
_DOC: Final = _OP + "docs/zh/custom_APIs/torch_npu/torch_npu-"
_SEED: Final = "seed 004 (npu_mm_reduce_scatter_base)"

#: Every constraint the checks below enforce, in the order they are checked.
RULES: Final[tuple[Rule, ...]] = (
    Rule("product line", {_RS: "Atlas A2 (Ascend910B*) or A3 (Ascend910_93*)", _AG: "Atlas A2 or A3",
                          _AR: "Atlas A2 only"},
         (f"{_SEED}:44-46", f"{_DOC}npu_all_gather_base_mm.md:5-8", f"{_DOC}npu_mm_all_reduce_base.md:5-7")),
    Rule("world size", {_RS: "A2: 2, 4, 8; A3: 2, 4, 8, 16, 32", _AG: "A2: 2, 4, 8; A3: 2, 4, 8, 16, 32",
                        _AR: "1, 2, 4, 8"},
         (f"{_SEED}:22-23", f"{_DOC}npu_mm_reduce_scatter_base.md:54-55", f"{_DOC}npu_all_gather_base_mm.md:49-50",
          f"{_OP}op_plugin/ops/opapi/MatmulReduceScatterBaseKernelNpuOpApi.cpp:33-37",
          f"{_OP}op_plugin/ops/opapi/AllGatherBaseMatmulKernelNpuOpApi.cpp:53-58",
          f"{_DOC}npu_mm_all_reduce_base.md:74")),
    Rule("CANN >= 8.0.RC2", dict.fromkeys((_RS, _AG, _AR), "CANN 8.0.RC2 or newer, where its version is known"),
         (f"{_SEED}:8", f"{_DOC}npu_mm_reduce_scatter_base.md:40", f"{_DOC}npu_all_gather_base_mm.md:35")),
    Rule("topology", {_RS: "A2: one server (HCCS all-mesh)", _AG: "A2: one server (HCCS all-mesh)",
                      _AR: "one server (HCCS all-mesh)"},
         (f"{_SEED}:22", f"{_DOC}npu_mm_reduce_scatter_base.md:54", f"{_DOC}npu_mm_all_reduce_base.md:74")),
    Rule("comm_turn", dict.fromkeys((_RS, _AG, _AR), "0"),
         (f"{_SEED}:28", f"{_DOC}npu_all_gather_base_mm.md:56", f"{_DOC}npu_mm_all_reduce_base.md:54")),
    Rule("dtype", dict.fromkeys((_RS, _AG, _AR), "x1 float16 or bfloat16, x2 the same (int8 needs quantisation scales)"),
         (f"{_SEED}:18-19", f"{_DOC}npu_mm_reduce_scatter_base.md:50-51", f"{_DOC}npu_all_gather_base_mm.md:45-46",
          f"{_DOC}npu_mm_all_reduce_base.md:86-89")),
    Rule("2-D inputs", {_RS: "x1 (m, k), x2 (k, n)", _AG: "x1 (m, k), x2 (k, n)",
                        _AR: "x1 (m, k) or (b, s, k), x2 (k, n)"},
         (f"{_SEED}:18-19", f"{_DOC}npu_all_gather_base_mm.md:45-46", f"{_DOC}npu_mm_all_reduce_base.md:68")),
    Rule("non-empty", {_AR: "x1 and x2 not empty", _RS: "x1 and x2 not empty (xccl's own rule: nothing to fuse)",
                       _AG: "x1 and x2 not empty (xccl's own rule: nothing to fuse)"},
         (f"{_DOC}npu_mm_all_reduce_base.md:73",)),
    Rule("x1 not transposed", dict.fromkeys((_RS, _AG, _AR), "x1 contiguous (xccl makes a transposed view contiguous)"),
         (f"{_SEED}:39", f"{_DOC}npu_all_gather_base_mm.md:69", f"{_DOC}npu_mm_all_reduce_base.md:69")),
    Rule("k range", {_RS: "256 <= k < 65535", _AG: "256 <= k < 65535"},
         (f"{_SEED}:19", f"{_DOC}npu_all_gather_base_mm.md:45")),
    Rule("m divisible by world size", {_RS: "m % world size == 0"},
         (f"{_SEED}:19", f"{_DOC}npu_mm_reduce_scatter_base.md:77",
          f"{_OP}op_plugin/ops/opapi/MatmulReduceScatterBaseKernelNpuOpApi.cpp:52-54")),
    Rule("reduce_op", {_RS: "'sum'", _AR: "'sum'"}, (f"{_SEED}:26", f"{_DOC}npu_mm_all_reduce_base.md:33")),
    Rule("gather_index", {_AG: "0 (gather x1)"}, (f"{_DOC}npu_all_gather_base_mm.md:54",)),
    Rule("bias", {_RS: "None or zeros (a non-zero bias is not supported)", _AG: "None or zeros",
                  _AR: "1-D of size n, dtype of x1"},
         (f"{_SEED}:27", f"{_DOC}npu_all_gather_base_mm.md:51", f"{_DOC}npu_mm_all_reduce_base.md:34")),
    Rule("size limits", {_AR: "1 <= m, k, n <= 2**31 - 1"}, (f"{_DOC}npu_mm_all_reduce_base.md:75",)),
    Rule("one communication domain per model", dict.fromkeys((_RS, _AG, _AR), "A2: one group for all MC2 kernels"),
         (f"{_SEED}:40", f"{_DOC}npu_all_gather_base_mm.md:73", f"{_DOC}npu_mm_all_reduce_base.md:80")),
)


def describe(kernel: str) -> str:
    """The constraints of ``kernel`` as one line, for the capability table's notes."""
    return "; ".join(f"{r.name}: {r.rule[kernel]}" for r in RULES if kernel in r.rule)


@final
@dataclass(frozen=True, slots=True)
class FusedCall:
    """Where and how a fused kernel is about to run: everything the checks need besides the tensors."""

    #: xccl's public op name, e.g. ``"mm_reduce_scatter"``.
    op: str
    #: The chip name (``get_device_name()``; simulated: from ``XCCL_SIM_ASCEND_SOC``).
    device_name: str
    world_size: int
    #: Global ranks of the group, and ranks per server (``LOCAL_WORLD_SIZE``; None when unknown).
    ranks: Sequence[int] = ()
    local_world_size: int | None = None
    #: CANN toolkit version when known (e.g. ``"8.0.RC2"``).
    cann_version: str | None = None
    comm_turn: int = 0

    @property
    def line(self) -> ProductLine:
        """The product line of :attr:`device_name`."""
        return product_line(self.device_name)

    def violation(self, kernel: str, constraint: str, detail: str) -> ConstraintViolation:
        """A :class:`ConstraintViolation` for this call, naming the kernel."""
        return ConstraintViolation(self.op, BACKEND, constraint, f"torch_npu.{kernel}: {detail}")


# ------------------------------------------------------------------------------------------------- shared checks


def _check_platform(call: FusedCall, kernel: str) -> None:
    lines = _WORLD_SIZES[kernel]
    line = call.line
    if line not in lines:
        names = {ProductLine.A2: "Atlas A2 (Ascend910B*)", ProductLine.A3: "Atlas A3 (Ascend910_93*)"}
        where = " and ".join(names[x] for x in lines)
        raise call.violation(kernel, "product line", f"runs on {where} only; this device is {call.device_name!r}")
    sizes = lines[line]
    if call.world_size not in sizes:
        raise call.violation(
            kernel, "world size",
            f"the group has {call.world_size} ranks; on Atlas {line} the kernel takes {sorted(sizes)}",
        )
    if call.cann_version is not None and not _cann_ok(call.cann_version):
        raise call.violation(
            kernel, "CANN >= 8.0.RC2", f"CANN {call.cann_version} is installed; MC2 kernels need {MIN_CANN} or newer"
        )
    if line is ProductLine.A2 and call.local_world_size and call.ranks:
        # A2's MC2 kernels need the HCCS all-mesh of one server; torchrun numbers ranks server by server.
        servers = {r // call.local_world_size for r in call.ranks}
        if len(servers) > 1:
            raise call.violation(
                kernel, "topology",
                f"the group spans {len(servers)} servers; on Atlas A2 the kernel runs over one server's HCCS all-mesh",
            )
    if call.comm_turn != 0:
        raise call.violation(kernel, "comm_turn", f"comm_turn={call.comm_turn}; only 0 is supported")


@functools.cache
def _cann_ok(version: str) -> bool:
    return _cann_key(version) >= _cann_key(MIN_CANN)


def _cann_key(version: str) -> tuple[int, int, int, int]:
    """Order CANN versions: ``8.0.RC1 < 8.0.RC2 < 8.0.0 < 8.1.RC1``; unparsable -> newest (not blocking)."""
    match = re.match(r"(\d+)\.(\d+)\.(?:(RC)(\d+)|(\d+))", version.strip(), re.IGNORECASE)
    if match is None:
        return (10**6, 0, 0, 0)
    major, minor, rc, rc_num, patch = match.groups()
    return (int(major), int(minor), 0 if rc else 1, int(rc_num if rc else patch))


def _check_dtypes(call: FusedCall, kernel: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype not in _HALF:
        hint = " (int8 needs quantisation scales, which xccl's fused API does not pass)" if a.dtype == torch.int8 else ""
        raise call.violation(kernel, "dtype", f"x1 is {a.dtype}; the kernel takes float16 or bfloat16{hint}")
    if b.dtype != a.dtype:
        raise call.violation(kernel, "dtype", f"x2 is {b.dtype} but x1 is {a.dtype}; they must match")


def _check_matmul(call: FusedCall, a: torch.Tensor, b: torch.Tensor) -> None:
    if b.dim() == 2 and a.dim() >= 1 and a.shape[-1] != b.shape[0]:
        raise InvalidArgument(call.op, f"a {tuple(a.shape)} @ b {tuple(b.shape)}: inner dimensions differ")


def _check_x1(call: FusedCall, kernel: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.numel() == 0 or b.numel() == 0:
        raise call.violation(kernel, "non-empty", f"x1 {tuple(a.shape)} or x2 {tuple(b.shape)} is empty")
    if not a.is_contiguous():
        raise call.violation(
            kernel, "x1 not transposed", "x1 is not contiguous (a transposed view?); call .contiguous() first"
        )


def _check_zero_bias(call: FusedCall, kernel: str, bias: torch.Tensor | None, n: int, dtype: torch.dtype) -> None:
    if bias is None:
        return
    if bias.dim() != 1 or bias.shape[0] != n or bias.dtype != dtype:
        raise call.violation(kernel, "bias", f"bias must be 1-D of size {n} and {dtype}, got {tuple(bias.shape)} {bias.dtype}")
    # The documentation: "bias input other than 0 is not supported in this version".
    try:
        nonzero = int(torch.count_nonzero(bias))
    except Exception:  # meta/fake tensors (graph pass): the values are unknowable, so not provably 0
        nonzero = -1
    if nonzero != 0:
        raise call.violation(kernel, "bias", "a non-zero bias is not supported (only None or zeros)")


def _check_k(call: FusedCall, kernel: str, k: int) -> None:
    if not _K_MIN <= k < _K_END:
        raise call.violation(kernel, "k range", f"k={k}; the kernel takes {_K_MIN} <= k < {_K_END}")


# ------------------------------------------------------------------------------------------------------ per op


def check_mm_reduce_scatter(
    call: FusedCall, a: torch.Tensor, b: torch.Tensor, *, reduce_op: str = "sum", bias: torch.Tensor | None = None
) -> None:
    """Every documented constraint of ``npu_mm_reduce_scatter_base(a, b, hcom, world_size)``.

    Raises:
        ConstraintViolation: the first violated constraint.
        InvalidArgument: ``a @ b`` is not a matmul at all.
    """
    kernel = "npu_mm_reduce_scatter_base"
    _check_platform(call, kernel)
    _check_dtypes(call, kernel, a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise call.violation(kernel, "2-D inputs", f"x1 {tuple(a.shape)} and x2 {tuple(b.shape)} must both be 2-D")
    _check_matmul(call, a, b)
    _check_x1(call, kernel, a, b)
    _check_k(call, kernel, a.shape[1])
    if a.shape[0] % call.world_size:
        raise call.violation(
            kernel, "m divisible by world size", f"m={a.shape[0]} is not divisible by the world size {call.world_size}"
        )
    if reduce_op != "sum":
        raise call.violation(kernel, "reduce_op", f"reduce_op={reduce_op!r}; only 'sum' is supported")
    _check_zero_bias(call, kernel, bias, b.shape[1], a.dtype)


def check_all_gather_mm(
    call: FusedCall, a: torch.Tensor, b: torch.Tensor, *, gather_index: int = 0, bias: torch.Tensor | None = None
) -> None:
    """Every documented constraint of ``npu_all_gather_base_mm(a, b, hcom, world_size)``.

    Raises:
        ConstraintViolation: the first violated constraint.
        InvalidArgument: ``a @ b`` is not a matmul at all.
    """
    kernel = "npu_all_gather_base_mm"
    _check_platform(call, kernel)
    _check_dtypes(call, kernel, a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise call.violation(kernel, "2-D inputs", f"x1 {tuple(a.shape)} and x2 {tuple(b.shape)} must both be 2-D")
    _check_matmul(call, a, b)
    _check_x1(call, kernel, a, b)
    _check_k(call, kernel, a.shape[1])
    if gather_index != 0:
        raise call.violation(kernel, "gather_index", f"gather_index={gather_index}; only 0 (gather x1) is supported")
    _check_zero_bias(call, kernel, bias, b.shape[1], a.dtype)


def check_mm_all_reduce(
    call: FusedCall, a: torch.Tensor, b: torch.Tensor, *, reduce_op: str = "sum", bias: torch.Tensor | None = None
) -> None:
    """Every documented constraint of ``npu_mm_all_reduce_base(a, b, hcom)`` (non-quantised).

    Raises:
        ConstraintViolation: the first violated constraint.
        InvalidArgument: ``a @ b`` is not a matmul at all.
    """
    kernel = "npu_mm_all_reduce_base"
    _check_platform(call, kernel)
    _check_dtypes(call, kernel, a, b)
    if a.dim() not in (2, 3) or b.dim() != 2:
        raise call.violation(
            kernel, "2-D inputs", f"x1 must be (m, k) or (b, s, k) and x2 (k, n); got {tuple(a.shape)}, {tuple(b.shape)}"
        )
    _check_matmul(call, a, b)
    _check_x1(call, kernel, a, b)
    m, k, n = a.numel() // a.shape[-1], a.shape[-1], b.shape[1]
    if max(m, k, n) > _INT32_MAX:
        raise call.violation(kernel, "size limits", f"m={m}, k={k}, n={n}; each must be at most 2**31 - 1")
    if reduce_op != "sum":
        raise call.violation(kernel, "reduce_op", f"reduce_op={reduce_op!r}; only 'sum' is supported")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n or bias.dtype != a.dtype):
        raise call.violation(kernel, "bias", f"bias must be 1-D of size {n} and {a.dtype}, got {tuple(bias.shape)} {bias.dtype}")


# ----------------------------------------------------------------------------------------------------- domains


@final
class DomainTracker:
    """Atlas A2 rule: all MC2 kernels of one model (here: one process) use one communication domain.

    The first fused kernel claims its group's domain; a fused kernel on another group then violates the rule.
    Tracked by the group's torch name, known before the (collective) communicator name is fetched, so the check
    costs no communication.
    """

    __slots__ = ("_domain",)

    def __init__(self) -> None:
        self._domain: tuple[str, str] | None = None

    def check(self, call: FusedCall, kernel: str, group_name: str) -> None:
        """Raise if A2 and another domain was claimed; the caller claims with :meth:`claim` once the call runs."""
        if call.line is not ProductLine.A2 or self._domain is None or self._domain[0] == group_name:
            return
        raise call.violation(
            kernel, "one communication domain per model",
            f"on Atlas A2 every MC2 kernel of a model must use one communication domain; this process already used "
            f"{self._domain[1]!r} (group {self._domain[0]}) and now calls it on group {group_name}. Run the fused ops "
            "of one model on one group, or call xccl_ascend.reset_mc2_domain() when a new model starts",
        )

    def claim(self, call: FusedCall, group_name: str, hcom: str) -> None:
        """Record the domain a fused kernel ran on (A2 only)."""
        if call.line is ProductLine.A2 and self._domain is None:
            self._domain = (group_name, hcom)

    def reset(self) -> None:
        """Forget the claimed domain (a new model starts)."""
        self._domain = None
