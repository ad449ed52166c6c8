"""Collectives on a group whose members span islands of a mixed-vendor world (docs/mixed.md).

Such a group is its own kind: a :class:`MixedProcessGroup` (xccl's c10d group, so DDP, FSDP2 and ``dist.*`` reach it
as any other) whose state is a :class:`MixedGroup`, with its islands, its derived capability table and its own
fallback policy. Its kernels are compositions of two parts:

* the *island group*: this rank's vendor group over the members of its island, an :class:`XcclProcessGroup` run
  through xccl's ordinary dispatch, so the vendor's table, its emulations (Sophgo's missing reduce_scatter is
  emulated inside the Sophgo island only) and its typed errors apply there;
* the *host transport*: gloo groups over CPU tensors (a device-to-host copy on real hardware, nothing in
  simulation): the *peers* (the members with the same index in their island, one per island; index 0 are the
  islands' leaders) and the *host* group of every member.

How each op is composed (hierarchical through the islands, through the leaders, or host-staged over every member)
and what crosses islands is the table in docs/mixed.md (the compositions: ``_mixed_ops``).

The plan for a call (:meth:`MixedGroup.kernel_for`) checks each island's part against that island's table under the
group's fallback policy on every rank (every rank knows every plugin's table), so a part one island cannot do is an
:class:`~xccl.UnsupportedCollective` on every rank before any communication. The fused ops take their portable
version on every rank (one island's fused kernel cannot reach the others), and graph mode is refused at trace time
(the derived table's graph column): each rank's own compiler would lower the op for its own island.

A composition runs on the group's own thread, one call after another in the order they were issued, so that
``async_op=True`` returns before the collective completes (its handle's ``wait()`` completes it) while every rank
still runs the group's calls in the same order.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, _DistributedBackendOptions

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..plugin._capabilities import CapabilityTable, Collective, Level, Support, reduce_op_name, table_from
from ..plugin._contract import Runtime
from ..plugin._registry import default_registry
from ._dispatch import invalid, run
from ._hooks import install
from ._islands import WorldMap
from ._mixed_ops import COMPOSITIONS, HIERARCHICAL, REDUCE, LinkBytes, mixed_table
from ._process_group import XcclProcessGroup
from ._state import Fallback, GroupState
from ._vendor import VendorGroup

__all__ = ["HIERARCHICAL", "Islands", "LinkBytes", "MixedGroup", "MixedProcessGroup", "members_of", "mixed_group", "mixed_table"]

LOG = logging.getLogger("xccl")
C = Collective
def members_of(options: Any) -> list[int]:
    """The global ranks of a group being created, in group order (torch leaves them empty for the world)."""
    return list(options.global_ranks_in_group) or list(range(options.group_size))


def _gloo(store: Any, prefix: str, rank: int, size: int, timeout: _dt.timedelta) -> Any:
    return ProcessGroupGloo(PrefixStore(prefix, store), rank, size, timeout)


class Islands:
    """The parts of a group spanning islands: this rank's island group and the host transport.

    Args:
        options: torch's ``_DistributedBackendOptions`` for the group.
        runtime: this rank's runtime.
        world_map: the world's map.
        island_group: builds this rank's island group from its options (``_process_group``'s creator does).
        host_timeout: the host groups' timeout (default the group's): the timeout given, where the vendor's
            watchdog policy raised the island group's (Ascend: above HCCL_EXEC_TIMEOUT), as no watchdog watches gloo.
    """

    def __init__(self, options: Any, runtime: Runtime, world_map: WorldMap,
                 island_group: Callable[[Any, Any], Any], host_timeout: _dt.timedelta | None = None) -> None:
        members = members_of(options)
        me = members[options.group_rank]
        #: Each island's members (global ranks, group order), islands in the order of their first member.
        self.parts: Final = world_map.split(members)
        self.members: Final = tuple(members)
        self.index: Final = {r: i for i, r in enumerate(members)}
        self.mine: Final = next(i for i, p in enumerate(self.parts) if me in p)
        island = self.parts[self.mine]
        #: This rank's index in its island.
        self.local: Final = island.index(me)
        self.equal: Final = len({len(p) for p in self.parts}) == 1
        self.k: Final = len(island)
        self.runtime: Final = runtime
        self.plugins: Final = tuple(world_map.plugins[p[0]] for p in self.parts)
        store = options.store
        io = _DistributedBackendOptions()
        io.store = PrefixStore(f"xccl.mixed.island.{self.mine}", store)
        io.group_rank, io.group_size, io.timeout = self.local, len(island), options.timeout
        timeout = options.timeout if host_timeout is None else host_timeout
        io.group_id = f"{options.group_id}.island{self.mine}"
        io.global_ranks_in_group = list(island)
        self.island_name: Final = io.group_id
        #: This rank's vendor group over its island (xccl's dispatch runs on it).
        self.island: Final = island_group(io, runtime.process_group_options(list(island)))
        # The same creation order on every rank (host, then own peers; peer groups are disjoint): gloo's connect
        # cannot deadlock.
        #: Every member, over the host.
        self.host: Final = _gloo(store, "xccl.mixed.host", options.group_rank, len(members), timeout)
        peers = [p[self.local] for p in self.parts if len(p) > self.local]
        #: The members with this rank's island index, one per island that has it (index 0: the leaders).
        self.peers: Final = _gloo(store, f"xccl.mixed.peers.{self.local}", peers.index(me), len(peers), timeout)
        self.links: Final = LinkBytes()
        # The other islands' plugins, loaded (not their SDKs) once: their tables and declared patches.
        plugins = {p: runtime.plugin if p == runtime.plugin.name else default_registry().get(p) for p in self.plugins}
        #: Each island's plugin -> its table; each island's size in this group.
        self.tables: Final = {p: runtime.capabilities() if p == runtime.plugin.name else plugin.capabilities()
                              for p, plugin in plugins.items()}
        self.sizes: Final = {world_map.plugins[p[0]]: len(p) for p in self.parts}
        #: Whether some island's SDK replaces ``torch.distributed.gather`` (torch_npu's: the root's sizes go
        #: first, ``_mixed_ops._root_sizes_first``), so the group's gather must send what that replacement sends.
        self.gather_replaced: Final = any(patch.target == "torch.distributed.gather"
                                          for plugin in plugins.values() for patch in plugin.vendor_runtime().patches)

    def describe(self) -> str:
        """The group's islands, e.g. ``2 ascend + 2 sophgo``."""
        return " + ".join(f"{len(p)} {n}" for p, n in zip(self.parts, self.plugins, strict=True))


