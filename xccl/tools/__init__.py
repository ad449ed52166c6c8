"""Tools: the ``xccl`` command, the benchmark driver and the capability-table rendering."""
