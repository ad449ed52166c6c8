"""``python -m xccl`` is the ``xccl`` command."""

import sys

from .tools.cli import main

sys.exit(main())
