"""The compositions of a group spanning islands (``_mixed``): hierarchical through the island, or staged on the host.

Each composition is ``fn(group_state, *kernel_args)`` and runs on the mixed group's own thread: its island part
through the island's vendor state (``MixedGroup.island_call``: validated, planned and observed as any call there),
its cross-island part over the host gloo groups of the group's :class:`~._mixed.Islands`. :func:`mixed_table` says
how each op runs on such a group (``xccl caps --group``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist

from ..ops import _specs as S
from ..plugin._capabilities import CapabilityTable, Collective, Level, reduce_op_name

if TYPE_CHECKING:
    from ._mixed import MixedGroup

__all__ = ["COMPOSITIONS", "HIERARCHICAL", "HOST_STAGED", "REDUCE", "LinkBytes", "host_of", "mixed_table"]

C = Collective
_SUM: Final = dist.ReduceOp.SUM
#: The reduce ops a composition can carry (AVG as SUM, divided at the end).
REDUCE: Final = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
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


def host_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory (the tensor itself on CPU: no copy in simulation)."""
    return t if t.is_cpu else t.cpu()


def _back(dst: torch.Tensor, h: torch.Tensor) -> None:
    if h is not dst:
        dst.copy_(h)


# ----------------------------------------------------------------------------------------------- compositions


def _cross(g: MixedGroup, t: torch.Tensor) -> None:
    g.islands.links.cross += t.numel() * t.element_size()


