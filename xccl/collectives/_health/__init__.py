"""A group's health, apart from what its backend reports: who each rank is (``_facts``), whether a peer's process
lives (``_liveness``: the liveness ports, and the one verdict every survivor shares), and the watch that looks when a
call has waited past a short deadline (``_watch``, a hook of the call pipeline)."""
