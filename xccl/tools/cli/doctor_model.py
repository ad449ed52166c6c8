"""What ``xccl doctor`` reports: one :class:`Finding` per check, gathered in a :class:`Report`, rendered as text.

Shared by the node checks (``doctor_checks``, ``doctor_node``) and ``xccl doctor --world`` (``doctor_world``),
which sends each rank's report to rank 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, final

__all__ = ["DEFAULT_TIMEOUT", "MARK", "Finding", "Report", "Status", "render"]

#: ``ok``, ``info`` (nothing to judge), ``warn`` (works, but probably not as meant) or ``fail``.
Status = Literal["ok", "info", "warn", "fail"]
#: How each status is printed, four characters wide.
MARK: Final = {"ok": "ok  ", "info": "--  ", "warn": "WARN", "fail": "FAIL"}
#: Seconds rank 0 of ``xccl doctor --world`` waits for every rank to answer (``--timeout``). Here rather than in
#: ``doctor_world``, which imports torch, so that ``xccl doctor --help`` can print it without importing torch.
DEFAULT_TIMEOUT: Final = 60.0


@final
@dataclass(frozen=True, slots=True)
class Finding:
    """One check's result."""

    #: Section heading (``torch``, ``plugins``, ...).
    section: str
    #: What was checked (a package, a plugin, a variable).
    name: str
    #: ``ok``, ``info`` (nothing to judge), ``warn`` (works, but probably not as meant) or ``fail``.
    status: Status
    #: One sentence: what was found.
    summary: str
    #: What to do about it (empty when nothing is to be done).
    fix: str = ""
    #: Details (versions, paths, values).
    facts: Mapping[str, str] = field(default_factory=dict)


@final
@dataclass(frozen=True, slots=True)
class Report:
    """Every finding, and the plugin ``xccl.init`` would select (None when it cannot select one)."""

    findings: tuple[Finding, ...]
    selected: str | None

    @property
    def ok(self) -> bool:
        """Whether nothing failed (the exit status is 0)."""
        return not any(f.status == "fail" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "selected": self.selected,
            "findings": [{**asdict(f), "facts": dict(f.facts)} for f in self.findings],
        }



def render(report: Report) -> str:
    """The report as text, one block per section."""
    lines: list[str] = []
    section = ""
    for f in report.findings:
        if f.section != section:
            section = f.section
            lines.append(f"\n{section}")
        lines.append(f"  {MARK[f.status]}  {f.name}: {f.summary}")
        if f.fix:
            lines.append(f"        fix: {f.fix}")
        if f.facts:
            lines.append("        " + ", ".join(f"{k}={v}" for k, v in f.facts.items()))
    fails = [f for f in report.findings if f.status == "fail"]
    if fails:
        lines.append(f"\n{len(fails)} problem(s) stop xccl here: {', '.join(f'{f.section}/{f.name}' for f in fails)}")
    else:
        lines.append(f"\nxccl can run here with plugin {report.selected!r}")
    return "\n".join(lines).lstrip("\n")
