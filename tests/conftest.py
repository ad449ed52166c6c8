"""The suite's own settings: what its ranks dump stays in a directory of the run, not in /tmp beside the user's;
which cases of a parametrized test belong to the second tier (``slow_cases``); namespaced hosts for the multi-host
tests (``make_hosts``)."""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The flight recorder is on by default and dumps at every typed fault, as torch's does (to /tmp/nccl_trace_rank_N
# unless told otherwise); the suite provokes faults on purpose. Set before any rank process starts, so that every
# rank of every pool inherits it; a test that dumps on purpose sets its own.
if not (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")):
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(tempfile.mkdtemp(prefix="xccl-tests-fr-"), "rank_")


# The two tiers. `make test` runs what is not marked `slow`; `make test-more` (CI, after `make test`) runs the `slow`
# tests and the frameworks. A parametrized test whose cases are not all alike marks the ones for the second tier
# with `@pytest.mark.slow_cases("id", ...)`, by their ids (fixture parameters included, as pytest shows them;
# fnmatch patterns such as "4ranks-*" allowed):
# the place to do it where `pytest.param(..., marks=...)` cannot reach (a case made of a fixture's parameter and
# the test's own). An id that matches no case is an error (unless the command line picks cases by node id), so
# that a renamed case does not silently move back to the first tier.
@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmatched: dict[str, set[str]] = {}
    for item in items:
        marker = item.get_closest_marker("slow_cases")
        if marker is None:
            continue
        key = item.nodeid.split("[", 1)[0]
        left = unmatched.setdefault(key, set(marker.args))
        spec = getattr(item, "callspec", None)
        matched = {p for p in marker.args if spec is not None and fnmatch.fnmatchcase(spec.id, p)}
        if matched:
            item.add_marker(pytest.mark.slow)
            left -= matched
    wrong = {k: sorted(v) for k, v in unmatched.items() if v}
    if wrong and not any("::" in str(arg) for arg in config.args):
        raise pytest.UsageError(f"slow_cases names cases that do not exist: {wrong}")


@pytest.fixture
def make_hosts(tmp_path: Path) -> Iterator[Callable[[int], Any]]:
    """``make_hosts(n)``: ``n`` namespaced hosts (tests/netns), torn down after the test (also when it fails); the
    test is skipped, with the reason, where network namespaces cannot be made (not root)."""
    from netns import Hosts, NetnsUnavailable, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    made: list[Any] = []

    def make(n: int) -> Any:
        hosts = Hosts(n, workdir=tmp_path / f"hosts{len(made)}")
        try:
            hosts.__enter__()
        except NetnsUnavailable as exc:
            pytest.skip(f"multi-host tests need network namespaces: {exc}")
        made.append(hosts)
        return hosts

    yield make
    problems = [p for h in made for p in h.teardown()]
    assert not problems, f"teardown left: {problems}"
