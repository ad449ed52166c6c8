"""The plugin contract.

A plugin is a separate distribution that declares one entry point in the ``xccl.plugins`` namespace. The entry
point's target is a :class:`Plugin` instance (or a zero-argument callable returning one) in a module that imports
no vendor SDK: identity, a cheap :meth:`Plugin.probe`, and the capability table, all data. Everything heavy lives
behind :meth:`Plugin.runtime`, which is only called once the plugin is selected, and may import the SDK there: a
:class:`Runtime` whose defaults are plain ``torch.distributed``, so a vendor overrides only what differs.

Plugins never monkeypatch xccl: where a plugin needs a hook, the hook is a method here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, final

import torch
import torch.distributed as dist

from ..errors import InitError
from ._capabilities import CapabilityTable, Collective
from ._cost import CostModel
from ._fake_world import transport
from ._job import Job
from ._ranktable import RankTableFormat
from ._vendor_runtime import PLAIN, VendorRuntime

if TYPE_CHECKING:
    from ._sim import SimProfile

__all__ = ["PLUGIN_API_VERSION", "Plugin", "ProbeResult", "Runtime"]

#: The version of this contract. A plugin states the one it targets in ``Plugin.api_version``; a plugin built for
#: another version is listed as incompatible rather than loaded.
PLUGIN_API_VERSION: Final = 1


@final
@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Whether a plugin can run on this machine, and if not why and how to fix it."""

    #: True when the SDK and devices are present.
    available: bool
    #: Why not, when unavailable (one sentence).
    reason: str = ""
    #: What to do about it (a command, an env var, a package).
    fix: str = ""
    #: What the probe found, for ``xccl doctor`` (versions, device counts, paths).
    facts: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def ok(cls, **facts: str) -> ProbeResult:
        """An available result carrying what was found."""
        return cls(True, facts=facts)

    @classmethod
    def unavailable(cls, reason: str, fix: str = "", **facts: str) -> ProbeResult:
        """An unavailable result: the reason and the fix."""
        return cls(False, reason, fix, facts)


