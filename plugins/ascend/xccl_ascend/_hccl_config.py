"""``ProcessGroupHCCL.Options.hccl_config``: the documented keys, their types, and the checks on them.

torch_npu reads ``hccl_config`` in ``createHcclCommConfigWithOptions`` when it creates a communicator (lazily, at
the first collective), and a value of the wrong type fails a ``TORCH_CHECK`` there ("Value type of group_name
should be string."): far from the ``init_process_group`` call that passed it. Unknown keys are ignored silently,
so a typo loses the setting. xccl checks the whole dict when it is configured, before any process group exists
(:func:`validate_hccl_config`), and the simulation raises HCCL's own messages at group creation
(:func:`torch_check`).

Values bind to ``std::variant<uint32_t, uint64_t, int32_t, std::string>`` (``ProcessGroupHCCL.hpp:475``), and
pybind11 tries the alternatives in that order: an int in ``[0, 2**32)`` binds as uint32, ``[2**32, 2**64)`` as
uint64, a negative one as int32 (:func:`binds_as`). Each key accepts some alternatives only, so both checks ask
what the value *binds as*, not what Python type it has: ``hccl_job_id`` is read as uint64 only
(``ProcessGroupHCCL.cpp:3881-3887`` at tag compatibility_release-pytorch2.13.0), so a job id below 2**32 fails
torch_npu's "Value type of hccl_job_id should be int." and xccl refuses it up front.

``group_name`` is HCCL's ``hcclUdi`` (user-defined information, ``:3826-3839``), not the communicator's name: the
communicator is named ``"group_name_" + <torch's group name>`` (``:1132``, ``:3803-3811``), which is what
``xccl.comm_name`` returns. Strings longer than their field are truncated by torch_npu with a warning
(``group_name``, ``hccl_retry_params``, ``hccl_buffer_name``: 127 characters; ``hccl_retry_enable``: 49;
``hccl_algo``: 1599); xccl warns the same way when the config is set.
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from xccl.plugin import InvalidArgument

__all__ = [
    "ENV_VAR",
    "HCCL_CONFIG_KEYS",
    "ConfigKey",
    "binds_as",
    "config_for",
    "set_hccl_config",
    "torch_check",
    "validate_hccl_config",
]

#: Environment variable holding a JSON ``hccl_config`` applied to every group (like ``set_hccl_config(cfg)``).
ENV_VAR: Final = "XCCL_HCCL_CONFIG"

Kind = Literal["uint32", "uint64", "int32", "string"]
#: The variant's alternatives in pybind11's order, with the ints each takes.
_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "uint32": (0, 2**32 - 1),
    "uint64": (2**32, 2**64 - 1),
    "int32": (-(2**31), -1),
}
_INT32_MAX: Final = 2**31 - 1


@final
@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One ``hccl_config`` key as torch_npu reads it."""

    name: str
    #: The C++ type torch_npu reads (``hccl_exec_timeout`` also takes a uint32 up to INT32_MAX).
    kind: Kind
    #: What it sets, for error messages and docs.
    doc: str
    #: For strings: the size of the C field; longer values are truncated to ``max_len - 1`` with a warning.
    max_len: int | None = None


HCCL_CONFIG_KEYS: Final[Mapping[str, ConfigKey]] = {
    k.name: k
    for k in (
        ConfigKey("hccl_buffer_size", "uint32", "communicator buffer size in MB (overrides HCCL_BUFFSIZE)"),
        ConfigKey("qos_traffic_class", "uint32", "RDMA traffic class"),
        ConfigKey("qos_service_level", "uint32", "RDMA service level"),
        ConfigKey("hccl_sdma_qos", "uint32", "SDMA QoS"),
        ConfigKey("hccl_op_expansion_mode", "uint32", "operator expansion mode"),
        ConfigKey("hccl_world_rank_id", "uint32", "world rank id (NSLB-DP)"),
        ConfigKey("hccl_job_id", "uint64", "job id (NSLB-DP)"),
        ConfigKey("hccl_exec_timeout", "int32", "execution timeout in seconds (overrides HCCL_EXEC_TIMEOUT)"),
        ConfigKey("group_name", "string", "HCCL's hcclUdi, user-defined information; not the communicator's name",
                  128),
        ConfigKey("hccl_algo", "string", "algorithm selection (as HCCL_ALGO)", 1600),
        ConfigKey("hccl_retry_enable", "string", "retry switch", 50),
        ConfigKey("hccl_retry_params", "string", "retry parameters", 128),
        ConfigKey("hccl_buffer_name", "string", "name of a shared buffer", 128),
    )
}


