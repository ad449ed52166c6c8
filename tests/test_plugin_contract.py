"""The plugin contract is checked when ``xccl.init`` selects a plugin, pluggy-style: attributes, the signatures of
the Plugin and Runtime methods a plugin overrides, and its kernels against ``KERNEL_SIGNATURES``. A broken plugin
fails at init, before any process group exists, with one line per problem naming the method and what to write;
before, a wrong kernel signature surfaced only at the first call of that kernel, on a running job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

import xccl
from xccl.plugin import Collective, Plugin, Registry, Runtime
from xccl.plugin._verify import contract_problems


def test_init_refuses_a_plugin_whose_kernel_signature_is_wrong() -> None:
    # xccl-testplugins' bad-kernel: an all_to_all_v kernel without the count matrix. One rank, no rendezvous: the
    # check runs before any process group is created, so the error is the same on every rank of a real job.
    with pytest.raises(xccl.PluginContractError) as err:
        xccl.init(vendor="bad-kernel", rank=0, world_size=1)
    assert err.value.plugin == "bad-kernel"
    assert "kernels()[Collective.ALL_TO_ALL_V]: the all_to_all_v kernel takes 4 positional arguments" in str(err.value)
    assert "write `def all_to_all_v(ctx, output, input, send_count_matrix, async_op, /)`" in str(err.value)
    with pytest.raises(xccl.InitError):
        xccl.get_world()  # nothing was initialised


class _Good(Plugin):
    name = "good"
    vendor = "tests"
    device_type = "cpu"
    backend = "gloo"
    accelerator = False


class _NoGroup(Runtime):
    def comm_name(self) -> str:  # type: ignore[override]  # the mistake under test
        return "x"


class _NoSuper(Runtime):
    def __init__(self, plugin: Plugin, *, simulate: bool) -> None:  # forgets super().__init__
        self.plugin_ = plugin


class _StringKey(Runtime):
    def kernels(self) -> Mapping[Any, Callable[..., Any]]:
        return {"all_reduce": lambda ctx, t, op, async_op: None}


def _with(runtime_cls: type[Runtime] | None = None, **attrs: Any) -> Plugin:
    def runtime(self: Plugin, *, simulate: bool) -> Any:
        return runtime_cls(self, simulate=simulate) if runtime_cls else object()

    return type("Broken", (_Good,), {**attrs, **({"runtime": runtime} if "runtime" not in attrs else {})})()


@pytest.mark.parametrize(
    ("plugin", "phrase"),
    [
        (_with(_NoGroup), "_NoGroup.comm_name() cannot be called as xccl calls it, comm_name(group) (too many positional"),
        (_with(_NoGroup), "write `def comm_name(self, group: dist.ProcessGroup) -> str`"),
        (_with(None), "Broken.runtime() returned object, not an xccl.plugin.Runtime"),
        (_with(_NoSuper), "must call super().__init__(plugin, simulate=simulate)"),
        (_with(_StringKey), "has a key 'all_reduce' that is not an xccl.Collective: write Collective.ALL_REDUCE"),
        (_with(Runtime, backend="HCCL"), 'Plugin.backend is \'HCCL\'; it must be the torch.distributed backend, a '
                                         'lower-case identifier'),
        (_with(Runtime, sdk_packages="torch-acme"), 'sdk_packages = ("torch-acme",)'),
        (_with(Runtime, runtime=lambda self: Runtime(self, simulate=False)),
         "cannot be called as xccl calls it, runtime(simulate=...)"),
    ],
    ids=["runtime-hook-signature", "says-what-to-write", "not-a-runtime", "no-super-init", "kernel-key",
         "backend-name", "sdk-packages", "plugin-hook-signature"],
)
def test_contract_problems_name_the_method_and_what_to_write(plugin: Plugin, phrase: str) -> None:
    try:
        runtime = plugin.runtime(simulate=True)
    except TypeError:  # the hook itself cannot be called so: only the plugin's side can be checked
        runtime = None
    try:
        problems = contract_problems(plugin, runtime, simulate=True)
    finally:
        if isinstance(runtime, Runtime):  # one case returns what is not a Runtime
            runtime.shutdown()
    assert any(phrase in p for p in problems), problems


@pytest.mark.parametrize("name", ["cpu", "cuda", "ascend", "sophgo", "template", "gloo-emulated"])
def test_the_repository_plugins_keep_the_contract(name: str) -> None:
    plugin = Registry().get(name)
    simulate = plugin.simulation() is not None
    runtime = plugin.runtime(simulate=simulate)
    try:
        assert contract_problems(plugin, runtime, simulate=simulate) == []
    finally:
        # A simulated SDK patches torch.distributed when its runtime loads (Ascend's torch_npu stand-ins): undo it,
        # or every later test in this process runs under them.
        runtime.shutdown()
    assert Collective.ALL_REDUCE in Collective  # the registry loaded the real enum, not a stand-in


def test_kernel_signatures_are_the_specs_arguments() -> None:
    """The plugin SDK (below the collectives layer) lists each kernel's parameters; dispatch calls kernels with
    the spec's kernel arguments: one list must be the other, or a conforming plugin kernel gets the wrong ones."""
    from xccl.ops._specs import SPECS
    from xccl.plugin._kernels import KERNEL_SIGNATURES

    for op, signature in KERNEL_SIGNATURES.items():
        if op in SPECS:  # the fused ops have no spec: their kernels take the matmul's operands (fused/_ops.py)
            assert signature == (*(a.name for a in SPECS[op].args), "async_op"), op
    assert {op.value for op in KERNEL_SIGNATURES if op not in SPECS} == {"mm_reduce_scatter", "all_gather_mm",
                                                                          "mm_all_reduce"}


