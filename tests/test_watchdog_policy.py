"""xccl's policy for a vendor's watchdog (``xccl.collectives._watchdog``), on a made-up vendor's declaration; and the
backend name xccl registers over a vendor backend torch does not know (``xccl.BackendName``).

The multi-rank behaviour (a slow peer below the floor survives, a hung one gets a typed error) is tested on the
simulated Ascend runtime (``plugins/ascend/tests/test_ascend_runtime.py``) and by the conformance suite; here, the
decisions themselves, which every group's creation applies.
"""

from __future__ import annotations

import datetime as _dt
import math

import pytest

from xccl.collectives._watchdog import CHOSEN_MODE, NEVER, choose_mode, group_timeout, settings_of
from xccl.plugin import ErrorHandling, LazyConnect, VendorRuntime, Watchdog

WD = Watchdog(mode_env="V_MODE", mode_env_aliases=("V_OLD_MODE",), default_mode=ErrorHandling.TEAR_DOWN,
              exec_timeout_env="V_EXEC", exec_timeout_default=100.0, default_margin=50.0, source="made up")


def seconds(requested: float, env: dict[str, str] | None = None) -> tuple[float, str | None]:
    decided = group_timeout(WD, _dt.timedelta(seconds=requested), env or {})
    return decided.timeout.total_seconds(), decided.note


def test_no_timeout_given_gets_the_vendors_default_in_every_mode() -> None:
    """torch's 30-minute default means "none given": execution timeout + margin, whatever the mode (the vendor
    itself does so in TearDown only)."""
    assert seconds(1800) == (150.0, None)
    assert seconds(1800, {"V_EXEC": "10"}) == (60.0, None)


def test_a_timeout_at_or_below_the_execution_timeout_is_raised_above_it_and_said_once() -> None:
    for asked in (2, 100):
        got, note = seconds(asked)
        assert got == 150.0 and note is not None and "V_EXEC=100 s" in note and "150 s" in note


def test_a_timeout_above_the_execution_timeout_is_kept_and_the_note_says_what_ends_a_collective_first() -> None:
    got, note = seconds(120)
    assert got == 120.0 and note is not None and "bounded by 100 s" in note


def test_an_execution_timeout_of_zero_means_no_floor() -> None:
    assert seconds(2, {"V_EXEC": "0"}) == (2.0, None)
    assert group_timeout(WD, _dt.timedelta(seconds=1800), {"V_EXEC": "0"}).timeout == NEVER


def test_the_mode_is_xccls_unless_the_user_set_it() -> None:
    env: dict[str, str] = {}
    assert choose_mode(WD, env) == "set by xccl" and env == {"V_MODE": str(CHOSEN_MODE.value)}
    env = {"V_OLD_MODE": "1"}
    assert choose_mode(WD, env) == "V_OLD_MODE=1 (set by the user)" and "V_MODE" not in env
    with pytest.raises(ValueError, match="V_MODE should be 0, 1, 2, or 3"):
        choose_mode(WD, {"V_MODE": "7"})


def test_settings_report_what_bounds_a_collective() -> None:
    declared = VendorRuntime(watchdog=WD, lazy_connect=LazyConnect("V_CONNECT", 30.0, "made up"))
    s = settings_of(declared, {"V_MODE": "2", "V_EXEC": "10"}, "set by xccl")
    assert s is not None and s.mode is ErrorHandling.CLEAN_UP_ONLY and s.default_timeout == 60.0
    assert s.collective_bound(60.0) == 10.0 and s.connect_timeout == 30.0
    assert "V_EXEC=10 s" in s.describe() and "V_CONNECT=30 s" in s.describe()
    never = settings_of(declared, {"V_EXEC": "0"}, "the vendor's default")
    assert never is not None and math.isinf(never.default_timeout) and never.collective_bound(60.0) == 60.0


def test_backend_name_compares_as_both_names_and_hashes_as_xccls() -> None:
    """What code that branches on dist.get_backend() sees on a world over a vendor backend torch does not know."""
    import pickle

    from xccl import BackendName

    name = BackendName("xccl_hccl", "hccl")
    # Both operand orders and != on purpose: str.__eq__ on the left must defer to BackendName's.
    assert name == "hccl" and "hccl" == name and name == "xccl_hccl" and not name != "hccl"  # noqa: SIM300, SIM202
    assert name in ("nccl", "hccl") and name != "gloo" and name != "xccl"
    assert name not in {"hccl"} and {"xccl_hccl": 1}[name] == 1  # hashing is xccl's name's
    assert str(name) == f"{name}" == "xccl_hccl" and type(str(name)) is str and name.upper() == "XCCL_HCCL"
    assert pickle.loads(pickle.dumps(name)) == "hccl"
