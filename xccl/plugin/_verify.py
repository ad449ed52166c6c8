"""The plugin contract, checked when a plugin is selected: attributes, hook signatures, kernels.

pluggy checks a hook implementation against its specification when the plugin registers, so a typo fails at once
and names the hook. xccl does the same when ``xccl.init`` (or ``xccl.process_group_backend``) has selected a plugin
and built its runtime, before any process group exists: every identity attribute, every method of :class:`Plugin`
and :class:`Runtime` the plugin overrides (can xccl call it the way it calls the base method?), and every kernel
``Runtime.kernels()`` returns (against :data:`~xccl.plugin.KERNEL_SIGNATURES`). Without this check a wrong kernel
signature surfaced at the first call of each shape, on a running job.

:func:`contract_problems` lists the problems (the conformance kit and tests read it); :func:`verify` raises them
as one :class:`~xccl.PluginContractError`. Each problem names the method and says what to write.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import PluginContractError
from ._capabilities import Collective
from ._contract import Plugin, Runtime
from ._kernels import KERNEL_SIGNATURES, kernel_problems

__all__ = ["contract_problems", "verify"]

#: Identity attributes: name -> (check, what a correct value looks like).
_ATTRIBUTES: Final[Mapping[str, tuple[Callable[[object], bool], str]]] = {
    "name": (lambda v: isinstance(v, str) and bool(v), 'a non-empty string, the entry-point name: name = "acme"'),
    "vendor": (lambda v: isinstance(v, str) and bool(v), 'a non-empty string for humans: vendor = "Acme Corp"'),
    "device_type": (lambda v: isinstance(v, str) and bool(v), 'the torch device type: device_type = "npu"'),
    "backend": (lambda v: isinstance(v, str) and re.fullmatch(r"[a-z][a-z0-9_]*", v) is not None,
                'the torch.distributed backend, a lower-case identifier: backend = "acmecl"'),
    "accelerator": (lambda v: isinstance(v, bool), "True or False: accelerator = True"),
    "visible_devices_env": (lambda v: v is None or (isinstance(v, str) and bool(v)),
                            'a variable name or None: visible_devices_env = "ACME_VISIBLE_DEVICES"'),
    "api_version": (lambda v: isinstance(v, int) and not isinstance(v, bool),
                    "an int: api_version = xccl.PLUGIN_API_VERSION"),
    "sdk_packages": (lambda v: isinstance(v, tuple) and all(isinstance(p, str) and p for p in v),
                     'a tuple of distribution names: sdk_packages = ("torch-acme",)'),
}

#: The hooks xccl calls, by class: their signatures are the base class's.
_PLUGIN_HOOKS: Final = (
    "probe", "capabilities", "simulation", "vendor_runtime", "runtime", "rank_table_formats", "adaptor_modules",
)
_RUNTIME_HOOKS: Final = (
    "setup_device", "adopt_device", "create_native_group", "process_group_options", "comm_name", "kernels",
    "graph_converters", "compile_backend", "graph_ops", "sdk_versions", "shutdown",
)


def verify(plugin: Plugin, runtime: object, *, simulate: bool) -> None:
    """Raise when ``plugin`` or the ``runtime`` it built breaks the contract.

    Raises:
        PluginContractError: one line per problem, naming the attribute or method and what to write.
    """
    problems = contract_problems(plugin, runtime, simulate=simulate)
    if problems:
        raise PluginContractError(str(getattr(plugin, "name", "") or type(plugin).__name__), problems)


def contract_problems(plugin: Plugin, runtime: object | None = None, *, simulate: bool = False) -> list[str]:
    """Everything in ``plugin`` (and in ``runtime``, when given) that xccl cannot use as the contract says."""
    problems = [_attribute_problem(plugin, attr) for attr in _ATTRIBUTES]
    problems += [_hook_problem(plugin, Plugin, hook) for hook in _PLUGIN_HOOKS]
    if runtime is not None:
        problems += _runtime_problems(plugin, runtime, simulate)
    return [p for p in problems if p]


def _attribute_problem(plugin: Plugin, attr: str) -> str:
    value = getattr(plugin, attr, None)
    check, example = _ATTRIBUTES[attr]
    if check(value):
        return ""
    return f"Plugin.{attr} is {value!r}; it must be {example}"


def _runtime_problems(plugin: Plugin, runtime: object, simulate: bool) -> list[str]:
    cls = type(plugin).__name__
    if not isinstance(runtime, Runtime):
        return [f"{cls}.runtime() returned {type(runtime).__name__}, not an xccl.plugin.Runtime: subclass Runtime "
                "and return YourRuntime(self, simulate=simulate)"]
    if getattr(runtime, "plugin", None) is not plugin or getattr(runtime, "simulate", None) is not simulate:
        return [f"{type(runtime).__name__} does not carry the plugin and mode it was built for: its __init__ must "
                "call super().__init__(plugin, simulate=simulate) with the arguments runtime() received"]
    problems = [_hook_problem(runtime, Runtime, hook) for hook in _RUNTIME_HOOKS]
    if any(problems) and problems[_RUNTIME_HOOKS.index("kernels")]:
        return problems  # kernels() cannot be called as xccl calls it: its kernels cannot be read
    return problems + _kernel_problems(runtime)


def _kernel_problems(runtime: Runtime) -> list[str]:
    name = type(runtime).__name__
    try:
        kernels = runtime.kernels()
    except Exception as exc:  # the hook's own failure is the finding
        return [f"{name}.kernels() raised {type(exc).__name__}: {exc}"]
    if not isinstance(kernels, Mapping):
        return [f"{name}.kernels() returned {type(kernels).__name__}; return a mapping "
                "{xccl.Collective.OP: kernel} (empty when the SDK adds nothing to torch.distributed)"]
    out = []
    for op, kernel in kernels.items():
        if not isinstance(op, Collective):
            out.append(f"{name}.kernels() has a key {op!r} that is not an xccl.Collective: write Collective.ALL_REDUCE")
            continue
        for problem in kernel_problems(op, kernel):
            args = ", ".join(("ctx", *KERNEL_SIGNATURES[op]))
            out.append(f"{name}.kernels()[Collective.{op.name}]: {problem}; write `def {op.value}({args}, /)` "
                       "(xccl.plugin.KERNEL_SIGNATURES)")
    return out


def _hook_problem(obj: object, base: type, hook: str) -> str:
    """Why xccl cannot call ``obj.<hook>`` the way it calls ``base.<hook>`` (empty when it can)."""
    if getattr(type(obj), hook, None) is getattr(base, hook):
        return ""  # not overridden: the base class's
    owner = f"{type(obj).__name__}.{hook}"
    want = _render(hook, getattr(base, hook))
    method = getattr(obj, hook, None)
    if not callable(method):
        return f"{owner} is {method!r}, not a method: write `{want}`"
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):
        return ""  # a builtin without a signature: nothing to check
    args, kwargs = _call_of(getattr(base, hook))
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        call = ", ".join([*_positional(getattr(base, hook)), *(f"{k}=..." for k in kwargs)])
        return f"{owner}({_names(sig)}) cannot be called as xccl calls it, {hook}({call}) ({exc}): write `{want}`"
    return ""


def _names(sig: inspect.Signature) -> str:
    """The parameters of a bound method, as written (``group, *, simulate``), without annotations."""
    out, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        out.append(stars + p.name)
        star = star or p.kind is p.VAR_POSITIONAL
    return ", ".join(out)


def _positional(func: Callable[..., Any]) -> list[str]:
    params = list(inspect.signature(func).parameters.values())[1:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _call_of(func: Callable[..., Any]) -> tuple[tuple[object, ...], dict[str, object]]:
    """How xccl calls the base method ``func``: its positional parameters by position, keyword-only ones by name."""
    params = list(inspect.signature(func).parameters.values())[1:]  # without self
    args: tuple[object, ...] = tuple(None for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    kwargs: dict[str, object] = {p.name: None for p in params if p.kind is p.KEYWORD_ONLY}
    return args, kwargs


def _render(hook: str, func: Callable[..., Any]) -> str:
    """``def comm_name(self, group: dist.ProcessGroup) -> str``: the base method's signature, for messages."""
    sig = inspect.signature(func)
    parts = []
    star = False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        ann = "" if p.annotation is p.empty else f": {p.annotation}"
        parts.append(f"{p.name}{ann}")
    ret = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    return f"def {hook}({', '.join(parts)}){ret}"
