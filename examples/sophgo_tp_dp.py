"""Tensor- x data-parallel groups on one Sophgo node: does SCCL compute right on sub-groups?

xccl gives every group the node's whole chip map, as Sophgo's own code builds them (docs/vendors/sophgo.md). How
libsccl reads a sub-group's map is not published, so this checks it on the chips: with 8 ranks on the SG2260 ring
0-2-6-7-3-1-5-4, the tensor-parallel groups of 4 drive chips 0, 2, 6, 7 and 3, 1, 5, 4 (no ring of their own), and
the data-parallel pairs chips that are not linked. Each group all_reduces, all_gathers (in group-rank order: a rank
put on the wrong chip shows as a wrong order) and broadcasts from its last member, in three dtypes; a wrong value
raises, and every rank prints one line per group::

    RANK_TABLE_FILE=rank_table.json torchrun --standalone --nproc-per-node 8 examples/sophgo_tp_dp.py   # TPUs
    XCCL_SIMULATE=sophgo torchrun --standalone --nproc-per-node 8 examples/sophgo_tp_dp.py              # CPU
"""

from __future__ import annotations

import sys

import torch

import xccl

DTYPES = (torch.float32, torch.bfloat16, torch.int32)


def groups(world_size: int, tp: int) -> dict[str, list[list[int]]]:
    """Tensor-parallel groups of ``tp`` consecutive ranks, and the data-parallel groups across them."""
    return {"tp": [list(range(i, i + tp)) for i in range(0, world_size, tp)],
            "dp": [list(range(j, world_size, tp)) for j in range(tp)]}


def check(world: xccl.World, tp: int | None = None) -> list[str]:
    """Run the collectives on this rank's groups (every rank creates every group); one line per group.

    Raises:
        AssertionError: a collective gave a wrong value.
    """
    n, rank = world.world_size, world.rank
    tp = tp or max(n // 2, 1)
    mine = {}
    for name, all_ranks in groups(n, tp).items():
        for ranks in all_ranks:
            group = xccl.new_group(ranks)
            if rank in ranks:
                mine[name] = (ranks, group)
    lines = []
    for name, (ranks, group) in mine.items():
        for dtype in DTYPES:
            t = torch.full((256,), rank + 1, dtype=dtype, device=world.device)
            xccl.all_reduce(t, group=group)
            _expect(t, [sum(r + 1 for r in ranks)] * 256, f"{name} all_reduce {dtype}")
            out = torch.empty(2 * len(ranks), dtype=dtype, device=world.device)
            xccl.all_gather_into_tensor(out, torch.full((2,), rank, dtype=dtype, device=world.device), group=group)
            _expect(out, [r for r in ranks for _ in range(2)], f"{name} all_gather_into_tensor {dtype}")
            b = torch.full((4,), rank, dtype=dtype, device=world.device)
            xccl.broadcast(b, src=ranks[-1], group=group)
            _expect(b, [ranks[-1]] * 4, f"{name} broadcast {dtype}")
        lines.append(f"rank {rank}: {name} group {ranks} ok (comm {xccl.comm_name(group)})")
    xccl.barrier()
    return lines


def _expect(got: torch.Tensor, want: list[int], what: str) -> None:
    values = got.cpu().float().tolist()
    if values != [float(w) for w in want]:
        raise AssertionError(f"{what}: got {values[:8]}..., want {want[:8]}...")


if __name__ == "__main__":
    world = xccl.init(vendor="sophgo", fallback="emulate")
    try:
        print("\n".join(check(world)), flush=True)
    except AssertionError as exc:
        print(f"rank {world.rank}: WRONG: {exc}", file=sys.stderr, flush=True)
        raise
    finally:
        xccl.shutdown()