class Plugin:
    """Identity, probe and capability table of one backend. Cheap: no SDK import anywhere in this class.

    Subclasses set the class attributes and override :meth:`capabilities`, and usually :meth:`probe` and
    :meth:`runtime`.
    """

    #: Entry-point name, e.g. ``"sophgo"``.
    name: ClassVar[str] = ""
    #: Human-readable vendor, e.g. ``"Sophgo"``.
    vendor: ClassVar[str] = ""
    #: torch device type of its tensors: ``"cpu"``, ``"cuda"``, ``"npu"``, ``"tpu"``.
    device_type: ClassVar[str] = "cpu"
    #: torch.distributed backend name: ``"gloo"``, ``"nccl"``, ``"hccl"``, ``"sccl"``.
    backend: ClassVar[str] = "gloo"
    #: True for accelerator plugins; auto-detection prefers an available accelerator over the CPU.
    accelerator: ClassVar[bool] = True
    #: Environment variable that restricts which devices a process sees (``"ASCEND_RT_VISIBLE_DEVICES"``), or None
    #: when the vendor has none; ``xccl doctor`` checks it.
    visible_devices_env: ClassVar[str | None] = None
    #: The vendor SDK's distributions (pip names, e.g. ``("torch-npu",)``): ``xccl doctor`` lists each with its
    #: version or "not installed". Read from package metadata; nothing is imported.
    sdk_packages: ClassVar[tuple[str, ...]] = ()
    #: The plugin contract version this plugin was written for.
    api_version: ClassVar[int] = PLUGIN_API_VERSION

    def probe(self) -> ProbeResult:
        """Say whether this plugin can run here. Must be cheap and must not import the vendor SDK."""
        return ProbeResult.ok()

    def capabilities(self) -> CapabilityTable:
        """The capability table (data; built once and cached by the plugin)."""
        raise NotImplementedError(f"plugin {self.name!r} does not define capabilities()")

    def simulation(self) -> SimProfile | None:
        """The profile the CPU simulation enforces, or None when the plugin cannot be simulated."""
        return None

    def vendor_runtime(self) -> VendorRuntime:
        """What the vendor's SDK does at run time (:mod:`xccl.plugin._vendor_runtime`): data, cheap like
        :meth:`capabilities`. Default: plain torch.distributed."""
        return PLAIN

    def runtime(self, *, simulate: bool) -> Runtime:
        """Build the runtime once this plugin is selected; may import the SDK unless ``simulate``."""
        return Runtime(self, simulate=simulate)

    def rank_table_formats(self) -> Sequence[RankTableFormat]:
        """The rank-table formats this vendor uses (``RANK_TABLE_FILE``), for ``xccl rank-table`` and
        ``xccl doctor``. Cheap, like :meth:`probe`: no SDK import."""
        return ()

    def cost_model(self) -> CostModel | None:
        """The vendor's communication cost model, for ``xccl preflight``; None when the plugin publishes none.
        Data, cheap like :meth:`capabilities`."""
        return None

    def cost_models(self) -> Sequence[CostModel]:
        """Every hardware generation's cost model the plugin publishes (Atlas A2 and A3, say), the one
        :meth:`cost_model` returns first; by default just that one, or none."""
        model = self.cost_model()
        return () if model is None else (model,)

    def adaptor_modules(self) -> tuple[str, ...]:
        """Module-name prefixes whose frames are the vendor's, not the user's (its adaptor, which replaces
        torch.distributed functions, and the plugin's stand-ins for it in simulation; ``torch_npu`` covers
        ``torch_npu.distributed.distributed_c10d``): call sites, warnings and ``xccl preflight`` skip them to name
        the user's line. Data, cheap like :meth:`capabilities`. Default: none."""
        return ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Runtime:
    """What a selected plugin does at run time. The defaults are plain ``torch.distributed``.

    Args:
        plugin: the plugin this runtime belongs to.
        simulate: True when running the vendor's code path on CPU over gloo.
    """

    def __init__(self, plugin: Plugin, *, simulate: bool) -> None:
        self.plugin: Final = plugin
        self.simulate: Final = simulate

    @property
    def device_type(self) -> str:
        """Device type of the tensors this runtime takes (``"cpu"`` in simulation)."""
        return "cpu" if self.simulate else self.plugin.device_type

    @property
    def backend(self) -> str:
        """The torch.distributed backend name passed to ``init_process_group``."""
        return self.plugin.backend

    def place(self, job: Job, *, adopted: bool = False) -> torch.device:
        """Choose this process's device for ``job``, make it current (unless ``adopted``) and return it.

        xccl calls this once per world, before the vendor's first group (docs/plugin-guide.md, section 8).
        ``adopted``: the world was created outside xccl, whoever created it chose the device; know the placement
        (for the options of new groups), select nothing. The default calls :meth:`setup_device` (or
        :meth:`adopt_device`) with the local rank; a plugin whose placement depends on the whole job (Sophgo's chip
        map) overrides it.
        """
        return self.adopt_device(job.local_rank) if adopted else self.setup_device(job.local_rank)

    def capabilities(self) -> CapabilityTable:
        """The table dispatch uses: the plugin's (the default), refined by what this runtime found in the installed
        SDK (:meth:`CapabilityTable.with_entries`), e.g. an API one release has and another lacks (torch_npu's
        ``all_to_all_vc``), never by a hidden branch in the plugin's static table. Called once per group; cache it.
        """
        return self.plugin.capabilities()

    def setup_device(self, local_rank: int) -> torch.device:
        """Make ``local_rank``'s device current and return it (what the default :meth:`place` does)."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        getattr(torch, self.device_type).set_device(local_rank)
        return torch.device(self.device_type, local_rank)

    def adopt_device(self, local_rank: int) -> torch.device:
        """The device of a process whose world was created outside xccl: the current one, left as it is (the
        framework that created the world chose it), read instead of :meth:`setup_device`."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, getattr(torch, self.device_type).current_device())

    def create_native_group(self, options: Any, pg_options: Any) -> Any:
        """The vendor's own process group for one group of xccl's process-group backend (``xccl_<backend>``), which
        wraps it and runs the vendor's kernels through its c10d methods. The default builds what
        ``torch.distributed`` would for :attr:`backend`.

        Args:
            options: torch's ``_DistributedBackendOptions`` for the group (store, group rank and size, timeout,
                group id, global ranks).
            pg_options: the group's ``pg_options`` (:meth:`process_group_options` unless the caller passed some).

        Returns:
            A c10d ``Backend`` (``ProcessGroupGloo``, ``ProcessGroupNCCL``, ``ProcessGroupHCCL``) or a
            ``ProcessGroup``.
        """
        return _create_native_group(self.backend, options, pg_options)

    def process_group_options(self, ranks: Sequence[int] | None) -> Any:
        """Options for the process group over ``ranks`` (``None``: the world), or None for the backend default."""
        return None

    def comm_name(self, group: dist.ProcessGroup) -> str:
        """A communicator name for ``group``: stable, the same on every rank, unique per group."""
        return f"{self.backend}:{group.group_name}"

    def connect(self, group: dist.ProcessGroup) -> None:
        """Connect ``group``'s communicator now, where the vendor connects lazily (:class:`~xccl.plugin.LazyConnect`).
        Collective: every member calls it. Default: a one-element all_reduce on the vendor's own group."""
        from ._c10d import c10d_kernel  # plain c10d, so that no detector or dispatch records the call

        kernel = c10d_kernel(Collective.ALL_REDUCE, getattr(group, "native", group))
        if kernel is not None:
            kernel(torch.zeros(1, device=self.device_type), dist.ReduceOp.SUM, False)

    def comm_connected(self, group: dist.ProcessGroup) -> bool | None:
        """Whether ``group``'s communicator is connected yet, where the vendor connects lazily; None when the
        vendor connects at creation or cannot tell without connecting (``xccl.runtime.communicators``). The
        default knows it in simulation (the simulated group connects as the vendor's declaration says)."""
        if not self.simulate:
            return None
        from ._sim import simulated_group_of  # the simulation, imported only when simulating

        found = simulated_group_of(group)
        return None if found is None else found.simulated_runtime.connected

    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        """The vendor's kernels for ops c10d has no method for (uneven collectives, fused ops), or that need a
        check c10d's does not make, by collective; ops without an entry run c10d's method on the vendor's group.

        A kernel is called as :mod:`xccl.plugin._kernels` says. It may raise :class:`~xccl.ConstraintViolation`
        *before* communicating when its documented constraints do not hold; dispatch then applies the fallback
        policy.
        """
        return {}

    def graph_converters(self) -> Mapping[Any, Callable[..., Any]]:
        """Graph-mode converters: xccl graph op -> replacement, applied by the ``xccl`` compile backend."""
        return {}

    def compile_backend(self) -> Callable[..., Any] | None:
        """The vendor's own ``torch.compile`` backend to hand off to (None: Inductor)."""
        return None

    def graph_ops(self) -> frozenset[str] | None:
        """The names of xccl's graph ops (``torch.ops.xccl.<name>``) this runtime's graph compiler takes; None:
        every one (Inductor runs them as they are).

        One outside the set raises :class:`~xccl.UnsupportedCollective` at trace time instead of reaching a
        compiler that cannot take it. Without ``"order"`` the forms leave out the joins of standard collectives to
        the order token: the compiler keeps program order itself. A vendor whose own compile backend users may
        call directly can register here, once, what that backend needs to recognise xccl's ops (Ascend: TorchAir
        converters).
        """
        return None

    def sdk_versions(self) -> Mapping[str, str]:
        """Versions of the vendor SDKs this runtime found (name -> version, e.g. ``{"CANN": "8.5.0"}``), checked
        against the capability entries' ``min_sdk`` when a call is resolved; empty when unknown."""
        return {}

    def world_shrunk(self, kept: Sequence[int]) -> None:
        """The world is shrinking to the old global ranks ``kept`` (``torch.distributed.shrink_group``): the
        survivor ``kept[i]`` becomes rank ``i``, keeping its device. Called between the old world's destruction and
        the new one's creation, to re-derive what the runtime knows per global rank (Sophgo: the chip of each rank;
        Ascend: the survivors' rank table). Default: nothing."""

    def stop_device(self) -> bool:
        """Abort every task queued on this process's device, so that a collective stuck on a lost peer, and what
        waits behind it (a synchronisation, the teardown of its group), returns with an error instead of waiting for
        the vendor's execution timeout. Called when xccl finds a peer lost (the health watch's verdict) and before a
        shrink tears the old world down. Returns whether the vendor has such an abort (default: none, False)."""
        return False

    def restart_device(self) -> None:
        """Make the device take work again after :meth:`stop_device` (called by the shrink before the new world
        is built). Default: nothing."""

    def shutdown(self) -> None:
        """Release vendor resources after the process group is destroyed."""


