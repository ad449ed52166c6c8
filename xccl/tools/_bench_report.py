"""``xccl bench``'s output: the nccl-tests-style table, the summary of the raw comparison, and the plot."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Final, TextIO

from ._bench_config import BenchConfig

__all__ = ["TOLERANCE", "format_row", "plot", "print_header", "summarize"]

#: The band around 1.0 within which a ratio counts as parity in the summary (the goal for all_reduce).
TOLERANCE: Final = 0.05


def print_header(out: TextIO, op: str, result: dict[str, Any], cfg: BenchConfig) -> None:
    """The lines above an op's rows: how it runs, what raw calls, and the column names."""
    how = result["level"] + (f" via {result['via']}" if result["via"] else "")
    out.write(f"#\n# {op} ({how}); busbw factor {result['busbw_factor']:.4g}\n")
    if result["raw"]:
        raw = result["raw"]
        if result["raw_unavailable"]:
            raw += f": unavailable ({result['raw_unavailable']})"
        elif result["xccl_group"] == "raw":
            raw += "; xccl and raw on one communicator (the vendor's group, which xccl adopts)"
        else:
            raw += "; xccl on its world, raw on the vendor's group (two communicators)"
        out.write(f"# raw: {raw}\n")
    both = cfg.compare_raw and not result["raw_unavailable"]
    head = f"#{'size':>11} {'count':>11} {'type':>9}  {'time(us)':>10} {'algbw':>7} {'busbw':>7}"
    if both:
        out.write(f"#{'':33}  {'xccl':-^26}  {'raw torch.distributed':-^26}\n")
        head += f"  {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'ratio':>6}"
        if cfg.control:
            out.write(
                "# ratio: median over rounds of raw's time over xccl's (xccl's busbw over raw's), with its 95% "
                "CI;\n# A/A: the same for raw against a second raw call in the same round (the noise alone)\n"
            )
            head += f" {'95% CI':>11} {'A/A':>6} {'95% CI':>11}"
    out.write(head + "\n")


def _ci(ci: Sequence[float] | None) -> str:
    return "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"


def format_row(row: dict[str, Any], dtype: str) -> str:
    """One table line: size, count, type, then time/algbw/busbw per variant, the ratio, and the A/A control."""

    def cols(s: dict[str, float]) -> str:
        return f"{s['time_us']:>10.1f} {s['algbw_gbps']:>7.3f} {s['busbw_gbps']:>7.3f}"

    line = f"{row['size']:>12} {row['count']:>11} {dtype:>9}  {cols(row['xccl'])}"
    if "raw" in row:
        ratio = row.get("ratio")
        line += f"  {cols(row['raw'])} {ratio:>6.3f}" if ratio is not None else f"  {cols(row['raw'])} {'-':>6}"
    if "control" in row:
        aa = row["control"]
        aa_ratio = "-" if aa["ratio"] is None else f"{aa['ratio']:.3f}"
        line += f" {_ci(row['ratio_ci']):>11} {aa_ratio:>6} {_ci(aa['ratio_ci']):>11}"
    return line


def summarize(rows: Sequence[dict[str, Any]], tolerance: float = TOLERANCE) -> dict[str, Any] | None:
    """The raw comparison over every size: how many ratios are within ``tolerance`` of 1, for xccl and the A/A.

    A size is *within* when its median ratio is, and *resolved within* when its whole 95% confidence interval is
    (the noise was small enough to tell). None when no row has a raw comparison.
    """
    paired = [r for r in rows if r.get("ratio") is not None]
    if not paired:
        return None

    def side(ratios: list[float], cis: list[Sequence[float]]) -> dict[str, Any]:
        return {
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "within": sum(abs(x - 1) <= tolerance for x in ratios),
            "resolved_within": sum(1 - tolerance <= lo and hi <= 1 + tolerance for lo, hi in cis),
            "outside": [(r["size"], x) for r, x in zip(paired, ratios, strict=True) if abs(x - 1) > tolerance],
        }

    out: dict[str, Any] = {"sizes": len(paired), "tolerance": tolerance}
    out["xccl_vs_raw"] = side([r["ratio"] for r in paired], [r.get("ratio_ci", (0.0, 0.0)) for r in paired])
    if all(r.get("control", {}).get("ratio") is not None for r in paired):
        out["aa_control"] = side([r["control"]["ratio"] for r in paired], [r["control"]["ratio_ci"] for r in paired])
    return out


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as comment lines under the table."""
    tol, n = summary["tolerance"], summary["sizes"]

    def one(name: str, s: dict[str, Any]) -> str:
        return (
            f"# {name}: median {s['median_ratio']:.3f} (sizes range {s['min_ratio']:.3f} to {s['max_ratio']:.3f}); "
            f"{s['within']}/{n} sizes within {tol:.0%} of 1, {s['resolved_within']}/{n} with the whole 95% CI within"
        )

    lines = [one("xccl/raw", summary["xccl_vs_raw"])]
    if "aa_control" in summary:
        lines.append(one("A/A control (raw/raw)", summary["aa_control"]))
    return lines


def plot(doc: dict[str, Any], path: str) -> None:
    """Bus bandwidth against size, one line per op and variant (needs matplotlib)."""
    import matplotlib  # optional (the 'plot' extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for res in doc["results"]:
        rows = [r for r in res["rows"] if r["size"] > 0]
        if not rows:
            continue
        for variant in ("xccl", "raw"):
            pts = [(r["size"], r[variant]["busbw_gbps"]) for r in rows if variant in r]
            if pts:
                label = f"{res['op']} ({'xccl' if variant == 'xccl' else 'torch.distributed'})"
                ax.plot(
                    *zip(*pts, strict=True), marker="o", ms=3, label=label, linestyle="-" if variant == "xccl" else "--"
                )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    sim = " simulated" if doc["simulate"] else ""
    ax.set_title(
        f"xccl bench: {doc['plugin']}{sim} ({doc['backend']}), {doc['world_size']} ranks, {doc['config']['dtype']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
