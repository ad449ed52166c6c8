"""``python -m xccl`` is the ``xccl`` command."""

import sys

from .cli import main

sys.exit(main())