class MixedProcessGroup(XcclProcessGroup):
    """xccl's c10d group over members of several islands: its host group serves what torch routes past Python, and
    its state is a :class:`MixedGroup` (:meth:`make_state`)."""

    def __init__(self, options: Any, islands: Islands, name: str, device_type: str, pg_options: Any = None) -> None:
        super().__init__(options, islands.host, None, name, device_type, pg_options)
        #: The group's parts (read by its state).
        self.islands: Final = islands

    def make_state(self, runtime: Runtime, fallback: Fallback, check: bool) -> GroupState:
        """This group's state: a :class:`MixedGroup`."""
        return MixedGroup(self, runtime, self.islands, fallback, check)

    def __repr__(self) -> str:
        return f"<MixedProcessGroup {self.islands.describe()} rank={self.rank()} size={self.size()}>"


def mixed_group(runtime: Runtime, world_map: WorldMap, options: Any, pg_options: Any, name: str,
                host_timeout: _dt.timedelta, vendor_group: Callable[..., Any]) -> MixedProcessGroup:
    """xccl's group over members of several islands (``_process_group``'s creator): its island part is this rank's
    vendor group (``vendor_group``, the vendor's timeout policy applied), its host groups keep ``host_timeout``, the
    timeout given (no vendor watchdog watches them)."""
    islands = Islands(options, runtime, world_map, partial(vendor_group, runtime, name), host_timeout)
    LOG.debug("xccl mixed group %s: islands %s", options.group_id, islands.parts)
    return MixedProcessGroup(options, islands, name, runtime.device_type, pg_options)