def binds_as(value: object) -> Kind | None:
    """The alternative of ``hccl_config``'s variant a Python value binds to, or None when none can hold it.

    pybind11 tries uint32, uint64, int32 and string in turn; a bool is an int to it (``True`` binds as uint32).
    """
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return next((k for k, (lo, hi) in _RANGES.items() if lo <= value <= hi), None)  # type: ignore[return-value]
    return None


def _accepts(spec: ConfigKey, value: object) -> bool:
    """Whether torch_npu's ``createHcclCommConfigWithOptions`` takes ``value`` for ``spec`` (type only)."""
    kind = binds_as(value)
    if spec.kind == "int32":  # hccl_exec_timeout: int32, or a uint32 it then bounds by INT32_MAX
        return kind in ("int32", "uint32")
    return kind == spec.kind


def validate_hccl_config(config: object) -> dict[str, int | str]:
    """Check an ``hccl_config`` dict against the documented keys, and each value as torch_npu will see it.

    Args:
        config: what the user passed.

    Returns:
        A copy, safe to hand to ``ProcessGroupHCCL.Options.hccl_config``.

    Raises:
        InvalidArgument: not a dict of str keys, an unknown key, or a value torch_npu would refuse (wrong type, or
            an int that binds to an alternative the key does not read, e.g. ``hccl_job_id`` below 2**32).

    Warns:
        UserWarning: a string torch_npu will truncate.
    """
    op = "hccl_config"
    if not isinstance(config, Mapping):
        raise InvalidArgument(op, f"must be a dict of HCCL options, got {type(config).__name__}")
    out: dict[str, int | str] = {}
    for key, value in config.items():
        spec = HCCL_CONFIG_KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            raise InvalidArgument(op, _unknown(key))
        out[key] = _checked(spec, value)
    return out


