"""Is Sophgo's torch_tpu here, and are there TPUs? Answered without importing any SDK.

Two unrelated products install a package importable as ``torch_tpu``: Sophgo's torch-tpu (from Sophgo's release)
and Google's TorchTPU (the PyPI wheel ``torch-tpu``). Importing either has side effects (Google's autoloads into
torch and claims the ``tpu`` device; Sophgo's loads its runtime libraries), so the probe tells them apart from
what is on disk: the distribution's metadata first, the package's file layout second. After import,
:mod:`xccl_sophgo._torch_tpu` checks again by ``ProcessGroupSCCLOptions``.
"""

from __future__ import annotations

import enum
import glob
import importlib.machinery
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final, final

from xccl.plugin import ProbeResult

__all__ = ["DEVICE_GLOBS", "Flavour", "Installation", "find_torch_tpu", "probe", "tpu_device_nodes"]

#: Device nodes of Sophgo's drivers: ``bm-sophon<N>`` (libsophon PCIe driver) and ``bm-tpu<N>`` (the name
#: Sophgo's bmlib ``bm_dev_query`` falls back to).
DEVICE_GLOBS: Final = ("bm-sophon[0-9]*", "bm-tpu[0-9]*")
#: Set to 1 to accept a Sophgo torch_tpu without device nodes (Sophgo's CMODEL mode emulates chips in software).
NO_DEVICE_ENV: Final = "XCCL_SOPHGO_ALLOW_NO_DEVICES"

_SOPHGO_RELEASE: Final = (
    "install Sophgo's torch-tpu wheel from Sophgo's release (https://github.com/sophgo/torch-tpu, or Sophgo's "
    "SDK / docker image), not `pip install torch-tpu`, which is Google's TorchTPU"
)


class Flavour(str, enum.Enum):
    """Which product an installed ``torch_tpu`` is."""

    SOPHGO = "sophgo"
    GOOGLE = "google"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@final
@dataclass(frozen=True, slots=True)
class Installation:
    """An installed ``torch_tpu`` package, as found on disk."""

    flavour: Flavour
    #: Where the package lives.
    location: str
    #: ``name version`` of the distribution that installed it, or ``""`` (e.g. a source tree on ``PYTHONPATH``).
    distribution: str
    #: What gave the flavour away, for messages.
    evidence: str


def find_torch_tpu(path: Sequence[str] | None = None) -> Installation | None:
    """Find an importable ``torch_tpu`` and tell whose it is, without importing it.

    Args:
        path: directories to search instead of ``sys.path`` (a test seam).

    Returns:
        The installation, or None if ``import torch_tpu`` would fail with ModuleNotFoundError.
    """
    search = None if path is None else list(path)
    spec = importlib.machinery.PathFinder.find_spec("torch_tpu", search)
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    location = locations[0] if locations else str(spec.origin or "")
    dist = _distribution(search)
    if dist is not None:
        flavour, evidence = _classify_metadata(dist)
        if flavour is not Flavour.UNKNOWN:
            return Installation(flavour, location, _name_version(dist), evidence)
    flavour, evidence = _classify_layout(Path(location))
    return Installation(flavour, location, "" if dist is None else _name_version(dist), evidence)


def _distribution(path: list[str] | None) -> metadata.Distribution | None:
    """The installed distribution whose files include the ``torch_tpu`` package (whatever its name)."""
    for dist in metadata.distributions(path=path) if path is not None else metadata.distributions():
        top = (dist.read_text("top_level.txt") or "").split()
        if "torch_tpu" in top or any(str(f).startswith("torch_tpu/") for f in (dist.files or ())[:200]):
            return dist
    return None


def _name_version(dist: metadata.Distribution) -> str:
    return f"{_field(dist.metadata, 'Name') or '?'} {dist.version}"


def _field(meta: metadata.PackageMetadata, key: str) -> str:
    """The first value of a metadata field, or ``""`` (indexing a missing key is deprecated)."""
    values = meta.get_all(key)
    return str(values[0]) if values else ""


