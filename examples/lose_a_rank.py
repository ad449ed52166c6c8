"""Lose a rank and go on: the survivors shrink the world in place (``dist.shrink_group``, docs/elastic.md).

Plain processes, one per rank (torchrun's agent would stop the survivors when one fails)::

    for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python examples/lose_a_rank.py & done; wait

On Ascend or Sophgo the same, with ``XCCL_VENDOR=ascend`` / ``sophgo`` (or ``XCCL_SIMULATE=...`` anywhere). Rank 3
exits after the first all_reduce; ranks 0, 1 and 2 print ``lost [3]: rank r of 3, all_reduce 3.0`` (their new
rank), and, on Ascend with ``RANK_TABLE_FILE`` set, the survivors' table xccl wrote.
"""

import os

import torch
import torch.distributed as dist

import xccl


def main() -> None:
    world = xccl.init(timeout=float(os.environ.get("XCCL_TIMEOUT", "30")))
    t = torch.ones(1, device=world.device)
    xccl.all_reduce(t)
    if world.rank == 3:
        os._exit(1)  # the lost rank: its process ends without a word
    try:
        xccl.all_reduce(t)
        raise SystemExit("rank 3 was not lost")
    except xccl.PeerFailure as err:
        lost = list(err.ranks)
    dist.shrink_group(lost)
    w = xccl.get_world()
    t = torch.ones(1, device=w.device)
    xccl.all_reduce(t)
    table = os.environ.get("RANK_TABLE_FILE", "")
    print(f"lost {lost}: rank {w.rank} of {w.world_size}, all_reduce {t.item()}" + (f", {table}" if table else ""))
    xccl.shutdown()


if __name__ == "__main__":
    main()
