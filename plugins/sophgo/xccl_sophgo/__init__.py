"""xccl plugin for Sophgo TPUs: SCCL through Sophgo's torch_tpu, and its CPU simulation.

Selected by ``xccl.init(vendor="sophgo")`` (or automatically where it is the one available accelerator);
``xccl.init(vendor="sophgo", simulate=True)`` or ``XCCL_SIMULATE=sophgo`` runs the same code on CPU. Importing
this package imports no SDK.
"""

from ._plugin import SophgoPlugin, plugin

__all__ = ["SophgoPlugin", "plugin"]
