"""Subcommands of the ``xccl`` command, one module each (see ``xccl/cli.py``)."""
