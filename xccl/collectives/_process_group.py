"""xccl's c10d process group: what puts xccl under torch.distributed, DDP, FSDP2, DTensor and compiled graphs.

Every group of xccl's backend (``xccl_<vendor backend>``: ``xccl_gloo``, ``xccl_hccl``...; never ``xccl``, which
torch owns for Intel XPUs; registered by ``_backend``) is an :class:`XcclProcessGroup`: a
``torch.distributed.ProcessGroup`` whose collective methods decode the c10d call into the public arguments and run
xccl's dispatch, over the vendor's own process group (``Runtime.create_native_group``)::

    dist.all_gather_into_tensor(out, inp, group=g)      # FSDP2, or any code written for torch.distributed
      -> g.all_gather_single(out, inp, opts)            # Python override (the pybind trampoline routes C++
                                                        # callers here too: DDP's reducer, functional collectives)
        -> dispatch(ALL_GATHER_INTO_TENSOR, ...)        # validation, the capability table, fallback policy,
                                                        # mismatch check, typed faults
          -> native: the vendor group's _allgather_base(out, inp, opts)
          -> emulated (SCCL has no reduce_scatter): all_to_all_single on the vendor group + a local reduction
          -> unsupported: UnsupportedCollective, before any rank communicates

What torch reports: ``dist.get_backend(g)`` is ``"xccl_<backend>"`` (pass it to ``new_group``);
``g._get_backend(device)`` is the vendor's backend object, so vendor code that reaches for it
(``get_hccl_comm_name``, FSDP2's allocator hooks) finds what it expects.

Over a vendor backend torch does not know itself (``hccl``, ``sccl``), ``dist.get_backend(g)`` is a
:class:`BackendName`: xccl's name, which also compares equal to the vendor's, so vendor code that checks the name
(torch_npu, TorchAir) takes the vendor's path while ``new_group(backend=get_backend())`` still creates xccl's groups.
Over gloo and nccl no alias is made: torch compares the name with them to build its own groups (``_backend``).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist
from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

from ..errors import InvalidArgument
from ..ops._c10d import Method, d_allreduce, op_of
from ..ops._specs import SPECS, Access, Spec
from ..ops._torch import ASYNC_OP, TORCH
from ..plugin._capabilities import Collective
from ..plugin._contract import Runtime
from ..plugin._python_group import PythonProcessGroup
from ..plugin._work import Work
from . import _observe
from ._dispatch import all_reduce, dispatch
from ._groups import forget, state_of
from ._state import Fallback, GroupState
from ._vendor import VendorGroup

__all__ = ["PREFIX", "BackendName", "XcclProcessGroup", "backend_name"]


#: The prefix of xccl's torch.distributed backend names.
PREFIX: Final = "xccl_"
_ALLREDUCE_OPTIONS: Final = dist.AllreduceOptions
#: Whether torch's wrappers take None from a blocking call (2.8 on); 2.7's call ``work.wait()`` on what they get.
_BLOCKING_NONE: Final = TORCH.has(ASYNC_OP)


def backend_name(runtime: Runtime) -> str:
    """The torch.distributed backend name of xccl's process group over ``runtime``'s vendor backend."""
    return f"{PREFIX}{runtime.backend}"


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


class XcclProcessGroup(PythonProcessGroup):
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
        super().__init__(options.group_rank, options.group_size)
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

    def make_state(self, runtime: Runtime, fallback: Fallback, check: bool) -> GroupState:
        """xccl's state of this group (``_state.register``): a group of one vendor."""
        return VendorGroup(self, self.native, self.side, runtime, fallback, check)

    def shutdown(self) -> None:
        """What ``torch.distributed.destroy_process_group(group)`` calls: xccl's state of the group (its scratch
        buffers) goes first, then the backends."""
        forget(self)
        if isinstance(self.native, dist.ProcessGroup):  # torch's shutdown reaches the vendor's backend, not its group
            self.native.shutdown()
        super().shutdown()

    # ---------------------------------------------------------------------------------------- the c10d methods
    # Every c10d method an op's spec names (``Spec.c10d``) is a method of this class, made from the spec's decoder
    # below (``_c10d_method``): the call becomes the public arguments of xccl's function and runs through xccl's
    # dispatch. ``allreduce`` takes the path xccl.all_reduce takes: DDP's reducer and dist.all_reduce land there on
    # every bucket.
    #
    # Synchronous or not: torch 2.13's collectives tell the group in the options struct (``opts.asyncOp =
    # async_op``) and accept None from it ("the backend has sync'ed", ``distributed_c10d.py``: ``elif work is not
    # None: work.wait()``). A caller that will wait at once gets the call run synchronously and None, so it gains no
    # handle and no Python wait; every other caller (C++'s options default to asyncOp=True: DDP's reducer, the
    # functional collectives) gets xccl's typed handle. torch 2.7's options have no asyncOp (every call is async to
    # the group) and its wrappers wait on whatever they get: a blocking call there gets a completed handle.

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        """``ProcessGroup.allreduce`` (one tensor; several are an all_reduce_coalesced)."""
        if type(opts) is _ALLREDUCE_OPTIONS and type(tensors) is list and len(tensors) == 1:  # every bucket
            if _BLOCKING_NONE and not opts.asyncOp:
                all_reduce(tensors[0], op_of(opts), self, False)
                return None
            work = all_reduce(tensors[0], op_of(opts), self, True)
            return work if work is not None else Work()
        async_op = opts is None or getattr(opts, "asyncOp", True)
        key, public = d_allreduce(tensors, opts)
        return _returned(dispatch(SPECS[key], self, async_op, *public), async_op)


