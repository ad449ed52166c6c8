"""xccl-template: the xccl plugin for Example Devices (templatecl through torch_template), and its CPU simulation.

``xccl.init(vendor="template")`` selects it on a host with the SDK and a device; ``XCCL_SIMULATE=template`` (or
``xccl.init(vendor="template", simulate=True)``) runs the same code path on CPU with the library's rules enforced.
Importing this package imports no SDK: xccl imports it on every machine, to list and probe it.
"""

from ._plugin import TemplatePlugin, plugin

__all__ = ["TemplatePlugin", "plugin"]