def _derived_table(islands: Islands) -> CapabilityTable:
    """The capability table of a group spanning ``islands``: how each op runs there (:func:`mixed_table`), the fused
    ops' portable version, and no graph mode."""
    eager: dict[Collective, Support] = {}
    for op, how in mixed_table(islands.tables, islands.sizes).items():
        eager[op] = (Support(Level.UNSUPPORTED, note=how.removeprefix("unsupported: ")) if how.startswith("unsupported")
                     else Support(Level.NATIVE, note=f"{how} across islands"))
    for op in S.FUSED:
        eager[op] = Support(Level.EMULATED, via="pipelined", note="the portable pipelined version on every rank: one "
                            "island's fused kernel cannot reach the others")
    graph = Support(Level.UNSUPPORTED, note="graph mode is not composed across vendors: compile the collectives of "
                    "groups inside one island (tensor parallelism) and run this group's eagerly, e.g. in a function "
                    "under torch.compiler.disable")
    return table_from(f"a group that spans islands ({islands.describe()})", eager,
                      dict.fromkeys(Collective, graph),
                      default=Support(Level.UNSUPPORTED, note="no composition across islands yet"))


class MixedGroup(GroupState):
    """The state of a group spanning islands of a mixed-vendor world (see the module docstring).

    Its kernels are compositions over its :class:`Islands`; its island part runs through the island's own vendor
    state (its table, emulations and hooks) under this group's fallback policy; its table is derived
    (:func:`_derived_table`); its calls run one after another on the group's own thread.
    """

    __slots__ = ("_pool", "island_state", "islands", "leaders_only")

    def __init__(self, group: Any, runtime: Runtime, islands: Islands, fallback: Fallback, check: bool) -> None:
        super().__init__(group, islands.host, None, runtime, fallback, check, table=_derived_table(islands))
        self.islands: Final = islands
        #: This rank's island part: the vendor's own group state, under this group's policies.
        self.island_state: Final = VendorGroup(islands.island, getattr(islands.island, "native", islands.island),
                                              getattr(islands.island, "side", None), runtime, fallback, check,
                                              ranks=islands.parts[islands.mine], name=islands.island_name)
        install(self.island_state)
        #: all_reduce call shapes (dtype, reduce op) some island can only run through the leaders' path.
        self.leaders_only: Final[set[tuple[torch.dtype | None, str | None]]] = set()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------------------------------------- planning
    def communicator_name(self) -> str:
        """xccl's name for the group, the same on every member: it has no vendor communicator of its own (each
        island has its own), and asks no vendor (HCCL's would broadcast over the whole group)."""
        if self.comm_name is None:
            self.comm_name = f"xccl-mixed:{self.name}"
        return self.comm_name

    @property
    def communicator_group(self) -> Any:
        """The group whose vendor communicator this rank connects: its island's."""
        return self.islands.island

    def kernel_for(self, op: Collective, dtype: torch.dtype | None, reduce_op: Any, block: Any,
                   fallback: Callable[[], Any] | None = None) -> Any:
        """The composition of ``op`` on this group, once every island can do its part (else UnsupportedCollective
        on every rank); the fused ops' portable version (``fallback``)."""
        if fallback is not None:
            return fallback()
        redop = None if reduce_op is None else reduce_op_name(reduce_op)
        self._require(op, dtype, redop)
        fn = COMPOSITIONS.get(op)
        if fn is None:
            raise UnsupportedCollective(op.value, self.plugin, "no composition across islands yet")

        def kernel(*kargs: Any) -> Any:
            *args, async_op = kargs
            # Complete when done, holding the output (a DDP communication hook reads ``fut.value()[0]``).
            first = args[0] if args else None
            out = [first] if isinstance(first, torch.Tensor) else list(first) if isinstance(first, list) else []
            future = self._submit(fn, args)
            work = _ThreadWork(future, [t for t in out if isinstance(t, torch.Tensor)])
            if async_op:
                return work
            work.wait()
            return None

        return kernel

    def _submit(self, fn: Callable[..., None], args: Sequence[Any]) -> concurrent.futures.Future[None]:
        """Run ``fn(self, *args)`` on the group's thread, after every call issued before it."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"xccl-mixed-{self.name}")
        return self._pool.submit(fn, self, *args)

    def close(self) -> None:
        """The group is gone: its thread ends once its calls are done."""
        super().close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.island_state.close()

    def _refusal(self, parts: Sequence[Collective], dtype: torch.dtype | None, redop: str | None) -> str | None:
        """Why some island cannot run one of ``parts`` for this call shape (None: every island can), under the
        group's fallback policy (an island part emulated under ``"error"`` is refused here, on every rank alike,
        rather than in that island's dispatch while the other islands go on)."""
        allow = self.fallback != "error"
        red = None if redop is None else "sum" if redop == "avg" else redop
        for part in parts:
            for plugin, size in self.islands.sizes.items():
                if size < 2:
                    continue  # an island of one runs no island part
                t = self.islands.tables[plugin]
                refused = t.refusal(part, t.resolve(part, dtype=dtype, reduce_op=red, world_size=size),
                                    allow_emulated=allow)
                if refused is not None:
                    return f"{plugin}'s island cannot do its part: {refused.detail}"
        return None

    def _require(self, op: Collective, dtype: torch.dtype | None, redop: str | None) -> None:
        """Every island can do its part of ``op`` for this call shape, else UnsupportedCollective (every rank
        decides alike: every rank checks every island's table). all_reduce takes the leaders' path where an
        island cannot reduce_scatter or all_gather but can reduce and broadcast."""
        where = f"a mixed group of {self.islands.describe()}"
        if redop is not None and redop not in REDUCE:
            raise UnsupportedCollective(op.value, where, f"reduce op {redop} cannot be composed across islands "
                                        "(sum, avg, max, min and product can)")
        parts = HIERARCHICAL.get(op, ())
        why = self._refusal(parts[:2], dtype, redop)
        if why is not None and op is C.ALL_REDUCE and self._refusal(parts[2:], dtype, redop) is None:
            self.leaders_only.add((dtype, redop))
            return
        if why is not None:
            raise UnsupportedCollective(op.value, where, why)

    def island_call(self, spec: S.Spec, *public: Any) -> None:
        """Run ``spec`` on this rank's island (validated, planned and observed as any call there), blocking."""
        st = self.island_state
        run(st, spec, spec.validate(st, invalid, *public), False)


