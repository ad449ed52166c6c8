"""xccl's c10d process group: what puts xccl under torch.distributed, DDP, FSDP2, DTensor and compiled graphs.

``xccl.init`` registers a torch.distributed backend named ``xccl_<vendor backend>`` (``xccl_gloo``,
``xccl_nccl``, ``xccl_hccl``, ``xccl_sccl``; never ``xccl``, which torch owns for Intel XPUs) and creates the
world on it. Every group of that backend is an :class:`XcclProcessGroup`: a ``torch.distributed.ProcessGroup``
whose collective methods decode the c10d call into the public arguments and run xccl's dispatch, over the
vendor's own process group, which the plugin's runtime builds (``Runtime.create_native_group``)::

    dist.reduce_scatter_tensor(out, inp, group=g)       # FSDP2, or any code written for torch.distributed
      -> g.reduce_scatter_single(out, inp, opts)        # Python override (the pybind trampoline routes C++
                                                        # callers here too: DDP's reducer, functional collectives)
        -> dispatch(REDUCE_SCATTER_TENSOR, ...)         # validation, the capability table, fallback policy,
                                                        # mismatch check, typed faults
          -> native: the vendor group's _reduce_scatter_base(out, inp, opts)
          -> emulated (SCCL has no reduce_scatter): all_to_all_single on the vendor group + a local reduction
          -> unsupported: UnsupportedCollective, before any rank communicates

Groups created by third-party code (``dist.new_group``, DeviceMesh, FSDP's helpers) on this backend come through
the same creator and get the vendor's options from the plugin (``Runtime.process_group_options``), which SCCL
needs: it refuses to create a group without ``ProcessGroupSCCLOptions``.

What torch reports: ``dist.get_backend(g)`` is ``"xccl_<backend>"`` (pass it to ``new_group``);
``g._get_backend(device)`` is the vendor's backend object, so vendor code that reaches for it
(``get_hccl_comm_name``, FSDP2's allocator hooks) finds what it expects.

Code that branches on the backend's name: over a vendor backend torch does not know itself (``hccl``, ``sccl``),
``dist.get_backend(g)`` is a :class:`BackendName`, a ``str`` whose value is xccl's name and which also *compares*
equal to the vendor's (``==``, ``!=``, ``in`` a list or tuple), so torch_npu's ``_AllGatherBase.backward`` check,
TorchAir's ``get_backend(pg) != "hccl"`` and ``"npu" if get_backend() == "hccl" else "cpu"`` take the vendor's
path, as they would on the vendor's own group, whose devices xccl's group serves. What stays xccl's: ``str()``,
formatting, hashing (a dict or set of names finds it under ``"xccl_hccl"`` only), ``.lower()`` and the like, which
torch's group creation uses, so ``new_group(backend=get_backend())`` still creates xccl's groups. Over gloo and
nccl no alias is made: torch's ``_new_process_group_helper`` compares the name with them to build its own groups.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from ..errors import InitError
from ..ops._c10d import Method, d_allreduce, op_of
from ..ops._specs import SPECS
from ..plugin._capabilities import Collective
from ..plugin._contract import Runtime
from ..plugin._fake_world import fake_backend, fake_world
from ..plugin._vendor_runtime import Completion
from ..plugin._work import Work
from . import _observe
from ._dispatch import all_reduce, dispatch, warn_once
from ._mixed import MixedProcessGroup, members_of
from ._state import STATE, forget, state_of
from ._watchdog import group_timeout

__all__ = ["PREFIX", "BackendName", "TimeoutWarning", "XcclProcessGroup", "backend_name", "register_backend"]

LOG = logging.getLogger("xccl")

#: The prefix of xccl's torch.distributed backend names.
PREFIX: Final = "xccl_"
#: Backend names torch compares with when it creates a group (``_new_process_group_helper``, ``BackendConfig``):
#: xccl's name must never compare equal to one of them, or torch would build its own group instead of xccl's.
_TORCH_OWN: Final = frozenset({"undefined", "gloo", "nccl", "ucc", "mpi", "xccl", "fake"})


def backend_name(runtime: Runtime) -> str:
    """The torch.distributed backend name of xccl's process group over ``runtime``'s vendor backend."""
    return f"{PREFIX}{runtime.backend}"


def needs_host_side(runtime: Runtime) -> bool:
    """Whether the plugin needs a host-side gloo group: its table stages point-to-point through one, or its works
    complete at once, so the barrier blocks the host on one (``_host_barrier``)."""
    if runtime.plugin.vendor_runtime().completion is Completion.AT_ONCE:
        return True
    table = runtime.capabilities()
    return any(table.entry(op).via == "host_gloo" for op in (Collective.SEND, Collective.RECV))


class BackendName(str):
    """xccl's backend name (``"xccl_hccl"``) that also compares equal to the vendor's (``"hccl"``).

    ``dist.get_backend(g)`` returns ``getattr(Backend, NAME.upper())``, which ``register_backend`` sets to the
    name unless it is set already; xccl sets it to this first. Equality (``==``, ``!=``, and so ``in`` a list or
    tuple) holds for both names; everything else is the ``str`` ``"xccl_hccl"``: its hash (dict and set lookups
    find it under xccl's name only), ``str()``, formatting and every ``str`` method, which return plain strings.
    """

    vendor: str

    def __new__(cls, name: str, vendor: str) -> BackendName:
        obj = super().__new__(cls, name)
        obj.vendor = vendor
        return obj

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return str.__eq__(self, other) or str.__eq__(self.vendor, other)

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return not self.__eq__(other)

    __hash__ = str.__hash__

    def __reduce__(self) -> tuple[Any, ...]:
        return (BackendName, (str(self), self.vendor))


def register_backend(runtime: Runtime) -> str:
    """Register xccl's backend for ``runtime`` with torch.distributed (once per process); returns its name.

    The creator reads the runtime from xccl's state when torch calls it, so one registration serves every
    ``xccl.init`` of the process. Over a vendor backend torch does not know itself, ``dist.get_backend`` returns
    the name as a :class:`BackendName`, equal to the vendor's name as well.
    """
    name = backend_name(runtime)
    if name.upper() not in dist.Backend._plugins:
        if runtime.backend not in _TORCH_OWN and not hasattr(dist.Backend, name.upper()):
            # register_backend keeps an attribute that exists: this is what Backend(name) returns from now on.
            setattr(dist.Backend, name.upper(), BackendName(name, runtime.backend))
        dist.Backend.register_backend(name, _Creator(name), extended_api=True, devices=[runtime.device_type])
    return name


class _Creator:
    """The creator torch calls for every group of an ``xccl_<backend>`` backend."""

    def __init__(self, name: str) -> None:
        self.name: Final = name

    def __call__(self, options: Any, pg_options: Any) -> XcclProcessGroup:
        runtime = STATE.runtime
        if runtime is None or backend_name(runtime) != self.name:
            raise InitError(
                f"torch.distributed creates a group of xccl's backend {self.name!r}, but xccl has not prepared it in "
                "this process: call xccl.init() (or xccl.process_group_backend()) before creating groups on it"
            )
        if STATE.job is None and STATE.job_at is not None:
            _place_world(runtime, options)
        if pg_options is None:
            # A group created by third-party code (DeviceMesh, FSDP, Megatron-style builders): the vendor's options.
            world = None if not dist.is_initialized() else list(options.global_ranks_in_group)
            pg_options = runtime.process_group_options(world)
        given = options.timeout  # a mixed group's host (gloo) groups keep it: no vendor watchdog watches them
        watchdog = runtime.plugin.vendor_runtime().watchdog
        if watchdog is not None:
            # Every group, whoever creates it: the vendor's watchdog never gets a timeout at or below its floor.
            decided = group_timeout(watchdog, options.timeout)
            if decided.note is not None:
                warn_once(("timeout", runtime.plugin.name), f"xccl: {decided.note}.", TimeoutWarning)
            options.timeout = decided.timeout
        world_map = STATE.world_map
        if world_map is not None and len(world_map.split(members_of(options))) > 1:
            return _mixed_group(runtime, world_map, options, pg_options, self.name, given)
        return _vendor_group(runtime, self.name, options, pg_options)


def _vendor_group(runtime: Runtime, name: str, options: Any, pg_options: Any) -> XcclProcessGroup:
    """xccl's group over the vendor's own group of ``options``' members (and its host-side gloo group where the
    plugin needs one): every group of one vendor, and each island's part of a mixed group."""
    t = time.perf_counter()
    native = runtime.create_native_group(options, pg_options)
    t = STATE.lap("native group", t)
    side = None
    if needs_host_side(runtime):
        side = fake_backend(options.group_rank, options.group_size) if fake_world() is not None else \
            ProcessGroupGloo(PrefixStore("xccl.side", options.store), options.group_rank, options.group_size,
                             options.timeout)
        STATE.lap("host-side gloo group", t)
    LOG.debug("xccl group %s (%s) of %d ranks over %s", options.group_id, name, options.group_size,
              type(native).__name__)
    return XcclProcessGroup(options, native, side, name, runtime.device_type, pg_options)


