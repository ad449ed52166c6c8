"""Lose a rank and go on: the survivors shrink the world in place (``dist.shrink_group``, docs/elastic.md).

Plain processes, one per rank (torchrun's agent would stop the survivors when one fails)::

    for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python examples/lose_a_rank.py & done; wait

On Ascend the same, with ``XCCL_VENDOR=ascend`` (or ``XCCL_SIMULATE=ascend`` anywhere). Rank 1 (``XCCL_LOSE_RANK``)
exits after the first all_reduce: a rank in the middle, not the last, so that the survivors are renumbered and a
device map that kept the lost chip would show. Ranks 0, 2 and 3 print ``lost [1] (PeerFailure after 0.31 s): rank r
of 3, all_reduce 3.0`` (their new rank; the type and time of what the failed step raised), and, on Ascend with
``RANK_TABLE_FILE`` set, the survivors' table xccl wrote. The failed step synchronises inside the ``try``
(``.item()``): on a device, an error the collective meets surfaces at the next synchronisation, not at the call.

Sophgo cannot shrink in place (SCCL has no abort): there ``dist.shrink_group`` raises ``UnsupportedCollective``
before anything is torn down, and the survivors print it and exit 3, as a job under ``torchrun --max-restarts``
would restart (docs/elastic.md).
"""

import os
import time

import torch
import torch.distributed as dist

import xccl


def main() -> None:
    world = xccl.init(timeout=float(os.environ.get("XCCL_TIMEOUT", "30")))
    victim = int(os.environ.get("XCCL_LOSE_RANK", "1"))
    t = torch.ones(1, device=world.device)
    xccl.all_reduce(t)
    if world.rank == victim:
        os._exit(1)  # the lost rank: its process ends without a word
    started = time.monotonic()
    try:
        xccl.all_reduce(t)
        t.item()  # synchronise: on a device, what the collective met surfaces here
        raise SystemExit(f"rank {victim} was not lost")
    except xccl.PeerFailure as err:
        lost, seen = list(err.ranks), f"{type(err).__name__} after {time.monotonic() - started:.2f} s"
    try:
        dist.shrink_group(lost)
    except xccl.UnsupportedCollective as err:  # Sophgo: restart and resume instead
        print(f"lost {lost} ({seen}): {err}")
        raise SystemExit(3) from None
    w = xccl.get_world()
    t = torch.ones(1, device=w.device)
    xccl.all_reduce(t)
    table = os.environ.get("RANK_TABLE_FILE", "")
    print(f"lost {lost} ({seen}): rank {w.rank} of {w.world_size}, all_reduce {t.item()}"
          + (f", {table}" if table else ""))
    xccl.shutdown()


if __name__ == "__main__":
    main()