def _unknown(key: object) -> str:
    known = ", ".join(sorted(HCCL_CONFIG_KEYS))
    close = difflib.get_close_matches(str(key), list(HCCL_CONFIG_KEYS), n=1) if isinstance(key, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; torch_npu ignores unknown keys silently, so the setting would be lost. Known keys: {known}"


def _checked(spec: ConfigKey, value: object) -> int | str:
    op, name = "hccl_config", spec.name
    if spec.kind == "string":
        if not isinstance(value, str):
            raise InvalidArgument(op, f"{name} ({spec.doc}) must be a str, got {type(value).__name__} {value!r}")
        if spec.max_len is not None and len(value) >= spec.max_len:
            warnings.warn(
                f"hccl_config {name} has {len(value)} characters; torch_npu truncates it to {spec.max_len - 1} "
                f"(its C field holds {spec.max_len} bytes)", UserWarning, stacklevel=4,
            )
        return value
    # bool is an int to Python and to pybind (True binds as uint32), but a flag where a number is meant is a slip.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(op, f"{name} ({spec.doc}) must be an int, got {type(value).__name__} {value!r}")
    kind = binds_as(value)
    if spec.kind == "uint64" and kind == "uint32":
        raise InvalidArgument(
            op,
            f"{name}={value}: torch_npu reads {name} as a uint64 only, and an int below 2**32 reaches it as a uint32 "
            "(pybind binds hccl_config's std::variant<uint32_t, uint64_t, int32_t, string> to the first alternative "
            f"that fits), so HCCL would fail 'Value type of {name} should be int.' at the first collective. Pass a "
            "value >= 2**32 (torch_npu's own NSLB job ids are (port << 32) + ip)",
        )
    if spec.kind == "int32":
        if kind not in ("int32", "uint32") or value > _INT32_MAX:
            raise InvalidArgument(op, f"{name}={value} is outside the int32 range [{-(2**31)}, {_INT32_MAX}]")
        return value
    if kind != spec.kind:
        lo, hi = (0, 2**32 - 1) if spec.kind == "uint32" else _RANGES[spec.kind]
        raise InvalidArgument(
            op, f"{name}={value} is outside the {spec.kind} range [{lo}, {hi}] (it would reach torch_npu as "
            f"{kind or 'no C++ integer'}, which it does not read for {name})",
        )
    return value


def torch_check(config: Mapping[str, object]) -> None:
    """What torch_npu's ``createHcclCommConfigWithOptions`` does with ``hccl_config`` (for the simulation).

    Unknown keys pass, as in torch_npu; a value that binds to an alternative the key does not read raises its
    ``TORCH_CHECK`` message, ``"Value type of <key> should be int."`` / ``"... should be string."``; a string
    longer than its field warns with torch_npu's message (it is truncated there).

    Raises:
        RuntimeError: a documented key holds a value torch_npu refuses.
        TypeError: a value pybind cannot bind at all (``Options.hccl_config`` assignment fails on the hardware).
    """
    for key, value in config.items():
        spec = HCCL_CONFIG_KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            continue
        if binds_as(value) is None:
            raise TypeError(f"hccl_config[{key!r}] = {value!r}: incompatible function arguments (pybind: no "
                            "alternative of std::variant<uint32_t, uint64_t, int32_t, std::string> holds it)")
        if not _accepts(spec, value):
            raise RuntimeError(f"Value type of {key} should be {'string' if spec.kind == 'string' else 'int'}.")
        if key == "hccl_exec_timeout" and binds_as(value) == "uint32" and int(value) > _INT32_MAX:  # type: ignore[call-overload]
            raise RuntimeError("Value type of hccl_exec_timeout exceeds INT32_MAX(2147483647).")
        if key == "hccl_exec_timeout" and binds_as(value) == "int32":
            warnings.warn("Value type of hccl_exec_timeout less than 0.", UserWarning, stacklevel=2)
        if spec.max_len is not None and len(str(value)) >= spec.max_len:
            warnings.warn(f"The length of {key} has exceeded its limit ({spec.max_len}) and is truncated to "
                          f"{spec.max_len - 1} characters (torch_npu)", UserWarning, stacklevel=2)


# --------------------------------------------------------------------------------------------- configured values

#: Configured ``hccl_config`` per group: ``None`` -> every group, ``"world"`` -> the world, a rank tuple -> that group.
_CONFIGS: dict[object, dict[str, int | str]] = {}


def set_hccl_config(
    config: Mapping[str, int | str] | None, *, ranks: Sequence[int] | str | None = None
) -> None:
    """Set the ``hccl_config`` xccl passes (in ``ProcessGroupHCCL.Options``) to groups created afterwards.

    Call it before ``xccl.init`` for the world group, before ``xccl.new_group`` for sub-groups. It is checked at
    once: an unknown key or a value of the wrong type raises here, not at the first collective.

    Args:
        config: the options, e.g. ``{"hccl_buffer_size": 400}``; None removes what was set for ``ranks``.
        ranks: None for every group; ``"world"`` for the world group only; a list of global ranks for the group
            over exactly those ranks. A group-specific config replaces the one for every group.

    Raises:
        InvalidArgument: a bad key or value (see :func:`validate_hccl_config`).

    Example::

        xccl_ascend.set_hccl_config({"hccl_buffer_size": 400})
        xccl_ascend.set_hccl_config({"group_name": "tp0", "hccl_buffer_size": 200}, ranks=[0, 1])  # tp0: the UDI
        xccl.init(vendor="ascend")
        tp = xccl.new_group([0, 1])
    """
    key = _key(ranks)
    if config is None:
        _CONFIGS.pop(key, None)
        return
    _CONFIGS[key] = validate_hccl_config(config)


def _key(ranks: Sequence[int] | str | None) -> object:
    if ranks is None or ranks == "world":
        return ranks
    if isinstance(ranks, str):
        raise InvalidArgument("hccl_config", f"ranks={ranks!r}: pass None, 'world' or a list of global ranks")
    return tuple(sorted(int(r) for r in ranks))  # a group's identity is its member set (torch orders it)


def config_for(ranks: Sequence[int] | None, env: Mapping[str, str] | None = None) -> dict[str, int | str] | None:
    """The ``hccl_config`` for the group over ``ranks`` (None: the world), or None when nothing is configured.

    Precedence: the group's own config, then the one for every group, then ``XCCL_HCCL_CONFIG``.

    Raises:
        InvalidArgument: ``XCCL_HCCL_CONFIG`` is not a JSON object of valid options.
    """
    own = _CONFIGS.get("world" if ranks is None else tuple(sorted(ranks)))
    if own is not None:
        return dict(own)
    every = _CONFIGS.get(None)
    if every is not None:
        return dict(every)
    raw = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidArgument("hccl_config", f"{ENV_VAR} is not JSON ({exc}): {raw!r}") from None
    return validate_hccl_config(parsed)