def _mixed_group(runtime: Runtime, world_map: Any, options: Any, pg_options: Any, name: str,
                 host_timeout: _dt.timedelta) -> XcclProcessGroup:
    """xccl's group over members of several islands: its kernels are the compositions of ``_mixed``, over this
    rank's island group (the vendor's timeout policy applied) and gloo groups over the host (``host_timeout``, the
    one given: no vendor watchdog watches them); the host group serves what torch routes past Python."""
    parts = MixedProcessGroup(options, runtime, world_map, partial(_vendor_group, runtime, name), host_timeout)
    group = XcclProcessGroup(options, parts.host, None, name, runtime.device_type, pg_options)
    #: Read by dispatch's planner (``_dispatch.plan``) and by ``xccl.mixed_table``.
    group.mixed = parts  # type: ignore[attr-defined]
    LOG.debug("xccl mixed group %s: islands %s", options.group_id, parts.parts)
    return group


def _place_world(runtime: Runtime, options: Any) -> None:
    """Place this process when a framework creates the world on xccl's backend (after ``process_group_backend``).

    The world's group is the first one torch creates, and its options carry this rank and the world's size, which
    the framework may have given only as arguments (Lightning, Ray Train); the launcher's variables exist by now.
    Placed before the vendor's group is created: vendors that bind a group to the current device (SCCL takes the
    current TPU stream in its constructor) need the device set first.
    """
    job_at = STATE.job_at
    if job_at is None:  # pragma: no cover - the caller checked
        return
    job = job_at(options.group_rank, options.group_size)
    STATE.device = runtime.place(job)
    STATE.job, STATE.job_at = job, None


