"""``xccl doctor --first-hour``: the lost-rank checks only the hardware can answer, as one command that writes a report.

Run on one node of the machine in question (docs/elastic.md, "The first hour"); it starts its own ranks, one per
device, as plain processes (``xccl.testing.RankPool``), in three rounds, each a fresh world:

1. ``silent``: xccl's health watch off, rank ``--lose`` (1 by default: not the last) ends; each survivor runs an
   all_reduce and synchronises (``.item()``) in a thread and says what reached it, and when, within ``--bound``
   seconds. On Sophgo this answers first whether anything bounds a missing peer; on Ascend it shows EI0002 after
   ``HCCL_EXEC_TIMEOUT`` (or nothing, within the bound).
2. ``shrink``: the watch on; the same loss; each survivor records the exception its failed step raised (type, ranks,
   seconds), is still alive ``--alive-after`` seconds later, then times ``dist.shrink_group(err.ranks)`` (or its
   refusal), checks the new world's all_reduce and the device's memory in use before and after.
3. ``shrink_abort``: the same with ``SHRINK_ABORT``.

The report (JSON, ``--report``) holds every survivor's answers and ``not_checked``: what this run could not tell
(in simulation, all that only the hardware decides). ``tests/test_doctor_first_hour.py`` runs it in simulation.
"""

from __future__ import annotations

import json
import platform
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from ...collectives._health._ending import EXIT_CODE

__all__ = ["ROUNDS", "first_hour", "render_hour"]

ROUNDS: Final = ("silent", "shrink", "shrink_abort")


def _used(device: Any) -> int | None:
    """Bytes in use on ``device`` (its module's ``mem_get_info``: free and total), None where it cannot be read."""
    import torch

    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    try:
        free, total = module.mem_get_info() if module is not None else (None, None)
    except (AttributeError, RuntimeError):
        return None
    return None if free is None or total is None else int(total) - int(free)


def _outcome(exc: BaseException | None, started: float) -> dict[str, Any]:
    return {"seconds": round(time.monotonic() - started, 3), "type": type(exc).__name__ if exc else "",
            "ranks": list(getattr(exc, "ranks", ()) or ()), "message": str(exc).splitlines()[0][:300] if exc else ""}


def _bounded(step: Callable[[], None], bound: float) -> dict[str, Any]:
    """``step`` run in a thread (a synchronisation may never return): what it raised within ``bound`` seconds."""
    done, box = threading.Event(), list[BaseException | None]()
    started = time.monotonic()

    def run() -> None:
        try:
            step()
            box.append(None)
        except BaseException as exc:  # what the loss surfaced as: the answer
            box.append(exc)
        done.set()

    threading.Thread(target=run, name="xccl-first-hour", daemon=True).start()
    if not done.wait(bound):
        return {"seconds": bound, "type": "", "ranks": [], "message": f"nothing within {bound:g} s"}
    return _outcome(box[0], started)


def body(round_: str, victim: int, bound: float, alive_after: float) -> dict[str, Any]:
    """One rank's part of a round (run by the pool in every rank)."""
    import os

    import torch
    import torch.distributed as dist

    import xccl

    world = xccl.get_world()
    t = torch.ones(1, device=world.device)
    xccl.all_reduce(t)
    before = _used(world.device)
    if world.rank == victim:
        os._exit(1)  # the lost rank ends without a word
    time.sleep(0.2)

    def step() -> None:
        xccl.all_reduce(t)
        t.item()  # synchronise: on a device, what the collective met surfaces here

    seen = _bounded(step, bound)
    out: dict[str, Any] = {"rank": world.rank, "failed_step": seen, "memory_before": before}
    lost = seen["ranks"]
    if round_ != "silent" and not lost and seen["type"]:
        # On a device the sentinel's abort (Ascend's stop_device) fails the synchronisation with the vendor's own
        # error; the verdict is then the next call's, raised before it communicates.
        out["next_call"] = _bounded(lambda: xccl.all_reduce(t), bound)
        lost = out["next_call"]["ranks"]
    if round_ == "silent" or not lost:
        return out
    time.sleep(alive_after)
    out["alive_after"] = alive_after
    started = time.monotonic()
    try:  # torch before 2.10 has neither: the AttributeError is the answer
        flags = dist.distributed_c10d.SHRINK_ABORT if round_ == "shrink_abort" else 0
        dist.shrink_group(list(lost), shrink_flags=flags)
    except Exception as refused:
        out["shrink"] = _outcome(refused, started)
        return out
    out["shrink"] = _outcome(None, started)
    new = xccl.get_world()
    t = torch.ones(1, device=new.device)
    xccl.all_reduce(t)
    out["new_world"] = {"rank": new.rank, "size": new.world_size, "all_reduce": t.item(),
                        "right": t.item() == new.world_size, "memory_after": _used(new.device)}
    return out