def _hier_all_reduce(g: MixedGroup, t: torch.Tensor, op: Any) -> None:
    x = g.islands
    name = reduce_op_name(op)
    red = REDUCE[name]
    flat = t if t.is_contiguous() else t.contiguous()
    flat = flat.view(-1)
    n, k = flat.numel(), x.k
    if x.equal and k > 1 and n % k == 0 and (t.dtype, name) not in g.leaders_only:
        shard = torch.empty(n // k, dtype=t.dtype, device=t.device)
        x.links.island += flat.numel() * flat.element_size()
        g.island_call(S.REDUCE_SCATTER_TENSOR, shard, flat, red)
        h = host_of(shard)
        _cross(g, h)
        x.peers.allreduce([h], _opts(red)).wait()
        _back(shard, h)
        g.island_call(S.ALL_GATHER_INTO_TENSOR, flat, shard)
    else:
        if k > 1:
            x.links.island += flat.numel() * flat.element_size()
            g.island_call(S.REDUCE, flat, None, red, 0)
        if x.local == 0:
            h = host_of(flat)
            _cross(g, h)
            x.peers.allreduce([h], _opts(red)).wait()
            _back(flat, h)
        if k > 1:
            g.island_call(S.BROADCAST, flat, None, 0)
    if name == "avg":
        flat.div_(len(x.members))
    if flat.data_ptr() != t.data_ptr():
        t.copy_(flat.view_as(t))


def _hier_reduce_scatter(g: MixedGroup, out: torch.Tensor, inp: torch.Tensor, op: Any) -> None:
    x = g.islands
    name = reduce_op_name(op)
    red = REDUCE[name]
    n = out.numel()
    chunks = inp.contiguous().view(len(x.members), n)
    if x.equal and x.k > 1:
        # Lay the chunks out island index first: island member l gets, reduced over its island, the chunks of
        # the members with index l in every island; its peers then reduce-scatter those among themselves.
        order = [p[i] for i in range(x.k) for p in x.parts]
        staged = chunks[[x.index[r] for r in order]].reshape(-1)
        block = torch.empty(len(x.parts) * n, dtype=out.dtype, device=out.device)
        x.links.island += staged.numel() * staged.element_size()
        g.island_call(S.REDUCE_SCATTER_TENSOR, block, staged, red)
        h = host_of(block)
        _cross(g, h)
        mine = torch.empty(n, dtype=out.dtype)
        x.peers.reduce_scatter([mine], [list(h.view(len(x.parts), n).unbind(0))], _rs_opts(red)).wait()
        out.view(-1).copy_(mine)
    else:
        h = host_of(chunks).clone()
        _cross(g, h)
        x.host.allreduce([h], _opts(red)).wait()
        out.view(-1).copy_(h[x.host.rank()])
    if name == "avg":
        out.div_(len(x.members))


def _hier_all_gather(g: MixedGroup, out: torch.Tensor, inp: torch.Tensor) -> None:
    x = g.islands
    n = inp.numel()
    rows = out.view(len(x.members), n)
    if x.equal and x.k > 1:
        block = torch.empty(x.k * n, dtype=inp.dtype, device=inp.device)
        x.links.island += inp.numel() * inp.element_size()
        g.island_call(S.ALL_GATHER_INTO_TENSOR, block, inp.contiguous().view(-1))
        h = host_of(block)
        gathered = torch.empty(len(x.parts) * x.k * n, dtype=inp.dtype)
        _cross(g, h)
        x.peers._allgather_base(gathered, h).wait()
        view = gathered.view(len(x.parts), x.k, n)
        for j, part in enumerate(x.parts):
            for i, r in enumerate(part):
                rows[x.index[r]].copy_(view[j, i])
    else:
        h = host_of(inp.contiguous().view(-1))
        got = torch.empty(len(x.members) * n, dtype=inp.dtype)
        _cross(g, h)
        x.host._allgather_base(got, h).wait()
        rows.copy_(got.view(len(x.members), n))


def _hier_broadcast(g: MixedGroup, t: torch.Tensor, root: int) -> None:
    x = g.islands
    src = x.members[root]
    home = next(j for j, p in enumerate(x.parts) if src in p)
    flat = t if t.is_contiguous() else t.contiguous()
    if x.mine == home and x.k > 1:
        g.island_call(S.BROADCAST, flat, None, x.parts[home].index(src))
    if x.local == 0:
        h = host_of(flat)
        _cross(g, h)
        x.peers.broadcast([h], _root(home)).wait()
        _back(flat, h)
    if x.mine != home and x.k > 1:
        g.island_call(S.BROADCAST, flat, None, 0)
    if flat.data_ptr() != t.data_ptr():
        t.copy_(flat)


def _staged(g: MixedGroup, tensors: Sequence[torch.Tensor], call: Callable[[list[torch.Tensor]], Any],
            written: Sequence[torch.Tensor] = ()) -> None:
    """Run ``call`` on host copies of ``tensors`` (the tensors themselves on CPU), then copy back those in
    ``written``."""
    hs = [host_of(t) for t in tensors]
    for h in hs:
        g.islands.links.cross += h.numel() * h.element_size()
    call(hs).wait()
    for t, h in zip(tensors, hs, strict=True):
        if any(t is w for w in written):
            _back(t, h)


def _host_all_reduce_coalesced(g: MixedGroup, ts: list[torch.Tensor], op: Any) -> None:
    for t in ts:
        _hier_all_reduce(g, t, op)


def _host_all_gather(g: MixedGroup, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
    _staged(g, [inp, *outs], lambda h: g.islands.host.allgather([h[1:]], [h[0]]), outs)


def _host_all_gather_coalesced(g: MixedGroup, outs: list[list[torch.Tensor]], inps: list[torch.Tensor]) -> None:
    for o, i in zip(outs, inps, strict=True):
        _host_all_gather(g, o, i)


def _host_reduce_scatter(g: MixedGroup, out: torch.Tensor, inps: list[torch.Tensor], op: Any) -> None:
    _hier_reduce_scatter(g, out, torch.stack([i.reshape(-1) for i in inps]), op)


def _host_all_to_all(g: MixedGroup, outs: list[torch.Tensor], inps: list[torch.Tensor]) -> None:
    """One all_to_all_single with split sizes over the concatenated tensors: gloo's list form needs tensors of one
    size, and torch's gloo has none before 2.12."""
    out = torch.empty(sum(t.numel() for t in outs), dtype=inps[0].dtype, device=inps[0].device)
    _host_all_to_all_single(g, out, torch.cat([t.reshape(-1) for t in inps]), [t.numel() for t in outs],
                            [t.numel() for t in inps])
    for t, part in zip(outs, torch.split(out, [t.numel() for t in outs]), strict=True):
        t.copy_(part.view(t.shape))


def _host_all_to_all_single(g: MixedGroup, out: torch.Tensor, inp: torch.Tensor, osz: Any = None,
                            isz: Any = None) -> None:
    _staged(g, [out, inp],
            lambda h: g.islands.host.alltoall_base(h[0], h[1], list(osz or []), list(isz or [])), [out])


def _host_reduce(g: MixedGroup, t: torch.Tensor, root: int, op: Any) -> None:
    keep = t.clone()
    _hier_all_reduce(g, t, op)
    if g.islands.host.rank() != root:
        t.copy_(keep)


def _host_gather(g: MixedGroup, t: torch.Tensor, lst: Any, root: int) -> None:
    if g.islands.gather_replaced:
        _root_sizes_first(g, lst, root)
    outs = [torch.empty_like(t) for _ in g.islands.members]
    _host_all_gather(g, outs, t)
    if g.islands.host.rank() == root and lst is not None:
        for o, got in zip(lst, outs, strict=True):
            o.copy_(got)


def _root_sizes_first(g: MixedGroup, lst: Any, root: int) -> None:
    """What an island whose SDK replaces ``dist.gather`` sends before its all_gather: torch_npu's ``_gather``
    broadcasts the root's ``gather_list`` sizes with ``broadcast_object_list`` (a broadcast of the pickled sizes'
    lengths, then one of their bytes, both on this group's broadcast). The other islands' ranks reach this
    composition through the group's gather instead; they take part in the same two broadcasts, so every member makes
    the same calls in the same order."""
    x = g.islands
    if x.host.rank() == root:
        pickled = [pickle.dumps(o.size()) for o in lst]
        lengths = torch.tensor([len(b) for b in pickled], dtype=torch.long)
        data = torch.frombuffer(bytearray(b"".join(pickled)), dtype=torch.uint8)
    else:
        lengths = torch.empty(len(x.members), dtype=torch.long)
    _hier_broadcast(g, lengths, root)
    if x.host.rank() != root:
        data = torch.empty(int(lengths.sum()), dtype=torch.uint8)
    _hier_broadcast(g, data, root)


def _host_scatter(g: MixedGroup, t: torch.Tensor, lst: Any, root: int) -> None:
    x = g.islands
    me = x.host.rank()
    stacked = torch.stack(list(lst)) if me == root else torch.empty((len(x.members), *t.shape), dtype=t.dtype,
                                                                    device=t.device)
    _hier_broadcast(g, stacked, root)
    t.copy_(stacked[me])


def _host_barrier(g: MixedGroup) -> None:
    g.islands.host.barrier().wait()


def _host_send(g: MixedGroup, t: torch.Tensor, dst: int, tag: int) -> None:
    _staged(g, [t.contiguous()], lambda h: g.islands.host.send(h, dst, tag))


def _host_recv(g: MixedGroup, t: torch.Tensor, src: int, tag: int) -> None:
    _staged(g, [t], lambda h: g.islands.host.recv(h, src, tag), [t])


def _host_recv_any_source(g: MixedGroup, t: torch.Tensor, src: Any, tag: int) -> None:
    _staged(g, [t], lambda h: g.islands.host.recv_anysource(h, tag), [t])


#: Each op's composition across islands: ``fn(group_state, *kernel_args)``.
COMPOSITIONS: Final[dict[Collective, Callable[..., None]]] = {
    C.ALL_REDUCE: _hier_all_reduce,
    C.REDUCE_SCATTER_TENSOR: _hier_reduce_scatter,
    C.ALL_GATHER_INTO_TENSOR: _hier_all_gather,
    C.BROADCAST: _hier_broadcast,
    C.ALL_REDUCE_COALESCED: _host_all_reduce_coalesced,
    C.ALL_GATHER: _host_all_gather,
    C.ALL_GATHER_COALESCED: _host_all_gather_coalesced,
    C.REDUCE_SCATTER: _host_reduce_scatter,
    C.ALL_TO_ALL: _host_all_to_all,
    C.ALL_TO_ALL_SINGLE: _host_all_to_all_single,
    C.ALL_TO_ALL_SINGLE_UNEVEN: _host_all_to_all_single,
    C.REDUCE: _host_reduce,
    C.GATHER: _host_gather,
    C.SCATTER: _host_scatter,
    C.BARRIER: _host_barrier,
    C.SEND: _host_send,
    C.RECV: _host_recv,
    C.RECV_ANY_SOURCE: _host_recv_any_source,
}


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

