"""The suite's own settings: what its ranks dump stays in a directory of the run, not in /tmp beside the user's."""

from __future__ import annotations

import os
import tempfile

# The flight recorder is on by default and dumps at every typed fault, as torch's does (to /tmp/nccl_trace_rank_N
# unless told otherwise); the suite provokes faults on purpose. Set before any rank process starts, so that every
# rank of every pool inherits it; a test that dumps on purpose sets its own.
if not (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")):
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(tempfile.mkdtemp(prefix="xccl-tests-fr-"), "rank_")