def first_hour(vendor: str, *, simulate: bool, world: int = 4, victim: int = 1, bound: float = 120.0,
               alive_after: float = 90.0, report: Path | None = None, env: Mapping[str, str] | None = None
               ) -> dict[str, Any]:
    """Run the rounds and return (and write to ``report``) what every survivor saw."""
    import torch

    import xccl
    from xccl.testing import RankPool

    base = {("XCCL_SIMULATE" if simulate else "XCCL_VENDOR"): vendor, **(env or {})}
    rounds: dict[str, Any] = {}
    for name in ROUNDS:
        quiet = {"XCCL_HEALTH_DEADLINE": "0"} if name == "silent" else {}
        pool = RankPool(world, {"timeout": 300}, env={**base, **quiet}, start_method="forkserver", start_timeout=300)
        with pool:
            outs = pool.run(body, name, victim, bound, alive_after, timeout=bound + alive_after + 300)
        rounds[name] = [o.value if o.ok else {"rank": o.rank, "error": str(o).splitlines()[0]}
                        for o in outs if o.rank != victim]
    out = {"vendor": vendor, "simulated": simulate, "world": world, "lost": victim, "host": platform.node(),
           "torch": torch.__version__, "xccl": xccl.__version__, "rounds": rounds,
           "not_checked": _not_checked(simulate, rounds)}
    if report is not None:
        report.write_text(json.dumps(out, indent=2) + "\n")
    return out


def _not_checked(simulate: bool, rounds: Mapping[str, Any]) -> list[str]:
    gaps = []
    if simulate:
        gaps.append("everything the vendor decides: this is xccl's simulation of it; run without --simulate on the "
                    "hardware and send the report")
    if not any(r.get("memory_before") is not None for rs in rounds.values() for r in rs):
        gaps.append("device memory: this device type has no mem_get_info")
    if not any("shrink" in r for rs in rounds.values() for r in rs):
        gaps.append("the shrink: no survivor was told of the loss within the bound")
    return gaps


def render_hour(result: Mapping[str, Any]) -> str:
    """The report, one line per survivor and round."""
    lines = [f"xccl doctor --first-hour: {result['vendor']}{' (simulated)' if result['simulated'] else ''}, world "
             f"{result['world']}, rank {result['lost']} lost"]
    for name, ranks in result["rounds"].items():
        for r in ranks:
            if "error" in r:
                ended = f"exit code {EXIT_CODE}" in r["error"]  # a vendor without an abort: xccl's end, as documented
                lines.append(f"  {name:<13} rank {r['rank']}: "
                             + (f"ended itself (exit code {EXIT_CODE}) after the loss" if ended else r["error"]))
                continue
            seen, shrink = r["failed_step"], r.get("shrink")
            heard = f"{seen['type']} after {seen['seconds']:g} s" if seen["type"] else seen["message"]
            line = f"  {name:<13} rank {r['rank']}: {heard}"
            if "next_call" in r:  # the synchronisation failed with the vendor's own error (the sentinel's abort)
                nxt = r["next_call"]
                line += f"; next call: {nxt['type'] or 'returned'} after {nxt['seconds']:g} s"
            if shrink is not None:
                line += f"; shrink {shrink['type'] or 'done'} in {shrink['seconds']:g} s"
            if "new_world" in r:
                line += f"; new world all_reduce {'right' if r['new_world']['right'] else 'WRONG'}"
            lines.append(line)
    lines += [f"  not checked: {gap}" for gap in result["not_checked"]]
    return "\n".join(lines)
