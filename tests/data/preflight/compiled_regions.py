"""Three compiled regions, as ``xccl preflight`` reports them:

* ``step`` (``torch.compile``, the eager backend) calls ``torch.distributed.broadcast``, which Dynamo cannot trace on torch 2.13 (it
  builds the op's ``BroadcastOptions``, a pybind object): a graph break at the broadcast's line, two graphs;
* ``converts`` (``xccl.compile``): a matmul and an all_reduce, every node of which TorchAir converts on Ascend;
* ``does_not_convert`` (``xccl.compile``): ``logcumsumexp``, whose TorchAir converter only raises
  NotImplementedError; on Ascend its compilation fails at the first call, as on the hardware.
"""

import torch
import torch.distributed as dist

import xccl

xccl.init()
w = torch.ones(8, 8)


@torch.compile(backend="eager")
def step(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    dist.broadcast(y, src=0)
    return (y + 1).sum()


@xccl.compile
def converts(x: torch.Tensor) -> torch.Tensor:
    y = x @ w
    xccl.all_reduce(y)
    return y


@xccl.compile
def does_not_convert(x: torch.Tensor) -> torch.Tensor:
    y = torch.logcumsumexp(x, dim=0)
    xccl.all_reduce(y)
    return y


for _ in range(2):
    step(torch.ones(8))
converts(torch.ones(4, 8))
does_not_convert(torch.ones(4, 8))
xccl.shutdown()
