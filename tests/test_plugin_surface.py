"""The plugin SDK's surface: every name ``xccl.plugin`` exports is documented in the plugin guide, and so is every
field of ``SimProfile`` and every identity attribute of ``Plugin``; the warnings xccl issues have public names.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import xccl
import xccl.plugin
from xccl.plugin import Plugin, SimProfile

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "plugin-guide.md").read_text()


def _documented(name: str) -> bool:
    return re.search(rf"`{re.escape(name)}[`(.\[ ]", GUIDE) is not None


@pytest.mark.parametrize("name", xccl.plugin.__all__)
def test_every_exported_name_is_in_the_plugin_guide(name: str) -> None:
    assert _documented(name), f"xccl.plugin.{name} is exported but docs/plugin-guide.md never names it"


def test_sim_profile_is_documented_field_by_field() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", GUIDE.split("| `SimProfile` field |", 1)[1], re.M))
    assert {f.name for f in dataclasses.fields(SimProfile)} <= rows


def test_plugin_identity_attributes_are_documented() -> None:
    attrs = {k for k in vars(Plugin) if not k.startswith("_") and not callable(getattr(Plugin, k))}
    assert attrs == {"name", "vendor", "device_type", "backend", "accelerator", "visible_devices_env", "sdk_packages",
                     "api_version"}
    rows = set(re.findall(r"^\| `(\w+)` \|", GUIDE, re.M))
    assert attrs <= rows


def test_the_warnings_have_public_names() -> None:
    from xccl.collectives._dispatch import EmulationWarning
    from xccl.fused._api import ConstraintFallbackWarning

    assert xccl.EmulationWarning is EmulationWarning and xccl.ConstraintFallbackWarning is ConstraintFallbackWarning
    assert {"EmulationWarning", "ConstraintFallbackWarning"} <= set(xccl.__all__)
    assert '"ignore::xccl.EmulationWarning"' in (ROOT / "pyproject.toml").read_text()
    assert "xccl.ConstraintFallbackWarning" in (ROOT / "docs" / "fused.md").read_text()
