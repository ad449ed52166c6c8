"""An example xccl plugin: everything a vendor backend needs, over gloo so that it runs anywhere.

Importing this package imports no SDK (xccl imports it at discovery, on every machine, to list and probe it).
"""

from ._plugin import TemplatePlugin, plugin

__all__ = ["TemplatePlugin", "plugin"]
