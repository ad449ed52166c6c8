"""The one training job every framework test runs, and its single-process reference.

A tiny MLP (the same initial weights everywhere, from a fixed seed), a fixed global batch, mean-squared error, SGD
for :data:`STEPS` steps. Data parallelism over ``n`` ranks gives rank ``r`` an equal share of the batch; the mean
of the ranks' gradients is then the gradient of the whole batch, so every framework's run, on any number of ranks,
must end at the parameters of one process training on the whole batch (:func:`reference`), and its global loss at
each step must be the whole batch's loss at that step's parameters.

Imported by the job scripts (run as ``python tests/frameworks/job_*.py`` or by a framework's launcher: their
folder is on ``sys.path``) and by the test modules; it imports only torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: Training steps (``XCCL_FRAMEWORK_STEPS`` raises it for benchmarks/frameworks.py, which compares no results).
STEPS = int(os.environ.get("XCCL_FRAMEWORK_STEPS", "3"))
LR = 0.1
D_IN, HIDDEN, D_OUT = 8, 16, 4
#: Rows of the global batch: divisible by 1, 2 and 4 ranks.
BATCH = 8
#: float32 sums in a different order (a ring, a tree, a reduce_scatter) differ in the last bits only.
TOL = 1e-5
#: ``gloo``: the job creates its world on plain gloo instead of xccl's backend (the baseline of
#: benchmarks/frameworks.py).
BASELINE_ENV = "XCCL_FRAMEWORK_BASELINE"
#: The folder where a job script writes its results, one ``NAME.json`` per run (set by the test; rank 0 writes).
OUT_ENV = "XCCL_FRAMEWORK_TEST_OUT"


def baseline() -> bool:
    """Whether this run is the plain-gloo baseline of benchmarks/frameworks.py (no xccl at all)."""
    return os.environ.get(BASELINE_ENV, "") == "gloo"


def model() -> nn.Sequential:
    """The initial model, identical on every rank: children ``0`` (Linear), ``1`` (ReLU), ``2`` (Linear)."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (inputs, targets): the same on every rank and at every step."""
    gen = torch.Generator().manual_seed(100)
    return torch.randn(BATCH, D_IN, generator=gen), torch.randn(BATCH, D_OUT, generator=gen)


def rows(rank: int, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s contiguous share of the global batch."""
    x, y = batch()
    return x.chunk(parts)[rank], y.chunk(parts)[rank]


def reference() -> dict[str, Any]:
    """One process, the whole batch: the loss before each step and the final parameters (as lists)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = batch()
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {k: v.tolist() for k, v in net.state_dict().items()}}


def write_result(name: str, losses: Sequence[float], params: Mapping[str, torch.Tensor], **extra: Any) -> None:
    """Write run ``name``'s result where the test asked (``$XCCL_FRAMEWORK_TEST_OUT/NAME.json``), else print it."""
    out = os.environ.get(OUT_ENV)
    doc = {"losses": [float(v) for v in losses],
           "params": {k: v.detach().float().cpu().tolist() for k, v in params.items()}, **extra}
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(doc))
    else:
        print(name, json.dumps(doc))


def read_result(folder: Path, name: str) -> dict[str, Any]:
    """What :func:`write_result` wrote for run ``name`` (``AssertionError`` if nothing was written)."""
    path = folder / f"{name}.json"
    if not path.exists():
        raise AssertionError(f"run {name!r} wrote no result")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _flat(v: Any) -> Iterable[float]:
    if isinstance(v, list):
        for item in v:
            yield from _flat(item)
    else:
        yield float(v)


def compare(got: Mapping[str, Any], what: str, *, check_losses: bool = True) -> None:
    """Raise ``AssertionError`` naming the first difference between a job's result and :func:`reference`."""
    ref = reference()
    if check_losses:
        for step, (g, r) in enumerate(zip(got["losses"], ref["losses"], strict=True)):
            if not math.isfinite(g) or abs(g - r) > TOL:
                raise AssertionError(f"{what}: step {step} loss {g!r}, reference {r!r} "
                                     f"(all: {got['losses']} vs {ref['losses']})")
    names = {k.removeprefix("module.").removeprefix("_orig_mod.") for k in got["params"]}
    if names != set(ref["params"]):
        raise AssertionError(f"{what}: parameters {sorted(got['params'])}, reference {sorted(ref['params'])}")
    for name, value in got["params"].items():
        exp = list(_flat(ref["params"][name.removeprefix("module.").removeprefix("_orig_mod.")]))
        val = list(_flat(value))
        worst = max((abs(a - b) for a, b in zip(val, exp, strict=True)), default=0.0)
        if len(val) != len(exp) or worst > TOL:
            raise AssertionError(f"{what}: parameter {name} differs from the reference by {worst}")