class TimeoutWarning(UserWarning):
    """The timeout given to xccl is not what bounds a collective on this vendor (warned once per process)."""


class XcclProcessGroup(dist.ProcessGroup):
    """A ``torch.distributed.ProcessGroup`` whose collectives run through xccl's dispatch.

    Args:
        options: torch's ``_DistributedBackendOptions`` for the group.
        native: the vendor's own process group (or c10d ``Backend``): where native kernels run.
        side: a gloo backend over the same ranks for point-to-point staged through host memory, or None.
        name: the torch.distributed backend name (``xccl_<backend>``).
        device_type: the device type of the group's tensors.
        pg_options: the vendor's options the group was created with (HCCL's ``Options``, SCCL's chip map).
    """

    def __init__(self, options: Any, native: Any, side: Any, name: str, device_type: str, pg_options: Any = None) -> None:
        super().__init__(options.group_rank, options.group_size)  # type: ignore[call-arg]
        #: The vendor's own process group or backend.
        self.native: Final = native
        #: The host-side gloo group over the same ranks, or None.
        self.side: Final = side
        #: The vendor's options the group was created with.
        self.pg_options: Final = pg_options
        #: The timeout the vendor's group got (after xccl's watchdog policy).
        self.timeout: Final[_dt.timedelta] = options.timeout
        #: The group's store (torch's prefix store for the group), for xccl's own bookkeeping.
        self.store: Final = options.store
        self._backend_name: Final = name
        device = torch.device(device_type)
        # The vendor's backend object serves group_name (stored in the backends), _get_backend(device) (vendor
        # extras such as get_hccl_comm_name) and anything torch routes to the backend without a Python override.
        backend = native._get_backend(device) if isinstance(native, dist.ProcessGroup) else native
        self._register_backend(device, dist.ProcessGroup.BackendType.CUSTOM, backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    def getBackendName(self) -> str:  # camelCase: the name the C++ trampoline looks up
        """xccl's backend name, which ``pg.name()`` reports."""
        return self._backend_name

    def __repr__(self) -> str:
        return f"<XcclProcessGroup {self._backend_name} rank={self.rank()} size={self.size()}>"

    def shutdown(self) -> None:
        """What ``torch.distributed.destroy_process_group(group)`` calls: xccl's state of the group (its scratch
        buffers) goes first, then the backends."""
        forget(self)
        super().shutdown()

    # ---------------------------------------------------------------------------------------- the c10d methods
    # Every c10d method an op's spec names (``Spec.c10d``) is a method of this class, made from the spec's decoder
    # below (``_c10d_method``): the call becomes the public arguments of xccl's function and runs through xccl's
    # dispatch with async_op=True (torch's wrappers wait on the returned Work themselves when the caller did not ask
    # for it). ``allreduce`` takes the flat path xccl.all_reduce takes: DDP's reducer and dist.all_reduce land there
    # on every bucket.

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        """``ProcessGroup.allreduce`` (one tensor; several are an all_reduce_coalesced)."""
        if type(tensors) is list and len(tensors) == 1:
            return _returned(all_reduce(tensors[0], op_of(opts), self, True))
        key, public = d_allreduce(tensors, opts)
        return _returned(dispatch(SPECS[key], self, True, *public))


def _c10d_method(method: Method) -> Any:
    """The method of :class:`XcclProcessGroup` for c10d's ``method``: decode, then dispatch."""
    decode = method.decode
    if not method.pairs:
        def call(self: XcclProcessGroup, *args: Any, **kwargs: Any) -> Any:
            key, public = decode(*args, **kwargs)
            return _returned(dispatch(SPECS[key], self, True, *public))
    else:
        def call(self: XcclProcessGroup, *args: Any, **kwargs: Any) -> Any:
            key, calls = decode(*args, **kwargs)
            spec = SPECS[key]

            def issue() -> Work:
                return _all_of([dispatch(spec, self, True, *public) for public in calls])

            return _coalesced(self, method, key, args, issue)

    call.__name__ = call.__qualname__ = method.name
    call.__doc__ = f"``ProcessGroup.{method.name}``, decoded into xccl's call and dispatched."
    return call


# The signatures are the C++ virtuals' (tensors, opts), which torch.distributed and the trampoline call; every name
# torch and the trampoline call a method by (``all_gather_single`` for ``_allgather_base``, ...) is set. Each runs
# outside Dynamo: when a compiled function calls a torch.distributed function Dynamo cannot trace (dist.broadcast
# builds a pybind options struct), Dynamo breaks the graph and, on torch 2.13, then traces on into this group's
# Python method, where reading any attribute of the group (an opaque object to it) is a hard InternalTorchDynamoError
# instead of a graph break. Disabled, the method is a graph break of its own and runs eagerly, as a C++ group's would.
for _spec in dict.fromkeys(SPECS.values()):
    for _m in _spec.c10d:
        _fn = XcclProcessGroup.allreduce if _m.name == "allreduce" else _c10d_method(_m)
        _eager = torch.compiler.disable(_fn)  # type: ignore[no-untyped-call]
        for _name in _m.names:
            setattr(XcclProcessGroup, _name, _eager)


def _coalesced(group: XcclProcessGroup, method: Method, key: Collective, args: tuple[Any, ...], issue: Any) -> Any:
    """A coalesced tensor form (one collective per pair), shown to watching tools as its own c10d op, once."""
    if not _observe.watched():
        return issue()
    return _observe.visible(state_of(group), key, method.name, args[:2], issue, method.tool)


def _returned(work: Any) -> Any:
    """A ``torch.distributed.Work`` for torch (a completed one when the kernel finished synchronously)."""
    return work if work is not None else Work()


def _all_of(works: Sequence[Any]) -> Work:
    """One work that waits for several."""
    return Work([w for w in works if w is not None])