class _ThreadWork(dist.Work):
    """The handle of a composition running on its group's thread: ``wait()`` waits for it, its future holds the
    outputs (a DDP communication hook reads ``fut.value()[0]``)."""

    def __init__(self, future: concurrent.futures.Future[None], result: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self._future: Final = future
        self._result: Final = list(result)

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for the composition; its error (typed by the island's dispatch, or gloo's) is raised here. A wait
        with a timeout that runs out raises c10d's own ``Work::wait`` text, as gloo's work does: the mismatch
        detector and the health watch wait in slices, and read it as a slice that ran out."""
        seconds = None if timeout is None or timeout == _dt.timedelta(0) else timeout.total_seconds()
        try:
            self._future.result(seconds)
        except concurrent.futures.TimeoutError:
            raise RuntimeError("Operation timed out!") from None
        return True

    def is_completed(self) -> bool:
        """Whether the composition finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """Whether it finished without error."""
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """Its failure, once finished."""
        return self._future.exception() if self._future.done() else None

    def result(self) -> list[torch.Tensor]:
        """The output tensors."""
        return self._result

    def synchronize(self) -> None:
        """``Work.synchronize``: the composition runs on the host, so this waits."""
        self.wait()

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future of the outputs, completed when the composition is."""
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

        def complete(done: concurrent.futures.Future[None]) -> None:
            error = done.exception()
            if error is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(error)  # type: ignore[arg-type]  # torch's stub types it as the result

        self._future.add_done_callback(complete)
        return fut

