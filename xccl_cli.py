"""The ``xccl`` console script: a shim outside the ``xccl`` package.

``import xccl`` imports torch, and on a node where torch's device-backend autoload is broken (torch_npu installed
without CANN) ``import torch`` itself fails. ``xccl doctor`` is the tool for exactly that node, so for ``doctor``
this shim turns autoload off *before* anything imports torch; doctor then tries ``import torch`` with autoload on
in a child process and explains the failure. Every other subcommand runs in the environment as it is.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Entry point of the ``xccl`` command."""
    if sys.argv[1:2] == ["doctor"] and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        # Tell doctor the variable was not the user's, so it reports autoload as the user's shell has it.
        os.environ["XCCL_DOCTOR_AUTOLOAD_SET_BY_SHIM"] = "1"
    try:
        from xccl.tools.cli import main as cli_main
    except RuntimeError as exc:  # xccl.UnsupportedTorch (below xccl's torch floor): one line, not a traceback
        if type(exc).__name__ != "UnsupportedTorch":  # its class is unreachable: importing xccl is what failed
            raise
        print(f"xccl: {exc}", file=sys.stderr)
        return 2
    return cli_main()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
