"""Test support for xccl and its plugins: a pool of live rank processes, and the conformance suite.

``RankPool`` runs test bodies on real processes over a real process group. The pytest plugin
(:mod:`xccl.testing.plugin`, registered through the ``pytest11`` entry point) provides the ``rank_pools`` fixture.
"""

from ._pool import Outcome, RankPool, all_here, free_port

__all__ = ["Outcome", "RankPool", "all_here", "free_port"]
