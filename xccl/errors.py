"""Every error xccl raises, and the two warnings it issues.

One flat hierarchy, at most two levels deep: ``XcclError`` and its direct subclasses. Each error keeps its
context as attributes (which op, which backend, which file) and its message says what was wrong, where, and
what to do about it. Errors that describe bad input also derive from the builtin ``torch.distributed`` raises for
the same input (``ValueError``, ``TypeError``, ``RuntimeError``), and their message contains torch's, so that code
written against ``torch.distributed`` keeps catching them. :class:`InvalidArgumentType` is the one third level:
the ``TypeError`` twin of :class:`InvalidArgument`, so that ``except xccl.InvalidArgument`` still catches it.

The warnings live here too, under public names (``xccl.EmulationWarning``, ``xccl.ConstraintFallbackWarning``),
so that a ``filterwarnings`` line or a ``warnings.simplefilter`` call names them without a private module path.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BackendNotFound",
    "BackendUnavailable",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConstraintFallbackWarning",
    "ConstraintViolation",
    "EmulationWarning",
    "InitError",
    "InvalidArgument",
    "InvalidArgumentType",
    "MissingExtra",
    "PeerFailure",
    "PluginContractError",
    "RankTableError",
    "RendezvousTimeout",
    "UnsupportedCollective",
    "UnsupportedTorch",
    "XcclError",
]


class XcclError(Exception):
    """Base class of every error raised by xccl."""


class InitError(XcclError, ValueError):
    """``xccl.init`` cannot proceed: bad environment, conflicting re-initialisation, no process group yet.

    Also a ``ValueError``, as torch.distributed's own refusals to initialise twice or to run a collective before
    ``init_process_group``.
    """


class BackendNotFound(XcclError, LookupError):
    """No plugin of that name was discovered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name: Final = name
        self.known: Final = tuple(known)
        super().__init__(
            f"no xccl plugin named {name!r}; discovered: {', '.join(known) or 'none'}. "
            "Install the plugin's distribution (e.g. `pip install xccl-ascend`) or pick one of those listed; "
            "`xccl doctor` shows every plugin and why it is or is not available."
        )


class BackendUnavailable(XcclError):
    """A plugin exists but cannot run here; ``reason`` says why and ``fix`` what to do (``backend``: the plugin's
    name)."""

    def __init__(self, backend: str, reason: str, fix: str = "") -> None:
        self.backend: Final = backend
        self.reason: Final = reason
        self.fix: Final = fix
        msg = f"xccl plugin {backend!r} is unavailable: {reason}"
        super().__init__(f"{msg}. Fix: {fix}" if fix else msg)


class MissingExtra(XcclError, ImportError):
    """A feature needs an optional dependency that is not installed (``xccl preflight --png`` needs matplotlib).

    Attributes: ``package`` (what cannot be imported), ``extra`` (xccl's extra that installs it), ``feature`` (what
    asked for it) and ``fix`` (the install command).
    """

    def __init__(self, package: str, extra: str, feature: str) -> None:
        self.package: Final = package
        self.extra: Final = extra
        self.feature: Final = feature
        self.fix: Final = f"pip install 'xccl[{extra}]'"
        super().__init__(f"{feature} needs {package}, which is not installed (xccl's {extra!r} extra). Fix: {self.fix}")


class PluginContractError(XcclError, TypeError):
    """The selected plugin does not implement the plugin contract as xccl calls it (checked by ``xccl.init``).

    Raised before any process group exists, identically on every rank, with one line per problem: which
    attribute or method, what is wrong, and what to write instead.
    """

    def __init__(self, plugin: str, problems: list[str]) -> None:
        self.plugin: Final = plugin
        self.problems: Final = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"xccl plugin {plugin!r} does not implement the plugin contract "
                         f"(docs/plugin-guide.md):\n{lines}")


class UnsupportedCollective(XcclError, RuntimeError):
    """The selected plugin cannot run this collective (natively, or emulated under the fallback policy).

    ``backend`` holds the plugin's name (the attribute predates the plugin/backend vocabulary).

    Also a ``RuntimeError``, as what torch.distributed's backends raise for an op they lack, so that code written
    for torch.distributed keeps catching it.
    """

    def __init__(self, op: str, backend: str, detail: str) -> None:
        self.op: Final = op
        self.backend: Final = backend
        self.detail: Final = detail
        super().__init__(f"{op} is not supported on {backend}: {detail}")


