"""xccl's emulations, one record each: what the composition calls, whether it reduces on the host, what it costs.

An emulation runs an op (its :attr:`Emulation.op`) as a composition (its ``via``) of building blocks the backend
has: a tensor reduce-scatter as all_to_all_single plus a local reduction where SCCL has no reduce_scatter, the
uneven ops by padding, send/recv through host memory. Its record holds everything the layers need to know of it:

* :attr:`~Emulation.blocks`: the building blocks it calls, with their dtype and reduce op, which the capability
  table resolves in turn (``CapabilityTable.resolve``), so an emulation whose block cannot run a call shape is
  unsupported before any rank communicates;
* :attr:`~Emulation.local_reduction`: whether it reduces on the host (the reduce ops and dtypes a host reduction
  has limit it);
* :attr:`~Emulation.note`: what using it costs (the once-per-op warning, ``xccl caps``);
* :attr:`~Emulation.fn`: the composition itself, ``fn(st, call, *kernel_args, async_op)``, implemented in
  ``xccl.collectives._emulate`` (which registers it here with :func:`implements`; the table never runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, final

import torch

from ._vocab import Collective

__all__ = ["BY_KEY", "EMULATIONS", "Block", "Emulation", "implements", "of", "unimplemented"]

C = Collective
#: A building block: (op, dtype, reduce op). A dtype of None means the caller's (after any cast), a reduce op of
#: ``"="`` the caller's (after avg-via-sum and the bool mapping), None none.
Block = tuple[Collective, "torch.dtype | None", "str | None"]
_FNS: dict[tuple[Collective, str], Callable[..., Any]] = {}


@final
@dataclass(frozen=True, slots=True)
class Emulation:
    """One composition of an op: see the module docstring."""

    op: Collective
    via: str
    blocks: tuple[Block, ...]
    note: str
    local_reduction: bool = False

    @property
    def fn(self) -> Callable[..., Any]:
        """The composition (``xccl.collectives._emulate`` registers it).

        Raises:
            KeyError: the collectives layer was not imported (nothing calls this before it is).
        """
        return _FNS[(self.op, self.via)]


def implements(op: Collective, via: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the function decorated as the composition of ``op`` via ``via`` (whose record must exist)."""
    if (op, via) not in BY_KEY:
        raise KeyError(f"no emulation record for {op.value} via {via!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _FNS[(op, via)] = fn
        return fn

    return register


_HOST = "staged through host memory over a gloo group"
#: Every emulation xccl has.
EMULATIONS: Final[tuple[Emulation, ...]] = (
    Emulation(C.REDUCE_SCATTER_TENSOR, "all_to_all", ((C.ALL_TO_ALL_SINGLE, None, None),),
              "all_to_all_single + local reduction; same bytes as a ring", local_reduction=True),
    Emulation(C.REDUCE_SCATTER_TENSOR, "all_reduce", ((C.ALL_REDUCE, None, "="),),
              "all_reduce + slice; about 2x the bytes of reduce_scatter"),
    Emulation(C.REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR.value, ((C.REDUCE_SCATTER_TENSOR, None, "="),),
              "concatenates the inputs, then one reduce-scatter of the whole"),
    Emulation(C.ALL_TO_ALL, "all_to_all_single", ((C.ALL_TO_ALL_SINGLE_UNEVEN, None, None),),
              "concatenates the inputs, one all_to_all_single with split sizes, one copy out"),
    Emulation(C.ALL_TO_ALL_SINGLE_UNEVEN, "padding", ((C.ALL_REDUCE, torch.int64, "max"), (C.ALL_TO_ALL_SINGLE, None, None)),
              "pads every chunk to the largest: one extra 8-byte all_reduce, (largest/average chunk) x the bytes"),
    Emulation(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "all_to_all_single", ((C.ALL_TO_ALL_SINGLE_UNEVEN, None, None),),
              "all_to_all_single with split sizes, this rank's rows to every peer: the bytes of the splits, no padding"),
    Emulation(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "padding", ((C.ALL_GATHER_INTO_TENSOR, None, None),),
              "pads every rank's rows to the largest split"),
    Emulation(C.REDUCE_SCATTER_TENSOR_UNEVEN, "all_to_all_single", ((C.ALL_TO_ALL_SINGLE_UNEVEN, None, None),),
              "all_to_all_single with split sizes + local reduction: the bytes of the splits, no padding",
              local_reduction=True),
    Emulation(C.REDUCE_SCATTER_TENSOR_UNEVEN, "padding", ((C.REDUCE_SCATTER_TENSOR, None, "="),),
              "pads every chunk to the largest split"),
    Emulation(C.ALL_TO_ALL_V, "all_to_all_single",
              ((C.ALL_TO_ALL_SINGLE, None, None), (C.ALL_TO_ALL_SINGLE_UNEVEN, None, None)),
              "all_to_all_single with split sizes from the count matrix"),
    Emulation(C.ALL_REDUCE_COALESCED, "all_reduce", ((C.ALL_REDUCE, None, "="),),
              "the tensors flattened into one buffer per dtype, one all_reduce each, copied back"),
    Emulation(C.ALL_GATHER_COALESCED, "all_gather", ((C.ALL_GATHER, None, None),), "one all_gather per input tensor"),
    Emulation(C.ALL_GATHER, "all_gather_into_tensor_uneven", ((C.ALL_GATHER_INTO_TENSOR_UNEVEN, None, None),),
              "one uneven all_gather of the flattened tensors (split sizes: their element counts), copied out"),
    Emulation(C.ALL_REDUCE, "all_gather", ((C.ALL_GATHER_INTO_TENSOR, None, None),),
              "all_gather_into_tensor of every rank's bits + a local reduction in rank order: exact, identical on "
              "every rank; world size x the bytes of the tensor received", local_reduction=True),
    Emulation(C.REDUCE, "all_gather", ((C.ALL_GATHER_INTO_TENSOR, None, None),),
              "all_gather_into_tensor + a local reduction on the root, in rank order: exact; every rank receives "
              "world size x the bytes of the tensor", local_reduction=True),
    Emulation(C.GATHER, "all_gather", ((C.ALL_GATHER_INTO_TENSOR, None, None),),
              "an all_gather kept on the root: every rank receives the whole gathered data (world size x the bytes "
              "of a gather)"),
    Emulation(C.MONITORED_BARRIER, "store", (),
              "over the rendezvous store, not the backend: a few store round trips per rank (torch's gloo algorithm, "
              "naming the late ranks on every rank)"),
    Emulation(C.SEND, "host_gloo", (), _HOST),
    Emulation(C.RECV, "host_gloo", (), _HOST),
    Emulation(C.RECV_ANY_SOURCE, "host_gloo", (), _HOST),
)
#: Each record by (op, via).
BY_KEY: Final[dict[tuple[Collective, str], Emulation]] = {(e.op, e.via): e for e in EMULATIONS}


def of(op: Collective) -> tuple[Emulation, ...]:
    """The emulations of ``op``, in order of preference (the first is what a refusing native kernel falls back to)."""
    return tuple(e for e in EMULATIONS if e.op is op)


def unimplemented() -> list[Emulation]:
    """The records whose composition is not registered (none, once ``xccl.collectives._emulate`` is imported)."""
    return [e for e in EMULATIONS if (e.op, e.via) not in _FNS]