def _create_native_group(backend: str, options: Any, pg_options: Any) -> Any:
    """A c10d ``Backend`` or ``ProcessGroup`` of ``backend`` for the group ``options`` describes, built the way
    ``torch.distributed`` would: gloo and nccl directly, as ``distributed_c10d._new_process_group_helper`` does in
    torch 2.13; any other name through the creator its package registered with ``Backend.register_backend``
    (torch_npu's ``hccl``, Sophgo's ``sccl``, or xccl's simulations of them).

    Raises:
        InitError: no backend of that name is available in this process.
    """
    c10d: Any = dist.distributed_c10d
    store, rank, size, timeout = options.store, options.group_rank, options.group_size, options.timeout
    net = transport()
    if backend == "gloo" or (backend == "nccl" and not net.waits):
        return net.gloo(store, rank, size, timeout, list(options.global_ranks_in_group), options.group_id)
    if backend == "nccl":
        opts = pg_options if pg_options is not None else c10d.ProcessGroupNCCL.Options()
        if pg_options is None:
            opts.is_high_priority_stream = False
        opts._timeout = timeout
        opts.global_ranks_in_group = list(options.global_ranks_in_group)
        opts.group_name = options.group_id
        return c10d.ProcessGroupNCCL(store, rank, size, opts)
    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is None:
        raise InitError(
            f"torch.distributed has no backend {backend!r} in this process: import the vendor's package (torch_npu "
            "registers 'hccl', torch_tpu 'sccl') or simulate it with xccl.init(vendor=..., simulate=True)"
        )
    if plugin.extended_api:
        return plugin.creator_fn(options, pg_options)
    return plugin.creator_fn(store, rank, size, timeout)
