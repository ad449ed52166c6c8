"""Collectives on a group whose members span islands of a mixed-vendor world (docs/mixed.md).

Such a group is a :class:`MixedProcessGroup`: xccl's c10d group (so DDP, FSDP2 and ``dist.*`` reach it as any
other) whose kernels are compositions of two parts:

* the *island group*: this rank's vendor group over the members of its island, an :class:`XcclProcessGroup` run
  through xccl's ordinary dispatch, so the vendor's table, its emulations (Sophgo's missing reduce_scatter is
  emulated inside the Sophgo island only) and its typed errors apply there;
* the *host transport*: gloo groups over CPU tensors (a device-to-host copy on real hardware, nothing in
  simulation): the *peers* (the members with the same index in their island, one per island; index 0 are the
  islands' leaders) and the *host* group of every member.

Hierarchical (the cross-island part carries 1/k of the bytes, k ranks per island, where every island has k
members and the size divides): all_reduce (island reduce_scatter, peers all_reduce of the shard, island
all_gather), reduce_scatter_tensor (island reduce_scatter, peers reduce_scatter). Through the leaders, any island
sizes: all_reduce when the size does not divide or the islands differ in size (island reduce, leaders all_reduce,
island broadcast), broadcast (island broadcast in the root's island, leaders, island broadcast). all_gather_into_tensor
is island all_gather then the peers' all_gather of island blocks (equal islands; else host-staged). Every other op is
*host-staged*: one gloo call over the host group (all_to_all(_single), all_gather (list), reduce_scatter (list),
reduce, gather, scatter, send/recv, barrier, the coalesced forms).

The plan for a call (:meth:`MixedProcessGroup.compose`) checks each island's part against that island's table on
every rank (every rank knows every plugin's table), so a part one island cannot do is an
:class:`~xccl.UnsupportedCollective` on every rank before any communication.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, _DistributedBackendOptions

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..plugin._capabilities import CapabilityTable, Collective, Level, reduce_op_name
from ..plugin._contract import Runtime
from ..plugin._registry import default_registry
from ..plugin._work import Work
from ._dispatch import dispatch
from ._islands import WorldMap
from ._state import STATE, register

__all__ = ["HIERARCHICAL", "HOST_STAGED", "LinkBytes", "MixedProcessGroup", "members_of", "mixed_table"]

C = Collective
_SUM: Final = dist.ReduceOp.SUM
#: The reduce ops a composition can carry (AVG as SUM, divided at the end).
_REDUCE: Final = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                  "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}

#: The ops composed of island parts, and the island ops each needs.
HIERARCHICAL: Final[dict[Collective, tuple[Collective, ...]]] = {
    C.ALL_REDUCE: (C.REDUCE_SCATTER_TENSOR, C.ALL_GATHER_INTO_TENSOR, C.REDUCE, C.BROADCAST),
    C.REDUCE_SCATTER_TENSOR: (C.REDUCE_SCATTER_TENSOR,),
    C.ALL_GATHER_INTO_TENSOR: (C.ALL_GATHER_INTO_TENSOR,),
    C.BROADCAST: (C.BROADCAST,),
}
#: The ops carried by the host group alone.
HOST_STAGED: Final = (C.ALL_REDUCE_COALESCED, C.ALL_GATHER, C.ALL_GATHER_COALESCED, C.REDUCE_SCATTER, C.ALL_TO_ALL,
                      C.ALL_TO_ALL_SINGLE, C.ALL_TO_ALL_SINGLE_UNEVEN, C.REDUCE, C.GATHER, C.SCATTER, C.BARRIER,
                      C.SEND, C.RECV, C.RECV_ANY_SOURCE)


@dataclass
class LinkBytes:
    """Bytes this rank put on each link, by the compositions (``MixedProcessGroup.links``)."""

    #: Into island collectives (the vendor's own link).
    island: int = 0
    #: Into cross-island (host, gloo) collectives.
    cross: int = 0


def mixed_table(tables: dict[str, CapabilityTable], sizes: dict[str, int]) -> dict[Collective, str]:
    """The derived table of a group spanning islands: op -> how it runs there, for ``xccl caps --group``.

    ``"hierarchical"`` (island parts + the host between islands), ``"host-staged"`` (the host group alone) or
    ``"unsupported: <why>"``; a hierarchical op names the island parts a vendor only emulates.

    Args:
        tables: each island's plugin -> its capability table.
        sizes: each island's plugin -> its number of members in the group.
    """
    out: dict[Collective, str] = {}
    for op, parts in HIERARCHICAL.items():
        lacking, emulated = [], []
        for plugin, table in tables.items():
            # all_reduce: reduce_scatter + all_gather; where a vendor lacks them, reduce + broadcast (the leaders).
            options = [parts[:2], parts[2:]] if op is C.ALL_REDUCE else [parts]
            for option in options:
                levels = {part: table.level(part, world_size=sizes[plugin]) for part in option}
                if sizes[plugin] < 2 or all(lv is not Level.UNSUPPORTED for lv in levels.values()):
                    emulated += [f"{plugin} emulates {part.value}" for part, lv in levels.items()
                                 if lv is Level.EMULATED and sizes[plugin] > 1]
                    break
            else:
                lacking.append(f"{plugin} cannot run {' + '.join(p.value for p in options[0])}")
        out[op] = ("unsupported: " + "; ".join(lacking) if lacking else
                   "hierarchical" + (f" ({'; '.join(emulated)})" if emulated else ""))
    for op in HOST_STAGED:
        out[op] = "host-staged"
    return out


def members_of(options: Any) -> list[int]:
    """The global ranks of a group being created, in group order (torch leaves them empty for the world)."""
    return list(options.global_ranks_in_group) or list(range(options.group_size))


def _gloo(store: Any, prefix: str, rank: int, size: int, timeout: _dt.timedelta) -> Any:
    return ProcessGroupGloo(PrefixStore(prefix, store), rank, size, timeout)


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory (the tensor itself on CPU: no copy in simulation)."""
    return t if t.is_cpu else t.cpu()


