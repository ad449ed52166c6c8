"""``ProcessGroupHCCL.Options.hccl_config``: the documented keys, their types, and the checks on them.

torch_npu reads ``hccl_config`` in ``createHcclCommConfigWithOptions`` when it creates a communicator (lazily, at
the first collective), and a value of the wrong type fails a ``TORCH_CHECK`` there ("Value type of group_name
should be string"): far from the ``init_process_group`` call that passed it. Unknown keys are ignored silently,
so a typo loses the setting. xccl checks the whole dict when it is configured, before any process group exists
(:func:`validate_hccl_config`), and the simulation raises HCCL's own messages at group creation
(:func:`torch_check`).

Values bind to ``std::variant<uint32, uint64, int32, string>``; a small Python int binds as ``uint32``, so
``hccl_job_id`` (read as ``uint64`` only) may fail HCCL's type check for values below 2**32 (manifest gotcha 11,
not verified on hardware): xccl accepts them and says so in the docs.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from xccl.plugin import InvalidArgument

__all__ = [
    "ENV_VAR",
    "HCCL_CONFIG_KEYS",
    "ConfigKey",
    "config_for",
    "set_hccl_config",
    "torch_check",
    "validate_hccl_config",
]

#: Environment variable holding a JSON ``hccl_config`` applied to every group (like ``set_hccl_config(cfg)``).
ENV_VAR: Final = "XCCL_HCCL_CONFIG"

Kind = Literal["uint32", "uint64", "int32", "string"]
_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "int32": (-(2**31), 2**31 - 1),
}
#: HCCL's communicator name is a ``char[128]``: at most 127 characters and the terminating NUL.
MAX_GROUP_NAME: Final = 127


@final
@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One ``hccl_config`` key as torch_npu reads it."""

    name: str
    #: The C++ type the value must bind to.
    kind: Kind
    #: What it sets, for error messages and docs.
    doc: str


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
        ConfigKey("group_name", "string", "the communicator's name, as get_hccl_comm_name then returns it"),
        ConfigKey("hccl_algo", "string", "algorithm selection (as HCCL_ALGO)"),
        ConfigKey("hccl_retry_enable", "string", "retry switch"),
        ConfigKey("hccl_retry_params", "string", "retry parameters"),
        ConfigKey("hccl_buffer_name", "string", "name of a shared buffer"),
    )
}


def validate_hccl_config(config: object) -> dict[str, int | str]:
    """Check an ``hccl_config`` dict against the documented keys, types and ranges.

    Args:
        config: what the user passed.

    Returns:
        A copy, safe to hand to ``ProcessGroupHCCL.Options.hccl_config``.

    Raises:
        InvalidArgument: not a dict of str keys, an unknown key, a value of the wrong type or out of range.
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
    op = "hccl_config"
    if spec.kind == "string":
        if not isinstance(value, str):
            raise InvalidArgument(op, f"{spec.name} ({spec.doc}) must be a str, got {type(value).__name__} {value!r}")
        if spec.name == "group_name" and not 0 < len(value) <= MAX_GROUP_NAME:
            raise InvalidArgument(op, f"group_name must have 1..{MAX_GROUP_NAME} characters, got {len(value)}")
        return value
    # bool is an int to Python but binds to no HCCL integer; refuse it rather than send 0/1 by accident.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(op, f"{spec.name} ({spec.doc}) must be an int, got {type(value).__name__} {value!r}")
    lo, hi = _RANGES[spec.kind]
    if not lo <= value <= hi:
        raise InvalidArgument(op, f"{spec.name}={value} is outside the {spec.kind} range [{lo}, {hi}]")
    return value


def torch_check(config: Mapping[str, object]) -> None:
    """The type checks HCCL itself makes on ``hccl_config``, with its messages (for the simulation).

    Unknown keys pass, as in HCCL; values of the wrong kind raise ``RuntimeError("Value type of <key> should be
    int.")`` / ``("... should be string")`` like its ``TORCH_CHECK``.

    Raises:
        RuntimeError: a documented key holds a value of the wrong kind.
    """
    for key, value in config.items():
        spec = HCCL_CONFIG_KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            continue
        if spec.kind == "string" and not isinstance(value, str):
            raise RuntimeError(f"Value type of {key} should be string")
        if spec.kind != "string" and (not isinstance(value, int) or isinstance(value, bool)):
            raise RuntimeError(f"Value type of {key} should be int.")


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
        InvalidArgument: a bad key or value, or a ``group_name`` (which names one communicator) set for every group.

    Example::

        xccl_ascend.set_hccl_config({"hccl_buffer_size": 400})
        xccl_ascend.set_hccl_config({"group_name": "tp0", "hccl_buffer_size": 200}, ranks=[0, 1])
        xccl.init(vendor="ascend")
        tp = xccl.new_group([0, 1])
    """
    key = _key(ranks)
    if config is None:
        _CONFIGS.pop(key, None)
        return
    checked = validate_hccl_config(config)
    if key is None and "group_name" in checked:
        raise InvalidArgument(
            "hccl_config",
            "group_name names one communicator, so it cannot apply to every group; pass ranks='world' or the "
            "group's ranks",
        )
    _CONFIGS[key] = checked


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
    checked = validate_hccl_config(parsed)
    if "group_name" in checked:
        raise InvalidArgument("hccl_config", f"{ENV_VAR} applies to every group, so it cannot set group_name")
    return checked