class _Recording:
    """A stand-in for the vendor's c10d backend that records the options struct of each call (only the kernel
    builders of ``ops/_c10d.py`` run here: no collective, no torch.distributed). As ProcessGroupNCCL does (seen on
    an H200, torch 2.11.0+cu130), a call told that its caller blocks runs on the current stream and returns no work:
    None, which torch's own wrappers accept ("the backend has sync'ed")."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            flags = [a.asyncOp for a in args if hasattr(a, "asyncOp")]
            self.seen += flags
            return self if flags == [True] else None  # the work (wait() below), or none for a blocking call

        return call

    def wait(self) -> bool:
        return True


def _kernel_args() -> dict[Collective, tuple[Any, ...]]:
    import torch
    import torch.distributed as dist

    t, ts, op = torch.ones(2), [torch.ones(2)], dist.ReduceOp.SUM
    C = Collective
    return {C.ALL_REDUCE: (t, op), C.ALL_REDUCE_COALESCED: (ts, op), C.ALL_GATHER: (ts, t),
            C.ALL_GATHER_COALESCED: ([ts], ts), C.ALL_GATHER_INTO_TENSOR: (t, t), C.REDUCE_SCATTER: (t, ts, op),
            C.REDUCE_SCATTER_TENSOR: (t, t, op), C.ALL_TO_ALL: (ts, ts), C.ALL_TO_ALL_SINGLE: (t, t, None, None),
            C.BROADCAST: (t, 0), C.REDUCE: (t, 0, op), C.GATHER: (t, ts, 0), C.SCATTER: (t, ts, 0), C.BARRIER: ()}


@pytest.mark.parametrize("op", list(_kernel_args()), ids=lambda op: op.value)
def test_a_c10d_kernel_tells_the_backend_whether_the_caller_blocks(op: Collective) -> None:
    # torch's wrappers set opts.asyncOp = async_op, and NCCL launches a blocking call on the current stream without
    # the event syncs and tensor stashing of an asynchronous one (pytorch/pytorch#150398): xccl's kernels must too.
    from xccl.plugin._c10d import c10d_kernel

    native = _Recording()
    kernel = c10d_kernel(op, native)
    assert kernel is not None
    args = _kernel_args()[op]
    for async_op in (False, True, False):
        kernel(*args, async_op)
    assert native.seen == [False, True, False]
