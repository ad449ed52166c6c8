"""The plugin contract, checked when a plugin is selected: attributes, hook signatures, kernels.

As pluggy checks a hook implementation when the plugin registers, ``xccl.init`` checks a selected plugin and its
runtime before any process group exists (docs/plugin-guide.md, section 10): without this a wrong kernel signature
surfaced at the first call of each shape, on a running job. :func:`contract_problems` lists the problems (the
conformance kit and tests read it); :func:`verify` raises them as one :class:`~xccl.PluginContractError`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import PluginContractError
from ._contract import Plugin, Runtime
from ._kernels import kernels_problems

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
    return "" if check(value) else f"Plugin.{attr} is {value!r}; it must be {example}"


def _runtime_problems(plugin: Plugin, runtime: object, simulate: bool) -> list[str]:
    cls = type(plugin).__name__
    if not isinstance(runtime, Runtime):
        return [f"{cls}.runtime() returned {type(runtime).__name__}, not an xccl.plugin.Runtime: subclass Runtime "
                "and return YourRuntime(self, simulate=simulate)"]
    if getattr(runtime, "plugin", None) is not plugin or getattr(runtime, "simulate", None) is not simulate:
        return [f"{type(runtime).__name__} does not carry the plugin and mode it was built for: its __init__ must "
                "call super().__init__(plugin, simulate=simulate) with the arguments runtime() received"]
    problems = [_hook_problem(runtime, Runtime, hook) for hook in _RUNTIME_HOOKS]
    if problems[_RUNTIME_HOOKS.index("kernels")]:
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
    return kernels_problems(kernels, f"{name}.")


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
    positional, keywords = _call_of(getattr(base, hook))
    try:
        sig.bind(*[None] * len(positional), **dict.fromkeys(keywords))
    except TypeError as exc:
        call = ", ".join([*positional, *(f"{k}=..." for k in keywords)])
        return f"{owner}({_params(sig)}) cannot be called as xccl calls it, {hook}({call}) ({exc}): write `{want}`"
    return ""


def _params(sig: inspect.Signature, *, annotated: bool = False) -> str:
    """The parameters as written (``group, *, simulate``), with their annotations when ``annotated``."""
    out, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        ann = f": {p.annotation}" if annotated and p.annotation is not p.empty else ""
        out.append(f"{stars}{p.name}{ann}")
    return ", ".join(out)


def _call_of(func: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """How xccl calls the base method ``func``: its positional parameters by position, keyword-only ones by name."""
    params = list(inspect.signature(func).parameters.values())[1:]  # without self
    return ([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            [p.name for p in params if p.kind is p.KEYWORD_ONLY])


def _render(hook: str, func: Callable[..., Any]) -> str:
    """``def comm_name(self, group: dist.ProcessGroup) -> str``: the base method's signature, for messages."""
    sig = inspect.signature(func)
    ret = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    return f"def {hook}({_params(sig, annotated=True)}){ret}"
