"""torchft's reconfigurable process group over xccl's: the replica groups of a fault-tolerant job on any vendor.

torchft (meta-pytorch/torchft) ships its reconfigurable process group for gloo, NCCL and Intel's XCCL only;
:class:`ProcessGroupXccl` is the same over xccl's group, so the replica dimension runs on HCCL, SCCL, gloo or NCCL
through xccl's dispatch. Usage, and what happens when a replica group dies: docs/elastic.md ("Replica groups that
come and go: torchft").

Each :meth:`~ProcessGroupXccl.configure` builds a new group of xccl's backend over torchft's store for the quorum
(:func:`replica_group`, with the vendor's options for torchft's global ranks) and drops the previous one; the group
joins no torch world. A fault is *reported*, not raised, as torchft's ``ProcessGroupNCCL`` reports its own: the
failed handle completes, :meth:`~ProcessGroupXccl.errored` returns the error, ``should_commit`` discards the step,
and the group's next all_reduces are skipped until the next quorum. Raising from ``wait()`` instead (torchft's
``ProcessGroupGloo`` does) ends torchft 0.2.0's DDP comm hook in an ``AssertionError``.

.. note:: ``xccl.init()`` first: the group is of the plugin it selected, and a mixed-vendor world
   (``heterogeneous=True``) has no replica groups here (its islands are per world).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _DistributedBackendOptions
from torch.distributed.distributed_c10d import GroupName

try:
    from torchft.process_group import ProcessGroupWrapper
    from torchft.work import _DummyWork
except ImportError as exc:  # torchft, or the opentelemetry packages it imports at import
    raise ImportError(f"xccl.integrations.torchft needs torchft (pip install torchft==0.2.0): {exc}") from exc

from ..collectives import _faults
from ..collectives._backend import _Creator
from ..collectives._groups import forget, register
from ..collectives._process_group import XcclProcessGroup, backend_name
from ..collectives._state import PROCESS
from ..errors import InitError

__all__ = ["ProcessGroupXccl", "replica_group"]


def replica_group(store: Any, rank: int, world_size: int, *, timeout: _dt.timedelta,
                  global_ranks: list[int] | None = None, name: str | None = None) -> XcclProcessGroup:
    """A group of xccl's backend over ``store``, outside torch's world: what torchft's ``configure`` builds.

    Args:
        store: the group's store (torchft's prefix store of the quorum); every member passes the same one.
        rank: this process's rank in the group.
        world_size: the group's size.
        timeout: the group's collective timeout (the vendor's watchdog policy applies, as to every xccl group).
        global_ranks: the members' ranks across the job, in group order (torchft's ``global_ranks``); the plugin's
            options for the group are for these ranks (Sophgo: their chips). Default ``range(world_size)``.
        name: the group's name (its flight-recorder and error messages say it). Default ``torchft:<size>``.

    Raises:
        InitError: ``xccl.init()`` has not run in this process, or its world is mixed-vendor.
    """
    runtime = PROCESS.runtime
    if runtime is None or PROCESS.job is None:
        raise InitError("ProcessGroupXccl needs the plugin xccl.init() selects: call xccl.init() in every process "
                        "of the replica group before torchft's Manager configures its process group")
    if PROCESS.world_map is not None:
        raise InitError("ProcessGroupXccl does not span a mixed-vendor world's islands: torchft's replica groups "
                        "must be of one vendor (xccl.init without heterogeneous=True)")
    members = list(range(world_size)) if not global_ranks else list(global_ranks)
    options = _DistributedBackendOptions()
    options.store, options.group_rank, options.group_size, options.timeout = store, rank, world_size, timeout
    options.group_id = name or f"torchft:{world_size}"
    options.global_ranks_in_group = members
    pg = _Creator(backend_name(runtime))(options, runtime.process_group_options(members))
    pg._set_group_name(GroupName(options.group_id))
    register(pg, runtime, ranks=tuple(members), name=options.group_id)
    return pg


class ProcessGroupXccl(ProcessGroupWrapper):  # type: ignore[misc]  # torchft ships no type information
    """torchft's reconfigurable process group over xccl's group of the plugin ``xccl.init()`` selected.

    Args:
        timeout: the group's collective timeout, and torchft's for connecting to the quorum's store.
    """

    def __init__(self, timeout: _dt.timedelta = _dt.timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Exception | None = None

    def errored(self) -> Exception | None:
        """The first fault of the current group's collectives (None: none), which torchft's ``should_commit``
        reports; cleared when the next quorum reconfigures the group."""
        return self._errored

    def report(self, exc: Exception) -> None:
        """Record a collective's fault (the first one stays)."""
        if self._errored is None:
            self._errored = exc

    def allreduce(self, tensors: list[torch.Tensor], opts: object) -> Any:
        """torchft's all_reduce (the Manager's, and so its DDP's), skipped once the group has failed."""
        if self._errored is not None:
            return _DummyWork(tensors)
        return super().allreduce(tensors, opts)

    def _wrap_work(self, work: Any, opts: object) -> Any:
        if work is None or isinstance(work, _DummyWork):
            return work
        _faults.handled_by_caller(work)
        return _ReportedWork(self, work)

    def _create_pg(self, store: Any, rank: int, world_size: int) -> dist.ProcessGroup:
        """The group of the new quorum (torchft's ``configure`` calls this after dropping the previous one)."""
        self._errored = None
        name = f"torchft:quorum{self._quorum_id}:rank{self._group_rank}" if self._quorum_id is not None else None
        return replica_group(store, rank, world_size, timeout=self._timeout, global_ranks=self._global_ranks,
                             name=name)

    def abort(self, errored: bool = True) -> None:
        """Drop the current group: xccl's state of it first (its scratch buffers, its observers), then torchft's
        abort, which aborts the vendor's group."""
        pg = self._pg
        if isinstance(pg, XcclProcessGroup):
            forget(pg)
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Drop the current group without aborting it (torchft's shutdown)."""
        pg = self._pg
        if isinstance(pg, XcclProcessGroup):
            forget(pg)
        super().shutdown()

    def getBackendName(self) -> str:  # camelCase: torch's name
        """``torchft-xccl_<vendor backend>`` (``torchft-xccl_hccl``): torchft's own groups are ``torchft-<backend>``
        and its ``torchft-xccl`` is Intel's XCCL."""
        runtime = PROCESS.runtime
        return f"torchft-{backend_name(runtime)}" if runtime is not None else "torchft-xccl_"


class _ReportedWork(dist.Work):
    """A collective's handle whose fault goes to :meth:`ProcessGroupXccl.report` instead of its waiter: ``wait()``
    returns, and a failed future completes with None (the Manager's own callbacks hold the tensors)."""

    def __init__(self, pg: ProcessGroupXccl, work: Any) -> None:
        super().__init__()
        self._pg = pg
        self._work = work
        self._failed = False

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        if self._failed:  # reported once (xccl's flight recorder dumps once per fault)
            return True
        try:
            self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as exc:  # xccl's typed fault (or the backend's own): torchft discards the step
            self._failed = True
            self._pg.report(exc)
        return True

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def get_future(self) -> torch.futures.Future[Any]:
        def value(fut: torch.futures.Future[Any]) -> Any:
            try:
                return fut.value()
            except Exception:
                self.wait()  # the typed fault, reported (the work has finished: at once), unless wait() was first
                return None

        fut: torch.futures.Future[Any] = self._work.get_future()
        return fut.then(value)
