"""An entry-point target whose import fails, as a plugin with a missing dependency would."""

import xccl_testplugins_missing_dependency  # noqa: F401  # deliberately absent

plugin = None
