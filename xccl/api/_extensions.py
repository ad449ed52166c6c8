"""Collectives beyond the standard set: the coalesced forms and the uneven collectives of HCCL.

The uneven ones have torch_npu's semantics (``torch_npu.distributed.all_gather_into_tensor_uneven``,
``reduce_scatter_tensor_uneven``, ``all_to_all_vc``): native on Ascend, emulated elsewhere. Errors as in
``xccl.api._collectives``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ..ops import _specs as S
from ._collectives import _run

__all__ = [
    "all_gather_coalesced",
    "all_gather_into_tensor_uneven",
    "all_reduce_coalesced",
    "all_to_all_v",
    "reduce_scatter_tensor_uneven",
]

SUM: Final = dist.ReduceOp.SUM


def all_reduce_coalesced(
    tensors: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """All-reduce several tensors in one call (``torch.distributed.all_reduce_coalesced``).

    Args:
        tensors: the tensors, each reduced in place.
        op: the reduce op.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Example::

        xccl.all_reduce_coalesced([grad_a, grad_b])
    """
    return _run(S.ALL_REDUCE_COALESCED, group, async_op, tensors, op)


def all_gather_coalesced(
    output_tensor_lists: list[list[torch.Tensor]], input_tensor_list: list[torch.Tensor], group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-gather several tensors in one call (``torch.distributed.all_gather_coalesced``).

    Args:
        output_tensor_lists: one list per rank of the group; ``output_tensor_lists[r][i]`` receives rank ``r``'s
            ``input_tensor_list[i]``.
        input_tensor_list: this rank's tensors.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Example::

        outs = [[torch.empty(2), torch.empty(3)] for _ in range(world_size)]
        xccl.all_gather_coalesced(outs, [torch.ones(2), torch.ones(3)])
    """
    return _run(S.ALL_GATHER_COALESCED, group, async_op, output_tensor_lists, input_tensor_list)


def all_gather_into_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-gather where rank ``i`` contributes ``output_split_sizes[i]`` rows (torch_npu's semantics).

    Args:
        output: ``sum(output_split_sizes)`` rows.
        input: ``output_split_sizes[rank]`` rows, ``output``'s trailing shape.
        output_split_sizes: rows per rank, the same on every rank (``None``: even, as all_gather_into_tensor).
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Example::

        sizes = [r + 1 for r in range(world_size)]
        out = torch.empty(sum(sizes), 4)
        xccl.all_gather_into_tensor_uneven(out, torch.ones(sizes[rank], 4), sizes)
    """
    return _run(S.ALL_GATHER_INTO_TENSOR_UNEVEN, group, async_op, output, input, output_split_sizes)


def reduce_scatter_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    input_split_sizes: Sequence[int] | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce-scatter where rank ``i`` receives ``input_split_sizes[i]`` rows (torch_npu's semantics).

    Args:
        output: ``input_split_sizes[rank]`` rows, ``input``'s trailing shape.
        input: ``sum(input_split_sizes)`` rows.
        input_split_sizes: rows per rank, the same on every rank (``None``: even).
        op: the reduce op.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Example::

        sizes = [r + 1 for r in range(world_size)]
        out = torch.empty(sizes[rank], 4)
        xccl.reduce_scatter_tensor_uneven(out, torch.ones(sum(sizes), 4), sizes)
    """
    return _run(S.REDUCE_SCATTER_TENSOR_UNEVEN, group, async_op, output, input, input_split_sizes, op)


def all_to_all_v(
    output: torch.Tensor,
    input: torch.Tensor,
    send_count_matrix: Sequence[Sequence[int]],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-to-all with per-peer element counts: ``send_count_matrix[i][j]`` elements go from rank i to rank j.

    The matrix is the same on every rank (torch_npu's ``all_to_all_vc`` contract). ``input`` holds this rank's
    row of counts, contiguous per peer; ``output`` receives column ``rank``, contiguous per peer.

    Args:
        output: ``sum(column rank)`` elements.
        input: ``sum(row rank)`` elements; not the same buffer as ``output``.
        send_count_matrix: an n x n matrix of non-negative counts.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: the matrix is not n x n, has negative counts, disagrees with the tensors' sizes, or the
            call is in place.

    Example::

        m = [[1] * world_size for _ in range(world_size)]
        xccl.all_to_all_v(torch.empty(world_size), torch.ones(world_size), m)
    """
    return _run(S.ALL_TO_ALL_V, group, async_op, output, input, send_count_matrix)
