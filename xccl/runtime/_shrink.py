"""Surviving a lost rank in place: ``torch.distributed.shrink_group`` on xccl's groups, on every vendor.

torch 2.13's ``shrink_group`` asks the group's device backend to shrink (NCCL's ``ncclCommShrink``) and wraps the
result in a plain ``ProcessGroup`` (``distributed_c10d.py``: ``_create_shrunk_process_group``): HCCL and SCCL have
no shrink, and a plain group would take the world out from under xccl. So :func:`shrink_group` is where torch's is
once a program uses xccl's backend (``_torch_api``): torch's own for any other group; for xccl's, the survivors
rebuild the vendor's communicator (the world, or a sub-group among its survivors). docs/elastic.md says how, and
what a survivor must do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any, Final

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import PrefixStore

from ..collectives._flight import mark
from ..collectives._groups import close_all, state_of
from ..collectives._health._facts import Facts
from ..collectives._health._liveness import Liveness
from ..collectives._health._sentinel import start as start_sentinel
from ..collectives._mixed import MixedProcessGroup
from ..collectives._process_group import XcclProcessGroup
from ..collectives._state import GROUPS, PROCESS
from ..errors import InitError, RendezvousTimeout, UnsupportedCollective, XcclError
from ..ops._torch import SHRINK_GROUP, TORCH
from ._env import rendezvous_error, setup_timeout_of
from ._torch_own import OWN
from ._vendor import connect_world, group_options

__all__ = ["shrink_group"]

LOG = logging.getLogger("xccl")
#: The store prefix under which the survivors of a shrink meet (below the old world's own prefix).
_PREFIX: Final = "xccl.shrink"


def shrink_group(ranks_to_exclude: list[int], group: Any = None, shrink_flags: int = 0,
                 pg_options: Any | None = None) -> Any:
    """``torch.distributed.shrink_group``, for xccl's groups too: a new group of the survivors.

    Args:
        ranks_to_exclude: the ranks of ``group`` to leave out (for the world: global ranks), typically
            ``err.ranks`` of the :class:`~xccl.PeerFailure` every survivor got.
        group: the group to shrink (None: the world, which the result replaces).
        shrink_flags: ``SHRINK_DEFAULT`` (0), or ``SHRINK_ABORT`` (``torch.distributed.distributed_c10d``): torch's
            abort of the old group's backends in place of an orderly destroy (only NCCL's aborts anything; on
            gloo and HCCL it drops torch's records, docs/elastic.md).
        pg_options: the vendor's options for the new group (default: the plugin's, for the survivors).

    Returns:
        The new group. For the world, it is the new world: ``dist.get_rank()``, ``dist.get_world_size()`` and
        ``xccl.get_world()`` describe it, and every other group is gone.

    Raises:
        UnsupportedTorch: torch is older than 2.10, which has no shrink_group and none of the checks it runs.
        UnsupportedCollective: the vendor cannot shrink a world in place (``VendorRuntime.no_shrink``: SCCL).
        TypeError, ValueError, RuntimeError: torch's own, for bad arguments (an empty list, a rank out of range or
            twice, excluding this rank or every rank).
        InitError: a mixed-vendor group (not supported), or xccl's state is gone (after ``xccl.shutdown``).
        RendezvousTimeout: a survivor did not come within the setup timeout (``XCCL_SETUP_TIMEOUT``, else the
            group's timeout but at least 300 s; the message says what the others asked for: survivors that disagree
            on the ranks to exclude never meet).

    Example::

        try:
            loss = train_step(model, batch)
        except xccl.PeerFailure as err:
            dist.shrink_group(list(err.ranks))      # every survivor, with the same ranks
            model = DDP(module)                     # on the new world
    """
    TORCH.require(SHRINK_GROUP)
    target = group if group is not None else c10d._get_default_group()
    if not isinstance(target, XcclProcessGroup):
        return OWN["shrink_group"](ranks_to_exclude, group, shrink_flags, pg_options)
    c10d._validate_shrink_inputs(ranks_to_exclude, shrink_flags)
    info = c10d._prepare_shrink_target_group(group)
    excluded = sorted(c10d._validate_and_process_excluded_ranks(ranks_to_exclude, info))
    if isinstance(target, MixedProcessGroup):
        raise InitError("shrinking a group that spans the islands of a mixed-vendor world is not supported: restart "
                        "the job on the surviving hosts (docs/elastic.md)")
    runtime = PROCESS.runtime
    if runtime is None or PROCESS.world is None:
        raise InitError("xccl's state of this group is gone (xccl.shutdown was called): nothing to shrink")
    why = runtime.plugin.vendor_runtime().no_shrink
    if why:
        raise UnsupportedCollective("shrink_group", runtime.plugin.name, f"{why}. Nothing was torn down: restart the "
                                    "job and resume from the last checkpoint (torchrun --max-restarts; docs/elastic.md)")
    if info["is_default_group"]:
        return _shrink_world(target, excluded, shrink_flags, pg_options)
    return _shrink_subgroup(target, excluded, shrink_flags, pg_options)


def _shrink_world(old: XcclProcessGroup, excluded: Sequence[int], flags: int, pg_options: Any) -> Any:
    t0 = time.monotonic()
    runtime, world = PROCESS.runtime, PROCESS.world
    assert runtime is not None and world is not None  # checked by the caller
    size, rank = old.size(), old.rank()
    kept = [r for r in range(size) if r not in excluded]
    new_rank, new_size = kept.index(rank), len(kept)
    base, timeout, name = old.store, old.timeout, str(dist.get_backend(old))
    others = [c10d._get_process_group_name(pg) for pg in c10d._world.pg_names if pg is not old]
    if others:
        LOG.warning("xccl: shrinking the world destroys its %d other groups (%s): their ranks are renumbered; "
                    "create them again on the new world", len(others), ", ".join(others))
    # The survivors meet under a prefix that names them: ranks that disagree on who is lost never meet.
    prefix = f"{_PREFIX}/{size}:{','.join(map(str, kept))}"
    with contextlib.suppress(RuntimeError):  # what this rank asked for, for a survivor that times out to say
        base.set(f"{_PREFIX}/{size}/asked/{rank}", ",".join(map(str, kept)))
    live = PROCESS.liveness
    laps = [("", time.monotonic())]  # (the step done, when): what each step took goes into the recorder's mark
    if isinstance(live, Liveness):
        # The old world's neighbours, first: a look of the sentinel's under way ends (and stops the device, if it
        # does) before the device is stopped and restarted for the new world, not after.
        live.leave()
    _free_device(runtime)
    _teardown_old(flags)
    laps.append(("old world destroyed", time.monotonic()))
    runtime.world_shrunk(kept)
    if isinstance(live, Liveness):
        live = _carry_liveness(live, kept, size, rank, new_rank)
    laps.append(("placement and liveness", time.monotonic()))
    kwargs = {"pg_options": pg_options} if pg_options is not None else group_options(runtime, None)
    store = PrefixStore(prefix, base)
    started = time.monotonic()
    try:
        # Survivors learn of the loss up to a collective timeout apart (a rank not talking to the lost one waits
        # it out), and the vendor's group connects within the group's timeout: meet first, within the setup
        # timeout, as xccl.init's rendezvous does.
        _meet(store, new_size, setup_timeout_of(None, timeout))
        laps.append(("survivors met", time.monotonic()))
        dist.init_process_group(backend=name, store=store, rank=new_rank, world_size=new_size, timeout=timeout,
                                **kwargs)
    except Exception as exc:
        if isinstance(exc, XcclError):
            raise
        raise _not_met(exc, base, size, rank, kept, time.monotonic() - started) from exc
    PROCESS.liveness = live
    start_sentinel(live, new_size)
    PROCESS.world = dataclasses.replace(world, rank=new_rank, world_size=new_size)
    st = GROUPS.default = state_of(dist.group.WORLD)
    laps.append(("new world", time.monotonic()))
    connect_world()
    laps.append(("connected", time.monotonic()))
    spent = ", ".join(f"{k} {t - before:.2f} s" for (_, before), (k, t) in itertools.pairwise(laps))
    mark(st, "shrink_group", f"world {size} -> {new_size} ranks: excluded {list(excluded)}; this rank {rank} -> "
                             f"{new_rank}; took {time.monotonic() - t0:.2f} s ({spent})")
    return dist.group.WORLD


def _meet(store: Any, size: int, timeout: _dt.timedelta) -> None:
    """Wait until ``size`` ranks have arrived under ``store`` (one add each; the last one sets the mark)."""
    if store.add("arrived", 1) == size:
        store.set("all", "1")
    store.wait(["all"], timeout)


def _free_device(runtime: Any) -> None:
    """Abort what the device holds (a collective stuck on the lost rank: a vendor's teardown that synchronises its
    streams would wait for it until the vendor's execution timeout), then let it take the new world's work."""
    if runtime.stop_device():
        runtime.restart_device()


def _teardown_old(flags: int) -> None:
    """Destroy the old world and every group made from it, xccl's state of them first (their scratch buffers)."""
    close_all()
    if flags & c10d.SHRINK_ABORT:
        # torch's own abort: every backend of every group, without communicating (what is in flight fails).
        c10d._abort_process_group()
    else:
        dist.destroy_process_group()
    # What the failed step left in reference cycles (a dropped DDP, whose reducer, stuck mid-iteration, keeps
    # hooks on the parameters that would fire again in the next backward) goes now, not at some later collection.
    gc.collect()


def _carry_liveness(live: Liveness, kept: Sequence[int], size: int, rank: int, new_rank: int) -> Liveness:
    """This rank's liveness port under its new rank: its Facts published again under the new world's prefix, so
    that a rank lost after the shrink is named by its new rank. The store's host and its ranks carry over."""
    renumber = {old: new for new, old in enumerate(kept)}
    new_size = len(kept)
    prefix = f"{live.prefix}/{_PREFIX}/{size}:{','.join(map(str, kept))}"
    try:
        raw = dist.TCPStore(live.store[0], live.store[1], is_master=False, wait_for_workers=False)
        mine = Facts.decode(PrefixStore(live.prefix, raw).get(f"rank/{rank}"))
        if mine is not None:
            PrefixStore(prefix, raw).set(f"rank/{new_rank}",
                                         dataclasses.replace(mine, rank=new_rank, world_size=new_size).encode())
    except RuntimeError as exc:  # the store is gone: the new world cannot be made either, which says so
        LOG.debug("xccl: liveness facts not carried over: %s", exc)
    peers = [dataclasses.replace(f, rank=renumber[r], world_size=new_size)
             for r, f in live.store_peers.items() if r in renumber]
    return Liveness(live.sock, new_rank, live.store, prefix, live.hosted_by, peers, live.wait)


def _not_met(exc: Exception, base: Any, size: int, rank: int, kept: Sequence[int], elapsed: float) -> XcclError:
    """The typed error for survivors that did not all meet: what each rank asked for, where the store knows."""
    error = rendezvous_error(exc, kept.index(rank), len(kept), elapsed)
    if not isinstance(error, RendezvousTimeout):
        return error
    asked = {}
    for r in kept:
        with contextlib.suppress(RuntimeError):
            if base.check([f"{_PREFIX}/{size}/asked/{r}"]):
                asked[r] = base.get(f"{_PREFIX}/{size}/asked/{r}").decode()
    mine = ",".join(map(str, kept))
    differ = {r: a for r, a in asked.items() if a != mine}
    silent = [r for r in kept if r not in asked]
    said = []
    if differ:
        said.append("; ".join(f"rank {r} keeps [{a}]" for r, a in sorted(differ.items())))
    if silent:
        said.append(f"ranks {silent} never asked (lost too, or not calling shrink_group)")
    return RendezvousTimeout(
        f"shrinking the world of {size} to ranks [{mine}] (old numbering): not every survivor came. "
        + ("; ".join(said) or "every survivor asked for the same ranks; one may have died since")
        + ". Call dist.shrink_group with err.ranks of the PeerFailure, on every survivor",
        rank=rank, world_size=size, elapsed=elapsed)


def _shrink_subgroup(old: XcclProcessGroup, excluded: Sequence[int], flags: int, pg_options: Any) -> Any:
    members = dist.get_process_group_ranks(old)
    kept = [g for i, g in enumerate(members) if i not in excluded]
    _free_device(PROCESS.runtime)
    if flags & c10d.SHRINK_ABORT:
        with contextlib.suppress(RuntimeError, AttributeError):
            old.native.abort()
    new = dist.new_group(kept, timeout=old.timeout, pg_options=pg_options, use_local_synchronization=True)
    dist.destroy_process_group(old)
    mark(state_of(new), "shrink_group", f"group of {len(members)} -> {len(kept)} ranks: excluded group ranks "
                                        f"{list(excluded)}")
    return new
