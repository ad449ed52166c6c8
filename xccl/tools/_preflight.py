"""``xccl preflight``: will this training script run on vendor V at world size N, and what will its communication
cost? Answered on this machine, before the cluster is booked.

The script runs unmodified, every rank a process of this machine on V's CPU simulation (the vendor's capability
table, constraints and typed errors, computed by gloo), with torchrun's variables (:mod:`._preflight_launch`).
Each rank's flight recorder keeps every collective with the user's call site, and dumps it when the world ends;
a rank that dies leaves the error it raised (:mod:`._preflight_child`). :mod:`._preflight_report` turns both into
a table per call site priced with the plugin's cost model (:meth:`xccl.plugin.Plugin.cost_model`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from ..errors import InvalidArgument
from ..plugin._cost import CostModel
from ..plugin._registry import Registry, default_registry
from ._preflight_compiled import load_compiled, regions
from ._preflight_launch import launch, rank_env
from ._preflight_report import Report, Setting, build, groups_of, load_records
from .cli.doctor_node import vendor_runtime

__all__ = ["FAKE_NOTES", "MAX_REAL", "NOTES", "derived_nodes", "devices_per_node", "preflight"]

LOG = logging.getLogger("xccl")

#: The largest world run as one process per rank by default (each rank imports torch: seconds and ~300 MB each).
MAX_REAL = 8
#: What a preflight cannot show, printed with every report.
NOTES = (
    "times are the cost model's prediction for the vendor's hardware, not this machine's; the simulation's own "
    "timing says nothing about it",
    "collectives a script issues outside xccl's process group (a group on another backend) are not seen",
)
#: What a fake world cannot show, printed with every report of mode ``fake``.
FAKE_NOTES = (
    "fake world: only the ranks listed as run were played, each alone (XCCL_FAKE_WORLD), issuing no communication; "
    "control flow that differs on the other ranks was not seen",
    "fake world: collectives return tensors of the right shapes with garbage values, so decisions that depend on "
    "received values (loss checks, early stopping, data-dependent shapes or branches) may differ from a real run",
    "fake world: a rank that would wait for a peer never does (no hang, no timeout, no peer failure can show)",
)


def _mode(world: int, mode: str, ranks: Sequence[int] | None) -> tuple[int, ...] | None:
    """The ranks to play in a fake world (None: mode ``real``, every rank a process)."""
    if mode not in ("real", "fake", "auto"):
        raise InvalidArgument("preflight", f"mode={mode!r}: expected 'real', 'fake' or 'auto'")
    if mode == "auto":
        mode = "fake" if world > MAX_REAL or ranks is not None else "real"
    if mode == "real":
        if ranks is not None:
            raise InvalidArgument("preflight", "ranks= chooses the ranks of a fake world; mode 'real' runs them all")
        if world > MAX_REAL:
            raise InvalidArgument("preflight", f"world={world} is more than {MAX_REAL} processes on this machine; "
                                  "use mode 'fake' (or 'auto'): a few ranks, each playing its part of the world")
        return None
    chosen = tuple(dict.fromkeys(ranks if ranks is not None else (0, world - 1)))
    if not chosen or any(not 0 <= r < world for r in chosen):
        raise InvalidArgument("preflight", f"ranks={list(chosen)}: each must be a rank of the world, 0..{world - 1}")
    if len(chosen) > MAX_REAL:
        raise InvalidArgument("preflight", f"ranks={list(chosen)}: at most {MAX_REAL} ranks are played at once")
    return chosen


#: Run in a fresh interpreter by :func:`devices_per_node`: prints the device count of the vendor's simulated SDK.
_DEVICES_PROBE: Final = """
import sys
from xccl.plugin._registry import default_registry
runtime = default_registry().get(sys.argv[1]).runtime(simulate=True)
count = getattr(getattr(runtime, "sdk", None), "device_count", None)
print(count() if callable(count) else "")
"""


def devices_per_node(vendor: str, *, timeout: float = 120.0) -> int | None:
    """The devices a node of ``vendor``'s simulation has: what its ranks will be placed on, so the most ranks a
    node of the preflight can run. None when the plugin has no simulation or does not say.

    The plugin contract declares no device count, so this asks the simulated runtime's SDK boundary
    (``runtime.sdk.device_count()``), which ``xccl new-plugin``'s runtimes and those of Ascend and Sophgo have; it
    follows the simulation's own variables (``XCCL_SOPHGO_SIM_DEVICES``, ``XCCL_SIM_ASCEND_DEVICES``). The runtime
    is built in a child process, because building it may patch ``torch.distributed`` as the vendor SDK's import
    does (Ascend's), which this process must not get.

    Args:
        vendor: the plugin.
        timeout: seconds the child may take (it imports torch).
    """
    plugin = default_registry().get(vendor)
    if plugin.simulation() is None:
        return None
    try:
        child = subprocess.run([sys.executable, "-c", _DEVICES_PROBE, vendor], capture_output=True, text=True,
                               timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        LOG.debug("preflight: asking %s's simulation for its devices per node failed", vendor, exc_info=True)
        return None
    out = child.stdout.strip().splitlines()
    if child.returncode != 0 or not out or not out[-1].isdigit() or int(out[-1]) < 1:
        # Tolerant: without a count the world stays on one node, and the ranks say what the node lacks.
        LOG.debug("preflight: %s's simulation gave no devices per node (exit %s): %s", vendor, child.returncode,
                  child.stderr[-2000:])
        return None
    return int(out[-1])


def derived_nodes(world: int, per_node: int | None) -> int:
    """The fewest nodes that run ``world`` ranks with at most ``per_node`` on each, every node the same number
    (as ``torchrun --nnodes M --nproc-per-node N / M``): ``world / per_node`` rounded up, raised to the next
    divisor of ``world`` (9 ranks on nodes of 8: 3 nodes of 3). One node when ``per_node`` is None (no limit)."""
    if per_node is None or per_node < 1 or world <= per_node:
        return 1
    nodes = -(-world // per_node)
    while world % nodes:
        nodes += 1
    return nodes


def _checked(vendor: str, world: int, nodes: int, argv: Sequence[str], timeout: float) -> None:
    if world < 1:
        raise InvalidArgument("preflight", f"world={world}: a world needs at least one rank")
    if nodes < 1 or world % nodes:
        raise InvalidArgument("preflight", f"nodes={nodes} does not divide world={world}: every node runs "
                              "world / nodes ranks, as torchrun's --nnodes x --nproc-per-node")
    if not argv:
        raise InvalidArgument("preflight", "no script: pass what follows `python`, e.g. ['train.py', '--steps', '2']")
    if timeout <= 0:
        raise InvalidArgument("preflight", f"timeout={timeout}: must be a positive number of seconds")
    if not vendor:
        raise InvalidArgument("preflight", "no vendor: name a plugin (`xccl caps` lists them)")


def settings(registry: Registry, vendor: str, env: Mapping[str, str], groups: int) -> list[Setting]:
    """The vendor's settings that would bite the script: ``xccl doctor``'s vendor-runtime findings for ``vendor``,
    judged in ``env`` (the ranks' environment), and the device memory ``groups`` process groups per rank hold."""
    out = [Setting(f.name, f.status, f.summary, f.fix) for f in vendor_runtime(env, registry, vendor)]
    memory = registry.get(vendor).vendor_runtime().comm_memory
    if memory is not None and groups:
        mb = memory.comm_mb(env)
        out.append(Setting("communicator memory", "info",
                           f"the script's {groups} process group(s) per rank hold {groups} communicator(s) of "
                           f"{memory.buffers} x {memory.env}={memory.mb(env)} MB: {groups * mb} MB of device memory "
                           "per rank (a group's own buffer size, where set, changes its share)"))
    return out


def preflight(vendor: str, world: int, argv: Sequence[str], *, nodes: int | None = 1, timeout: float = 300.0,
              cwd: str | None = None, cost_model: CostModel | Literal["plugin"] | None = "plugin",
              mode: Literal["real", "fake", "auto"] = "auto", ranks: Sequence[int] | None = None) -> Report:
    """Run ``python ARGV`` as every rank of a world of ``world`` on ``vendor``'s simulation; what it did there.

    A world larger than :data:`MAX_REAL` runs as a fake world: a process per representative rank (``ranks``,
    default the first and the last), each playing its rank of ``world`` alone, issuing no communication, with the
    vendor's table, constraints and fallback policy enforced as in a real simulated run (:mod:`xccl.plugin._fake_world`).

    Args:
        vendor: the plugin (``sophgo``, ``ascend``, ``cpu``...); its simulation runs the ranks.
        world: the number of ranks (at most :data:`MAX_REAL` in mode ``real``).
        argv: what follows ``python``: ``["train.py", ARGS...]`` or ``["-m", "module", ARGS...]``. Keep the
            script's steps few (an argument of its own): every call is recorded.
        nodes: the nodes the world spans (ranks are laid out node by node): which groups cross nodes. None: as
            few as the vendor's simulated node holds (:func:`derived_nodes` of :func:`devices_per_node`, one
            child process to ask), said in the report's header (``xccl preflight`` without ``--nodes``).
        timeout: seconds the run may take; ranks still running then are stopped, and the report says so.
        cwd: the ranks' working directory (default: this process's).
        cost_model: the model to price calls with (``"plugin"``: the plugin's
            :meth:`~xccl.plugin.Plugin.cost_model`; None: none, every time unknown).
        mode: ``real`` (every rank a process), ``fake`` (the ``ranks`` only, in a fake world) or ``auto`` (real up
            to :data:`MAX_REAL` ranks, fake above, or when ``ranks`` is given).
        ranks: the ranks a fake world plays (default: the first and the last); the report's ``ranks_run``.

    Returns:
        The :class:`~xccl.tools._preflight_report.Report`; ``report.exit_code`` is 1 when a call would fail on the
        vendor or a rank failed.

    Raises:
        InvalidArgument: a world, node count, timeout, mode, rank list or command line that cannot be run.
        BackendNotFound: no plugin of that name.

    Example::

        report = xccl.tools.preflight("sophgo", 4, ["train.py", "--steps", "2"])
        print(report.table())
        sys.exit(report.exit_code)
    """
    argv = list(argv)
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]  # `-- python train.py`: the ranks run this interpreter, where xccl and the plugins are
    registry = default_registry()
    derivation = ""  # how ``nodes`` was derived when not given, for the report's header
    if nodes is None:
        _checked(vendor, world, 1, argv, timeout)  # a bad request is refused before the child is asked
        nodes, per_node = 1, devices_per_node(vendor)
        if per_node is not None:
            kind = str(registry.get(vendor).device_type)
            noun = f"{kind.upper()}s" if kind.endswith("pu") and len(kind) <= 4 else f"{kind} devices"  # TPUs
            nodes, derivation = derived_nodes(world, per_node), f"{world} ranks / {per_node} {noun} per node"
    _checked(vendor, world, nodes, argv, timeout)
    fake = _mode(world, mode, ranks)
    plugin = registry.get(vendor)
    model = plugin.cost_model() if cost_model == "plugin" else cost_model
    workdir = os.path.abspath(cwd or os.getcwd())
    with tempfile.TemporaryDirectory(prefix="xccl-preflight-") as trace_dir:
        exits = launch(argv, vendor=vendor, world=world, nodes=nodes, timeout=timeout, trace_dir=trace_dir,
                       cwd=workdir, fake=fake)
        records = load_records(trace_dir, [e.rank for e in exits])
        compiled = regions(load_compiled(trace_dir, [e.rank for e in exits]), workdir)
        # Judged in rank 0's environment: the one the ranks ran in (the variables the user exported included).
        env = rank_env(os.environ, rank=0, world=world, nodes=nodes, port=0, vendor=vendor, trace_dir=trace_dir)
        return build(trace_dir, records, vendor=plugin.name, world=world, nodes=nodes, exits=exits, model=model,
                     cwd=workdir, settings=settings(registry, plugin.name, env, groups_of(records)),
                     notes=NOTES if fake is None else NOTES + FAKE_NOTES, mode="real" if fake is None else "fake",
                     compiled=compiled, nodes_derivation=derivation)
