"""pytest plugin: session-wide pools of live rank processes, and the conformance suite's options.

Registered through the ``pytest11`` entry point, so any test suite in an environment with xccl installed can
ask for ``rank_pools`` and get ``rank_pools.get(world_size, **init_kwargs)``: a started :class:`RankPool`, shared
by every test that asks for the same configuration.

``pytest --xccl-plugin NAME [--xccl-simulate]`` runs the conformance suite (:mod:`xccl.testing.conformance`)
against the installed plugin ``NAME``: its module is added to the session's arguments, so it is collected like any
test file named on the command line (``-k``, ``-m``, ``-x``, ``--collect-only`` work as usual).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest

from ._pool import RankPools

__all__ = ["RankPools"]

# Before anything imports it: the suite's asserts then report values, in whichever module binds the suite.
pytest.register_assert_rewrite("xccl.testing.conformance")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The conformance suite's command-line options."""
    group = parser.getgroup("xccl", "xccl plugin conformance")
    group.addoption("--xccl-simulate", action="store_true", default=False,
                    help="with --xccl-plugin: run the ranks in xccl's CPU simulation of the vendor")
    for flag, metavar, text in (
        ("--xccl-plugin", "NAME",
         "run xccl's conformance suite against the installed plugin NAME (its entry-point name)"),
        ("--xccl-world-sizes", "N,M", "world sizes of the conformance suite's multi-rank checks (default: 2,4)"),
        ("--xccl-compile-backend", "BACKEND", "torch.compile backend of the graph-mode checks (default: aot_eager)"),
    ):
        group.addoption(flag, metavar=metavar, default=None, help=text)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """With ``--xccl-plugin``: collect the conformance suite (only it, unless paths were given)."""
    if not config.getoption("xccl_plugin", None):
        return
    raw = config.getoption("xccl_world_sizes", None)
    if raw:
        from .conformance import parse_world_sizes  # raises UsageError early, before any rank starts

        parse_world_sizes(raw)
    spec = importlib.util.find_spec("xccl.testing.conformance")
    if spec is None or spec.origin is None:  # pragma: no cover - part of this very package
        raise pytest.UsageError("xccl.testing.conformance is missing from this xccl installation")
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        config.args[:] = [spec.origin]  # no paths given: testpaths or the current directory would run too
    elif spec.origin not in config.args:
        config.args.append(spec.origin)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the suite's ``xccl_world_size`` from the suite class or ``--xccl-world-sizes``."""
    if "xccl_world_size" not in metafunc.fixturenames:
        return
    from .conformance import _sizes_option

    sizes = getattr(metafunc.cls, "xccl_world_sizes", None) or _sizes_option(metafunc.config)
    metafunc.parametrize("xccl_world_size", list(sizes), ids=[f"{n}ranks" for n in sizes])


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[RankPools]:
    """Session-wide :class:`RankPools`."""
    with contextlib.closing(RankPools()) as pools:
        yield pools