class UnsupportedTorch(XcclError, RuntimeError):
    """The installed torch is too old for xccl (``feature`` is ``"xccl"``) or for one of its features (``feature``
    names it): ``needs`` is the first torch release that has what it stands on, ``installed`` the torch found, and
    ``why`` what that release has."""

    def __init__(self, feature: str, needs: str, installed: str, why: str) -> None:
        self.feature: Final = feature
        self.needs: Final = needs
        self.installed: Final = installed
        self.why: Final = why
        super().__init__(f"{feature} needs torch >= {needs}, and torch {installed} is installed: {why}. Install "
                         f"torch {needs} or newer (xccl supports 2.7 to 2.14; docs/quickstart.md)")


class ConstraintViolation(XcclError, ValueError):
    """A vendor kernel's documented constraint does not hold for these arguments (``backend``: the plugin's name)."""

    def __init__(self, op: str, backend: str, constraint: str, detail: str) -> None:
        self.op: Final = op
        self.backend: Final = backend
        self.constraint: Final = constraint
        self.detail: Final = detail
        super().__init__(f"{op} on {backend} violates constraint {constraint!r}: {detail}")


class InvalidArgument(XcclError, ValueError):
    """A collective was called with arguments every rank can see are wrong (dtype, device, shape, sizes)."""

    def __init__(self, op: str, detail: str) -> None:
        self.op: Final = op
        self.detail: Final = detail
        super().__init__(f"{op}: {detail}")


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type (not a tensor, not a list of tensors, a timeout that is not a ``timedelta``):
    an :class:`InvalidArgument` that is also a ``TypeError``, which is what torch.distributed raises for these."""


class RankTableError(XcclError, ValueError):
    """A rank table file is missing, unreadable or malformed."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path: Final = path
        self.field: Final = field
        self.problem: Final = problem
        super().__init__(f"rank table {path}: {field}: {problem}")


class _FaultError(XcclError):
    """Shared shape of the runtime faults: who saw it, in which op and group, after how long, and (where known) the
    global ranks at fault."""

    def __init__(self, message: str, *, rank: int, op: str, group: str, elapsed: float,
                 ranks: tuple[int, ...] = ()) -> None:
        self.rank: Final = rank
        self.op: Final = op
        self.group: Final = group
        self.elapsed: Final = elapsed
        #: Global ranks at fault, where known (``monitored_barrier``: those that did not arrive in time).
        self.ranks: Final = tuple(ranks)
        super().__init__(f"rank {rank}, {op} on group {group!r} after {elapsed:.1f}s: {message}")


class PeerFailure(_FaultError):
    """A peer of the group died or closed its connection during a collective."""


class CollectiveTimeout(_FaultError):
    """A collective did not complete within the timeout: a peer is silent or called something else."""


class RendezvousTimeout(XcclError):
    """Not every rank joined the process group before the timeout."""

    def __init__(self, message: str, *, rank: int, world_size: int, elapsed: float) -> None:
        self.rank: Final = rank
        self.world_size: Final = world_size
        self.elapsed: Final = elapsed
        super().__init__(f"rank {rank} of {world_size}: rendezvous did not complete after {elapsed:.1f}s: {message}")


class CollectiveMismatch(XcclError):
    """Ranks of one group called different collectives (op, shape, dtype, root...) at the same step."""

    def __init__(self, message: str, *, group: str, calls: dict[int, str]) -> None:
        self.group: Final = group
        self.calls: Final = dict(calls)
        lines = "\n".join(f"  rank {r}: {c}" for r, c in sorted(calls.items()))
        super().__init__(f"collective mismatch on group {group!r}: {message}\n{lines}")


class EmulationWarning(UserWarning):
    """A collective runs as an emulation on this plugin (warned once per op and plugin, under ``fallback="warn"``).

    Silence it with ``fallback="emulate"``, or ``warnings.filterwarnings("ignore", category=xccl.EmulationWarning)``.
    """


class ConstraintFallbackWarning(UserWarning):
    """A native fused kernel refused the call (a documented constraint failed); the portable version ran instead.

    Issued under ``fallback="warn"``, once per op, plugin and constraint.
    """