def _c10d_method(method: Method) -> Any:
    """The method of :class:`XcclProcessGroup` for c10d's ``method``: decode, then dispatch."""
    decode = method.decode
    if not method.pairs:
        def call(self: XcclProcessGroup, *args: Any, **kwargs: Any) -> Any:
            key, public = decode(*args, **kwargs)
            # The options struct is the last argument, or ``opts=`` (send and recv take none: always a handle).
            async_op = getattr(kwargs.get("opts", args[-1] if args else None), "asyncOp", True)
            spec = SPECS[key]
            try:
                return _returned(dispatch(spec, self, async_op, *public), async_op)
            except InvalidArgument:
                contiguous = _contiguous_inputs(spec, public)
                if contiguous is None:
                    raise
            return _returned(dispatch(spec, self, async_op, *contiguous), async_op)
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


def _contiguous_inputs(spec: Spec, public: Sequence[Any]) -> list[Any] | None:
    """``public`` with every tensor the call only reads made contiguous, or None when each already was.

    torch's own autograd functions hand the group what the user cannot reach: ``_AllGatherBase.backward`` passes
    ``sum().backward()``'s expanded gradient to reduce_scatter. NCCL and HCCL read such an input by ``data_ptr``
    and reduce the wrong elements, silently; xccl's validation refuses it before anything is sent. A caller through
    torch.distributed gets the copy xccl's own functions ask the user to make. Only after the validation refused
    the call (on every rank alike, before communicating), so a contiguous call pays nothing; written tensors are
    never copied (the result would land in the copy).
    """
    out = list(public)
    changed = False
    for i, arg in enumerate(spec.args[: len(out)]):
        value = out[i]
        if arg.access is not Access.READ:
            continue
        if isinstance(value, torch.Tensor) and not value.is_contiguous():
            out[i] = value.contiguous()
            changed = True
        elif isinstance(value, list) and any(isinstance(t, torch.Tensor) and not t.is_contiguous() for t in value):
            out[i] = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in value]
            changed = True
    return out if changed else None


def _outside_dynamo(fn: Any) -> Any:
    """``fn``, run outside Dynamo at no cost per call.

    When a compiled function calls a torch.distributed function Dynamo cannot trace (dist.broadcast builds a pybind
    options struct), Dynamo breaks the graph and, on torch 2.13, then traces on into this group's Python method,
    where reading any attribute of the group (an opaque object to it) is a hard InternalTorchDynamoError instead of a
    graph break. ``torch.compiler.disable`` avoids that with a wrapper that costs about a microsecond per call, as
    much as the rest of a native call's dispatch. The same two marks, without the wrapper: the attribute Dynamo's
    tracer reads to graph-break at a call (``symbolic_convert.py``: ``_torchdynamo_disable``), and the frame strategy
    its frame evaluation reads to run the method, and every frame it calls, eagerly (``FrameAction.SKIP`` for the
    frame and recursively, as ``torch._dynamo.skip`` sets for the frame alone).
    """
    fn._torchdynamo_disable = True
    set_code_exec_strategy(fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return fn


# The signatures are the C++ virtuals' (tensors, opts), which torch.distributed and the trampoline call; every name
# torch and the trampoline call a method by (``all_gather_single`` for ``_allgather_base``, ...) is set. Each runs
# outside Dynamo (``_outside_dynamo``): a graph break of its own, run eagerly, as a C++ group's would.
for _spec in dict.fromkeys(SPECS.values()):
    for _m in _spec.c10d:
        _fn = _outside_dynamo(XcclProcessGroup.allreduce if _m.name == "allreduce" else _c10d_method(_m))
        for _name in _m.names:
            setattr(XcclProcessGroup, _name, _fn)


def _coalesced(group: XcclProcessGroup, method: Method, key: Collective, args: tuple[Any, ...], issue: Any) -> Any:
    """A coalesced tensor form (one collective per pair), shown to watching tools as its own c10d op, once."""
    if not _observe.watched():
        return issue()
    return _observe.visible(state_of(group), key, method.name, args[:2], issue, method.tool)


def _returned(work: Any, async_op: bool = True) -> Any:
    """What a c10d method returns: a ``torch.distributed.Work`` for an asynchronous caller (a completed one when the
    kernel finished synchronously), None for a caller that asked for a synchronous call (it already ran) where torch
    takes None (:data:`_BLOCKING_NONE`)."""
    if not async_op and _BLOCKING_NONE:
        return None
    return work if work is not None else Work()


def _all_of(works: Sequence[Any]) -> Work:
    """One work that waits for several."""
    return Work([w for w in works if w is not None])
