"""Simulated vendor backends: a vendor's process-group name and rules, computed by gloo on CPU.

A vendor plugin describes its backend as a :class:`SimProfile` (docs/plugin-guide.md, section 7), and
:func:`register_simulated_backend` registers the profile's name with ``torch.distributed`` for a CPU-only process.
Each group is a :class:`SimulatedProcessGroup`: every collective first checks the call against the profile and
raises what the vendor would raise, then runs on gloo.

How it is wired (measured on torch 2.13, see ``tests/test_sim.py``)::

    dist.all_reduce(t, group=g)                       # Python entry point
      -> g.allreduce([t], opts)                       # a Python method of SimulatedProcessGroup: check, then
           -> inner.allreduce([t], opts)              # a plain c10d ProcessGroup whose cpu backend is gloo

    funcol.all_gather_tensor(t, 0, g)                 # functional / compiled path, from C++
      -> resolve_process_group(g.group_name)          # needs a backend registered on g (see below)
      -> g->allgather_into_tensor_coalesced(...)      # C++ virtual call, lands in the Python override through
                                                      # the PyProcessGroup trampoline: check, then inner

Why a ``dist.ProcessGroup`` subclass and not a ``Backend`` subclass: ``torch._C._distributed_c10d.Backend`` has
no Python constructor (``TypeError: No constructor defined``), so a Python backend cannot exist; ``ProcessGroup``
has a pybind trampoline that forwards every virtual collective to Python overrides. ``_new_process_group_helper``
returns a creator's ``ProcessGroup`` subclass as the group itself and registers no backend on it, which breaks
``group_name`` ("ProcessGroup name not set": the name lives in the backends) and with it every functional
collective. So the creator registers the gloo backend on the wrapper as well; the wrapper's Python methods still
run first, because Python calls and the trampoline both find the overrides before the C++ base class. In torch
2.13 ``dist.all_gather_into_tensor`` calls ``all_gather_single`` and the tensor reduce-scatter calls
``reduce_scatter_single``; a subclass that overrides only ``_reduce_scatter_base`` falls through to the C++ base,
which fails with "No backend type associated with device type cpu". Every method name is overridden here.

The vendor's run time given at registration (:class:`VendorRuntime`) is reproduced around every call
(``_sim_runtime``), and its completion shapes the works returned (``_work.complete``).

Caveats: ``g._get_backend(torch.device("cpu"))`` returns the bare gloo backend, so code that takes a group's
backend object directly (``_time_estimator``, NCCL-style coalescing) bypasses the checks; ``batch_isend_irecv``
uses plain ``isend``/``irecv`` because the group is not exactly ``ProcessGroup``. SCCL's communicator per op is not
simulated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, cast, final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from ..ops._specs import SPECS
from ..ops._torch import GLOO_ALL_TO_ALL, TORCH
from ..ops._vocab import ALL_REDUCE_OPS, premul_factor
from ._fake_world import transport
from ._python_group import PythonProcessGroup
from ._sim_dtypes import carried, mapped, widened
from ._sim_gloo import call as gloo_call
from ._sim_runtime import GroupRuntime
from ._vendor_runtime import PLAIN, VendorRuntime
from ._work import Work, complete

__all__ = [
    "NATIVE_OP_KEYS",
    "REDUCE_OP_NAMES",
    "SimProfile",
    "SimulatedProcessGroup",
    "SimulatedVendorError",
    "base_class_message",
    "register_simulated_backend",
    "simulated_backend_of",
    "simulated_group_of",
]

logger = logging.getLogger(__name__)

#: Every c10d method an op's spec names (``Spec.c10d``): the ``Backend`` virtual methods a profile can list in
#: ``native_ops`` (a vendor's class overrides some; the rest raise :func:`base_class_message`).
_METHODS: Final = tuple(m for spec in dict.fromkeys(SPECS.values()) for m in spec.c10d)
NATIVE_OP_KEYS: Final = frozenset(m.name for m in _METHODS)

#: Reduce-op names a profile can list in ``reduce_ops``: ``ReduceOp.RedOpType`` member names, lower case.
REDUCE_OP_NAMES: Final = frozenset(ALL_REDUCE_OPS)

#: ``ProcessGroup`` method (as Python code and the C++ trampoline call it) -> the ``Backend`` method it reaches.
_METHOD_KEYS: Final[Mapping[str, str]] = MappingProxyType({name: m.name for m in _METHODS for name in m.names})

#: Backend methods that reduce, so their reduce op is checked.
_REDUCING: Final = frozenset(m.name for m in _METHODS if m.reduces)
#: Reducing methods that work in place on their first argument; the others read their second argument.
_IN_PLACE: Final = frozenset(m.name for m in _METHODS if m.in_place)

#: Backend names torch or its test utilities own. ``register_backend`` silently keeps the built-in creator for
#: these, so registering one would simulate nothing.
_RESERVED: Final = frozenset({"undefined", "gloo", "nccl", "ucc", "mpi", "xccl", "fake", "threaded"})


def base_class_message(backend: str, key: str) -> str:
    """What c10d's ``Backend`` base class raises for a method ``key`` the vendor ``backend`` (its
    ``getBackendName()``) did not override: ``"Backend SCCL does not support _reduce_scatter_base"`` in libtorch
    2.13."""
    return f"Backend {backend} does not support {key}"


class SimulatedVendorError(RuntimeError):
    """The simulated vendor refused a call; the message is the one the vendor raises.

    A ``RuntimeError`` like the vendor's ``TORCH_CHECK`` failure, so code that catches those catches this.
    """

    def __init__(self, backend: str, op: str, message: str) -> None:
        #: The simulated backend name, e.g. ``"sccl"``.
        self.backend: Final = backend
        #: The ``Backend`` method that was refused, e.g. ``"reduce_scatter"``.
        self.op: Final = op
        super().__init__(message)


OptionsCheck = Callable[[object | None, int, int], None]
CallCheck = Callable[[str, torch.dtype, str | None], str | None]


@final
@dataclass(frozen=True, slots=True)
class SimProfile:
    """What a simulated vendor backend accepts, and how it refuses the rest.

    Raises:
        ValueError: on construction, for an unknown ``native_ops`` key or reduce-op name (a typo would
            otherwise make an op silently unsupported).
    """

    #: ``torch.distributed`` backend name to register, e.g. ``"sccl"``, ``"hccl"``; lower case.
    backend: str
    #: Used in messages, e.g. ``"ProcessGroupSCCL"``.
    vendor_name: str
    #: ``Backend`` method name -> ``None`` if the vendor implements it, else the exact message it raises. A method
    #: left out raises :func:`base_class_message`, as a vendor class that does not override it would.
    native_ops: Mapping[str, str | None]
    #: Dtypes the vendor accepts; others raise ``"<vendor_name>: Invalid scalar type <dtype>"``.
    dtypes: frozenset[torch.dtype]
    #: Reduce ops the vendor accepts, lower case (:data:`REDUCE_OP_NAMES`), for every dtype not in
    #: ``dtype_reduce_ops``; others raise ``"<vendor_name>: unsupported reduce op ReduceOp.<OP> (supported: ...)"``.
    reduce_ops: frozenset[str]
    #: False: ``alltoall_base`` with unequal split sizes raises (SCCL ignores the splits: the simulation refuses
    #: instead of computing garbage). True: uneven splits and uneven lists both run (HCCL's AlltoAllV).
    uneven_all_to_all: bool
    #: ``(pg_options, group_rank, group_size)`` -> None, raising like the vendor's creator; None: no check.
    check_options: OptionsCheck | None = field(default=None, compare=False)
    #: ``(method, dtype, reduce op or None)`` -> the message the vendor raises for that dtype in that call, or
    #: None: what the lists cannot say (HCCL: fewer dtypes reduced than moved, no product over bfloat16).
    check_call: CallCheck | None = field(default=None, compare=False)
    #: Reduce op (lower case) -> the exact message the vendor raises for it, for ops not in :attr:`reduce_ops`.
    reduce_op_messages: Mapping[str, str] = field(default_factory=dict)
    #: Per-dtype override of ``reduce_ops``, as ``Support.dtype_reduce_ops`` in the capability table.
    dtype_reduce_ops: Mapping[torch.dtype, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.native_ops) - NATIVE_OP_KEYS
        if unknown:
            raise ValueError(f"SimProfile {self.backend!r}: unknown native_ops keys {sorted(unknown)}; "
                             f"expected c10d Backend method names: {sorted(NATIVE_OP_KEYS)}")
        bad_ops = (set(self.reduce_ops) | set(self.reduce_op_messages)).union(*self.dtype_reduce_ops.values()) - \
            REDUCE_OP_NAMES
        if bad_ops:
            raise ValueError(f"SimProfile {self.backend!r}: unknown reduce ops {sorted(bad_ops)}; "
                             f"expected some of {sorted(REDUCE_OP_NAMES)}")
        # Freeze the table so a profile shared by every group cannot change under them.
        for name in ("native_ops", "reduce_op_messages", "dtype_reduce_ops"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def reduce_ops_for(self, dtype: torch.dtype) -> frozenset[str]:
        """The reduce ops the vendor accepts over ``dtype``."""
        return self.dtype_reduce_ops.get(dtype, self.reduce_ops)

    def refusal(self, key: str) -> str | None:
        """The message the vendor raises for ``Backend.<key>``, or None if it implements it."""
        if key in self.native_ops:
            return self.native_ops[key]
        return base_class_message(self.backend, key)


_PROFILES: dict[str, SimProfile] = {}
#: The vendor's declared run time per simulated backend (watchdog, lazy connect...; ``_sim_runtime``).
_RUNTIMES: dict[str, VendorRuntime] = {}
_LOCK = threading.Lock()


def register_simulated_backend(profile: SimProfile, *, runtime: VendorRuntime = PLAIN) -> None:
    """Make ``profile.backend`` a ``torch.distributed`` backend that runs on gloo under ``profile``'s rules.

    Call it in every process before ``init_process_group`` / ``new_group`` (torch keeps registrations per
    process). Registering the same name again is allowed and replaces the profile for groups created afterwards,
    so plugins may call this unconditionally.

    Args:
        profile: the vendor's rules.
        runtime: the vendor's run time (``xccl.init`` passes ``Plugin.vendor_runtime()``), which the simulated
            groups reproduce (``xccl.plugin._sim_runtime``, ``_work.complete``).

    Raises:
        ValueError: the name is not a lower-case identifier, or torch (or another plugin, e.g. the real vendor
            package imported in this process) already owns it; torch would silently keep the existing creator.
    """
    name = profile.backend
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"simulated backend name {name!r} must be a lower-case identifier, e.g. 'sccl'")
    with _LOCK:
        replaced = name in _PROFILES
        if not replaced:
            if (name in _RESERVED or name in dist.Backend.backend_list
                    or name.upper() in dist.Backend._plugins or hasattr(dist.Backend, name.upper())):
                raise ValueError(
                    f"cannot simulate backend {name!r}: torch.distributed already has a backend of that name "
                    "(built in, or registered by the vendor's own package in this process), and register_backend "
                    "would silently keep it. Simulate in a process that does not import the vendor package."
                )
            dist.Backend.register_backend(name, _Creator(name), extended_api=True, devices=["cpu"])
        _PROFILES[name] = profile
        _RUNTIMES[name] = runtime
    logger.debug("simulated backend %r %s (%s)", name, "profile replaced" if replaced else "registered",
                 profile.vendor_name)


def simulated_backend_of(group: dist.ProcessGroup | None = None) -> SimProfile | None:
    """The profile behind ``group`` (default: the world group), or None if it is not simulated.

    Args:
        group: a process group, or None for the default group.

    Returns:
        The :class:`SimProfile` the group enforces; None for real backends or before initialisation.
    """
    if group is None:
        if not dist.is_initialized():
            return None
        group = dist.group.WORLD
    found = simulated_group_of(group)
    return None if found is None else found.profile


def simulated_group_of(group: Any) -> SimulatedProcessGroup | None:
    """The simulated vendor group behind ``group`` (xccl's process group or the vendor's own), or None."""
    # xccl's process group wraps the vendor's: look through it.
    group = getattr(group, "native", group)
    return group if isinstance(group, SimulatedProcessGroup) else None


class _Creator:
    """The ``extended_api`` creator torch calls for every group of a simulated backend."""

    def __init__(self, backend: str) -> None:
        self.backend: Final = backend

    def __call__(self, opts: Any, pg_options: object | None) -> SimulatedProcessGroup:
        # Looked up per group, so a re-registered profile applies to groups created after it.
        profile = _PROFILES[self.backend]
        if profile.check_options is not None:
            profile.check_options(pg_options, opts.group_rank, opts.group_size)
        return SimulatedProcessGroup(profile, opts, pg_options, _RUNTIMES.get(self.backend, PLAIN))


class SimulatedProcessGroup(PythonProcessGroup):
    """A process group that acts as ``profile``'s vendor backend and computes with gloo.

    Every collective method checks, in the vendor's order, that the op exists, that every tensor's dtype is
    accepted, that the reduce op is accepted and (if the vendor ignores them) that all_to_all split sizes are
    even, raising :class:`SimulatedVendorError` otherwise; then it returns the inner gloo group's ``Work``.

    Args:
        profile: the vendor's rules.
        opts: torch's ``_DistributedBackendOptions`` (store, group rank and size, timeout, group id).
        pg_options: the ``pg_options`` the caller passed, kept as :attr:`pg_options` for the plugin.
        runtime: the vendor's run time to reproduce (watchdog, execution timeout, lazy connect, completion).
    """

    def __init__(self, profile: SimProfile, opts: Any, pg_options: object | None,
                 runtime: VendorRuntime = PLAIN) -> None:
        # The (store, rank, size) constructor is a pybind factory that cannot build a Python subclass
        # ("returned holder-wrapped instance is not an alias instance"), so the wrapper has no store of its own.
        super().__init__(opts.group_rank, opts.group_size)
        #: The rules this group enforces.
        self.profile: Final = profile
        #: The ``pg_options`` the group was created with (the plugin's simulated options object).
        self.pg_options: Final = pg_options
        self._completion: Final = runtime.completion
        #: The vendor's run time for this group (``_sim_runtime``).
        self.simulated_runtime: Final = GroupRuntime(runtime, opts, profile.vendor_name)
        # Gloo gets its own key prefix so that its rendezvous cannot collide with keys a simulated plugin
        # writes to the same group store (HCCL root info, SCCL unique ids). It times out when the vendor's own
        # execution timeout would.
        # In a fake world: the same checks, no communication.
        net = transport()
        gloo = net.gloo(PrefixStore("xccl.sim.gloo", opts.store), opts.group_rank, opts.group_size,
                        self.simulated_runtime.gloo_timeout(opts.timeout), list(opts.global_ranks_in_group),
                        opts.group_id)
        cpu, custom = torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM
        # The inner group translates every ProcessGroup method to the gloo backend in C++.
        self._inner: Final = dist.ProcessGroup(opts.store, opts.group_rank, opts.group_size)
        for pg in (self._inner, self):
            # On the wrapper this registration only serves group_name (stored in the backends) and
            # _get_backend; collectives never reach it because the Python overrides come first.
            pg._register_backend(cpu, custom, gloo)
            pg._set_default_backend(custom)

    def getBackendName(self) -> str:  # camelCase: the name the C++ trampoline looks up
        """The simulated backend name, which ``pg.name()`` and ``dist.get_backend`` report."""
        return self.profile.backend

    def __repr__(self) -> str:
        return f"<SimulatedProcessGroup {self.profile.backend} rank={self.rank()} size={self.size()}>"

    def shutdown(self) -> None:
        """``ProcessGroup.shutdown`` (``destroy_process_group``): the vendor's teardown (HCCL's synchronises its
        streams first: ``_sim_stream``), then gloo's."""
        self.simulated_runtime.shutdown()
        super().shutdown()

    def _admit(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Check one call against the profile, raising what the vendor raises."""
        profile, name = self.profile, self.profile.vendor_name
        refusal = profile.refusal(key)
        if refusal is not None:
            raise SimulatedVendorError(profile.backend, key, refusal)
        dtypes = dict.fromkeys(t.dtype for t in _tensors((args, kwargs)))
        for dtype in dtypes:
            if dtype not in profile.dtypes:
                raise SimulatedVendorError(profile.backend, key, f"{name}: Invalid scalar type {dtype}")
        op = _reduce_op_name(args, kwargs) if key in _REDUCING else None
        for dtype in dtypes:
            if op is not None and op not in profile.reduce_ops_for(dtype):
                allowed = ", ".join(sorted(profile.reduce_ops_for(dtype))) or "none"
                over = f" over {dtype}" if dtype in profile.dtype_reduce_ops else ""
                raise SimulatedVendorError(profile.backend, key, profile.reduce_op_messages.get(op) or (
                    f"{name}: unsupported reduce op ReduceOp.{op.upper()}{over} (supported: {allowed})"))
        if profile.check_call is not None:
            for dtype in dtypes:
                message = profile.check_call(key, dtype, op)
                if message is not None:
                    raise SimulatedVendorError(profile.backend, key, message)
        if key == "alltoall_base" and not profile.uneven_all_to_all:
            out_splits = args[2] if len(args) > 2 else kwargs.get("output_split_sizes", ())
            in_splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes", ())
            if len(set(out_splits)) > 1 or len(set(in_splits)) > 1:
                raise SimulatedVendorError(
                    profile.backend, key,
                    f"{name} ignores all_to_all_single split sizes and always splits evenly, so "
                    f"input_split_sizes={list(in_splits)}, output_split_sizes={list(out_splits)} would give wrong "
                    f"results on the hardware (refused by the xccl simulation of {name})",
                )

def _gated(method: str, key: str) -> Callable[..., Any]:
    """A ``SimulatedProcessGroup`` method: check against the profile, then run ``method`` on the inner group."""

    def call(self: SimulatedProcessGroup, *args: Any, **kwargs: Any) -> Any:
        self._admit(key, args, kwargs)
        if key not in _REDUCING:
            args, kwargs = carried(args), carried(kwargs)
            back: list[tuple[torch.Tensor, torch.Tensor]] = []
        else:
            args, back = widened(args, in_place=key in _IN_PLACE)
            if _reduce_op_name(args, kwargs) == "premul_sum":
                args = _premul_as_sum(key, args)
        vendor = self.simulated_runtime
        vendor.before(key)
        work = vendor.after(key, None if vendor.held() else gloo_call(self._inner, key, method, args, kwargs))
        if back:
            # The vendor reduced in the narrow dtype; gloo reduced a wide copy: the result goes back once it is
            # there.
            work = Work([work], then=lambda: [narrow.copy_(wide) for narrow, wide in back])
        return complete(self._completion, key, work)

    call.__name__ = method
    call.__qualname__ = f"SimulatedProcessGroup.{method}"
    call.__doc__ = f"``ProcessGroup.{method}``, gated by the profile's ``{key}`` entry, computed by gloo."
    return call


# Generated rather than written out: every override is the same check-then-delegate, and the table above is the
# one place that says which name reaches which vendor method.
for _method, _key in _METHOD_KEYS.items():
    setattr(SimulatedProcessGroup, _method, _gated(_method, _key))


_EVEN_ALLTOALL: Final = SimulatedProcessGroup.alltoall


def _alltoall(self: SimulatedProcessGroup, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
              opts: Any = None) -> Any:
    """``ProcessGroup.alltoall`` (the list form), gated like every method. A vendor that takes uneven tensors there
    (HCCL runs the list as AlltoAllV) is computed by gloo's ``alltoall_base`` with split sizes over one flat buffer
    each way: gloo's own list form refuses tensors of different sizes ("ProcessGroupGloo::alltoall: invalid tensor
    size"), which the vendor's user never sees, and torch's gloo has no list form before 2.9."""
    even = not self.profile.uneven_all_to_all or len({t.numel() for t in (*outputs, *inputs)}) <= 1
    if even and TORCH.has(GLOO_ALL_TO_ALL):
        return _EVEN_ALLTOALL(self, outputs, inputs, *(() if opts is None else (opts,)))
    self._admit("alltoall", (outputs, inputs), {})
    send = carried(torch.cat([t.reshape(-1) for t in inputs]))
    recv = torch.empty(sum(t.numel() for t in outputs), dtype=send.dtype, device=send.device)
    vendor = self.simulated_runtime
    vendor.before("alltoall")
    inner = None if vendor.held() else self._inner.alltoall_base(
        recv, send, [t.numel() for t in outputs], [t.numel() for t in inputs], dist.AllToAllOptions())
    work = vendor.after("alltoall", inner)

    def copy_out() -> None:
        offset = 0
        for out in outputs:
            carried(out).view(-1).copy_(recv[offset: offset + out.numel()])
            offset += out.numel()

    return complete(self._completion, "alltoall", Work([work], then=copy_out))


SimulatedProcessGroup.alltoall = _alltoall  # type: ignore[method-assign,assignment]


def _tensors(obj: object) -> Iterator[torch.Tensor]:
    """Every tensor in a call's arguments (tensors, nested lists of them, options objects ignored)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _reduce_op_name(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The reduce op of a call, lower case: from its options object, or a positional ``ReduceOp``."""
    for arg in (*args, *kwargs.values()):
        red = getattr(arg, "reduceOp", None)
        if red is not None:
            return str(red.op.name).lower()
        if isinstance(arg, dist.ReduceOp):
            return str(cast(Any, arg).op.name).lower()  # .op is bound in C++ but missing from the .pyi
        if isinstance(arg, dist.ReduceOp.RedOpType):
            return str(arg.name).lower()
    return "sum"  # the default of every c10d reduce options struct


def _premul_as_sum(key: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Rewrite a PREMUL_SUM call as SUM over pre-scaled inputs: gloo refuses PREMUL_SUM, vendors may not.

    Only floating inputs are rewritten (PREMUL_SUM is defined for them; HCCL accepts it only for them), and only
    when the call carries an options object; anything else goes to gloo and fails with gloo's message.
    """
    opts = next((a for a in args if hasattr(a, "reduceOp")), None)
    if opts is None or not all(t.is_floating_point() for t in _tensors(args)):
        return args
    factor = premul_factor(opts.reduceOp)
    opts.reduceOp = dist.ReduceOp.SUM  # torch builds a fresh options object per call, so this is ours
    if key in _IN_PLACE:
        # The result overwrites these tensors anyway; scaling them first is what the vendor does on device.
        for tensor in _tensors(args[0]):
            tensor.mul_(factor)
        return args
    # reduce_scatter reads its second argument and must leave it untouched.
    return (args[0], mapped(args[1], lambda t: t * factor), *args[2:])

