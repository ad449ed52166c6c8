"""A vendor's adaptor is not the user's code: torch_npu replaces ``dist.gather`` (and TorchAir, torch_tpu and
DeepSpeed's ``deepspeed.comm`` wrap other collectives), so the first frame outside torch and xccl is the vendor's.
``Plugin.adaptor_modules`` names those modules; the flight recorder's call sites, ``warn_at_user`` and the
preflight's error sites skip their frames by one rule (``xccl.ops._warn.internal``).

In-process: ``tests/data/adaptor/acme_adaptor.py`` plays the adaptor, named by a test plugin's hook.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from xccl.collectives._flight import user_frame
from xccl.ops import _warn
from xccl.plugin import Plugin
from xccl.tools._preflight_child import _user_frame

ROOT = Path(__file__).resolve().parent.parent


class AcmePlugin(Plugin):
    """A vendor whose adaptor is the module ``acme_adaptor``."""

    name = "acme-adaptor-test"

    def adaptor_modules(self) -> tuple[str, ...]:
        return ("acme_adaptor",)


@pytest.fixture
def adaptor(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "data" / "adaptor"))
    import acme_adaptor

    before = _warn.adaptor_modules()
    _warn.set_adaptor_modules(AcmePlugin().adaptor_modules())  # what xccl.init does with the selected plugin's
    try:
        yield acme_adaptor
    finally:
        _warn.set_adaptor_modules(before)
        sys.modules.pop("acme_adaptor", None)


def test_the_flight_recorders_call_site_skips_the_adaptor(adaptor: ModuleType) -> None:
    # The recorder walks out from its caller; here from the adaptor's frame, the one that called the lambda.
    here = sys._getframe().f_lineno + 1
    code, line = adaptor.gather(lambda: _site(user_frame(sys._getframe(1))))
    assert (code.co_filename, code.co_name, line) == (
        __file__, "test_the_flight_recorders_call_site_skips_the_adaptor", here)


def _site(frame: Any) -> tuple[Any, int]:
    assert frame is not None
    return frame.f_code, frame.f_lineno  # read while the frame is at the call


def test_a_warning_names_the_line_that_called_the_adaptor(adaptor: ModuleType) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        here = sys._getframe().f_lineno + 1
        adaptor.gather(functools.partial(_warn.warn_at_user, "emulated"))
    [w] = caught
    assert (w.filename, w.lineno) == (__file__, here)


def test_the_preflight_error_site_is_the_user_frame_above_the_adaptor(adaptor: ModuleType) -> None:
    with pytest.raises(RuntimeError) as raised:
        adaptor.fail()
    site = _user_frame(raised.value.__traceback__)
    assert site is not None and (site["filename"], site["name"]) == (
        __file__, "test_the_preflight_error_site_is_the_user_frame_above_the_adaptor")


def test_framework_layers_stay_and_a_module_prefix_is_a_package_not_a_string_prefix() -> None:
    before = _warn.adaptor_modules()
    try:
        _warn.set_adaptor_modules(("torch_npu",))
        assert _warn.adaptor_modules() == ("deepspeed.comm", "torch_npu")
        assert _warn._in("torch_npu.distributed.distributed_c10d", _warn.adaptor_modules())
        assert _warn._in("deepspeed.comm.torch", _warn.adaptor_modules())
        assert not _warn._in("torch_npu_helpers", _warn.adaptor_modules())
        assert not _warn._in("deepspeed.runtime.engine", _warn.adaptor_modules())
    finally:
        _warn.set_adaptor_modules(before)


def test_the_vendor_plugins_name_their_adaptors() -> None:
    from xccl_ascend import _plugin as ascend
    from xccl_sophgo import _plugin as sophgo

    assert {"torch_npu", "torchair", "xccl_ascend"} <= set(ascend.plugin.adaptor_modules())
    assert {"torch_tpu", "xccl_sophgo"} <= set(sophgo.plugin.adaptor_modules())
    assert Plugin().adaptor_modules() == ()