def _back(dst: torch.Tensor, h: torch.Tensor) -> None:
    if h is not dst:
        dst.copy_(h)


class MixedProcessGroup:
    """The parts of a group spanning islands; its c10d face is an ``XcclProcessGroup`` whose ``mixed`` is this
    (``_process_group._mixed_group``).

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
        #: This rank's vendor group over its island (xccl's dispatch runs on it).
        self.island: Final = island_group(io, runtime.process_group_options(list(island)))
        register(self.island, runtime, ranks=tuple(island), name=io.group_id)
        # The same creation order on every rank (host, then own peers; peer groups are disjoint): gloo's connect
        # cannot deadlock.
        #: Every member, over the host.
        self.host: Final = _gloo(store, "xccl.mixed.host", options.group_rank, len(members), timeout)
        peers = [p[self.local] for p in self.parts if len(p) > self.local]
        #: The members with this rank's island index, one per island that has it (index 0: the leaders).
        self.peers: Final = _gloo(store, f"xccl.mixed.peers.{self.local}", peers.index(me), len(peers), timeout)
        self.links: Final = LinkBytes()
        tables = {p: (runtime.capabilities() if p == runtime.plugin.name else default_registry().get(p).capabilities())
                  for p in self.plugins}
        #: Each island's plugin -> its table; each island's size in this group.
        self.tables: Final = tables
        self.sizes: Final = {world_map.plugins[p[0]]: len(p) for p in self.parts}
        #: all_reduce call shapes (dtype, reduce op) some island can only run through the leaders' path.
        self.leaders_only: Final[set[tuple[torch.dtype | None, str | None]]] = set()

    # ------------------------------------------------------------------------------------------------- planning
    def describe(self) -> str:
        """The group's islands, e.g. ``2 ascend + 2 sophgo``."""
        return " + ".join(f"{len(p)} {n}" for p, n in zip(self.parts, self.plugins, strict=True))

    def table(self) -> dict[Collective, str]:
        """The group's derived capability table (:func:`mixed_table`)."""
        return mixed_table(self.tables, self.sizes)

    def _refusal(self, parts: Sequence[Collective], dtype: torch.dtype | None, redop: str | None) -> str | None:
        """Why some island cannot run one of ``parts`` for this call shape (None: every island can), under the
        fallback policy (an island part emulated under ``"error"`` is refused here, on every rank alike, rather
        than in that island's dispatch while the other islands go on)."""
        allow = STATE.fallback != "error"
        red = None if redop is None else "sum" if redop == "avg" else redop
        for part in parts:
            for plugin, size in self.sizes.items():
                if size < 2:
                    continue  # an island of one runs no island part
                t = self.tables[plugin]
                refused = t.refusal(part, t.resolve(part, dtype=dtype, reduce_op=red, world_size=size),
                                    allow_emulated=allow)
                if refused is not None:
                    return f"{plugin}'s island cannot do its part: {refused.detail}"
        return None

    def _require(self, op: Collective, dtype: torch.dtype | None, redop: str | None) -> None:
        """Every island can do its part of ``op`` for this call shape, else UnsupportedCollective (every rank
        decides alike: every rank checks every island's table). all_reduce takes the leaders' path where an
        island cannot reduce_scatter or all_gather but can reduce and broadcast."""
        where = f"a mixed group of {self.describe()}"
        if redop is not None and redop not in _REDUCE:
            raise UnsupportedCollective(op.value, where, f"reduce op {redop} cannot be composed across islands "
                                        "(sum, avg, max, min and product can)")
        parts = HIERARCHICAL.get(op, ())
        why = self._refusal(parts[:2], dtype, redop)
        if why is not None and op is C.ALL_REDUCE and self._refusal(parts[2:], dtype, redop) is None:
            self.leaders_only.add((dtype, redop))
            return
        if why is not None:
            raise UnsupportedCollective(op.value, where, why)

    def compose(self, op: Collective, dtype: torch.dtype | None, reduce_op: Any) -> Callable[..., Any]:
        """The kernel for ``op`` on this group: called as ``kernel(*kernel_args, async_op)`` by dispatch."""
        redop = None if reduce_op is None else reduce_op_name(reduce_op)
        self._require(op, dtype, redop)
        fn = getattr(self, f"_{op.value}", None)
        if fn is None:
            raise UnsupportedCollective(op.value, "a mixed group", "no composition across islands yet")

        def kernel(*kargs: Any) -> Work:
            fn(*kargs)
            # Complete at once, holding the output (a DDP communication hook reads ``fut.value()[0]``).
            first = kargs[0] if kargs else None
            out = [first] if isinstance(first, torch.Tensor) else list(first) if isinstance(first, list) else []
            return Work(result=[t for t in out if isinstance(t, torch.Tensor)])

        return kernel

    # ----------------------------------------------------------------------------------------- hierarchical
    def _cross(self, group: Any, t: torch.Tensor) -> None:
        self.links.cross += t.numel() * t.element_size()

    def _all_reduce(self, t: torch.Tensor, op: Any, async_op: bool = False) -> None:
        name = reduce_op_name(op)
        red = _REDUCE[name]
        flat = t if t.is_contiguous() else t.contiguous()
        flat = flat.view(-1)
        n, k = flat.numel(), self.k
        if self.equal and k > 1 and n % k == 0 and (t.dtype, name) not in self.leaders_only:
            shard = torch.empty(n // k, dtype=t.dtype, device=t.device)
            self.links.island += flat.numel() * flat.element_size()
            dispatch(S.REDUCE_SCATTER_TENSOR, self.island, False, shard, flat, red)
            h = _host(shard)
            self._cross(self.peers, h)
            self.peers.allreduce([h], _opts(red)).wait()
            _back(shard, h)
            dispatch(S.ALL_GATHER_INTO_TENSOR, self.island, False, flat, shard)
        else:
            if k > 1:
                self.links.island += flat.numel() * flat.element_size()
                dispatch(S.REDUCE, self.island, False, flat, None, red, 0)
            if self.local == 0:
                h = _host(flat)
                self._cross(self.peers, h)
                self.peers.allreduce([h], _opts(red)).wait()
                _back(flat, h)
            if k > 1:
                dispatch(S.BROADCAST, self.island, False, flat, None, 0)
        if name == "avg":
            flat.div_(len(self.members))
        if flat.data_ptr() != t.data_ptr():
            t.copy_(flat.view_as(t))

    def _reduce_scatter_tensor(self, out: torch.Tensor, inp: torch.Tensor, op: Any, async_op: bool = False) -> None:
        name = reduce_op_name(op)
        red = _REDUCE[name]
        n = out.numel()
        chunks = inp.contiguous().view(len(self.members), n)
        if self.equal and self.k > 1:
            # Lay the chunks out island index first: island member l gets, reduced over its island, the chunks of
            # the members with index l in every island; its peers then reduce-scatter those among themselves.
            order = [p[i] for i in range(self.k) for p in self.parts]
            staged = chunks[[self.index[r] for r in order]].reshape(-1)
            block = torch.empty(len(self.parts) * n, dtype=out.dtype, device=out.device)
            self.links.island += staged.numel() * staged.element_size()
            dispatch(S.REDUCE_SCATTER_TENSOR, self.island, False, block, staged, red)
            h = _host(block)
            self._cross(self.peers, h)
            mine = torch.empty(n, dtype=out.dtype)
            self.peers.reduce_scatter([mine], [list(h.view(len(self.parts), n).unbind(0))], _rs_opts(red)).wait()
            out.view(-1).copy_(mine)
        else:
            h = _host(chunks).clone()
            self._cross(self.host, h)
            self.host.allreduce([h], _opts(red)).wait()
            out.view(-1).copy_(h[self._rank()])
        if name == "avg":
            out.div_(len(self.members))

    def _all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False) -> None:
        n = inp.numel()
        rows = out.view(len(self.members), n)
        if self.equal and self.k > 1:
            block = torch.empty(self.k * n, dtype=inp.dtype, device=inp.device)
            self.links.island += inp.numel() * inp.element_size()
            dispatch(S.ALL_GATHER_INTO_TENSOR, self.island, False, block, inp.contiguous().view(-1))
            h = _host(block)
            gathered = torch.empty(len(self.parts) * self.k * n, dtype=inp.dtype)
            self._cross(self.peers, h)
            self.peers._allgather_base(gathered, h).wait()
            g = gathered.view(len(self.parts), self.k, n)
            for j, part in enumerate(self.parts):
                for i, r in enumerate(part):
                    rows[self.index[r]].copy_(g[j, i])
        else:
            h = _host(inp.contiguous().view(-1))
            got = torch.empty(len(self.members) * n, dtype=inp.dtype)
            self._cross(self.host, h)
            self.host._allgather_base(got, h).wait()
            rows.copy_(got.view(len(self.members), n))

    def _broadcast(self, t: torch.Tensor, root: int, async_op: bool = False) -> None:
        src = self.members[root]
        home = next(j for j, p in enumerate(self.parts) if src in p)
        flat = t if t.is_contiguous() else t.contiguous()
        if self.mine == home and self.k > 1:
            dispatch(S.BROADCAST, self.island, False, flat, None, self.parts[home].index(src))
        if self.local == 0:
            h = _host(flat)
            self._cross(self.peers, h)
            self.peers.broadcast([h], _root(home)).wait()
            _back(flat, h)
        if self.mine != home and self.k > 1:
            dispatch(S.BROADCAST, self.island, False, flat, None, 0)
        if flat.data_ptr() != t.data_ptr():
            t.copy_(flat)

    # ------------------------------------------------------------------------------------------ host-staged
    def _rank(self) -> int:
        return self.host.rank()  # type: ignore[no-any-return]

    def _staged(self, tensors: Sequence[torch.Tensor], call: Callable[[list[torch.Tensor]], Any],
                written: Sequence[torch.Tensor] = ()) -> None:
        """Run ``call`` on host copies of ``tensors`` (the tensors themselves on CPU), then copy back those in
        ``written``."""
        hs = [_host(t) for t in tensors]
        for h in hs:
            self.links.cross += h.numel() * h.element_size()
        call(hs).wait()
        for t, h in zip(tensors, hs, strict=True):
            if any(t is w for w in written):
                _back(t, h)

    def _all_reduce_coalesced(self, ts: list[torch.Tensor], op: Any, async_op: bool = False) -> None:
        for t in ts:
            self._all_reduce(t, op)

    def _all_gather(self, outs: list[torch.Tensor], inp: torch.Tensor, async_op: bool = False) -> None:
        self._staged([inp, *outs], lambda h: self.host.allgather([h[1:]], [h[0]]), outs)

    def _all_gather_coalesced(self, outs: list[list[torch.Tensor]], inps: list[torch.Tensor],
                              async_op: bool = False) -> None:
        for o, i in zip(outs, inps, strict=True):
            self._all_gather(o, i)

    def _reduce_scatter(self, out: torch.Tensor, inps: list[torch.Tensor], op: Any, async_op: bool = False) -> None:
        self._reduce_scatter_tensor(out, torch.stack([i.reshape(-1) for i in inps]), op)

    def _all_to_all(self, outs: list[torch.Tensor], inps: list[torch.Tensor], async_op: bool = False) -> None:
        n = len(outs)
        self._staged([*outs, *inps], lambda h: self.host.alltoall(h[:n], h[n:]), outs)

    def _all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, osz: Any = None, isz: Any = None,
                           async_op: bool = False) -> None:
        self._staged([out, inp], lambda h: self.host.alltoall_base(h[0], h[1], list(osz or []), list(isz or [])),
                     [out])

    _all_to_all_single_uneven = _all_to_all_single

    def _reduce(self, t: torch.Tensor, root: int, op: Any, async_op: bool = False) -> None:
        keep = t.clone()
        self._all_reduce(t, op)
        if self._rank() != root:
            t.copy_(keep)

    def _gather(self, t: torch.Tensor, lst: Any, root: int, async_op: bool = False) -> None:
        outs = [torch.empty_like(t) for _ in self.members]
        self._all_gather(outs, t)
        if self._rank() == root and lst is not None:
            for o, g in zip(lst, outs, strict=True):
                o.copy_(g)

    def _scatter(self, t: torch.Tensor, lst: Any, root: int, async_op: bool = False) -> None:
        stacked = torch.stack(list(lst)) if self._rank() == root else torch.empty((len(self.members), *t.shape),
                                                                                 dtype=t.dtype, device=t.device)
        self._broadcast(stacked, root)
        t.copy_(stacked[self._rank()])

    def _barrier(self, async_op: bool = False) -> None:
        self.host.barrier().wait()

    def _send(self, t: torch.Tensor, dst: int, tag: int, async_op: bool = False) -> None:
        self._staged([t.contiguous()], lambda h: self.host.send(h, dst, tag))

    def _recv(self, t: torch.Tensor, src: int, tag: int, async_op: bool = False) -> None:
        self._staged([t], lambda h: self.host.recv(h, src, tag), [t])

    def _recv_any_source(self, t: torch.Tensor, src: Any, tag: int, async_op: bool = False) -> None:
        self._staged([t], lambda h: self.host.recv_anysource(h, tag), [t])


def _opts(op: Any) -> Any:
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def _rs_opts(op: Any) -> Any:
    o = dist.ReduceScatterOptions()
    o.reduceOp = op
    return o


def _root(root: int) -> Any:
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o