def _classify_metadata(dist: metadata.Distribution) -> tuple[Flavour, str]:
    meta = dist.metadata
    fields = ("Author", "Author-email", "Home-page", "Summary", "Maintainer", "Maintainer-email")
    text = " ".join(_field(meta, k) for k in fields)
    text += " " + " ".join(meta.get_all("Project-URL") or [])
    lowered = text.lower()
    # Sophgo's setup.py: author "sophgo", url github.com/sophgo/torch-tpu. Google's 0.2.0 METADATA: Home-page
    # github.com/google-pytorch/torch_tpu, Requires-Dist libtpu.
    if "sophgo" in lowered:
        return Flavour.SOPHGO, "its metadata names Sophgo"
    requires = [r.split(";")[0].strip().lower() for r in (meta.get_all("Requires-Dist") or [])]
    if "google" in lowered or any(r.startswith("libtpu") for r in requires):
        url = _field(meta, "Home-page") or "requires libtpu"
        return Flavour.GOOGLE, f"its metadata points to Google ({url})"
    return Flavour.UNKNOWN, "its metadata names neither Sophgo nor Google"


def _classify_layout(location: Path) -> tuple[Flavour, str]:
    # Sophgo's package has the tpu/ device module and ships libsccl.so; Google's has the autoload _loader.py.
    if (location / "tpu" / "utils.py").is_file() or (location / "lib" / "libsccl.so").is_file():
        return Flavour.SOPHGO, f"{location} has Sophgo's layout (tpu/utils.py or lib/libsccl.so)"
    if (location / "_loader.py").is_file():
        return Flavour.GOOGLE, f"{location} has Google's layout (_loader.py)"
    return Flavour.UNKNOWN, f"neither its metadata nor its files at {location} identify it"


def tpu_device_nodes(dev_dir: str = "/dev") -> list[str]:
    """Sophgo TPU device nodes present under ``dev_dir``, sorted."""
    found: set[str] = set()
    for pattern in DEVICE_GLOBS:
        found.update(glob.glob(os.path.join(glob.escape(dev_dir), pattern)))
    return sorted(found)


def probe(path: Sequence[str] | None = None, dev_dir: str = "/dev") -> ProbeResult:
    """The plugin's probe: Sophgo's torch_tpu installed, and TPU device nodes present.

    Args:
        path: where to look for ``torch_tpu`` instead of ``sys.path`` (a test seam).
        dev_dir: where device nodes live (a test seam).
    """
    found = find_torch_tpu(path)
    if found is None:
        return ProbeResult.unavailable("Sophgo's torch_tpu is not installed", _SOPHGO_RELEASE)
    facts = {"torch_tpu": found.location, "flavour": str(found.flavour), "evidence": found.evidence}
    if found.distribution:
        facts["distribution"] = found.distribution
    if found.flavour is Flavour.GOOGLE:
        what = found.distribution or "a torch_tpu package"
        return ProbeResult.unavailable(
            f"the installed torch_tpu ({what} at {found.location}) is Google's TorchTPU, not Sophgo's: "
            f"{found.evidence}; it has no SCCL backend",
            f"uninstall it (`pip uninstall torch-tpu`) and {_SOPHGO_RELEASE}",
            **facts,
        )
    arch = os.environ.get("CHIP_ARCH")
    if arch:
        facts["CHIP_ARCH"] = arch
    nodes = tpu_device_nodes(dev_dir)
    facts["devices"] = str(len(nodes))
    if not nodes and os.environ.get(NO_DEVICE_ENV, "0").strip() not in ("", "0", "false"):
        return ProbeResult.ok(**facts, note=f"no device nodes; accepted because {NO_DEVICE_ENV} is set")
    if not nodes:
        patterns = ", ".join(os.path.join(dev_dir, p) for p in DEVICE_GLOBS)
        return ProbeResult.unavailable(
            f"torch_tpu is installed but no Sophgo TPU device node is present ({patterns})",
            "install Sophgo's driver (libsophon; `bm-smi` lists the cards) and, in a container, pass "
            f"--device=/dev/bm-sophonN and --device=/dev/bmdev-ctl; for Sophgo's CMODEL mode set {NO_DEVICE_ENV}=1; "
            "to try xccl without TPUs use XCCL_SIMULATE=sophgo",
            **facts,
        )
    return ProbeResult.ok(**facts)
